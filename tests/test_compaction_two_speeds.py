"""Compaction in two speeds (docs/memory.md: A compaction): the fold needs no model and keeps the bound; the model's
part waits for a quiet thread (or K folds), never runs while a turn streams, and a stale one is discarded; the commit's
hard cap and the refusal of a reused message id (docs/contract.md: the done frame).

Real Redis, the fake LLM over HTTP; the service's task bodies are called directly (no eager Celery)."""

from __future__ import annotations

from app.compaction.service import STREAMING_POLL_SECONDS, run_compaction, run_refinement
from app.memory.compaction import hard_cap_messages
from app.memory.final_turn import FinalTurn
from app.store.keys import ThreadKeys
from chat_support.fake_llm import Reply
from tests.fixtures.celery_worker import commit_turn, history, message_ids, seed_turns, thread_id_for, turn_ids
from tests.fixtures.memory_data import text_record

GIST = {"summary": "They chatted about the numbers one and two.", "pinnedDecisions": []}


class Sent(list):
    """Stands in for the broker: records each refinement published as ``(thread_id, token, countdown)``."""

    def __call__(self, thread_id: str, token: int, countdown: float) -> None:
        self.append((thread_id, token, countdown))


def fold(rig, tid: str, result, sent=None):
    assert rig.request(tid, result)
    version = int(rig.client.get(ThreadKeys(tid).compacting))
    return run_compaction(rig.services, tid, version, send_refine=sent)


def test_a_fold_calls_no_model_keeps_four_turns_and_asks_for_a_refinement_later(compaction_rig, fake_llm):
    rig = compaction_rig
    tid = thread_id_for("two-speeds-fold")
    sent = Sent()
    outcome = fold(rig, tid, seed_turns(rig.store, tid, 5), sent)
    assert (outcome.outcome, outcome.reason) == ("applied", "extractive")
    state = rig.store.load(tid)
    assert message_ids(state) == turn_ids(2, 5) and len(state.messages) == 8
    assert fake_llm.chat_requests("structured") == []
    [entry] = history(rig.client, tid)
    assert (entry["step"], entry["turnsFolded"]) == ("fold", 1)
    assert sent == [(tid, 1, rig.settings.compaction_idle_seconds)]
    assert rig.client.get(ThreadKeys(tid).refining) == "1"


def test_a_fold_that_frees_little_still_folds(compaction_rig, fake_llm):
    rig = compaction_rig
    tid = thread_id_for("two-speeds-little")
    result = None
    for n in range(1, 6):  # short, fact-dense turns: the record keeps every statement
        result = commit_turn(rig.store, tid, n, user=f"My badge number is {n}00{n}.", assistant="Noted.")
    outcome = fold(rig, tid, result)
    assert outcome.outcome == "applied"
    state = rig.store.load(tid)
    assert len(state.messages) == 8 and "1001" in state.summary


def test_every_turn_beyond_the_window_is_folded_at_once(compaction_rig, fake_llm):
    rig = compaction_rig
    tid = thread_id_for("two-speeds-each")
    seed_turns(rig.store, tid, 4)
    most = 0
    for n in range(5, 15):
        outcome = fold(rig, tid, commit_turn(rig.store, tid, n))
        assert outcome.outcome == "applied"
        most = max(most, len(rig.store.load(tid).messages))
    assert most == 8 and rig.store.load(tid).folded_turns == 10
    assert fake_llm.chat_requests("structured") == []


def test_the_refinement_waits_while_a_turn_streams_and_runs_when_the_thread_is_quiet(compaction_rig, fake_llm):
    rig = compaction_rig
    fake_llm.add_rule(Reply(json=GIST), structured=True)
    tid = thread_id_for("two-speeds-refine")
    sent = Sent()
    fold(rig, tid, seed_turns(rig.store, tid, 6), sent)
    [(_, token, _)] = sent
    requests = rig.services.compaction_requests

    requests.turn_streaming(tid)
    waiting = run_refinement(rig.services, tid, token)
    assert (waiting.outcome, waiting.reason, waiting.reschedule_in) == (
        "skipped", "not_quiet", min(STREAMING_POLL_SECONDS, rig.settings.compaction_idle_seconds))
    requests.turn_ended(tid)  # idle for COMPACTION_IDLE_SECONDS, with fewer folds than the batch
    assert run_refinement(rig.services, tid, token).reschedule_in is not None
    assert fake_llm.chat_requests("structured") == []

    rig.client.delete(ThreadKeys(tid).active)  # quiet
    before = rig.store.load(tid)
    refined = run_refinement(rig.services, tid, token)
    assert (refined.outcome, refined.reason) == ("applied", "llm")
    assert len(fake_llm.chat_requests("structured")) == 1
    state = rig.store.load(tid)
    assert "About: They chatted about the numbers one and two." in state.summary
    assert state.messages == before.messages and state.gen == before.gen + 1
    assert rig.client.hmget(ThreadKeys(tid).state, "rf", "uf") == [str(state.folded_turns), "0"]
    entry = history(rig.client, tid)[0]
    assert (entry["step"], entry["turnsRefined"], entry["modelCalls"]) == ("refine", 2, 1)
    assert not rig.client.exists(ThreadKeys(tid).refining)
    assert run_refinement(rig.services, tid, token).reason == "not_due"  # nothing left to refine


