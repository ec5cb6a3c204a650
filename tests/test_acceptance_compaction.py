"""Acceptance cases of the compaction family: P5-P8, B1, B2, B5, B10.

A real Celery worker (embedded, solo pool), the real Redis, the fake LLM over HTTP.
"""

from __future__ import annotations

import json
import re
import threading
import time

import pytest

from app.chat.events import EventHub
from app.compaction.service import run_compaction
from app.memory.state import utc_now_iso
from app.store.redis_client import make_redis
from chat_support.fake_llm import Reply
from chat_support.redis_server import start_embedded_server
from tests.fixtures.celery_worker import (
    NUMBERS_ANSWER,
    asked,
    commit_turn,
    fold_now,
    folded_section,
    history,
    message_ids,
    raw_hash,
    record,
    refine_now,
    rendered,
    seed_turns,
    thread_id_for,
    turn_ids,
    wait_no_refinement,
    wait_until,
)

ANSWER = NUMBERS_ANSWER
FOLDED = record(1, 2, asked(1), asked(2))
SUMMARY = record(1, 2, asked(1), asked(2), "- About: " + ANSWER["summary"])


@pytest.fixture
def make_compaction_rig(make_compaction_rig):
    """Each fold's refinement follows at once (``COMPACTION_REFINE_AFTER_FOLDS=1``; no turn streams here), and a
    discarded one is asked again after 1 s."""
    def make(**overrides):
        return make_compaction_rig(**{"compaction_refine_after_folds": 1, "compaction_idle_seconds": 1, **overrides})
    return make


@pytest.fixture
def compaction_rig(make_compaction_rig):
    return make_compaction_rig()


# ------------------------------------------------------------------------------------------ P5-P8


def test_p5_twelve_messages_compacted_keep_exactly_the_last_eight(compaction_rig, fake_llm):
    rig = compaction_rig
    decision = "We decided to keep answers short"
    fake_llm.add_rule(Reply(json={**ANSWER, "pinnedDecisions": [decision]}), structured=True)
    rig.worker()
    tid = thread_id_for("p5")
    commit_turn(rig.store, tid, 1, user=decision + ", thanks.")
    result = seed_turns(rig.store, tid, 5, start=2)
    assert result.message_count == 12
    started = utc_now_iso()
    assert rig.request(tid, result)
    rig.wait_outcome(tid, "applied", count=2)  # the fold, then its refinement
    finished = utc_now_iso()
    state = rig.store.load(tid)
    assert message_ids(state) == ["u3", "a3", "u4", "a4", "u5", "a5", "u6", "a6"]
    assert [m.role for m in state.messages] == ["user", "assistant"] * 4
    # the fold's lines, then the model's gist; its (grounded) decision is a note
    assert state.summary == record(1, 2, "- Person (turn 1): " + decision + ", thanks.", asked(2),
                                   "- About: " + ANSWER["summary"])
    assert (state.notes, state.pins) == ((decision,), ())
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", state.last_compacted_at)
    assert started <= state.last_compacted_at <= finished  # set by the worker, never by the model


def test_p6_eight_messages_are_not_compacted_and_the_model_is_not_called(compaction_rig, fake_llm):
    rig = compaction_rig
    tid = thread_id_for("p6")
    result = seed_turns(rig.store, tid, 4)
    before = raw_hash(rig.client, tid)
    assert rig.request(tid, result) is False
    assert run_compaction(rig.services, tid, result.version).outcome == "skipped"  # even if a task arrives
    assert raw_hash(rig.client, tid) == before
    assert fake_llm.chat_requests() == []


