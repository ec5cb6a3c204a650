"""The words of a compaction's history entry, events and metrics: ``Outcome`` and ``Reason`` are the plain strings."""

from __future__ import annotations

import json

import orjson

from app.store.compaction_outcome import Outcome, Reason, reason_of


def test_the_outcomes_are_the_strings_of_the_history():
    assert [member.value for member in Outcome] == ["applied", "stale", "failed", "skipped", "blocked"]
    assert Outcome.STALE == "stale" and str(Outcome.APPLIED) == "applied" and f"{Outcome.FAILED}" == "failed"


def test_the_reasons_are_the_strings_of_the_history():
    assert {member.value for member in Reason} == {
        "not_due", "no_gain", "not_quiet", "generation", "messages", "missing", "rate_limited", "timeout", "unavailable",
        "bad_request", "invalid_answer", "store_unavailable", "corrupt", "fact_guard", "internal"}


def test_json_sees_the_plain_values():
    entry = {"outcome": Outcome.FAILED, "reason": Reason.INVALID_ANSWER}
    assert json.dumps(entry) == '{"outcome": "failed", "reason": "invalid_answer"}'
    assert orjson.loads(orjson.dumps(entry)) == {"outcome": "failed", "reason": "invalid_answer"}


def test_a_reason_not_listed_is_kept_as_given():
    assert reason_of("timeout") is Reason.TIMEOUT
    assert reason_of("truncated") == "truncated" and not isinstance(reason_of("truncated"), Reason)
    assert Reason.parse(None) is None
