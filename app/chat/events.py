"""Compaction status for open sockets: one pattern subscription per web process.

Workers publish ``{"type":"memory",...}`` JSON on ``mem:{hex}:events``; the hub
listens on the pattern ``mem:{*}:events`` in one background thread and hands
each frame to the sockets open for that thread.  When Redis goes away the
listener reconnects with backoff and resubscribes, so frames reach open pages
again after a Redis restart (acceptance B10).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import defaultdict
from typing import Callable

import redis

from app.store.keys import EVENTS_PATTERN, thread_id_from_events_channel

log = logging.getLogger(__name__)

Listener = Callable[[dict], None]


class EventHub:
    """Routes memory events from Redis pub/sub to registered listeners.

    Args:
        client_factory: returns a fresh ``redis.Redis`` for the subscription.
    """

    def __init__(self, client_factory: Callable[[], redis.Redis]):
        self._client_factory = client_factory
        self._listeners: dict[str, set[Listener]] = defaultdict(set)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()
        self.subscribed = threading.Event()

    def register(self, thread_id: str, listener: Listener) -> None:
        """Deliver events of ``thread_id`` to ``listener`` (called from the hub's thread)."""
        with self._lock:
            self._listeners[thread_id].add(listener)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="memory-events", daemon=True)
                self._thread.start()

    def unregister(self, thread_id: str, listener: Listener) -> None:
        """Stop delivering to ``listener``."""
        with self._lock:
            listeners = self._listeners.get(thread_id)
            if listeners:
                listeners.discard(listener)
                if not listeners:
                    del self._listeners[thread_id]

    def stop(self) -> None:
        """Stop the listener thread (tests)."""
        self._stopped.set()

    def _dispatch(self, message: dict) -> None:
        thread_id = thread_id_from_events_channel(message.get("channel") or "")
        if not thread_id:
            return
        try:
            frame = json.loads(message["data"])
        except (TypeError, ValueError):
            return
        if not isinstance(frame, dict) or frame.get("type") != "memory":
            return
        with self._lock:
            listeners = list(self._listeners.get(thread_id, ()))
        for listener in listeners:
            try:
                listener(frame)
            except Exception:  # a closed socket must not stop the hub
                log.debug("memory event listener failed", exc_info=True)

    def _run(self) -> None:
        backoff = 0.5
        while not self._stopped.is_set():
            pubsub = None
            try:
                pubsub = self._client_factory().pubsub(ignore_subscribe_messages=True)
                pubsub.psubscribe(EVENTS_PATTERN)
                self.subscribed.set()
                backoff = 0.5
                while not self._stopped.is_set():
                    message = pubsub.get_message(timeout=1.0)
                    if message and message.get("type") == "pmessage":
                        self._dispatch(message)
            except redis.RedisError as exc:
                self.subscribed.clear()
                log.warning("memory events subscription lost (%s); retrying in %.1f s", type(exc).__name__, backoff)
                time.sleep(backoff)
                backoff = min(backoff * 2, 10.0)
            finally:
                if pubsub is not None:
                    try:
                        pubsub.close()
                    except Exception:
                        pass
