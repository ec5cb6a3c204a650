"""The compaction task with a real Celery worker, the real Redis and the fake LLM over HTTP.

Every test asserts the exact stored state afterwards.  Waiting is polling with a
deadline on an observable event (history entry, marker released, model request).
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from app.compaction.requests import TASK_NAME, queued_marker_ttl
from app.compaction.service import (
    MESSAGE_FAILED,
    MESSAGE_FOLDED,
    MESSAGE_RETRYING,
    MESSAGE_SUCCEEDED,
    prepare,
    produce,
    run_refinement,
)
from app.extensions import Services
from app.llm.provider import LLMError
from app.memory import compaction as domain
from app.memory.context import format_summary
from app.memory.migration import read_record
from app.memory.state import PINNED_BY_PERSON, Pin
from app.store.keys import ThreadKeys
from chat_support.fake_llm import Reply
from tests.fixtures.celery_worker import (
    asked,
    assistant_text,
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
    wait_until,
)
from workers.tasks import compact_thread

ROOT = Path(__file__).resolve().parent.parent
ANSWER = {"summary": "They chatted about the numbers one and two.", "pinnedDecisions": ["Keep answers short"]}
SUMMARY = ("Statements kept from earlier turns:\n- About: They chatted about the numbers one and two.\n"
           "(turns 1–2 of this conversation)")
FOLDED = ("Statements kept from earlier turns:\n- Asked (turn 1): tell me something nice about the number one please\n"
          "- Asked (turn 2): tell me something nice about the number two please\n(turns 1–2 of this conversation)")
REFINED = FOLDED.replace("\n(turns", "\n- About: They chatted about the numbers one and two.\n(turns")
HISTORY_KEYS = {"at", "outcome", "reason", "step", "attempt", "durationMs", "turnsFolded", "tokensBefore", "tokensAfter",
                "summaryChars", "notesCount", "factRetention", "factsChecked", "factsDropped", "factsSkipped",
                "unreadShare"}

@pytest.fixture
def make_compaction_rig(make_compaction_rig):
    """These tests see the fold and its refinement back to back: a refinement after every fold
    (``COMPACTION_REFINE_AFTER_FOLDS=1``; nothing streams in them)."""
    def make(**overrides):
        return make_compaction_rig(**{"compaction_refine_after_folds": 1, **overrides})
    return make


@pytest.fixture
def compaction_rig(make_compaction_rig):
    return make_compaction_rig()



# ------------------------------------------------------------------------------------------ request


def test_a_request_sets_one_marker_and_enqueues_only_the_thread_id_and_version(compaction_rig):
    rig = compaction_rig
    tid = thread_id_for("request")
    result = seed_turns(rig.store, tid, 5)
    assert rig.request(tid, result) is True
    marker = ThreadKeys(tid).compacting
    assert rig.client.get(marker) == str(result.version) == "5"
    assert queued_marker_ttl(rig.settings) == rig.settings.compaction_queued_ttl == 60  # COMPACTION_QUEUED_TTL_SECONDS
    assert 58 <= rig.client.ttl(marker) <= 60
    assert rig.request(tid, result) is False  # one pending per thread
    queued = rig.client.lrange("compaction", 0, -1)
    assert len(queued) == 1
    envelope = json.loads(queued[0])
    args, kwargs, _ = json.loads(base64.b64decode(envelope["body"]))
    assert (envelope["headers"]["task"], args, kwargs) == (TASK_NAME, [tid, 5], {})
    assert "number" not in queued[0]  # no message text travels


def test_a_thread_of_eight_messages_requests_nothing(compaction_rig):
    rig = compaction_rig
    tid = thread_id_for("eight")
    result = seed_turns(rig.store, tid, 4)
    assert rig.request(tid, result) is False
    assert rig.client.exists(ThreadKeys(tid).compacting) == 0
    assert rig.client.llen("compaction") == 0


def test_a_request_with_the_store_down_returns_false_without_raising(settings):
    down = Services(settings.with_overrides(redis_url="redis://127.0.0.1:1/0", redis_socket_timeout=0.5))
    assert down.compaction_requests.after_commit(thread_id_for("down"), message_count=12, uncompacted_tokens=10,
                                                 version=6) is False


# ------------------------------------------------------------------------------------------ applied


def test_the_worker_folds_the_oldest_turns_publishes_and_records(compaction_rig, fake_llm):
    rig = compaction_rig
    fake_llm.add_rule(Reply(json=ANSWER), structured=True)
    rig.worker()
    tid = thread_id_for("applied")
    result = seed_turns(rig.store, tid, 6)
    before = rig.store.load(tid)
    assert rig.request(tid, result)
    rig.wait_outcome(tid, "applied", count=2)  # the fold, then its refinement
    rig.wait_idle(tid)

    state = rig.store.load(tid)
    assert message_ids(state) == turn_ids(3, 6)
    assert (state.summary, state.pins, state.notes) == (REFINED, (), ())  # "Keep answers short": not the person's
    assert (state.version, state.gen) == (before.version + 2, before.gen + 2)
    assert set(raw_hash(rig.client, tid)) == {"v", "gen", "messages", "summary", "notes", "lastCompactedAt", "ft", "ab",
                                              "uf", "rf", "born"}
    # the folded turns are in the archive, numbered, as committed; the thread counts them
    archived = rig.client.zrange(ThreadKeys(tid).archive, 0, -1, withscores=True)
    assert [(json.loads(m)["n"], score) for m, score in archived] == [(1, 1.0), (2, 2.0)]
    assert [[x["id"] for x in json.loads(m)["m"]] for m, _ in archived] == [["u1", "a1"], ["u2", "a2"]]
    assert [msg for m, _ in archived for msg in json.loads(m)["m"]] == [m.to_dict() for m in before.messages[:4]]
    assert state.folded_turns == 2 and raw_hash(rig.client, tid)["ab"] == str(sum(len(m.encode()) for m, _ in archived))
    assert 0 < rig.client.ttl(ThreadKeys(tid).archive) <= rig.settings.memory_ttl_seconds

    request = fake_llm.last_request("structured")
    assert (request.model, request.body["temperature"], request.body["max_tokens"]) == ("fake-compact", 0, 256)
    assert folded_section(request.body) == rendered([1, 2])

    assert rig.events.wait_statuses(tid, 3) == ["succeeded", "started", "succeeded"]
    events = rig.events.for_thread(tid)
    assert events[0] == {"type": "memory", "status": "succeeded", "message": MESSAGE_FOLDED, "step": "fold",
                         "summaryLength": len(FOLDED), "noteCount": 0, "turnsFolded": 2, "factRetention": 1.0}
    assert events[2] == {"type": "memory", "status": "succeeded", "message": MESSAGE_SUCCEEDED, "step": "refine",
                         "turnsRefined": 2, "modelCalls": 1}

    refine, fold = history(rig.client, tid)
    assert set(fold) == HISTORY_KEYS
    counter = rig.services.counter
    assert {k: fold[k] for k in ("outcome", "reason", "step", "attempt", "turnsFolded", "summaryChars", "notesCount",
                                 "factRetention", "factsChecked", "factsDropped", "tokensBefore", "tokensAfter")} == {
        "outcome": "applied", "reason": "extractive", "step": "fold", "attempt": 0, "turnsFolded": 2,
        "summaryChars": len(FOLDED), "notesCount": 0, "factRetention": 1.0, "factsChecked": 0, "factsDropped": 0,
        "tokensBefore": domain.messages_cost(before.messages, counter),
        "tokensAfter": domain.messages_cost(state.messages, counter) + counter.message("system",
                                                                                format_summary(read_record(FOLDED)))}
    assert fold["tokensAfter"] < fold["tokensBefore"]
    assert {k: refine[k] for k in ("outcome", "reason", "step", "turnsRefined", "modelCalls", "summaryChars")} == {
        "outcome": "applied", "reason": "llm", "step": "refine", "turnsRefined": 2, "modelCalls": 1,
        "summaryChars": len(REFINED)}
    assert refine["promptTokens"] == counter.prompt(request.messages)
    assert 0 < rig.client.ttl(ThreadKeys(tid).compactions) <= rig.settings.memory_ttl_seconds


def test_a_persons_pin_is_kept_word_for_word_and_a_grounded_decision_becomes_a_note(compaction_rig, fake_llm):
    rig = compaction_rig
    fake_llm.add_rule(Reply(json={"summary": "They talked.", "pinnedDecisions": [
        "use UTC everywhere", "We decided to keep the answers short", "Be brief"]}), structured=True)
    rig.worker()
    tid = thread_id_for("person pin")
    commit_turn(rig.store, tid, 1, user="We decided to keep the answers short from now on, please.")
    seed_turns(rig.store, tid, 4, start=2)
    assert rig.store.set_pins(tid, expected_gen=0, pins=[Pin("Use UTC everywhere!", PINNED_BY_PERSON)])
    result = commit_turn(rig.store, tid, 6)
    assert rig.request(tid, result)
    rig.wait_outcome(tid, "applied", count=2)
    state = rig.store.load(tid)
    assert state.pins == (Pin("Use UTC everywhere!", PINNED_BY_PERSON),)
    assert state.notes == ("We decided to keep the answers short",)
    assert state.summary.splitlines()[1] == "- Person (turn 1): We decided to keep the answers short from now on, please."


def test_a_duplicate_delivery_is_harmless(compaction_rig, fake_llm):
    from celery.worker import state as worker_state

    rig = compaction_rig
    fake_llm.add_rule(Reply(json=ANSWER), structured=True)
    tid = thread_id_for("duplicate")
    result = seed_turns(rig.store, tid, 6)
    assert rig.request(tid, result)
    compact_thread.apply_async(args=[tid, result.version])  # the same task delivered twice
    done_before = worker_state.total_count.get(TASK_NAME, 0)
    rig.worker()
    wait_until(lambda: worker_state.total_count.get(TASK_NAME, 0) >= done_before + 2
               and not worker_state.active_requests, message="both deliveries to finish")
    rig.wait_outcome(tid, "applied", count=2)
    state = rig.store.load(tid)
    assert message_ids(state) == turn_ids(3, 6)
    assert state.summary == REFINED
    assert [(e["outcome"], e["step"]) for e in history(rig.client, tid)] == [("applied", "refine"), ("applied", "fold")]
    assert len(fake_llm.chat_requests()) == 1
    assert rig.client.exists(ThreadKeys(tid).compacting) == 0


# ------------------------------------------------------------------------------------------ interleavings


def test_two_compactions_racing_for_one_thread_apply_exactly_once(compaction_rig, fake_llm):
    rig = compaction_rig
    fake_llm.add_rule(Reply(json=ANSWER, delay=0.4), structured=True)
    tid = thread_id_for("race")
    sent = fold_now(rig, tid, seed_turns(rig.store, tid, 6))
    outcomes = []
    threads = [threading.Thread(target=lambda: outcomes.append(
        run_refinement(rig.services, tid, sent[0][1]).outcome)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert sorted(outcomes) == ["applied", "stale"]
    assert len(fake_llm.chat_requests()) == 2
    state = rig.store.load(tid)
    assert message_ids(state) == turn_ids(3, 6)
    assert state.summary == REFINED
    assert sorted((e["outcome"], e["reason"], e["step"]) for e in history(rig.client, tid)) == \
        [("applied", "extractive", "fold"), ("applied", "llm", "refine"), ("stale", "generation", "refine")]


def test_a_clear_during_compaction_leaves_the_thread_empty(compaction_rig, fake_llm):
    rig = compaction_rig
    fake_llm.add_rule(Reply(json=ANSWER, delay=1.0), structured=True)
    rig.worker()
    tid = thread_id_for("clear")
    result = seed_turns(rig.store, tid, 6)
    assert rig.request(tid, result)
    fake_llm.wait_for_requests(1, "structured")  # the refinement asks the model...
    rig.store.clear(tid)  # ...and the thread is cleared meanwhile
    wait_until(lambda: fake_llm.chat_requests("structured") and not rig.client.exists(ThreadKeys(tid).state)
               or rig.store.load(tid).is_empty, message="the clear")
    time.sleep(1.5)  # the refinement's answer comes back (1 s) and its compare-and-set fails
    stored = raw_hash(rig.client, tid)
    assert {k: stored[k] for k in ("messages", "summary", "pins", "notes")} == {
        "messages": "[]", "summary": "", "pins": "[]", "notes": "[]"}
    assert "lastCompactedAt" not in stored
    assert rig.store.load(tid).is_empty
    assert rig.events.wait_statuses(tid, 2) == ["succeeded", "started"]


ERROR_WORDS = ("rate limit", "error", "exception", "traceback", "upstream exploded", "bad model", "compactedat",
               "cut off", "timed out", "xxxxxxxx")


@pytest.mark.parametrize("case, reply, overrides, attempts, calls, reason", [
    ("rate limited", Reply(status=429), {}, 3, 3, "rate_limited"),
    ("server error", Reply(status=500, error_message="upstream exploded"), {}, 3, 3, "unavailable"),
    ("timeout", Reply(delay=3.0), {"compaction_llm_timeout": 0.5, "compaction_max_retries": 1}, 2, 2, "timeout"),
    ("malformed json", Reply(text='{"summary": "cut off'), {}, 3, 3, "invalid_answer"),
    ("extra keys", Reply(json={**ANSWER, "compactedAt": "2020-01-01T00:00:00Z"}), {}, 3, 3, "invalid_answer"),
    ("missing summary", Reply(json={"pinnedDecisions": []}), {}, 3, 3, "invalid_answer"),
    ("refused", Reply(status=400, error_message="bad model"), {}, 1, 1, "bad_request"),
])
def test_a_failed_refinement_leaves_the_record_as_the_fold_wrote_it(make_compaction_rig, fake_llm, case, reply,
                                                                     overrides, attempts, calls, reason):
    rig = make_compaction_rig(**overrides)
    fake_llm.add_rule(reply, structured=True)
    tid = thread_id_for(case)
    sent = fold_now(rig, tid, seed_turns(rig.store, tid, 6))
    folded = rig.store.load(tid)
    assert (folded.summary, message_ids(folded)) == (FOLDED, turn_ids(3, 6))
    outcomes = refine_now(rig, tid, sent)

    assert [o.outcome for o in outcomes] == ["failed"] * attempts
    state = rig.store.load(tid)
    assert (state.summary, state.notes, state.messages) == (folded.summary, folded.notes, folded.messages)
    assert rig.client.hget(ThreadKeys(tid).state, "rf") == "2"  # marked refined: not asked again for them
    entries = [e for e in history(rig.client, tid) if e["step"] == "refine"]
    stored = raw_hash(rig.client, tid)
    everything = (json.dumps([stored["summary"], stored["notes"], stored["messages"]]) + json.dumps(entries)).lower()
    assert [word for word in ERROR_WORDS if word in everything] == []
    assert [(e["outcome"], e["reason"], e["attempt"]) for e in reversed(entries)] == \
        [("failed", reason, n) for n in range(attempts)]
    assert len(fake_llm.chat_requests()) == calls
    assert rig.events.wait_statuses(tid, 1 + 2 * attempts) == ["succeeded"] + ["started", "failed"] * attempts
    events = [e for e in rig.events.for_thread(tid) if e["step"] == "refine"]
    assert [e["message"] for e in events if e["status"] == "failed"] == \
        [MESSAGE_RETRYING] * (attempts - 1) + [MESSAGE_FAILED]
    assert all(set(e) <= {"type", "status", "message", "reason", "retrying", "step"} for e in events)
    assert not rig.client.exists(ThreadKeys(tid).refining)


def test_after_the_last_retry_the_next_refinement_asks_about_its_own_turns_only(make_compaction_rig, fake_llm):
    rig = make_compaction_rig(compaction_max_retries=0)
    fake_llm.enqueue(Reply(status=503), structured=True)
    fake_llm.add_rule(Reply(json=ANSWER), structured=True)
    tid = thread_id_for("next turn")
    sent = fold_now(rig, tid, seed_turns(rig.store, tid, 6))
    assert [o.outcome for o in refine_now(rig, tid, sent)] == ["failed"]
    assert message_ids(rig.store.load(tid)) == turn_ids(3, 6)
    sent = fold_now(rig, tid, commit_turn(rig.store, tid, 7))
    assert [o.outcome for o in refine_now(rig, tid, sent)] == ["applied"]
    state = rig.store.load(tid)
    assert message_ids(state) == turn_ids(4, 7)
    assert folded_section(fake_llm.last_request("structured").body) == rendered([3])


def test_an_over_limit_answer_is_asked_once_more_with_the_limit_stated(compaction_rig, fake_llm):
    rig = compaction_rig
    long_answer = {"summary": "y" * 2600, "pinnedDecisions": []}
    fake_llm.enqueue(Reply(json=long_answer), structured=True)
    fake_llm.add_rule(Reply(json=ANSWER), structured=True)
    tid = thread_id_for("limit")
    refine_now(rig, tid, fold_now(rig, tid, seed_turns(rig.store, tid, 6)))
    assert rig.store.load(tid).summary == REFINED
    second = fake_llm.chat_requests("structured")[1].body["messages"]
    assert [m["role"] for m in second] == ["system", "user", "assistant", "user"]
    assert second[2]["content"] == json.dumps(long_answer)
    assert "summary: String should have at most 300 characters" in second[3]["content"]


def test_a_second_unusable_answer_gives_the_fold_without_the_model(compaction_rig, fake_llm):
    rig = compaction_rig
    fake_llm.add_rule(Reply(json={"summary": "Wang Fang said the deadline is 2025-09-01.", "pinnedDecisions": []}),
                      structured=True)
    tid = thread_id_for("ungrounded twice")
    refine_now(rig, tid, fold_now(rig, tid, seed_turns(rig.store, tid, 6)))
    state = rig.store.load(tid)
    assert state.summary == record(1, 2, asked(1), asked(2)) == FOLDED
    assert [(e["outcome"], e["reason"], e["step"]) for e in history(rig.client, tid)] == [
        ("applied", "extractive", "refine"), ("applied", "extractive", "fold")]
    requests = fake_llm.chat_requests("structured")
    assert len(requests) == 2
    assert "these names, numbers or dates are not in the turns: Wang Fang; 2025-09-01" in \
        requests[1].body["messages"][-1]["content"]


def test_the_model_never_sees_the_summary_and_a_second_fold_appends_to_it(compaction_rig, fake_llm):
    rig = compaction_rig
    fake_llm.enqueue(Reply(json=ANSWER), structured=True)
    fake_llm.add_rule(Reply(json={"summary": "Then they chatted about the number three.", "pinnedDecisions": []}),
                      structured=True)
    tid = thread_id_for("append")
    refine_now(rig, tid, fold_now(rig, tid, seed_turns(rig.store, tid, 6)))
    refine_now(rig, tid, fold_now(rig, tid, commit_turn(rig.store, tid, 7)))
    state = rig.store.load(tid)
    assert (state.summary, message_ids(state)) == (
        record(1, 3, asked(1), asked(2), "- About: They chatted about the numbers one and two.", asked(3),
               "- About: Then they chatted about the number three."), turn_ids(4, 7))
    second = fake_llm.chat_requests("structured")[1].body
    assert folded_section(second) == rendered([3])
    assert "numbers one and two" not in json.dumps(second)


def test_the_extractive_strategy_calls_no_model(make_compaction_rig, fake_llm):
    rig = make_compaction_rig(compaction_strategy="extractive")
    rig.worker()
    tid = thread_id_for("extractive")
    assert rig.request(tid, seed_turns(rig.store, tid, 6))
    rig.wait_outcome(tid, "applied")
    state = rig.store.load(tid)
    assert message_ids(state) == turn_ids(3, 6)
    assert state.summary == record(1, 2, asked(1), asked(2))
    assert fake_llm.chat_requests() == []


def test_a_provider_without_json_schema_still_compacts(compaction_rig, fake_llm):
    rig = compaction_rig
    fake_llm.reject_json_schema = True
    fake_llm.add_rule(Reply(json=ANSWER), structured=True)
    tid = thread_id_for("llama")
    refine_now(rig, tid, fold_now(rig, tid, seed_turns(rig.store, tid, 6)))
    assert rig.store.load(tid).summary == REFINED
    assert [r.response_format["type"] for r in fake_llm.chat_requests()] == ["json_schema", "json_object"]


def test_no_model_call_starts_past_the_tasks_deadline(compaction_rig, fake_llm):
    rig = compaction_rig
    tid = thread_id_for("deadline")
    seed_turns(rig.store, tid, 6)
    prepared = prepare(rig.services, tid)
    with pytest.raises(LLMError) as info:
        produce(rig.services, prepared, deadline=time.monotonic() + 0.5)
    assert (info.value.category, info.value.retryable) == ("timeout", True)
    assert fake_llm.chat_requests() == []


# ------------------------------------------------------------------------------------------ facts

PLANTED = ("Hi, I'm Marta Kowalski. Incident INC-4821 started on 2024-03-15 in eu-west-2 and we need a "
           "post-mortem by Friday.")
PLANTED_FACTS = ["Marta Kowalski", "INC-4821", "2024-03-15", "eu-west-2"]


def paraphrasing_model(body: dict) -> dict:
    """A model that keeps the gist and loses every concrete fact (and ignores requests to keep them)."""
    topics = re.findall(r"the number (\w+)", folded_section(body))
    last_topic = topics[-1] if topics else "zero"
    return {"summary": f"Someone from operations reported a regional outage earlier; small talk followed, "
                       f"lately about the number {last_topic}.", "pinnedDecisions": []}


@pytest.mark.slow  # about 15 s: thirty turns, each folded and refined by the worker
def test_planted_facts_survive_thirty_turns_of_small_talk_with_a_paraphrasing_model(compaction_rig, fake_llm):
    rig = compaction_rig
    fake_llm.add_rule(paraphrasing_model, structured=True)
    rig.worker()
    tid = thread_id_for("facts")
    commit_turn(rig.store, tid, 1, user=PLANTED, assistant="Thanks, noted. Let's keep chatting meanwhile.")
    for n in range(2, 32):
        result = commit_turn(rig.store, tid, n)
        if rig.request(tid, result):
            rig.wait_quiet(tid)  # applied, or skipped while folding would free too little
    rig.wait_quiet(tid)
    applied = [e for e in history(rig.client, tid) if e["outcome"] == "applied" and e["step"] == "fold"]
    assert len(applied) >= 5
    state = rig.store.load(tid)
    memory = state.summary + "\n" + "\n".join(state.notes)
    assert [f for f in PLANTED_FACTS if f not in memory] == []
    assert state.summary.splitlines()[1] == "- Person (turn 1): " + PLANTED
    assert message_ids(state)[-8:] == turn_ids(28, 31) and len(state.messages) <= 10
    assert all(e["factRetention"] == 1.0 and e["factsDropped"] == 0 for e in applied)
    assert applied[-1]["factsChecked"] >= len(PLANTED_FACTS)


# ------------------------------------------------------------------------------------------ SIGKILL


def worker_process(settings, log_path: Path, name: str) -> subprocess.Popen:
    """``celery -A celery_app worker -Q compaction,refine --pool solo`` configured like the rig (environment only)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REDIS", "OPENAI", "COMPACTION", "MEMORY"))}
    env.update({
        "APP_ENV": "test", "REDIS_URL": settings.redis_url, "SECRET_KEY": "k" * 64,
        "OPENAI_BASE_URL": settings.openai_base_url, "OPENAI_API_KEY": "test-key",
        "CHAT_MODEL": "fake-chat", "COMPACTION_MODEL": "fake-compact",
        "COMPACTION_LLM_TIMEOUT_SECONDS": "30", "COMPACTION_VISIBILITY_TIMEOUT_SECONDS": "1",
        "COMPACTION_REFINE_AFTER_FOLDS": "1",
    })
    log = open(log_path, "w")
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "celery_app", "worker", "-Q", "compaction,refine", "--pool", "solo",
         "--loglevel", "INFO", "--without-heartbeat", "--without-mingle", "--without-gossip", "-n", f"{name}@%h"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)


