// Reconnection rules of app/web/static/js/backoff.js (docs/contract.md: WebSocket `/ws/chat`, close codes).
import { test } from "node:test";
import assert from "node:assert/strict";
import {
  afterClose, backoffDelay, bannerState, BACKOFF_MS, CLOSE_IDLE, CLOSE_RATE_LIMITED, CLOSE_SESSION_LIMIT, HEALTH_MS,
  LIMIT_NOTES,
} from "../../app/web/static/js/backoff.js";

test("the delay doubles up to 8 s, then stays at 15 s", () => {
  assert.deepEqual([0, 1, 2, 3, 4, 5, 50].map(backoffDelay), [1000, 2000, 4000, 8000, 15000, 15000, 15000]);
  assert.equal(backoffDelay(-3), 1000);
  assert.equal(backoffDelay(NaN), 1000);
});

test("close codes: idle waits for the person, 4429 and 4430 retry slowly and say why, the rest keep the back-off", () => {
  assert.equal(CLOSE_IDLE, 4408);
  assert.equal(CLOSE_SESSION_LIMIT, 4429);
  assert.equal(CLOSE_RATE_LIMITED, 4430);
  assert.deepEqual(afterClose(4408, 3), { action: "idle", attempt: 0, note: "" });
  assert.deepEqual(afterClose(4429, 0), { action: "retry", attempt: BACKOFF_MS.length - 1, note: LIMIT_NOTES[4429] });
  assert.equal(backoffDelay(afterClose(4429, 0).attempt), 15000);
  assert.deepEqual(afterClose(4429, 9), { action: "retry", attempt: 9, note: LIMIT_NOTES[4429] });
  assert.deepEqual(afterClose(4430, 1), { action: "retry", attempt: BACKOFF_MS.length - 1, note: LIMIT_NOTES[4430] });
  assert.deepEqual(afterClose(1013, 2), { action: "retry", attempt: 2, note: "" });
  assert.deepEqual(afterClose(1011, 0), { action: "retry", attempt: 0, note: "" });
});

test("the banner says which limit closed the socket before its countdown", () => {
  assert.deepEqual(bannerState(view({ reconnectAt: 15000, attempt: 4, note: LIMIT_NOTES[4430] }), 3000),
    { hidden: false, text: "Too many new connections from your network. Reconnecting in 12 s…" });
});

const view = (over = {}) => ({ wsOpen: false, lastFetchFailed: false, reconnectAt: 0, attempt: 0, everConnected: true, ...over });

test("the banner: hidden while connected, the countdown while reconnecting", () => {
  assert.deepEqual(bannerState(view({ wsOpen: true }), 0), { hidden: true, text: "" });
  assert.deepEqual(bannerState(view({ wsOpen: true, lastFetchFailed: true }), 0),
    { hidden: false, text: "Can't load the conversation from the server." });
  assert.deepEqual(bannerState(view(), 0), { hidden: true, text: "" });
  assert.deepEqual(bannerState(view({ reconnectAt: 5000, attempt: 1 }), 2100), { hidden: false, text: "Reconnecting in 3 s…" });
  assert.deepEqual(bannerState(view({ reconnectAt: 5000, attempt: 2 }), 5000),
    { hidden: false, text: "Can't reach the server. Reconnecting…" });
  assert.deepEqual(bannerState(view({ reconnectAt: 5000, everConnected: false }), 4001),
    { hidden: false, text: "Can't reach the server. Reconnecting in 1 s…" });
});

test("the model banner checks every 30 s, every 5 s while down", () => {
  assert.deepEqual({ ...HEALTH_MS }, { up: 30000, down: 5000 });
});
