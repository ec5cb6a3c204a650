// Frame handling decisions of app/web/static/js/turn.js (docs/contract.md: WebSocket `/ws/chat`).
import { test } from "node:test";
import assert from "node:assert/strict";
import {
  doneDecision, doneEndsTurn, endKind, errorDecision, parseFrame, progressStage, RETRY_AFTER_MAX_S, toolInfo,
  WAIT_NOTICE_MS,
  waitingInfo, waitingText,
} from "../../app/web/static/js/turn.js";

const turn = (over = {}) => ({ messageId: "m1", started: true, answer: "", sentAt: 10_000, ...over });

test("parseFrame keeps JSON objects of known types and drops the rest", () => {
  assert.deepEqual(parseFrame('{"type":"delta","text":"hi"}'), { type: "delta", text: "hi" });
  assert.equal(parseFrame('{"type":"mystery"}'), null);
  assert.equal(parseFrame("not json"), null);
  assert.equal(parseFrame("[1,2]"), null);
  assert.equal(parseFrame("null"), null);
  assert.equal(parseFrame('"start"'), null);
  assert.equal(parseFrame(new ArrayBuffer(2)), null);
});

test("done ends the turn in flight unless it names another message", () => {
  assert.equal(doneEndsTurn({ type: "done", messageId: "m1" }, turn()), true);
  assert.equal(doneEndsTurn({ type: "done" }, turn()), true);
  assert.equal(doneEndsTurn({ type: "done", messageId: "m2" }, turn({ messageId: "" })), true);
  assert.equal(doneEndsTurn({ type: "done", messageId: "m2" }, turn()), false);
  assert.equal(doneEndsTurn({ type: "done", messageId: "m1" }, null), false);
});

test("a written done reloads the conversation; anything else only the panel", () => {
  const none = { turn: 0, note: "" };
  assert.deepEqual(doneDecision({ type: "done", status: "completed", messageId: "m1" }, turn()),
    { end: "completed", unsaved: "", reload: "thread", ...none });
  assert.deepEqual(doneDecision({ type: "done", status: "blocked", messageId: "m1" }, turn()),
    { end: "blocked", unsaved: "", reload: "thread", ...none });
  assert.deepEqual(doneDecision({ type: "done", status: "completed", saved: false, reason: "thread_cleared" }, turn()),
    { end: "completed", unsaved: "thread_cleared", reload: "memory", ...none });
  assert.deepEqual(doneDecision({ type: "done", status: "cancelled" }, turn()),
    { end: "cancelled", unsaved: "", reload: "memory", ...none });
  assert.deepEqual(doneDecision({ type: "done", status: "weird" }, turn()),
    { end: "failed", unsaved: "", reload: "memory", ...none });
  assert.deepEqual(doneDecision({ type: "done", status: "completed", messageId: "other" }, turn()),
    { end: null, unsaved: "", reload: "thread", ...none });
  assert.deepEqual(doneDecision({ type: "done", status: "completed" }, null),
    { end: null, unsaved: "", reload: "thread", ...none });
});

test("done tells the memory turn number of a written turn only, and the length note of a complete answer", () => {
  assert.deepEqual(doneDecision({ type: "done", status: "completed", messageId: "m1", turn: 4 }, turn()),
    { end: "completed", unsaved: "", reload: "thread", turn: 4, note: "" });
  assert.deepEqual(doneDecision({ type: "done", status: "completed", turn: 5, finish: "length" }, turn()),
    { end: "completed", unsaved: "", reload: "thread", turn: 5, note: "reached the length limit" });
  // not written: no number, whatever the frame says; the answer was still complete at its limit
  assert.deepEqual(doneDecision({ type: "done", status: "completed", saved: false, reason: "store_unavailable",
    turn: 5, finish: "length" }, turn()),
  { end: "completed", unsaved: "store_unavailable", reload: "memory", turn: 0, note: "reached the length limit" });
  assert.deepEqual(doneDecision({ type: "done", status: "failed", code: "llm_unavailable", turn: 3 }, turn()),
    { end: "failed", unsaved: "", reload: "memory", turn: 0, note: "" });
  for (const bad of [0, -1, 2.5, "3", null]) {
    assert.equal(doneDecision({ type: "done", status: "completed", turn: bad }, turn()).turn, 0);
  }
});

