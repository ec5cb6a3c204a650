"""What a compaction attempt did (``Outcome``) and why (``Reason``): the words of its history entry and metrics.

Both are ``str`` enums, like ``app.memory.status.TurnStatus``: a member is the very string kept in
the thread's compaction history (``ThreadKeys.compactions``), sent in ``memory`` events, counted in
``chat_compactions_total`` and returned by the task, so ``Outcome.STALE == "stale"`` and JSON or Redis
see the plain value.  They sit in the store because ``apply_compaction`` already answers with them.

An applied compaction's reason is its strategy (``app.memory.compaction``: ``llm`` or ``extractive``);
a failed one's may also be a model error's category not listed here (``LLMError.category``), kept as given.
"""

from __future__ import annotations

from enum import StrEnum

from app.memory.status import Vocabulary


class Outcome(StrEnum):
    """How one compaction attempt ended."""

    APPLIED = "applied"
    """The fold was written (``apply_compaction``'s compare-and-set held)."""
    STALE = "stale"
    """The thread changed meanwhile; nothing was written."""
    FAILED = "failed"
    """Nothing was written; retried with backoff when the reason is transient."""
    SKIPPED = "skipped"
    """No compaction was due (or, for a refinement, the thread was not quiet yet)."""
    BLOCKED = "blocked"
    """A fold failed for a reason a retry will not fix; the thread's folds are not asked again for
    ``COMPACTION_BLOCKED_SECONDS`` (a clear lifts it)."""


class Reason(Vocabulary):
    """Why an attempt was skipped, stale or failed."""

    # skipped
    NOT_DUE = "not_due"
    NO_GAIN = "no_gain"
    NOT_QUIET = "not_quiet"
    # stale (``lua/apply_compaction.lua``)
    GENERATION = "generation"
    MESSAGES = "messages"
    MISSING = "missing"
    # failed: the model (``LLMError.category``)
    RATE_LIMITED = "rate_limited"
    TIMEOUT = "timeout"
    UNAVAILABLE = "unavailable"
    BAD_REQUEST = "bad_request"
    INVALID_ANSWER = "invalid_answer"
    # failed: the store, the stored state, the fold, anything else
    STORE_UNAVAILABLE = "store_unavailable"
    CORRUPT = "corrupt"
    FACT_GUARD = "fact_guard"
    INTERNAL = "internal"


def reason_of(value: str) -> "Reason | str":
    """``value`` as a ``Reason`` member when it names one, else the string as given."""
    return Reason.parse(value) or value
