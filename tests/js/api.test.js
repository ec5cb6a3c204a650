// The JSON error shape of app/web/static/js/api.js (docs/contract.md: HTTP), against a stand-in fetch.
import { test, afterEach } from "node:test";
import assert from "node:assert/strict";
import { api, errorMessage } from "../../app/web/static/js/api.js";

const realFetch = globalThis.fetch;
afterEach(() => { globalThis.fetch = realFetch; });

test("a failure shows the error body's message, else names the status", () => {
  assert.equal(errorMessage({ error: { code: "pin_limit", message: "At most 20 pins." } }, 409), "At most 20 pins.");
  assert.equal(errorMessage({ error: { code: "x" } }, 500), "The server answered 500.");
  assert.equal(errorMessage(null, 404), "The server answered 404.");
});

test("api sends JSON with cookies and reads the answer", async () => {
  const calls = [];
  globalThis.fetch = async (url, init) => {
    calls.push([url, init]);
    return new Response(JSON.stringify({ pinnedDecisions: ["a"] }), { status: 201 });
  };
  const r = await api("POST", "/api/chat/pins", { text: "a" });
  assert.deepEqual(r, { ok: true, status: 201, data: { pinnedDecisions: ["a"] }, message: "", unknown: false });
  const [url, init] = calls[0];
  assert.equal(url, "/api/chat/pins");
  assert.equal(init.credentials, "same-origin");
  assert.equal(init.headers["Content-Type"], "application/json");
  assert.equal(init.body, '{"text":"a"}');
});

test("api: an error body, a 204, an unreachable server", async () => {
  globalThis.fetch = async () => new Response(JSON.stringify({ error: { code: "thread_cleared", message: "Cleared." } }), { status: 409 });
  assert.deepEqual(await api("DELETE", "/api/chat/pins/1"),
    { ok: false, status: 409, data: { error: { code: "thread_cleared", message: "Cleared." } }, message: "Cleared.", unknown: false });
  globalThis.fetch = async () => new Response(null, { status: 204 });
  assert.deepEqual(await api("DELETE", "/api/chat/thread"), { ok: true, status: 204, data: null, message: "", unknown: false });
  globalThis.fetch = async () => new Response("<html>", { status: 502 });
  assert.deepEqual(await api("GET", "/api/chat/stats"), { ok: false, status: 502, data: null, message: "The server answered 502.", unknown: false });
  globalThis.fetch = async () => { throw new TypeError("network"); };
  assert.deepEqual(await api("GET", "/healthz"), { ok: false, status: 0, data: null, message: "Can't reach the server.", unknown: false });
});

test("api: a 202 outcome unknown is neither done nor failed, and says so", async () => {
  const body = { outcome: "unknown", message: "The change may or may not have been made; checking again…" };
  globalThis.fetch = async () => new Response(JSON.stringify(body), { status: 202 });
  assert.deepEqual(await api("DELETE", "/api/chat/turns/3"),
    { ok: false, status: 202, data: body, message: body.message, unknown: true });
  globalThis.fetch = async () => new Response(JSON.stringify({ accepted: true }), { status: 202 });
  assert.equal((await api("POST", "/api/chat/x")).unknown, false);
});
