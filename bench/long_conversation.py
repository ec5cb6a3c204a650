"""Long conversations at a person's pace with the bundled model, against a quiet floor measured first in the
same run (docs/benchmarks.md: Performance).  Prints tables with each figure's target and PASS/FAIL; not a test.

The stack is the one ``make run`` starts (``bench.stack``: scripts/dev.py's plan and Procfile.dev's own
lines on free ports: the embedded store, the bundled model's chat and compaction servers, web, worker(s),
flower), with the product's own settings: no answer cap or any other setting the product does not ship
(``--env KEY=VALUE`` exists to try one; the header prints any).  Person turns are real: LoCoMo (English) and
KdConv (Chinese) first-side turns, mixed in blocks (``bench.person_turns``), read from ``--data`` at run time,
drawn with a fresh random seed each run (printed; ``--seed`` repeats a run), from the held-out part of the
data by default (``--split``; the dev part is what others tune on).  Every turn is a websocket ``message``
frame, as the page sends it; times are the client's (``time.monotonic``).

Phases, in this order:

(a) **floor**, on the quiet stack just started: the inputs of (b), each from a fresh session (no memory), one
    after another 1 s apart; each floor answer is cancelled after its first token (only the first token is
    measured; ``--floor-full`` lets them run).  One unmeasured turn first.  ``--floor-sample N`` sends N of
    the inputs (spread evenly) instead of all.
(b) **conversations**: ``--conversations`` (2) at a person's pace (the next message ``--pause`` 3-10 s after
    the answer ended, drawn uniformly) and ``--fast`` (1) fast typist (1 s), ``--turns`` (64) turns each, one
    session and socket per conversation.  Per turn: first-token time, answer end, answer tokens (the turn's
    ``completionTokens`` in ``GET /api/chat/stats``), failure (a ``done`` other than ``completed``, ``saved:
    false``, an error frame, no ``done``), the waiting frames' reasons, and whether the answer nearly repeats
    an earlier answer of its conversation (difflib ratio >= ``--dup-ratio``, 0.85; also counted, without a
    target: answers that echo the person's own message).  Then first token p50 / p95 / max as ratios to the
    floor's (targets 2x / 4x / 8x), per conversation, overall and per language; answer end p95 (<= 20 s);
    failed turns (0); repeated answers (0).
(c) **fresh visitors during another thread's background work**: a background thread chats ``--bg-turns`` (8)
    turns at 1 s pauses (its folds), and (c1) right after each fold of it is applied (its ``memory``
    ``succeeded`` frame: the web's prompt warm-up starts then) a fresh visitor sends a message; then the
    thread goes quiet, and (c2) once its refinement starts (``memory`` ``started`` ``refine``, after
    ``COMPACTION_IDLE_SECONDS`` of quiet) fresh visitors send messages one after another until it ends (at
    most ``--visitors``, 8).  Visitors' inputs are the floor's; each counts against the floor (p50 and p95 <=
    1.5x).  Visitors whose turn overlapped the refinement (from the thread's history) are counted.
(d) **fold latency** (a turn's commit -> its fold applied: ``at`` of the fold's entry in the thread's
    compaction history against the ``at`` of the turn record before it, both in ``GET /api/chat/stats``), p50 /
    p95, for the conversations of (b) and while other threads' refinements are slow: ``--refiners`` (2)
    threads chat ``--bg-turns`` turns each (round robin, 1 s pauses, the measured thread taking a turn in each
    round too, so that it folds on every turn by then) and go quiet; the measured thread chats on at 1 s
    pauses until their refinements (the bundled compaction server's, 20-40 s each on this machine, queued on
    its one slot) have ended, at most ``--fold-turns`` (16) more turns; its folds whose turn committed while
    one of their refinements ran count (target p95 <= 1 s); when none did (a quick refinement between two
    commits), the refiners chat 2 more turns each and go quiet again, at most ``--refine-rounds`` (3) rounds.  The served history drops its ``step`` field
    today (``accounting.public_compaction`` keeps numbers only): the bench then tells a fold's entry by its
    ``turnsFolded``, a refinement's by ``turnsRefined`` / ``modelCalls`` (``step_of``).

Per-turn rows of every phase go to ``bench/out/long_conversation-<UTC time>.json`` (git-ignored; they hold
the model's answers and the data's texts: never commit them).

Usage::

    python -m bench.long_conversation                                   # the real case (defaults): ~1.5-2 h here
    python -m bench.long_conversation --turns 5 --conversations 1 --fast 0 --pause 1 2 \\
        --bg-turns 6 --visitors 3 --refiners 1 --fold-turns 6          # a smoke run: mechanics and tables
    python -m bench.long_conversation --only a,b --turns 64             # some phases only
    python -m bench.long_conversation --seed 1234                       # repeat a run's draw

The smoke run above takes 10-15 minutes on this shared machine.  ``--data`` defaults to ``../shared/data``
beside the checkout (from a worktree under ``/work/wt/``: ``/work/shared/data``).  Units: seconds unless a
column says ms.  Ctrl+C (or SIGTERM) stops the run and every process it started; the store's data (the
conversations) lives in a temporary folder removed at the end (``--keep-logs DIR`` keeps the logs).
The exit status is 0 when every target passed, 1 otherwise, 130 when interrupted.
"""

