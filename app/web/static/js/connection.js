// @ts-check
/** The connection indicator and the reconnection banner (their words: backoff.js). */
import { el } from "./dom.js";
import { conn, memory } from "./state.js";
import { bannerState } from "./backoff.js";

/**
 * The indicator in the top bar (data-state: connecting, connected, reconnecting, offline, idle).
 * @param {string} stateName
 * @param {string} text
 */
export function setConnection(stateName, text) {
  el.connection.dataset.state = stateName;
  el.connectionText.textContent = text;
}

/** Show, update or hide the banner from the connection's state now. */
export function updateBanner() {
  const b = bannerState({
    wsOpen: conn.open, lastFetchFailed: memory.lastFetchFailed, reconnectAt: conn.reconnectAt,
    attempt: conn.attempt, everConnected: conn.everConnected, note: conn.note,
  }, Date.now());
  if (!b.hidden) el.bannerText.textContent = b.text;
  el.banner.hidden = b.hidden;
}
