"""CPU per message on crafted input vs a plain English message of the same length (docs/benchmarks.md: Performance).

For each adversarial message (the issue's list: a long letter-digit run, one 12,000-character word, ``"好。"``
repeated, 50,000 emoji, deeply mixed scripts, plus a few regex traps), the CPU time (``time.process_time``,
best of ``--repeat``) of each step a message goes through, divided by the same step's time on a plain English
message of the same length measured in the same run:

* ``prepare``: the web turn's CPU (``assemble_context`` with recall over an archive of ``--archive-turns``
  folded turns: the tokeniser, the token counts, BM25, the excerpts);
* ``tokenize``: recall's tokeniser alone; ``count``: the token count (tiktoken), uncached;
* ``sentences``: pysbd's sentence split (the worker's compaction); ``facts``: the fact guard (worker);
* ``record``: a whole turn's record lines (``statement_lines``: sentences, forms and facts; worker).

A ratio near 1 means the crafted message costs what any message of its length costs; every step is linear
in its input (a quadratic step shows ratios that double with ``--chars``).  Try ``--chars 24000`` to see
the ratios hold.

The last lines measure what a crafted message does to another socket of the same gevent process: a
greenlet that ticks every 2 ms records its longest gap while the crafted message's ``prepare`` runs on the
event loop (as before) and then off it (``app.chat.turn.off_the_event_loop``, gevent's thread pool).

Usage::

    python -m bench.cpu_input                     # 12,000 characters (MAX_INPUT_CHARS)
    python -m bench.cpu_input --chars 24000 --repeat 3
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from app.memory.compaction.facts import _read_facts
from app.memory.compaction.record import sentences, statement_lines
from app.memory.context import assemble_context
from app.memory.recall import ArchivedTurn, ArchiveIndex, tokenize
from app.memory.state import ThreadMessage, ThreadState
from app.memory.tokens import TokenCounter

ROOT = Path(__file__).resolve().parent.parent

ENGLISH = ("We moved the Lisbon release to Tuesday after the review, and Maria will send the notes to the "
           "team before noon so everyone can read them. ")


def repeat(unit: str, n: int) -> str:
    return (unit * (n // len(unit) + 1))[:n]


def inputs(n: int) -> dict[str, str]:
    rng = random.Random(7)
    scripts = ["a", "я", "好", "1", " ", "ع", "😀", "-", ".", "ß", "\u0301", "अ", "ا", "\u200d", "한"]
    return {
        "plain English": repeat(ENGLISH, n),
        "abc12 run": repeat("abc12", n),
        "one word": repeat("abcdefghij", n),
        "好。 repeated": repeat("好。", n),
        "50,000 emoji": "😀" * 50_000,
        "mixed scripts": "".join(rng.choice(scripts) for _ in range(n)),
        "a- chain": repeat("a-", n),
        "12: chain": repeat("12:", n),
        "numbers": " ".join(str(i) for i in range(10, 10 ** 6))[:n],
        "Chinese numerals": repeat("一二三四五", n),
    }


def _message(i: int, role: str, text: str) -> ThreadMessage:
    return ThreadMessage(f"{role[0]}{i}", role, text, "2025-01-01T00:00:00Z")


def archive(turns: int) -> ArchiveIndex:
    rng = random.Random(3)
    words = ENGLISH.replace(",", "").replace(".", "").split() + [f"topic{i}" for i in range(500)]
    index = ArchiveIndex()
    index.add(ArchivedTurn(i, (_message(i, "user", " ".join(rng.choice(words) for _ in range(40))),
                               _message(i, "assistant", " ".join(rng.choice(words) for _ in range(80)))))
              for i in range(1, turns + 1))
    return index


def best(fn, text: str, repeat_: int) -> float:
    times = []
    for _ in range(repeat_):
        start = time.process_time()
        fn(text)
        times.append(time.process_time() - start)
    return min(times)


def steps(index: ArchiveIndex) -> dict:
    def prepare(text: str) -> None:
        assemble_context(ThreadState(), text, system_prompt="You are helpful.", counter=TokenCounter(cache_bytes=0),
                         context_tokens=1_000_000, reserved_output_tokens=1024, archive=index, recall_share=0.15)

    counter = TokenCounter(cache_bytes=0)
    return {
        "prepare": prepare,
        "tokenize": tokenize,
        "count": counter.count,
        "sentences": sentences,
        "facts": _read_facts,
        "record": lambda text: statement_lines([_message(1, "user", text), _message(1, "assistant", "Noted.")],
                                               number=1),
    }


STALL_SCRIPT = textwrap.dedent("""
    from gevent import monkey
    monkey.patch_all()
    import sys, time
    import gevent
    from bench.cpu_input import archive, inputs, steps
    from app.chat.turn import off_the_event_loop

    prepare = steps(archive({turns}))["prepare"]
    text = inputs({chars})[{name!r}]
    prepare("warm up 预热")  # jieba's dictionary (a second or more on first use) is loaded before measuring
    off_the_event_loop(lambda: prepare("warm up"))  # the pool's thread exists before the measurement

    def longest_gap(run):
        gaps, last = [0.0], [time.monotonic()]
        def ticker():
            while True:
                gevent.sleep(0.002)
                now = time.monotonic()
                gaps.append(now - last[0])
                last[0] = now
        g = gevent.spawn(ticker)
        gevent.sleep(0.05)
        gaps.clear(); gaps.append(0.0)
        last[0] = start = time.monotonic()
        run(lambda: prepare(text))
        took = time.monotonic() - start
        gevent.sleep(0.02)
        g.kill()
        return max(gaps), took

    on_loop, took_on = longest_gap(lambda work: work())
    off_loop, took_off = longest_gap(off_the_event_loop)
    print(f"{{on_loop * 1000:.0f}} {{took_on * 1000:.0f}} {{off_loop * 1000:.0f}} {{took_off * 1000:.0f}}")
