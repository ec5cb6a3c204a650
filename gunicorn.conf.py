"""gunicorn settings read from the working directory by every ``gunicorn wsgi:app`` (Procfile, Procfile.dev).

Prometheus multiprocess mode (issue 7): each worker process writes its metric
values to files in ``PROMETHEUS_MULTIPROC_DIR`` and ``/metrics`` served by any
worker adds up all of them.  When the variable is unset a fresh private
directory is made for this gunicorn master.  The directory's files are wiped
when the master starts (values of an earlier run are not this run's), and an
exited worker's live gauges (open websockets) are dropped by ``child_exit``.

Command-line flags still win over anything set here.
"""

import glob
import os
import tempfile

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


# gthread: accept no more connections than a worker has threads.  Each open websocket holds a
# thread; without this a worker accepts sockets it cannot serve while another worker idles.
worker_connections = int(os.environ.get("WEB_THREADS", "64"))