@pytest.mark.slow
def test_a_worker_killed_mid_task_is_redelivered_and_the_compaction_applies_once(compaction_rig, fake_llm, tmp_path):
    rig = compaction_rig
    fake_llm.enqueue(Reply(json=ANSWER, delay=60), structured=True)  # worker A dies while waiting for this
    fake_llm.add_rule(Reply(json=ANSWER), structured=True)
    tid = thread_id_for("sigkill")
    result = seed_turns(rig.store, tid, 6)
    before = raw_hash(rig.client, tid)
    first = worker_process(rig.settings, tmp_path / "a.log", "a")
    second = None
    try:
        assert rig.request(tid, result)
        fake_llm.wait_for_requests(1, "structured", timeout=30)  # the refinement, after the fold
        os.kill(first.pid, signal.SIGKILL)
        assert first.wait(10) == -signal.SIGKILL
        assert rig.store.load(tid).summary == FOLDED and raw_hash(rig.client, tid) != before
        assert [e["step"] for e in history(rig.client, tid)] == ["fold"]
        # The unacknowledged message is redelivered once its visibility timeout (1 s) has passed.
        wait_until(lambda: any(time.time() - score > 1.5
                               for _, score in rig.client.zrange("unacked_index", 0, -1, withscores=True)),
                   message="the visibility timeout to pass")
        second = worker_process(rig.settings, tmp_path / "b.log", "b")
        rig.wait_outcome(tid, "applied", count=2, timeout=30)
        state = rig.store.load(tid)
        assert message_ids(state) == turn_ids(3, 6)
        assert state.summary == REFINED
        assert [(e["outcome"], e["step"]) for e in history(rig.client, tid)] == [("applied", "refine"),
                                                                                   ("applied", "fold")]
        assert len(fake_llm.chat_requests("structured")) == 2
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                os.kill(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    os.kill(proc.pid, signal.SIGKILL)
                    proc.wait(5)


# ------------------------------------------------------------------------------------------ Chinese, windows, growth

CHINESE_PLANTS = {1: "我叫林伟，工单号是INC-4471。", 2: "我们决定把数据库迁移推迟到4月2日，负责人是王芳。",
                  3: "项目预算是9000欧元，系统在2025年3月14日上线。"}
CHINESE_FACTS = ["林伟", "INC-4471", "4月2日", "王芳", "9000欧元", "2025年3月14日"]
CHINESE_FILLER = "我们聊聊别的吧😀，今天天气不错，你觉得周末去公园散步怎么样？顺便说说你最喜欢的水果。"
CHINESE_FILLERS = ["换个话题吧，", "再聊一会儿，", "说点轻松的，", "闲聊一下，", "顺便问问，"]
CHINESE_ANSWER = "好的😀。" + "这是一个很好的问题，我们可以从几个方面来看，先了解背景，再比较不同做法的优缺点，最后再做决定。" * 3


def chinese_paraphrase(body: dict) -> dict:
    """A model that answers in Chinese and drops every name, date, id and amount."""
    return {"summary": "用户介绍了自己和项目的安排，之后聊了些日常话题。", "pinnedDecisions": ["用户做了一些决定。"]}


@pytest.mark.slow  # about 14 s each: thirty turns, each folded and refined by the worker
@pytest.mark.parametrize("context_tokens", [1500, 4096, 8192])
def test_thirty_chinese_turns_keep_every_planted_fact_after_every_compaction_and_no_request_passes_the_window(
        make_compaction_rig, fake_llm, context_tokens):
    """At 1,500 tokens the record may hold about 119 tokens: there the window and the caps are checked, and
    facts are let go by the fitting policy; from 4,096 on every planted fact stays."""
    rig = make_compaction_rig(model_context_tokens=context_tokens)
    fake_llm.add_rule(chinese_paraphrase, structured=True)
    rig.worker()
    tid = thread_id_for(f"chinese {context_tokens}")
    budget = rig.settings.prompt_budget
    counter = rig.services.counter
    checked = 0
    for n in range(1, 31):
        result = commit_turn(rig.store, tid, n, user=CHINESE_PLANTS.get(n, CHINESE_FILLERS[n % 5] + CHINESE_FILLER),
                             assistant=CHINESE_ANSWER)
        if rig.request(tid, result):
            rig.wait_quiet(tid)
        state = rig.store.load(tid)
        if state.summary:
            memory = "\n".join([state.summary, *state.notes, *(m.text for m in state.messages)])
            planted = [f for k, text in CHINESE_PLANTS.items() if k <= n for f in CHINESE_FACTS if f in text]
            if context_tokens > 1500:
                assert [f for f in planted if f not in memory] == [], f"after turn {n}: {state.summary}"
            assert counter.count(state.summary) <= domain.summary_token_cap(budget)
            checked += 1
    assert checked >= 10
    applied = [e for e in history(rig.client, tid) if e["outcome"] == "applied" and e["step"] == "fold"]
    assert applied and all(e["tokensAfter"] < e["tokensBefore"] for e in applied)
    requests = fake_llm.chat_requests("structured")
    assert requests and all(counter.prompt(r.messages) <= budget for r in requests)
    assert all(r.body["max_tokens"] == domain.MAX_OUTPUT_TOKENS for r in requests)
    assert rig.store.load(tid).notes == ()  # "用户做了一些决定。" is not grounded in the person's words


def test_the_refinement_asks_for_a_gist_of_at_most_300_characters(compaction_rig, fake_llm):
    rig = compaction_rig
    fake_llm.add_rule(Reply(json=ANSWER), structured=True)
    tid = thread_id_for("gist limit")
    refine_now(rig, tid, fold_now(rig, tid, seed_turns(rig.store, tid, 6)))
    [request] = fake_llm.chat_requests("structured")
    stated = re.search(r"at most (\d+) characters, saying", request.messages[0]["content"]).group(1)
    assert 60 <= int(stated) <= 300


def test_without_room_for_a_gist_the_model_is_not_asked(compaction_rig, fake_llm):
    rig = compaction_rig
    fake_llm.add_rule(Reply(json=ANSWER), structured=True)
    rig.worker()
    tid = thread_id_for("no room")
    # one turn to fold that frees a little more than the gain rule asks: about 12 tokens of room, no gist fits
    commit_turn(rig.store, tid, 1, assistant=assistant_text(1) + " and so on")
    assert rig.request(tid, seed_turns(rig.store, tid, 4, start=2))
    rig.wait_outcome(tid, "applied")
    assert rig.store.load(tid).summary == record(1, 1, asked(1))
    assert [(e["outcome"], e["reason"]) for e in history(rig.client, tid)] == [("applied", "extractive")]
    assert fake_llm.chat_requests("structured") == []


@pytest.mark.parametrize("backoff, retries, low, high", [
    (10.0, 0, 5.0, 10.0),
    (10.0, 1, 10.0, 20.0),
    (10.0, 3, 40.0, 80.0),
    (10.0, 6, 300.0, 600.0),  # 640 s capped at RETRY_BACKOFF_MAX_SECONDS
    (0.2, 0, 0.1, 0.2),  # fractions of a second are kept (the test rigs' backoff)
    (0.2, 1, 0.2, 0.4),
])
def test_a_retry_waits_between_half_the_interval_and_the_interval(monkeypatch, backoff, retries, low, high):
    from types import SimpleNamespace

    import app.compaction.service as service

    settings = SimpleNamespace(compaction_retry_backoff=backoff)
    monkeypatch.setattr(service.random, "uniform", lambda a, b: a)
    assert service.retry_countdown(settings, retries) == low
    monkeypatch.setattr(service.random, "uniform", lambda a, b: b)
    assert service.retry_countdown(settings, retries) == high
    monkeypatch.undo()
    waits = [service.retry_countdown(settings, retries) for _ in range(200)]
    assert all(low <= wait <= high for wait in waits) and len(set(waits)) > 1