test("an error before start rejects the turn; model errors check health", () => {
  assert.deepEqual(errorDecision({ type: "error", code: "input_too_long", message: "Too long." }, turn({ started: false })),
    { message: "Too long.", reject: true, checkModel: false, resendAfterMs: 0 });
  assert.deepEqual(errorDecision({ type: "error", code: "llm_unavailable", message: "" }, turn()),
    { message: "Something went wrong.", reject: false, checkModel: true, resendAfterMs: 0 });
  assert.deepEqual(errorDecision({ type: "error", code: "upstream_truncated" }, null),
    { message: "Something went wrong.", reject: false, checkModel: true, resendAfterMs: 0 });
});

test("a rate-limited message is sent again after retryAfter seconds, within bounds", () => {
  const refused = (over) => errorDecision({ type: "error", code: "rate_limited", message: "Wait.", ...over },
    turn({ started: false }));
  assert.equal(refused({ retryAfter: 12 }).resendAfterMs, 12_000);
  assert.equal(refused({ retryAfter: RETRY_AFTER_MAX_S + 1 }).resendAfterMs, 0);
  assert.equal(refused({ retryAfter: "12" }).resendAfterMs, 0);
  assert.equal(refused({}).resendAfterMs, 0);
  assert.equal(errorDecision({ type: "error", code: "store_full", retryAfter: 5 }, turn({ started: false })).resendAfterMs, 0);
});

test("the waiting note: due after WAIT_NOTICE_MS, at once when the server said why, never with text", () => {
  assert.equal(WAIT_NOTICE_MS, 1500);
  assert.equal(waitingText(turn(), 10_000 + 1499), null);
  assert.equal(waitingText(turn(), 10_000 + 1500), "waiting for the model… 1 s");
  assert.equal(waitingText(turn(), 10_000 + 4999), "waiting for the model… 4 s");
  const busy = turn({ ...waitingInfo({ type: "waiting", for: "model_busy", message: "ignored" }) });
  assert.equal(busy.waitFor, "model_busy");
  assert.equal(waitingText(busy, 10_200), "waiting for the model… 0 s — it is answering another message first");
  assert.equal(waitingText(turn({ answer: "Hel" }), 20_000), null);
  assert.deepEqual(waitingInfo({ type: "waiting", message: "queue" }),
    { waitFor: "model", waitReason: "queue", waitPercent: 0 });
});

test("the waiting note names why: another visitor's turn, or reading the conversation with its percent", () => {
  const other = turn(waitingInfo({ type: "waiting", for: "another_turn", message: "The model is answering another visitor first." }));
  assert.equal(waitingText(other, 10_000 + 7_400), "waiting for the model… 7 s — it is answering another visitor first");
  const reading = (percent) => turn(waitingInfo({ type: "waiting", for: "reading", message: "Reading…", percent }));
  assert.equal(waitingText(reading(40), 10_000 + 12_900), "reading the conversation again… 40 % · 12 s");
  assert.equal(waitingText(reading(0), 10_000 + 3_000), "reading the conversation again… 3 s"); // 0 %: not told
  assert.equal(waitingText(reading(250), 10_000), "reading the conversation again… 99 % · 0 s");
  assert.equal(waitingText(reading("40"), 10_000), "reading the conversation again… 0 s");
  assert.equal(waitingText({ ...reading(40), answer: "Hi" }, 20_000), null);
  // a later reason replaces the earlier one
  const t = turn(waitingInfo({ type: "waiting", for: "another_turn" }));
  Object.assign(t, waitingInfo({ type: "waiting", for: "reading", percent: 10 }));
  assert.equal(waitingText(t, 12_000), "reading the conversation again… 10 % · 2 s");
});

test("tool frames: name, status, call id and the card's words", () => {
  assert.deepEqual(toolInfo({ type: "tool", name: "search", status: "started", id: 7 }),
    { name: "search", status: "started", callId: "7", label: "running…" });
  assert.deepEqual(toolInfo({ type: "tool", status: "finished", callId: "c1" }),
    { name: "tool", status: "finished", callId: "c1", label: "done" });
  assert.deepEqual(toolInfo({ type: "tool", name: "calc", status: "errored" }),
    { name: "calc", status: "errored", callId: "", label: "errored" });
  assert.deepEqual(toolInfo({ type: "tool", name: "" }), { name: "tool", status: "started", callId: "", label: "running…" });
});

test("progress stages and how a turn is shown at its end", () => {
  assert.equal(progressStage({ stage: "recall" }), "recall");
  assert.equal(progressStage({ stage: "" }), "working");
  assert.equal(progressStage({}), "working");
  assert.equal(endKind("completed", ""), "kept");
  assert.equal(endKind("blocked", "store_unavailable"), "unsaved");
  assert.equal(endKind("cancelled", ""), "unkept");
  assert.equal(endKind("failed", "thread_cleared"), "unkept");
});
