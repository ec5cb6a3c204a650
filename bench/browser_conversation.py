"""A conversation in the real page, in a real browser, with the bundled model: what a person sees
(docs/benchmarks.md: Performance).  Prints per-turn rows and a summary with each figure's target and PASS/FAIL; not a test.

Starts the stack ``make run`` starts (``bench.stack``: scripts/dev.py's plan and Procfile.dev's lines on free
ports, the product's own settings) and drives its page with Playwright and Debian's Chromium
(``/usr/bin/chromium``, ``CHROMIUM_PATH``; the launch flags of the browser tests, ``tests/fixtures``; for the
Chinese turns' screenshots a CJK font: ``apt-get install -y fonts-wqy-zenhei``).  Person
turns are the same real data as ``bench.long_conversation`` (``bench.person_turns``: LoCoMo English and
KdConv Chinese first-side turns mixed in blocks, held-out split by default, read from ``--data`` at run time,
a fresh seed per run, printed).

1. **floor**: each input from a fresh browser context (new session, empty memory), on the quiet stack first:
   type it, press Enter, time the first answer text, press Stop (only the first text is measured).
   ``--floor-sample N`` sends N of them (spread evenly).
2. **conversation**: ``--turns`` (30) turns in one page, the next typed ``--pause`` 5-10 s (uniform) after the
   answer ended.  For each turn the page itself records, with a MutationObserver and ``performance.now()``:
   the Enter key press (a capture-phase keydown listener), the first answer text in the assistant bubble (text
   in its content other than the typing dots and the waiting note), the answer's end (the bubble's
   ``data-status``), every waiting note the page showed (its text and reason); the bench polls it every 50 ms.
   Before the next turn (the page has reloaded its memory by then) it reads the turn number the page shows for
   the turn (the user bubble's ``data-turn-guess``) and the answer's status and note ("failed — not saved").
   Answer tokens come from ``GET /api/chat/stats`` with the page's cookies.

Reported: per-turn rows; first visible text p50 / p95 / max (target: no turn > 6 s) and as ratios to the
floor; answer end p95 (target <= 20 s); failed turns (0); answers that nearly repeat an earlier one (difflib
ratio >= ``--dup-ratio``; 0); turns whose shown number is not the person's count; the waiting messages
shown.  Screenshots of turns ``--screenshots`` (1, 10, 20, 30), of the first waiting notes and of slow or
failed turns go to ``bench/out/browser-<UTC time>-*.png``, the rows to ``bench/out/browser-<UTC time>.json``
(git-ignored: they hold the data's texts and the model's answers; never commit them).

Usage::

    python -m bench.browser_conversation                                   # the real case: 30 turns, ~15-25 min here
    python -m bench.browser_conversation --turns 4 --pause 2 3 --floor-sample 2   # a smoke run
    python -m bench.browser_conversation --seed 1234 --headed              # repeat a draw, watch it (needs a display)

Ctrl+C stops the run, the browser and every process it started.
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

from bench.paced_options import paced_parser
from bench.person_turns import TurnSource, describe_split, pct, repeats, similarity
from bench.stack import Stack, parse_env, terminate_on_sigterm

ROOT = Path(__file__).resolve().parent.parent

OUT = ROOT / "bench" / "out"
TARGET_FIRST_MAX = 6.0
TARGET_END_P95 = 20.0
CHROMIUM = os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]  # the flags the browser tests launch it with

# Installed into every page before its scripts: records the turn's times from the page's own clock.
RECORDER = r"""
(() => {
  const B = window.__bench = { turns: [] };
  const turnsShown = () => Array.from(document.querySelectorAll('[data-testid="message"][data-role="assistant"]'))
    .map((b) => b.dataset.turn || "").filter(Boolean);
  const visible = (content) => {
    if (!content) return "";
    const c = content.cloneNode(true);
    for (const x of c.querySelectorAll('.typing, .waiting, [data-testid="waiting"]')) x.remove();
    return (c.textContent || "").trim();
  };
  document.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && e.target && e.target.id === "message-input" && e.target.value.trim()) {
      B.turns.push({ sent: performance.now(), first: null, end: null, waits: [], reasons: [], status: null,
                     old: turnsShown() });
    }
  }, true);
  document.addEventListener("click", (e) => {
    const t = e.target && e.target.closest && e.target.closest('[data-testid="send"]');
    const box = document.getElementById("message-input");
    if (t && box && box.value.trim()) {
      B.turns.push({ sent: performance.now(), first: null, end: null, waits: [], reasons: [], status: null,
                     old: turnsShown() });
    }
  }, true);
  const check = () => {
    const cur = B.turns[B.turns.length - 1];
    if (!cur || cur.end !== null) return;
    const bots = document.querySelectorAll('[data-testid="message"][data-role="assistant"]');
    // this turn's bubble only: the page's own (data-turn: its client id) and new since Enter (none when not sent)
    const bot = Array.from(bots).reverse().find((b) => b.dataset.turn && !cur.old.includes(b.dataset.turn));
    if (!bot) return;
    const now = performance.now();
    const content = bot.querySelector(".content");
    const note = bot.querySelector('[data-testid="waiting"]');
    if (note && cur.first === null) {
      const text = (note.textContent || "").trim();
      const shape = text.replace(/\d+ s/, "N s");
      const seen = cur.waits.find((w) => w.shape === shape);
      if (seen) seen.text = text; else cur.waits.push({ shape, text, at: now - cur.sent });  // its last text
      const reason = note.dataset.reason || "";
      if (reason && !cur.reasons.includes(reason)) cur.reasons.push(reason);
    }
    if (cur.first === null && visible(content)) cur.first = now;
    if (bot.dataset.status) {
      cur.end = now;
      cur.status = bot.dataset.status;
    }
  };
  const start = () => {
    const root = document.getElementById("messages") || document.body;
    new MutationObserver(check).observe(root, { subtree: true, childList: true, characterData: true,
                                                attributes: true, attributeFilter: ["data-status", "class"] });
  };
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start); else start();
})();
"""

STATE = r"""
() => {
  const B = window.__bench || { turns: [] };
  const cur = B.turns[B.turns.length - 1] || null;
  return cur && { n: B.turns.length, sent: cur.sent, first: cur.first, end: cur.end, status: cur.status,
                  waits: cur.waits, reasons: cur.reasons, elapsed: performance.now() - cur.sent };
}
"""

LAST_TURN = r"""
() => {
  const users = document.querySelectorAll('[data-testid="message"][data-role="user"]');
  const bots = document.querySelectorAll('[data-testid="message"][data-role="assistant"]');
  const user = users[users.length - 1], bot = bots[bots.length - 1];
  const note = bot && bot.querySelector(".msg-foot .note");
  return { shown: user ? (user.dataset.turnGuess || null) : null, messageId: bot ? (bot.dataset.messageId || "") : "",
           status: bot ? (bot.dataset.status || "") : "", note: note ? (note.textContent || "").trim() : "",
           answer: bot ? (bot._text || (bot.querySelector(".content") || {}).textContent || "") : "" };
}
"""


@dataclass
class Row:
    phase: str
    n: int
    lang: str
    source: str
    pause_before: float = 0.0
    first_visible: float | None = None  # seconds from Enter to the first answer text in the page
    end: float | None = None  # seconds from Enter to the answer's end (the bubble's status)
    status: str = ""
    failure: str = ""
    waits: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    shown_turn: str | None = None
    message_id: str = ""
    answer_tokens: int | None = None
    answer: str = ""
    repeat_of: int | None = None
    repeat_ratio: float | None = None
    screenshot: str = ""
    text: str = ""


def fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f} s"


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


class Browser:
    def __init__(self, base: str, headed: bool):
        from playwright.sync_api import sync_playwright

        if not (Path(CHROMIUM).exists() or shutil.which(CHROMIUM)):
            raise SystemExit(f"bench: {CHROMIUM} is missing (apt-get install -y chromium)")
        self.base = base
        self._pw = sync_playwright().start()
        try:
            self.browser = self._pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=not headed)
        except Exception:
            self._pw.stop()
            raise

    def page(self):
        context = self.browser.new_context(viewport={"width": 1100, "height": 800})
        context.add_init_script(RECORDER)
        page = context.new_page()
        page.set_default_timeout(60_000)
        page.goto(self.base + "/")
        page.wait_for_selector('[data-testid="connection"][data-state="connected"]')
        return page

    def close(self) -> None:
        try:
            self.browser.close()
        finally:
            self._pw.stop()


def run_turn(page, text: str, row: Row, timeout: float, *, stop_after_first: bool = False,
             shots: list | None = None, shot_prefix: str = "") -> Row:
    """Type ``text``, press Enter, poll the page's recorder every 50 ms until the answer ended (or ``timeout``)."""
    row.text = text
    before = page.evaluate(STATE)
    n_before = before["n"] if before else 0
    box = page.get_by_test_id("message-input")
    box.fill(text)
    box.press("Enter")
    deadline = time.monotonic() + timeout
    stopped = False
    waiting_shot = False
    state = None
    while time.monotonic() < deadline:
        state = page.evaluate(STATE)
        if state and state["n"] > n_before:
            if state["first"] is not None and stop_after_first and not stopped:
                stop = page.get_by_test_id("stop")
                if stop.is_visible():
                    stop.click()
                stopped = True
            if (shots is not None and state["waits"] and state["first"] is None and not waiting_shot
                    and state["elapsed"] > 3000 and len(shots) < 4):  # a wait a person notices
                path = OUT / f"{shot_prefix}-turn{row.n}-waiting.png"
                page.screenshot(path=str(path))
                shots.append(path)
                row.screenshot = path.name
                waiting_shot = True
            if state["end"] is not None:
                break
        page.wait_for_timeout(50)
    if not state or state["n"] <= n_before:
        row.failure = "the page did not send the message"
        return row
    if state["first"] is not None:
        row.first_visible = (state["first"] - state["sent"]) / 1000
    if state["end"] is not None:
        row.end = (state["end"] - state["sent"]) / 1000
    else:
        row.failure = f"no end within {timeout:.0f} s"
    row.status = state["status"] or ""
    row.waits = [w["text"] for w in state["waits"]]
    row.reasons = list(state["reasons"])
    expected = ("cancelled", "completed") if stopped else ("completed",)
    if row.status and row.status not in expected:
        row.failure = row.status
    if row.first_visible is None and not row.failure:
        row.failure = "no text"
    return row


