// Formatting of app/web/static/js/format.js.
import { test } from "node:test";
import assert from "node:assert/strict";
import {
  charLength, compactionText, display, escapeHtml, factsText, fmt, fmtMs, fmtTime, num, pinText, promptBudget, str,
  summaryPreview,
} from "../../app/web/static/js/format.js";

test("numbers and strings", () => {
  assert.equal(num(3.5), 3.5);
  assert.equal(num(Infinity), 0);
  assert.equal(num("4"), 0);
  assert.equal(fmt(1234.6), new Intl.NumberFormat().format(1235));
  assert.equal(fmt(undefined), "0");
  assert.equal(str(5), "");
  assert.equal(str("x"), "x");
});

test("length in code points, as Python counts", () => {
  assert.equal(charLength("abc"), 3);
  assert.equal(charLength("🚆里"), 2);
  assert.equal("🚆里".length, 3);
});

test("durations and times", () => {
  assert.equal(fmtMs(850.4), "850\u00a0ms");
  assert.equal(fmtMs(2500), "2.5\u00a0s");
  assert.equal(fmtMs(null), "–");
  assert.equal(fmtTime("not a date"), "");
  assert.notEqual(fmtTime("2026-12-03T10:05:00Z"), "");
  assert.ok(fmtTime("2026-12-03T10:05:00Z", true).length > fmtTime("2026-12-03T10:05:00Z").length);
});

test("display pretty-prints JSON and bounds long text", () => {
  assert.equal(display('{"a":1}'), '{\n  "a": 1\n}');
  assert.equal(display("plain"), "plain");
  assert.equal(display({ b: [1] }), '{\n  "b": [\n    1\n  ]\n}');
  assert.equal(display(undefined), "");
  assert.equal(display("x".repeat(10), 4), "xxxx\n… (truncated)");
});

test("escapeHtml, pins, the summary's preview, the budget", () => {
  assert.equal(escapeHtml(`<a href="x">'&'</a>`), "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;");
  assert.equal(pinText("Use Redis"), "Use Redis");
  assert.equal(pinText({ text: "From object" }), "From object");
  assert.equal(pinText({ nope: 1 }), "");
  assert.equal(summaryPreview("Intro\n- first fact\n- second"), "first fact");
  assert.equal(summaryPreview("\n  only prose\n"), "  only prose");
  assert.equal(summaryPreview("- " + "y".repeat(200)).length, 120);
  assert.equal(promptBudget({ budget: 7168 }), 7168);
  assert.equal(promptBudget({ contextTokens: 8192, reservedOutputTokens: 1024 }), 7168);
});

test("facts and compaction entries", () => {
  assert.equal(factsText({ factsChecked: 21, factsDropped: 0, factsSkipped: 1 }), "21 facts checked: 20 kept, 1 only in an answer");
  assert.equal(factsText({ factsChecked: 1 }), "1 fact checked: 1 kept");
  assert.equal(factsText({ factsChecked: 5, factsDropped: 2, factsSkipped: 2 }),
    "5 facts checked: 1 kept, 2 let go to fit, 2 only in answers");
  assert.deepEqual(compactionText({ turnsFolded: 1, tokensBefore: 900, tokensAfter: 300, durationMs: 1200, reason: "llm" }, "applied"),
    { badge: "applied · with the model's gist", detail: "1 turn folded · 900 → 300 tokens · 1.2\u00a0s" });
  assert.deepEqual(compactionText({ turnsFolded: 4, durationMs: 30, reason: "timeout" }, "failed"),
    { badge: "failed · timeout", detail: "4 turns to fold, none folded · 30\u00a0ms" });
  assert.deepEqual(compactionText({ turnsFolded: 4, durationMs: 30 }, "stale"),
    { badge: "discarded", detail: "discarded: the thread changed meanwhile · 30\u00a0ms" });
});

test("a compaction whose fold made the archive drop turns says which", () => {
  const { detail } = compactionText({ turnsFolded: 2, durationMs: 10, droppedTurns: [1, 12] }, "applied");
  assert.ok(detail.includes("turns 1–12 are no longer kept"), detail);
  assert.ok(compactionText({ turnsFolded: 1, durationMs: 10, droppedTurns: [4, 4] }, "applied").detail.includes("turn 4 is no longer kept"));
  assert.ok(!compactionText({ turnsFolded: 1, durationMs: 10, droppedTurns: "x" }, "applied").detail.includes("kept"));
});

test("a forget's history entry names its turn, and no figure stands for an absent duration", () => {
  const entry = { at: 1, outcome: "applied", reason: "forgotten", step: "forget", forgottenTurn: 14 };
  assert.deepEqual(compactionText(entry, "applied"), { badge: "applied · forgotten", detail: "turn 14 forgotten" });
  assert.ok(!compactionText({ turnsFolded: 1 }, "applied").detail.includes("–"));
  assert.ok(!compactionText({ ...entry, forgottenTurn: "14" }, "applied").detail.includes("turn"));
});