from __future__ import annotations

import json
import os
import random
import secrets
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

os.environ.setdefault("APP_ENV", "test")  # before the app is imported

import requests  # noqa: E402
import websocket  # noqa: E402

from bench.paced_options import paced_parser  # noqa: E402
from bench.person_turns import PersonTurn, TurnSource, describe_split, pct, repeats, similarity  # noqa: E402
from bench.stack import Stack, parse_env, terminate_on_sigterm  # noqa: E402
from chat_support.live_app import Address, ChatClient  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out"
TARGETS = {"p50": 2.0, "p95": 4.0, "max": 8.0}
TARGET_END_P95 = 20.0
TARGET_VISITOR = 1.5
TARGET_FOLD_P95_MS = 1000.0


def load_average() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def iso_ms(value: str | None) -> float | None:
    """Epoch milliseconds of an ISO 8601 UTC stamp (``2026-12-06T14:00:00.123Z``)."""
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() * 1000
    except ValueError:
        return None


def step_of(entry: dict) -> str:
    """A history entry's ``step``; the served history (``accounting.public_compaction``) drops the string field
    today, so it is inferred then: a fold's entry carries ``turnsFolded``, a refinement's ``turnsRefined`` or
    ``modelCalls``; ``?`` otherwise (a fold or refinement that failed before its figures)."""
    if entry.get("step"):
        return str(entry["step"])
    if "turnsFolded" in entry:
        return "fold"
    if "turnsRefined" in entry or "modelCalls" in entry:
        return "refine"
    return "?"


# -- one session ---------------------------------------------------------------------------------------------------

@dataclass
class Turn:
    phase: str
    conversation: str
    n: int
    lang: str
    source: str
    pause_before: float = 0.0
    sent_wall: float = 0.0  # epoch seconds
    first_token: float | None = None  # seconds after sending
    end: float | None = None  # seconds after sending (the ``done`` frame)
    status: str = ""
    failure: str = ""
    waiting: list[str] = field(default_factory=list)
    message_id: str = ""
    answer: str = ""
    answer_tokens: int | None = None
    repeat_of: int | None = None
    repeat_ratio: float | None = None
    fold_ms: float | None = None  # this turn's commit -> its fold applied (history)
    fold_frame: float | None = None  # ``done`` -> the fold's memory frame on the socket (client clock)
    note: str = ""
    text: str = ""


