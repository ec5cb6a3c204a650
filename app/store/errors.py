"""The store's errors and its one error guard (docs/contract.md: what a person sees when memory is unavailable).

Every Redis failure of a store object surfaces as ``StoreUnavailable`` (never with Redis's text in what a person
sees), after the store's error hook was told the operation's name (the metrics count them:
``app.observability.metrics.count_store_error``).  ``ErrorGuard`` is that mapping, public so that every reader
of the store's keys (the thread store, the archive, the compaction markers and history, the socket leases, the
health probes) maps errors the same way; ``guarded`` applies it to a method of an object holding a ``guard``.
"""

from __future__ import annotations

import functools
import logging
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Callable, Protocol, TypeVar

import redis

log = logging.getLogger(__name__)


class StoreUnavailable(RuntimeError):
    """The store could not be reached or answered with an error.  Its text is for logs only."""


class OutcomeUnknown(StoreUnavailable):
    """A memory-changing script was sent, its reply was lost and reading the thread back failed too: it may
    or may not have been applied (never "not written").  Its text is for logs only."""


class CorruptState(RuntimeError):
    """The stored hash does not satisfy the stored-state schema (or is not a hash).  Its text is for logs only.

    Readers treat the thread as empty and unreadable (docs/contract.md: ``memory_unreadable``);
    ``ThreadStore.clear`` always repairs it.
    """


class Unsettled(redis.ConnectionError):
    """The reply of a memory-changing script was lost after it was sent (internal to the store)."""


def never_sent(exc: BaseException) -> bool:
    """True when ``exc`` (a redis-py connection error) came from making the connection (refused, unreachable,
    name not resolved): the command was never written, so its outcome is known (not run)."""
    seen: BaseException | None = exc
    for _ in range(5):
        if seen is None:
            return False
        if isinstance(seen, (ConnectionRefusedError, socket.gaierror)):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class ErrorGuard:
    """Maps Redis failures to ``StoreUnavailable``, telling ``on_error`` first.

    Args:
        on_error: called with the operation's name (``"load"``, ``"archive"``, ``"claim_socket"``, ...) on every
            Redis failure, before ``StoreUnavailable`` is raised; what it raises is logged and dropped (observability
            never changes what the store does).  None: failures are not reported.
    """

    def __init__(self, on_error: Callable[[str], None] | None = None):
        self.on_error = on_error

    def report(self, operation: str) -> None:
        """Tell ``on_error`` that ``operation`` failed (or met a condition it counts, such as ``wait_replicas``);
        never raises."""
        if self.on_error is None:
            return
        try:
            self.on_error(operation)
        except Exception:  # observability never changes what the store does
            log.debug("store error not reported", exc_info=True)

    def unavailable(self, operation: str, exc: BaseException) -> StoreUnavailable:
        """Report ``operation`` and return the ``StoreUnavailable`` to raise (``raise ... from exc``); its text is
        ``"<exception type>: <exception text>"``, for logs only."""
        self.report(operation)
        return StoreUnavailable(f"{type(exc).__name__}: {exc}")

    @contextmanager
    def __call__(self, operation: str) -> Iterator[None]:
        """``with guard("archive"): ...``: a ``redis.RedisError`` inside becomes ``StoreUnavailable``.

        Raises:
            StoreUnavailable: Redis failed inside the block (``on_error`` told ``operation`` first).
        """
        try:
            yield
        except redis.RedisError as exc:
            raise self.unavailable(operation, exc) from exc


class Guarded(Protocol):
    """An object whose Redis failures go through ``guard``."""

    guard: ErrorGuard


F = TypeVar("F", bound=Callable[..., Any])


def guarded(fn: F) -> F:
    """Run the method ``fn`` under its object's ``guard``, with the method's name as the operation's."""
    @functools.wraps(fn)
    def wrapper(self: Guarded, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(self, *args, **kwargs)
        except redis.RedisError as exc:
            raise self.guard.unavailable(fn.__name__, exc) from exc
    return wrapper  # type: ignore[return-value]
