"""Configuration validated when a process starts: one clear line and a non-zero exit, never a traceback.

``wsgi.py`` (the web), ``celery_app.py`` (the worker, Flower, any ``celery -A
celery_app`` command) call ``settings_or_exit``.  It reads ``Settings.from_env``
and then checks what that role needs:

- every role: the variables are well formed, ``SECRET_KEY`` is set in production,
  ``CELERY_BROKER_URL`` is set with ``REDIS_CLUSTER=1``;
- ``web`` in production, and every Celery role: the store answers PING within
  ``REDIS_SOCKET_TIMEOUT_SECONDS`` (2 s) and is a cluster node exactly when
  ``REDIS_CLUSTER=1``; a separate ``CELERY_BROKER_URL`` answers too (and is not a
  cluster node, which Celery's Redis transport cannot use);
- ``flower`` outside development: ``FLOWER_BASIC_AUTH`` is set (docs/contract.md: Configuration).

On a problem it prints exactly one line to stderr, for example::

    config error: REDIS_URL is unreachable (redis://:***@10.0.0.5:6379/0): set REDIS_URL to a reachable Redis

and exits with status 3.  Passwords in URLs are masked.  Status 3 is gunicorn's
"worker failed to boot" code, so a gunicorn master that loads the app in its
workers stops instead of respawning them forever.
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn

import redis

from app.settings import ConfigError, Settings, mask_url
from app.store.redis_client import celery_broker_url, ping

EXIT_CONFIG = 3

# Options of the ``celery`` command that take a value as the next argument (``-A app``).
_CELERY_VALUE_OPTIONS = {"-A", "--app", "-b", "--broker", "--result-backend", "--loader", "--config",
                         "--workdir"}


def fail(message: str) -> NoReturn:
    """Print ``config error: <message>`` as one line on stderr and exit with status 3."""
    line = " ".join(str(message).split())  # one line whatever the message holds
    print(f"config error: {line}", file=sys.stderr, flush=True)
    raise SystemExit(EXIT_CONFIG)


def store_problem(settings: Settings, environ: dict | None = None) -> str | None:
    """None when the store answers PING; otherwise the one-line problem, naming the variable to set."""
    env = os.environ if environ is None else environ
    name = "REDIS_TLS_URL" if (env.get("REDIS_TLS_URL") or "").strip() else "REDIS_URL"
    shown = mask_url(settings.redis_url)
    try:
        cluster_enabled = str(ping(settings.redis_url, timeout=settings.redis_socket_timeout)
                              .get("cluster_enabled", 0)) == "1"
    except redis.AuthenticationError:
        return f"{name} was refused by the store ({shown}): set {name} with the right password"
    except redis.ResponseError as exc:
        # An answer, but an error one (e.g. NOAUTH: a password is required; a wrong database number).
        kind = str(exc).split(" ", 1)[0] if str(exc) else "error"
        return f"{name} answered PING with an error ({kind}) ({shown}): set {name} to a usable Redis"
    except (redis.RedisError, OSError, ValueError):
        return f"{name} is unreachable ({shown}): set {name} to a reachable Redis"
    if settings.redis_cluster and not cluster_enabled:
        return (f"{name} names a Redis that is not in cluster mode ({shown}): set {name} to a node of a Redis "
                "Cluster, or unset REDIS_CLUSTER")
    if cluster_enabled and not settings.redis_cluster:
        return (f"{name} names a node of a Redis Cluster ({shown}): set REDIS_CLUSTER=1 and CELERY_BROKER_URL, "
                f"or set {name} to a plain Redis")
    return None


def broker_problem(settings: Settings) -> str | None:
    """None when ``CELERY_BROKER_URL`` is unset (the store is the broker) or answers; else the one-line problem."""
    url = settings.celery_broker_url
    if not url or (url == settings.redis_url and not settings.redis_cluster):  # the store's check covers it
        return None
    shown = mask_url(url)
    if url.startswith(("amqp://", "amqps://")):
        import amqp.exceptions
        import kombu

        connection = kombu.Connection(celery_broker_url(url), connect_timeout=settings.redis_socket_timeout)
        try:
            connection.connect()
        except amqp.exceptions.AccessRefused:
            return (f"CELERY_BROKER_URL was refused by the broker ({shown}): set CELERY_BROKER_URL with the right "
                    "user and password")
        except amqp.exceptions.NotAllowed:
            return (f"CELERY_BROKER_URL names a virtual host the broker does not allow ({shown}): create it or "
                    "set CELERY_BROKER_URL to an existing one")
        except Exception:  # refused, unresolvable, timed out, TLS
            return f"CELERY_BROKER_URL is unreachable ({shown}): set CELERY_BROKER_URL to a reachable broker"
        finally:
            connection.release()
        return None
    try:
        cluster_enabled = str(ping(url, timeout=settings.redis_socket_timeout).get("cluster_enabled", 0)) == "1"
    except redis.AuthenticationError:
        return f"CELERY_BROKER_URL was refused by the broker ({shown}): set CELERY_BROKER_URL with the right password"
    except (redis.RedisError, OSError, ValueError):
        return f"CELERY_BROKER_URL is unreachable ({shown}): set CELERY_BROKER_URL to a reachable broker"
    if cluster_enabled:
        return (f"CELERY_BROKER_URL names a node of a Redis Cluster ({shown}): Celery's Redis transport cannot use "
                "a cluster; set CELERY_BROKER_URL to amqp://... (RabbitMQ) or to a plain Redis")
    return None


def celery_command(argv: list[str]) -> str | None:
    """The subcommand of a ``celery`` command line (``worker``, ``flower``, ``inspect`` ...), or None."""
    args = iter(argv[1:])
    for arg in args:
        if arg in _CELERY_VALUE_OPTIONS:
            next(args, None)
        elif not arg.startswith("-"):
            return arg
    return None


def _flower_auth_in_argv(argv: list[str]) -> bool:
    for i, arg in enumerate(argv):
        for name in ("--basic-auth", "--basic_auth"):
            if arg.startswith(name + "=") and arg.split("=", 1)[1].strip():
                return True
            if arg == name and i + 1 < len(argv) and argv[i + 1].strip() and not argv[i + 1].startswith("-"):
                return True
    return False


def settings_or_exit(role: str, *, environ: dict | None = None, argv: list[str] | None = None) -> Settings:
    """The validated settings for ``role`` (``web``, ``worker`` or ``flower``), or one line and exit 3.

    Args:
        role: ``web`` pings the store only in production; ``worker`` and ``flower`` always do.
        environ: mapping to read instead of ``os.environ``.
        argv: the command line (Flower's ``--basic-auth`` counts as set); ``sys.argv`` when None.
    """
    try:
        settings = Settings.from_env(environ)
    except ConfigError as exc:
        fail(str(exc))
    argv = sys.argv if argv is None else argv
    if role == "flower" and settings.env != "development" and not settings.flower_basic_auth \
            and not _flower_auth_in_argv(argv):
        fail("FLOWER_BASIC_AUTH is not set: set FLOWER_BASIC_AUTH=user:password "
             "(Flower refuses to start without it outside development)")
    if role != "web" or settings.production:
        problem = store_problem(settings, environ) or broker_problem(settings)
        if problem:
            fail(problem)
    return settings


def main() -> int:
    """``python -m app.startup``: check the configuration a deployment needs (the Procfile's release phase).

    Validates the variables and PINGs the store as the worker would; prints ``config ok: ...``
    (URL password masked) and exits 0, or one ``config error: ...`` line and exits 3.
    """
    settings = settings_or_exit("worker")
    provider = settings.openai_base_url or "OpenAI"
    store = mask_url(settings.redis_url) + (" (Redis Cluster)" if settings.redis_cluster else "")
    broker = f", broker {mask_url(settings.celery_broker_url)}" if settings.celery_broker_url else ""
    print(f"config ok: APP_ENV={settings.env}, store {store}{broker}, "
          f"model provider {mask_url(provider)}, chat model {settings.chat_model}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