class Session:
    """One browser session (cookie) and its websocket; ``events`` are the memory frames heard, with times."""

    def __init__(self, stack: Stack, timeout: float):
        server = Address(stack.url, stack.ws_url)
        self.client = ChatClient(server).connect(timeout=30)
        self.url = stack.url
        self.timeout = timeout
        self.events: list[tuple[float, dict]] = []  # (monotonic, frame)
        self.commits: dict[str, float] = {}
        self.history: dict[tuple, dict] = {}
        self.records: dict[str, dict] = {}

    def close(self) -> None:
        try:
            self.client.close()
        except Exception:  # noqa: BLE001 - closing a broken socket
            pass

    def _reconnect(self) -> None:
        self.close()
        self.client.connect(timeout=30)

    def turn(self, pt: PersonTurn, turn: Turn, *, cancel_after_first: bool = False) -> Turn:
        turn.text = pt.text
        sent = time.monotonic()
        turn.sent_wall = time.time()
        self.client.send({"type": "message", "text": pt.text})
        deltas: list[str] = []
        errors: list[str] = []
        cancelled = False
        deadline = sent + self.timeout
        done = None
        while done is None:
            try:
                frame = self.client.recv(timeout=max(deadline - time.monotonic(), 0.01))
            except (websocket.WebSocketTimeoutException, websocket.WebSocketConnectionClosedException, OSError) as exc:
                turn.failure = f"no done ({type(exc).__name__})"
                self._reconnect()
                break
            now = time.monotonic()
            kind = frame.get("type")
            if kind == "start":
                turn.message_id = str(frame.get("messageId") or "")
            elif kind == "waiting":
                turn.waiting.append(f"{frame.get('for')}: {frame.get('message')}")
            elif kind == "delta":
                if turn.first_token is None:
                    turn.first_token = now - sent
                deltas.append(str(frame.get("text") or ""))
                if cancel_after_first and not cancelled:
                    self.client.send({"type": "cancel"})
                    cancelled = True
            elif kind == "error":
                errors.append(str(frame.get("code")))
                if frame.get("code") in ("input_too_long", "turn_in_progress", "empty_input", "invalid_text",
                                         "memory_unreadable", "rate_limited", "store_full"):
                    done = frame
            elif kind == "memory":
                self.events.append((now, frame))
            elif kind == "done":
                done = frame
                turn.end = now - sent
        turn.answer = "".join(deltas)
        if done is not None:
            turn.status = str(done.get("status", done.get("type")))
            expected = ("cancelled", "completed") if cancelled else ("completed",)
            if turn.status not in expected:
                turn.failure = turn.status + (f" ({done.get('code')})" if done.get("code") else "")
            elif done.get("saved") is False:
                turn.failure = f"not saved ({done.get('reason')})"
            elif errors and not cancelled:
                turn.failure = "error " + ",".join(errors)
            if turn.status == "completed":
                self.commits[turn.message_id] = time.time()
        if turn.first_token is None and not turn.failure:
            turn.failure = "no text"
        return turn

    def idle(self, seconds: float, until=None) -> dict | None:
        """Read frames for ``seconds`` (a person's pause), noting memory frames; returns the first memory frame
        for which ``until(frame)`` is true (then stops early), else None."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                frame = self.client.recv(timeout=min(left, 5.0))
            except websocket.WebSocketTimeoutException:
                continue
            except (websocket.WebSocketConnectionClosedException, OSError):
                self._reconnect()
                continue
            if frame.get("type") == "memory":
                self.events.append((time.monotonic(), frame))
                if until is not None and until(frame):
                    return frame
        return None

    def refresh(self) -> None:
        """Merge the thread's turn records and compaction history (the store keeps the last 50 entries)."""
        try:
            data = self.client.http.get(self.url + "/api/chat/stats", timeout=30).json()
        except (requests.RequestException, ValueError):
            return
        for r in data.get("turns") or []:
            if r.get("messageId"):
                self.records[r["messageId"]] = r
        for c in data.get("compactions") or []:
            c = dict(c, step=step_of(c))
            self.history[(c.get("at"), c.get("step"), c.get("outcome"), c.get("turnsFolded"))] = c

    def folds(self) -> list[dict]:
        return sorted((c for c in self.history.values() if c.get("step") == "fold"), key=lambda c: c.get("at") or "")

    def refinements(self) -> list[tuple[float, float, str]]:
        """(start, end, outcome) of each refinement, epoch ms (end from ``at``, start from ``durationMs``)."""
        out = []
        for c in self.history.values():
            if c.get("step") == "refine" and (end := iso_ms(c.get("at"))) is not None:
                out.append((end - float(c.get("durationMs") or 0), end, str(c.get("outcome"))))
        return sorted(out)

    def annotate(self, turns: list[Turn]) -> None:
        """Answer tokens and fold latency of ``turns`` from the thread's records and history."""
        self.refresh()
        by_id = {t.message_id: t for t in turns if t.message_id}
        for mid, r in self.records.items():
            if mid in by_id:
                by_id[mid].answer_tokens = r.get("completionTokens")
        stamped: list[tuple[float, str]] = sorted((at, mid) for mid, r in self.records.items()
                                                  if (at := iso_ms(r.get("at"))) is not None)
        for c in self.folds():
            if c.get("outcome") != "applied" or (at := iso_ms(c.get("at"))) is None:
                continue
            before = [s for s in stamped if s[0] <= at]
            if before and before[-1][1] in by_id and by_id[before[-1][1]].fold_ms is None:
                by_id[before[-1][1]].fold_ms = at - before[-1][0]


# -- phases ----------------------------------------------------------------------------------------------------------

