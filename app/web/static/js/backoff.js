// @ts-check
/**
 * Reconnection rules of the websocket (docs/contract.md: WebSocket `/ws/chat`, close codes): the back-off
 * delays, what a close code means, and the banner's words. No DOM access: unit tested in
 * tests/js/backoff.test.js.
 */

/** Delays between reconnection attempts, in ms; the last one repeats. */
export const BACKOFF_MS = Object.freeze([1000, 2000, 4000, 8000, 15000]);

/** The server closed an idle socket: reconnect when the person is back. */
export const CLOSE_IDLE = 4408;
/** The session, or the network address, has too many sockets open (other tabs): retry slowly. */
export const CLOSE_SESSION_LIMIT = 4429;
/** The network address opened too many sockets in the last minute: retry slowly. */
export const CLOSE_RATE_LIMITED = 4430;

/** What the banner says before its countdown after a limit closed the socket. */
export const LIMIT_NOTES = Object.freeze({
  [CLOSE_SESSION_LIMIT]: "Too many chats are open (other tabs, or others on your network).",
  [CLOSE_RATE_LIMITED]: "Too many new connections from your network.",
});

/**
 * The delay before reconnection attempt number `attempt` (0-based).
 * @param {number} attempt
 */
export function backoffDelay(attempt) {
  const i = Math.max(0, Math.min(Math.floor(attempt) || 0, BACKOFF_MS.length - 1));
  return BACKOFF_MS[i];
}

/**
 * What to do after the socket closed with `code`: "idle" (wait for the person, attempts start over),
 * else "retry" with the attempt count to continue from (4429 and 4430 jump to the slowest delay; 1013, 1011
 * and the rest keep the usual back-off), and the banner's note saying why ("" when none).
 * @param {number} code
 * @param {number} attempt
 * @returns {{action: "idle" | "retry", attempt: number, note: string}}
 */
export function afterClose(code, attempt) {
  if (code === CLOSE_IDLE) return { action: "idle", attempt: 0, note: "" };
  if (code === CLOSE_SESSION_LIMIT || code === CLOSE_RATE_LIMITED) {
    return { action: "retry", attempt: Math.max(attempt, BACKOFF_MS.length - 1), note: LIMIT_NOTES[code] };
  }
  return { action: "retry", attempt, note: "" };
}

/**
 * @typedef {object} ConnectionView
 * @property {boolean} wsOpen the socket is open
 * @property {boolean} lastFetchFailed the last GET /api/chat/thread failed
 * @property {number} reconnectAt when the next attempt starts (ms since the epoch), 0 when none is scheduled
 * @property {number} attempt attempts made since the socket was last open
 * @property {boolean} everConnected the socket was open at least once
 * @property {string} [note] why the server closed the socket (a limit), shown before the countdown
 */

/**
 * The connection banner: hidden, or the text it shows at time `now` (ms since the epoch).
 * @param {ConnectionView} c
 * @param {number} now
 * @returns {{hidden: boolean, text: string}}
 */
export function bannerState(c, now) {
  if (c.wsOpen && !c.lastFetchFailed) return { hidden: true, text: "" };
  if (c.wsOpen) return { hidden: false, text: "Can't load the conversation from the server." };
  if (!c.reconnectAt) return { hidden: true, text: "" };
  const secs = Math.max(0, Math.ceil((c.reconnectAt - now) / 1000));
  const unreachable = c.lastFetchFailed || c.attempt >= 2 || !c.everConnected;
  const base = c.note ? `${c.note} Reconnecting` : unreachable ? "Can't reach the server. Reconnecting" : "Reconnecting";
  return { hidden: false, text: secs > 0 ? `${base} in ${secs} s…` : `${base}…` };
}

/** How often the model banner re-checks /healthz, in ms: while the model is up, and while it is down. */
export const HEALTH_MS = Object.freeze({ up: 30000, down: 5000 });