""")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chars", type=int, default=12_000, help="message length (default: MAX_INPUT_CHARS)")
    parser.add_argument("--repeat", type=int, default=2, help="runs per step, the best counts")
    parser.add_argument("--archive-turns", type=int, default=2000, help="folded turns recall searches")
    parser.add_argument("--stall-input", action="append", help="a crafted message of the gevent lines "
                        "(repeatable; default: abc12 run, numbers, 好。 repeated)")
    args = parser.parse_args(argv)

    index = archive(args.archive_turns)
    tokenize("预热 warm up")  # jieba's dictionary loads once per process, not in a measurement
    work = steps(index)
    messages = inputs(args.chars)
    base = {name: best(fn, messages["plain English"], args.repeat) for name, fn in work.items()}
    print(f"CPU per message of {args.chars:,} characters (50,000 emoji: 50,000), ratio to plain English "
          f"of the same length in this run; archive of {args.archive_turns} turns")
    print(f"{'input':18s}" + "".join(f"{name:>16s}" for name in work))
    print(f"{'plain English (ms)':18s}" + "".join(f"{base[name] * 1000:16.1f}" for name in work))
    for label, text in messages.items():
        if label == "plain English":
            continue
        cells = []
        for name, fn in work.items():
            spent = best(fn, text, args.repeat)
            cells.append(f"{spent * 1000:8.1f} ({spent / max(base[name], 1e-4):4.1f}x)")
        print(f"{label:18s}" + "".join(f"{c:>16s}" for c in cells), flush=True)

    for name in args.stall_input or ["abc12 run", "numbers", "好。 repeated"]:
        script = STALL_SCRIPT.format(turns=args.archive_turns, chars=args.chars, name=name)
        out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=600)
        if out.returncode != 0:
            print("gevent stall measurement failed:", out.stderr.strip().splitlines()[-1:])
            return 1
        on_gap, on_took, off_gap, off_took = out.stdout.split()
        print(f"another socket's longest pause while {name!r} is prepared (gevent, one process, ticks of 2 ms): "
              f"on the event loop {on_gap} ms (prepare {on_took} ms); off it {off_gap} ms (prepare {off_took} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