def floor_phase(stack: Stack, inputs: list[PersonTurn], args) -> list[Turn]:
    out = []
    warm = Session(stack, args.timeout)
    try:
        warm.turn(inputs[0], Turn("warm-up", "warm-up", 0, inputs[0].lang, inputs[0].source), cancel_after_first=True)
    finally:
        warm.close()
    time.sleep(1)
    for i, pt in enumerate(inputs):
        s = Session(stack, args.timeout)
        try:
            t = s.turn(pt, Turn("a floor", f"fresh-{i + 1}", i + 1, pt.lang, pt.source),
                       cancel_after_first=not args.floor_full)
        finally:
            s.close()
        out.append(t)
        print(f"  floor {i + 1}/{len(inputs)} [{pt.lang}]: first token {fmt(t.first_token)}"
              f"{'  FAILED ' + t.failure if t.failure else ''}", flush=True)
        time.sleep(1.0)
    return out


def conversation(stack: Stack, name: str, inputs: list[PersonTurn], pauses: list[float], args) -> list[Turn]:
    s = Session(stack, args.timeout)
    turns: list[Turn] = []
    try:
        for i, pt in enumerate(inputs):
            t = s.turn(pt, Turn("b conversation", name, i + 1, pt.lang, pt.source,
                                pause_before=pauses[i - 1] if i else 0.0))
            done_mono = time.monotonic()
            turns.append(t)
            s.idle(pauses[i])
            fold_frames = [at for at, f in s.events if at >= done_mono and f.get("step") == "fold"
                           and f.get("status") in ("succeeded", "failed")]
            if fold_frames:
                t.fold_frame = fold_frames[0] - done_mono
            if (i + 1) % 5 == 0:
                s.refresh()
            print(f"  {name} turn {i + 1}/{len(inputs)} [{pt.lang}]: first token {fmt(t.first_token)}, "
                  f"end {fmt(t.end)}, {len(t.answer)} chars{'; waiting: ' + '; '.join(t.waiting) if t.waiting else ''}"
                  f"{'  FAILED ' + t.failure if t.failure else ''}", flush=True)
        s.annotate(turns)
    finally:
        s.close()
    for t, rep in zip(turns, repeats([t.answer for t in turns], args.dup_ratio), strict=True):
        if rep is not None:
            t.repeat_of, t.repeat_ratio = turns[rep[0]].n, round(rep[1], 3)
    return turns


def visitors_phase(stack: Stack, source: TurnSource, floor_inputs: list[PersonTurn], args) -> list[Turn]:
    """(c): visitors right after another thread's folds (warm-ups) and during its refinement."""
    out: list[Turn] = []
    k = 0

    def visit(label: str) -> Turn:
        nonlocal k
        pt = floor_inputs[k % len(floor_inputs)]
        k += 1
        v = Session(stack, args.timeout)
        try:
            t = v.turn(pt, Turn(f"c {label}", f"visitor-{k}", k, pt.lang, pt.source), cancel_after_first=True)
        finally:
            v.close()
        out.append(t)
        print(f"  visitor {k} ({label}) [{pt.lang}]: first token {fmt(t.first_token)}"
              f"{'  FAILED ' + t.failure if t.failure else ''}", flush=True)
        return t

    bg = Session(stack, args.timeout)
    try:
        bg_inputs = source.conversation(args.bg_turns)
        for i, pt in enumerate(bg_inputs):
            t = bg.turn(pt, Turn("c background", "background", i + 1, pt.lang, pt.source))
            print(f"  background turn {i + 1}/{len(bg_inputs)}: first token {fmt(t.first_token)}, end {fmt(t.end)}"
                  f"{'  FAILED ' + t.failure if t.failure else ''}", flush=True)
            fold = bg.idle(5.0, until=lambda f: f.get("step") == "fold" and f.get("status") == "succeeded")
            if fold is not None:
                visit("after a fold: warm-up")
            bg.idle(1.0)
        print(f"  background thread quiet; waiting for its refinement (COMPACTION_IDLE_SECONDS, "
              f"at most {args.refine_wait:.0f} s)", flush=True)
        started = bg.idle(args.refine_wait, until=lambda f: f.get("step") == "refine" and f.get("status") == "started")
        if started is None:
            print("  no refinement started", flush=True)
        else:
            ended = False
            for _ in range(args.visitors):
                visit("during a refinement")
                if bg.idle(0.05, until=lambda f: f.get("step") == "refine" and f.get("status") != "started"):
                    ended = True
                    break
            if not ended:
                bg.idle(args.refine_wait, until=lambda f: f.get("step") == "refine" and f.get("status") != "started")
        bg.refresh()
        spans = bg.refinements()
        for t in out:
            if t.phase == "c during a refinement":
                start, end = t.sent_wall * 1000, (t.sent_wall + (t.first_token or t.end or 0)) * 1000
                t.note = "overlapped" if any(a < end and start < b for a, b, _ in spans) else "after it ended"
    finally:
        bg.close()
    return out