def after_turn(page, row: Row) -> None:
    info = page.evaluate(LAST_TURN)
    row.message_id = info["messageId"]
    row.answer = info["answer"]
    if "not saved" in info["note"] and not row.failure:
        row.failure = info["note"]


def main(argv: list[str] | None = None) -> int:
    parser = paced_parser(__doc__, turns=30, pause=(5.0, 10.0), floor_sample_help="floor turns (0: every input)")
    parser.add_argument("--screenshots", default="1,10,20,30", help="turns to screenshot after their answer")
    parser.add_argument("--headed", action="store_true")
    args = parser.parse_args(argv)
    terminate_on_sigterm()
    seed = args.seed if args.seed is not None else secrets.randbelow(10**6)
    rng = random.Random(seed)
    inputs = TurnSource(args.data, args.split, rng).conversation(args.turns, args.languages)
    pauses = [rng.uniform(*args.pause) for _ in inputs]
    floor_inputs = inputs
    if args.floor_sample and args.floor_sample < len(inputs):
        step = len(inputs) / args.floor_sample
        floor_inputs = [inputs[int(i * step)] for i in range(args.floor_sample)]
    shot_turns = {int(x) for x in args.screenshots.split(",") if x.strip().isdigit()}
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    prefix = f"browser-{stamp}"
    OUT.mkdir(parents=True, exist_ok=True)
    print(f"bench: browser conversation; seed {seed}; data {args.data} ({describe_split(args.split)}); "
          f"{args.turns} turns ({sum(1 for p in inputs if p.lang == 'en')} en, "
          f"{sum(1 for p in inputs if p.lang == 'zh')} zh) at {args.pause[0]:g}-{args.pause[1]:g} s pauses; "
          f"floor {len(floor_inputs)} fresh pages; settings: the product's own"
          f"{' + ' + ' '.join(args.env) if args.env else ''}; load {', '.join(f'{x:.2f}' for x in os.getloadavg())}",
          flush=True)
    floor: list[Row] = []
    rows: list[Row] = []
    shots: list[Path] = []
    interrupted = False
    tmp = Path(tempfile.mkdtemp(prefix="bench-browser-"))
    stack = Stack(tmp, skip=tuple(s for s in args.skip.split(",") if s), extra_env=parse_env(args.env))
    browser = None
    try:
        stack.start()
        print(f"bench: stack up at {stack.url}; {stack.describe()}", flush=True)
        browser = Browser(stack.url, args.headed)
        warm = browser.page()  # one unmeasured turn: the first page load and request after start
        run_turn(warm, floor_inputs[0].text, Row("warm-up", 0, "", ""), args.timeout, stop_after_first=True)
        warm.context.close()
        print(f"1. floor: {len(floor_inputs)} fresh pages", flush=True)
        for i, pt in enumerate(floor_inputs):
            page = browser.page()
            try:
                row = run_turn(page, pt.text, Row("floor", i + 1, pt.lang, pt.source), args.timeout,
                               stop_after_first=True)
            finally:
                page.context.close()
            floor.append(row)
            print(f"  floor {i + 1}/{len(floor_inputs)} [{pt.lang}]: first visible {fmt(row.first_visible)}"
                  f"{'  FAILED ' + row.failure if row.failure else ''}", flush=True)
            time.sleep(1.0)
        print(f"2. conversation: {len(inputs)} turns", flush=True)
        page = browser.page()
        for i, pt in enumerate(inputs):
            row = run_turn(page, pt.text, Row("conversation", i + 1, pt.lang, pt.source,
                                              pause_before=pauses[i - 1] if i else 0.0),
                           args.timeout, shots=shots, shot_prefix=prefix)
            rows.append(row)
            after_turn(page, row)
            if row.n in shot_turns or row.failure or (row.first_visible or 0) > TARGET_FIRST_MAX:
                if len(shots) < 12:
                    path = OUT / f"{prefix}-turn{row.n}.png"
                    page.screenshot(path=str(path))
                    shots.append(path)
                    row.screenshot = path.name
            print(f"  turn {row.n}/{len(inputs)} [{pt.lang}]: first visible {fmt(row.first_visible)}, "
                  f"end {fmt(row.end)}, {len(row.answer)} chars"
                  f"{'; shown: ' + ' | '.join(row.waits) if row.waits else ''}"
                  f"{'  FAILED ' + row.failure if row.failure else ''}", flush=True)
            page.wait_for_timeout(pauses[i] * 1000)
            row.shown_turn = page.evaluate(LAST_TURN)["shown"]
        try:
            stats = page.request.get(stack.url + "/api/chat/stats").json()
            by_id = {r.get("messageId"): r for r in stats.get("turns") or []}
            for row in rows:
                if row.message_id in by_id:
                    row.answer_tokens = by_id[row.message_id].get("completionTokens")
        except Exception as exc:  # noqa: BLE001 - the table still prints without tokens
            print(f"bench: stats not read ({type(exc).__name__})", flush=True)
        page.context.close()
    except KeyboardInterrupt:
        interrupted = True
        print("bench: interrupted; stopping the browser and the stack", flush=True)
    finally:
        if browser is not None:
            try:
                browser.close()
            except Exception:  # noqa: BLE001 - already gone
                pass
        stack.stop()
        if args.keep_logs is not None:
            args.keep_logs.mkdir(parents=True, exist_ok=True)
            for log in tmp.glob("*.log"):
                (args.keep_logs / log.name).write_bytes(log.read_bytes())
        shutil.rmtree(tmp, ignore_errors=True)
    for row, rep in zip(rows, repeats([r.answer for r in rows], args.dup_ratio), strict=True):
        if rep is not None:
            row.repeat_of, row.repeat_ratio = rows[rep[0]].n, round(rep[1], 3)
    ok = report(floor, rows, args)
    (OUT / f"{prefix}.json").write_text(json.dumps(
        {"seed": seed, "split": args.split, "args": {k: str(v) for k, v in vars(args).items()},
         "floor": [asdict(r) for r in floor], "rows": [asdict(r) for r in rows],
         "screenshots": [p.name for p in shots]}, ensure_ascii=False, indent=1))
    print(f"\nrows: {OUT / (prefix + '.json')}; screenshots: {len(shots)} in {OUT} ({prefix}-*.png)")
    print(f"overall: {'interrupted (incomplete)' if interrupted else verdict(ok)}")
    return 130 if interrupted else (0 if ok else 1)


