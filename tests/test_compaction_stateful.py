"""Random interleavings of commits, compactions, clears and duplicate deliveries (hypothesis).

The compaction task's phases (``prepare`` = the task reads the thread, ``produce``
= the model call over HTTP to the fake LLM, ``commit`` = the Lua compare-and-set)
are driven separately, so a compaction can be started, overtaken by commits,
clears or other compactions, and finished later (a slow compaction), or fail.
A reference model of the thread (the ids committed, minus the ids folded by
compactions that applied) must equal the stored thread after every step:

- no committed message is lost unless a compaction that read it applied;
- no message is held twice, and the order is the commit order;
- summary, pins and notes stay within their limits after every applied compaction.
"""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
from hypothesis import HealthCheck, settings as hsettings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from app.compaction.service import commit, prepare, produce, run_compaction
from app.llm.provider import LLMError
from app.memory.compaction import InvalidCompactionOutput, hard_cap_messages
from app.settings import MemoryLimits
from tests.fixtures.celery_worker import commit_turn, thread_id_for

LIMITS = MemoryLimits(recent_turns=2, summary_max_chars=300, pinned_max=3, pinned_max_chars=60)
MODES = ["ok", "ok", "ok", "rate_limited", "over_limit", "extra_keys", "long_pins"]
_examples = itertools.count()
SEEN: Counter = Counter()  # what happened across all examples (asserted at the end)


class FakeModelScript:
    """What the fake model answers next (the state machine sets ``mode`` before each model call)."""

    def __init__(self):
        self.mode = "ok"
        self.calls = 0

    def __call__(self, body):
        from chat_support.fake_llm import Reply

        self.calls += 1
        user = body["messages"][1]["content"]
        folded = user.split("TURNS (oldest first):\n")[1].count("[person]")
        summary = f"Call {self.calls} folded {folded} turns of the talk about tickets."
        if self.mode == "rate_limited":
            return Reply(status=429)
        if self.mode == "over_limit":
            return {"summary": "z" * 301, "pinnedDecisions": []}
        if self.mode == "extra_keys":
            return {"summary": summary, "pinnedDecisions": [], "lastCompactedAt": "2020-01-01T00:00:00Z"}
        if self.mode == "long_pins":
            return {"summary": summary, "pinnedDecisions": [f"we decided on ticket {self.calls} {i}" for i in range(3)]}
        return {"summary": summary, "pinnedDecisions": [f"we decided on ticket {self.calls}"]}