def folds_phase(stack: Stack, source: TurnSource, args) -> tuple[list[Turn], list[tuple[float, float, str]]]:
    """(d): a thread folding at 1 s pauses while ``--refiners`` other threads' refinements run.  The measured
    thread chats in the refiners' rounds too (so it folds on every turn by the time they go quiet), then goes
    on alone at 1 s pauses until every refiner's refinement has run and ended (at most ``--fold-turns`` more
    turns)."""
    refiners = [Session(stack, args.timeout) for _ in range(args.refiners)]
    measured = Session(stack, args.timeout)
    turns: list[Turn] = []
    inputs = iter(source.conversation(args.bg_turns + (args.fold_turns + 2) * args.refine_rounds))
    open_refines: set[int] = set()

    def measured_turn(label: str) -> None:
        pt = next(inputs)
        t = measured.turn(pt, Turn("d measured", "measured", len(turns) + 1, pt.lang, pt.source, pause_before=1.0))
        turns.append(t)
        for r, s in enumerate(refiners):
            s.idle(0.01)
            for _at, f in s.events:
                if f.get("step") == "refine":
                    (open_refines.add if f.get("status") == "started" else open_refines.discard)(r)
            s.events.clear()
        print(f"  measured turn {len(turns)} ({label}): first token {fmt(t.first_token)}, end {fmt(t.end)}, "
              f"refinements running: {len(open_refines)}{'  FAILED ' + t.failure if t.failure else ''}", flush=True)
        measured.idle(1.0)

    def spans_now() -> list[tuple[float, float, str]]:
        out = []
        for s in refiners:
            s.refresh()
            out += s.refinements()
        return out

    def during(t: Turn, spans: list[tuple[float, float, str]]) -> bool:
        at = iso_ms(measured.records.get(t.message_id, {}).get("at"))
        return at is not None and any(a <= at <= b for a, b, _ in spans)

    try:
        more = 2 * (args.refine_rounds - 1)
        scripts = [source.conversation(args.bg_turns + more) for _ in refiners]
        done_turns = [0] * len(refiners)

        def refiner_round(label: str) -> None:
            for r, (s, script) in enumerate(zip(refiners, scripts, strict=True)):
                i = done_turns[r]
                t = s.turn(script[i], Turn("d refiner", f"refiner-{r + 1}", i + 1, script[i].lang, script[i].source))
                done_turns[r] += 1
                print(f"  refiner {r + 1} turn {i + 1}: end {fmt(t.end)}"
                      f"{'  FAILED ' + t.failure if t.failure else ''}", flush=True)
                s.idle(1.0)
            measured_turn(label)

        for _ in range(args.bg_turns):
            refiner_round("with the refiners")
        spans: list[tuple[float, float, str]] = []
        for round_ in range(args.refine_rounds):  # bounded: a round whose refinements missed every fold repeats
            if round_:
                print("  no fold of the measured thread was committed while a refinement ran: the refiners chat "
                      "2 more turns each and go quiet again", flush=True)
                for _ in range(2):
                    refiner_round("with the refiners")
            spans_now()  # refreshes each refiner's history
            before = [len(s.refinements()) for s in refiners]
            print("  refiners quiet: their refinements start after COMPACTION_IDLE_SECONDS", flush=True)
            for _ in range(args.fold_turns):
                measured_turn("alone")
                if not open_refines:
                    for s in refiners:
                        s.refresh()
                    if all(len(s.refinements()) > n for s, n in zip(refiners, before, strict=True)):
                        break  # every refiner's refinement of this round has run and ended
            measured.annotate(turns)
            spans = spans_now()
            if any(t.fold_ms is not None and during(t, spans) for t in turns):
                break
        for t in turns:
            t.note = "during a refinement" if during(t, spans) else ""
        return turns, spans
    finally:
        for s in refiners + [measured]:
            s.close()


# -- tables ----------------------------------------------------------------------------------------------------------

def fmt(v: float | None, unit: str = " s") -> str:
    return "-" if v is None else f"{v:.2f}{unit}"


def ratio_line(label: str, values: list[float], floor: list[float], targets: dict[str, float]) -> tuple[list[str], bool]:
    lines, ok_all = [], True
    for key, q in (("p50", 0.5), ("p95", 0.95), ("max", 1.0)):
        if key not in targets:
            continue
        v, f = pct(values, q), pct(floor, q)
        r = v / f if f > 0 else float("inf")
        ok = r <= targets[key] and bool(values)
        ok_all &= ok
        lines.append(f"  {label:<34} first token {key:<3} {v:7.2f} s   floor {f:6.2f} s   {r:5.1f}x  "
                     f"(target <= {targets[key]:.1f}x)  {verdict(ok)}")
    return lines, ok_all


