"""Classic against sharded pub/sub for compaction events on a Redis Cluster (docs/scale-out.md).

The question: how should web processes hear of compaction events when the store is a cluster of
3 masters and 3 replicas?  The figures for 10,000 open sockets spread over 20 web processes:

- classic: each web process holds one ``PSUBSCRIBE mem:{*}:events`` on one node; a worker
  ``PUBLISH``es each event, which the cluster bus copies to every node, and every web process
  receives every event (and drops those of threads it does not show);
- sharded: each web process ``SSUBSCRIBE``s the channel of each thread it shows, on the master
  that serves the thread's slot (one connection per master); a worker ``SPUBLISH``es each event to
  that master, which copies it to its own replica only, and only the web process showing the thread
  receives it.

Both run here against the same local cluster (started for the run from ``redis-server``), with 20
simulated web processes (connections) holding 10,000 thread subscriptions between them, and one
publisher sending ``--events`` events at ``--rate`` per second to random threads.  Printed per
variant: the cluster's CPU time per event (all six nodes, from ``INFO cpu``, less what the nodes spend
idle over the same time), cluster-bus messages
per event (``CLUSTER INFO``), deliveries per event and per web process, delivery latency p50/p99,
and the time to subscribe all 10,000 threads.  Sharded is reported against classic in the same run.

Usage::

    python -m bench.cluster_events [--events 5000] [--rate 500] [--processes 20] [--sockets 10000]

Units: microseconds (µs) of server CPU, milliseconds (ms) of latency, counts per event.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import threading
import time

import redis

from app.store.keys import EVENTS_PATTERN, ThreadKeys
from app.store.redis_client import make_redis
from chat_support.threads import thread_id_for
from scripts.cluster import ClusterError, LocalCluster, free_cluster_ports


def cluster_stats(cluster: LocalCluster) -> dict:
    """CPU seconds and bus messages summed over the running nodes."""
    cpu = bus = 0.0
    for node in cluster.nodes:
        client = redis.Redis(host="127.0.0.1", port=node.port, decode_responses=True)
        info = client.info("cpu")
        cpu += float(info["used_cpu_sys"]) + float(info["used_cpu_user"])
        raw = client.execute_command("CLUSTER INFO")
        fields = raw if isinstance(raw, dict) else dict(line.split(":", 1) for line in raw.splitlines() if ":" in line)
        bus += float(fields.get("cluster_stats_messages_sent", 0))
        client.close()
    return {"cpu": cpu, "bus": bus}


class Subscriber:
    """One simulated web process: its connections and what they received."""

    def __init__(self):
        self.pubsubs: list = []
        self.latencies: list[float] = []
        self.received = 0
        self.threads: list[threading.Thread] = []
        self.stop = threading.Event()

    def listen(self, pubsub) -> None:
        self.pubsubs.append(pubsub)
        thread = threading.Thread(target=self._read, args=(pubsub,), daemon=True)
        self.threads.append(thread)
        thread.start()

    def _read(self, pubsub) -> None:
        while not self.stop.is_set():
            try:
                message = pubsub.get_message(timeout=0.5)
            except Exception:
                return
            if message and message["type"] in ("pmessage", "smessage"):
                self.received += 1
                sent = json.loads(message["data"])["sentAt"]
                self.latencies.append((time.time() - sent) * 1000)

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(2)
        for pubsub in self.pubsubs:
            pubsub.close()


def run_variant(kind: str, cluster: LocalCluster, client, threads: list[str], processes: int, events: int,
                rate: float) -> dict:
    owner = {t: i % processes for i, t in enumerate(threads)}  # which web process shows which thread
    subscribers = [Subscriber() for _ in range(processes)]
    nodes = cluster.nodes
    started = time.perf_counter()
    if kind == "classic":
        for i, sub in enumerate(subscribers):
            node = nodes[i % len(nodes)]  # spread over every node, as each process would pick one
            pubsub = redis.Redis(host="127.0.0.1", port=node.port, decode_responses=True).pubsub()
            pubsub.psubscribe(EVENTS_PATTERN)
            sub.listen(pubsub)
    else:
        for i, sub in enumerate(subscribers):
            per_node: dict[str, list[str]] = {}
            for t in threads:
                if owner[t] == i:
                    channel = ThreadKeys(t).events
                    per_node.setdefault(client.node_name_for(channel), []).append(channel)
            for channels in per_node.values():
                pubsub = client.node_for(channels[0]).pubsub()
                for start in range(0, len(channels), 1):  # one SSUBSCRIBE per channel: what a socket open does
                    pubsub.ssubscribe(channels[start])
                sub.listen(pubsub)
    subscribe_seconds = time.perf_counter() - started
    time.sleep(1.0)  # every confirmation read
    idle_start, idle_t = cluster_stats(cluster), time.perf_counter()  # the nodes' own cron work, to subtract
    time.sleep(min(5.0, events / rate))
    idle_rate = (cluster_stats(cluster)["cpu"] - idle_start["cpu"]) / (time.perf_counter() - idle_t)
    before, publish_t = cluster_stats(cluster), time.perf_counter()
    interval = 1.0 / rate
    next_at = time.perf_counter()
    for _ in range(events):
        thread = random.choice(threads)
        data = json.dumps({"type": "memory", "status": "succeeded", "message": "Older turns were summarized.",
                           "sentAt": time.time()})
        channel = ThreadKeys(thread).events
        if kind == "classic":
            client.execute_command("PUBLISH", channel, data, target_nodes=client.cluster().get_node_from_key(channel))
        else:
            client.spublish(channel, data)
        next_at += interval
        delay = next_at - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
    deadline = time.monotonic() + 10
    expected = events * (processes if kind == "classic" else 1)
    while sum(s.received for s in subscribers) < expected and time.monotonic() < deadline:
        time.sleep(0.05)
    after = cluster_stats(cluster)
    busy = after["cpu"] - before["cpu"] - idle_rate * (time.perf_counter() - publish_t)
    latencies = [x for s in subscribers for x in s.latencies]
    received = sum(s.received for s in subscribers)
    for sub in subscribers:
        sub.close()
    return {
        "kind": kind, "events": events, "subscribe_s": subscribe_seconds,
        "cpu_us_per_event": busy / events * 1e6,
        "bus_per_event": (after["bus"] - before["bus"]) / events,
        "deliveries_per_event": received / events,
        "per_process_per_event": received / events / processes,
        "lost": expected - received,
        "latency_p50": statistics.median(latencies) if latencies else float("nan"),
        "latency_p99": sorted(latencies)[int(0.99 * (len(latencies) - 1))] if latencies else float("nan"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=5000)
    parser.add_argument("--rate", type=float, default=500.0, help="events per second")
    parser.add_argument("--processes", type=int, default=20, help="web processes")
    parser.add_argument("--sockets", type=int, default=10000, help="open sockets (one thread each)")
    args = parser.parse_args(argv)
    try:
        cluster = LocalCluster(free_cluster_ports()).start()
    except ClusterError as exc:
        print(f"cluster_events: {exc}", file=sys.stderr)
        return 2
    client = make_redis(cluster.url, cluster=True, max_connections=64)
    try:
        threads = [thread_id_for(f"socket {i}") for i in range(args.sockets)]
        load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
        print(f"cluster_events: {args.sockets} sockets over {args.processes} web processes, {args.events} events at "
              f"{args.rate:.0f}/s, 3 masters + 3 replicas, {os.cpu_count()} CPUs (load average {load})")
        results = {kind: run_variant(kind, cluster, client, threads, args.processes, args.events, args.rate)
                   for kind in ("classic", "sharded")}
        for r in results.values():
            print(f"== {r['kind']}: server CPU {r['cpu_us_per_event']:.1f} µs/event, cluster bus "
                  f"{r['bus_per_event']:.2f} messages/event, deliveries {r['deliveries_per_event']:.2f}/event "
                  f"({r['per_process_per_event']:.3f} per web process), lost {r['lost']}, latency p50 "
                  f"{r['latency_p50']:.2f} ms p99 {r['latency_p99']:.2f} ms, subscribing took {r['subscribe_s']:.2f} s")
        c, s = results["classic"], results["sharded"]
        print(f"sharded / classic: server CPU {s['cpu_us_per_event'] / c['cpu_us_per_event']:.2f}x, bus messages "
              f"{s['bus_per_event'] / max(c['bus_per_event'], 1e-9):.2f}x, deliveries "
              f"{s['deliveries_per_event'] / c['deliveries_per_event']:.3f}x")
        return 0
    finally:
        client.close()
        cluster.stop()


if __name__ == "__main__":
    sys.exit(main())
