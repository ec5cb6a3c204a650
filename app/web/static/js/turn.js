// @ts-check
/**
 * The decisions of a turn: what each websocket frame does to the turn in flight, and how the turn ends
 * (docs/contract.md: WebSocket `/ws/chat`). No DOM access: unit tested in tests/js/turn.test.js;
 * turnview.js applies the decisions to the page.
 */
import { doneOutcome, finishNote, MODEL_ERROR_CODES, unsavedReason, writesMemory } from "./status.js";
import { str } from "./format.js";
import { doneTurn } from "./turns.js";

/** @typedef {import("./frames.js").ServerFrame} ServerFrame */
/** @typedef {import("./frames.js").DoneFrame} DoneFrame */
/** @typedef {import("./frames.js").ErrorFrame} ErrorFrame */
/** @typedef {import("./frames.js").ToolFrame} ToolFrame */
/** @typedef {import("./frames.js").WaitingFrame} WaitingFrame */

/** A turn without its first token says what it waits for after this long (ms). */
export const WAIT_NOTICE_MS = 1500;

/** The frame types the page acts on; any other is ignored. */
export const FRAME_TYPES = Object.freeze(["start", "delta", "tool", "progress", "waiting", "memory", "done", "error"]);

/**
 * The turn in flight, as the decisions see it (turnview.js adds its elements).
 * @typedef {object} TurnInfo
 * @property {string} messageId the assistant message id, from `start` ("" before it)
 * @property {boolean} started a `start` frame arrived
 * @property {string} answer the text streamed so far
 * @property {number} sentAt when the message was sent (ms since the epoch)
 * @property {string} [waitFor] what the server said the turn waits for (`waiting.for`)
 * @property {string} [waitReason] the words for it
 * @property {number} [waitPercent] how much of the prompt the model has read (`reading`), 0-99
 */

/**
 * A websocket message's data as a frame: a JSON object of a known type, else null (ignored).
 * @param {unknown} data
 * @returns {ServerFrame | null}
 */
export function parseFrame(data) {
  if (typeof data !== "string") return null;
  let frame;
  try { frame = JSON.parse(data); } catch { return null; }
  if (!frame || typeof frame !== "object" || Array.isArray(frame)) return null;
  if (!FRAME_TYPES.includes(frame.type)) return null;
  return frame;
}

/**
 * Whether a `done` frame ends the turn in flight: it names no message, or the turn has no id yet, or
 * it names this turn's message.
 * @param {DoneFrame} frame
 * @param {TurnInfo | null} turn
 */
export function doneEndsTurn(frame, turn) {
  return Boolean(turn && (!frame.messageId || !turn.messageId || frame.messageId === turn.messageId));
}

/**
 * What a `done` frame does: the outcome to end the turn in flight with (null: no turn of this page),
 * why it was not written ("" when written or not meant to be), what to reload: "thread" (the
 * conversation and the stats: memory now holds the turn) or "memory" (the panel only), the memory turn
 * number the turn took (0: none, it was not written) and the quiet note under the answer ("" or
 * status.js LENGTH_NOTE).
 * @param {DoneFrame} frame
 * @param {TurnInfo | null} turn
 * @returns {{end: string | null, unsaved: string, reload: "thread" | "memory", turn: number, note: string}}
 */
export function doneDecision(frame, turn) {
  const status = str(frame.status);
  const unsaved = unsavedReason(frame);
  const written = writesMemory(status) && !unsaved;
  return {
    end: doneEndsTurn(frame, turn) ? doneOutcome(status) : null,
    unsaved,
    reload: written ? "thread" : "memory",
    turn: written ? doneTurn(frame) : 0,
    note: writesMemory(status) ? finishNote(frame) : "",
  };
}

/**
 * What an `error` frame does: the message to show, whether it rejects the turn in flight (the server
 * refused the message before the turn began), whether the model's health is checked soon, and after how
 * many ms the refused message may be sent again by itself (`rate_limited` with `retryAfter` seconds, at
 * most RETRY_AFTER_MAX_S; 0: never).
 * @param {ErrorFrame} frame
 * @param {TurnInfo | null} turn
 * @returns {{message: string, reject: boolean, checkModel: boolean, resendAfterMs: number}}
 */
