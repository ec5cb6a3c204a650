// The status rules of app/web/static/js/status.js (docs/contract.md: WebSocket `/ws/chat`, "Memory after a turn").
import { test } from "node:test";
import assert from "node:assert/strict";
import {
  compactionOutcome, DONE_STATUSES, doneOutcome, finishNote, LENGTH_NOTE, MEMORY_STATUSES, memoryHint, settledToolStatus, unkeptLabel,
  unsavedLabel, unsavedReason, writesMemory,
} from "../../app/web/static/js/status.js";

test("only completed and blocked turns write memory", () => {
  assert.deepEqual([...MEMORY_STATUSES], ["completed", "blocked"]);
  assert.deepEqual(DONE_STATUSES.filter(writesMemory), ["completed", "blocked"]);
  for (const s of ["cancelled", "failed", "paused", "interrupted", "rejected", "", undefined, null, 1]) {
    assert.equal(writesMemory(s), false, String(s));
  }
});

test("an unknown done status ends the turn as failed", () => {
  assert.equal(doneOutcome("completed"), "completed");
  assert.equal(doneOutcome("paused"), "paused");
  assert.equal(doneOutcome("exploded"), "failed");
  assert.equal(doneOutcome(undefined), "failed");
});

test("saved: false gives its reason, or unknown; otherwise nothing is unsaved", () => {
  assert.equal(unsavedReason({ saved: false, reason: "thread_cleared" }), "thread_cleared");
  assert.equal(unsavedReason({ saved: false }), "unknown");
  assert.equal(unsavedReason({ saved: false, reason: "" }), "unknown");
  assert.equal(unsavedReason({ reason: "thread_cleared" }), "");
  assert.equal(unsavedReason({ saved: true, reason: "store_unavailable" }), "");
});

test("labels of answers not kept", () => {
  assert.equal(unsavedLabel("thread_cleared"), "not saved (new chat started)");
  assert.equal(unsavedLabel("store_unavailable"), "not saved (memory unavailable)");
  assert.equal(unsavedLabel("turn_forgotten"), "not saved (a turn was forgotten meanwhile)");
  assert.equal(unsavedLabel("rejected"), "not saved");
  assert.equal(unkeptLabel("cancelled"), "stopped — not saved to memory");
  assert.equal(unkeptLabel("interrupted"), "interrupted — not saved");
  assert.equal(unkeptLabel("rejected"), "not sent");
  assert.equal(unkeptLabel("whatever"), "not saved");
});

test("a running tool card is finished by a kept turn and stopped by any other", () => {
  assert.equal(settledToolStatus("completed"), "finished");
  assert.equal(settledToolStatus("blocked"), "finished");
  assert.equal(settledToolStatus("cancelled"), "stopped");
  assert.equal(settledToolStatus("interrupted"), "stopped");
});

test("memory hints: default words, the server's message, how long they stay, what they reload", () => {
  assert.deepEqual(memoryHint({ status: "started" }),
    { text: "Compacting memory…", status: "started", hideAfterMs: 90000, reload: "" });
  assert.deepEqual(memoryHint({ status: "succeeded", message: "  Folded 3 turns " }),
    { text: "Folded 3 turns", status: "succeeded", hideAfterMs: 6000, reload: "thread" });
  assert.deepEqual(memoryHint({ status: "failed", message: "   " }),
    { text: "Memory compaction failed; it will be retried", status: "failed", hideAfterMs: 6000, reload: "stats" });
  assert.deepEqual(memoryHint({}), { text: "Memory updated", status: "info", hideAfterMs: 6000, reload: "" });
});

test("compaction outcomes outside the contract are unknown", () => {
  assert.equal(compactionOutcome("applied"), "applied");
  assert.equal(compactionOutcome("stale"), "stale");
  assert.equal(compactionOutcome("exploded"), "unknown");
  assert.equal(compactionOutcome(undefined), "unknown");
});

test("an answer that ended at its token limit gets a quiet note", () => {
  assert.equal(finishNote({ finish: "length" }), LENGTH_NOTE);
  assert.equal(LENGTH_NOTE, "reached the length limit");
  assert.equal(finishNote({ finish: "stop" }), "");
  assert.equal(finishNote({}), "");
});
