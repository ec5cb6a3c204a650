"""What a compaction writes: the new record and notes, checked by the fact guard and the gain rule.

``compose`` is pure and deterministic.  Given the thread as read, the plan, and
the model's answer (or None for a fold without the model), it

1. refuses a gist that names facts the folded turns do not hold, or facts memory already
   holds that the person did not say again in them (``ungrounded``); leaves out a gist
   that only repeats what the person said or copies an answer's sentences, or, for turns
   in which the person only told things, one that retells the answers instead of their words;
2. appends the folded turns' record lines (``record.statement_lines``) after the
   model's ``About:`` line (without it, an ``Asked:`` line for each turn that left
   no other line), and keeps the model's grounded decisions as notes;
3. fits the record to its limits (``record.fit_record``: a fixed policy that
   reports every fact it lets go);
4. checks the **gain rule**: memory after (summary + notes + pins) costs at most
   memory before (summary + notes + pins + folded turns) minus ``GAIN_SHARE`` of
   the folded turns, in prompt tokens; otherwise ``InvalidCompactionOutput``
   ``growth``.  The rule is a model answer's only: a fold without the model folds
   even when that frees little (docs/memory.md: A compaction; the archive keeps every word);
5. runs the **fact guard**: every fact of the previous summary and notes, of the
   person's folded messages and of the answer sentences kept must be in the new
   memory, unless the record policy let it go (counted in ``facts_dropped``).
   Anything else missing is a bug and raises ``FactGuardFailure``: such a result
   is never written.

Every figure is in tokens (the model's tokenizer) or counts of facts.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Iterable, Sequence

from app.memory.compaction.answer import AnswerProblem, CompactionAnswer, InvalidCompactionOutput, gist_problems
from app.memory.compaction.facts import extract_facts, fact_present, facts_of, unread_share
from app.memory.compaction.notes import grounding, merge_notes, normalize_pin
from app.memory.compaction.policy import GAIN_SHARE, CompactionPlan, notes_token_cap, summary_token_cap
from app.memory.compaction.record import (
    ABOUT,
    ASKED,
    ASSISTANT,
    PERSON,
    TOLD,
    FitStep,
    Record,
    RecordLine,
    asked_line,
    asks,
    fit_record,
    mark_replaced,
    sentences,
    statement_lines,
)
from app.memory.context import format_pins, format_summary
from app.memory.limits import MemoryLimits
from app.memory.state import ThreadMessage, ThreadState, group_turns, number_turns
from app.memory.tokens import TokenCounter
from app.memory.words import key

COPY_SHARE = 0.8
"""A gist with this share of its content words from one message the person wrote is a copy of it: no line."""
TOLD_SHARE = 0.5
"""When the person only told things in the folded turns, a gist needs this share of its content words from
what they said to be kept (else it retells the answers)."""


class Strategy(StrEnum):
    """How a compaction's summary line was made (``CompactionResult.strategy``; the history's ``reason``
    of an applied compaction, docs/contract.md)."""

    LLM = "llm"
    EXTRACTIVE = "extractive"


class FactGuardFailure(RuntimeError):
    """A guarded fact is missing from a composed result without the record policy having let it go (a bug)."""


class RecordOverLimit(RuntimeError):
    """The fitted record is still longer than the summary limit (a bug of the fitting policy, or one of its steps
    switched off by a benchmark): never written, since the stored state would no longer validate."""


@dataclass(frozen=True)
class CompactionResult:
    """What a compaction writes, and its figures (for the history, the event and the log).

    Attributes:
        record: the new record, within its character and token limits (rendered: ``summary``).
        notes: the model notes after the compaction, oldest first.
        strategy: ``llm`` (with the model's gist and notes) or ``extractive``.
        tokens_before: memory before (summary, notes, pins and every stored message), in prompt tokens.
        tokens_after: memory after (summary, notes, pins and the kept messages), in prompt tokens.
        folded_tokens: what the folded messages cost, in prompt tokens.
        facts_checked: facts of the previous summary and notes and of the folded turns.
        facts_kept: those still in the new memory (summary, notes or pins).
        facts_dropped: guarded facts let go by the record policy to respect the limits.
        facts_skipped: facts of answers that the policy does not keep (beyond the sentences kept).
        lines_added: record lines the fold added (before fitting).
        lines_dropped: record lines removed by the fitting policy.
        notes_added: proposals kept as notes.
        notes_refused: proposals refused (ungrounded, not a decision, ...).
        policy_steps: the fitting policy's steps used (``record.fit_record``).
        unread_share: share (0.0-1.0) of the folded text's letters in scripts the fact guard does
            not read (neither Latin nor Chinese): its facts were not checked.
        room_tokens: how many more tokens memory could cost and still meet the gain rule (what a
            model's gist and notes may add to this result), in tokens.
    """

    record: Record
    notes: tuple[str, ...]
    strategy: Strategy
    tokens_before: int
    tokens_after: int
    folded_tokens: int
    facts_checked: int = 0
    facts_kept: int = 0
    facts_dropped: int = 0
    facts_skipped: int = 0
    lines_added: int = 0
    lines_dropped: int = 0
    notes_added: int = 0
    notes_refused: int = 0
    policy_steps: tuple[FitStep, ...] = ()
    unread_share: float = 0.0
    room_tokens: int = 0

    @property
    def summary(self) -> str:
        """The new record as text (``Record.render``)."""
        return self.record.render()

    @property
    def retention(self) -> float:
        """Share of checked facts kept, 0.0 to 1.0 (1.0 when none were checked)."""
        if not self.facts_checked:
            return 1.0
        return round(self.facts_kept / self.facts_checked, 4)


def _check_gist(gist: str, folded_texts: Sequence[str], person_said: Sequence[str], memory: Sequence[str]) -> None:
    """Refuse a gist naming a fact the folded turns do not hold, or one memory holds already that the person
    did not say again in them: a small chat model repeats the record's facts in its answers ("…以便我将数据库
    迁移推迟到4月2日" in a chat about a film), and a gist of those answers would write them in again.

    Raises:
        InvalidCompactionOutput: ``ungrounded``, naming the facts.
    """
    invented = gist_problems(gist, folded_texts)
    if invented:
        raise InvalidCompactionOutput(AnswerProblem.UNGROUNDED, [
            "summary: these names, numbers or dates are not in the turns: " + "; ".join(invented[:12])
            + ". Use only what the turns say."])
    older, said = "\n".join(memory), "\n".join(person_said)
    echoed = [f for f in extract_facts(gist) if fact_present(f, older) and not fact_present(f, said)]
    if echoed:
        raise InvalidCompactionOutput(AnswerProblem.UNGROUNDED, [
            "summary: these belong to earlier turns, not to these: " + "; ".join(echoed[:12])
            + ". Say only what these turns are about."])


def _gist_adds(gist: str, folded_texts: Sequence[str], person_said: Sequence[str], asked: bool) -> bool:
    """False for a gist the record is better without: one that repeats what the person said (kept word for
    word anyway); one that copies an answer's sentences (a gist of nothing; the record keeps an answer's
    sentence itself); or, when the person only told things in these turns, one that is not mostly their
    words (it then retells the model's answers, which restate and invent: "Lin Wei is an excellent
    candidate…")."""
    if grounding(gist, person_said) >= COPY_SHARE or _copies(gist, folded_texts):
        return False
    return asked or grounding(gist, ["\n".join(person_said)]) >= TOLD_SHARE


def _copies(gist: str, texts: Sequence[str]) -> bool:
    """True when at least half of ``gist``'s sentences stand word for word in one of ``texts``."""
    parts = [key(sentence) for sentence in sentences(gist)]
    parts = [p for p in parts if p]
    return bool(parts) and any(2 * sum(p in plain for p in parts) >= len(parts) for plain in map(key, texts))


def _line_key(line: RecordLine) -> tuple[str, str]:
    return line.kind, normalize_pin(line.text)


def memory_cost(record: Record, notes: Sequence[str], pins: Sequence[str], counter: TokenCounter) -> int:
    """Prompt tokens of the record message (the record and notes) and the pins message."""
    cost = counter.message("system", format_summary(record, notes)) if record.lines or notes else 0
    return cost + (counter.message("system", format_pins(list(pins))) if pins else 0)


def messages_cost(messages: Iterable[ThreadMessage], counter: TokenCounter) -> int:
    """Prompt tokens of messages sent as chat messages."""
    return sum(counter.message(m.role, m.text) for m in messages)


def compose(state: ThreadState, plan: CompactionPlan, answer: CompactionAnswer | None, *, limits: MemoryLimits,
            counter: TokenCounter, prompt_budget: int, require_gain: bool = True) -> CompactionResult:
    """Build what a compaction writes (see the module docstring).

    Args:
        state: the thread as read.
        plan: the plan made from it.
        answer: the model's validated answer, or None to fold without the model.
        limits: ``MemoryLimits``.
        counter: the model's token counter.
        prompt_budget: tokens a prompt may use.
        require_gain: False: no gain rule for a model answer either.  A fold without the model
            (``answer`` None) never applies it (docs/memory.md: A compaction): the turns are folded even when
            that frees little (the archive keeps every word); the record still fits its own character
            and token limits.

    Raises:
        InvalidCompactionOutput: ``ungrounded`` (the gist names facts found nowhere) or
            ``growth`` (the answer makes memory shrink too little); ask once more, then
            fold without the model.
        FactGuardFailure: a guarded fact went missing (never written).
    """
    pins = state.pinned_decisions
    folded_texts = [m.text for m in plan.folded]
    person_said = [m.text for m in plan.folded if m.role == "user"]
    if answer is not None:
        _check_gist(answer.summary, folded_texts, person_said, [state.summary, *state.notes, *pins])

    old = state.record
    # Facts are read from the statements, never the header nor the model's About: lines (whose facts are
    # grounded in the statements, so counting them would count a fact twice).
    old_texts = [line.text for line in old.lines if line.kind not in (ABOUT, ASKED)]
    known = facts_of([*old_texts, *state.notes, *pins])
    seen = {_line_key(line) for line in old.lines}
    about = RecordLine(ABOUT, answer.summary) if answer is not None else None
    if about is not None and not _gist_adds(about.text, folded_texts, person_said,
                                            any(asks(t) for t in group_turns(plan.folded))):
        about = None
    new_lines: list[RecordLine] = [about] if about is not None and _line_key(about) not in seen else []
    turns = group_turns(plan.folded)
    numbers = number_turns(turns, state.folded_turns, state.forgotten_turns)
    # A refinement composes turns the folds already wrote: their answer sentence was chosen then (with what memory
    # knew then), so another sentence of the same answer is not added at the record's end.
    answered = {line.turn for line in old.lines if line.kind == ASSISTANT and line.turn}
    for turn, number in zip(turns, numbers, strict=True):
        lines = [line for line in statement_lines(turn, known, number=number)
                 if _line_key(line) not in seen and not (line.kind == ASSISTANT and number in answered)]
        if not lines and answer is None:  # without the model's gist, say at least what was asked
            asked = asked_line(turn, number)
            lines = [asked] if asked is not None and _line_key(asked) not in seen else []
        seen.update(_line_key(line) for line in lines)  # a statement repeated word for word is kept once
        new_lines.extend(lines)
        known.extend(facts_of(line.text for line in lines))
    last_turn = numbers[-1] if numbers else state.folded_turns
    first_turn = old.first_turn if old.lines else (numbers[0] if numbers else 1)
    record = Record(first_turn or 1, max(last_turn, old.last_turn), mark_replaced(old.lines + tuple(new_lines)))

    merged = merge_notes(state.notes, answer.pinnedDecisions if answer is not None else (), plan.folded,
                         pins=pins, max_count=limits.notes_max, max_chars=limits.note_max_chars,
                         max_tokens=notes_token_cap(prompt_budget), counter=counter)
    reference = "\n".join([*merged.notes, *pins, *(m.text for m in plan.kept)])
    max_tokens = summary_token_cap(prompt_budget)
    fitted, report = fit_record(record, max_chars=limits.summary_max_chars, max_tokens=max_tokens,
                                counter=counter, reference_text=reference)

    folded_cost = messages_cost(plan.folded, counter)
    before_memory = memory_cost(state.record, state.notes, pins, counter)
    allowed = before_memory + folded_cost - GAIN_SHARE * folded_cost
    after_memory = memory_cost(fitted, merged.notes, pins, counter)
    if answer is not None and require_gain and after_memory > allowed:
        raise InvalidCompactionOutput(AnswerProblem.GROWTH, [
            f"memory would cost {after_memory} tokens, more than the {int(allowed)} allowed: write a much "
            "shorter summary and fewer pinnedDecisions"])

    # What the fold added is guarded (the record keeps it, or the policy reports letting it go); which of
    # the person's sentences enter the record is decided by their form (``record.statement_sentences``).
    person_texts = [line.text for line in new_lines if line.kind == PERSON]
    answer_lines = [line.text for line in new_lines if line.kind in (ASSISTANT, TOLD)]
    guarded = facts_of([*old_texts, *state.notes, *person_texts, *answer_lines])
    checked = facts_of([*old_texts, *state.notes, *folded_texts])
    present = "\n".join([*(line.text for line in fitted.lines), *merged.notes, *pins])
    let_go = "\n".join([*report.dropped_facts, *merged.dropped])
    missing_guarded = [f for f in guarded if not fact_present(f, present)]
    accidental = [f for f in missing_guarded if not fact_present(f, let_go)]
    if accidental:
        raise FactGuardFailure(f"{len(accidental)} guarded facts missing without the policy letting them go")
    kept = sum(1 for f in checked if fact_present(f, present))
    if len(fitted.render()) > limits.summary_max_chars:
        raise RecordOverLimit(f"the record has {len(fitted.render())} characters after fitting; "
                              f"at most {limits.summary_max_chars}")
    return CompactionResult(
        record=fitted,
        notes=merged.notes,
        strategy=Strategy.LLM if answer is not None else Strategy.EXTRACTIVE,
        tokens_before=before_memory + messages_cost(state.messages, counter),
        tokens_after=after_memory + messages_cost(plan.kept, counter),
        folded_tokens=folded_cost,
        facts_checked=len(checked),
        facts_kept=kept,
        facts_dropped=len(missing_guarded),
        facts_skipped=max(len(checked) - kept - len(missing_guarded), 0),
        lines_added=len(new_lines),
        lines_dropped=report.dropped_lines,
        notes_added=len(merged.added),
        notes_refused=len(merged.refused),
        policy_steps=report.steps,
        unread_share=round(unread_share("\n".join(folded_texts)), 3),
        room_tokens=max(int(allowed - _without_asked_cost(fitted, new_lines, merged.notes, pins, counter,
                                                          after_memory)), 0),
    )


def _without_asked_cost(fitted: Record, new_lines: Sequence[RecordLine], notes: Sequence[str],
                        pins: Sequence[str], counter: TokenCounter,
                        cost: int) -> int:
    """What memory costs without the ``Asked:`` lines this fold added (a model's gist stands in their place)."""
    asked = {id(line) for line in new_lines if line.kind == ASKED}
    if not asked:
        return cost
    lines = tuple(line for line in fitted.lines if id(line) not in asked) + (RecordLine(ABOUT, ""),)
    return memory_cost(Record(fitted.first_turn, fitted.last_turn, lines), notes, pins, counter)
