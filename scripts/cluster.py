"""A local Redis Cluster of 3 masters and 3 replicas from the ``redis-server`` binary, and the app on it.

``LocalCluster`` starts six ``redis-server --cluster-enabled yes`` processes on
loopback ports, joins them with ``redis-cli --cluster create ... --cluster-replicas 1``
and waits until every node reports ``cluster_state:ok``.  The tests (one cluster per
session), the benchmarks and this script's command line use it.  Nodes keep no data
on disk beyond their ``nodes.conf`` (``--appendonly no --save ''``); a node can be
killed and started again on the same port, when it rejoins as a replica.

Run the app against it (docs/scale-out.md)::

    .venv/bin/python scripts/cluster.py                 # cluster on 7000-7005, then `scripts/dev.py` on it
    .venv/bin/python scripts/cluster.py --nodes-only    # only the cluster; Ctrl+C stops it
    .venv/bin/python scripts/cluster.py --port 7100 --broker amqp://guest:guest@127.0.0.1:5672//

The app runs with ``REDIS_URL`` = the first node, ``REDIS_CLUSTER=1`` and
``CELERY_BROKER_URL`` = the machine's RabbitMQ (``--broker``).  Ctrl+C stops the
app, then the nodes.

Raises (``ClusterError``, one line): ``redis-server`` or ``redis-cli`` is not on the
PATH, a port is taken, or the cluster does not form in time.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"
DEFAULT_PORT = 7000
DEFAULT_BROKER = "amqp://guest:guest@127.0.0.1:5672//"


class ClusterError(RuntimeError):
    """The local cluster cannot be started or did not become ready; the message says what to do."""


def binaries() -> tuple[str, str]:
    """Paths of ``redis-server`` and ``redis-cli``.

    Raises:
        ClusterError: either is missing (Debian: ``apt-get install redis-server``).
    """
    server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if not server or not cli:
        raise ClusterError("redis-server and redis-cli are needed for a local Redis Cluster: "
                           "apt-get install redis-server (Redis 7 or newer)")
    return server, cli


def free_cluster_ports(count: int = 6, low: int = 20000, high: int = 30000) -> list[int]:
    """``count`` ports in ``[low, high)`` that are free together with their cluster-bus ports (+10000).

    Below the kernel's ephemeral range, so an outgoing connection does not take one meanwhile;
    a node's port must be at most 55535 (its bus port is 10000 higher).
    """
    import random

    chosen: list[int] = []
    candidates = list(range(low, high))
    random.shuffle(candidates)
    for port in candidates:
        if all(_bindable(p) for p in (port, port + 10000)):
            chosen.append(port)
            if len(chosen) == count:
                return chosen
    raise ClusterError(f"no {count} free ports between {low} and {high}")


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.3)
        return sock.connect_ex((HOST, port)) == 0


def _info(port: int, section: str, timeout: float = 1.0) -> dict[str, str]:
    """``INFO <section>`` (or ``CLUSTER INFO`` for ``"cluster-info"``) of one node, as a dict ({} when down)."""
    import redis

    client = redis.Redis(host=HOST, port=port, socket_timeout=timeout, socket_connect_timeout=timeout,
                         decode_responses=True)
    try:
        if section == "cluster-info":
            reply = client.execute_command("CLUSTER INFO")
            if isinstance(reply, dict):  # redis-py parses it into a dict
                return {k: str(v) for k, v in reply.items()}
            return dict(line.split(":", 1) for line in str(reply).splitlines() if ":" in line)
        return {k: str(v) for k, v in client.info(section).items()}
    except Exception:
        return {}
    finally:
        client.close()


@dataclass
class Node:
    """One ``redis-server`` of the cluster: its port, data folder and process (None when stopped)."""

    port: int
    folder: Path
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    @property
    def name(self) -> str:
        """``host:port``, as redis-py names cluster nodes."""
        return f"{HOST}:{self.port}"


def _process(node: Node) -> subprocess.Popen:
    """``node``'s running process.

    Raises:
        ClusterError: the node is not running (never started, or killed).
    """
    if node.proc is None:
        raise ClusterError(f"node {node.name} is not running")
    return node.proc


@dataclass
class LocalCluster:
    """Six loopback nodes (3 masters, 3 replicas).

    Args:
        ports: six free ports.
        node_timeout_ms: ``cluster-node-timeout``: how long a silent master goes unnoticed before
            its replica takes over (milliseconds; failover completes about 1-3 node timeouts later).
        folder: where the nodes keep ``nodes.conf`` and their logs (a temporary folder when None).
    """

    ports: list[int]
    node_timeout_ms: int = 2000
    folder: Path | None = None
    nodes: list[Node] = field(default_factory=list)
    _tmp: tempfile.TemporaryDirectory | None = None

    @property
    def url(self) -> str:
        """The seed URL (the first node), what ``REDIS_URL`` names with ``REDIS_CLUSTER=1``."""
        return self.nodes[0].url

    def node(self, port: int) -> Node:
        """The node listening on ``port``."""
        return next(n for n in self.nodes if n.port == port)

    # -- processes ---------------------------------------------------------------------------

    def _argv(self, node: Node) -> list[str]:
        server, _cli = binaries()
        return [server, "--bind", HOST, "--port", str(node.port), "--protected-mode", "yes",
                "--daemonize", "no", "--dir", str(node.folder),
                "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", str(self.node_timeout_ms),
                # Other shards keep serving while one has no master (docs/scale-out.md).
                "--cluster-require-full-coverage", "no",
                "--appendonly", "no", "--save", "", "--maxmemory-policy", "noeviction",
                "--logfile", str(node.folder / "redis.log")]

    def start_node(self, node: Node, timeout: float = 10.0) -> None:
        """Start (or restart, on its port and ``nodes.conf``) one node and wait until it answers."""
        node.folder.mkdir(parents=True, exist_ok=True)
        node.proc = subprocess.Popen(self._argv(node), stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        deadline = time.monotonic() + timeout
        while not _info(node.port, "server"):
            if node.proc.poll() is not None:
                raise ClusterError(f"redis-server on port {node.port} exited with {node.proc.returncode}: "
                                   f"{self.log_tail(node)}")
            if time.monotonic() > deadline:
                raise ClusterError(f"redis-server on port {node.port} did not answer in {timeout:.0f} s")
            time.sleep(0.05)

    def kill_node(self, node: Node, sig: int = signal.SIGKILL) -> None:
        """Stop one node at once (SIGKILL: what a crashed machine looks like to the others)."""
        if node.proc is not None and node.proc.poll() is None:
            node.proc.send_signal(sig)
            node.proc.wait(10)
        node.proc = None

    def pause_node(self, node: Node) -> None:
        """SIGSTOP: the node stops answering and replicating, keeping its sockets open.

        Raises:
            ClusterError: the node is not running (never started, or killed).
        """
        _process(node).send_signal(signal.SIGSTOP)

    def resume_node(self, node: Node) -> None:
        """SIGCONT after ``pause_node``.

        Raises:
            ClusterError: the node is not running (never started, or killed).
        """
        _process(node).send_signal(signal.SIGCONT)

    def log_tail(self, node: Node, chars: int = 800) -> str:
        try:
            return (node.folder / "redis.log").read_text()[-chars:]
        except OSError:
            return ""

    def start(self, timeout: float = 60.0) -> "LocalCluster":
        """Start the six nodes, create the cluster and wait until it is ready.

        Raises:
            ClusterError: a binary is missing, a port is taken, or the cluster did not form.
        """
        _server, cli = binaries()
        if len(self.ports) != 6:
            raise ClusterError("a local cluster has six nodes (3 masters, 3 replicas)")
        taken = [p for p in self.ports if _port_open(p)]
        if taken:
            raise ClusterError(f"ports {taken} are in use: stop what runs there or choose another --port")
        if self.folder is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="redis-cluster-")
            self.folder = Path(self._tmp.name)
        self.nodes = [Node(port, self.folder / str(port)) for port in self.ports]
        try:
            for node in self.nodes:
                self.start_node(node)
            create = subprocess.run(
                [cli, "--cluster", "create", *(n.name for n in self.nodes), "--cluster-replicas", "1",
                 "--cluster-yes"], capture_output=True, text=True, timeout=timeout)
            if create.returncode != 0:
                raise ClusterError(f"redis-cli --cluster create failed: {(create.stdout + create.stderr)[-800:]}")
            self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every node (by its pid) and remove the temporary folder."""
        for node in self.nodes:
            if node.proc is not None and node.proc.poll() is None:
                try:
                    os.kill(node.proc.pid, signal.SIGCONT)  # a paused node cannot handle SIGTERM
                except ProcessLookupError:
                    pass
                node.proc.terminate()
                try:
                    node.proc.wait(10)
                except subprocess.TimeoutExpired:
                    node.proc.kill()
                    node.proc.wait(5)
            node.proc = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    # -- topology ----------------------------------------------------------------------------

    def roles(self) -> dict[int, str]:
        """``{port: "master" | "slave"}`` of the running nodes."""
        out = {}
        for node in self.nodes:
            if node.proc is not None:
                role = _info(node.port, "replication").get("role")
                if role:
                    out[node.port] = role
        return out

    def masters(self) -> list[Node]:
        return [self.node(p) for p, role in self.roles().items() if role == "master"]

    def replica_of(self, master: Node) -> Node:
        """The running replica whose master is ``master``."""
        for node in self.nodes:
            if node.proc is None or node is master:
                continue
            info = _info(node.port, "replication")
            if info.get("role") == "slave" and int(info.get("master_port", 0)) == master.port:
                return node
        raise ClusterError(f"no replica of {master.name}")

    def owner_of(self, key: str, *, agreed: bool = False) -> Node:
        """The master that serves ``key``'s hash slot now, as the first running node answers.

        Args:
            agreed: ask every running node and raise ``ClusterError`` unless they all name the same
                master (after a failover the news takes a moment to reach every node).
        """
        import redis

        owners = set()
        for node in self.nodes:
            if node.proc is None:
                continue
            client = redis.Redis(host=HOST, port=node.port, socket_timeout=1, decode_responses=True)
            try:
                slot = int(client.execute_command("CLUSTER KEYSLOT", key))
                for start, end, master, *_replicas in client.execute_command("CLUSTER SLOTS"):
                    if start <= slot <= end:
                        owners.add(int(master[1]))
                        break
            except Exception:
                continue
            finally:
                client.close()
            if owners and not agreed:
                break
        if len(owners) != 1:
            raise ClusterError(f"the nodes do not agree on who serves {key}: {sorted(owners)}")
        return self.node(owners.pop())

    def wait_ready(self, timeout: float = 60.0, masters: int = 3, replicas: int = 3) -> None:
        """Wait until every running node says ``cluster_state:ok`` and the roles add up.

        Raises:
            ClusterError: not within ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        while True:
            running = [n for n in self.nodes if n.proc is not None]
            states = [_info(n.port, "cluster-info").get("cluster_state") for n in running]
            roles = list(self.roles().values())
            if (states and all(s == "ok" for s in states) and roles.count("master") == masters
                    and roles.count("slave") == replicas and self._replicas_in_sync(running)):
                return
            if time.monotonic() > deadline:
                raise ClusterError(f"the cluster is not ready after {timeout:.0f} s: states {states}, roles {roles}")
            time.sleep(0.1)

    @staticmethod
    def _replicas_in_sync(running: list[Node]) -> bool:
        for node in running:
            info = _info(node.port, "replication")
            if info.get("role") == "slave" and info.get("master_link_status") != "up":
                return False
        return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="A local 6-node Redis Cluster, and the app running on it.")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="first of six ports (default 7000)")
    parser.add_argument("--broker", default=os.environ.get("CELERY_BROKER_URL") or DEFAULT_BROKER,
                        help="CELERY_BROKER_URL for the app (default: the local RabbitMQ)")
    parser.add_argument("--nodes-only", action="store_true", help="start only the cluster")
    args = parser.parse_args(argv)
    folder = ROOT / ".local" / "cluster"
    cluster = LocalCluster(list(range(args.port, args.port + 6)), node_timeout_ms=5000, folder=folder)
    try:
        cluster.start()
    except ClusterError as exc:
        print(f"cluster: error: {exc}", file=sys.stderr)
        return 1
    print(f"cluster: 3 masters + 3 replicas on {HOST}:{args.port}-{args.port + 5}; "
          f"REDIS_URL={cluster.url} REDIS_CLUSTER=1 CELERY_BROKER_URL={args.broker}", flush=True)
    try:
        if args.nodes_only:
            signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
            while True:
                time.sleep(3600)
        env = {**os.environ, "REDIS_URL": cluster.url, "REDIS_TLS_URL": "", "REDIS_CLUSTER": "1",
               "CELERY_BROKER_URL": args.broker}
        return subprocess.call([sys.executable, str(ROOT / "scripts" / "dev.py")], env=env, cwd=ROOT)
    except KeyboardInterrupt:
        return 130
    finally:
        cluster.stop()
        shutil.rmtree(folder, ignore_errors=True)  # nodes.conf of this run only


if __name__ == "__main__":
    sys.exit(main())