def report(floor: list[Turn], convs: dict[str, list[Turn]], visitors: list[Turn], fold_turns: list[Turn],
           spans: list, args) -> tuple[list[str], bool]:
    lines: list[str] = []
    ok_all = True
    base = [t.first_token for t in floor if t.first_token is not None]
    if floor or convs or visitors:
        lines.append("")
        lines.append("(a) floor: the same inputs, each from a fresh session, quiet stack")
        lines.append(f"  {len(floor)} turns ({sum(1 for t in floor if t.lang == 'en')} en, "
                     f"{sum(1 for t in floor if t.lang == 'zh')} zh), failed {sum(1 for t in floor if t.failure)}: "
                     f"first token p50 {pct(base, .5):.2f} s  p95 {pct(base, .95):.2f} s  "
                     f"max {max(base, default=0):.2f} s")
    if convs:
        lines.append("")
        lines.append("(b) conversations at a person's pace (ratios to the floor)")
        every: list[Turn] = []
        for name, turns in convs.items():
            every += turns
            lines.append(f" {name}: {len(turns)} turns")
            ls, ok = ratio_line(name, [t.first_token for t in turns if t.first_token is not None], base, TARGETS)
            lines += ls
        lines.append(" all conversations:")
        ls, ok = ratio_line("all", [t.first_token for t in every if t.first_token is not None], base, TARGETS)
        lines += ls
        ok_all &= ok
        for lang in ("en", "zh"):
            sub_ft = [t.first_token for t in every if t.lang == lang and t.first_token is not None]
            fl = [t.first_token for t in floor if t.lang == lang and t.first_token is not None]
            if sub_ft and fl:
                lines.append(f"  ({lang}: p50 {pct(sub_ft, .5):.2f} s / floor {pct(fl, .5):.2f} s, p95 "
                             f"{pct(sub_ft, .95):.2f} s / {pct(fl, .95):.2f} s, max {max(sub_ft):.2f} s / {max(fl):.2f} s)")
        ends = [t.end for t in every if t.end is not None]
        ok = pct(ends, .95) <= TARGET_END_P95 and bool(ends)
        ok_all &= ok
        lines.append(f"  answer end (sent -> done)          p50 {pct(ends, .5):.2f} s  p95 {pct(ends, .95):.2f} s  "
                     f"max {max(ends, default=0):.2f} s   (target p95 <= {TARGET_END_P95:.0f} s)  {verdict(ok)}")
        tokens = [t.answer_tokens for t in every if t.answer_tokens is not None]
        lines.append(f"  answer tokens                      p50 {pct(tokens, .5):.0f}  p95 {pct(tokens, .95):.0f}  "
                     f"max {max(tokens, default=0)}  ({len(tokens)} of {len(every)} turns recorded)")
        failed = [t for t in every if t.failure]
        ok_all &= not failed
        lines.append(f"  failed turns                       {len(failed)}   (target 0)  {verdict(not failed)}"
                     + ("  [" + "; ".join(f"{t.conversation}#{t.n}: {t.failure}" for t in failed[:6]) + "]"
                        if failed else ""))
        reps = [t for t in every if t.repeat_of is not None]
        ok_all &= not reps
        lines.append(f"  answers repeating an earlier one   {len(reps)}   (similarity >= {args.dup_ratio}; target 0)  "
                     f"{verdict(not reps)}" + ("  [" + "; ".join(f"{t.conversation}#{t.n}~#{t.repeat_of} "
                                                                  f"({t.repeat_ratio})" for t in reps[:6]) + "]"
                                               if reps else ""))
        echoes = [t for t in every if similarity(t.answer, t.text) >= args.dup_ratio]
        lines.append(f"  answers echoing the person's message {len(echoes)}  (similarity >= {args.dup_ratio}; no target: "
                     "a person reads them as broken)" + ("  [" + ", ".join(f"{t.conversation}#{t.n}" for t in echoes[:8])
                                                        + "]" if echoes else ""))
        waits = [t for t in every if t.waiting]
        reasons = sorted({w.split(":")[0] for t in waits for w in t.waiting})
        lines.append(f"  turns that showed a waiting reason {len(waits)}  ({', '.join(reasons) or 'none'})")
    if visitors:
        lines.append("")
        lines.append("(c) fresh visitors during another thread's background work (ratios to the floor)")
        if getattr(args, "warmups", None):
            lines.append(f"  prompt warm-ups the web queued during (c): {args.warmups[0]}; the proxy read {args.warmups[1]}"
                         f" whole, {args.warmups[2]} were preempted by a turn, {args.warmups[3]} failed")
        for label in ("c after a fold: warm-up", "c during a refinement"):
            sub = [t for t in visitors if t.phase == label]
            if not sub:
                lines.append(f"  {label[2:]}: no visitor")
                continue
            vals = [t.first_token for t in sub if t.first_token is not None]
            overlapped = sum(1 for t in sub if t.note == "overlapped")
            extra = f", {overlapped} overlapped the refinement" if label.endswith("refinement") else ""
            lines.append(f" {label[2:]}: {len(sub)} visitors{extra}, failed {sum(1 for t in sub if t.failure)}, "
                         f"max {max(vals, default=0):.2f} s")
            ls, ok = ratio_line(label[2:], vals, base, {"p50": TARGET_VISITOR, "p95": TARGET_VISITOR})
            lines += ls
            ok_all &= ok and not any(t.failure for t in sub)
    if convs or visitors:
        ok_all &= bool(base)  # no ratio without a floor
    if convs or fold_turns:
        lines.append("")
        lines.append("(d) fold latency (turn committed -> fold applied, from the thread's compaction history)")
    if convs:
        ms = [t.fold_ms for ts in convs.values() for t in ts if t.fold_ms is not None]
        frames = [t.fold_frame * 1000 for ts in convs.values() for t in ts if t.fold_frame is not None]
        lines.append(f"  conversations (b): {len(ms)} folds  p50 {pct(ms, .5):.0f} ms  p95 {pct(ms, .95):.0f} ms  "
                     f"max {max(ms, default=0):.0f} ms   (client: done -> fold frame p50 {pct(frames, .5):.0f} ms, "
                     f"p95 {pct(frames, .95):.0f} ms)")
    if fold_turns:
        during = [t.fold_ms for t in fold_turns if t.fold_ms is not None and t.note]
        alls = [t.fold_ms for t in fold_turns if t.fold_ms is not None]
        durs = [(b - a) / 1000 for a, b, _ in spans]
        ok = bool(during) and pct(during, .95) <= TARGET_FOLD_P95_MS
        ok_all &= ok
        lines.append(f"  other threads' refinements: {len(spans)}, each {min(durs, default=0):.1f}-"
                     f"{max(durs, default=0):.1f} s ({', '.join(sorted({o for *_, o in spans})) or '-'})")
        lines.append(f"  while they ran: {len(during)} folds  p50 {pct(during, .5):.0f} ms  p95 {pct(during, .95):.0f} ms"
                     f"  max {max(during, default=0):.0f} ms   (target p95 <= {TARGET_FOLD_P95_MS:.0f} ms)  "
                     f"{verdict(ok)}" + ("  [no fold while a refinement ran]" if not during else ""))
        lines.append(f"  all folds of the measured thread: {len(alls)}  p50 {pct(alls, .5):.0f} ms  "
                     f"p95 {pct(alls, .95):.0f} ms")
        failed = [t for t in fold_turns if t.failure]
        lines.append(f"  the measured thread's failed turns: {len(failed)}"
                     + ("  [" + "; ".join(f"#{t.n}: {t.failure}" for t in failed[:6]) + "]" if failed else ""))
    return lines, ok_all