def test_after_k_folds_the_refinement_runs_between_turns(make_compaction_rig, fake_llm):
    rig = make_compaction_rig(compaction_refine_after_folds=2)
    fake_llm.add_rule(Reply(json=GIST), structured=True)
    tid = thread_id_for("two-speeds-batch")
    sent = Sent()
    seed_turns(rig.store, tid, 4)
    fold(rig, tid, commit_turn(rig.store, tid, 5), sent)
    fold(rig, tid, commit_turn(rig.store, tid, 6), sent)
    assert [countdown for *_, countdown in sent] == [rig.settings.compaction_idle_seconds]  # one pending
    rig.services.compaction_requests.turn_ended(tid)  # a turn just ended, but two folds went unrefined
    outcome = run_refinement(rig.services, tid, sent[0][1])
    assert outcome.outcome == "applied" and len(fake_llm.chat_requests("structured")) == 1


def test_a_refinement_read_before_a_fold_is_discarded(compaction_rig, fake_llm):
    rig = compaction_rig
    tid = thread_id_for("two-speeds-stale")
    fold(rig, tid, seed_turns(rig.store, tid, 5))
    state = rig.store.load(tid)
    fold(rig, tid, commit_turn(rig.store, tid, 6))
    folded = rig.store.load(tid)
    stale = rig.store.apply_refinement(tid, expected_gen=state.gen, refined_turns=state.folded_turns,
                                       record=text_record("lost"), notes=[])
    assert (stale.outcome, stale.detail) == ("stale", "generation")
    after = rig.store.load(tid)
    assert (after.record, after.notes, after.gen) == (folded.record, folded.notes, folded.gen)
    assert "lost" not in after.summary.splitlines()


def test_the_commit_refuses_past_the_hard_cap_whatever_the_worker_does(compaction_rig):
    rig = compaction_rig
    tid = thread_id_for("two-speeds-cap")
    cap = hard_cap_messages(rig.settings.limits)
    last = seed_turns(rig.store, tid, cap // 2)
    assert last.appended and last.message_count == cap
    refused = commit_turn(rig.store, tid, cap // 2 + 1)
    assert (refused.appended, refused.refused, refused.message_count) == (False, "full", cap)
    assert len(rig.store.load(tid).messages) == cap


def test_a_reused_message_id_with_another_text_is_refused_and_the_same_text_stays_idempotent(compaction_rig):
    rig = compaction_rig
    tid = thread_id_for("two-speeds-ids")
    first = commit_turn(rig.store, tid, 1, user="hello there")
    again = commit_turn(rig.store, tid, 1, user="hello there")
    other = rig.store.commit_final_turn(tid, FinalTurn("something else", "answer", "completed", "chat",
                                                       user_id="u1", assistant_id="a9"))
    assert (first.appended, again.appended, again.refused) == (True, False, None)
    assert (other.appended, other.refused) == (False, "id_conflict")
    assert [m.text for m in rig.store.load(tid).messages][0] == "hello there"


def test_a_fold_failing_for_good_blocks_the_requests_until_a_clear(compaction_rig):
    rig = compaction_rig
    tid = thread_id_for("two-speeds-blocked")
    requests = rig.services.compaction_requests

    def ask(result) -> bool:
        return requests.after_commit(tid, message_count=result.message_count, uncompacted_tokens=0,
                                     version=result.version)
    seed_turns(rig.store, tid, 4)
    rig.client.hset(ThreadKeys(tid).state, "summary", "x" * 40000)  # unreadable: over its limit
    assert ask(rig.store.commit_final_turn(tid, FinalTurn("x", "y")))
    version = int(rig.client.get(ThreadKeys(tid).compacting))
    outcome = run_compaction(rig.services, tid, version)
    assert (outcome.outcome, outcome.reason) == ("blocked", "corrupt")
    [entry] = history(rig.client, tid)
    assert (entry["outcome"], entry["reason"], entry["step"]) == ("blocked", "corrupt", "fold")
    assert rig.store.markers.compactions_blocked(tid) == "corrupt"
    assert not ask(rig.store.commit_final_turn(tid, FinalTurn("again", "y")))
    rig.store.clear(tid)
    assert rig.store.markers.compactions_blocked(tid) is None


def test_at_the_hard_cap_the_turn_folds_without_the_model_and_commits(compaction_rig, fake_llm):
    from app.compaction.service import fold_at_cap

    rig = compaction_rig
    tid = thread_id_for("two-speeds-at-cap")
    cap = hard_cap_messages(rig.settings.limits)
    seed_turns(rig.store, tid, cap // 2)  # the worker never folded (down)
    assert commit_turn(rig.store, tid, cap // 2 + 1).refused == "full"
    assert fold_at_cap(rig.services, tid)
    assert len(rig.store.load(tid).messages) == 8 and fake_llm.chat_requests() == []
    assert commit_turn(rig.store, tid, cap // 2 + 1).appended
    [entry] = history(rig.client, tid)
    assert (entry["step"], entry["atCap"], entry["turnsFolded"]) == ("fold", True, cap // 2 - 4)
