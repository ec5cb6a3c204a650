"""The feedback list of a thread in Redis: ``mem:{hex}:feedback`` (keys from ``app/store/keys.py``).

Newest first, capped, with the thread's TTL; one entry per message (``lua/feedback_put.lua`` drops a
message's earlier entry before pushing the new one).  The entry's shape belongs to
``app/observability/feedback.py``; this module only stores and reads JSON objects.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from app.store.keys import ThreadKeys
from app.store.scripts import lua_script

if TYPE_CHECKING:
    from app.store.redis_client import StoreClient


class FeedbackStore:
    """Feedback entries of threads, on one redis-py client (``decode_responses=True``)."""

    def __init__(self, client: StoreClient) -> None:
        self._client = client
        self._put = lua_script(client, "feedback_put.lua")

    def put(self, thread_id: str, entry: dict, cap: int, ttl_seconds: int) -> int:
        """Store ``entry`` (a dict with ``messageId``), replacing that message's earlier one.

        Returns how many entries the thread keeps (at most ``cap``).
        Raises:
            redis.RedisError: the store failed.
        """
        payload = json.dumps(entry, ensure_ascii=False, separators=(",", ":"))
        return int(self._put(keys=[ThreadKeys(thread_id).feedback],
                             args=[payload, entry["messageId"], cap, ttl_seconds]))

    def load(self, thread_id: str) -> list[dict]:
        """The thread's entries, newest first (``[]`` when there are none).

        Raises:
            redis.RedisError: the store failed.
        """
        return [json.loads(item) for item in self._client.lrange(ThreadKeys(thread_id).feedback, 0, -1)]
