"""Every Redis key name of the project, built here and nowhere else.

Keys of one thread share the hash tag ``{<thread hex>}``, so on Redis Cluster
they land in one hash slot and a Lua script may touch them together; no command
or script of the project names keys of two threads, and nothing scans the keyspace.

| key | type | holds |
| --- | --- | --- |
| ``mem:{hex}`` | hash | ``v``, ``gen``, ``clr`` (times cleared), ``messages`` (JSON), ``summary`` (the record, JSON ``{"fmt": 2, …}``: ``app.memory.record``; text when an earlier version wrote it), ``pins`` (JSON), ``notes`` (JSON), ``lastCompactedAt``, ``ft`` (person turns folded so far), ``ab`` (archive bytes), ``rf`` (turns refined by the model so far), ``uf`` (folds since the last refinement), ``fg`` (turns forgotten so far), ``fgt`` (JSON array of the forgotten turns' numbers), ``born`` (creation stamp: the server's clock and the first turn's answer id; every process cache of the thread is valid for it) |
| ``mem:{hex}:archive`` | sorted set, capped | every folded turn, scored by its turn number: ``{"n", "m": [messages]}`` (``app.store.archive``) |
| ``mem:{hex}:forgetting`` | string, TTL 120 s | the forget job running now: ``{"turns": [numbers], "startedAt": ms}``, deleted when it ends (``app.web.api.forget``) |
| ``mem:{hex}:compacting`` | string, NX + EX | the one pending compaction (the version it saw); a short expiry while queued, held while its task runs |
| ``mem:{hex}:refining`` | string, NX + EX | the one pending refinement (the model's part of a compaction; the token it was asked with) |
| ``mem:{hex}:active`` | string, EX | ``streaming`` while a turn of the thread streams, then ``idle`` for ``COMPACTION_IDLE_SECONDS`` |
| ``mem:{hex}:events`` | pub/sub channel | compaction status for open sockets (a shard channel on a cluster: it lives in the thread's slot) |
| ``mem:{hex}:stats`` | list, capped | per-turn token accounting (numbers only) |
| ``mem:{hex}:compactions`` | list, capped | compaction history (numbers and outcomes only; a forget's entry too: ``lua/forget_turn.lua``) |
| ``mem:{hex}:feedback`` | list, capped | thumbs up/down per assistant message |
| ``ws:{hex}:sockets`` | sorted set, PEXPIRE | the session's open websockets: socket id -> lease end (Redis ms); ``WS_MAX_PER_SESSION`` |
| ``run:{hex}:<run id>`` | hash | tool, agent and workflow runtime state; never read by hydration or prompts |
| ``run:{hex}:paused`` | string, EX | the id of the thread's task-list run waiting for confirmation |
| ``caps:<sha256 of base URL, 24 hex>`` | hash, EX | what the model provider was found to refuse (``tools``, ``json_schema``, ``json_object_schema``; ``ProviderCaps``) |
| ``obs:{metrics}:worker`` | hash | counters and duration buckets added by Celery workers (``app.observability.metrics``) |
| ``health:{probe}`` | string, EX | the web processes' write probe (``/healthz``: is the store taking writes?) |

The last three, and the clients' quota keys (listed with their builders at the end of this module),
are the only keys that belong to no thread.  On a cluster each is one key on one
node: the provider record is read once per model call and written once per refusal; the worker
hash takes one ``HINCRBY`` batch per compaction (a few thousand a second would be the first hot
spot; split it per worker then).  Neither is memory: losing either in a failover loses counters or
a remembered refusal, never a conversation.
"""

from __future__ import annotations

import hashlib

from app.memory.schemas import THREAD_ID_RE

EVENTS_PATTERN = "mem:{*}:events"  # one Redis only: a cluster has no pattern subscription on shard channels
WORKER_METRICS_KEY = "obs:{metrics}:worker"
HEALTH_PROBE_KEY = "health:{probe}"


def thread_hex(thread_id: str) -> str:
    """The 64-hex part of a thread id ``chat:<hex>``.

    Raises:
        ValueError: ``thread_id`` is not ``chat:`` + 64 lowercase hex characters.
    """
    if not THREAD_ID_RE.match(thread_id):
        raise ValueError("not a thread id")
    return thread_id[5:]


