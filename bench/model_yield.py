"""Background work yields to people: a fresh visitor's first token while a refinement runs on the compaction
server, with and without ``LOCAL_MODEL_YIELD`` (docs/bundled-model.md: The bundled model; ``scripts/cpu_yield.py``).

Prints figures; not a test.  For each mode (yield on, then off) both bundled model servers start for real as
``make run`` starts them (``scripts/model_server.py --role chat`` with its slot proxy, ``--role compaction``), in a
private run directory.  Then:

1. quiet: ``--visitors`` fresh visitors one after another (a new cache key each, a short question, streamed, 8
   tokens), nothing else running: the time to the first content token;
2. busy: the same, each sent ``--lead`` seconds after a refinement-sized request went to the compaction server
   (a new ``--refine-prompt``-token prompt, ``--refine-out`` tokens of output, as a refinement asks); the next
   visitor waits for that request to end.

Reported per mode: first-token p50 / max (s) quiet and busy, busy / quiet, busy / the yield-off quiet floor (the
baseline, measured in the same run), and the refinements' durations (they take longer when they yield).  Target
(the issue's): a fresh visitor during another thread's background work <= 1.5x the quiet floor.  On a shared
machine other processes skew the figures: the header prints the load average.

Usage::

    python -m bench.model_yield                    # 4 visitors per phase
    python -m bench.model_yield --visitors 6 --refine-prompt 1500 --refine-out 200
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from chat_support.servers import free_ports

ROOT = Path(__file__).resolve().parent.parent
WORDS = ("harbour lantern orchard violin granite meadow ledger copper thistle canyon pepper wool compass marble "
         "saffron glacier ribbon tunnel walnut beacon").split()


def start(role: str, port: int, env: dict) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "scripts/model_server.py", "--role", role, "--port", str(port)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if f"ready at http://127.0.0.1:{port}/v1" in line:
            threading.Thread(target=proc.stdout.read, daemon=True).start()
            return proc
        if "error" in line:
            raise SystemExit(line)
    raise SystemExit(f"the {role} server ended")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


def first_token(port: int, nonce: int) -> float:
    """Seconds from sending a fresh visitor's streamed question to its first content token."""
    body = {"messages": [{"role": "system", "content": "You are a helpful assistant."},
                         {"role": "user", "content": f"Visitor {nonce} here. Say hello in one short sentence."}],
            "stream": True, "max_tokens": 8, "temperature": 0}
    key = f"{nonce:064x}"[-64:]
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    started = time.monotonic()
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body),
                 headers={"Content-Type": "application/json", "X-Model-Cache-Key": key})
    resp = conn.getresponse()
    seen = None
    for raw in resp:
        line = raw.decode().strip()
        if seen is None and line.startswith("data: {") and '"content":"' in line.replace(" ", "") \
                and '"content":""' not in line.replace(" ", ""):
            seen = time.monotonic() - started
    conn.close()
    if seen is None:
        raise SystemExit("a visitor's answer had no content")
    return seen


def refinement(port: int, prompt_tokens: int, out_tokens: int, nonce: int) -> float:
    """Seconds of one refinement-sized completion on the compaction server (a new prompt: nothing cached)."""
    rng = random.Random(nonce)
    text = f"Record {nonce}. " + " ".join(rng.choice(WORDS) for _ in range(int(prompt_tokens * 0.9)))
    body = {"messages": [{"role": "system", "content": "Summarise the record in numbered lines."},
                         {"role": "user", "content": text}],
            "max_tokens": out_tokens, "temperature": 0, "ignore_eos": True}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=900)
    started = time.monotonic()
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    conn.getresponse().read()
    conn.close()
    return time.monotonic() - started


def run_mode(yields: bool, args) -> dict:
    chat_port, compaction_port = free_ports(2)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOCAL_MODEL_YIELD", "DEV_RUN_DIR"))}
    env.update({"PYTHONUNBUFFERED": "1", "LOCAL_MODEL_YIELD": "on" if yields else "off",
                "LOCAL_COMPACTION_MODEL_PORT": str(compaction_port),
                "DEV_RUN_DIR": tempfile.mkdtemp(prefix="bench-yield-")})
    compaction = start("compaction", compaction_port, env)
    try:
        chat = start("chat", chat_port, env)
        try:
            nonce = random.randrange(1 << 40)
            first_token(chat_port, nonce - 1)  # not counted: the first one has the system prompt's state saved
            quiet = [first_token(chat_port, nonce + n) for n in range(args.visitors)]
            busy, refinements = [], []
            for n in range(args.visitors):
                done: list[float] = []
                worker = threading.Thread(target=lambda n=n, done=done: done.append(
                    refinement(compaction_port, args.refine_prompt, args.refine_out, nonce + 1000 + n)))
                worker.start()
                time.sleep(args.lead)
                busy.append(first_token(chat_port, nonce + 100 + n))
                worker.join()
                refinements.extend(done)
        finally:
            stop(chat)
    finally:
        stop(compaction)
    return {"quiet": quiet, "busy": busy, "refinements": refinements}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--visitors", type=int, default=4)
    parser.add_argument("--refine-prompt", type=int, default=1500, help="tokens (about)")
    parser.add_argument("--refine-out", type=int, default=200, help="tokens")
    parser.add_argument("--lead", type=float, default=3.0, help="seconds between a refinement and the visitor")
    args = parser.parse_args(argv)
    print(f"model yield: {args.visitors} visitors per phase, refinement ~{args.refine_prompt} prompt tokens + "
          f"{args.refine_out} out, visitor sent {args.lead:.1f} s after it; cores {os.cpu_count()}, "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} (a shared machine: noisy)", flush=True)
    results = {mode: run_mode(mode == "on", args) for mode in ("on", "off")}
    floor = statistics.median(results["off"]["quiet"])
    print(f"{'yield':6} {'quiet p50':>10} {'busy p50':>9} {'busy max':>9} {'busy/quiet':>11} "
          f"{'busy/floor':>11} {'refine p50':>11}")
    for mode, r in results.items():
        q, b = statistics.median(r["quiet"]), statistics.median(r["busy"])
        print(f"{mode:6} {q:10.2f} {b:9.2f} {max(r['busy']):9.2f} {b / q:11.2f} {b / floor:11.2f} "
              f"{statistics.median(r['refinements']):11.1f}")
    print("floor: the quiet p50 with yield off (the baseline); target busy/floor <= 1.5; seconds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