export function errorDecision(frame, turn) {
  const reject = Boolean(turn && !turn.started);
  const wait = typeof frame.retryAfter === "number" ? frame.retryAfter : 0;
  const resend = reject && frame.code === "rate_limited" && wait > 0 && wait <= RETRY_AFTER_MAX_S;
  return {
    message: typeof frame.message === "string" && frame.message ? frame.message : "Something went wrong.",
    reject,
    checkModel: typeof frame.code === "string" && MODEL_ERROR_CODES.includes(frame.code),
    resendAfterMs: resend ? wait * 1000 : 0,
  };
}

/** The longest `retryAfter` (seconds) after which the page sends a refused message again by itself. */
export const RETRY_AFTER_MAX_S = 120;

/** The words of each `waiting.for` the page knows (docs/contract.md: the waiting frame). */
const WAIT_REASONS = Object.freeze({
  model_busy: "it is answering another message first",
  another_turn: "it is answering another visitor first",
  reading: "reading the conversation again",
});

/**
 * What a `waiting` frame says the turn waits for, the words for it and, while the model reads the
 * prompt (`reading`), the percent read (0-99; 0 when not told).
 * @param {WaitingFrame} frame
 * @returns {{waitFor: string, waitReason: string, waitPercent: number}}
 */
export function waitingInfo(frame) {
  const waitFor = str(frame.for) || "model";
  const known = /** @type {Record<string, string>} */ (WAIT_REASONS)[waitFor];
  const percent = typeof frame.percent === "number" && Number.isFinite(frame.percent)
    ? Math.max(0, Math.min(99, Math.floor(frame.percent))) : 0;
  return { waitFor, waitReason: known || str(frame.message), waitPercent: waitFor === "reading" ? percent : 0 };
}

/**
 * The waiting note of a turn without answer text at time `now`, or null while none is due
 * (before WAIT_NOTICE_MS, unless the server said what it waits for; never once text arrived). It names
 * the reason and the seconds since the message was sent: "waiting for the model… 4 s — it is answering
 * another visitor first", "reading the conversation again… 40 % · 12 s".
 * @param {TurnInfo} turn
 * @param {number} now
 * @returns {string | null}
 */
export function waitingText(turn, now) {
  if (turn.answer) return null;
  const ms = now - turn.sentAt;
  if (ms < WAIT_NOTICE_MS && !turn.waitReason) return null;
  const seconds = `${Math.floor(Math.max(ms, 0) / 1000)} s`;
  if (turn.waitFor === "reading") {
    const percent = turn.waitPercent ? `${turn.waitPercent} % · ` : "";
    return `${WAIT_REASONS.reading}… ${percent}${seconds}`;
  }
  const reason = turn.waitReason ? ` — ${turn.waitReason}` : "";
  return `waiting for the model… ${seconds}${reason}`;
}

/**
 * A `tool` frame's name, status and call id, and its status's words on the card.
 * @param {ToolFrame} frame
 * @returns {{name: string, status: string, callId: string, label: string}}
 */
export function toolInfo(frame) {
  const name = typeof frame.name === "string" && frame.name ? frame.name : "tool";
  const status = frame.status === "finished" ? "finished" : frame.status === "started" ? "started"
    : str(frame.status) || "started";
  const callId = typeof frame.id === "string" || typeof frame.id === "number" ? String(frame.id)
    : typeof frame.callId === "string" ? frame.callId : "";
  return { name, status, callId, label: toolStatusLabel(status) };
}

/**
 * A tool card's status in words.
 * @param {string} status
 */
export function toolStatusLabel(status) {
  return status === "started" ? "running…" : status === "finished" ? "done" : status;
}

/**
 * The stage of a `progress` frame ("working" when it names none).
 * @param {{stage?: unknown}} frame
 */
export function progressStage(frame) {
  return typeof frame.stage === "string" && frame.stage ? frame.stage : "working";
}

/**
 * How a settled turn is shown: "unsaved" (complete, not written), "kept" (written) or "unkept" (nothing
 * written: stopped, failed, paused, interrupted, rejected).
 * @param {string} outcome
 * @param {string} unsaved
 * @returns {"unsaved" | "kept" | "unkept"}
 */
export function endKind(outcome, unsaved) {
  if (!writesMemory(outcome)) return "unkept";
  return unsaved ? "unsaved" : "kept";
}
