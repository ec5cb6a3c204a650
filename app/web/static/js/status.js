// @ts-check
/**
 * Status rules of a turn and of a compaction, in one place (docs/contract.md: WebSocket `/ws/chat`,
 * "Memory after a turn"). No DOM access: unit tested in tests/js/status.test.js.
 */

/** The `done` statuses whose turn is written to memory (unless `done` says `"saved": false`). */
export const MEMORY_STATUSES = Object.freeze(["completed", "blocked"]);

/** Every `done` status the page knows; anything else is treated as "failed". */
export const DONE_STATUSES = Object.freeze([...MEMORY_STATUSES, "cancelled", "failed", "paused"]);

/** The outcomes a bubble can end with: the `done` statuses, plus the page's own two. */
export const OUTCOMES = Object.freeze([...DONE_STATUSES, "interrupted", "rejected"]);

/** Outcomes of a compaction history entry (GET /api/chat/stats: compactions). */
export const COMPACTION_OUTCOMES = Object.freeze(["applied", "stale", "failed"]);

/**
 * True when a turn that ended with `status` writes memory.
 * @param {unknown} status
 * @returns {boolean}
 */
export function writesMemory(status) {
  return typeof status === "string" && MEMORY_STATUSES.includes(status);
}

/**
 * The outcome of a turn from its `done` status: a known status as is, anything else "failed".
 * @param {unknown} status
 * @returns {string}
 */
export function doneOutcome(status) {
  return typeof status === "string" && DONE_STATUSES.includes(status) ? status : "failed";
}

/**
 * Why a finished turn was not written: `reason` of a `done` with `"saved": false` ("unknown" when it
 * has none), else "" (written, or nothing to write; `"saved": "unknown"` too: the page reads the thread
 * again after `done`, and shows the turn as memory holds it).
 * @param {{saved?: boolean | "unknown", reason?: unknown}} frame
 * @returns {string}
 */
export function unsavedReason(frame) {
  if (frame.saved !== false) return "";
  return typeof frame.reason === "string" && frame.reason ? frame.reason : "unknown";
}

/**
 * The note under an answer that was complete but not written.
 * @param {string} reason
 */
export function unsavedLabel(reason) {
  /** @type {Record<string, string>} */
  const labels = {
    thread_cleared: "not saved (new chat started)",
    turn_forgotten: "not saved (a turn was forgotten meanwhile)",
    store_unavailable: "not saved (memory unavailable)",
  };
  return labels[reason] || "not saved";
}

/**
 * The note under an answer whose turn wrote nothing (an outcome outside MEMORY_STATUSES).
 * @param {string} outcome
 */
export function unkeptLabel(outcome) {
  /** @type {Record<string, string>} */
  const labels = {
    cancelled: "stopped — not saved to memory",
    paused: "waiting for your confirmation — not saved yet", // a /tasklist run
    failed: "failed — not saved",
    interrupted: "interrupted — not saved",
    rejected: "not sent",
  };
  return labels[outcome] || "not saved";
}

/**
 * What a tool card still running becomes when its turn ends with `outcome`.
 * @param {string} outcome
 * @returns {"finished" | "stopped"}
 */
export function settledToolStatus(outcome) {
  return writesMemory(outcome) ? "finished" : "stopped";
}

/**
 * The memory hint of a `memory` frame: its text, its status and how long it stays.
 * "started" waits for its outcome, but not forever (the outcome frame can be missed on a reconnect).
 * @param {{status?: unknown, message?: unknown}} frame
 * @returns {{text: string, status: string, hideAfterMs: number, reload: "thread" | "stats" | ""}}
 */
export function memoryHint(frame) {
  const status = typeof frame.status === "string" ? frame.status : "";
  /** @type {Record<string, string>} */
  const defaults = {
    started: "Compacting memory…",
    succeeded: "Memory compacted",
    failed: "Memory compaction failed; it will be retried",
  };
  const text = (typeof frame.message === "string" && frame.message.trim()) || defaults[status] || "Memory updated";
  return {
    text,
    status: status || "info",
    hideAfterMs: status === "started" ? 90000 : 6000,
    reload: status === "succeeded" ? "thread" : status === "failed" ? "stats" : "",
  };
}

/**
 * A compaction entry's outcome, "unknown" when it is none of COMPACTION_OUTCOMES.
 * @param {unknown} outcome
 */
export function compactionOutcome(outcome) {
  return typeof outcome === "string" && COMPACTION_OUTCOMES.includes(outcome) ? outcome : "unknown";
}

/** The quiet note under an answer that ended at its token limit (`done` with `"finish": "length"`). */
export const LENGTH_NOTE = "reached the length limit";

/**
 * The note a `done` frame asks for under its answer: LENGTH_NOTE when the answer ended at its token limit
 * (it is complete and written as shown), else "".
 * @param {{finish?: unknown}} frame
 * @returns {string}
 */
export function finishNote(frame) {
  return frame && frame.finish === "length" ? LENGTH_NOTE : "";
}

/** Error codes after which the model banner checks /healthz often for a while. */
export const MODEL_ERROR_CODES = Object.freeze(["llm_unavailable", "upstream_truncated"]);
