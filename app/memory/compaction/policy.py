"""When a compaction is due and which whole turns it folds.

- **Due** (``compaction_due``): the stored messages exceed ``recent_turns`` whole
  turns by at least ``compact_batch_turns`` whole turns, or the uncompacted
  messages pass 70 % of the prompt budget.  Exactly ``2 * recent_turns``
  messages is never due.
- **What to fold** (``plan_compaction``): the newest whole turns that fit both
  ``recent_turns`` and 35 % of the prompt budget stay verbatim; older turns are
  folded, oldest first, never splitting a turn.  A fold is capped so that the
  compaction prompt fits the prompt budget (what is left is folded by the next
  compaction, which is then still due).
- **Hard cap** (``hard_cap_messages``): past four recent windows of stored
  messages, a thread whose model keeps failing is folded without the model.

Units: tokens (the model's tokenizer) for budgets, counts of messages or whole
turns (a user message and its answer).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from app.memory.limits import MemoryLimits
from app.memory.state import ThreadMessage, ThreadState, group_turns
from app.memory.tokens import TokenCounter

TOKEN_TRIGGER_SHARE = 0.70
"""Uncompacted messages above this share of the prompt budget make a compaction due."""
KEEP_SHARE = 0.35
"""The kept (verbatim) turns use at most this share of the prompt budget."""
HARD_CAP_FACTOR = 4
"""Stored messages beyond this many recent windows are folded without a model when compaction fails."""
SUMMARY_TOKEN_SHARE = 0.25
"""The summary costs at most this share of the prompt budget, in tokens, besides its character limit:
2,500 Chinese characters are about 3,000 tokens, so characters alone do not bound a prompt.  With the
person's pins (at most 25 %), the notes (5 %) and the kept turns (35 %) this leaves at least 10 % for
the system prompt and the new input."""
NOTES_TOKEN_SHARE = 0.05
"""All model notes together cost at most this share of the prompt budget (a fifth of what pins may)."""
GAIN_SHARE = 0.10
"""A compaction must free at least this share of the tokens it folds: memory after (summary + notes +
pins) costs at most memory before (summary + notes + pins + folded turns) minus a tenth of the folded
turns.  Keeping a turn word for word is the most faithful memory, so a fold that frees less (short,
fact-dense turns whose statements the record keeps anyway) waits for more turns instead; and since each
applied fold frees a tenth of what it folds, repeated compactions always shrink the prompt."""


def uncompacted_tokens(messages: Iterable[ThreadMessage], counter: TokenCounter) -> int:
    """Tokens of the stored messages' texts (the measure ``compaction_due`` compares), in tokens."""
    return sum(counter.count(m.text) for m in messages)


def compaction_due(message_count: int, uncompacted: int, limits: MemoryLimits, prompt_budget: int) -> bool:
    """Is a compaction due after a committed turn?

    Args:
        message_count: messages stored now (2 per whole turn).
        uncompacted: tokens of those messages' texts (``uncompacted_tokens()``).
        limits: ``MemoryLimits`` (``recent_turns``, ``compact_batch_turns``).
        prompt_budget: tokens a prompt may use (context window minus reserved output).

    Returns:
        True when the messages exceed ``recent_turns`` whole turns by at least
        ``compact_batch_turns`` whole turns, or when there is at least one whole turn
        and the messages' tokens pass 70 % of ``prompt_budget``.
    """
    window = 2 * limits.recent_turns
    beyond = message_count - window
    if beyond > 0 and beyond >= 2 * limits.compact_batch_turns:
        return True
    return message_count >= 2 and uncompacted > TOKEN_TRIGGER_SHARE * prompt_budget


def summary_token_cap(prompt_budget: int) -> int:
    """The summary's token limit for a prompt budget (``SUMMARY_TOKEN_SHARE``), in tokens."""
    return int(SUMMARY_TOKEN_SHARE * prompt_budget)


def notes_token_cap(prompt_budget: int) -> int:
    """The notes' token limit for a prompt budget (``NOTES_TOKEN_SHARE``), in tokens."""
    return int(NOTES_TOKEN_SHARE * prompt_budget)


def hard_cap_messages(limits: MemoryLimits) -> int:
    """The most messages a thread should hold: four recent windows (32 with the defaults)."""
    return HARD_CAP_FACTOR * 2 * limits.recent_turns


@dataclass(frozen=True)
class CompactionPlan:
    """Which whole turns a compaction folds and which it keeps.

    Attributes:
        folded: the messages to fold, oldest first (whole turns; the oldest stored messages).
        kept: the messages that stay verbatim, oldest first.
        folded_turns: whole turns in ``folded``.
        kept_turns: whole turns in ``kept``.
        expected_gen: the generation read (the compare-and-set checks it).
        version: the version read.
        message_token_limit: the longest a single folded message may be in the model's prompt, in tokens.
    """

    folded: tuple[ThreadMessage, ...]
    kept: tuple[ThreadMessage, ...]
    folded_turns: int
    kept_turns: int
    expected_gen: int
    version: int
    message_token_limit: int

    @property
    def folded_ids(self) -> list[str]:
        """Ids of the folded messages, oldest first (what the compare-and-set compares)."""
        return [m.id for m in self.folded]


def plan_compaction(state: ThreadState, limits: MemoryLimits, counter: TokenCounter, prompt_budget: int, *,
                    fixed_prompt_tokens: int) -> CompactionPlan | None:
    """Choose the whole turns to fold.

    The newest whole turns that fit both ``limits.recent_turns`` and 35 % of
    ``prompt_budget`` stay; older turns are folded, oldest first.  A turn is never
    split.  The fold is capped so that the compaction prompt (``fixed_prompt_tokens``
    of instructions plus the folded turns) fits ``prompt_budget``; at least one turn
    is always folded (its messages are clipped in the prompt when one turn alone is
    too long).

    Args:
        state: the thread as just read (its ``gen`` and ``version`` are recorded).
        limits: ``MemoryLimits``.
        counter: the model's token counter.
        prompt_budget: tokens a prompt may use.
        fixed_prompt_tokens: tokens of the compaction prompt without any turn.

    Returns:
        The plan, or None when nothing would be folded.
    """
    turns = group_turns(state.messages)
    costs = [sum(counter.message(m.role, m.text) for m in turn) for turn in turns]
    keep_budget = KEEP_SHARE * prompt_budget
    kept_turns, used = 0, 0
    for index in range(len(turns) - 1, -1, -1):
        if kept_turns >= limits.recent_turns or used + costs[index] > keep_budget:
            break
        if turns[index][0].role != "user":  # an orphan answer is never kept alone
            break
        kept_turns += 1
        used += costs[index]
    foldable = len(turns) - kept_turns
    if foldable <= 0:
        return None
    fold_budget = max(prompt_budget - fixed_prompt_tokens, prompt_budget // 4)
    fold_count, fold_cost = 0, 0
    for index in range(foldable):
        if fold_count and fold_cost + costs[index] > fold_budget:
            break
        fold_count += 1
        fold_cost += costs[index]
    folded = tuple(m for turn in turns[:fold_count] for m in turn)
    per_message = fold_budget if fold_cost <= fold_budget else max(fold_budget // max(len(folded), 1) - 8, 32)
    return CompactionPlan(
        folded=folded,
        kept=tuple(m for turn in turns[fold_count:] for m in turn),
        folded_turns=fold_count,
        kept_turns=len(turns) - fold_count,
        expected_gen=state.gen,
        version=state.version,
        message_token_limit=per_message,
    )
