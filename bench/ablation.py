"""Ablation of the memory rules: what each rule group earns on the memory measures (docs/benchmarks.md: Memory fidelity).

The memory rules (sentence forms and their cues, acceptance and correction cues, the fact kinds the fact guard
reads, the steps of the record's fitting policy, recall's function words, notes' stop words) come in named
groups, ``app.memory.lexicon.GROUPS``; ``MEMORY_RULES_OFF=<group>`` switches a group off in every process that
imports ``app.memory`` (read at import; an unknown name raises ``ValueError`` there).  For the baseline
(nothing off) and for each group (``--groups a,b``: a subset), this runs the measures in subprocesses whose
environment has ``MEMORY_RULES_OFF`` set to that group, and prints each measure's value and its difference
from the baseline of the same run, in percentage points.  This process itself never imports ``app.memory``
(``GROUPS`` is read by a subprocess too).

Measures (a share of cases in [0, 1]; shown in %):

* ``fidelity.en`` / ``fidelity.zh``: planted facts retained, per language (``python -m bench.fidelity --fake --data
  DATA --filler 24``, as ``.ci/run``: its ``results.json``, ``methods.memory.retained``; the paraphrasing fake
  model writes the compaction's gists).
* ``locomo.*``: LoCoMo QA through the product's turn path with the replay fake compaction model
  (``python -m bench.fidelity --locomo --fake --data DATA --conversations N``: its ``locomo.json``, per conversation):
  evidence in the prompt (all evidence turns of a question reach it) and session recall@5 / @10 (a gold
  evidence session among the sessions of recall's top turns).  The first ``--dev`` conversations are the dev
  split the decision reads; the others are the held-out split, reported beside it (``held-out agrees``:
  whether each LoCoMo measure earns >= 0.5 points on held-out exactly when it does on dev).
* ``forms.*`` and ``corrections.marked``: the rule checks over the public data (``rules_checks``, run as
  ``python -m bench.ablation --rules-json PATH``), the checks of ``tests/test_compaction_forms.py`` as shares of
  the cases that pass, and the correction cases of ``bench/corrections.py`` as a compaction reads them
  (``statement_lines`` per turn, then ``mark_replaced``): passed when exactly the replaced statement is marked.
* ``corrections.answered``: ``python -m bench.corrections --json``: the bundled model answers the corrected value with
  the record as the prompt renders it now (``after``).  Its records are written by hand (a replaced line is
  marked in the case), so only a rule of the rendering can move it; one model server serves every group, its
  answers cached per exact request (temperature 0, seed 7: the same request gets the same answer), so a group
  that leaves the prompts unchanged costs no model time.

Decision, beside each group: ``removable`` when the group earns less than ``THRESHOLD`` (0.5) points on every
dev measure of the sources run (``DECIDING``: all but the held-out ones), where a group *earns* the baseline's
value minus the value with the group switched off; ``keep`` when it earns at least that on one; ``undecided``
when a measure failed and none earns enough.  A group that no measure exercises looks removable: read the
measures' list.

Usage::

    python -m bench.ablation                                # every group; ~1.5 min a group on 2 cores
    python -m bench.ablation --quick                        # LoCoMo conversations 1 (dev) and 2 (held-out)
    python -m bench.ablation --groups forms.greeting,correct --out docs/ablation.md
    python -m bench.ablation --measures fidelity,rules      # only these sources

Output: the table on stdout; ``--out`` (default ``test-output/ablation/ablation.md``) gets it as Markdown with
a header (measures, data, split, models, date and machine) and, beside it, the same stem ``.json`` (numbers
only).  Subprocess logs go to ``test-output/ablation/<group>/``.  Exit status 0; 2 when a group name is
unknown, the data is missing, or the baseline could not be measured.
"""

from __future__ import annotations

import argparse
import hashlib
import http.server
import json
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from bench.rule_changes import rules_env
from chat_support.processes import stop_group

ROOT = Path(__file__).resolve().parent.parent

ENV_VAR = "MEMORY_RULES_OFF"
BASELINE = "baseline"
THRESHOLD = 0.5
"""Points a group must earn on at least one dev measure to be kept."""
SOURCES = ("fidelity", "locomo", "rules", "corrections")


@dataclass(frozen=True)
class Measure:
    """One measure: its key in the results, its label, its source (``SOURCES``) and whether the decision reads
    it (dev) or not (held-out)."""

    key: str
    label: str
    short: str
    source: str
    deciding: bool = True


