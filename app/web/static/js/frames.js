// @ts-check
/**
 * The websocket frames of docs/contract.md, section "WebSocket `/ws/chat`", as JSDoc types.
 * This module holds types only; the contract itself is docs/contract.md and is not copied here.
 * Unknown frame types are ignored by the page (turn.js: frameKind).
 */

/** Client to server: starts a turn. @typedef {{type: "message", id: string, text: string}} MessageFrame */
/** Client to server: cancels the turn in flight. @typedef {{type: "cancel"}} CancelFrame */
/** @typedef {MessageFrame | CancelFrame} ClientFrame */

/** @typedef {{type: "start", messageId: string}} StartFrame */
/** @typedef {{type: "delta", text: string}} DeltaFrame */
/**
 * Display only: a tool call of the turn.
 * @typedef {{type: "tool", name?: string, arguments?: unknown, result?: unknown,
 *            status?: "started" | "finished" | string, id?: string | number, callId?: string}} ToolFrame
 */
/** Display only: a stage of the turn. @typedef {{type: "progress", stage?: string, message?: string}} ProgressFrame */
/**
 * Before the first delta: what the turn waits behind (`for`: "model_busy", "another_turn", "reading" with
 * `percent`, or another reason with its `message`).
 * @typedef {{type: "waiting", for?: string, message?: string, percent?: number}} WaitingFrame
 */
/**
 * Compaction status; may also arrive between turns. A forget (from any tab of the session) is one with
 * `step: "forget"`, the turns' numbers and their message ids.
 * @typedef {{type: "memory", status?: "started" | "succeeded" | "failed" | string, message?: string,
 *            step?: string, forgottenTurns?: number[], messageIds?: unknown[]}} MemoryFrame
 */
/**
 * The end of a turn. `saved: false` (with a `reason`) when a completed or blocked turn was not written;
 * `turn`: the memory turn number of a written turn; `finish: "length"`: the answer ended at its token limit.
 * @typedef {{type: "done", status?: "completed" | "blocked" | "cancelled" | "failed" | "paused" | string,
 *            messageId?: string, saved?: boolean | "unknown",
 *            reason?: "thread_cleared" | "turn_forgotten" | "store_unavailable" | "rejected" | string, code?: string,
 *            turn?: number, finish?: "length" | string}} DoneFrame
 */
/** @typedef {{type: "error", code?: string, message?: string, retryAfter?: number}} ErrorFrame */
/**
 * Any frame the server sends (docs/contract.md: WebSocket `/ws/chat`).
 * @typedef {StartFrame | DeltaFrame | ToolFrame | ProgressFrame | WaitingFrame | MemoryFrame | DoneFrame | ErrorFrame} ServerFrame
 */

export {};
