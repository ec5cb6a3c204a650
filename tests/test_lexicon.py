"""The memory rules' data (app/memory/data/*.toml, built by app/memory/lexicon.py; docs/memory.md: The rules).

The tests read the same tables the rules do: every cue list's entries are recognised as the form that list
stands for; the rule-group switch (``MEMORY_RULES_OFF``) turns a group off, and only that group; the
rule budget (every pattern, data entry and hand-written word list of app/memory; scripts/rule_budget.py) holds
and breaks when anything is added.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from app.memory import lexicon, words
from app.memory.compaction import facts, forms
from scripts import rule_budget

ROOT = Path(__file__).resolve().parents[1]


def test_every_list_names_its_group_and_source():
    for language in ("en", "zh"):
        for name, entry in lexicon.table(language).items():
            groups = entry["uses"].values() if "uses" in entry else [entry["group"]]
            assert all(group in lexicon.GROUPS for group in groups), (language, name)
            assert len(entry["source"]) > 10, (language, name)
    for script in ("latin", "zh"):
        for kind, entry in lexicon.table("facts")[script].items():
            assert entry["group"].startswith("facts."), kind
    assert len(lexicon.GROUPS) == len(set(lexicon.GROUPS)) == 21


@pytest.mark.parametrize(("language", "section", "form"), [
    ("en", "greetings", forms.GREETING), ("en", "thanks", forms.THANKS), ("zh", "greetings", forms.GREETING),
    ("zh", "thanks", forms.THANKS), ("zh", "acknowledgements", forms.ACKNOWLEDGEMENT)])
def test_each_entry_of_a_form_list_alone_has_that_form(language, section, form):
    entries = [e.replace("+", "") for e in lexicon.words(language, section)]
    wrong = [e for e in entries if forms.sentence_form(e + ("!" if language == "en" else "！")) != form]
    # "谢谢"-like acknowledgements are read as thanks first (the same outcome: nothing kept)
    allowed = {"acknowledgements": {"谢谢", "谢谢你", "多谢", "感谢"}}.get(section, set())
    assert set(wrong) <= allowed, wrong


@pytest.mark.parametrize("entry", lexicon.words("en", "interjections"))
def test_each_interjection_alone_acknowledges(entry):
    assert forms.sentence_form(entry.replace("+", "") + ".") in (forms.ACKNOWLEDGEMENT, forms.THANKS, forms.GREETING)


@pytest.mark.parametrize("entry", lexicon.words("en", "request_verbs"))
def test_each_request_verb_opens_a_request(entry):
    assert forms.sentence_form(f"Please {entry} the plan for Lisbon.") == forms.REQUEST


@pytest.mark.parametrize(("language", "entry"), [("en", e) for e in lexicon.words("en", "corrections")]
                         + [("zh", e) for e in lexicon.words("zh", "corrections")])
def test_each_correction_cue_corrects(language, entry):
    text = entry.replace("…", " the one " if language == "en" else "周三")
    assert forms.corrects(f"The dinner, {text} Friday." if language == "en" else f"晚饭{text}周五")


def test_phrase_marks():
    assert lexicon.phrase("hmm+") == "hmm+"
    assert lexicon.phrase("not … but") == r"not\ .{1,40}?\ but"
    assert lexicon.alternation([]) == "(?!)"
    assert lexicon.alternation(["ok", "okay"]) == "(?:okay|ok)"


def test_one_tokenizer_and_one_overlap():
    assert words.tokens("Ticket INC-4471 moved to Tuesday, 14:30") == ["ticket", "inc-4471", "moved", "tuesday",
                                                                       "14:30"]
    assert words.tokens("What is it?", function_words=True) == ["what", "is", "it"]
    assert words.overlap("We moved to Berlin", ["Berlin is where we moved", "nothing"]) == 1.0
    assert words.overlap("We moved to Berlin", ["Paris"]) == 0.0
    assert words.key("- Use Postgres!") == words.key("use  postgres") == "use postgres"
    assert words.key("Don't use Redis") != words.key("Use Redis")
    assert words.key("👍") != words.key("🎉")


def _run_with(off: str, code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "MEMORY_RULES_OFF": off}
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60)


def test_a_switched_off_group_matches_nothing_and_the_others_still_do():
    code = ("from app.memory.compaction import forms, facts\n"
            "print(forms.sentence_form('Hello there!'), forms.sentence_form('Thanks!'),"
            " facts.extract_facts('Ticket INC-4471 on 2025-03-14'))")
    on = _run_with("", code)
    off = _run_with("forms.greeting,facts.dates", code)
    assert on.stdout.split(" ", 2)[:2] == ["greeting", "thanks"], on.stderr
    assert off.stdout.split(" ", 2)[:2] == ["statement", "thanks"], off.stderr
    assert "2025-03-14" in on.stdout and "2025-03-14" not in off.stdout and "INC-4471" in off.stdout


def test_an_unknown_group_is_refused_at_import():
    result = _run_with("forms.greetings", "import app.memory.lexicon")
    assert result.returncode != 0
    assert "unknown rule groups: forms.greetings" in result.stderr


def test_the_fact_kinds_are_read_from_the_table():
    kinds = [kind for kind, _ in lexicon.fact_patterns("latin")]
    assert kinds[:2] == ["iso_date", "month_day"] and len(kinds) == 14
    assert facts.extract_facts("Write to Ana about INC-4471 by March 15, 2026, or on Friday.") == [
        "Ana", "INC-4471", "March 15, 2026", "Friday"]


def test_the_rule_budget_holds():
    result = subprocess.run([sys.executable, "-m", "scripts.rule_budget"], cwd=ROOT, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stdout
    counts = rule_budget.count()
    assert (counts.total_patterns, counts.total_entries, counts.total_words) == (
        rule_budget.MAX_PATTERNS, rule_budget.MAX_ENTRIES, rule_budget.MAX_WORDS), result.stdout


def _copy(tmp_path: Path) -> Path:
    """A copy of app/memory to count (``rule_budget.count(root)``)."""
    shutil.copytree(ROOT / "app" / "memory", tmp_path / "app" / "memory",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def _append(path: Path, text: str) -> None:
    path.write_text(path.read_text(encoding="utf-8") + text, encoding="utf-8")


@pytest.mark.parametrize(("where", "added", "figure"), [
    ("app/memory/recall.py", '\n_EXTRA_RE = re.compile(r"extra")\n', "total_patterns"),
    ("app/memory/compaction/forms.py", '\n_EXTRA_RE = lexicon.cue("en", "thanks", at="end")\n', "total_patterns"),
    ("app/memory/lexicon.py", '\n\ndef extra_pattern():\n    return build("extra")\n', "total_patterns"),
    ("app/memory/data/facts.toml", '\n[latin.extra]\ngroup = "facts.dates"\npattern = \'\'\'extra\'\'\'\n',
     "total_patterns"),
    ("app/memory/data/en.toml", '\n[extra]\ngroup = "decision"\nsource = "a test"\nwords = ["extra"]\n',
     "total_entries"),
    ("app/memory/data/zh.toml", '\n[extra]\ngroup = "decision"\nsource = "a test"\nwords = "额外"\n',
     "total_entries"),
    ("app/memory/hydration.py", '\n_EXTRA = ("one", "two", "three", "four", "five")\n', "total_words"),
])
def test_one_pattern_or_entry_more_anywhere_breaks_the_budget(tmp_path, where, added, figure):
    root = _copy(tmp_path)
    before = getattr(rule_budget.count(root), figure)
    _append(root / where, added)
    assert getattr(rule_budget.count(root), figure) == before + {"zh.toml": 2, "hydration.py": 5}.get(
        Path(where).name, 1)
    assert rule_budget.main(["--root", str(root)]) == 1


def test_a_word_more_in_a_stop_list_breaks_the_budget(tmp_path):
    root = _copy(tmp_path)
    data = root / "app" / "memory" / "data" / "en.toml"
    data.write_text(data.read_text(encoding="utf-8").replace('"units" = """\n', '"units" = """\nextra ', 1),
                    encoding="utf-8")
    assert rule_budget.count(root).total_entries == rule_budget.MAX_ENTRIES + 1
    assert rule_budget.main(["--root", str(root)]) == 1


def test_the_stop_words_are_each_uses_list():
    function, names, units = (lexicon.stop_words(use) for use in ("function", "names", "units"))
    assert (len(function), len(names), len(units)) == (144, 224, 91)
    assert {"the", "it's", "don't"} <= function and "monday" not in function and "per" not in function
    assert {"monday", "user", "hello"} <= names and "the" not in names
    assert {"per", "times", "the"} <= units and "monday" not in units