RULE_CHECKS = {
    "forms.evidence_kept": "LoCoMo QA evidence turns keep a statement (`statement_sentences`)",
    "forms.knowledge_kept": "KdConv turns with knowledge triples keep a statement",
    "forms.en_questions": "LoCoMo sentences ending in `?` read as questions (`sentence_form`)",
    "forms.zh_questions": "KdConv questions (`？`, `吗`) read as questions",
    "forms.en_unmarked": "the same LoCoMo questions with the `?` dropped (as people type) read as questions",
    "forms.zh_unmarked": "KdConv questions ending in `？` with the mark dropped read as questions",
    "forms.zh_unmarked_asks": "the same questions make the turn look in the archive (`may_ask`: recall runs)",
    "forms.en_unmarked_statements": "LoCoMo statements with their final `.`/`!` dropped are not read as questions",
    "forms.questions_not_whole": "no question of the data enters the record whole",
    "forms.greetings": "short LoCoMo session openings read as greetings",
    "forms.labelled": "the hand-labelled forms of tests/test_compaction_forms.py",
    "corrections.marked": "bench/corrections.py cases: exactly the replaced statement marked (`mark_replaced`)",
    "facts.invented_en": "LoCoMo turns with a speaker's name or a number changed: the fact guard refuses the changed "
                         "text as a gist of the turn (`gist_problems`)",
    "facts.invented_dates_en": "LoCoMo turns with a month or weekday name changed (three months, two days on): "
                               "the fact guard refuses them",
    "facts.invented_ids_en": "LoCoMo turns with an acronym changed to the data's next acronym: the guard refuses "
                             "them",
    "facts.invented_zh": "KdConv turns with an annotated entity or value changed to another of the same attribute: "
                         "the fact guard refuses it",
    "facts.invented_dates_zh": "KdConv turns with a weekday or a month changed: the fact guard refuses them",
    **{f"labels.{g}": f"the units `{g}` reads differently, hand-labelled blind (bench/disagreements.py): share read "
                      "as labelled" for g in ("forms.clauses", "forms.first_person", "accept", "decision")},
}

MEASURES: tuple[Measure, ...] = (
    Measure("fidelity.en", "planted facts retained, English (python -m bench.fidelity --fake)", "facts EN", "fidelity"),
    Measure("fidelity.zh", "planted facts retained, Chinese (python -m bench.fidelity --fake)", "facts ZH", "fidelity"),
    Measure("locomo.dev", "LoCoMo evidence in prompt, dev split", "LoCoMo dev", "locomo"),
    Measure("recall5.dev", "LoCoMo session recall@5, dev split", "R@5 dev", "locomo"),
    Measure("recall10.dev", "LoCoMo session recall@10, dev split", "R@10 dev", "locomo"),
    Measure("locomo.held", "LoCoMo evidence in prompt, held-out split", "LoCoMo held-out", "locomo", False),
    Measure("recall5.held", "LoCoMo session recall@5, held-out split", "R@5 held-out", "locomo", False),
    Measure("recall10.held", "LoCoMo session recall@10, held-out split", "R@10 held-out", "locomo", False),
    *(Measure(key, label, "corr. marked" if key == "corrections.marked"
              else "labels " + key.rsplit(".", 1)[1].replace("_", " ") if key.startswith("labels.")
              else key.split(".", 1)[1].replace("_", " "), "rules") for key, label in RULE_CHECKS.items()),
    Measure("corrections.answered", "corrections answered by the bundled model, current rendering "
            "(bench/corrections.py)", "corr. answered", "corrections"),
)
BY_KEY = {m.key: m for m in MEASURES}
DECIDING = tuple(m.key for m in MEASURES if m.deciding)
HELD_OUT_PAIRS = (("locomo.dev", "locomo.held"), ("recall5.dev", "recall5.held"), ("recall10.dev", "recall10.held"))
MAIN_COLUMNS = ("fidelity.en", "fidelity.zh", "locomo.dev", "recall5.dev", "recall10.dev", "locomo.held",
                "recall5.held", "recall10.held", "corrections.marked", "corrections.answered")
FORMS_COLUMNS = tuple(k for k in RULE_CHECKS if k != "corrections.marked")


# ============================================================================================ the table's logic


def diff_points(value: float | None, base: float | None) -> float | None:
    """``value - base`` in percentage points (shares in [0, 1]), rounded to 0.01; None when either is missing."""
    if value is None or base is None:
        return None
    return round(100 * (value - base), 2)


def earned_points(value: float | None, base: float | None) -> float | None:
    """What a group earns on a measure: the baseline's value minus the value with the group off, in points."""
    diff = diff_points(value, base)
    return None if diff is None else -diff


def decide(diffs: dict[str, float | None], keys=DECIDING, threshold: float = THRESHOLD) -> tuple[str, list[str]]:
    """The decision for one group from its differences to the baseline (points; None: not measured).

    Returns:
        ``("keep", keys earning >= threshold)``, else ``("undecided", missing keys)`` when a key of ``keys`` has
        no difference, else ``("removable", [])`` (it earns < ``threshold`` points on every one of ``keys``).
    """
    earning = [k for k in keys if (diff := diffs.get(k)) is not None and -diff >= threshold]
    if earning:
        return "keep", earning
    missing = [k for k in keys if diffs.get(k) is None]
    if missing:
        return "undecided", missing
    return "removable", []


def held_out_agrees(diffs: dict[str, float | None], pairs=HELD_OUT_PAIRS, threshold: float = THRESHOLD) -> bool | None:
    """True when, for every (dev, held-out) pair, the group earns >= ``threshold`` on held-out exactly when it
    does on dev; None when a difference is missing."""
    verdicts = []
    for dev, held in pairs:
        on_dev, on_held = diffs.get(dev), diffs.get(held)
        if on_dev is None or on_held is None:
            return None
        verdicts.append((-on_dev >= threshold) == (-on_held >= threshold))
    return all(verdicts)


