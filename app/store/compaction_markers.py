"""A thread's compaction markers: the one pending fold, the one pending refinement, a block on folds, and the
thread's activity (``app.store.keys``: ``mem:{hex}:compacting``, ``:refining``, ``:active``; docs/memory.md:
A compaction).

The values are typed here and nowhere else:

- ``MarkerValue``: what a pending marker holds, the version (fold) or token (refinement) of the task that set it
  (``"<n>"``), or, on the fold's marker, that folds are blocked and why (``"blocked:<reason>"``).
- ``Activity``: the activity key's value, ``streaming`` while a turn streams, then ``idle``.

Each marker is a short-lived string key, never memory: a clear deletes them (``ThreadKeys.markers``).  Every
method raises ``StoreUnavailable`` when Redis fails, after the store's error hook is told the method's name.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

from app.store.errors import ErrorGuard, guarded
from app.store.keys import ThreadKeys
from app.store.scripts import lua_script

if TYPE_CHECKING:
    from app.store.redis_client import StoreClient


class Activity(StrEnum):
    """The value of a thread's activity key (``ThreadKeys.active``)."""

    STREAMING = "streaming"
    """A turn of the thread streams now (no refinement starts meanwhile)."""
    IDLE = "idle"
    """A turn ended less than ``COMPACTION_IDLE_SECONDS`` ago."""


@dataclass(frozen=True)
class MarkerValue:
    """What a pending marker holds: ``version`` (the fold's version or the refinement's token; an integer), or
    ``blocked`` (the reason a retry will not fix) when the thread's folds are blocked; never both."""

    version: int | None = None
    blocked: str | None = None

    BLOCKED_PREFIX = "blocked:"
    """How a blocked marker is stored: this prefix, then the reason."""

    @classmethod
    def of_version(cls, version: int) -> "MarkerValue":
        """The marker of the task for ``version``."""
        return cls(version=int(version))

    @classmethod
    def blocking(cls, reason: str) -> "MarkerValue":
        """The marker that blocks the thread's folds for ``reason`` (a ``Reason`` or a model error's category)."""
        return cls(blocked=str(reason))

    def encode(self) -> str:
        """The stored string: ``"<version>"`` or ``"blocked:<reason>"`` (as ``lua/release_marker.lua`` and
        ``lua/hold_marker.lua`` compare it)."""
        if self.blocked is not None:
            return self.BLOCKED_PREFIX + self.blocked
        return str(self.version)

    @classmethod
    def decode(cls, value: object) -> "MarkerValue | None":
        """The marker a stored value holds; None when absent or neither a version nor a block."""
        if not isinstance(value, str):
            return None
        if value.startswith(cls.BLOCKED_PREFIX):
            return cls(blocked=value[len(cls.BLOCKED_PREFIX):])
        try:
            return cls(version=int(value))
        except ValueError:
            return None


@dataclass(frozen=True)
class RefineStatus:
    """What the refinement step reads besides the thread (``CompactionMarkers.refine_status``).

    Attributes:
        refined_turns: person turns the model's part covered so far (``rf``).
        unrefined_folds: applied folds since the last refinement (``uf``).
        activity: ``streaming`` while a turn of the thread streams, ``idle`` within
            ``COMPACTION_IDLE_SECONDS`` after a turn, None when quiet (an ``Activity``; a value no version
            writes is kept as read).
        activity_ms: milliseconds the activity key still lives (0 when absent).
    """

    refined_turns: int = 0
    unrefined_folds: int = 0
    activity: Activity | str | None = None
    activity_ms: int = 0


def _activity(value: str | None) -> Activity | str | None:
    if value is None:
        return None
    try:
        return Activity(value)
    except ValueError:
        return value


class CompactionMarkers:
    """The pending-compaction markers and the activity key of threads.

    Args:
        client: the store's Redis client (``decode_responses=True``).
        guard: the store's error guard (``ThreadStore.guard``).
    """

    def __init__(self, client: StoreClient, guard: ErrorGuard) -> None:
        self.redis = client
        self.guard = guard
        self._release = lua_script(client, "release_marker.lua")
        self._hold = lua_script(client, "hold_marker.lua")

    @staticmethod
    def _key(thread_id: str, refine: bool) -> str:
        keys = ThreadKeys(thread_id)
        return keys.refining if refine else keys.compacting

    @guarded
    def mark_compaction_pending(self, thread_id: str, version: int, ttl_seconds: int, *,
                                refine: bool = False) -> bool:
        """Set the one-pending marker (SET NX EX, ``ttl_seconds``) of the fold, or with ``refine`` of the
        refinement, holding ``version``; False when one is already pending (or the thread's folds are blocked:
        ``block_compactions``)."""
        return bool(self.redis.set(self._key(thread_id, refine), MarkerValue.of_version(version).encode(), nx=True,
                                   ex=ttl_seconds))

    @guarded
    def release_compaction_marker(self, thread_id: str, version: int, *, refine: bool = False) -> bool:
        """Remove the pending marker if it still holds ``version`` (``lua/release_marker.lua``); False otherwise."""
        return bool(self._release(keys=[self._key(thread_id, refine)],
                                  args=[MarkerValue.of_version(version).encode()]))

    @guarded
    def hold_compaction_marker(self, thread_id: str, version: int, ttl_seconds: int, *, refine: bool = False) -> bool:
        """Give the pending marker a new expiry (seconds) for the task of ``version``.

        Sets it when it holds ``version`` or is gone; a marker of another version is left alone
        and False is returned (``lua/hold_marker.lua``).
        """
        return bool(self._hold(keys=[self._key(thread_id, refine)],
                               args=[MarkerValue.of_version(version).encode(), int(ttl_seconds)]))

    @guarded
    def block_compactions(self, thread_id: str, reason: str, seconds: int) -> None:
        """Mark the thread's folds as failing for a reason a retry will not fix: the fold's marker holds
        ``MarkerValue.blocking(reason)`` for ``seconds`` (a clear removes it), so turns do not ask again meanwhile."""
        self.redis.set(ThreadKeys(thread_id).compacting, MarkerValue.blocking(reason).encode(), ex=int(seconds))

    @guarded
    def compactions_blocked(self, thread_id: str) -> str | None:
        """The reason the thread's folds are blocked (``block_compactions``), or None."""
        marker = MarkerValue.decode(self.redis.get(ThreadKeys(thread_id).compacting))
        return marker.blocked if marker is not None else None

    @guarded
    def mark_activity(self, thread_id: str, activity: Activity | str, seconds: float) -> None:
        """Set the thread's activity key (``Activity``) for ``seconds`` (at least one millisecond)."""
        self.redis.set(ThreadKeys(thread_id).active, str(activity), px=max(int(seconds * 1000), 1))

    @guarded
    def refine_status(self, thread_id: str) -> RefineStatus:
        """``rf``, ``uf`` and the thread's activity key with its remaining life, in one round trip."""
        keys = ThreadKeys(thread_id)
        pipe = self.redis.pipeline(transaction=False)
        pipe.hmget(keys.state, "rf", "uf")
        pipe.get(keys.active)
        pipe.pttl(keys.active)
        (refined, unrefined), activity, left = pipe.execute()
        return RefineStatus(int(refined or 0), int(unrefined or 0), _activity(activity), max(int(left or 0), 0))
