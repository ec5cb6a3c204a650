"""Whether a rule group is right on what it changes: a blind, hand-labelled sample of the texts each group reads
differently (bench/rule_changes.py counts them; this says whether the change is right).

Units, per group (each reading is this process's rules; ``MEMORY_RULES_OFF`` switches a group off at import):

* ``forms.first_person``: a sentence (``record.sentences``) whose membership in ``statement_sentences`` changes;
  label: it says something worth remembering (a statement), not only thanks, a greeting or an acknowledgement.
* ``forms.clauses``: a clause of a question or request (a piece of ``forms._CLAUSE_RE``'s split of one of
  ``record.sentences``, not the last) whose membership in ``statement_sentences`` changes (via
  ``forms.statement_clauses``); label: as it stands, a statement worth keeping in a chat memory (about the speaker,
  someone or the world), not a fragment of a question or request, or a social phrase.
* ``accept`` (removed since): a text whose reading as accepting an answer changed; label: it accepts or agrees to
  take up what the other speaker offered just before.
* ``decision``: a text whose ``facts.states_decision`` changes; label: it states the speaker's own decision,
  firm preference, commitment or ruling-out.

``--sample`` computes each group's disagreement set (one subprocess per reading) and writes up to 60 units a
group, shuffled with a fixed seed, to ``--out`` (outside the repository: the texts are LoCoMo's and KdConv's,
never committed) as id, text and the previous turn, without the readings.  The labels
(``bench/data/disagreement_labels.json``) hold ids only; ``score`` counts, in this process, how many labelled
units the rules read as labelled, on a dev and a held split.  ``--score`` prints it with the rules on and with
each group off.

Ids: LoCoMo ``locomo:<sample_id>:<dia_id>``, KdConv ``kdconv:<conversation index>:<message index>``, and
``#<sentence index>`` after either for a sentence, ``#<sentence index>.<clause index>`` for a clause.  Split: LoCoMo's first three conversations and KdConv's
even-indexed ones are dev, the rest held.

Usage: ``python -m bench.disagreements --sample --out /tmp/labels`` and ``python -m bench.disagreements --score``.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import tempfile
from pathlib import Path
from typing import Iterator

from bench.rule_changes import read_with

ROOT = Path(__file__).resolve().parent.parent
LABELS = ROOT / "bench" / "data" / "disagreement_labels.json"
GROUPS = ("forms.first_person", "forms.clauses", "accept", "decision")
PER_GROUP = 60
ALL = ("forms.clauses",)  # groups sampled whole (their set is small)
SEED = 20261204


def turns(data: Path) -> Iterator[tuple[str, str, str, bool]]:
    """Every LoCoMo turn and KdConv message: (id, text, previous turn's text or "", dev split)."""
    locomo = json.loads((data / "locomo10.json").read_text(encoding="utf-8"))
    kdconv = json.loads((data / "kdconv-sample.json").read_text(encoding="utf-8"))
    for number, conv in enumerate(locomo):
        talk = conv["conversation"]
        keys = sorted((k for k in talk if re.fullmatch(r"session_\d+", k)), key=lambda k: int(k.split("_")[1]))
        for key in keys:
            previous = ""
            for turn in talk[key]:
                yield f"locomo:{conv['sample_id']}:{turn['dia_id']}", turn["text"], previous, number < 3
                previous = turn["text"]
    for number, conv in enumerate(kdconv):
        previous = ""
        for index, message in enumerate(conv["messages"]):
            yield f"kdconv:{number}:{index}", message["message"], previous, number % 2 == 0
            previous = message["message"]


def units(data: Path) -> dict[str, dict[str, dict]]:
    """Per group, every unit: id -> {"text", "previous", "dev"} (sentences for ``forms.first_person``, clauses for
    ``forms.clauses``, with the whole turn as "context")."""
    from app.memory.compaction.record import sentences

    out: dict[str, dict[str, dict]] = {group: {} for group in GROUPS}
    for key, text, previous, dev in turns(data):
        for group in ("accept", "decision"):
            out[group][key] = {"text": text, "previous": previous, "dev": dev}
        for index, sentence in enumerate(sentences(text)):
            out["forms.first_person"][f"{key}#{index}"] = {"text": sentence, "context": text, "previous": previous,
                                                           "dev": dev}
            for part, clause in enumerate(_clauses(sentence)[:-1]):
                out["forms.clauses"][f"{key}#{index}.{part}"] = {"text": clause, "context": text,
                                                                 "previous": previous, "dev": dev}
    return out


def _clauses(sentence: str) -> list[str]:
    """The clauses ``forms.statement_clauses`` reads, each bare (no trailing comma or semicolon)."""
    from app.memory.compaction.forms import _CLAUSE_RE

    return [c.strip().rstrip(",;，；").strip() for c in _CLAUSE_RE.split(sentence.strip()) if c and c.strip()]


def reading(group: str, unit_id: str, text: str) -> bool:
    """This process's reading of one unit (``text`` is the whole turn, also for a sentence unit)."""
    from app.memory.compaction import forms
    from app.memory.compaction.facts import states_decision
    from app.memory.compaction.record import sentences, statement_sentences

    if group == "forms.first_person":
        return sentences(text)[int(unit_id.rsplit("#", 1)[1])] in statement_sentences(text)
    if group == "forms.clauses":
        index, part = unit_id.rsplit("#", 1)[1].split(".")
        sentence = sentences(text)[int(index)]
        return (forms.sentence_form(sentence) in (forms.QUESTION, forms.REQUEST)
                and _clauses(sentence)[int(part)] in forms.statement_clauses(sentence))
    if group == "accept":
        return False  # removed after these labels (docs/ablation.md: Decisions): nothing reads acceptance now
    if group == "decision":
        return states_decision(text)
    raise ValueError(f"unknown group {group}")


def read_all(data: Path) -> dict[str, dict[str, bool]]:
    """Per group, every unit's reading in this process."""
    found: dict[str, dict[str, bool]] = {group: {} for group in GROUPS}
    for group, table in units(data).items():
        for unit_id, unit in table.items():
            found[group][unit_id] = reading(group, unit_id, unit.get("context", unit["text"]))
    return found


def _run(group: str | None, data: Path, path: Path) -> dict[str, dict[str, bool]]:
    return read_with(group, "bench.disagreements", "--read", path, "--data", str(data))


def live_groups() -> list[str]:
    """The labelled groups that still exist (``forms.first_person`` and ``accept`` were removed after their labels:
    their labels stay, the evidence of that decision, and score with the rules as they are now)."""
    from app.memory.lexicon import GROUPS as existing

    return [group for group in GROUPS if group in existing]


def sample(data: Path, out: Path, per_group: int = PER_GROUP, seed: int = SEED) -> dict[str, int]:
    """Writes ``out/<group>.jsonl`` (id, text, previous; no reading), shuffled; returns each group's set size."""
    table = units(data)
    sizes = {}
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as folder:
        base = _run(None, data, Path(folder) / "on.json")
        for group in live_groups():
            off = _run(group, data, Path(folder) / f"{group}.json")[group]
            changed = sorted(u for u, value in base[group].items() if off[u] != value)
            sizes[group] = len(changed)
            picked = random.Random(f"{seed}:{group}").sample(changed, len(changed) if group in ALL else min(per_group, len(changed)))
            with (out / f"{group}.jsonl").open("w", encoding="utf-8") as handle:
                for unit_id in picked:
                    unit = table[group][unit_id]
                    row = {"id": unit_id, "text": unit["text"], "previous": unit["previous"]}
                    if "context" in unit:
                        row["turn"] = unit["context"]
                    handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    return sizes


def score(data_dir: Path, labels: dict) -> dict[str, dict[str, tuple[int, int]]]:
    """Per group and split, (units the rules of this process read as labelled, units labelled)."""
    texts = {key: (text, dev) for key, text, _previous, dev in turns(data_dir)}
    out: dict[str, dict[str, tuple[int, int]]] = {}
    for group, rows in labels.items():
        if group == "about":
            continue
        counts = {"dev": [0, 0], "held": [0, 0]}
        for row in rows:
            text, dev = texts[row["id"].split("#", 1)[0]]
            split = counts["dev" if dev else "held"]
            split[0] += reading(group, row["id"], text) == row["label"]
            split[1] += 1
        out[group] = {split: (right, n) for split, (right, n) in counts.items()}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--sample", action="store_true", help="write the unlabelled sample to --out")
    parser.add_argument("--out", type=Path, default=Path("/tmp/labels"))
    parser.add_argument("--score", action="store_true", help="score the labels with the rules on and each group off")
    parser.add_argument("--labels", type=Path, default=LABELS)
    parser.add_argument("--read", type=Path, help=argparse.SUPPRESS)  # one reading, in a subprocess
    parser.add_argument("--score-json", type=Path, help=argparse.SUPPRESS)  # one scoring, in a subprocess
    args = parser.parse_args(argv)
    if args.read:
        args.read.write_text(json.dumps(read_all(args.data)), encoding="utf-8")
    elif args.score_json:
        labels = json.loads(args.labels.read_text(encoding="utf-8"))
        args.score_json.write_text(json.dumps(score(args.data, labels)), encoding="utf-8")
    elif args.sample:
        print(sample(args.data, args.out))
    elif args.score:
        with tempfile.TemporaryDirectory() as folder:
            for off in (None, *live_groups()):
                scores = read_with(off, "bench.disagreements", "--score-json", Path(folder) / "score.json", "--data",
                                   str(args.data), "--labels", str(args.labels))
                print(f"off={off or '-'}", scores, flush=True)
    else:
        parser.error("give --sample or --score")
    return 0


if __name__ == "__main__":
    sys.exit(main())
