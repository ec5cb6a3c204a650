// @ts-check
/**
 * The chat websocket (docs/contract.md: WebSocket `/ws/chat`): connect, reconnect with back-off
 * (backoff.js), come back after an idle close, send frames. What a frame, an open or a close does is
 * given by main.js (setSocketHooks), so this module knows nothing of turns or memory.
 */
import { API, WS_URL } from "./config.js";
import { conn } from "./state.js";
import { el } from "./dom.js";
import { afterClose, backoffDelay } from "./backoff.js";
import { setConnection, updateBanner } from "./connection.js";
import { parseFrame } from "./turn.js";

/** @typedef {import("./frames.js").ServerFrame} ServerFrame */
/** @typedef {import("./frames.js").ClientFrame} ClientFrame */

/**
 * @typedef {object} SocketHooks
 * @property {(wasReconnect: boolean) => void} onOpen the socket opened (again, when wasReconnect)
 * @property {(frame: ServerFrame) => void} onFrame a frame of a known type arrived
 * @property {() => void} onClose the socket closed (before any reconnection is scheduled)
 */

/** @type {SocketHooks} */
const hooks = { onOpen: () => {}, onFrame: () => {}, onClose: () => {} };

/** @param {Partial<SocketHooks>} given */
export function setSocketHooks(given) {
  Object.assign(hooks, given);
}

function clearTimers() {
  clearTimeout(conn.reconnectTimer);
  clearInterval(conn.countdownTimer);
}

function scheduleReconnect() {
  clearTimers();
  const delay = backoffDelay(conn.attempt);
  conn.attempt += 1;
  conn.reconnectAt = Date.now() + delay;
  setConnection(conn.everConnected ? "reconnecting" : "offline", conn.everConnected ? "Reconnecting…" : "Offline");
  updateBanner();
  conn.countdownTimer = window.setInterval(updateBanner, 1000);
  conn.reconnectTimer = window.setTimeout(connect, delay);
}

/** Reconnect now, unless open or already connecting. */
export function reconnectNow() {
  if (conn.open) return;
  clearTimers();
  if (conn.ws && conn.ws.readyState === WebSocket.CONNECTING) return;
  connect();
}

/** Open the socket. */
export function connect() {
  clearTimers();
  conn.reconnectAt = 0;
  if (!conn.everConnected) setConnection("connecting", "Connecting…");
  else { setConnection("reconnecting", "Reconnecting…"); el.bannerText.textContent = "Reconnecting…"; }
  let ws;
  try {
    ws = new WebSocket(WS_URL);
  } catch {
    scheduleReconnect();
    return;
  }
  conn.ws = ws;
  let opened = false;
  ws.addEventListener("open", () => {
    opened = true;
    if (conn.ws !== ws) return;
    const wasReconnect = conn.everConnected;
    conn.open = true;
    conn.idle = false;
    conn.everConnected = true;
    conn.attempt = 0;
    conn.reconnectAt = 0;
    conn.note = "";
    setConnection("connected", "Connected");
    updateBanner();
    hooks.onOpen(wasReconnect);
  });
  ws.addEventListener("message", (ev) => {
    if (conn.ws !== ws) return;
    const frame = parseFrame(ev.data);
    if (!frame) return; // not JSON, not an object, or a type the page does not know: ignored
    try { hooks.onFrame(frame); } catch (err) { console.error("frame handling failed", err); }
  });
  ws.addEventListener("close", (ev) => {
    if (conn.ws !== ws) return;
    conn.ws = null;
    conn.open = false;
    hooks.onClose();
    const next = afterClose(ev.code, conn.attempt);
    conn.attempt = next.attempt;
    conn.note = next.note;
    if (next.action === "idle") { idleClosed(); return; }
    // Refused before it opened twice running: the session cookie may be gone (an upgrade without it is
    // refused, 403 no_session); loading the thread hands out a fresh one before the next attempt.
    if (!opened && conn.attempt >= 2) fetch(API.thread, { credentials: "same-origin" }).catch(() => {});
    scheduleReconnect();
  });
  ws.addEventListener("error", () => { /* a close event follows */ });
}

/** The server closed an idle socket (4408): come back at once if the person is here, else when they are. */
function idleClosed() {
  conn.idle = true;
  if (document.visibilityState === "visible" && document.hasFocus()) { backFromIdle(); return; }
  setConnection("idle", "Idle — reconnects when you're back");
}

/** The person is back (focus, a key, a click): reconnect a socket closed as idle. */
export function backFromIdle() {
  if (!conn.idle || conn.open) return;
  conn.idle = false;
  conn.attempt = 0;
  reconnectNow();
}

/** The page became visible or the network came back: reconnect at once. */
export function reconnectSoon() {
  if (conn.open) return;
  conn.attempt = 0;
  reconnectNow();
}

/**
 * Send a frame; false when the socket is not open or the send failed.
 * @param {ClientFrame} frame
 */
export function sendFrame(frame) {
  if (!conn.ws || conn.ws.readyState !== WebSocket.OPEN) return false;
  try { conn.ws.send(JSON.stringify(frame)); return true; } catch { return false; }
}
