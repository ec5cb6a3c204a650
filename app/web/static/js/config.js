// @ts-check
/**
 * The page's configuration, read once from the data attributes of <body> (templates/index.html; no
 * inline script, so the strict Content-Security-Policy holds). The routes are those of
 * docs/contract.md, sections "HTTP" and "WebSocket `/ws/chat`".
 */

const data = document.body.dataset;

/** The app's script root, without a trailing slash ("" at the host's root). */
export const ROOT = (data.root || "").replace(/\/+$/, "");

/** The longest message the server accepts, in code points (MAX_INPUT_CHARS). */
export const MAX_INPUT = parseInt(data.maxInputChars || "", 10) || 12000;

/** The JSON API's addresses. */
export const API = Object.freeze({
  thread: ROOT + "/api/chat/thread",
  stats: ROOT + "/api/chat/stats",
  inspector: ROOT + "/api/chat/inspector",
  pins: ROOT + "/api/chat/pins",
  notes: ROOT + "/api/chat/notes",
  feedback: ROOT + "/api/chat/feedback",
  turns: ROOT + "/api/chat/turns",
  forget: ROOT + "/api/chat/forget",
  export: ROOT + "/api/chat/export",
  health: ROOT + "/healthz",
});

/** The chat websocket's address on this page's host. */
export const WS_URL = (location.protocol === "https:" ? "wss://" : "ws://") + location.host + ROOT + "/ws/chat";