def make_machine(services, script: FakeModelScript):
    class CompactionMachine(RuleBasedStateMachine):
        """One thread per example; ``expected`` is the reference list of stored message ids."""

        def __init__(self):
            super().__init__()
            self.tid = thread_id_for(f"stateful-{next(_examples)}")
            self.store = services.store
            self.expected: list[str] = []
            self.committed: list[str] = []
            self.next_turn = 1
            self.pending = []          # compactions that read the thread and have not committed yet
            self.finished = []         # (prepared, result) pairs already committed once

        # -- commits ---------------------------------------------------------------------------

        @rule(kinds=st.lists(st.sampled_from(["plain", "ticket", "long"]), min_size=1, max_size=4))
        def commit_turns(self, kinds):
            for kind in kinds:
                self.commit_a_turn(kind)

        @rule(text_kind=st.sampled_from(["plain", "ticket", "long"]))
        def commit_a_turn(self, text_kind):
            n = self.next_turn
            self.next_turn += 1
            user = {"plain": f"hello there friend {n}", "ticket": f"ticket INC-{4000 + n} in eu-west-{n % 3 + 1}",
                    "long": "a fairly long message about nothing in particular " * 6}[text_kind]
            result = commit_turn(self.store, self.tid, n, user=user,
                                 assistant=f"reply number {n}, " + "with a few more words to say about it " * 4)
            if result.refused == "full":  # the hard cap holds whatever the folds do (nothing written)
                assert len(self.expected) + 2 > hard_cap_messages(LIMITS) and result.message_count == len(self.expected)
                return
            assert result.appended
            self.expected += [f"u{n}", f"a{n}"]
            self.committed += [f"u{n}", f"a{n}"]

        @precondition(lambda self: self.expected)
        @rule(data=st.data())
        def commit_a_stored_turn_again(self, data):
            user_id = data.draw(st.sampled_from([i for i in self.expected if i.startswith("u")]))
            assert commit_turn(self.store, self.tid, int(user_id[1:])).appended is False

        @rule(roll=st.integers(0, 5))
        def clear(self, roll):
            if roll:  # clears are rarer than other steps
                return
            self.store.clear(self.tid)
            self.expected = []

        # -- compactions in phases ---------------------------------------------------------------

        @rule()
        def start_a_compaction(self):
            prepared = prepare(services, self.tid)
            if prepared is not None:
                assert prepared.plan.folded_ids == self.expected[:len(prepared.plan.folded_ids)]
                self.pending.append(prepared)

        @precondition(lambda self: self.pending)
        @rule(data=st.data(), mode=st.sampled_from(MODES))
        def finish_a_compaction(self, data, mode):
            prepared = self.pending.pop(data.draw(st.integers(0, len(self.pending) - 1)))
            script.mode = mode
            calls = script.calls
            try:
                result = produce(services, prepared)
            except (LLMError, InvalidCompactionOutput):
                assert mode in {"rate_limited", "extra_keys"}
                SEEN["failed"] += 1
                return  # a failure writes nothing
            # the model was not asked (no room for a gist, or the turns do not fit its prompt): folded without it
            asked = script.calls > calls
            assert not asked or mode in {"ok", "long_pins", "over_limit"}  # an answer over a limit: folded without it
            assert asked or result.strategy == "extractive"
            self._commit(prepared, result)

        @precondition(lambda self: self.finished)
        @rule(data=st.data())
        def deliver_a_finished_compaction_again(self, data):
            prepared, result = data.draw(st.sampled_from(self.finished))
            assert commit(services, prepared, result).outcome == "stale"
            SEEN["redelivered"] += 1

        @rule(roll=st.integers(0, 2))
        def run_the_task_twice(self, roll):
            if roll:
                return
            script.mode = "ok"
            version = self.store.load(self.tid).version
            first = run_compaction(services, self.tid, version)
            second = run_compaction(services, self.tid, version)  # a duplicate delivery
            assert second.outcome in {"skipped", "applied"}
            SEEN["task " + first.outcome] += 1
            if first.outcome == "applied":
                self._sync_after_task()
            if second.outcome == "applied":
                self._sync_after_task()

        def _sync_after_task(self):
            # run_compaction folded the oldest messages; the store tells which survived.
            stored = [m.id for m in self.store.load(self.tid).messages]
            assert stored == self.expected[len(self.expected) - len(stored):]
            self.expected = stored

        def _commit(self, prepared, result):
            outcome = commit(services, prepared, result)
            SEEN[outcome.outcome] += 1
            read = {m.id for m in prepared.state.messages}
            if outcome.outcome == "applied" and any(i not in read for i in self.expected):
                SEEN["applied over newer commits"] += 1
            folded = prepared.plan.folded_ids
            if outcome.outcome == "applied":
                assert self.expected[:len(folded)] == folded  # only what the compaction read is removed
                self.expected = self.expected[len(folded):]
                self.finished.append((prepared, result))
            else:
                assert outcome.outcome == "stale"

        # -- invariants ---------------------------------------------------------------------------

        @invariant()
        def stored_messages_are_exactly_the_expected_ones(self):
            state = self.store.load(self.tid)  # also validates the stored-state schema
            stored = [m.id for m in state.messages]
            assert stored == self.expected
            assert len(set(stored)) == len(stored)
            positions = [self.committed.index(i) for i in stored]
            assert positions == sorted(positions)
            assert len(state.summary) <= LIMITS.summary_max_chars
            assert len(state.pins) <= LIMITS.pinned_max
            assert all(len(p.text) <= LIMITS.pinned_max_chars for p in state.pins)
            assert len(state.notes) <= LIMITS.notes_max
            assert all(len(n) <= LIMITS.note_max_chars for n in state.notes)

    return CompactionMachine


@pytest.mark.slow
def test_random_interleavings_never_lose_duplicate_or_reorder_messages(make_compaction_rig, fake_llm):
    rig = make_compaction_rig(limits=LIMITS, compaction_max_retries=0, model_context_tokens=2048,
                              reserved_output_tokens=256)
    script = FakeModelScript()
    fake_llm.add_rule(script, structured=True)
    machine = make_machine(rig.services, script)
    run_state_machine_as_test(machine, settings=hsettings(
        # the same 100 examples every run (a seed from the test itself, no example database): the coverage
        # asserted below (a stale commit, a failure, a redelivery ...) is not left to chance
        max_examples=100, stateful_step_count=50, deadline=None, derandomize=True, database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]))
    assert script.calls > 0
    print(dict(SEEN))
    for what in ("applied", "stale", "failed", "redelivered", "task applied", "task skipped",
                 "applied over newer commits"):
        assert SEEN[what] > 0, what