def test_p7_an_answer_missing_summary_leaves_the_record_as_the_fold_wrote_it(compaction_rig, fake_llm):
    rig = compaction_rig
    fake_llm.add_rule(Reply(json={"pinnedDecisions": ["Keep answers short"]}), structured=True)
    tid = thread_id_for("p7")
    seed_turns(rig.store, tid, 5)
    sent = fold_now(rig, tid, commit_turn(rig.store, tid, 6))  # the turn that triggers compaction
    folded = raw_hash(rig.client, tid)
    assert [o.outcome for o in refine_now(rig, tid, sent)] == ["failed"] * 3
    after = raw_hash(rig.client, tid)
    assert {k: after[k] for k in ("messages", "summary", "notes")} == {k: folded[k] for k in ("messages", "summary",
                                                                                              "notes")}
    assert (rig.store.load(tid).summary, message_ids(rig.store.load(tid))) == (FOLDED, turn_ids(3, 6))


def test_p8_a_model_call_that_times_out_leaves_the_record_as_the_fold_wrote_it(make_compaction_rig, fake_llm):
    rig = make_compaction_rig(compaction_llm_timeout=0.5, compaction_max_retries=0)
    fake_llm.add_rule(Reply(stall=True, stall_max=5.0), structured=True)
    tid = thread_id_for("p8")
    sent = fold_now(rig, tid, seed_turns(rig.store, tid, 6))
    [outcome] = refine_now(rig, tid, sent)
    assert (outcome.outcome, outcome.reason, rig.store.load(tid).summary) == ("failed", "timeout", FOLDED)


# ------------------------------------------------------------------------------------------ B1


def test_b1_a_failing_summarizer_does_not_destroy_history(compaction_rig, fake_llm):
    rig = compaction_rig  # recent window 4 turns: 6 turns are past the trigger
    fake_llm.add_rule(Reply(status=429, error_message="Rate limit reached for gpt-x in organization org-123"),
                      structured=True)
    rig.worker()
    tid = thread_id_for("b1")
    result = seed_turns(rig.store, tid, 6)
    before = raw_hash(rig.client, tid)
    assert rig.request(tid, result)
    entries = rig.wait_outcome(tid, "failed", count=3)
    wait_no_refinement(rig, tid)

    after = raw_hash(rig.client, tid)
    assert after != before  # the fold needs no model: it applied
    assert message_ids(rig.store.load(tid)) == turn_ids(3, 6)  # the recent window, the rest in the archive
    assert rig.store.load(tid).summary == FOLDED  # as the fold wrote it: no gist
    everything = json.dumps([after["summary"], after["notes"], after["messages"]]) + json.dumps(entries)
    assert "Rate limit" not in everything and "org-123" not in everything
    # the status code as a number of its own, not as digits inside a millisecond timestamp
    assert re.search(r"(?<![0-9])429(?![0-9])", everything) is None
    # tried again later: three model calls, each after a backoff
    calls = fake_llm.chat_requests("structured")
    assert len(calls) == 3
    # backoff base 0.2 s, doubled per retry, jitter factor 0.5-1.5: at least 0.1 s, then 0.2 s
    assert calls[1].time - calls[0].time >= 0.09 and calls[2].time - calls[1].time >= 0.19
    # and the next committed turn triggers again
    fake_llm.clear_rules()
    fake_llm.add_rule(Reply(json=ANSWER), structured=True)
    assert rig.request(tid, commit_turn(rig.store, tid, 7))
    rig.wait_outcome(tid, "applied", count=3)  # the first fold, this fold and its refinement
    assert message_ids(rig.store.load(tid)) == turn_ids(4, 7)


# ------------------------------------------------------------------------------------------ B2


