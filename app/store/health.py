"""The store's health probes for ``/healthz`` (``app.web.routes.store_health``): does Redis answer, does it take
writes?"""

from __future__ import annotations

from typing import TYPE_CHECKING

import redis

from app.store.errors import ErrorGuard, StoreUnavailable, guarded
from app.store.keys import HEALTH_PROBE_KEY

if TYPE_CHECKING:
    from app.store.redis_client import StoreClient


class StoreHealth:
    """Probes of the store's Redis.

    Args:
        client: the store's Redis client.
        guard: the store's error guard (a failed ``ping`` is counted as the store error ``ping``).
    """

    def __init__(self, client: StoreClient, guard: ErrorGuard) -> None:
        self.redis = client
        self.guard = guard

    @guarded
    def ping(self) -> bool:
        """True when Redis answers PING.

        Raises:
            StoreUnavailable: Redis did not answer.
        """
        return bool(self.redis.ping())

    def probe_write(self) -> bool:
        """True when Redis takes a write: ``SET health:{probe} 1 EX 60`` (one small key, overwritten).

        False when Redis answers but refuses it (``maxmemory`` with ``noeviction``, a read-only
        replica, a refused command).  Used by ``/healthz`` (cached there).  Not counted as a store error.

        Raises:
            StoreUnavailable: Redis did not answer (connection or timeout).
        """
        try:
            self.redis.set(HEALTH_PROBE_KEY, "1", ex=60)
            return True
        except redis.ResponseError:
            return False
        except redis.RedisError as exc:
            raise StoreUnavailable(f"{type(exc).__name__}: {exc}") from exc
