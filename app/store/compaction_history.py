"""A thread's compaction history: a capped list of entries, numbers and categories only (``app.store.keys``:
``mem:{hex}:compactions``; docs/contract.md: the export's ``compactions``).

An entry is a JSON object ``{"at": ms, "outcome", "reason", "step", ...figures}``: ``outcome`` and ``reason`` are
``app.store.compaction_outcome``'s words, ``step`` a ``HistoryStep``.  The list keeps the newest ``HISTORY_MAX``
entries, the one bound every writer and reader uses.
"""

from __future__ import annotations

import json
from enum import StrEnum
from typing import TYPE_CHECKING

from app.store.compaction_outcome import Outcome
from app.store.errors import ErrorGuard, guarded
from app.store.keys import ThreadKeys
from app.store.scripts import lua_script

if TYPE_CHECKING:
    from app.store.redis_client import StoreClient

HISTORY_MAX = 50
"""Entries a thread's compaction history keeps (the newest)."""


class HistoryStep(StrEnum):
    """What an entry of the history is about (its ``step``)."""

    FOLD = "fold"
    """The fold: the oldest turns into the record and the archive, without a model."""
    REFINE = "refine"
    """The refinement: the model's part of a compaction."""
    FORGET = "forget"
    """A turn forgotten by the person (docs/contract.md: Forget and provenance)."""
    CLEAR = "clear"
    """The thread cleared."""

    @classmethod
    def values(cls) -> frozenset[str]:
        """Every step's string."""
        return frozenset(step.value for step in cls)


def forget_entry(turn: int, at_ms: int) -> dict:
    """The history entry of forgetting ``turn`` at ``at_ms`` (Unix milliseconds):
    ``{"at", "outcome": "applied", "reason": "forgotten", "step": "forget", "forgottenTurn"}``."""
    return {"at": at_ms, "outcome": Outcome.APPLIED, "reason": "forgotten", "step": HistoryStep.FORGET,
            "forgottenTurn": turn}


def encode_entry(entry: dict) -> str:
    """An entry as stored: compact JSON (no spaces after ``,`` and ``:``; non-ASCII characters escaped)."""
    return json.dumps(entry, separators=(",", ":"))


class CompactionHistory:
    """Writes threads' compaction histories.

    Args:
        client: the store's Redis client.
        guard: the store's error guard (``ThreadStore.guard``).
        ttl_seconds: the thread's sliding expiry (``MEMORY_TTL_SECONDS``), given to a list whose thread has none.
    """

    def __init__(self, client: StoreClient, guard: ErrorGuard, ttl_seconds: int) -> None:
        self.redis = client
        self.guard = guard
        self.ttl = ttl_seconds
        self._record = lua_script(client, "record_compaction.lua")

    @guarded
    def record_compaction(self, thread_id: str, entry: dict, max_entries: int = HISTORY_MAX, *,
                          cleared: int | None = None) -> bool:
        """Push one entry on the thread's history, keeping the newest ``max_entries``; True when recorded.

        Nothing is recorded for a thread that does not exist, nor, with ``cleared`` (the clear counter the work
        read), for a thread cleared since (``lua/record_compaction.lua``).

        Raises:
            StoreUnavailable: Redis failed.
        """
        keys = ThreadKeys(thread_id)
        return bool(self._record(keys=[keys.state, keys.compactions],
                                 args=[encode_entry(entry), max_entries, self.ttl,
                                       "" if cleared is None else str(int(cleared))]))
