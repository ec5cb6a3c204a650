// @ts-check
/**
 * The JSON API of docs/contract.md, section "HTTP": same-origin requests with cookies, and the one error
 * shape `{"error": {"code", "message"}}` (the message is shown to the person as is). No DOM access: unit
 * tested in tests/js/api.test.js.
 */

/**
 * @typedef {object} ApiResult
 * @property {boolean} ok a 2xx answer
 * @property {number} status the HTTP status (0: the server could not be reached)
 * @property {any} data the parsed JSON body (null: none, 204, or not JSON)
 * @property {string} message for a failure: the error body's message, else a sentence naming the status;
 *   for an unknown outcome the body's message
 * @property {boolean} unknown 202 `{"outcome": "unknown"}`: the change may or may not have been made (its
 *   reply was lost); read the state again to know (docs/contract.md: HTTP, "Outcome unknown")
 */

/**
 * fetch JSON; never rejects.
 * @param {string} method
 * @param {string} url
 * @param {unknown} [payload] sent as a JSON body
 * @returns {Promise<ApiResult>}
 */
export async function api(method, url, payload) {
  /** @type {Record<string, string>} */
  const headers = { Accept: "application/json" };
  /** @type {RequestInit} */
  const init = { method, credentials: "same-origin", headers };
  if (payload !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(payload);
  }
  let res;
  try {
    res = await fetch(url, init);
  } catch {
    return { ok: false, status: 0, data: null, message: "Can't reach the server.", unknown: false };
  }
  let data = null;
  if (res.status !== 204) {
    try { data = await res.json(); } catch { data = null; }
  }
  const unknown = res.status === 202 && !!data && typeof data === "object" && data.outcome === "unknown";
  const message = unknown ? String(data.message || "Checking whether that change was made…")
    : res.ok ? "" : errorMessage(data, res.status);
  return { ok: res.ok && !unknown, status: res.status, data, message, unknown };
}

/**
 * The message of an error body, else "The server answered <status>.".
 * @param {unknown} data
 * @param {number} status
 */
export function errorMessage(data, status) {
  const e = data && typeof data === "object" ? /** @type {{error?: unknown}} */ (data).error : null;
  const message = e && typeof e === "object" ? /** @type {{message?: unknown}} */ (e).message : null;
  return (typeof message === "string" && message) || `The server answered ${status}.`;
}
