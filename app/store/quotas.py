"""What one client may take from the shared store and sockets (docs/deployment.md: "Budgets").

- ``client_of(address, ipv6_prefix)``: the client a network address counts as (an IPv4 address; an IPv6
  address's network of ``CLIENT_IPV6_PREFIX`` bits; an IPv4-mapped IPv6 address is its IPv4 address),
  so one client is counted once whatever the spelling of its address.
- ``Quotas.hit(kind, who, limit)``: one more request counted against a rate limit (the ``limits`` library's
  fixed windows in Redis, keys ``quota:LIMITER/...``); False when over it.  ``Quotas.allows`` asks without
  counting (a request that may still be refused for another reason is counted only once it is accepted).
- A network address's open websockets are leases of ``app.store.socket_leases.SocketLeases``
  (``LeaseOwner.client``), as a session's.
- ``Quotas.record_turn_stats``: a turn's accounting record, kept only while its thread exists
  (``lua/record_turn_stats.lua``): a turn that wrote nothing leaves no key.
- ``Quotas.thread_exists`` and ``Quotas.used_memory_fraction``: the store's budget, both O(1) commands.

Every method raises ``StoreUnavailable`` when Redis fails; callers decide (the quotas fail open: a store
that cannot count does not refuse anyone, and the turn itself then meets the store's own error).
"""

from __future__ import annotations

import functools
import ipaddress
import logging
import time
from typing import TYPE_CHECKING, Callable, ParamSpec, TypeVar

import redis
from limits import parse
from limits.errors import StorageError
from limits.storage import RedisClusterStorage, RedisStorage
from limits.strategies import FixedWindowRateLimiter

from app.store.errors import StoreUnavailable
from app.store.keys import QUOTA_KEY_PREFIX, ThreadKeys, quota_identity
from app.store.scripts import lua_script

if TYPE_CHECKING:
    from app.store.redis_client import StoreClient

log = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")


def client_of(address: str | None, ipv6_prefix: int = 64) -> str:
    """The client ``address`` (a request's remote address) counts as in every per-client budget.

    Args:
        address: an IPv4 or IPv6 address as a proxy reports it (brackets and an IPv6 zone allowed).
        ipv6_prefix: bits of an IPv6 address that name one client (``CLIENT_IPV6_PREFIX``, 1-128).

    Returns:
        ``"a.b.c.d"`` for IPv4 (also written as ``::ffff:a.b.c.d`` or ``::ffff:XXXX:XXXX``), else the IPv6
        network ``"2001:db8:1:2::/64"`` in its compressed form; anything that is not an address as given
        (trimmed), ``"unknown"`` when empty.
    """
    text = (address or "").strip()
    if text.startswith("[") and "]" in text:
        text = text[1:text.index("]")]
    try:
        parsed = ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return text or "unknown"
    if isinstance(parsed, ipaddress.IPv6Address):
        if parsed.ipv4_mapped is not None:
            return str(parsed.ipv4_mapped)
        return str(ipaddress.IPv6Network((parsed, ipv6_prefix), strict=False))
    return str(parsed)


def _guard(fn: Callable[P, R]) -> Callable[P, R]:
    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except (redis.RedisError, StorageError, OSError) as exc:
            raise StoreUnavailable(type(exc).__name__) from exc
    return wrapper


class Quotas:
    """Per-client counters and the store's budget.

    Args:
        client: the store's Redis client (one Redis, or a cluster client).
        redis_url: its URL (a cluster's seed node), for the rate limiter's own cluster client.
        cluster: True on Redis Cluster.
    """

    def __init__(self, client: StoreClient, *, redis_url: str, cluster: bool = False) -> None:
        self.client = client
        storage: RedisStorage
        if cluster:
            scheme, rest = redis_url.split("://", 1)
            tls: dict[str, float | str | bool] = (
                {"ssl": True, "ssl_cert_reqs": "none"} if scheme == "rediss" else {})  # as the store's client
            # wrap_exceptions named (its default) so that only the TLS options go to the redis client
            storage = RedisClusterStorage(f"redis+cluster://{rest}", key_prefix=QUOTA_KEY_PREFIX,
                                          wrap_exceptions=False, **tls)
        else:
            storage = RedisStorage(redis_url, connection_pool=client.connection_pool, key_prefix=QUOTA_KEY_PREFIX)
        self._limiter = FixedWindowRateLimiter(storage)
        self._stats = lua_script(client, "record_turn_stats.lua")

    @_guard
    def hit(self, kind: str, who: str, limit: str) -> bool:
        """Count one request of ``kind`` by ``who`` against ``limit`` (e.g. ``"30/minute"``); False when over it.

        ``limit`` is the ``limits`` notation; an empty string or ``"0"`` means no limit.
        """
        if not limit or limit.strip() == "0":
            return True
        return self._limiter.hit(parse(limit), quota_identity(kind, who))

    @_guard
    def allows(self, kind: str, who: str, limit: str) -> bool:
        """True when one more request of ``kind`` by ``who`` is within ``limit``, counting nothing."""
        if not limit or limit.strip() == "0":
            return True
        return self._limiter.test(parse(limit), quota_identity(kind, who))

    @_guard
    def retry_after(self, kind: str, who: str, limit: str) -> int:
        """Seconds until ``who`` may ``kind`` again under ``limit`` (at least 1)."""
        reset, _remaining = self._limiter.get_window_stats(parse(limit), quota_identity(kind, who))
        return max(1, int(reset - time.time()) + 1)

    @_guard
    def record_turn_stats(self, thread_id: str, record_json: str, *, most: int, ttl_seconds: int) -> bool:
        """Add a turn's record to the thread's stats (the newest ``most`` kept); False, nothing written, when
        the thread does not exist (a first turn that wrote nothing)."""
        keys = ThreadKeys(thread_id)
        return bool(self._stats(keys=[keys.state, keys.stats], args=[record_json, most, ttl_seconds]))

    @_guard
    def thread_exists(self, thread_id: str) -> bool:
        """True when the thread's state hash exists (``EXISTS``, O(1))."""
        return bool(self.client.exists(ThreadKeys(thread_id).state))

    @_guard
    def used_memory_fraction(self) -> float | None:
        """The store's ``used_memory / maxmemory`` (the fullest node of a cluster); None when no ``maxmemory``
        is set or the server does not say (``INFO memory``, O(1))."""
        info = self.client.info("memory")
        nodes = info.values() if info and all(isinstance(v, dict) for v in info.values()) else [info]
        fractions = []
        for node in nodes:
            most = int(node.get("maxmemory") or 0)
            if most > 0:
                fractions.append(int(node.get("used_memory") or 0) / most)
        return max(fractions) if fractions else None