def test_b2_a_turn_committed_during_compaction_is_kept_exactly_once(compaction_rig, fake_llm):
    rig = compaction_rig
    gate = threading.Event()
    calls = []

    def model(body):
        calls.append(folded_section(body))
        if len(calls) == 1:
            time.sleep(2.0)  # the refinement's model call takes 2 s
            return ANSWER
        gate.wait(10)  # the refinement asked again waits until the test has looked
        return {"summary": "They chatted about the numbers one to three.", "pinnedDecisions": []}

    fake_llm.add_rule(model, structured=True)
    tid = thread_id_for("b2")
    sent = fold_now(rig, tid, seed_turns(rig.store, tid, 6))
    first = []
    refining = threading.Thread(target=lambda: first.extend(refine_now(rig, tid, sent)))
    refining.start()
    fake_llm.wait_for_requests(1, "structured")  # the fold applied; its refinement asks the model
    seventh = commit_turn(rig.store, tid, 7)  # while the model call is in flight
    assert seventh.appended
    fold_now(rig, tid, seventh)  # the fold of turn 3 never waits for the model
    refining.join(10)
    assert [o.outcome for o in first] == ["stale"]  # it read the thread before that fold: discarded
    state = rig.store.load(tid)
    assert message_ids(state) == turn_ids(4, 7)
    assert state.summary == record(1, 3, asked(1), asked(2), asked(3))
    assert calls[0] == rendered([1, 2])
    gate.set()
    assert [o.outcome for o in refine_now(rig, tid, sent)] == ["applied"]  # asked again later
    final = rig.store.load(tid)
    assert message_ids(final) == turn_ids(4, 7)
    assert [m.id for m in final.messages].count("u7") == 1
    assert calls[1] == rendered([1, 2, 3])  # every turn folded since the last refinement
    assert "- About: They chatted about the numbers one to three." in final.summary


# ------------------------------------------------------------------------------------------ B5