def main(argv: list[str] | None = None) -> int:
    parser = paced_parser(__doc__, turns=64, pause=(3.0, 10.0),
                          floor_sample_help="floor turns (0: every input of (b))")
    parser.add_argument("--conversations", type=int, default=2, help="conversations at --pause")
    parser.add_argument("--fast", type=int, default=1, help="fast-typist conversations (1 s pauses)")
    parser.add_argument("--floor-full", action="store_true", help="let floor answers run to their end")
    parser.add_argument("--bg-turns", type=int, default=8, help="turns of each background thread in (c), (d)")
    parser.add_argument("--visitors", type=int, default=8, help="at most this many visitors during a refinement")
    parser.add_argument("--refiners", type=int, default=2)
    parser.add_argument("--fold-turns", type=int, default=16)
    parser.add_argument("--refine-wait", type=float, default=180.0, help="seconds to wait for a refinement")
    parser.add_argument("--refine-rounds", type=int, default=3,
                        help="(d): rounds of refinements at most, until a measured fold lands in one")
    parser.add_argument("--only", default="a,b,c,d", help="phases to run (a is always run when b or c is)")
    args = parser.parse_args(argv)
    terminate_on_sigterm()
    phases = set(args.only.split(","))
    if phases & {"b", "c"}:
        phases.add("a")
    seed = args.seed if args.seed is not None else secrets.randbelow(10**6)
    rng = random.Random(seed)
    source = TurnSource(args.data, args.split, rng)
    plan = [(f"paced-{i + 1}", False) for i in range(args.conversations)] + \
           [(f"fast-{i + 1}", True) for i in range(args.fast)]
    scripts = {name: (source.conversation(args.turns, args.languages),) for name, _ in plan}
    pauses = {name: [1.0 if fast else rng.uniform(*args.pause) for _ in range(args.turns)] for name, fast in plan}
    inputs = [pt for (s,) in scripts.values() for pt in s] if "b" in phases else source.conversation(args.turns)
    if args.floor_sample and args.floor_sample < len(inputs):
        step = len(inputs) / args.floor_sample
        inputs = [inputs[int(i * step)] for i in range(args.floor_sample)]
    extra = parse_env(args.env)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    what = (f"{args.conversations} x {args.turns} turns at {args.pause[0]:g}-{args.pause[1]:g} s pauses + "
            f"{args.fast} fast typist (1 s), {args.languages}; " if "b" in phases else "")
    print(f"bench: long conversations; seed {seed}; data {args.data} ({describe_split(args.split)}); {what}"
          f"floor {len(inputs)} inputs; phases {','.join(sorted(phases))}; "
          f"settings: the product's own{' + ' + ' '.join(args.env) if args.env else ''}; load {load_average()}",
          flush=True)
    floor: list[Turn] = []
    convs: dict[str, list[Turn]] = {}
    visitors: list[Turn] = []
    fold_turns: list[Turn] = []
    spans: list = []
    interrupted = False
    tmp = Path(tempfile.mkdtemp(prefix="bench-long-"))
    stack = Stack(tmp, skip=tuple(s for s in args.skip.split(",") if s), extra_env=extra)
    try:
        stack.start()
        print(f"bench: stack up at {stack.url}; {stack.describe()}", flush=True)
        if "a" in phases:
            print(f"(a) floor: {len(inputs)} fresh sessions", flush=True)
            floor = floor_phase(stack, inputs, args)
        if "b" in phases:
            for name, fast in plan:
                print(f"(b) {name}: {args.turns} turns, pauses {'1 s' if fast else f'{args.pause[0]:g}-{args.pause[1]:g} s'}",
                      flush=True)
                convs[name] = conversation(stack, name, list(scripts[name][0]), pauses[name], args)
        if "c" in phases:
            print("(c) fresh visitors during another thread's background work", flush=True)
            before, model_before = stack.log("web"), stack.log("model")
            visitors = visitors_phase(stack, source, inputs, args)
            logged, model_logged = stack.log("web")[len(before):], stack.log("model")[len(model_before):]
            # the web queues a warm-up with the slot proxy ("queued"), which logs how each one ended
            args.warmups = (logged.count("prompt warm-up"), model_logged.count(" read whole: "),
                            model_logged.count(" preempted by a turn of "), model_logged.count("warm-up") -
                            model_logged.count(" read whole: ") - model_logged.count(" preempted by a turn of "))
        if "d" in phases:
            print("(d) fold latency while other threads' refinements run", flush=True)
            fold_turns, spans = folds_phase(stack, source, args)
    except KeyboardInterrupt:
        interrupted = True
        print("bench: interrupted; stopping the stack", flush=True)
    finally:
        stack.stop()
        if args.keep_logs is not None:
            args.keep_logs.mkdir(parents=True, exist_ok=True)
            for log in tmp.glob("*.log"):
                (args.keep_logs / log.name).write_bytes(log.read_bytes())
        shutil.rmtree(tmp, ignore_errors=True)  # the store's data: the conversations' texts
    lines, ok = report(floor, convs, visitors, fold_turns, spans, args)
    print("\n".join(lines))
    OUT.mkdir(parents=True, exist_ok=True)
    out = OUT / f"long_conversation-{stamp}.json"
    rows = [asdict(t) for t in floor + [t for ts in convs.values() for t in ts] + visitors + fold_turns]
    out.write_text(json.dumps({"seed": seed, "split": args.split, "args": {k: str(v) for k, v in vars(args).items()},
                               "load_at_end": load_average(), "refinements": spans, "rows": rows},
                              ensure_ascii=False, indent=1))
    print(f"\nper-turn rows: {out}   load at the end: {load_average()}")
    print(f"overall: {'interrupted (incomplete)' if interrupted else verdict(ok)}")
    return 130 if interrupted else (0 if ok else 1)


if __name__ == "__main__":
    raise SystemExit(main())