def pooled(entries: list[dict], get) -> float | None:
    """The share over the questions of several conversations: their per-conversation shares (``get(entry)``,
    rounded) weighted by ``entry["questions"]``, as counts.  None when there is no question or no share."""
    hits = total = 0
    for entry in entries:
        share, n = get(entry), entry.get("questions") or 0
        if share is None or not n:
            continue
        hits += round(share * n)
        total += n
    return round(hits / total, 4) if total else None


def split_locomo(conversations: list[dict], dev: int) -> dict[str, float | None]:
    """The LoCoMo measures of ``locomo.json``'s ``conversations`` list: the first ``dev`` are the dev split, the
    rest the held-out split (``{"locomo.dev": share, "recall5.dev": ..., "locomo.held": ..., ...}``)."""
    out = {}
    for suffix, part in (("dev", conversations[:dev]), ("held", conversations[dev:])):
        out[f"locomo.{suffix}"] = pooled(part, lambda e: e["reached"]["product"])
        for k in (5, 10):
            out[f"recall{k}.{suffix}"] = pooled(part, lambda e, k=k: (e.get("session_recall") or {}).get(f"at{k}"))
    return out


def pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}"


def signed(points: float | None) -> str:
    return "–" if points is None else f"{points:+.1f}".replace("-", "−")


def cell(value: float | None, base: float | None, is_baseline: bool) -> str:
    """``97.5`` for the baseline, ``95.0 (−2.5)`` for a group."""
    if is_baseline:
        return pct(value)
    return f"{pct(value)} ({signed(diff_points(value, base))})"


def rows_of(results: dict, deciding=DECIDING) -> list[dict]:
    """One row per run (baseline first): values, differences in points, decision (on ``deciding``) and held-out
    check."""
    base = results[BASELINE]["values"]
    rows = []
    for name, run in results.items():
        values = run["values"]
        diffs = {k: diff_points(values.get(k), base.get(k)) for k in BY_KEY}
        row = {"group": name, "values": values, "diffs": diffs}
        if name != BASELINE:
            row["decision"], row["why"] = decide(diffs, deciding)
            row["held_out_agrees"] = held_out_agrees(diffs)
        rows.append(row)
    return rows


def decision_text(row: dict) -> str:
    if "decision" not in row:
        return ""
    if row["decision"] == "keep":
        return "keep: " + ", ".join(f"{BY_KEY[k].short} {signed(row['diffs'][k])}" for k in row["why"])
    if row["decision"] == "undecided":
        return "undecided (not measured: " + ", ".join(BY_KEY[k].short for k in row["why"]) + ")"
    return "removable"


