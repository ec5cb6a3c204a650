"""Leases of open websockets: one sorted set per owner, socket id -> lease end (Redis milliseconds), written only
by ``lua/claim_socket.lua`` (docs/deployment.md: "Budgets").

Two limits use them, through the one ``SocketLeases`` object: a session's open sockets (``WS_MAX_PER_SESSION``,
``LeaseOwner.session``: ``ws:{hex}:sockets``) and a network address's (``WS_MAX_PER_CLIENT``,
``LeaseOwner.client``: ``ws:{cl:<tag>}:sockets``).  A lease not renewed within its ``lease_seconds`` frees its
place by itself, so a process that dies leaves nothing behind for long.  Never memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import redis

from app.store.errors import ErrorGuard, StoreUnavailable
from app.store.keys import ThreadKeys, client_sockets_key
from app.store.scripts import lua_script

if TYPE_CHECKING:
    from app.store.redis_client import StoreClient


@dataclass(frozen=True)
class LeaseOwner:
    """Whose open websockets a lease counts: ``key`` is its sorted set (built in ``app.store.keys``).

    ``reported``: a Redis failure is told to the store's error hook (the session's leases, counted as store
    errors ``claim_socket``, ``renew_socket``, ``release_socket``); an address's leases are not.
    """

    key: str
    reported: bool

    @classmethod
    def session(cls, thread_id: str) -> "LeaseOwner":
        """The session of ``thread_id`` (``WS_MAX_PER_SESSION``)."""
        return cls(ThreadKeys(thread_id).sockets, True)

    @classmethod
    def client(cls, address: str) -> "LeaseOwner":
        """The network address ``address`` (as ``app.store.quotas.client_of`` gives it; ``WS_MAX_PER_CLIENT``)."""
        return cls(client_sockets_key(address), False)


class SocketLeases:
    """Claims, renews and releases websocket leases (``lua/claim_socket.lua``).

    Args:
        client: the store's Redis client.
        guard: the store's error guard; it is told a failure of an owner that is ``reported``.

    Every method raises ``StoreUnavailable`` when Redis fails; callers serve the socket anyway (a store that
    cannot count refuses no one).
    """

    def __init__(self, client: StoreClient, guard: ErrorGuard) -> None:
        self.redis = client
        self.guard = guard
        self._script = lua_script(client, "claim_socket.lua")

    def _run(self, operation: str, owner: LeaseOwner, args: list) -> int:
        try:
            return self._script(keys=[owner.key], args=args)
        except redis.RedisError as exc:
            if owner.reported:
                raise self.guard.unavailable(operation, exc) from exc
            raise StoreUnavailable(type(exc).__name__) from exc
        except OSError as exc:  # not a redis-py error: an address's limit fails open all the same
            if owner.reported:
                raise
            raise StoreUnavailable(type(exc).__name__) from exc

    def claim(self, owner: LeaseOwner, socket_id: str, *, most: int, lease_seconds: float) -> bool:
        """Take a place for one open websocket of ``owner`` for ``lease_seconds``; False when ``most`` are open."""
        return bool(self._run("claim_socket", owner, ["claim", socket_id, int(lease_seconds * 1000), most]))

    def renew(self, owner: LeaseOwner, socket_id: str, *, lease_seconds: float) -> None:
        """Extend a websocket's lease by ``lease_seconds`` from now."""
        self._run("renew_socket", owner, ["renew", socket_id, int(lease_seconds * 1000), 0])

    def release(self, owner: LeaseOwner, socket_id: str) -> None:
        """Give a closed websocket's place back."""
        self._run("release_socket", owner, ["release", socket_id, 0, 0])
