// @ts-check
/**
 * The page's mutable state, one object per concern. The message bubbles keep their own facts in data
 * attributes (data-saved, data-kept, data-summarized, ...), which the browser tests read too.
 */

/**
 * The websocket (socket.js).
 * @type {{ws: WebSocket | null, open: boolean, everConnected: boolean, attempt: number, reconnectTimer: number,
 *         countdownTimer: number, reconnectAt: number, idle: boolean, note: string}}
 */
export const conn = {
  ws: null,
  open: false,
  everConnected: false,
  attempt: 0,
  reconnectTimer: 0,
  countdownTimer: 0,
  reconnectAt: 0,
  idle: false, // the server closed the socket as idle; reconnect when the person is back
  note: "", // why a limit closed the socket (backoff.js afterClose), shown in the banner until open again
};

/**
 * The turn in flight (turnview.js), null when none.
 * @typedef {import("./turn.js").TurnInfo & {clientId: string, text: string, userEl: HTMLElement,
 *   botEl: HTMLElement, stopping: boolean, stages: string[], waitTimer: number}} Turn
 * @type {{turn: Turn | null, rafPending: boolean, stickToBottom: boolean}}
 */
export const chat = { turn: null, rafPending: false, stickToBottom: true };

/**
 * What the page knows of server memory (memory.js).
 * @type {{serverIds: Set<string>, pins: string[], notes: string[], summary: string, sawStart: boolean | null,
 *         lastFetchFailed: boolean, feedback: Map<string, string>, folded: number, earliestKept: number | null}}
 */
export const memory = {
  serverIds: new Set(), // ids of messages known to be in server memory
  folded: 0, // person turns before the recent messages, best guess (turns.js foldedTurns)
  earliestKept: /** @type {number | null} */ (null), // hydration's earliestKeptTurn
  pins: [],
  notes: [],
  summary: "",
  sawStart: null, // true when this page has shown the thread from its first message (no summary before it)
  lastFetchFailed: false,
  feedback: new Map(), // messageId -> "up" | "down"
};

/** Sequence numbers of loads: an answer to an older load than the newest is dropped (memory.js). */
export const seq = { thread: 0, messages: 0, stats: 0 };

/** The model banner's checks (health.js). */
export const health = { timer: 0, checksSoon: 0 }; // checksSoon: /healthz checks still to make at the short interval