class ThreadKeys:
    """The key names of one thread.  ``ThreadKeys("chat:<hex>").state`` is ``mem:{<hex>}``."""

    __slots__ = ("thread_id", "tag")

    def __init__(self, thread_id: str):
        self.thread_id = thread_id
        self.tag = "{" + thread_hex(thread_id) + "}"

    @property
    def state(self) -> str:
        """The ThreadState hash."""
        return f"mem:{self.tag}"

    @property
    def compacting(self) -> str:
        """The pending-compaction marker."""
        return f"mem:{self.tag}:compacting"

    @property
    def refining(self) -> str:
        """The pending-refinement marker (the model's part of a compaction)."""
        return f"mem:{self.tag}:refining"

    @property
    def active(self) -> str:
        """``streaming`` while a turn streams, then ``idle`` for ``COMPACTION_IDLE_SECONDS`` (never memory)."""
        return f"mem:{self.tag}:active"

    def markers(self) -> list[str]:
        """The thread's short-lived markers, deleted by a clear (never given the thread's TTL)."""
        return [self.compacting, self.refining, self.active]

    @property
    def events(self) -> str:
        """The pub/sub channel of compaction status frames."""
        return f"mem:{self.tag}:events"

    @property
    def stats(self) -> str:
        """Per-turn token accounting."""
        return f"mem:{self.tag}:stats"

    @property
    def compactions(self) -> str:
        """Compaction history."""
        return f"mem:{self.tag}:compactions"

    @property
    def feedback(self) -> str:
        """Feedback on assistant messages."""
        return f"mem:{self.tag}:feedback"

    @property
    def sockets(self) -> str:
        """The session's open websockets (a lease per socket; never memory)."""
        return f"ws:{self.tag}:sockets"

    @property
    def archive(self) -> str:
        """The archive of folded turns (a sorted set scored by turn number; docs/memory.md: Recall)."""
        return f"mem:{self.tag}:archive"

    @property
    def forgetting(self) -> str:
        """The forget job running now, if any (JSON ``{"turns", "startedAt"}``, a short TTL; turn numbers only;
        ``GET /api/chat/forget/status``)."""
        return f"mem:{self.tag}:forgetting"

    def run(self, run_id: str) -> str:
        """Runtime state of one tool/agent/workflow run (never memory)."""
        return f"run:{self.tag}:{run_id}"

    @property
    def paused_run(self) -> str:
        """The id of the task-list run waiting for the person's confirmation (runtime only)."""
        return f"run:{self.tag}:paused"

    def ttl_keys(self) -> list[str]:
        """Every key a write refreshes the TTL of (the state hash first, the archive last); a clear
        deletes all but the first."""
        return [self.state, self.stats, self.compactions, self.feedback, self.archive]


def provider_caps_key(base_url: str | None) -> str:
    """What a model provider (by base URL; None is the bundled default) was found not to support."""
    digest = hashlib.sha256((base_url or "default").rstrip("/").encode()).hexdigest()[:24]
    return f"caps:{digest}"


def thread_id_from_events_channel(channel: str) -> str | None:
    """Invert ``ThreadKeys.events``: ``mem:{hex}:events`` -> ``chat:hex`` (None if not such a channel)."""
    if channel.startswith("mem:{") and channel.endswith("}:events"):
        candidate = "chat:" + channel[5:-8]
        if THREAD_ID_RE.match(candidate):
            return candidate
    return None


# -- Clients and their quotas (docs/deployment.md: "Budgets") ------------------------------------------
# A client is its session and, for what a session cannot bound, its network address.  The address is
# never stored as such: ``client_tag`` is a hash of it.
#
# | key | type | holds |
# | --- | --- | --- |
# | ``ws:{cl:<tag>}:sockets`` | sorted set, PEXPIRE | one address's open websockets (``WS_MAX_PER_CLIENT``), as ``ws:{hex}:sockets`` |
# | ``quota:LIMITER/<who>/<n>/<m>/<unit>`` | string, EX | a fixed-window counter of the ``limits`` library for ``quota_identity(kind, who)`` |

QUOTA_KEY_PREFIX = "quota"  # the ``limits`` storage's key prefix (it appends ``:LIMITER/...``)


def client_tag(address: str) -> str:
    """A client's network address as it appears in key names: 24 hex of its SHA-256 (never the address)."""
    return hashlib.sha256(address.encode("utf-8", "replace")).hexdigest()[:24]


def client_sockets_key(address: str) -> str:
    """The open websockets of one network address (a lease per socket, as ``ThreadKeys.sockets``)."""
    return f"ws:{{cl:{client_tag(address)}}}:sockets"


def quota_identity(kind: str, who: str) -> str:
    """The identifier a rate limit of ``kind`` counts under for ``who`` (an address or a thread id), hashed:
    ``<kind>:<24 hex>``.  The ``limits`` storage makes it the key ``quota:LIMITER/<identifier>/...``."""
    return f"{kind}:{client_tag(who)}"
