"""Every Redis client of the project, built here: one blocking pool per process, or a Redis Cluster client.

Heroku Redis serves ``rediss://`` with a self-signed certificate, so TLS URLs are
opened with ``ssl_cert_reqs=none``.  The pool blocks (up to ``pool_timeout``
seconds) instead of failing when every connection is busy; size it to the web
threads.  Commands time out after ``socket_timeout`` seconds so a stalled store
degrades a request instead of hanging it.

With ``REDIS_CLUSTER=1`` (``make_redis(url, cluster=True)``) the URL names one seed
node and the client is a ``ClusterClient``: a ``redis.cluster.RedisCluster`` built on
first use, whose every failure is a ``redis.RedisError`` (docs/scale-out.md).  Every
multi-key command and Lua script of the project touches one thread's keys, which
share the hash tag ``{<thread hex>}`` and so one slot (``app.store.keys``).
"""

from __future__ import annotations

import functools
import threading
from typing import TYPE_CHECKING, Any, Callable, TypeAlias, cast

import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterPipeline, RedisCluster
from redis.commands.core import Script
from redis.exceptions import MovedError, RedisClusterException
from redis.retry import Retry

if TYPE_CHECKING:
    from redis.connection import Encoder
    from typing_extensions import TypeIs

# Attempts of a cluster command after the first, each after refreshing the slot map: enough to follow
# a failover that has completed, few enough that a slot without a master fails fast (the turn degrades).
CLUSTER_RETRIES = 3

StoreClient: TypeAlias = "redis.Redis | ClusterClient"
"""What ``make_redis`` returns: one node's client, or (``REDIS_CLUSTER=1``) a ``ClusterClient``."""


class ClusterUnavailable(redis.ConnectionError):
    """The cluster could not be reached or serves no node for a slot (its text is for logs only)."""


def make_redis(url: str, *, cluster: bool = False, max_connections: int = 64, socket_timeout: float = 2.0,
               pool_timeout: float = 5.0) -> StoreClient:
    """Return a client (str responses) for ``url``.

    Args:
        url: ``redis://``, ``rediss://`` or ``unix://`` URL; with ``cluster`` one seed node of a cluster.
        cluster: build a ``ClusterClient`` (``REDIS_CLUSTER=1``).
        max_connections: pool size (connections; per node in a cluster).
        socket_timeout: per-command and connect timeout, seconds.
        pool_timeout: how long a thread waits for a free connection, seconds (single node only: a
            cluster node's pool is sized so that it never runs out).
    """
    if cluster:
        return ClusterClient(url, max_connections=max_connections, socket_timeout=socket_timeout)
    kwargs = {}
    if url.startswith("rediss://"):
        kwargs["ssl_cert_reqs"] = "none"
    pool = redis.BlockingConnectionPool.from_url(
        url,
        max_connections=max_connections,
        timeout=pool_timeout,
        decode_responses=True,
        socket_timeout=socket_timeout,
        socket_connect_timeout=socket_timeout,
        health_check_interval=30,
        # One retry on a dropped connection (a restarted Redis); never on a timeout, which redis-py
        # would otherwise retry at both the handshake and the command: 4 x socket_timeout per call.
        retry=Retry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,)),
        **kwargs,
    )
    return redis.Redis(connection_pool=pool)