def markdown_table(rows: list[dict], columns) -> str:
    """The rows as a Markdown table: group, each column's value (and difference), decision, held-out check."""
    base = rows[0]["values"]
    head = ["group", *(BY_KEY[k].short for k in columns), "decision", "held-out agrees"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        is_base = row["group"] == BASELINE
        agrees = row.get("held_out_agrees")
        lines.append("| " + " | ".join([
            f"`{row['group']}`" if not is_base else "**baseline**",
            *(cell(row["values"].get(k), base.get(k), is_base) for k in columns),
            decision_text(row), "" if is_base else {True: "yes", False: "no", None: "–"}[agrees]]) + " |")
    return "\n".join(lines)


# ============================================================================================ the rule checks


def _locomo_sessions(conversation: dict) -> list[list[dict]]:
    talk = conversation["conversation"]
    keys = sorted((k for k in talk if re.fullmatch(r"session_\d+", k)), key=lambda k: int(k.split("_")[1]))
    return [talk[k] for k in keys]


def rules_checks(data: Path) -> dict[str, dict[str, int]]:
    """The rule checks (``RULE_CHECKS``) in this process, as ``{key: {"passed": n, "checked": n}}``.

    The sentences and cases are those ``tests/test_compaction_forms.py`` reads (LoCoMo ``locomo10.json``: the first
    three conversations' sentences, every conversation's QA evidence; KdConv ``kdconv-sample.json``) and the
    correction cases of ``bench/corrections.py``.  Imports ``app.memory``: run it with the rules to measure.

    Raises:
        FileNotFoundError: a data file is missing.
    """
    from app.memory.compaction import forms
    from app.memory.compaction.answer import gist_problems
    from app.memory.compaction.record import mark_replaced, sentences, statement_lines, statement_sentences
    from app.memory.state import ThreadMessage
    from bench import disagreements
    from bench.corrections import CASES, FILLER
    from chat_support.form_cases import LABELLED

    locomo = json.loads((data / "locomo10.json").read_text(encoding="utf-8"))
    kdconv = json.loads((data / "kdconv-sample.json").read_text(encoding="utf-8"))
    english = [s for conv in locomo[:3] for session in _locomo_sessions(conv) for t in session
               for s in sentences(t["text"])]
    chinese = [s for conv in kdconv for m in conv["messages"] for s in sentences(m["message"])]
    out: dict[str, dict[str, int]] = {}

    def count(key: str, results) -> None:
        results = list(results)
        out[key] = {"passed": sum(results), "checked": len(results)}

    evidence = []
    for conv in locomo:
        turns = {t["dia_id"]: t for session in _locomo_sessions(conv) for t in session}
        evidence += [turns[d]["text"] for qa in conv["qa"] if qa.get("category") in (1, 2, 3, 4)
                     for d in qa["evidence"] if d in turns]
    count("forms.evidence_kept", (bool(statement_sentences(t)) for t in evidence))
    count("forms.knowledge_kept", (bool(statement_sentences(m["message"])) for conv in kdconv
                                   for m in conv["messages"] if m.get("attrs")))
    en_questions = [s for s in english if s.endswith("?")]
    zh_questions = [s for s in chinese if s.endswith(("？", "?")) or re.search(r"吗[。]?$", s)]
    count("forms.en_questions", (forms.sentence_form(s) == forms.QUESTION for s in en_questions))
    count("forms.zh_questions", (forms.sentence_form(s) == forms.QUESTION for s in zh_questions))
    count("forms.en_unmarked", (forms.sentence_form(s[:-1].rstrip()) == forms.QUESTION for s in en_questions))
    count("forms.en_unmarked_statements", (not forms.is_question(s[:-1].rstrip()) for s in english
                                           if s.endswith((".", "!"))))
    count("forms.zh_unmarked", (forms.sentence_form(s[:-1].rstrip()) == forms.QUESTION for s in zh_questions
                                if s.endswith(("？", "?"))))
    count("forms.zh_unmarked_asks", (forms.may_ask(s[:-1].rstrip()) for s in zh_questions if s.endswith(("？", "?"))))
    count("forms.questions_not_whole", (s not in statement_sentences(s) for s in en_questions + zh_questions))
    openings = [sentences(session[0]["text"])[0] for conv in locomo for session in _locomo_sessions(conv)]
    count("forms.greetings", (forms.sentence_form(s) == forms.GREETING for s in openings
                              if len(s.split()) <= 3 and not s.endswith("?")))
    count("forms.labelled", (forms.sentence_form(sentence) == form for sentence, form in LABELLED))

    def message(role: str, text: str, n: int) -> ThreadMessage:
        return ThreadMessage(f"{role[0]}{n}", role, text, "2026-01-01T00:00:00.000Z")

    marked = []
    for case in CASES:
        first, second, third = FILLER[case.lang]
        lines = []
        for n, text in enumerate((first, case.before, second, third, case.after), 1):
            lines += statement_lines((message("user", text, n), message("assistant", "Noted.", n)), number=n)
        found = {(line.turn, line.replaced_by) for line in mark_replaced(tuple(lines)) if line.replaced_by}
        marked.append(found == {(2, 5)})
    count("corrections.marked", marked)
    en_cases, zh_cases = invented_fact_cases(locomo, kdconv)
    count("facts.invented_en", (bool(gist_problems(gist, [source])) for source, gist in en_cases))
    count("facts.invented_zh", (bool(gist_problems(gist, [source])) for source, gist in zh_cases))
    for key, cases in invented_kind_cases(locomo, kdconv).items():
        count(key, (bool(gist_problems(gist, [source])) for source, gist in cases))
    labels = json.loads(disagreements.LABELS.read_text(encoding="utf-8"))
    for group, splits in disagreements.score(data, labels).items():
        out[f"labels.{group}"] = {"passed": sum(r for r, _ in splits.values()),
                                  "checked": sum(n for _, n in splits.values())}
    return out


def invented_fact_cases(locomo: list, kdconv: list) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """``(turn, changed turn)`` pairs whose change invents a fact, built from the data alone (never from the
    fact guard, so every group is measured on the same cases).

    English: a LoCoMo turn naming one of its conversation's speakers gets the next conversation's speaker
    instead; a turn with digits gets each run of digits plus 7.  Chinese: a KdConv turn holding an annotated
    value or entity (its knowledge triples) gets another dialogue's value of the same attribute.
    """
    en: list[tuple[str, str]] = []
    for index, conv in enumerate(locomo):
        talk, other = conv["conversation"], locomo[(index + 1) % len(locomo)]["conversation"]
        names = [(talk["speaker_a"], other["speaker_a"]), (talk["speaker_b"], other["speaker_b"])]
        for session in _locomo_sessions(conv):
            for turn in session:
                text = turn["text"]
                for name, replacement in names:
                    if re.search(rf"\b{re.escape(name)}\b", text) and name != replacement:
                        en.append((text, re.sub(rf"\b{re.escape(name)}\b", replacement, text)))
                        break
                if re.search(r"\d", text):
                    en.append((text, re.sub(r"\d+", lambda m: str(int(m.group(0)) + 7), text)))
    values: dict[str, list[str]] = {}
    for conv in kdconv:
        for message in conv["messages"]:
            for attr in message.get("attrs") or []:
                values.setdefault(attr["attrname"], []).append(str(attr["attrvalue"]))
    zh: list[tuple[str, str]] = []
    for conv_index, conv in enumerate(kdconv):
        for message in conv["messages"]:
            text = message["message"]
            for attr in message.get("attrs") or []:
                for old, pool in ((str(attr["attrvalue"]), values.get(attr["attrname"], [])),
                                  (str(attr["name"]), [str(c["messages"][0].get("attrs", [{}])[0].get("name", ""))
                                                       for c in kdconv if c["messages"][0].get("attrs")])):
                    if len(old) < 2 or old not in text:
                        continue
                    new = next((v for v in pool[conv_index % max(len(pool), 1):] + pool
                                if len(v) >= 2 and v not in text and old not in v), None)
                    if new:
                        zh.append((text, text.replace(old, new)))
                        break
                else:
                    continue
                break
    return en, zh


MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December")
WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
ZH_WEEKDAYS = "一二三四五六日"


def invented_kind_cases(locomo: list, kdconv: list) -> dict[str, list[tuple[str, str]]]:
    """``{rule check: [(turn, changed turn)]}`` for the fact kinds that carry no digits, built from the data
    alone like ``invented_fact_cases``: a date written with words (English month or weekday names, Chinese
    weekdays and months) and an acronym.

    The first such name of a turn is changed everywhere in it: a month three months on, a weekday two days on,
    an acronym to the next of the data's acronyms (sorted).  An acronym is an all-capital word of two or more
    letters whose lower-case form never occurs in the data as a word ("OK", "IT" and "LOL" are words there).
    """
    texts = [t["text"] for conv in locomo for session in _locomo_sessions(conv) for t in session]
    lower = {w for text in texts for w in re.findall(r"[a-z]+", text)}
    acronyms = sorted({w for text in texts for w in re.findall(r"\b[A-Z]{2,}\b", text) if w.lower() not in lower})
    dates_en: list[tuple[str, str]] = []
    ids_en: list[tuple[str, str]] = []
    for text in texts:
        found = re.search(rf"\b({'|'.join(MONTHS + WEEKDAYS)})\b", text)
        if found:
            name = found.group(1)
            names, step = (MONTHS, 3) if name in MONTHS else (WEEKDAYS, 2)
            new = names[(names.index(name) + step) % len(names)]
            dates_en.append((text, re.sub(rf"\b{name}\b", new, text)))
        found = next((m for m in re.finditer(r"\b[A-Z]{2,}\b", text) if m.group(0) in acronyms), None)
        if found and len(acronyms) > 1:
            name = found.group(0)
            new = acronyms[(acronyms.index(name) + 1) % len(acronyms)]
            ids_en.append((text, re.sub(rf"\b{name}\b", new, text)))
    dates_zh: list[tuple[str, str]] = []
    for conv in kdconv:
        for message in conv["messages"]:
            text = message["message"]
            weekday = re.search(r"(星期|周|礼拜)([一二三四五六日天])", text)
            month = re.search(r"(?<!\d)(\d{1,2})月", text)
            if weekday:
                day = ZH_WEEKDAYS.index(weekday.group(2)) if weekday.group(2) in ZH_WEEKDAYS else 6
                dates_zh.append((text, text.replace(weekday.group(0), weekday.group(1) + ZH_WEEKDAYS[(day + 2) % 7])))
            elif month and 1 <= int(month.group(1)) <= 12:
                dates_zh.append((text, text.replace(month.group(0), f"{int(month.group(1)) % 12 + 1}月", 1)))
    return {"facts.invented_dates_en": dates_en, "facts.invented_ids_en": ids_en, "facts.invented_dates_zh": dates_zh}


# ============================================================================================ running the measures


def run_env(group: str | None) -> dict[str, str]:
    """This process's environment with ``MEMORY_RULES_OFF`` set to ``group`` (removed for the baseline)."""
    env = rules_env(group)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def run(command: list[str], env: dict, log: Path, timeout: float) -> int:
    """Run ``command`` (niced, in the checkout) with its output in ``log``; its exit status (124: timed out)."""
    with log.open("w") as out:
        proc = subprocess.Popen(["nice", "-n", "10", *command], cwd=ROOT, env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(30)
            return 124


def read_groups() -> tuple[str, ...]:
    """``app.memory.lexicon.GROUPS``, read by a subprocess with nothing switched off.

    Raises:
        RuntimeError: the module cannot be imported.
    """
    result = subprocess.run([sys.executable, "-c", "import json; from app.memory.lexicon import GROUPS; "
                             "print(json.dumps(list(GROUPS)))"], cwd=ROOT, env=run_env(None), capture_output=True,
                            text=True, timeout=300)
    if result.returncode:
        raise RuntimeError(f"app.memory.lexicon.GROUPS could not be read: {result.stderr.strip()[-500:]}")
    return tuple(json.loads(result.stdout.strip().splitlines()[-1]))


def measure_fidelity(env, work: Path, data: Path) -> tuple[dict, str]:
    out = work / "fidelity"
    code = run([sys.executable, "-m", "bench.fidelity", "--fake", "--data", str(data), "--filler", "24", "--out",
                str(out)], env, work / "fidelity.log", 1800)
    path = out / "results.json"
    if code not in (0, 1) or not path.is_file():  # 1: a retention target missed (still measured)
        return {}, f"fidelity exited {code} (see {work / 'fidelity.log'})"
    retained = json.loads(path.read_text())["methods"]["memory"]["retained"]
    return {"fidelity.en": retained.get("en"), "fidelity.zh": retained.get("zh")}, ""


def measure_locomo(env, work: Path, data: Path, conversations: int, dev: int) -> tuple[dict, str]:
    out = work / "locomo"
    code = run([sys.executable, "-m", "bench.fidelity", "--locomo", "--fake", "--data", str(data), "--conversations",
                str(conversations), "--out", str(out)], env, work / "locomo.log", 3600)
    path = out / "locomo.json"
    if code != 0 or not path.is_file():
        return {}, f"locomo exited {code} (see {work / 'locomo.log'})"
    return split_locomo(json.loads(path.read_text())["conversations"], dev), ""


def measure_rules(env, work: Path, data: Path) -> tuple[dict, str]:
    path = work / "rules.json"
    code = run([sys.executable, "-m", "bench.ablation", "--rules-json", str(path), "--data", str(data)], env,
               work / "rules.log", 1200)
    if code != 0 or not path.is_file():
        return {}, f"rule checks exited {code} (see {work / 'rules.log'})"
    checks = json.loads(path.read_text())
    return {k: (round(v["passed"] / v["checked"], 4) if v["checked"] else None) for k, v in checks.items()}, ""


def measure_corrections(env, work: Path, url: str | None, why: str) -> tuple[dict, str]:
    if not url:
        return {}, why or "no model server for the corrections"
    path = work / "corrections.json"
    code = run([sys.executable, "-m", "bench.corrections", "--url", url, "--json", str(path)], env,
               work / "corrections.log", 3600)
    if code != 0 or not path.is_file():
        return {}, f"corrections exited {code} (see {work / 'corrections.log'})"
    totals = json.loads(path.read_text())
    cases = sum(totals["cases"].values())
    return {"corrections.answered": round(sum(totals["answered"]["after"].values()) / cases, 4) if cases else None}, ""


class CachingProxy:
    """An HTTP proxy in this process for an OpenAI-compatible server: the same POST body gets the same answer.

    Each distinct (path, body) is asked of ``upstream`` once per run; later requests get the stored answer.
    ``hits`` and ``misses`` count requests.
    """

    def __init__(self, upstream: str):
        self.upstream = upstream.rstrip("/")
        self.cache: dict[str, bytes] = {}
        self.lock = threading.Lock()
        self.hits = self.misses = 0
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                path = self.path[len("/v1"):] if self.path.startswith("/v1") else self.path
                key = hashlib.sha256(path.encode() + b"\0" + body).hexdigest()
                with proxy.lock:
                    answer = proxy.cache.get(key)
                    proxy.hits += answer is not None
                if answer is None:
                    request = urllib.request.Request(proxy.upstream + path, data=body, method="POST",
                                                     headers={"Content-Type": "application/json"})
                    try:
                        with urllib.request.urlopen(request, timeout=900) as resp:
                            answer = resp.read()
                    except urllib.error.HTTPError as exc:
                        self.send_response(exc.code)
                        self.end_headers()
                        self.wfile.write(exc.read())
                        return
                    with proxy.lock:
                        proxy.cache[key] = answer
                        proxy.misses += 1
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def start_model_server(log: Path, timeout: float = 300) -> tuple[subprocess.Popen | None, str | None, str]:
    """The bundled chat model's server (``scripts/model_server.py --role chat``, as ``bench/corrections.py``
    starts it) on a free port: ``(process, base URL, "")``, or ``(None, None, why)`` when it did not start."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    handle = log.open("w")
    proc = subprocess.Popen([sys.executable, "scripts/model_server.py", "--role", "chat", "--port", str(port)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=handle, text=True, start_new_session=True)
    assert proc.stdout is not None  # stdout=PIPE
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line:
            handle.write(line)
            handle.flush()
        if "ready at" in line:
            threading.Thread(target=shutil.copyfileobj, args=(proc.stdout, handle), daemon=True).start()
            return proc, f"http://127.0.0.1:{port}/v1", ""
        if not line and proc.poll() is not None:
            break
    stop_group(proc, timeout=60)
    return None, None, f"the bundled chat server did not start (see {log})"


def measure_group(group: str | None, sources, args, work: Path, url: str | None, why: str = "") -> dict:
    """Every measure of ``sources`` with ``group`` switched off: ``{"values", "seconds", "errors"}``."""
    env = run_env(group)
    shutil.rmtree(work, ignore_errors=True)  # nothing of an earlier run may be read as this one's
    work.mkdir(parents=True, exist_ok=True)
    values: dict = {}
    seconds: dict = {}
    errors: list[str] = []
    for source in sources:
        started = time.monotonic()
        if source == "fidelity":
            found, error = measure_fidelity(env, work, args.data)
        elif source == "locomo":
            found, error = measure_locomo(env, work, args.data, args.conversations, args.dev)
        elif source == "rules":
            found, error = measure_rules(env, work, args.data)
        else:
            found, error = measure_corrections(env, work, url, why)
        seconds[source] = round(time.monotonic() - started, 1)
        values.update(found)
        if error:
            errors.append(error)
    return {"values": values, "seconds": seconds, "errors": errors}


# ============================================================================================ the report


def write_report(path: Path, results: dict, meta: dict) -> str:
    """``path`` (Markdown: header, the main table, the rule checks' table) and ``path.with_suffix(".json")``."""
    deciding = [k for k in DECIDING if BY_KEY[k].source in meta["sources"]]
    rows = rows_of(results, deciding)
    main_columns = [k for k in MAIN_COLUMNS if BY_KEY[k].source in meta["sources"]]
    forms_columns = [k for k in FORMS_COLUMNS if BY_KEY[k].source in meta["sources"]]
    base = results[BASELINE]
    seconds = {s: [r["seconds"][s] for r in results.values() if s in r["seconds"]] for s in meta["sources"]}
    lines = [
        "# Ablation of the memory rules", "",
        f"Command: `{meta['command']}`. Run {meta['date']} on {meta['machine']} ({meta['cpus']} CPUs); "
        f"{meta['minutes']} minutes in all. Each group is switched off alone (`{ENV_VAR}=<group>` in the "
        "measuring subprocesses); every value is measured in this run, the difference (in parentheses) is "
        "against this run's baseline, in percentage points.", "",
        "Measures (share of cases, %):", "",
        "* **facts EN / ZH**: planted facts retained per language, `python -m bench.fidelity --fake --data DATA "
        "--filler 24` (40 planted facts under real LoCoMo/KdConv filler; compaction answers by the paraphrasing "
        "fake model, which drops names, dates and ids).",
        f"* **LoCoMo dev / held-out**: evidence in the prompt, `python -m bench.fidelity --locomo --fake --conversations "
        f"{meta['conversations']}` (LoCoMo `locomo10.json`; the replay fake compaction model): dev = "
        f"conversations 1–{meta['dev']} ({', '.join(meta['dev_ids']) or '–'}; {meta['dev_questions']} questions), "
        f"held-out = the others ({', '.join(meta['held_ids']) or '–'}; {meta['held_questions']} questions). "
        "**R@5 / R@10**: session recall, a gold evidence session among the sessions of recall's top 5 / 10 "
        "turns. The decision reads dev only; *held-out agrees*: each LoCoMo measure earns ≥ "
        f"{THRESHOLD} points on held-out exactly when it does on dev.",
        "* **rule checks** (table below): the checks of `tests/test_compaction_forms.py` over LoCoMo and KdConv "
        "sentences as shares of cases passing; **corrections marked**: the 16 cases of `bench/corrections.py` "
        "read as a compaction reads them, exactly the replaced statement marked.",
        f"* **corr. answered**: `bench/corrections.py`, the bundled model ({meta['chat_model']}, temperature 0, "
        "seed 7) answers the corrected value with the record as the prompt renders it now; its records are "
        "written by hand, so only a rule of the rendering can move it (answers cached per exact request: "
        f"{meta['proxy']}).",
        "",
        f"Decision: **removable** when the group earns < {THRESHOLD} points (baseline minus the value with the "
        "group off) on every dev measure measured (every column but the held-out ones, and every rule check); "
        "**keep** names the measures it earns on; **undecided**: a measure failed and none earns. A group no "
        "measure exercises looks removable.", "",
        "Seconds per measure and group (median of the runs): " + ", ".join(
            f"{s} {sorted(v)[len(v) // 2]}" for s, v in seconds.items() if v) + ".", "",
        markdown_table(rows, main_columns), ""]
    if forms_columns:
        lines += ["Rule checks (share of cases passing; cases checked in the baseline: " + ", ".join(
            f"{BY_KEY[k].short} {meta['checked'].get(k, '–')}" for k in forms_columns) + "):", "",
                  markdown_table(rows, forms_columns), ""]
    problems = [f"- `{name}`: " + "; ".join(r["errors"]) for name, r in results.items() if r["errors"]]
    if problems:
        lines += ["Not measured:", "", *problems, ""]
    text = "\n".join(lines)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    payload = {"meta": meta, "threshold": THRESHOLD, "measures": {m.key: {"label": m.label, "deciding": m.deciding}
                                                                  for m in MEASURES},
               "rows": [{k: v for k, v in row.items()} | {"seconds": results[row["group"]]["seconds"],
                                                          "errors": results[row["group"]]["errors"]}
                        for row in rows], "baseline": base["values"]}
    path.with_suffix(".json").write_text(json.dumps(payload, indent=2, ensure_ascii=False))
    return text


def console_table(rows: list[dict], sources=SOURCES) -> str:
    """The main table and the rule checks (the measures of ``sources``) as plain text for the terminal."""
    out = []
    main_columns = [k for k in MAIN_COLUMNS if BY_KEY[k].source in sources]
    for columns in (main_columns, [k for k in FORMS_COLUMNS if BY_KEY[k].source in sources]):
        if not columns:
            continue
        head = ["group", *(BY_KEY[k].short for k in columns)]
        body = []
        base = rows[0]["values"]
        for row in rows:
            is_base = row["group"] == BASELINE
            body.append([row["group"], *(cell(row["values"].get(k), base.get(k), is_base) for k in columns)])
        widths = [max(len(str(r[i])) for r in [head, *body]) for i in range(len(head))]
        out.append("  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)))
        for row, line in zip(rows, body, strict=False):
            extra = ""
            if columns is main_columns and row["group"] != BASELINE:
                agrees = {True: "yes", False: "no", None: "–"}[row["held_out_agrees"]]
                extra = f"  {decision_text(row)}  [held-out agrees: {agrees}]"
            out.append("  ".join(str(c).ljust(w) for c, w in zip(line, widths, strict=True)) + extra)
        out.append("")
    return "\n".join(out)


# ============================================================================================ main


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", help="comma-separated rule groups (default: every group of GROUPS)")
    parser.add_argument("--quick", action="store_true",
                        help="LoCoMo conversations 1 (dev) and 2 (held-out) instead of 1-3 and 4-10")
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data",
                        help="folder with locomo10.json and kdconv-sample.json (default ../shared/data)")
    parser.add_argument("--conversations", type=int, help="LoCoMo conversations replayed (default 10; --quick 2)")
    parser.add_argument("--dev", type=int, help="the first N of them are the dev split (default 3; --quick 1)")
    parser.add_argument("--measures", default=",".join(SOURCES),
                        help=f"comma-separated sources of measures (default {','.join(SOURCES)})")
    parser.add_argument("--model-url", help="an OpenAI-compatible base URL serving the bundled model for the "
                                            "corrections (default: start the bundled chat server once)")
    parser.add_argument("--out", type=Path, default=ROOT / "test-output" / "ablation" / "ablation.md",
                        help="the Markdown report; the JSON goes beside it (same stem, .json)")
    parser.add_argument("--rules-json", type=Path, help=argparse.SUPPRESS)  # the rule checks, in a subprocess
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.rules_json:
        args.rules_json.write_text(json.dumps(rules_checks(args.data), indent=2))
        return 0
    started = time.monotonic()
    if not (args.data / "locomo10.json").is_file() or not (args.data / "kdconv-sample.json").is_file():
        print(f"ablation: no conversation data in {args.data} (use --data)", file=sys.stderr)
        return 2
    args.data = args.data.resolve()
    args.conversations = args.conversations or (2 if args.quick else 10)
    args.dev = args.dev or (1 if args.quick else 3)
    if not 0 < args.dev < args.conversations:
        print("ablation: --dev must leave at least one held-out conversation", file=sys.stderr)
        return 2
    sources = [s.strip() for s in args.measures.split(",") if s.strip()]
    if set(sources) - set(SOURCES):
        print(f"ablation: unknown measures {sorted(set(sources) - set(SOURCES))} (known: {', '.join(SOURCES)})",
              file=sys.stderr)
        return 2
    try:
        known = read_groups()
    except RuntimeError as exc:
        print(f"ablation: {exc}", file=sys.stderr)
        return 2
    groups = [g.strip() for g in args.groups.split(",") if g.strip()] if args.groups else list(known)
    unknown = [g for g in groups if g not in known]
    if unknown:
        print(f"ablation: unknown rule groups {unknown} (known: {', '.join(known)})", file=sys.stderr)
        return 2
    logs = ROOT / "test-output" / "ablation"
    logs.mkdir(parents=True, exist_ok=True)
    model, url, proxy, model_note = None, None, None, ""
    if "corrections" in sources:
        upstream = args.model_url
        if not upstream:
            model, upstream, model_note = start_model_server(logs / "model-server.log")
        if upstream:
            proxy = CachingProxy(upstream)
            url = proxy.url
    command = "python -m bench.ablation " + " ".join(argv if argv is not None else sys.argv[1:])
    print(f"ablation: {len(groups)} groups + baseline; measures {', '.join(sources)}; LoCoMo conversations "
          f"1-{args.conversations}, dev 1-{args.dev}" + (f"; {model_note}" if model_note else ""), flush=True)
    results: dict[str, dict] = {}
    try:
        for name in [BASELINE, *groups]:
            work = logs / re.sub(r"[^\w.-]", "_", name)
            one = measure_group(None if name == BASELINE else name, sources, args, work, url, model_note)
            results[name] = one
            shown = ", ".join(f"{BY_KEY[k].short} {pct(v)}" for k, v in one["values"].items() if k in MAIN_COLUMNS)
            print(f"ablation: {name}: {shown}; seconds {one['seconds']}"
                  + (f"; NOT MEASURED: {'; '.join(one['errors'])}" if one["errors"] else ""), flush=True)
            if name == BASELINE and not one["values"]:
                print("ablation: the baseline could not be measured", file=sys.stderr)
                return 2
    finally:
        if proxy is not None:
            proxy.stop()
        if model is not None:
            stop_group(model, timeout=60)
    locomo = logs / BASELINE / "locomo" / "locomo.json"
    conversations = json.loads(locomo.read_text())["conversations"] if locomo.is_file() else []
    rules = logs / BASELINE / "rules.json"
    checked = {k: v["checked"] for k, v in json.loads(rules.read_text()).items()} if rules.is_file() else {}
    answers = logs / BASELINE / "corrections.json"
    chat_model = json.loads(answers.read_text()).get("model") if answers.is_file() else "not run"
    meta = {"command": command, "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": f"{platform.node()}, {platform.machine()}, Python {platform.python_version()}",
            "cpus": os.cpu_count(), "load_average": [round(x, 2) for x in os.getloadavg()],
            "minutes": round((time.monotonic() - started) / 60, 1), "sources": sources, "groups": groups,
            "conversations": args.conversations, "dev": args.dev,
            "dev_ids": [c["sample_id"] for c in conversations[:args.dev]],
            "held_ids": [c["sample_id"] for c in conversations[args.dev:]],
            "dev_questions": sum(c["questions"] for c in conversations[:args.dev]),
            "held_questions": sum(c["questions"] for c in conversations[args.dev:]),
            "checked": checked, "chat_model": chat_model,
            "proxy": (f"{proxy.misses} asked, {proxy.hits} from the cache" if proxy else "not run"),
            "data": str(args.data)}
    write_report(args.out, results, meta)
    print()
    print(console_table(rows_of(results, [k for k in DECIDING if BY_KEY[k].source in sources]), sources))
    print(f"ablation: {meta['minutes']} min; report {args.out} and {args.out.with_suffix('.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
