"""The compaction task with a real Celery worker, the real Redis and the fake LLM over HTTP (issue 4).

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

from app.extensions import Services
from app.memory.state import PINNED_BY_MODEL, PINNED_BY_PERSON, Pin
from app.store.keys import ThreadKeys
from tests.fake_llm import Reply
from tests.fixtures.celery_worker import (commit_turn, folded_section, history, raw_hash, rendered, seed_turns,
                                          thread_id_for, wait_until)
from workers import compaction as worker_mod
from app.llm.provider import LLMError
from workers.compaction import (MESSAGE_FAILED, MESSAGE_RETRYING, TASK_NAME, marker_ttl, prepare, produce,
                                request_compaction, run_compaction)

ROOT = Path(__file__).resolve().parent.parent
ANSWER = {"summary": "They chatted about the numbers one and two.", "pinnedDecisions": ["Keep answers short"]}
HISTORY_KEYS = {"at", "outcome", "reason", "attempt", "durationMs", "turnsFolded", "tokensBefore", "tokensAfter",
                "summaryChars", "pinsCount", "factRetention", "factRetentionFinal", "factsCarried", "factsLost"}


def ids(state) -> list[str]:
    return [m.id for m in state.messages]


def turn_ids(first: int, last: int) -> list[str]:
    return [x for n in range(first, last + 1) for x in (f"u{n}", f"a{n}")]


# ------------------------------------------------------------------------------------------ request


def test_a_request_sets_one_marker_and_enqueues_only_the_thread_id_and_version(compaction_rig):
    rig = compaction_rig
    tid = thread_id_for("request")
    result = seed_turns(rig.store, tid, 5)
    assert rig.request(tid, result) is True
    marker = ThreadKeys(tid).compacting
    assert rig.client.get(marker) == str(result.version) == "5"
    assert marker_ttl(rig.settings) - 2 <= rig.client.ttl(marker) <= marker_ttl(rig.settings)
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
    assert request_compaction(down, thread_id_for("down"), message_count=12, uncompacted_tokens=10, version=6) is False


# ------------------------------------------------------------------------------------------ applied


def test_the_worker_folds_the_oldest_turns_publishes_and_records(compaction_rig, fake_llm):
    rig = compaction_rig
    fake_llm.add_rule(Reply(json=ANSWER), structured=True)
    rig.worker()
    tid = thread_id_for("applied")
    result = seed_turns(rig.store, tid, 6)
    before = rig.store.load(tid)
    assert rig.request(tid, result)
    rig.wait_outcome(tid, "applied")
    rig.wait_idle(tid)

    state = rig.store.load(tid)
    assert ids(state) == turn_ids(3, 6)
    assert (state.summary, state.pins) == (ANSWER["summary"], (Pin("Keep answers short", PINNED_BY_MODEL),))
    assert (state.version, state.gen) == (before.version + 1, before.gen + 1)
    assert set(raw_hash(rig.client, tid)) == {"v", "gen", "messages", "summary", "pins", "lastCompactedAt"}

    request = fake_llm.last_request("structured")
    assert (request.model, request.body["temperature"]) == ("fake-compact", 0)
    assert folded_section(request.body) == rendered([1, 2])

    assert rig.events.wait_statuses(tid, 2) == ["started", "succeeded"]
    events = rig.events.for_thread(tid)
    assert events[1] == {"type": "memory", "status": "succeeded", "message": "Older turns were summarized.",
                         "summaryLength": len(ANSWER["summary"]), "pinnedDecisionCount": 1, "turnsFolded": 2,
                         "factRetention": 1.0}

    [entry] = history(rig.client, tid)
    assert set(entry) == HISTORY_KEYS
    counter = rig.services.counter
    kept_tokens = sum(counter.count(m.text) for m in state.messages)
    assert {k: entry[k] for k in ("outcome", "reason", "attempt", "turnsFolded", "summaryChars", "pinsCount",
                                  "factRetention", "factsCarried", "factsLost", "tokensBefore", "tokensAfter")} == {
        "outcome": "applied", "reason": "llm", "attempt": 0, "turnsFolded": 2, "summaryChars": 43, "pinsCount": 1,
        "factRetention": 1.0, "factsCarried": 0, "factsLost": 0,
        "tokensBefore": sum(counter.count(m.text) for m in before.messages),
        "tokensAfter": kept_tokens + counter.count(ANSWER["summary"]) + counter.count("Keep answers short")}
    assert 0 < rig.client.ttl(ThreadKeys(tid).compactions) <= rig.settings.memory_ttl_seconds


def test_a_persons_pin_is_kept_word_for_word(compaction_rig, fake_llm):
    rig = compaction_rig
    fake_llm.add_rule(Reply(json={"summary": "They talked.", "pinnedDecisions": ["use UTC everywhere", "Be brief"]}),
                      structured=True)
    rig.worker()
    tid = thread_id_for("person pin")
    seed_turns(rig.store, tid, 5)
    assert rig.store.set_pins(tid, expected_gen=0, pins=[Pin("Use UTC everywhere!", PINNED_BY_PERSON)])
    result = commit_turn(rig.store, tid, 6)
    assert rig.request(tid, result)
    rig.wait_outcome(tid, "applied")
    assert rig.store.load(tid).pins == (Pin("Use UTC everywhere!", PINNED_BY_PERSON), Pin("Be brief", PINNED_BY_MODEL))


def test_a_duplicate_delivery_is_harmless(compaction_rig, fake_llm):
    from celery.worker import state as worker_state

    rig = compaction_rig
    fake_llm.add_rule(Reply(json=ANSWER), structured=True)
    tid = thread_id_for("duplicate")
    result = seed_turns(rig.store, tid, 6)
    assert rig.request(tid, result)
    worker_mod.compact_thread.apply_async(args=[tid, result.version])  # the same task delivered twice
    done_before = worker_state.total_count.get(TASK_NAME, 0)
    rig.worker()
    wait_until(lambda: worker_state.total_count.get(TASK_NAME, 0) >= done_before + 2
               and not worker_state.active_requests, message="both deliveries to finish")
    state = rig.store.load(tid)
    assert ids(state) == turn_ids(3, 6)
    assert state.summary == ANSWER["summary"]
    assert [e["outcome"] for e in history(rig.client, tid)] == ["applied"]
    assert len(fake_llm.chat_requests()) == 1
    assert rig.client.exists(ThreadKeys(tid).compacting) == 0


# ------------------------------------------------------------------------------------------ interleavings


def test_two_compactions_racing_for_one_thread_apply_exactly_once(compaction_rig, fake_llm):
    rig = compaction_rig
    fake_llm.add_rule(Reply(json=ANSWER, delay=0.4), structured=True)
    tid = thread_id_for("race")
    result = seed_turns(rig.store, tid, 6)
    outcomes = []
    threads = [threading.Thread(target=lambda: outcomes.append(
        run_compaction(rig.services, tid, result.version).outcome)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert sorted(outcomes) == ["applied", "stale"]
    assert len(fake_llm.chat_requests()) == 2
    state = rig.store.load(tid)
    assert ids(state) == turn_ids(3, 6)
    assert state.summary == ANSWER["summary"]
    assert sorted((e["outcome"], e["reason"]) for e in history(rig.client, tid)) == \
        [("applied", "llm"), ("stale", "generation")]


def test_a_clear_during_compaction_leaves_the_thread_empty(compaction_rig, fake_llm):
    rig = compaction_rig
    fake_llm.add_rule(Reply(json=ANSWER, delay=1.0), structured=True)
    rig.worker()
    tid = thread_id_for("clear")
    result = seed_turns(rig.store, tid, 6)
    assert rig.request(tid, result)
    fake_llm.wait_for_requests(1, "structured")
    rig.store.clear(tid)
    rig.wait_outcome(tid, "stale")
    rig.wait_idle(tid)
    stored = raw_hash(rig.client, tid)
    assert {k: stored[k] for k in ("messages", "summary", "pins")} == {"messages": "[]", "summary": "", "pins": "[]"}
    assert "lastCompactedAt" not in stored
    assert rig.store.load(tid).is_empty
    assert rig.events.wait_statuses(tid, 2) == ["started", "failed"]


ERROR_WORDS = ("rate limit", "error", "exception", "traceback", "upstream exploded", "bad model", "compactedat",
               "cut off", "timed out", "xxxxxxxx")


@pytest.mark.parametrize("case, reply, overrides, attempts, calls, reason", [
    ("rate limited", Reply(status=429), {}, 3, 3, "rate_limited"),
    ("server error", Reply(status=500, error_message="upstream exploded"), {}, 3, 3, "unavailable"),
    ("timeout", Reply(delay=3.0), {"compaction_llm_timeout": 0.5, "compaction_max_retries": 1}, 2, 2, "timeout"),
    ("malformed json", Reply(text='{"summary": "cut off'), {}, 3, 3, "invalid_answer"),
    ("over limit", Reply(json={"summary": "x" * 2501, "pinnedDecisions": []}), {}, 3, 6, "invalid_answer"),
    ("extra keys", Reply(json={**ANSWER, "compactedAt": "2020-01-01T00:00:00Z"}), {}, 3, 3, "invalid_answer"),
    ("missing summary", Reply(json={"pinnedDecisions": []}), {}, 3, 3, "invalid_answer"),
    ("refused", Reply(status=400, error_message="bad model"), {}, 1, 1, "bad_request"),
])
def test_a_failed_compaction_leaves_the_thread_byte_for_byte_unchanged(make_compaction_rig, fake_llm, case, reply,
                                                                       overrides, attempts, calls, reason):
    rig = make_compaction_rig(**overrides)
    fake_llm.add_rule(reply, structured=True)
    rig.worker()
    tid = thread_id_for(case)
    result = seed_turns(rig.store, tid, 6)
    before = raw_hash(rig.client, tid)
    assert rig.request(tid, result)
    entries = rig.wait_outcome(tid, "failed", count=attempts)
    rig.wait_idle(tid)

    assert raw_hash(rig.client, tid) == before
    assert ids(rig.store.load(tid))[-2:] == ["u6", "a6"]  # the triggering turn is kept
    everything = (json.dumps(raw_hash(rig.client, tid)) + json.dumps(entries)).lower()
    assert [word for word in ERROR_WORDS if word in everything] == []
    assert [(e["outcome"], e["reason"], e["attempt"]) for e in reversed(entries)] == \
        [("failed", reason, n) for n in range(attempts)]
    assert len(fake_llm.chat_requests()) == calls
    assert rig.events.wait_statuses(tid, 2 * attempts) == ["started", "failed"] * attempts
    events = rig.events.for_thread(tid)
    assert [e["message"] for e in events if e["status"] == "failed"] == \
        [MESSAGE_RETRYING] * (attempts - 1) + [MESSAGE_FAILED]
    assert all(set(e) <= {"type", "status", "message", "reason", "retrying"} for e in events)


def test_after_the_last_retry_the_next_turn_triggers_again(make_compaction_rig, fake_llm):
    rig = make_compaction_rig(compaction_max_retries=0)
    fake_llm.enqueue(Reply(status=503), structured=True)
    fake_llm.add_rule(Reply(json=ANSWER), structured=True)
    rig.worker()
    tid = thread_id_for("next turn")
    assert rig.request(tid, seed_turns(rig.store, tid, 6))
    rig.wait_outcome(tid, "failed")
    rig.wait_idle(tid)
    assert ids(rig.store.load(tid)) == turn_ids(1, 6)
    assert rig.request(tid, commit_turn(rig.store, tid, 7))
    rig.wait_outcome(tid, "applied")
    state = rig.store.load(tid)
    assert ids(state) == turn_ids(4, 7)
    assert folded_section(fake_llm.last_request("structured").body) == rendered([1, 2, 3])


def test_an_over_limit_answer_is_asked_once_more_with_the_limit_stated(compaction_rig, fake_llm):
    rig = compaction_rig
    long_answer = {"summary": "y" * 2600, "pinnedDecisions": []}
    fake_llm.enqueue(Reply(json=long_answer), structured=True)
    fake_llm.add_rule(Reply(json=ANSWER), structured=True)
    rig.worker()
    tid = thread_id_for("limit")
    assert rig.request(tid, seed_turns(rig.store, tid, 6))
    rig.wait_outcome(tid, "applied")
    assert rig.store.load(tid).summary == ANSWER["summary"]
    second = fake_llm.chat_requests("structured")[1].body["messages"]
    assert [m["role"] for m in second] == ["system", "user", "assistant", "user"]
    assert second[2]["content"] == json.dumps(long_answer)
    assert "summary: at most 2500 characters, got 2600" in second[3]["content"]


def test_a_summary_copying_the_previous_one_is_refused_then_rewritten(compaction_rig, fake_llm):
    rig = compaction_rig
    previous = "They planned the spring picnic in the park."
    rewrite = "A picnic is planned; small talk followed."
    fake_llm.enqueue(Reply(json={"summary": previous, "pinnedDecisions": []}),
                     Reply(json={"summary": previous + " Then they chatted.", "pinnedDecisions": []}),
                     Reply(json={"summary": rewrite, "pinnedDecisions": []}), structured=True)
    rig.worker()
    tid = thread_id_for("copy")
    assert rig.request(tid, seed_turns(rig.store, tid, 6))
    rig.wait_outcome(tid, "applied")
    rig.wait_idle(tid)
    assert rig.store.load(tid).summary == previous
    assert rig.request(tid, commit_turn(rig.store, tid, 7))
    rig.wait_outcome(tid, "applied", count=2)
    state = rig.store.load(tid)
    assert (state.summary, ids(state)) == (rewrite, turn_ids(4, 7))
    feedback = fake_llm.chat_requests("structured")[2].body["messages"][-1]["content"]
    assert "summary: it contains the previous summary word for word" in feedback


def test_a_model_that_copies_the_previous_summary_twice_has_the_copy_cut_out(compaction_rig, fake_llm):
    rig = compaction_rig
    previous = "They planned the spring picnic in the park."
    nested = {"summary": "Earlier: " + previous + "\nThen they chatted about the number seven.", "pinnedDecisions": []}
    fake_llm.enqueue(Reply(json={"summary": previous, "pinnedDecisions": []}), structured=True)
    fake_llm.add_rule(Reply(json=nested), structured=True)
    rig.worker()
    tid = thread_id_for("copy twice")
    assert rig.request(tid, seed_turns(rig.store, tid, 6))
    rig.wait_outcome(tid, "applied")
    rig.wait_idle(tid)
    assert rig.request(tid, commit_turn(rig.store, tid, 7))
    rig.wait_outcome(tid, "applied", count=2)
    assert rig.store.load(tid).summary == "Earlier:\nThen they chatted about the number seven."
    assert len(fake_llm.chat_requests("structured")) == 3


def test_a_model_that_repeats_the_previous_summary_unchanged_gets_a_condensed_fold(compaction_rig, fake_llm):
    rig = compaction_rig
    previous = "They planned the spring picnic. They chose the park by the river."
    fake_llm.add_rule(Reply(json={"summary": previous, "pinnedDecisions": []}), structured=True)
    rig.worker()
    tid = thread_id_for("unchanged")
    assert rig.request(tid, seed_turns(rig.store, tid, 6))
    rig.wait_outcome(tid, "applied")
    rig.wait_idle(tid)
    assert rig.request(tid, commit_turn(rig.store, tid, 7))
    rig.wait_outcome(tid, "applied", count=2)
    state = rig.store.load(tid)
    assert state.summary == ("They chose the park by the river.\n- tell me something nice about the number three "
                             "please → the number three is a lovely number indeed")
    assert [(e["outcome"], e["reason"]) for e in history(rig.client, tid)] == [("applied", "condensed"),
                                                                              ("applied", "llm")]


def test_at_the_hard_cap_a_failing_model_is_replaced_by_the_extractive_fold(compaction_rig, fake_llm):
    rig = compaction_rig
    fake_llm.add_rule(Reply(status=429), structured=True)
    tid = thread_id_for("hard cap")
    result = seed_turns(rig.store, tid, 16)  # 32 messages: four recent windows
    rig.worker()
    assert rig.request(tid, result)
    rig.wait_outcome(tid, "applied")
    state = rig.store.load(tid)
    assert ids(state) == turn_ids(13, 16)
    assert len(state.summary) <= 2500
    assert state.summary.split("\n")[0] == "- tell me something nice about the number one please → " \
                                           "the number one is a lovely number indeed"
    assert len(state.summary.split("\n")) == 12
    assert [(e["outcome"], e["reason"]) for e in history(rig.client, tid)] == [("applied", "extractive")]
    assert len(fake_llm.chat_requests()) == 1


def test_the_extractive_strategy_calls_no_model(make_compaction_rig, fake_llm):
    rig = make_compaction_rig(compaction_strategy="extractive")
    rig.worker()
    tid = thread_id_for("extractive")
    assert rig.request(tid, seed_turns(rig.store, tid, 6))
    rig.wait_outcome(tid, "applied")
    state = rig.store.load(tid)
    assert ids(state) == turn_ids(3, 6)
    assert state.summary == ("- tell me something nice about the number one please → the number one is a lovely "
                             "number indeed\n- tell me something nice about the number two please → the number two "
                             "is a lovely number indeed")
    assert fake_llm.chat_requests() == []


def test_a_provider_without_json_schema_still_compacts(compaction_rig, fake_llm):
    rig = compaction_rig
    fake_llm.reject_json_schema = True
    fake_llm.add_rule(Reply(json=ANSWER), structured=True)
    rig.worker()
    tid = thread_id_for("llama")
    assert rig.request(tid, seed_turns(rig.store, tid, 6))
    rig.wait_outcome(tid, "applied")
    assert rig.store.load(tid).summary == ANSWER["summary"]
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
    user = next(m["content"] for m in body["messages"] if m["role"] == "user")
    topics = re.findall(r"the number (\w+)", user.split("TURNS TO FOLD (oldest first):\n")[1].split("\n\n")[0])
    last_topic = topics[-1] if topics else "zero"
    return {"summary": f"Someone from operations reported a regional outage earlier; small talk followed, "
                       f"lately about the number {last_topic}.", "pinnedDecisions": []}


def test_planted_facts_survive_thirty_turns_of_small_talk_with_a_paraphrasing_model(compaction_rig, fake_llm):
    rig = compaction_rig
    fake_llm.add_rule(paraphrasing_model, structured=True)
    rig.worker()
    tid = thread_id_for("facts")
    commit_turn(rig.store, tid, 1, user=PLANTED, assistant="Thanks, noted. Let's keep chatting meanwhile.")
    for n in range(2, 32):
        result = commit_turn(rig.store, tid, n)
        if rig.request(tid, result):
            rig.wait_settled(tid)
    rig.wait_settled(tid)
    applied = [e for e in history(rig.client, tid) if e["outcome"] == "applied"]
    assert len(applied) >= 5
    state = rig.store.load(tid)
    memory = state.summary + "\n" + "\n".join(state.pinned_decisions)
    assert [f for f in PLANTED_FACTS if f not in memory] == []
    assert state.summary.endswith("\nKey facts: Marta Kowalski; INC-4821; 2024-03-15; eu-west-2.")
    assert ids(state) == turn_ids(28, 31)
    first_fold = [r for r in fake_llm.chat_requests("structured") if PLANTED in folded_section(r.body)]
    assert len(first_fold) == 2  # asked once more, naming the missing facts
    assert first_fold[1].body["messages"][-1]["content"].startswith(
        "That answer was not accepted:\n- these facts are missing and must appear word for word in the summary or "
        "the pinned decisions: Marta Kowalski; INC-4821; 2024-03-15; eu-west-2")
    assert applied[-1]["factRetention"] == 0.0 and applied[-1]["factRetentionFinal"] == 1.0


# ------------------------------------------------------------------------------------------ SIGKILL


def worker_process(settings, log_path: Path, name: str) -> subprocess.Popen:
    """``celery -A celery_app worker -Q compaction --pool solo`` configured like the rig (environment only)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REDIS", "OPENAI", "COMPACTION", "MEMORY"))}
    env.update({
        "APP_ENV": "test", "REDIS_URL": settings.redis_url, "SECRET_KEY": "k" * 64,
        "OPENAI_BASE_URL": settings.openai_base_url, "OPENAI_API_KEY": "test-key",
        "CHAT_MODEL": "fake-chat", "COMPACTION_MODEL": "fake-compact",
        "COMPACTION_LLM_TIMEOUT_SECONDS": "30", "COMPACTION_VISIBILITY_TIMEOUT_SECONDS": "1",
    })
    log = open(log_path, "w")
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "celery_app", "worker", "-Q", "compaction", "--pool", "solo",
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
        fake_llm.wait_for_requests(1, "structured", timeout=30)
        os.kill(first.pid, signal.SIGKILL)
        assert first.wait(10) == -signal.SIGKILL
        assert raw_hash(rig.client, tid) == before
        assert history(rig.client, tid) == []
        # The unacknowledged message is redelivered once its visibility timeout (1 s) has passed.
        wait_until(lambda: any(time.time() - score > 1.5
                               for _, score in rig.client.zrange("unacked_index", 0, -1, withscores=True)),
                   message="the visibility timeout to pass")
        second = worker_process(rig.settings, tmp_path / "b.log", "b")
        rig.wait_outcome(tid, "applied", timeout=30)
        rig.wait_idle(tid)
        state = rig.store.load(tid)
        assert ids(state) == turn_ids(3, 6)
        assert state.summary == ANSWER["summary"]
        assert [e["outcome"] for e in history(rig.client, tid)] == ["applied"]
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
