"""The Redis connection: one blocking pool per process, TLS that accepts self-signed certificates.

Heroku Redis serves ``rediss://`` with a self-signed certificate, so TLS URLs are
opened with ``ssl_cert_reqs=none``.  The pool blocks (up to ``pool_timeout``
seconds) instead of failing when every connection is busy; size it to the web
threads.  Commands time out after ``socket_timeout`` seconds so a stalled store
degrades a request instead of hanging it.
"""

from __future__ import annotations

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry


def make_redis(url: str, *, max_connections: int = 64, socket_timeout: float = 2.0,
               pool_timeout: float = 5.0) -> redis.Redis:
    """Return a ``redis.Redis`` (str responses) for ``url``.

    Args:
        url: ``redis://``, ``rediss://`` or ``unix://`` URL.
        max_connections: pool size (connections).
        socket_timeout: per-command and connect timeout, seconds.
        pool_timeout: how long a thread waits for a free connection, seconds.
    """
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


def celery_broker_url(url: str) -> str:
    """Celery wants the TLS setting in a ``rediss://`` URL: add ``ssl_cert_reqs=CERT_NONE`` when absent."""
    if url.startswith("rediss://") and "ssl_cert_reqs" not in url:
        return url + ("&" if "?" in url else "?") + "ssl_cert_reqs=CERT_NONE"
    return url


def ping(url: str, *, timeout: float = 2.0) -> None:
    """PING the Redis at ``url`` once, on a connection of its own that is closed afterwards.

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
    finally:
        client.close()
