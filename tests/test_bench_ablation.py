"""The ablation's table and decision (bench/ablation.py): differences in points, what a group earns, the
removable rule, the held-out check and the LoCoMo split, on numbers written here (no subprocess, no data)."""

from __future__ import annotations

import pytest

from bench import ablation as A


def test_differences_are_percentage_points_of_shares():
    assert A.diff_points(0.95, 0.975) == -2.5
    assert A.diff_points(0.6, 0.5933) == 0.67
    assert A.diff_points(1.0, 1.0) == 0.0
    assert A.diff_points(None, 0.5) is None and A.diff_points(0.5, None) is None
    # a group earns what the measure loses when it is switched off
    assert A.earned_points(0.95, 0.975) == 2.5
    assert A.earned_points(0.99, 0.975) == -1.5


def _diffs(**points):
    """Every deciding measure at 0.0 points except ``points`` (dots written as double underscores)."""
    out = {key: 0.0 for key in A.DECIDING}
    out.update({key.replace("__", "."): value for key, value in points.items()})
    return out


def test_removable_only_when_every_dev_measure_earns_under_half_a_point():
    assert A.decide(_diffs()) == ("removable", [])
    assert A.decide(_diffs(fidelity__en=-0.49, forms__greetings=-0.3)) == ("removable", [])
    assert A.decide(_diffs(locomo__dev=+3.0)) == ("removable", [])  # better without it: it earns nothing
    assert A.decide(_diffs(fidelity__zh=-0.5)) == ("keep", ["fidelity.zh"])  # exactly 0.5 earned: kept
    assert A.decide(_diffs(fidelity__en=-2.5, forms__greetings=-97.7)) == ("keep", ["fidelity.en", "forms.greetings"])
    # the held-out split never decides
    held = _diffs()
    held.update({"locomo.held": -10.0, "recall5.held": -10.0, "recall10.held": -10.0})
    assert A.decide(held) == ("removable", [])


def test_a_missing_measure_leaves_the_decision_open_unless_another_earns():
    missing = _diffs(corrections__answered=None)
    assert A.decide(missing) == ("undecided", ["corrections.answered"])
    missing["recall10.dev"] = -1.0
    assert A.decide(missing) == ("keep", ["recall10.dev"])
    assert A.decide({}) == ("undecided", list(A.DECIDING))


def test_held_out_agrees_when_each_locomo_measure_earns_on_both_splits_or_on_neither():
    both = {"locomo.dev": -2.0, "locomo.held": -1.0, "recall5.dev": 0.0, "recall5.held": -0.4,
            "recall10.dev": 0.1, "recall10.held": 0.0}
    assert A.held_out_agrees(both) is True
    assert A.held_out_agrees({**both, "locomo.held": -0.2}) is False  # earns on dev only
    assert A.held_out_agrees({**both, "recall5.held": -0.6}) is False  # earns on held-out only
    assert A.held_out_agrees({**both, "recall10.held": None}) is None


def test_locomo_splits_pool_the_questions_of_their_conversations():
    conversations = [
        {"sample_id": "a", "questions": 150, "reached": {"product": 0.5933},
         "session_recall": {"at5": 0.8867, "at10": 1.0}},
        {"sample_id": "b", "questions": 50, "reached": {"product": 0.6}, "session_recall": {"at5": 0.5, "at10": 0.9}},
        {"sample_id": "c", "questions": 100, "reached": {"product": 0.25}, "session_recall": {"at5": 0.2, "at10": 0.3}},
    ]
    split = A.split_locomo(conversations, dev=2)
    assert split["locomo.dev"] == round((89 + 30) / 200, 4)  # 0.5933 of 150 is 89 questions
    assert split["recall5.dev"] == round((133 + 25) / 200, 4)
    assert split["recall10.dev"] == round((150 + 45) / 200, 4)
    assert (split["locomo.held"], split["recall5.held"], split["recall10.held"]) == (0.25, 0.2, 0.3)
    # a bench without session recall, and an empty split
    assert A.split_locomo([{"questions": 10, "reached": {"product": 0.5}}], dev=1)["recall5.dev"] is None
    assert A.split_locomo(conversations, dev=3)["locomo.held"] is None


def test_rows_and_table_show_values_differences_and_the_decision():
    base = {"fidelity.en": 0.95, "fidelity.zh": 1.0, "forms.greetings": 0.9773}
    off = {"fidelity.en": 0.925, "fidelity.zh": 1.0, "forms.greetings": 0.0}
    results = {A.BASELINE: {"values": base}, "forms.greeting": {"values": off}}
    baseline, group = A.rows_of(results)
    assert "decision" not in baseline and baseline["diffs"]["fidelity.en"] == 0.0
    assert group["diffs"]["fidelity.en"] == -2.5 and group["diffs"]["forms.greetings"] == -97.73
    assert group["diffs"]["locomo.dev"] is None
    assert group["decision"] == "keep" and group["why"] == ["fidelity.en", "forms.greetings"]
    assert A.decision_text(group) == "keep: facts EN −2.5, greetings −97.7"
    table = A.markdown_table([baseline, group], ("fidelity.en", "fidelity.zh", "locomo.dev"))
    assert table.splitlines() == [
        "| group | facts EN | facts ZH | LoCoMo dev | decision | held-out agrees |",
        "|---|---|---|---|---|---|",
        "| **baseline** | 95.0 | 100.0 | – |  |  |",
        "| `forms.greeting` | 92.5 (−2.5) | 100.0 (+0.0) | – (–) | keep: facts EN −2.5, greetings −97.7 | – |"]


@pytest.mark.parametrize("row, text", [
    ({"decision": "removable", "why": []}, "removable"),
    ({"decision": "undecided", "why": ["corrections.answered", "locomo.dev"]},
     "undecided (not measured: corr. answered, LoCoMo dev)"),
    ({}, ""),
])
def test_decision_text(row, text):
    assert A.decision_text(row) == text


def test_the_subprocess_environment_switches_one_group_off(monkeypatch):
    monkeypatch.setenv(A.ENV_VAR, "correct")  # the caller's own setting never leaks into a measure
    assert A.ENV_VAR not in A.run_env(None)
    assert A.run_env("forms.greeting")[A.ENV_VAR] == "forms.greeting"


def test_invented_fact_cases_come_from_the_data_not_from_the_guard():
    locomo = [{"conversation": {"speaker_a": "Caroline", "speaker_b": "Mel", "session_1": [
                  {"text": "Mel, I ran 5 km today."}, {"text": "Nice!"}]}},
              {"conversation": {"speaker_a": "Jon", "speaker_b": "Gina", "session_1": [{"text": "Hi Jon."}]}}]
    kdconv = [{"messages": [{"message": "它是2001年12月28日上映的。",
                             "attrs": [{"attrname": "上映时间", "attrvalue": "2001年12月28日", "name": "我是山姆"}]}]},
              {"messages": [{"message": "好的。", "attrs": [{"attrname": "上映时间", "attrvalue": "1962年08月28日",
                                                           "name": "阿甘正传"}]}]}]
    en, zh = A.invented_fact_cases(locomo, kdconv)
    assert en == [("Mel, I ran 5 km today.", "Gina, I ran 5 km today."), ("Mel, I ran 5 km today.",
                                                                        "Mel, I ran 12 km today."),
                  ("Hi Jon.", "Hi Caroline.")]
    assert zh == [("它是2001年12月28日上映的。", "它是1962年08月28日上映的。")]