def unique_word(k: int) -> str:
    return "".join(chr(97 + (k // 26 ** i) % 26) for i in range(3))


def b5_turn(store, tid, n):
    return commit_turn(store, tid, n, user=f"let us talk about topic {unique_word(n)} and ticket INC-{1000 + n}",
                       assistant=f"topic {unique_word(n)} is noted with ticket INC-{1000 + n}, and" + " more" * 40)


def test_b5_ten_cycles_keep_the_summary_bounded_and_never_nest_an_earlier_one(compaction_rig, fake_llm):
    rig = compaction_rig
    fake_llm.add_rule(lambda body: {"summary": "They talk about a topic and a ticket each turn.", "pinnedDecisions": []},
                      structured=True)
    rig.worker()
    tid = thread_id_for("b5")
    summaries: list[str] = []
    n = 0
    for cycle in range(1, 11):
        for _ in range(6):
            n += 1
            result = b5_turn(rig.store, tid, n)
        assert rig.request(tid, result)
        rig.wait_outcome(tid, "applied", count=2 * cycle)
        wait_no_refinement(rig, tid)
        summary = rig.store.load(tid).summary
        assert len(summary) <= 2500
        assert [s for s in summaries if s in summary] == []  # no earlier summary inside the new one
        lines = summary.splitlines()
        assert len(lines) == len(set(lines))  # no statement twice
        summaries.append(summary)
    assert message_ids(rig.store.load(tid)) == turn_ids(57, 60)
    assert len(set(summaries)) == 10
    assert "INC-1056" in summaries[-1]  # the newest statements stay; the oldest made room (fitting policy)
    # the model never receives a summary, so it can never nest one
    assert not any("Statements kept from earlier turns" in json.dumps(r.body) for r in fake_llm.chat_requests("structured"))


def test_b5_a_model_repeating_the_same_gist_never_gets_it_stored_twice(compaction_rig, fake_llm):
    rig = compaction_rig
    gist = "They talk about a topic and a ticket each turn."
    fake_llm.add_rule(Reply(json={"summary": gist, "pinnedDecisions": []}), structured=True)
    rig.worker()
    tid = thread_id_for("b5 always")
    n = 0
    for cycle in range(1, 11):
        for _ in range(6):
            n += 1
            result = b5_turn(rig.store, tid, n)
        assert rig.request(tid, result)
        rig.wait_outcome(tid, "applied", count=2 * cycle)
        wait_no_refinement(rig, tid)
        state = rig.store.load(tid)
        assert len(state.summary) <= 2500 and len(state.messages) == 8
        # once, and only until the summary nears its limit: About lines are the first to make room
        assert state.summary.count("- About: " + gist) == (1 if cycle <= 2 else state.summary.count(gist)) <= 1
    assert [(e["outcome"], e["reason"]) for e in history(rig.client, tid) if e["step"] == "refine"] == \
        [("applied", "llm")] * 10


# ------------------------------------------------------------------------------------------ B10


@pytest.mark.slow
def test_b10_after_a_redis_restart_the_idle_worker_compacts_again_and_events_flow(
        make_compaction_rig, fake_llm):
    server = start_embedded_server()
    port = server.port
    url = f"redis://127.0.0.1:{port}/0"
    hub = None
    try:
        rig = make_compaction_rig(redis_url=url)
        fake_llm.add_rule(Reply(json=ANSWER), structured=True)
        frames: list[dict] = []
        hub = EventHub(lambda: make_redis(url, max_connections=2, socket_timeout=5.0))
        tid = thread_id_for("b10")
        hub.register(tid, frames.append)
        assert hub.subscribed.wait(5)
        rig.worker()
        assert rig.request(tid, seed_turns(rig.store, tid, 6))
        rig.wait_outcome(tid, "applied", count=2)
        wait_until(lambda: [f["status"] for f in frames] == ["succeeded", "started", "succeeded"],
                   message="events before")

        server.stop()  # Redis restarts on the same port while the worker is idle (data is gone)
        wait_until(lambda: not hub.subscribed.is_set(), message="the page's subscription to notice")
        server = start_embedded_server(port=port)
        assert hub.subscribed.wait(15)

        result = seed_turns(rig.store, tid, 6, start=11)  # new turns are committed
        assert result.message_count == 12
        assert rig.request(tid, result)
        rig.wait_outcome(tid, "applied", count=2, timeout=30)  # the same worker consumes again
        assert message_ids(rig.store.load(tid)) == turn_ids(13, 16)
        wait_until(lambda: [f["status"] for f in frames] == ["succeeded", "started", "succeeded"] * 2, timeout=15,
                   message="events after the restart")
        rig.close()  # stop the worker while its Redis is up
    finally:
        if hub is not None:
            hub.stop()
        server.stop()


# ------------------------------------------------------------------------------------------ B8


def test_b8_special_token_spellings_are_compacted_without_an_error(compaction_rig, fake_llm):
    """B8, compaction part: text spelling <|endoftext|> / <|im_start|> is folded like any other text."""
    rig = compaction_rig
    special_user = "Our tokenizer v2 must keep <|endoftext|> and <|im_start|>system as plain text."
    special_answer = ("<|endoftext|> ends a document; <|im_start|> opens a message. <|im_end|> "
                      + "Tokenizers treat such spellings specially only when asked to. " * 4)
    summary = "They asked what <|endoftext|> and <|im_start|> mean; both are special tokens."
    fake_llm.add_rule(Reply(json={"summary": summary, "pinnedDecisions": []}), structured=True)
    tid = thread_id_for("b8")
    commit_turn(rig.store, tid, 1, user=special_user, assistant=special_answer)
    result = seed_turns(rig.store, tid, 5, start=2)
    assert result.message_count == 12
    assert rig.request(tid, result)
    sent = []
    fold = run_compaction(rig.services, tid, result.version, send_refine=lambda *args: sent.append(args))
    assert fold.outcome == "applied"
    [outcome] = refine_now(rig, tid, sent)
    assert outcome.outcome == "applied"
    # the model was sent the special-token text verbatim, as ordinary text
    assert special_user in folded_section(fake_llm.last_request(kind="structured").body)
    state = rig.store.load(tid)
    assert message_ids(state) == turn_ids(3, 6)
    assert outcome.reason == "llm" and "- About: " + summary in state.summary.splitlines()
    assert "- Person (turn 1): " + special_user in state.summary.splitlines()
