"""Compaction status for open sockets: one subscriber per web process, whichever node holds the thread.

Workers (and a forget: ``forget_frame``) publish ``{"type":"memory",...}`` JSON on ``mem:{hex}:events``
(``ThreadStore.publish_event``); the hub hands each frame to the sockets open for
that thread in this process.  Two transports, by store:

- one Redis: a pattern subscription on ``mem:{*}:events`` (``PSUBSCRIBE``) in one
  background thread; every event reaches every web process, which drops those of
  threads it does not show.
- a Redis Cluster (``sharded=True``): sharded pub/sub.  ``SSUBSCRIBE`` of each shown
  thread's channel on the master that serves the thread's slot, one connection and
  one reading thread per master; ``SPUBLISH`` reaches only that master (and its
  replicas), and only the web processes showing the thread get the event.  Classic
  pub/sub would copy every event to every node over the cluster bus and to every web
  process (docs/scale-out.md, for the figures behind this choice).

When a connection is lost (a node restarted or failed over) the hub reads the slot
map again with backoff and subscribes each channel where its slot is served now, so
frames reach open pages again without a restart.  Events published while a thread's
channel had no subscription are not replayed: they are status notices, the memory
itself is in the store.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import defaultdict
from typing import Callable, cast

import redis

from app.store.keys import EVENTS_PATTERN, ThreadKeys, thread_id_from_events_channel
from app.store.redis_client import ClusterClient, StoreClient

log = logging.getLogger(__name__)

def forget_frame(turns: list[int], message_ids: list[str]) -> dict:
    """The ``memory`` frame a forget publishes on its thread's channel, so every open socket of the thread (every
    tab of the session, on any web process) takes the turns off its page (docs/contract.md: WebSocket):
    ``{"type": "memory", "status": "succeeded", "step": "forget", "forgottenTurns": [n], "messageIds": [str],
    "message": "Turn n was forgotten."}`` (``"Turns 3, 5 were forgotten."`` for several)."""
    numbers = sorted(int(t) for t in turns)
    said = f"Turn {numbers[0]} was" if len(numbers) == 1 else f"Turns {', '.join(map(str, numbers))} were"
    return {"type": "memory", "status": "succeeded", "step": "forget", "forgottenTurns": numbers,
            "messageIds": list(message_ids), "message": f"{said} forgotten."}


# Called with each memory event frame of its thread; what it returns is ignored (a socket's ``send`` says
# whether the frame went out).
Listener = Callable[[dict], object]


class EventHub:
    """Routes memory events from Redis pub/sub to registered listeners.

    Args:
        client_factory: returns a fresh client for the subscription (``make_redis``): a
            ``redis.Redis``, or with ``sharded`` a ``ClusterClient``.
        sharded: subscribe per thread with ``SSUBSCRIBE`` (``REDIS_CLUSTER=1``).

    Attributes:
        subscribed: set while events of every registered thread are delivered (the pattern
            subscription is live, or every registered thread's shard channel is).
    """

    def __init__(self, client_factory: Callable[[], StoreClient], *, sharded: bool = False):
        self._client_factory = client_factory
        self._listeners: dict[str, set[Listener]] = defaultdict(set)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()
        self.subscribed = threading.Event()
        self._sharded: ShardedSubscriptions | None = None
        self.sharded = sharded

    def register(self, thread_id: str, listener: Listener) -> None:
        """Deliver events of ``thread_id`` to ``listener`` (called from a subscriber thread)."""
        with self._lock:
            first = not self._listeners.get(thread_id)
            self._listeners[thread_id].add(listener)
            if self.sharded:
                if self._sharded is None:
                    self._sharded = ShardedSubscriptions(cast(ClusterClient, self._client_factory()), self._dispatch,
                                                         self.subscribed)
                if first:
                    self._sharded.add(ThreadKeys(thread_id).events)
            elif self._thread is None:
                self._thread = threading.Thread(target=self._run, name="memory-events", daemon=True)
                self._thread.start()

    def unregister(self, thread_id: str, listener: Listener) -> None:
        """Stop delivering to ``listener``."""
        with self._lock:
            listeners = self._listeners.get(thread_id)
            if not listeners:
                return
            listeners.discard(listener)
            if listeners:
                return
            del self._listeners[thread_id]
            if self._sharded is not None:
                self._sharded.remove(ThreadKeys(thread_id).events)

    def stop(self) -> None:
        """Stop the subscriber threads (tests)."""
        self._stopped.set()
        if self._sharded is not None:
            self._sharded.stop()

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
        """The pattern subscription (one Redis): reconnect with backoff until stopped."""
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


class _NodeSubscriber:
    """One ``SSUBSCRIBE`` connection to one master, read by its own thread until it breaks or is stopped."""

    def __init__(self, name: str, client: redis.Redis, owner: "ShardedSubscriptions"):
        self.name = name
        self.pubsub = client.pubsub()
        self.owner = owner
        self.broken = False
        self.thread = threading.Thread(target=self._read, name=f"memory-events-{name}", daemon=True)

    def _read(self) -> None:
        while not self.owner.stopped.is_set() and not self.broken:
            try:
                message = self.pubsub.get_message(timeout=1.0)
            except (redis.RedisError, OSError, ValueError, AttributeError, RuntimeError) as exc:
                if not self.owner.stopped.is_set():
                    self.owner.lost(self, type(exc).__name__)
                return
            if message:
                self.owner.received(self, message)

    def close(self) -> None:
        self.broken = True
        try:
            self.pubsub.close()
        except Exception:
            pass


class ShardedSubscriptions:
    """Shard channels subscribed on the masters that serve their slots (``SSUBSCRIBE``, Redis 7).

    Args:
        cluster: a ``ClusterClient`` (its slot map says which master serves a channel).
        deliver: called with ``{"channel", "data"}`` for each message (from a reader thread).
        ready: set while every wanted channel's subscription is confirmed; cleared otherwise.

    A broken connection, or a server-side unsubscribe (its slot moved), puts the channels it
    carried back to be placed: a repair thread reads the slot map again and subscribes them
    where they are served now, retrying with backoff (0.2 s up to 5 s) while that fails.
    """

    def __init__(self, cluster: ClusterClient, deliver: Callable[[dict], None], ready: threading.Event) -> None:
        self.cluster = cluster
        self.deliver = deliver
        self.ready = ready
        self.stopped = threading.Event()
        self._lock = threading.RLock()
        self._wanted: set[str] = set()
        self._placed: dict[str, str] = {}  # channel -> node name it was sent to
        self._live: set[str] = set()       # subscription confirmed
        self._leaving: set[str] = set()    # unsubscribed by us, confirmation pending
        self._nodes: dict[str, _NodeSubscriber] = {}
        self._repair = threading.Event()
        self._repairer = threading.Thread(target=self._repair_loop, name="memory-events-repair", daemon=True)
        self._repairer.start()

    # -- the hub's side --------------------------------------------------------------------

    def add(self, channel: str) -> None:
        """Subscribe ``channel`` (now if its node answers, else by the repair thread)."""
        with self._lock:
            self._wanted.add(channel)
            self._leaving.discard(channel)
            self._update_ready()
            if not self._place(channel):
                self._repair.set()

    def remove(self, channel: str) -> None:
        """Unsubscribe ``channel`` (best effort: a broken connection has dropped it already)."""
        with self._lock:
            self._wanted.discard(channel)
            self._live.discard(channel)
            name = self._placed.pop(channel, None)
            subscriber = self._nodes.get(name) if name else None
            if subscriber is not None and not subscriber.broken:
                self._leaving.add(channel)
                try:
                    subscriber.pubsub.sunsubscribe(channel)
                except (redis.RedisError, OSError):
                    self._leaving.discard(channel)
            self._update_ready()

    def stop(self) -> None:
        self.stopped.set()
        self._repair.set()
        with self._lock:
            for subscriber in self._nodes.values():
                subscriber.close()
            self._nodes.clear()

    # -- the readers' side -----------------------------------------------------------------

    def received(self, subscriber: _NodeSubscriber, message: dict) -> None:
        kind, channel = message.get("type"), message.get("channel")
        if kind == "smessage":
            self.deliver({"channel": channel, "data": message.get("data")})
            return
        with self._lock:
            if kind == "ssubscribe":
                if channel in self._wanted and self._placed.get(channel) == subscriber.name:
                    self._live.add(channel)
            elif kind == "sunsubscribe":
                if channel in self._leaving:
                    self._leaving.discard(channel)
                elif channel in self._wanted and self._placed.get(channel) == subscriber.name:
                    # The server dropped it: the slot is served elsewhere now.
                    self._live.discard(channel)
                    self._placed.pop(channel, None)
                    self._repair.set()
            self._update_ready()

    def lost(self, subscriber: _NodeSubscriber, reason: str) -> None:
        with self._lock:
            if self._nodes.get(subscriber.name) is subscriber:
                del self._nodes[subscriber.name]
            subscriber.close()
            dropped = [c for c, name in self._placed.items() if name == subscriber.name]
            for channel in dropped:
                del self._placed[channel]
                self._live.discard(channel)
            self._update_ready()
        if dropped:
            log.warning("memory events: lost the subscription to %s (%s); %d channel(s) to place again",
                        subscriber.name, reason, len(dropped))
            self._repair.set()

    # -- placing ---------------------------------------------------------------------------

    def _update_ready(self) -> None:
        if self._wanted <= self._live:
            self.ready.set()
        else:
            self.ready.clear()

    def _subscriber(self, name: str, key: str) -> _NodeSubscriber:
        subscriber = self._nodes.get(name)
        if subscriber is None or subscriber.broken:
            subscriber = _NodeSubscriber(name, self.cluster.node_for(key), self)
            self._nodes[name] = subscriber
        return subscriber

    def _place(self, channel: str) -> bool:
        """Send ``SSUBSCRIBE channel`` to the master serving it; False when that failed (repair later)."""
        subscriber = None
        try:
            name = self.cluster.node_name_for(channel)
            subscriber = self._subscriber(name, channel)
            subscriber.pubsub.ssubscribe(channel)
        except (redis.RedisError, OSError) as exc:
            log.debug("memory events: %s not subscribed yet (%s)", channel, type(exc).__name__)
            if subscriber is not None and not subscriber.thread.is_alive():  # never read: drop it
                self._nodes.pop(subscriber.name, None)
                subscriber.close()
            return False
        self._placed[channel] = name
        if not subscriber.thread.is_alive() and not subscriber.broken:
            subscriber.thread.start()
        return True

    def _repair_loop(self) -> None:
        """Place every wanted channel that has no subscription, with backoff, whenever asked to."""
        while not self.stopped.is_set():
            self._repair.wait()
            self._repair.clear()
            backoff = 0.2
            while not self.stopped.is_set() and self._unplaced():
                try:
                    self.cluster.refresh_slots()
                except redis.RedisError as exc:
                    log.debug("memory events: slot map not read (%s)", type(exc).__name__)
                with self._lock:
                    failed = [c for c in sorted(self._wanted - set(self._placed)) if not self._place(c)]
                if not failed:
                    log.info("memory events: every channel is subscribed again")
                    break
                self.stopped.wait(backoff)
                backoff = min(backoff * 2, 5.0)

    def _unplaced(self) -> bool:
        with self._lock:
            return bool(self._wanted - set(self._placed))
