"""gunicorn settings read from the working directory by every ``gunicorn wsgi:app`` (Procfile, Procfile.dev).

Prometheus multiprocess mode (docs/memory.md: Seeing what memory did): each worker process writes its metric
values to files in ``PROMETHEUS_MULTIPROC_DIR`` and ``/metrics`` served by any
worker adds up all of them.  When the variable is unset a fresh private
directory is made for this gunicorn master.  The directory's files are wiped
when the master starts (values of an earlier run are not this run's), and an
exited worker's live gauges (open websockets) are dropped by ``child_exit``.

The worker class is ``--worker-class`` (the Procfile: ``$WEB_WORKER_CLASS``, default ``gevent``;
docs/benchmarks.md: Performance).  For gevent the standard library is monkey-patched here, in the master, before
``--preload`` imports the app, so every lock, thread and socket the app makes is gevent's (gunicorn's
own gevent worker patches only after the fork, when the preloaded app already holds real ones).

Command-line flags still win over anything set here.
"""

import glob
import os
import sys
import tempfile


def _command_line_worker_class(argv: list[str]) -> str | None:
    """The ``-k`` / ``--worker-class`` value on gunicorn's command line, or None."""
    for i, arg in enumerate(argv):
        if arg in ("-k", "--worker-class") and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--worker-class="):
            return arg.split("=", 1)[1]
    return None


worker_class = _command_line_worker_class(sys.argv) or os.environ.get("WEB_WORKER_CLASS", "gevent")
if worker_class == "gevent":
    from gevent import monkey

    monkey.patch_all()

if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
    # set before any worker imports prometheus_client: the mode is chosen at its import
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="chat-prometheus-")
os.makedirs(os.environ["PROMETHEUS_MULTIPROC_DIR"], exist_ok=True)


def on_starting(server):
    """Master start: drop metric files left by an earlier run in the same directory."""
    for path in glob.glob(os.path.join(os.environ["PROMETHEUS_MULTIPROC_DIR"], "*.db")):
        try:
            os.remove(path)
        except OSError:
            pass


def child_exit(server, worker):
    """A worker exited: its live gauges stop counting (counters and histograms keep their totals)."""
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)


# Accept no more connections than WEB_THREADS per worker.  gthread: each open websocket holds a
# thread; without this a worker accepts sockets it cannot serve while another worker idles.
# gevent: each holds a greenlet; the same bound keeps the sockets spread over the workers.
# Websockets alone never take all of them: the app closes those beyond WS_MAX_PER_WORKER (fewer than
# WEB_THREADS) with 1013, and idle ones after WS_IDLE_TIMEOUT_SECONDS (docs/deployment.md).
worker_connections = int(os.environ.get("WEB_THREADS", "64"))
if worker_class == "gthread":
    # With no more connections than threads gthread can keep no idle HTTP connection open: say so here
    # (keep-alive off) instead of warning at every start.  Websockets are unaffected.
    keepalive = 0

# The access log names the path, never the query string: a query can carry what a person typed (the forget
# preview's ``?phrase=``), and logs never hold message text (docs/memory.md: Seeing what memory did).
access_log_format = '%(h)s %(l)s %(u)s %(t)s "%(m)s %(U)s %(H)s" %(s)s %(b)s "%(f)s" "%(a)s"'