def report(floor: list[Row], rows: list[Row], args) -> bool:
    print("\nturn  lang  first visible   end      tokens  status      shown#  repeat  waiting shown")
    for r in rows:
        shown = r.shown_turn or "-"
        flag = "" if shown in ("-", str(r.n)) else " (!)"
        print(f"{r.n:>4}  {r.lang:<4}  {fmt(r.first_visible):>12}  {fmt(r.end):>8}  {str(r.answer_tokens or '-'):>6}  "
              f"{(r.failure or r.status or '-')[:10]:<10}  {shown + flag:>6}  "
              f"{('#' + str(r.repeat_of)) if r.repeat_of else '-':>6}  {' | '.join(r.waits)[:60]}")
    first = [r.first_visible for r in rows if r.first_visible is not None]
    base = [r.first_visible for r in floor if r.first_visible is not None]
    ends = [r.end for r in rows if r.end is not None]
    tokens = [r.answer_tokens for r in rows if r.answer_tokens is not None]
    failed = [r for r in rows if r.failure]
    reps = [r for r in rows if r.repeat_of is not None]
    mismatched = [r for r in rows if r.shown_turn and r.shown_turn != str(r.n)]

    def ratio(a: float, b: float) -> str:
        return f"{a / b:.1f}x" if b > 0 else "-"
    ok_max = bool(first) and max(first) <= TARGET_FIRST_MAX and len(first) == len(rows)
    ok_end = bool(ends) and pct(ends, .95) <= TARGET_END_P95
    print("\nsummary (first visible answer text: Enter -> first text in the page)")
    print(f"  floor (fresh pages, quiet stack)   p50 {pct(base, .5):.2f} s  p95 {pct(base, .95):.2f} s  "
          f"max {max(base, default=0):.2f} s  ({len(base)} of {len(floor)})")
    print(f"  conversation                       p50 {pct(first, .5):.2f} s ({ratio(pct(first, .5), pct(base, .5))})  "
          f"p95 {pct(first, .95):.2f} s ({ratio(pct(first, .95), pct(base, .95))})  max {max(first, default=0):.2f} s "
          f"({ratio(max(first, default=0), max(base, default=0))})")
    print(f"  max first visible wait             {max(first, default=0):.2f} s   (target: no turn > "
          f"{TARGET_FIRST_MAX:.0f} s; {sum(1 for v in first if v > TARGET_FIRST_MAX)} over)  {verdict(ok_max)}")
    print(f"  answer end                         p50 {pct(ends, .5):.2f} s  p95 {pct(ends, .95):.2f} s  max "
          f"{max(ends, default=0):.2f} s   (target p95 <= {TARGET_END_P95:.0f} s)  {verdict(ok_end)}")
    print(f"  answer tokens                      p50 {pct(tokens, .5):.0f}  p95 {pct(tokens, .95):.0f}  "
          f"max {max(tokens, default=0)}")
    print(f"  failed turns                       {len(failed)}   (target 0)  {verdict(not failed)}"
          + ("  [" + "; ".join(f"#{r.n}: {r.failure}" for r in failed[:6]) + "]" if failed else ""))
    print(f"  answers repeating an earlier one   {len(reps)}   (similarity >= {args.dup_ratio}; target 0)  "
          f"{verdict(not reps)}" + ("  [" + "; ".join(f"#{r.n}~#{r.repeat_of} ({r.repeat_ratio})" for r in reps[:6])
                                    + "]" if reps else ""))
    print(f"  turn number shown != person's count {len(mismatched)}  (of {sum(1 for r in rows if r.shown_turn)} read)  "
          f"{verdict(not mismatched)}")
    echoes = [r for r in rows if similarity(r.answer, r.text) >= args.dup_ratio]
    print(f"  answers echoing the person's message {len(echoes)}  (no target: a person reads them as broken)"
          + ("  [" + ", ".join(f"#{r.n}" for r in echoes[:10]) + "]" if echoes else ""))
    waits = [r for r in rows if r.waits]
    print(f"  turns that showed a waiting message {len(waits)}: "
          + ("; ".join(f"#{r.n}: {r.waits[-1]}" for r in waits[:8]) or "none"))
    return ok_max and ok_end and not failed and not reps and not mismatched


if __name__ == "__main__":
    raise SystemExit(main())
