"""The prompt's fold step (docs/contract.md: ``MEMORY_PROMPT_FOLD_STEP``; docs/bundled-model.md): memory folds
every due turn at once, while the prompt moves folded turns into its record N at a time and shows the ones in
between verbatim from the archive, so between two checkpoints the next prompt is the previous one with the newest
turn appended.

Real Redis; the model-free fold of the service (``fold_at_cap``: the same fold and compare-and-set as the worker's)."""

from __future__ import annotations

from app.compaction.service import fold_at_cap
from app.memory.context import assemble_context, held_back
from app.memory.recall import ArchivedTurn, ArchiveIndex
from app.memory.record import Record, RecordLine
from app.memory.state import ThreadMessage
from app.memory.tokens import TokenCounter
from app.store.archive import Archive
from tests.fixtures.celery_worker import commit_turn, thread_id_for
from tests.fixtures.memory_data import CREATED

COUNTER = TokenCounter()


def prompt(state, archive, text: str, step: int) -> list[dict]:
    return assemble_context(state, text, system_prompt="You are helpful.", counter=COUNTER, context_tokens=8192,
                            reserved_output_tokens=1024, archive=archive, recall_share=0.0,
                            fold_step=step).to_openai()


def conversation(rig, name: str, step: int, turns: int = 14) -> tuple[list[list[dict]], list[int]]:
    """Each turn's prompt, and the record's last folded turn when it was built."""
    tid = thread_id_for(name)
    prompts, folded = [], []
    for n in range(1, turns + 1):
        state, archive = Archive(rig.store).load_turn_memory(tid)
        text = f"My locker number {n} is {n * 111}, near door {n}."
        prompts.append(prompt(state, archive, text, step))
        folded.append(state.record.last_turn)
        assert commit_turn(rig.store, tid, n, user=text, assistant=f"Noted: locker {n} is {n * 111}.").appended
        if n > 4:
            assert fold_at_cap(rig.services, tid)  # the fold the worker runs after every due turn
    return prompts, folded


def appended(before: list[dict], after: list[dict]) -> bool:
    return after[:len(before)] == before


def test_between_checkpoints_each_prompt_is_the_previous_one_with_the_newest_turn_appended(compaction_rig):
    prompts, folded = conversation(compaction_rig, "fold-step-4", 4)
    assert folded == [0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    changed = [n + 1 for n in range(1, len(prompts)) if not appended(prompts[n - 1], prompts[n])]
    # the layout changes only when the folds reach a multiple of 4 (turn 9's prompt has turns 1-4 in the record,
    # turn 13's turns 1-8); before that, folded turns are shown verbatim where they were
    assert changed == [9, 13]
    last = prompts[-1]
    text = "\n".join(m["content"] for m in last)
    for n in range(1, 14):  # every earlier turn reaches the prompt: in the record or verbatim
        assert f"{n * 111}" in text
    # turns 9-13 are folded; 9 is past the checkpoint (8): verbatim, with the 4 recent turns after it
    assert [m["content"] for m in last if m["role"] == "user"][0] == "My locker number 9 is 999, near door 9."
    assert "(turns 1–8 of this conversation)" in last[1]["content"]


def test_with_step_one_every_fold_changes_the_layout(compaction_rig):
    prompts, _ = conversation(compaction_rig, "fold-step-1", 1)
    changed = [n + 1 for n in range(1, len(prompts)) if not appended(prompts[n - 1], prompts[n])]
    assert changed == list(range(6, 15))


def _turn(n: int) -> ArchivedTurn:
    return ArchivedTurn(n, (ThreadMessage(f"u{n}", "user", f"person {n}", CREATED),
                            ThreadMessage(f"a{n}", "assistant", f"answer {n}", CREATED)))


def test_held_back_shows_the_turns_after_the_checkpoint_verbatim_or_falls_back_to_the_whole_record():
    record = Record(1, 6, tuple(RecordLine("person", f"person {n}", n) for n in range(1, 7)))
    archive = ArchiveIndex()
    archive.add([_turn(n) for n in range(1, 7)])
    shown, verbatim = held_back(record, archive, 4)
    assert (shown.last_turn, [line.turn for line in shown.lines]) == (4, [1, 2, 3, 4])
    assert [t.number for t in verbatim] == [5, 6]
    assert held_back(record, archive, 1) == (record, [])
    assert held_back(record, archive, 3) == (record, [])  # 6 is a checkpoint
    assert held_back(record, None, 4) == (record, [])
    gap = ArchiveIndex()
    gap.add([_turn(n) for n in (1, 2, 3, 4, 6)])  # turn 5 not archived (e.g. the archive's cap)
    assert held_back(record, gap, 4) == (record, [])


def test_verbatim_turns_that_do_not_fit_the_budget_give_way_to_the_whole_record(compaction_rig):
    tid = thread_id_for("fold-step-budget")
    for n in range(1, 7):
        commit_turn(compaction_rig.store, tid, n, user=f"Fact {n}: " + "word " * 300, assistant="ok")
        if n > 4:
            assert fold_at_cap(compaction_rig.services, tid)
    state, archive = Archive(compaction_rig.store).load_turn_memory(tid)
    assert state.record.last_turn == 2
    roomy = assemble_context(state, "next", system_prompt="s", counter=COUNTER, context_tokens=8192,
                             reserved_output_tokens=1024, archive=archive, recall_share=0.0, fold_step=4)
    assert roomy.to_openai()[1]["content"].startswith("Fact 1:")  # turns 1-2 verbatim, no record yet
    tight = assemble_context(state, "next", system_prompt="s", counter=COUNTER, context_tokens=2000,
                             reserved_output_tokens=200, archive=archive, recall_share=0.0, fold_step=4)
    assert tight.to_openai()[1]["content"].startswith("Earlier in this conversation")
    assert not any(m["role"] == "user" and m["content"].startswith(("Fact 1:", "Fact 2:")) for m in tight.to_openai())
