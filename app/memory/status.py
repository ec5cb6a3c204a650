"""How a turn ended, and what that means for memory and for the ``done`` frame (docs/memory.md: "A turn").

``TurnStatus`` is a ``str`` enum: its members are the very strings of frames, run records and
accounting records, so ``TurnStatus.FINAL == "final"`` and JSON or Redis see the plain value.

| status | written to memory | ``done`` frame status |
| --- | --- | --- |
| ``completed`` | yes | ``completed`` |
| ``final`` (a task list's last answer) | yes | ``completed`` |
| ``blocked`` | yes | ``blocked`` |
| ``paused`` (a task list waiting for confirmation) | no | ``paused`` |
| ``failed`` | no | ``failed`` |
| ``cancelled`` | no | ``cancelled`` |
| ``interrupted`` (the socket closed; no ``done`` is sent) | no | ``interrupted`` |
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Self


class Vocabulary(StrEnum):
    """A ``str`` enum of words kept in Redis and sent on the wire (``TurnStatus``, the compaction
    ``Reason``): a member equals its plain string."""

    @classmethod
    def parse(cls, value: Any) -> Self | None:
        """The member whose value is ``value`` (a ``str``), or None for anything else (never raises)."""
        try:
            return cls(value)
        except (ValueError, TypeError):
            return None


class TurnStatus(Vocabulary):
    """A producer's final status, a turn's outcome, or a finished run's status."""

    COMPLETED = "completed"
    FINAL = "final"
    BLOCKED = "blocked"
    PAUSED = "paused"
    FAILED = "failed"
    CANCELLED = "cancelled"
    INTERRUPTED = "interrupted"

    @property
    def writes_memory(self) -> bool:
        """True for ``completed``, ``final`` and ``blocked``: the turn's two texts enter memory."""
        return self in _WRITTEN

    @property
    def done_status(self) -> "TurnStatus":
        """The status the ``done`` frame carries: ``final`` is told as ``completed``, every other as itself."""
        return TurnStatus.COMPLETED if self is TurnStatus.FINAL else self


_WRITTEN = frozenset({TurnStatus.COMPLETED, TurnStatus.FINAL, TurnStatus.BLOCKED})


def writes_memory(value: str | None) -> bool:
    """True when ``value`` (a status string, or None) names a status that writes memory."""
    status = TurnStatus.parse(value)
    return status is not None and status.writes_memory