def _translated(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Call ``fn``; a ``RedisClusterException`` (not a ``RedisError``) becomes ``ClusterUnavailable``."""
    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            result = fn(*args, **kwargs)
        except RedisClusterException as exc:
            raise ClusterUnavailable(f"{type(exc).__name__}: {exc}") from exc
        return _PipelineProxy(result) if isinstance(result, ClusterPipeline) else result
    return call


class _PipelineProxy:
    """A ``ClusterPipeline`` whose errors are ``redis.RedisError``s; chained calls return the proxy."""

    def __init__(self, pipeline: ClusterPipeline):
        self._pipeline = pipeline

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._pipeline, name)
        if not callable(attr):
            return attr
        call = _translated(attr)

        def chained(*args: Any, **kwargs: Any) -> Any:
            result = call(*args, **kwargs)
            return self if result is self._pipeline else result
        return chained

    def __enter__(self) -> _PipelineProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self._pipeline.reset()


class ClusterClient:
    """A Redis Cluster client for ``REDIS_CLUSTER=1``, connected on first use.

    ``redis.cluster.RedisCluster`` connects to the cluster when it is built and raises
    ``RedisClusterException`` (which is not a ``redis.RedisError``) when no node answers
    or a slot has no node.  This wrapper builds it on the first command (so a process
    can start while the cluster is down, and degrade), and raises ``ClusterUnavailable``
    (a ``redis.ConnectionError``) instead; any other attribute is the cluster client's.

    Retries: a failed command refreshes the slot map and is tried again up to
    ``CLUSTER_RETRIES`` times, at once.  While a master's slots have no master (until its
    replica takes over, about two ``cluster-node-timeout``s), commands on those slots fail
    fast with ``redis.ConnectionError``; after the failover the next command finds the new
    master by itself.

    Args:
        url: one seed node (``redis://`` or ``rediss://``, database 0).
        max_connections: connections per node.
        socket_timeout: per-command and connect timeout, seconds.
    """

    def __init__(self, url: str, *, max_connections: int = 64, socket_timeout: float = 2.0):
        self.url = url
        self._kwargs = dict(
            max_connections=max_connections, decode_responses=True, socket_timeout=socket_timeout,
            socket_connect_timeout=socket_timeout, health_check_interval=30,
            retry=Retry(NoBackoff(), CLUSTER_RETRIES),
            # A slot without a master fails only the commands on that slot (docs/scale-out.md).
            require_full_coverage=False,
        )
        if url.startswith("rediss://"):
            self._kwargs["ssl_cert_reqs"] = "none"
        self._client: RedisCluster | None = None
        self._cached: set[str] = set()
        self._lock = threading.Lock()
        self._encoder = redis.Redis().get_encoder()  # utf-8, as every client here (no connection made)

    def cluster(self) -> RedisCluster:
        """The connected ``RedisCluster`` (built now if needed).

        Raises:
            ClusterUnavailable: no seed node answered.
        """
        client = self._client
        if client is not None:
            return client
        with self._lock:
            if self._client is None:
                try:
                    self._client = RedisCluster.from_url(self.url, **self._kwargs)
                except (RedisClusterException, redis.RedisError) as exc:
                    raise ClusterUnavailable(f"{type(exc).__name__}: {exc}") from exc
            return self._client

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        attr = getattr(self.cluster(), name)
        if not callable(attr):
            return attr
        method = _translated(attr)
        self.__dict__[name] = method  # found directly from now on, until close()
        self._cached.add(name)
        return method

    def get_encoder(self) -> Encoder:
        """The encoder scripts hash their text with (no connection made)."""
        return self._encoder

    def register_script(self, script: str) -> Script:
        """A Lua script bound to this client; loaded on the nodes on first call (no connection made here)."""
        # redis-py hints its own two client classes; Script calls only get_encoder, evalsha and script_load.
        return Script(self, script)  # type: ignore[arg-type]

    def node_for(self, key: str) -> redis.Redis:
        """A plain client of the master that serves ``key``'s slot, by the slot map as last read.

        Raises:
            ClusterUnavailable: the cluster is unreachable or no node serves the slot.
        """
        cluster = self.cluster()
        try:
            return cluster.get_redis_connection(cluster.get_node_from_key(key))
        except RedisClusterException as exc:
            raise ClusterUnavailable(f"{type(exc).__name__}: {exc}") from exc

    def node_name_for(self, key: str) -> str:
        """``host:port`` of the master that serves ``key``'s slot (slot map as last read)."""
        cluster = self.cluster()
        try:
            return cluster.get_node_from_key(key).name
        except RedisClusterException as exc:
            raise ClusterUnavailable(f"{type(exc).__name__}: {exc}") from exc

    def refresh_slots(self) -> None:
        """Read the slot map again from any node that answers.

        Raises:
            ClusterUnavailable: no node answered.
        """
        try:
            self.cluster().nodes_manager.initialize()
        except (RedisClusterException, redis.RedisError) as exc:
            raise ClusterUnavailable(f"{type(exc).__name__}: {exc}") from exc

    def close(self) -> None:
        """Close every node's connections (a later command connects again)."""
        with self._lock:
            client, self._client = self._client, None
            for name in self._cached:
                self.__dict__.pop(name, None)
            self._cached.clear()
        if client is not None:
            client.close()


def without_retries(client: StoreClient) -> StoreClient:
    """A client on a pool of its own that never retries a command (memory-changing scripts: a command
    whose reply is lost may have run; the store settles it by reading back, never by sending it again).

    A ``redis.Redis`` gets a pool with the same connection settings and ``Retry(NoBackoff(), 0)``; any other
    client (a ``ClusterClient``, whose retries follow a moved slot) is returned as it is.
    """
    if not isinstance(client, redis.Redis):  # checked first: reading attributes of a ClusterClient connects it
        return client
    pool = getattr(client, "connection_pool", None)
    if pool is None or not hasattr(pool, "connection_kwargs"):
        return client
    kwargs = {**pool.connection_kwargs, "retry": Retry(NoBackoff(), 0)}
    kwargs.pop("retry_on_error", None)
    kwargs.pop("retry_on_timeout", None)
    extra = {"timeout": pool.timeout} if isinstance(pool, redis.BlockingConnectionPool) else {}
    clone = type(pool)(connection_class=pool.connection_class, max_connections=pool.max_connections, **extra,
                       **kwargs)
    return redis.Redis(connection_pool=clone)


def is_cluster(client: StoreClient) -> TypeIs[ClusterClient]:
    """True for a ``ClusterClient`` (``REDIS_CLUSTER=1``)."""
    return isinstance(client, ClusterClient)


def run_script_and_wait(client: StoreClient, script: Script, keys: list[str], args: list, *, replicas: int,
                        timeout_ms: int) -> tuple[Any, int]:
    """Run ``script`` and then ``WAIT replicas timeout_ms`` on the same connection.

    ``WAIT`` counts the replicas that acknowledged the writes of *its own connection*, so
    both commands go in one pipeline to the node serving ``keys[0]`` (the master of the
    thread's slot in a cluster).  One round trip; the answer comes when ``replicas``
    replicas have the write, or after ``timeout_ms`` milliseconds (which must be shorter than
    the client's socket timeout; ``Settings`` checks it).  The script goes as ``EVAL`` with its
    text: a master new after a failover has no script loaded, and a refused ``EVALSHA`` would
    still wait the whole timeout.

    Returns:
        ``(the script's answer, how many replicas acknowledged)``.

    Raises:
        redis.RedisError: the node failed or answered with an error (a moved slot is followed
            once; a connection error refreshes the slot map and is raised: the write may or may
            not have happened, as for any lost answer).
    """
    for attempt in range(2):
        node = client.node_for(keys[0]) if is_cluster(client) else client
        pipe = node.pipeline(transaction=False)
        pipe.eval(cast(str, script.script), len(keys), *keys, *args)  # registered from text (``lua_script``)
        pipe.wait(replicas, timeout_ms)
        try:
            answer, acknowledged = pipe.execute()
            return answer, int(acknowledged)
        except MovedError:  # the slot moved (a failover or a resharding): nothing was run
            if not is_cluster(client) or attempt == 1:
                raise
            client.refresh_slots()
        except (redis.ConnectionError, redis.TimeoutError):
            if is_cluster(client):
                try:
                    client.refresh_slots()
                except ClusterUnavailable:
                    pass
            raise
    raise AssertionError("not reached")


def celery_broker_url(url: str) -> str:
    """Celery wants the TLS setting in a ``rediss://`` URL: add ``ssl_cert_reqs=CERT_NONE`` when absent.

    ``amqp://`` and ``amqps://`` URLs are returned unchanged.
    """
    if url.startswith("rediss://") and "ssl_cert_reqs" not in url:
        return url + ("&" if "?" in url else "?") + "ssl_cert_reqs=CERT_NONE"
    return url


def ping(url: str, *, timeout: float = 2.0) -> dict:
    """PING the Redis at ``url`` once, on a connection of its own that is closed afterwards; return its
    ``INFO cluster`` section (``{"cluster_enabled": 0 | 1}``).

    Used at process start (``app.startup``): a fresh client, so no socket is left
    in a pool that a forking server (gunicorn ``--preload``, Celery prefork) would share.

    Args:
        url: ``redis://`` or ``rediss://`` URL (self-signed certificates accepted).
        timeout: connect and reply timeout, seconds.

    Raises:
        redis.AuthenticationError: the server refused the password.
        redis.RedisError: the server is unreachable, slow, or answered with an error.
    """
    kwargs = {"ssl_cert_reqs": "none"} if url.startswith("rediss://") else {}
    client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout,
                                  retry=Retry(NoBackoff(), 0), **kwargs)
    try:
        client.ping()
        try:
            return dict(client.info("cluster"))
        except redis.ResponseError:  # INFO refused (ACL): assume a plain Redis
            return {}
    finally:
        client.close()
