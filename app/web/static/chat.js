/*
 * chat.js: the browser side of the chat page. Plain ES2020, no build step, no framework.
 * Needs vendor/marked.umd.js and vendor/purify.min.js loaded before it (both `defer`).
 * Assistant text is rendered as markdown through DOMPurify (raw HTML in the markdown is shown
 * as text, images become links); user text is only ever set with textContent.
 *
 * ───────────────────────── What the page expects from the server ─────────────────────────
 * All requests are same-origin with cookies (credentials: "same-origin").
 * Error bodies of the JSON API, whenever a request fails: {"error": {"code": str, "message": str}}
 * (the message is shown to the person as is; no other field is read).
 *
 * GET    /api/chat/thread
 *   200 {"threadId": str,
 *        "messages": [{"id": str, "role": "user"|"assistant", "text": str, "createdAt": ISO-8601}],
 *        "archived"?: [{"id", "role", "text", "createdAt"}], // folded turns the archive keeps, oldest
 *                                             //   first (absent when none): shown dimmed, as summarized
 *        "summaryPreview"?: str,              // absent when the summary is empty
 *        "summary"?: str,                     // the whole summary (absent when empty)
 *        "pinnedDecisions": [str],            // the person's (objects with a "text" field are tolerated)
 *        "modelNotes"?: [str],                // what compactions proposed to remember (absent when none)
 *        "restored": bool}
 * DELETE /api/chat/thread                    → 204 (anything else: error body, message shown)
 *
 * GET    /api/chat/stats
 *   200 {"budget": int,                      // most prompt tokens a turn may use
 *                                            //   (= contextTokens − reservedOutputTokens)
 *        "contextTokens": int,               // MODEL_CONTEXT_TOKENS
 *        "reservedOutputTokens": int,        // RESERVED_OUTPUT_TOKENS
 *        "turns": [{"messageId": str, "status": "completed"|"blocked"|"cancelled"|"failed",
 *                   "promptTokens": int,
 *                   "sections": {"system": int, "summary": int, "pins": int, "recent": int, "input": int},
 *                   "completionTokens": int, "firstTokenMs": int|null, "at": ISO-8601}],   // oldest first
 *        "compactions": [{"at": ISO-8601, "outcome": "applied"|"stale"|"failed",
 *                         "reason"?: str,    // a category, e.g. "timeout", "invalid_answer"
 *                         "turnsFolded"?: int, "tokensBefore"?: int, "tokensAfter"?: int,
 *                         "summaryChars"?: int, "notesCount"?: int,   // only the figures an entry has:
 *                         "factRetention"?: number (0..1) | null,     // a stale one has none
 *                         "durationMs": int}]}     // oldest first
 *   Any failure (404 while not built, 5xx, network): the panels say "not available"; nothing breaks.
 *
 * GET    /api/chat/inspector                 (the last turn's prompt, for this session's own thread)
 *   200 {"turn": {"messageId", "status", "at", "promptTokens", "budget"} | null,
 *        "messages": [{"origin": "system"|"summary"|"pins"|"recent"|"input",
 *                      "role": "system"|"user"|"assistant", "tokens": int,
 *                      "text": str | null,   // null when it changed since (folded, compacted, not kept)
 *                      "note"?: str}]}       // says why the text is not shown
 *
 * POST   /api/chat/pins      body {"text": str}  or  {"messageId": str}
 *   201 {"pinnedDecisions": [str]}
 *   400/409 {"error": {"code", "message"}}   (e.g. empty, too long, limit reached, unknown message)
 * DELETE /api/chat/pins/<n>  (n = 1-based position in pinnedDecisions)
 *   200 {"pinnedDecisions": [str]}            (404/400 with an error body when n is out of range)
 * POST   /api/chat/notes/<n>/pin             (n = 1-based position in modelNotes: make it the person's decision)
 *   201 {"pinnedDecisions": [str], "modelNotes": [str]}
 * DELETE /api/chat/notes/<n>
 *   200 {"pinnedDecisions": [str], "modelNotes": [str]}   (404 note_not_found, 409 pin_limit / thread_cleared)
 *
 * GET    /healthz
 *   200 or 503 {"status": "ok"|"degraded", "store": "up"|"down", "model": "up"|"down"}
 *   "model": "down" shows the model banner (checked every 30 s; every 5 s while down and for 30 s after a turn
 *   failed with "llm_unavailable" or "upstream_truncated"); nothing else is read.
 *
 * POST   /api/chat/feedback  body {"messageId": str, "rating": "up"|"down", "reason"?: str}
 *   201 (body ignored). The page may send a second POST for the same message (the person changes
 *   the rating, or adds a reason after a thumbs-down): the server should keep the latest one.
 *
 * WebSocket ws(s)://<host><script root>/ws/chat  (docs/contract.md)
 *   sends    {"type":"message","id":<client uuid>,"text":str}   {"type":"cancel"}
 *   receives {"type":"start","messageId"}  {"type":"delta","text"}
 *            {"type":"tool","name","arguments","result","status":"started"|"finished", "id"?}
 *            {"type":"progress","stage","message"?}
 *            {"type":"waiting","for":"model_busy","message"}   // before the first delta: the model is busy
 *            {"type":"memory","status":"started"|"succeeded"|"failed","message"?}
 *            {"type":"done","status":"completed"|"blocked"|"cancelled"|"failed"|"paused","messageId",
 *             "saved"?: false, "reason"?: "thread_cleared"|"store_unavailable"|"rejected"}   // not written
 *            {"type":"error","code","message"}   // e.g. memory_unreadable: a new chat repairs the thread
 *   Unknown frame types are ignored.
 *   Close codes: 4408 idle (nothing sent for WS_IDLE_TIMEOUT_SECONDS): reconnect at once when the page
 *   has focus, else as soon as the person is back (focus, a key, a click, the tab shown);
 *   4429 this session has too many sockets open (other tabs): retry slowly; 1013 the server is busy,
 *   1011 it failed: retry with the usual backoff.
 */
(() => {
  "use strict";

  // ───────────────────────────── configuration ─────────────────────────────
  const body = document.body;
  const ROOT = (body.dataset.root || "").replace(/\/+$/, "");
  const MAX_INPUT = parseInt(body.dataset.maxInputChars, 10) || 12000;
  const API = {
    thread: ROOT + "/api/chat/thread",
    stats: ROOT + "/api/chat/stats",
    inspector: ROOT + "/api/chat/inspector",
    pins: ROOT + "/api/chat/pins",
    notes: ROOT + "/api/chat/notes",
    feedback: ROOT + "/api/chat/feedback",
    health: ROOT + "/healthz",
  };
  const HEALTH_MS = { up: 30000, down: 5000 }; // how often the model banner re-checks /healthz
  const WS_URL = (location.protocol === "https:" ? "wss://" : "ws://") + location.host + ROOT + "/ws/chat";
  const BACKOFF_MS = [1000, 2000, 4000, 8000, 15000];
  const CLOSE_IDLE = 4408; // docs/contract.md: WebSocket, close codes
  const CLOSE_SESSION_LIMIT = 4429;
  const SECTIONS = ["system", "summary", "pins", "recent", "input"];
  const SECTION_LABELS = { system: "System", summary: "Summary", pins: "Pins", recent: "Recent turns", input: "New input" };
  const WAIT_NOTICE_MS = 1500; // a turn without its first token says what it waits for after this long
  const FEEDBACK_REASONS = ["forgot something I said", "incorrect", "not helpful"];
  const nf = new Intl.NumberFormat();

  // ───────────────────────────── elements ─────────────────────────────
  const $ = (id) => document.getElementById(id);
  const el = {
    messages: $("messages"),
    empty: $("empty-state"),
    composer: $("composer"),
    input: $("message-input"),
    send: $("send"),
    stop: $("stop"),
    charCount: $("char-count"),
    newChat: $("new-chat"),
    connection: document.querySelector('[data-testid="connection"]'),
    connectionText: document.querySelector('[data-testid="connection"] .connection-text'),
    banner: $("banner"),
    bannerText: document.querySelector("#banner .banner-text"),
    retryNow: $("retry-now"),
    modelBanner: $("model-banner"),
    memoryHint: document.querySelector('[data-testid="memory-hint"]'),
    memoryToggle: $("memory-toggle"),
    panel: $("memory-panel"),
    backdrop: $("drawer-backdrop"),
    drawerClose: $("drawer-close"),
    summary: $("summary"),
    pins: $("pins"),
    pinsEmpty: $("pins-empty"),
    pinsCount: $("pins-count"),
    notes: $("notes"),
    notesEmpty: $("notes-empty"),
    notesCount: $("notes-count"),
    summarySection: $("summary-section"),
    pinForm: $("pin-form"),
    pinInput: $("pin-input"),
    pinAdd: $("pin-add"),
    pinError: $("pin-error"),
    meter: $("context-meter"),
    chart: $("token-chart"),
    compactions: $("compactions"),
    compactionsEmpty: $("compactions-empty"),
    inspector: $("inspector"),
    inspectorBody: $("inspector-body"),
    toast: $("toast"),
    srStatus: $("sr-status"),
    dismissNotice: $("dismiss-notice"),
  };

  // ───────────────────────────── small helpers ─────────────────────────────
  /** Build an element. Text goes in through textContent only. */
  function h(tag, attrs, ...children) {
    const node = document.createElement(tag);
    if (attrs) {
      for (const [k, v] of Object.entries(attrs)) {
        if (v === undefined || v === null || v === false) continue;
        if (k === "class") node.className = v;
        else if (k === "text") node.textContent = v;
        else if (k === "dataset") Object.assign(node.dataset, v);
        else if (k.startsWith("on") && typeof v === "function") node.addEventListener(k.slice(2), v);
        else node.setAttribute(k, v === true ? "" : String(v));
      }
    }
    for (const c of children) {
      if (c === undefined || c === null || c === false) continue;
      node.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return node;
  }

  const SVG_NS = "http://www.w3.org/2000/svg";
  function s(tag, attrs) {
    const node = document.createElementNS(SVG_NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "text") node.textContent = v;
      else node.setAttribute(k, String(v));
    }
    return node;
  }

  // Tiny stroke icons drawn here (emoji fonts are not everywhere).
  const ICONS = {
    pin: ["M9 3h6l-1 6 3 3v2H7v-2l3-3z", "M12 14v7"],
    copy: ["M9 9h11v11H9z", "M5 15H4V4h11v1"],
    up: ["M7 11v9H3v-9z", "M7 11l4-8c1.6 0 2.6 1.2 2.3 2.8L12.6 10H19a2 2 0 0 1 2 2.3l-1.2 6A2 2 0 0 1 17.8 20H7"],
  };
  function icon(name, flip) {
    const svg = s("svg", { viewBox: "0 0 24 24", width: 16, height: 16, "aria-hidden": "true", focusable: "false", class: "icon" });
    if (flip) svg.classList.add("flip");
    for (const d of ICONS[name]) {
      svg.append(s("path", { d, fill: "none", stroke: "currentColor", "stroke-width": 1.8, "stroke-linejoin": "round", "stroke-linecap": "round" }));
    }
    return svg;
  }

  function uuid() {
    if (window.crypto && typeof crypto.randomUUID === "function") return crypto.randomUUID();
    // crypto.randomUUID needs a secure context; getRandomValues does not.
    const b = new Uint8Array(16);
    crypto.getRandomValues(b);
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    const hex = Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
    return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
  }

  const num = (v) => (typeof v === "number" && Number.isFinite(v) ? v : 0);
  const fmt = (v) => nf.format(Math.round(num(v)));
  const str = (v) => (typeof v === "string" ? v : "");
  /** Length in code points, as the server (Python) counts it. */
  function charLength(t) {
    let n = 0;
    for (const _ of t) n += 1; // eslint-disable-line no-unused-vars
    return n;
  }

  function fmtTime(iso, withDate) {
    const d = new Date(iso);
    if (Number.isNaN(d.getTime())) return "";
    const opts = withDate ? { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit" }
      : { hour: "2-digit", minute: "2-digit" };
    return d.toLocaleString(undefined, opts);
  }

  function fmtMs(ms) {
    if (typeof ms !== "number" || !Number.isFinite(ms)) return "–";
    return ms < 1000 ? `${Math.round(ms)}\u00a0ms` : `${(ms / 1000).toFixed(1)}\u00a0s`;
  }

  /** Anything (string, object, number) as readable text, bounded. */
  function display(value, limit = 4000) {
    let text;
    if (value === undefined) return "";
    if (typeof value === "string") {
      text = value;
      try { // pretty-print JSON strings
        const parsed = JSON.parse(value);
        if (parsed && typeof parsed === "object") text = JSON.stringify(parsed, null, 2);
      } catch (_) { /* plain text */ }
    } else {
      try { text = JSON.stringify(value, null, 2); } catch (_) { text = String(value); }
    }
    if (text === undefined) text = String(value);
    return text.length > limit ? text.slice(0, limit) + "\n… (truncated)" : text;
  }

  function announce(text) {
    el.srStatus.textContent = "";
    // a fresh text node so repeated messages are announced again
    setTimeout(() => { el.srStatus.textContent = text; }, 30);
  }

  let toastTimer = 0;
  function toast(text, kind) {
    el.toast.textContent = text;
    el.toast.dataset.kind = kind || "info";
    el.toast.hidden = false;
    clearTimeout(toastTimer);
    toastTimer = setTimeout(() => { el.toast.hidden = true; }, 5000);
  }

  /** fetch JSON; resolves {ok, status, data, message}; never rejects. */
  async function api(method, url, payload) {
    const init = { method, credentials: "same-origin", headers: { Accept: "application/json" } };
    if (payload !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(payload);
    }
    let res;
    try {
      res = await fetch(url, init);
    } catch (_) {
      return { ok: false, status: 0, data: null, message: "Can't reach the server." };
    }
    let data = null;
    if (res.status !== 204) {
      try { data = await res.json(); } catch (_) { data = null; }
    }
    let message = "";
    if (!res.ok) {
      const e = data && typeof data === "object" ? data.error : null;
      message = (e && typeof e.message === "string" && e.message) || `The server answered ${res.status}.`;
    }
    return { ok: res.ok, status: res.status, data, message };
  }

  // ───────────────────────────── markdown (safe) ─────────────────────────────
  const hasMarkdown = typeof window.marked !== "undefined" && typeof window.DOMPurify !== "undefined" &&
    typeof window.DOMPurify.sanitize === "function" && window.DOMPurify.isSupported !== false;

  function escapeHtml(t) {
    return String(t).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
  }

  const PURIFY_CONFIG = {
    USE_PROFILES: { html: true },
    FORBID_TAGS: ["style", "img", "svg", "math", "form", "input", "button", "textarea", "select", "option",
      "iframe", "frame", "object", "embed", "video", "audio", "source", "picture", "link", "meta", "base", "template"],
    FORBID_ATTR: ["style", "id", "name", "srcset", "action", "formaction"],
    ALLOW_DATA_ATTR: false,
    SANITIZE_NAMED_PROPS: true,
    RETURN_DOM_FRAGMENT: true,
  };

  if (hasMarkdown) {
    window.marked.use({
      gfm: true,
      breaks: true,
      async: false,
      renderer: {
        // Raw HTML in a message is shown as text, never interpreted.
        html(token) {
          const text = escapeHtml(token.text || token.raw || "");
          return token.block ? `<p>${text.replace(/\n+$/, "").replace(/\n/g, "<br>")}</p>\n` : text;
        },
        // Images are not loaded (no tracking pixels, no exfiltration): they become plain links.
        image(token) {
          const label = "image: " + (token.text || token.href || "");
          return `<a href="${escapeHtml(token.href || "")}">${escapeHtml(label)}</a>`;
        },
      },
    });
    window.DOMPurify.addHook("afterSanitizeAttributes", (node) => {
      if (node.nodeName === "A") {
        if (node.hasAttribute("href")) {
          node.setAttribute("target", "_blank");
          node.setAttribute("rel", "noopener noreferrer");
        } else {
          node.removeAttribute("target");
        }
      }
    });
  }

  /** Render assistant markdown into node, safely. */
  function renderMarkdown(node, text) {
    if (!hasMarkdown) { // vendor scripts missing: plain text is always safe
      node.textContent = text;
      return;
    }
    try {
      const html = window.marked.parse(text);
      node.replaceChildren(window.DOMPurify.sanitize(html, PURIFY_CONFIG));
    } catch (_) {
      node.textContent = text;
    }
  }

  // ───────────────────────────── state ─────────────────────────────
  const state = {
    ws: null,
    wsOpen: false,
    everConnected: false,
    attempt: 0,
    reconnectTimer: 0,
    healthTimer: 0,
    healthChecksSoon: 0, // /healthz checks still to make at the short interval
    countdownTimer: 0,
    reconnectAt: 0,
    idle: false, // the server closed the socket as idle; reconnect when the person is back
    lastFetchFailed: false,
    turn: null, // the turn in flight: {clientId, text, userEl, botEl, messageId, answer, started, stopping, tools:[], stages:[]}
    serverIds: new Set(), // ids of messages known to be in server memory
    threadSeq: 0,
    msgSeq: 0,
    statsSeq: 0,
    pins: [],
    notes: [],
    summary: "",
    sawStart: null, // true when this page has shown the thread from its first message (no summary before it)
    rafPending: false,
    feedback: new Map(), // messageId -> "up" | "down"
  };

  // ───────────────────────────── message bubbles ─────────────────────────────
  function updateEmpty() {
    el.empty.hidden = !!el.messages.querySelector('[data-testid="message"], [data-testid="earlier"]');
  }

  function nearBottom() {
    const m = el.messages;
    return m.scrollHeight - m.scrollTop - m.clientHeight < 80;
  }

  function scrollToBottom(force) {
    if (force || state.stickToBottom) el.messages.scrollTop = el.messages.scrollHeight;
  }
  el.messages.addEventListener("scroll", () => { state.stickToBottom = nearBottom(); }, { passive: true });
  state.stickToBottom = true;

  /**
   * A bubble. opts: {id, role, text, createdAt, local, turn, anchor}
   * local bubbles are created by this page (a turn it sent); server bubbles come from /api/chat/thread.
   */
  function makeBubble(opts) {
    const role = opts.role === "user" ? "user" : "assistant";
    const article = h("article", {
      class: `msg msg-${role}`,
      "data-testid": "message",
      "data-role": role,
      "data-message-id": opts.id || "",
      "aria-label": role === "user" ? "You" : "Assistant",
    });
    if (opts.local) {
      article.dataset.local = "1";
      article.dataset.turn = opts.turn || "";
      article.dataset.anchor = opts.anchor || "";
    }
    const inner = h("div", { class: "bubble" });
    if (role === "assistant") inner.append(h("div", { class: "tools" })); // tool cards; progress goes before it
    const content = h("div", { class: role === "assistant" ? "content markdown" : "content plain" });
    if (role === "assistant") {
      if (opts.text) { renderMarkdown(content, opts.text); addCodeCopy(content); }
    } else {
      content.textContent = opts.text || "";
    }
    inner.append(content);
    article.append(inner);
    const foot = h("div", { class: "msg-foot" });
    foot.append(h("span", { class: "note" }));
    if (opts.createdAt) {
      foot.append(h("time", { datetime: opts.createdAt, title: new Date(opts.createdAt).toLocaleString(), text: fmtTime(opts.createdAt) }));
    }
    foot.append(h("span", { class: "actions" }));
    article.append(foot);
    article._text = opts.text || "";
    return article;
  }

  function bubbleParts(article) {
    return {
      content: article.querySelector(".content"),
      progress: article.querySelector('[data-testid="progress"]'),
      bubble: article.querySelector(".bubble"),
      tools: article.querySelector(".tools"),
      note: article.querySelector(".msg-foot .note"),
      actions: article.querySelector(".msg-foot .actions"),
    };
  }

  // ───────────────────────────── copy ─────────────────────────────
  /** Put text on the clipboard; the button says "Copied" for a moment. Resolves true on success. */
  async function copyText(text, button) {
    let ok = false;
    try {
      await navigator.clipboard.writeText(text);
      ok = true;
    } catch (_) { // no async clipboard (an insecure origin): the old way
      const area = h("textarea", { class: "visually-hidden", readonly: true });
      area.value = text;
      document.body.append(area);
      area.select();
      try { ok = document.execCommand("copy"); } catch (_) { ok = false; }
      area.remove();
    }
    if (button) {
      button.dataset.copied = ok ? "true" : "false";
      setTimeout(() => { delete button.dataset.copied; }, 1500);
    }
    announce(ok ? "Copied." : "Couldn't copy.");
    return ok;
  }

  /** A "Copy" button on each code block of rendered markdown: it copies the block's exact code. */
  function addCodeCopy(content) {
    for (const pre of content.querySelectorAll("pre")) {
      if (pre.parentElement.classList.contains("code-wrap")) continue;
      const wrap = h("div", { class: "code-wrap" });
      pre.replaceWith(wrap);
      const code = () => (pre.querySelector("code") || pre).textContent.replace(/\n$/, ""); // marked adds one newline
      const button = h("button", {
        type: "button", class: "code-copy", "data-testid": "copy-code", title: "Copy the code",
        "aria-label": "Copy the code",
      }, "Copy");
      button.addEventListener("click", () => copyText(code(), button));
      wrap.append(pre, button);
    }
  }

  /** Pin / copy / thumbs buttons for a settled message. */
  function addActions(article) {
    const { actions } = bubbleParts(article);
    actions.replaceChildren();
    const role = article.dataset.role;
    if (role === "assistant" && article._text) {
      const copy = h("button", {
        type: "button", class: "icon-btn", "data-testid": "copy-answer",
        title: "Copy the answer (as written, in Markdown)", "aria-label": "Copy the answer",
      }, icon("copy"));
      copy.addEventListener("click", () => copyText(article._text, copy));
      actions.append(copy);
    }
    actions.append(h("button", {
      type: "button", class: "icon-btn", "data-testid": "pin-message",
      title: "Pin this as a decision", "aria-label": "Pin this message as a decision",
      onclick: () => pinFromMessage(article),
    }, icon("pin")));
    if (role === "assistant" && article.dataset.messageId) {
      const current = state.feedback.get(article.dataset.messageId);
      const up = h("button", {
        type: "button", class: "icon-btn", "data-testid": "thumb-up", title: "Good answer",
        "aria-label": "Good answer", "aria-pressed": current === "up" ? "true" : "false",
        onclick: () => sendFeedback(article, "up"),
      }, icon("up"));
      const down = h("button", {
        type: "button", class: "icon-btn", "data-testid": "thumb-down", title: "Bad answer",
        "aria-label": "Bad answer", "aria-pressed": current === "down" ? "true" : "false",
        onclick: () => sendFeedback(article, "down"),
      }, icon("up", true));
      actions.append(up, down);
    }
  }

  function setNote(article, text, kind) {
    const { note } = bubbleParts(article);
    note.textContent = text || "";
    note.dataset.kind = kind || "";
  }

  function appendBubble(article) {
    el.messages.append(article);
    updateEmpty();
  }

  function lastMessageId() {
    const all = el.messages.querySelectorAll('[data-testid="message"]');
    return all.length ? all[all.length - 1].dataset.messageId : "";
  }

  /**
   * Re-render the conversation from server memory, keeping this page's own unsaved bubbles.
   * folded: the thread has a summary. Then what this page showed that memory no longer holds word for
   * word (a compaction folded it into the summary) stays, marked data-summarized="true", before a
   * divider; nothing the person saw disappears while the page is open.
   * archived: the folded turns the thread's archive keeps (hydration's "archived"), shown the same way,
   * so that after a reload the earlier conversation is still there, dimmed.
   */
  function renderThread(messages, folded, archived) {
    const list = Array.isArray(messages) ? messages : [];
    const ids = new Set();
    const fresh = [];
    for (const m of list) {
      if (!m || typeof m !== "object" || typeof m.text !== "string") continue;
      const id = str(m.id);
      ids.add(id);
      const b = makeBubble({ id, role: m.role, text: m.text, createdAt: str(m.createdAt) });
      b.dataset.saved = "1";
      addActions(b);
      fresh.push(b);
    }
    const inFlight = state.turn ? state.turn.clientId : null;
    const keep = [];
    const summarized = [];
    for (const b of el.messages.querySelectorAll('[data-testid="message"]')) {
      const local = b.dataset.local === "1";
      const shown = b.dataset.saved === "1" || b.dataset.kept === "true"; // was in memory, or its turn was kept
      if (b.dataset.summarized === "true" ||
          (folded && shown && b.dataset.turn !== inFlight && b.dataset.messageId && !ids.has(b.dataset.messageId))) {
        b.dataset.summarized = "true";
        delete b.dataset.local; // placed by its position now, not by an anchor
        summarized.push(b);
        continue;
      }
      if (!local) continue;
      // Local bubbles survive unless server memory now holds their turn.
      const botId = b.dataset.botId || (b.dataset.role === "assistant" ? b.dataset.messageId : "");
      const confirmed = b.dataset.turn !== inFlight && botId && ids.has(botId);
      if (!confirmed) keep.push(b);
    }
    const byId = new Map(summarized.map((b) => [b.dataset.messageId, b]));
    const ordered = [];
    for (const m of Array.isArray(archived) ? archived : []) {
      if (!m || typeof m !== "object" || typeof m.text !== "string" || ids.has(str(m.id))) continue;
      let b = byId.get(str(m.id));
      if (b) byId.delete(str(m.id));
      else {
        b = makeBubble({ id: str(m.id), role: m.role, text: m.text, createdAt: str(m.createdAt) });
        b.dataset.summarized = "true";
        b.dataset.archived = "true";
      }
      ordered.push(b);
    }
    for (const b of summarized) if (byId.has(b.dataset.messageId)) ordered.push(b);
    summarized.length = 0;
    summarized.push(...ordered);
    for (const b of el.messages.querySelectorAll('[data-testid="message"], [data-testid="fold-divider"]')) b.remove();
    for (const b of summarized) el.messages.append(b);
    if (summarized.length) el.messages.append(foldDivider());
    for (const b of fresh) el.messages.append(b);
    for (const b of keep) {
      const anchor = b.dataset.anchor
        ? el.messages.querySelector(`[data-testid="message"][data-message-id="${CSS.escape(b.dataset.anchor)}"]`)
        : null;
      if (anchor) {
        // after the anchor and any local bubbles already placed after it
        let after = anchor;
        while (after.nextElementSibling && after.nextElementSibling.dataset.local === "1" &&
          after.nextElementSibling.dataset.anchor === b.dataset.anchor) after = after.nextElementSibling;
        after.after(b);
      } else if (!b.dataset.anchor) {
        const first = el.messages.querySelector('[data-testid="message"]:not([data-summarized])');
        if (first && !first.dataset.local) el.messages.insertBefore(b, first); else el.messages.append(b);
      } else {
        el.messages.append(b);
      }
    }
    state.serverIds = ids;
    updateEmpty();
  }

  /** The line after the turns a compaction folded: it opens the memory panel at the summary. */
  function foldDivider() {
    return h("div", { class: "fold-divider", "data-testid": "fold-divider", role: "separator" },
      h("button", { type: "button", class: "linklike", onclick: () => openMemory(el.summarySection) },
        "Earlier turns are now kept as a summary"));
  }

  /** Show the memory panel (the drawer on narrow screens) and bring `section` into view. */
  function openMemory(section) {
    if (narrow.matches) setDrawer(true);
    if (section) {
      section.scrollIntoView({ block: "start", behavior: "smooth" });
      section.classList.remove("flash");
      void section.offsetWidth; // restart the highlight
      section.classList.add("flash");
    }
  }

  /**
   * The first item of the conversation when this page did not show the thread from its start (a reload):
   * "Earlier in this conversation", collapsible, with the summary and the pinned decisions.
   */
  function renderEarlier() {
    let node = el.messages.querySelector('[data-testid="earlier"]');
    if (state.sawStart !== false || !state.summary) {
      if (node) node.remove();
      updateEmpty();
      return;
    }
    if (!node) {
      node = h("details", { class: "earlier", "data-testid": "earlier" },
        h("summary", null,
          h("span", { class: "earlier-title", text: "Earlier in this conversation" }),
          h("span", { class: "earlier-preview muted" })),
        h("div", { class: "earlier-body" }));
      el.messages.prepend(node);
    }
    const lines = state.summary.split("\n");
    const firstLine = lines.find((l) => /^-\s/.test(l)) || lines.find((l) => l.trim()) || "";
    node.querySelector(".earlier-preview").textContent = firstLine.replace(/^-\s*/, "").slice(0, 120);
    const body = node.querySelector(".earlier-body");
    body.replaceChildren(
      h("p", { class: "muted small", text: "Older turns are kept as this summary; the model reads it, not the turns themselves." }),
      h("div", { class: "earlier-text", "data-testid": "earlier-summary", text: state.summary }));
    if (state.pins.length) {
      body.append(h("p", { class: "earlier-label", text: `Your pinned decisions (${state.pins.length})` }),
        h("ol", { class: "earlier-pins" }, ...state.pins.map((t) => h("li", { "data-by": "person", text: t }))));
    }
    body.append(h("button", {
      type: "button", class: "btn btn-small btn-ghost", "data-testid": "earlier-open-memory",
      onclick: () => openMemory(el.summarySection),
    }, state.pins.length || state.notes.length ? "Open memory: summary, decisions and notes" : "Open memory"));
    updateEmpty();
  }

  // ───────────────────────────── memory panel ─────────────────────────────
  function renderSummary(text) {
    if (typeof text === "string" && text.trim()) {
      el.summary.textContent = text;
      el.summary.classList.remove("muted");
    } else {
      el.summary.textContent = "No summary yet";
      el.summary.classList.add("muted");
    }
  }

  function pinText(p) {
    if (typeof p === "string") return p;
    if (p && typeof p === "object" && typeof p.text === "string") return p.text;
    return "";
  }

  function renderPins(pins) {
    state.pins = Array.isArray(pins) ? pins.map(pinText).filter(Boolean) : [];
    el.pins.replaceChildren();
    state.pins.forEach((text, i) => {
      const n = i + 1;
      el.pins.append(h("li", { class: "pin", "data-testid": "pin", "data-by": "person" },
        h("span", { class: "pin-text", text }),
        h("button", {
          type: "button", class: "icon-btn unpin", "data-testid": "unpin", "data-index": n,
          title: "Unpin", "aria-label": `Unpin decision ${n}`, onclick: () => unpin(n),
        }, "✕")));
    });
    el.pinsEmpty.hidden = state.pins.length > 0;
    el.pins.hidden = state.pins.length === 0;
    el.pinsCount.textContent = state.pins.length ? `(${state.pins.length})` : "";
  }

  /** The model's notes: proposed by compactions, shown apart from the person's decisions; pin or remove each. */
  function renderNotes(notes) {
    state.notes = Array.isArray(notes) ? notes.filter((t) => typeof t === "string" && t) : [];
    el.notes.replaceChildren();
    state.notes.forEach((text, i) => {
      const n = i + 1;
      el.notes.append(h("li", { class: "note-item", "data-testid": "note", "data-by": "model" },
        h("span", { class: "pin-text", text }),
        h("span", { class: "note-actions" },
          h("button", {
            type: "button", class: "btn btn-small", "data-testid": "promote-note", title: "Make this your pinned decision",
            "aria-label": `Pin note ${n} as your decision`, onclick: () => changeNote("POST", `${n}/pin`, "Pinned as your decision."),
          }, "Pin"),
          h("button", {
            type: "button", class: "icon-btn", "data-testid": "remove-note", title: "Remove this note",
            "aria-label": `Remove note ${n}`, onclick: () => changeNote("DELETE", `${n}`, "Note removed."),
          }, "✕"))));
    });
    el.notesEmpty.hidden = state.notes.length > 0;
    el.notes.hidden = state.notes.length === 0;
    el.notesCount.textContent = state.notes.length ? `(${state.notes.length})` : "";
  }

  function showPinError(text) {
    el.pinError.textContent = text || "";
    el.pinError.hidden = !text;
  }

  // Context meter: the last turn's prompt tokens, by section, against the prompt budget.
  function renderMeter(stats) {
    const turns = Array.isArray(stats.turns) ? stats.turns : [];
    const budget = num(stats.budget) || (num(stats.contextTokens) - num(stats.reservedOutputTokens));
    const last = turns.length ? turns[turns.length - 1] : null;
    el.meter.replaceChildren();
    if (!last || budget <= 0) {
      el.meter.append(h("p", { class: "muted", text: budget > 0 ? `No turns yet · budget ${fmt(budget)} tokens` : "No turns yet." }));
      return;
    }
    const sections = last.sections && typeof last.sections === "object" ? last.sections : {};
    const used = num(last.promptTokens) || SECTIONS.reduce((a, k) => a + num(sections[k]), 0);
    const pct = Math.round((used / budget) * 100);
    const bar = h("div", {
      class: "meter-bar", role: "img",
      "aria-label": `Context ${pct}% full: ${fmt(used)} of ${fmt(budget)} prompt tokens. ` +
        SECTIONS.map((k) => `${SECTION_LABELS[k]} ${fmt(sections[k])}`).join(", "),
    });
    for (const k of SECTIONS) {
      const v = num(sections[k]);
      if (v <= 0) continue;
      const seg = h("span", { class: `seg seg-${k}`, title: `${SECTION_LABELS[k]}: ${fmt(v)} tokens`, "data-section": k });
      seg.style.width = `${Math.min(100, (v / budget) * 100)}%`;
      bar.append(seg);
    }
    el.meter.append(
      h("div", { class: "meter-head" },
        h("strong", { text: `${fmt(used)} / ${fmt(budget)}` }), " prompt tokens ",
        h("span", { class: pct >= 90 ? "pct warn" : "pct", text: `(${pct}%)` })),
      bar,
      h("ul", { class: "legend" }, ...SECTIONS.map((k) => h("li", null,
        h("span", { class: `swatch seg-${k}`, "aria-hidden": "true" }),
        `${SECTION_LABELS[k]} `, h("span", { class: "legend-num", text: fmt(sections[k]) })))),
      h("p", { class: "muted small", text:
        `+ ${fmt(stats.reservedOutputTokens)} reserved for the answer · window ${fmt(stats.contextTokens)}` +
        (last.completionTokens !== undefined ? ` · last answer ${fmt(last.completionTokens)} tokens` : "") +
        (typeof last.firstTokenMs === "number" ? ` · first token ${fmtMs(last.firstTokenMs)}` : "") }),
    );
  }

  // Chart: prompt tokens per turn, stacked by section, with the budget line and compaction markers.
  function renderChart(stats) {
    const turns = (Array.isArray(stats.turns) ? stats.turns : []).slice(-40);
    const budget = num(stats.budget) || (num(stats.contextTokens) - num(stats.reservedOutputTokens));
    el.chart.replaceChildren();
    if (!turns.length) {
      el.chart.append(h("p", { class: "muted", text: "No turns yet." }));
      return;
    }
    const W = 300, H = 110, padL = 4, padR = 4, padT = 8, padB = 14;
    // scale to the turns (so small prompts stay visible); the budget line is drawn when it is in range
    const peak = Math.max(...turns.map((t) => num(t.promptTokens)), 1);
    const maxTok = budget > 0 && budget <= peak * 1.6 ? Math.max(budget, peak) * 1.08 : peak * 1.25;
    const innerW = W - padL - padR, innerH = H - padT - padB;
    const slot = innerW / Math.max(turns.length, 8);
    const barW = Math.max(2, slot * 0.7);
    const y = (v) => padT + innerH - (v / maxTok) * innerH;
    const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart-svg", role: "img",
      "aria-label": `Prompt tokens for the last ${turns.length} turns; latest ${fmt(turns[turns.length - 1].promptTokens)}` +
        (budget ? ` of a ${fmt(budget)} token budget` : "") });
    svg.append(s("line", { x1: padL, x2: W - padR, y1: padT + innerH, y2: padT + innerH, class: "axis" }));
    turns.forEach((t, i) => {
      const x = padL + i * slot + (slot - barW) / 2;
      const g = s("g", { class: `bar status-${str(t.status) || "completed"}` });
      const sec = t.sections && typeof t.sections === "object" ? t.sections : {};
      let acc = 0;
      const secSum = SECTIONS.reduce((a, k) => a + num(sec[k]), 0);
      if (secSum > 0) {
        for (const k of SECTIONS) {
          const v = num(sec[k]);
          if (v <= 0) continue;
          g.append(s("rect", { x, width: barW, y: y(acc + v), height: Math.max(0.5, y(acc) - y(acc + v)), class: `seg-${k}` }));
          acc += v;
        }
      } else {
        const v = num(t.promptTokens);
        g.append(s("rect", { x, width: barW, y: y(v), height: Math.max(0.5, y(0) - y(v)), class: "seg-recent" }));
      }
      g.append(s("title", { text:
        `Turn ${i + 1} (${str(t.status) || "?"}) · ${fmtTime(t.at, true)}\n` +
        `${fmt(t.promptTokens)} prompt tokens: ` + SECTIONS.map((k) => `${k} ${fmt(sec[k])}`).join(", ") +
        `\n${fmt(t.completionTokens)} completion tokens · first token ${fmtMs(t.firstTokenMs)}` }));
      svg.append(g);
    });
    // compaction markers: a small triangle before the first turn after an applied compaction
    const comps = Array.isArray(stats.compactions) ? stats.compactions : [];
    for (const c of comps) {
      if (c.outcome !== "applied") continue;
      const at = Date.parse(c.at);
      if (Number.isNaN(at)) continue;
      const idx = turns.findIndex((t) => Date.parse(t.at) > at);
      if (idx <= 0) continue;
      const x = padL + idx * slot;
      const m = s("path", { d: `M${x - 3} ${H - 1} L${x + 3} ${H - 1} L${x} ${H - 6} Z`, class: "marker" });
      m.append(s("title", { text: `Compaction applied ${fmtTime(c.at, true)}` }));
      svg.append(m);
    }
    if (budget > 0 && budget <= maxTok) {
      svg.append(s("line", { x1: padL, x2: W - padR, y1: y(budget), y2: y(budget), class: "budget" }));
      svg.append(s("text", { x: W - padR, y: y(budget) - 2, class: "budget-label", "text-anchor": "end", text: `budget ${fmt(budget)}` }));
    }
    svg.append(s("text", { x: padL, y: padT - 1, class: "budget-label", text: `max ${fmt(peak)}` +
      (budget > maxTok ? ` · budget ${fmt(budget)} (off the scale)` : "") }));
    el.chart.append(svg);
  }

  // what a history entry's reason means, in words ("llm" and "extractive" are the stored values)
  const REASON_LABELS = { llm: "with the model's gist", extractive: "without the model", rate_limited: "rate limited",
                          invalid_answer: "the model's answer was unusable" };

  /** "21 facts checked: 20 kept, 1 only in an answer" — the kept ones, and why the others are not. */
  function factsText(c) {
    const checked = num(c.factsChecked), dropped = num(c.factsDropped), skipped = num(c.factsSkipped);
    const kept = Math.max(checked - dropped - skipped, 0);
    const plural = (n, one, many) => `${fmt(n)} ${n === 1 ? one : many}`;
    const parts = [`${fmt(kept)} kept`];
    if (dropped) parts.push(`${fmt(dropped)} let go to fit`);
    if (skipped) parts.push(`${fmt(skipped)} only in ${skipped === 1 ? "an answer" : "answers"}`);
    return `${plural(checked, "fact", "facts")} checked: ${parts.join(", ")}`;
  }

  function renderCompactions(stats) {
    const all = Array.isArray(stats.compactions) ? stats.compactions : [];
    const comps = all.slice(-5).reverse();
    el.compactions.replaceChildren();
    for (const c of comps) {
      const outcome = ["applied", "stale", "failed"].includes(c.outcome) ? c.outcome : "unknown";
      const has = (k) => typeof c[k] === "number";
      const bits = [];
      if (outcome === "stale") {
        bits.push("discarded: the thread changed meanwhile"); // nothing was folded: no figures
      } else {
        const turns = `${fmt(c.turnsFolded)} turn${num(c.turnsFolded) === 1 ? "" : "s"}`;
        if (has("turnsFolded")) bits.push(outcome === "applied" ? `${turns} folded` : `${turns} to fold, none folded`);
        if (has("tokensBefore") && has("tokensAfter")) bits.push(`${fmt(c.tokensBefore)} → ${fmt(c.tokensAfter)} tokens`);
        if (has("summaryChars")) bits.push(`summary ${fmt(c.summaryChars)} chars`);
        if (has("notesCount")) bits.push(`${fmt(c.notesCount)} notes`);
        if (has("factsChecked") && c.factsChecked > 0) bits.push(factsText(c));
      }
      bits.push(fmtMs(c.durationMs));
      const reason = REASON_LABELS[str(c.reason)] || str(c.reason).replace(/_/g, " ");
      const badge = outcome === "stale" ? "discarded" : outcome + (reason ? ` · ${reason}` : "");
      el.compactions.append(h("li", { class: "compaction", "data-outcome": outcome, "data-testid": "compaction" },
        h("div", { class: "compaction-head" },
          h("span", { class: `badge badge-${outcome}`, text: badge }),
          h("time", { datetime: str(c.at), text: fmtTime(c.at, true) })),
        h("div", { class: "muted small compaction-detail", text: bits.join(" · ") })));
    }
    if (all.length > comps.length) {
      el.compactions.append(h("li", { class: "muted small", text: `+ ${fmt(all.length - comps.length)} earlier` }));
    }
    el.compactionsEmpty.hidden = comps.length > 0;
    el.compactions.hidden = comps.length === 0;
  }

  function renderInspector(data) {
    const prompt = Array.isArray(data.messages) ? data.messages : [];
    el.inspectorBody.replaceChildren();
    if (!prompt.length) {
      el.inspectorBody.append(h("p", { class: "muted", text: "Nothing yet." }));
      return;
    }
    const total = prompt.reduce((a, m) => a + num(m && m.tokens), 0);
    el.inspectorBody.append(h("p", { class: "muted small", text: `${prompt.length} messages · ${fmt(total)} tokens, in the order the model received them` }));
    const ol = h("ol", { class: "inspector-list" });
    for (const m of prompt) {
      if (!m || typeof m !== "object") continue;
      const origin = SECTIONS.includes(m.origin) ? m.origin : "other";
      const text = str(m.text);
      const pre = h("pre", { class: m.text === null || m.text === undefined ? "inspector-text muted" : "inspector-text" });
      pre.textContent = m.text === null || m.text === undefined ? str(m.note) || "Not available."
        : text.length > 6000 ? text.slice(0, 6000) + "\n… (truncated)" : text;
      ol.append(h("li", { class: "inspector-item", "data-origin": origin },
        h("div", { class: "inspector-head" },
          h("span", { class: `badge origin seg-${origin}`, text: origin }),
          h("span", { class: "muted small", text: `${str(m.role) || "?"} · ${fmt(m.tokens)} tokens` })),
        pre));
    }
    el.inspectorBody.append(ol);
  }

  function renderStatsUnavailable() {
    for (const node of [el.meter, el.chart]) {
      node.replaceChildren(h("p", { class: "muted", text: "Not available." }));
    }
  }

  // ───────────────────────────── data loading ─────────────────────────────
  /** GET /api/chat/thread; messages=true re-renders the conversation too. */
  async function loadThread({ messages = true, forceScroll = false } = {}) {
    // Two counters: a newer panel-only load must not swallow an older full render.
    const seq = ++state.threadSeq;
    const msgSeq = messages ? ++state.msgSeq : state.msgSeq;
    const r = await api("GET", API.thread);
    const latest = seq === state.threadSeq;
    const latestMessages = messages && msgSeq === state.msgSeq;
    if (!latest && !latestMessages) return false; // newer loads are on their way
    if (!r.ok || !r.data || typeof r.data !== "object") {
      state.lastFetchFailed = true;
      if (!state.wsOpen) updateBanner();
      else toast(r.message || "Couldn't load the conversation.", "error");
      return false;
    }
    state.lastFetchFailed = false;
    updateBanner();
    const d = r.data;
    const summary = str(d.summary) || str(d.summaryPreview);
    if (state.sawStart === null) state.sawStart = !summary; // a page opened on a summarized thread
    if (latestMessages && !state.turn) {
      renderThread(d.messages, Boolean(summary), d.archived);
      scrollToBottom(forceScroll);
    } else if (latest && Array.isArray(d.messages)) {
      state.serverIds = new Set(d.messages.map((m) => m && m.id));
    }
    if (latest) {
      state.summary = summary;
      renderSummary(summary);
      renderPins(d.pinnedDecisions);
      renderNotes(d.modelNotes);
      renderEarlier();
    }
    return true;
  }

  async function loadStats() {
    const seq = ++state.statsSeq;
    const r = await api("GET", API.stats);
    if (seq !== state.statsSeq) return;
    if (!r.ok || !r.data || typeof r.data !== "object") {
      renderStatsUnavailable();
      return;
    }
    const stats = r.data;
    for (const [fn, name] of [[renderMeter, "meter"], [renderChart, "chart"], [renderCompactions, "compactions"]]) {
      try { fn(stats); } catch (err) { console.warn(`stats ${name} could not be drawn`, err); }
    }
    loadInspector(seq);
  }

  async function loadInspector(seq) {
    const r = await api("GET", API.inspector);
    if (seq !== state.statsSeq) return;
    try {
      renderInspector(r.ok && r.data && typeof r.data === "object" ? r.data : {});
    } catch (err) { console.warn("inspector could not be drawn", err); }
  }

  function refreshMemory() {
    loadThread({ messages: false });
    loadStats();
  }

  // ───────────────────────────── connection ─────────────────────────────
  function setConnection(stateName, text) {
    el.connection.dataset.state = stateName;
    el.connectionText.textContent = text;
  }

  function updateBanner() {
    if (state.wsOpen && !state.lastFetchFailed) {
      el.banner.hidden = true;
      return;
    }
    if (state.wsOpen && state.lastFetchFailed) {
      el.bannerText.textContent = "Can't load the conversation from the server.";
      el.banner.hidden = false;
      return;
    }
    if (!state.reconnectAt) {
      el.banner.hidden = true;
      return;
    }
    const secs = Math.max(0, Math.ceil((state.reconnectAt - Date.now()) / 1000));
    const unreachable = state.lastFetchFailed || state.attempt >= 2 || !state.everConnected;
    const base = unreachable ? "Can't reach the server. Reconnecting" : "Reconnecting";
    el.bannerText.textContent = secs > 0 ? `${base} in ${secs} s…` : `${base}…`;
    el.banner.hidden = false;
  }

  function scheduleReconnect() {
    clearTimeout(state.reconnectTimer);
    clearInterval(state.countdownTimer);
    const delay = BACKOFF_MS[Math.min(state.attempt, BACKOFF_MS.length - 1)];
    state.attempt += 1;
    state.reconnectAt = Date.now() + delay;
    setConnection(state.everConnected ? "reconnecting" : "offline", state.everConnected ? "Reconnecting…" : "Offline");
    updateBanner();
    state.countdownTimer = setInterval(updateBanner, 1000);
    state.reconnectTimer = setTimeout(connect, delay);
  }

  function reconnectNow() {
    if (state.wsOpen) return;
    clearTimeout(state.reconnectTimer);
    clearInterval(state.countdownTimer);
    if (state.ws && state.ws.readyState === WebSocket.CONNECTING) return;
    connect();
  }

  function connect() {
    clearTimeout(state.reconnectTimer);
    clearInterval(state.countdownTimer);
    state.reconnectAt = 0;
    if (!state.everConnected) setConnection("connecting", "Connecting…");
    else { setConnection("reconnecting", "Reconnecting…"); el.bannerText.textContent = "Reconnecting…"; }
    let ws;
    try {
      ws = new WebSocket(WS_URL);
    } catch (_) {
      scheduleReconnect();
      return;
    }
    state.ws = ws;
    ws.addEventListener("open", () => {
      if (state.ws !== ws) return;
      const wasReconnect = state.everConnected;
      state.wsOpen = true;
      state.idle = false;
      state.everConnected = true;
      state.attempt = 0;
      state.reconnectAt = 0;
      setConnection("connected", "Connected");
      updateBanner();
      updateComposer();
      // the view must match server memory (a turn may have been committed while we were away)
      loadThread({ forceScroll: !wasReconnect }).then(() => { if (wasReconnect) loadStats(); });
      if (!wasReconnect) loadStats();
    });
    ws.addEventListener("message", (ev) => {
      if (state.ws !== ws) return;
      if (typeof ev.data !== "string") return;
      let frame;
      try { frame = JSON.parse(ev.data); } catch (_) { return; }
      if (!frame || typeof frame !== "object") return;
      try { handleFrame(frame); } catch (err) { console.error("frame handling failed", err); }
    });
    ws.addEventListener("close", (ev) => {
      if (state.ws !== ws) return;
      state.ws = null;
      state.wsOpen = false;
      if (state.turn) endTurn("interrupted");
      if (el.memoryHint.dataset.status === "started") el.memoryHint.hidden = true; // its outcome may be missed
      updateComposer();
      if (ev.code === CLOSE_IDLE) { idleClosed(); return; }
      if (ev.code === CLOSE_SESSION_LIMIT) state.attempt = Math.max(state.attempt, BACKOFF_MS.length - 1);
      scheduleReconnect();
    });
    ws.addEventListener("error", () => { /* a close event follows */ });
  }

  /** The server closed an idle socket (4408): come back at once if the person is here, else when they are. */
  function idleClosed() {
    state.idle = true;
    state.attempt = 0;
    if (document.visibilityState === "visible" && document.hasFocus()) { backFromIdle(); return; }
    setConnection("idle", "Idle — reconnects when you're back");
  }

  function backFromIdle() {
    if (!state.idle || state.wsOpen) return;
    state.idle = false;
    state.attempt = 0;
    reconnectNow();
  }

  function sendFrame(obj) {
    if (!state.ws || state.ws.readyState !== WebSocket.OPEN) return false;
    try { state.ws.send(JSON.stringify(obj)); return true; } catch (_) { return false; }
  }

  // ───────────────────────────── turns ─────────────────────────────
  function updateComposer() {
    const len = charLength(el.input.value);
    const busy = !!state.turn;
    el.send.hidden = busy;
    el.stop.hidden = !busy;
    el.stop.disabled = busy && !!state.turn.stopping;
    el.stop.textContent = busy && state.turn.stopping ? "Stopping…" : "Stop";
    const tooLong = len > MAX_INPUT;
    el.send.disabled = busy || !state.wsOpen || tooLong || el.input.value.trim() === "";
    el.send.title = !state.wsOpen ? "Not connected" : tooLong ? "Message too long" : "";
    if (len >= MAX_INPUT * 0.8) {
      el.charCount.hidden = false;
      el.charCount.textContent = `${fmt(len)} / ${fmt(MAX_INPUT)}`;
      el.charCount.classList.toggle("over", tooLong);
    } else {
      el.charCount.hidden = true;
    }
  }

  function autosize() {
    el.input.style.height = "auto";
    el.input.style.height = Math.min(el.input.scrollHeight, Math.max(120, window.innerHeight * 0.35)) + "px";
  }

  function sendMessage(textArg) {
    const text = (textArg !== undefined ? textArg : el.input.value).trim();
    if (!text || state.turn) return;
    if (charLength(text) > MAX_INPUT) {
      toast(`That message is too long (${fmt(charLength(text))} characters; the limit is ${fmt(MAX_INPUT)}).`, "error");
      return;
    }
    if (!state.wsOpen) {
      toast("Not connected — your message wasn't sent.", "error");
      return;
    }
    const clientId = uuid();
    if (!sendFrame({ type: "message", id: clientId, text })) {
      toast("Not connected — your message wasn't sent.", "error");
      return;
    }
    const anchor = lastMessageId();
    const userEl = makeBubble({ id: clientId, role: "user", text, local: true, turn: clientId, anchor, createdAt: new Date().toISOString() });
    const botEl = makeBubble({ id: "", role: "assistant", text: "", local: true, turn: clientId, anchor: clientId });
    botEl.classList.add("streaming");
    botEl.setAttribute("aria-busy", "true");
    bubbleParts(botEl).content.append(h("span", { class: "typing" },
      h("i"), h("i"), h("i"), h("span", { class: "visually-hidden", text: "Waiting for the answer" })));
    appendBubble(userEl);
    appendBubble(botEl);
    state.turn = { clientId, text, userEl, botEl, messageId: "", answer: "", started: false, stopping: false, tools: [], stages: [],
      sentAt: Date.now(), waitTimer: 0 };
    state.turn.waitTimer = setInterval(() => showWaiting(state.turn), 250);
    if (textArg === undefined) {
      el.input.value = "";
      autosize();
    }
    updateComposer();
    scrollToBottom(true);
    state.stickToBottom = true;
  }

  /**
   * While a turn has no answer text yet: after WAIT_NOTICE_MS, say what it waits for, with the seconds
   * elapsed ("waiting for the model… 4 s"), updated until the first text arrives.
   */
  function showWaiting(t) {
    if (!t || t !== state.turn || t.answer) return;
    const ms = Date.now() - t.sentAt;
    if (ms < WAIT_NOTICE_MS && !t.waitReason) return;
    const content = bubbleParts(t.botEl).content;
    let note = content.querySelector('[data-testid="waiting"]');
    if (!note) {
      note = h("span", { class: "waiting", "data-testid": "waiting" });
      content.append(note);
    }
    // what the server said it waits behind (a busy bundled model), else only the model
    const reason = t.waitReason ? ` — ${t.waitReason}` : "";
    const text = `waiting for the model… ${Math.floor(ms / 1000)} s${reason}`;
    if (note.textContent !== text) note.textContent = text;
    if (t.waitReason) note.dataset.reason = t.waitFor;
  }

  /** {"type":"waiting"}: the server knows what the turn waits behind; say it in the waiting note at once. */
  function handleWaiting(f) {
    const t = state.turn;
    if (!t || t.answer) return;
    t.waitFor = str(f.for) || "model";
    t.waitReason = f.for === "model_busy" ? "it is answering another message first" : str(f.message);
    showWaiting(t);
  }

  function stopTurn() {
    const t = state.turn;
    if (!t || t.stopping) return;
    t.stopping = true;
    if (!sendFrame({ type: "cancel" })) endTurn("interrupted");
    updateComposer();
  }

  function scheduleRender() {
    if (state.rafPending) return;
    state.rafPending = true;
    requestAnimationFrame(() => {
      state.rafPending = false;
      const t = state.turn;
      if (!t) return;
      renderMarkdown(bubbleParts(t.botEl).content, t.answer);
      scrollToBottom(false);
    });
  }

  /**
   * Settle the turn in flight. outcome: completed | blocked | cancelled | failed | paused | interrupted | rejected.
   * unsaved: done said "saved": false (reason: "thread_cleared" or another string): the answer stays, marked not saved.
   */
  function endTurn(outcome, unsaved) {
    const t = state.turn;
    if (!t) return;
    state.turn = null;
    clearInterval(t.waitTimer);
    const bot = t.botEl;
    bot.classList.remove("streaming");
    bot.removeAttribute("aria-busy");
    bot.dataset.status = outcome;
    const parts = bubbleParts(bot);
    // close any tool card still running
    for (const card of bot.querySelectorAll('[data-testid="tool-card"][data-status="started"]')) {
      card.dataset.status = outcome === "completed" || outcome === "blocked" ? "finished" : "stopped";
      const st = card.querySelector(".tool-status");
      if (st) st.textContent = card.dataset.status === "finished" ? "done" : "stopped";
    }
    const prog = parts.progress;
    if (prog) prog.dataset.done = "1";
    bot._text = t.answer;
    if (t.answer) renderMarkdown(parts.content, t.answer);
    else parts.content.replaceChildren();

    if ((outcome === "completed" || outcome === "blocked") && unsaved) {
      addCodeCopy(parts.content);
      bot.dataset.kept = "false";
      t.userEl.dataset.kept = "false";
      bot.dataset.botId = t.messageId;
      const label = {
        thread_cleared: "not saved (new chat started)",
        store_unavailable: "not saved (memory unavailable)",
      }[unsaved] || "not saved";
      setNote(bot, label, "unsaved");
      setNote(t.userEl, "not saved", "unsaved");
      addActions(bot);
      announce(`The answer is complete but ${label}.`);
    } else if (outcome === "completed" || outcome === "blocked") {
      if (!t.answer) parts.content.append(h("p", { class: "muted", text: "(no answer)" }));
      addCodeCopy(parts.content);
      bot.dataset.kept = "true";
      t.userEl.dataset.kept = "true";
      bot.dataset.botId = t.messageId;
      t.userEl.dataset.botId = t.messageId;
      if (outcome === "blocked") setNote(bot, "blocked", "blocked");
      addActions(bot);
      addActions(t.userEl);
      announce(outcome === "blocked" ? "The answer was blocked." : "Answer complete.");
    } else {
      const label = {
        cancelled: "stopped — not saved to memory",
        paused: "waiting for your confirmation — not saved yet", // a /tasklist run
        failed: "failed — not saved",
        interrupted: "interrupted — not saved",
        rejected: "not sent",
      }[outcome] || "not saved";
      bot.dataset.kept = "false";
      t.userEl.dataset.kept = "false";
      if (!t.answer && outcome !== "rejected") {
        parts.content.append(h("p", { class: "muted", text: outcome === "cancelled" ? "(stopped before any answer)" : "(no answer)" }));
      }
      if (outcome === "rejected") {
        bot.remove(); // the reason is shown as a chat error
        setNote(t.userEl, "not sent", "unsaved");
      } else {
        setNote(bot, label, "unsaved");
        setNote(t.userEl, "not saved", "unsaved");
      }
      const retry = h("button", {
        type: "button", class: "btn btn-small btn-ghost", "data-testid": "retry",
        onclick: () => {
          if (state.turn) return;
          el.input.value = t.text;
          autosize();
          updateComposer();
          el.input.focus();
        },
      }, "Edit & resend");
      bubbleParts(outcome === "rejected" ? t.userEl : bot).actions.replaceChildren(retry);
      announce(outcome === "rejected" ? "The message was not sent." : `The answer ${label}.`);
    }
    updateEmpty();
    updateComposer();
    scrollToBottom(false);
  }

  // ───────────────────────────── tool and progress frames (display only) ─────────────────────────────
  function botForFrame() {
    return state.turn ? state.turn.botEl : null;
  }

  function handleTool(f) {
    const bot = botForFrame();
    if (!bot) return;
    const tools = bubbleParts(bot).tools;
    const name = typeof f.name === "string" && f.name ? f.name : "tool";
    const status = f.status === "finished" ? "finished" : f.status === "started" ? "started" : str(f.status) || "started";
    const callId = typeof f.id === "string" || typeof f.id === "number" ? String(f.id)
      : typeof f.callId === "string" ? f.callId : "";
    let card = null;
    const cards = Array.from(tools.querySelectorAll('[data-testid="tool-card"]'));
    if (callId) card = cards.find((c) => c.dataset.callId === callId) || null;
    if (!card && status !== "started") {
      card = cards.reverse().find((c) => c.dataset.name === name && c.dataset.status === "started") || null;
    }
    if (!card) {
      card = h("details", { class: "tool-card", "data-testid": "tool-card" },
        h("summary", null,
          h("span", { class: "tool-kind", text: "tool" }),
          h("span", { class: "tool-name" }),
          h("span", { class: "tool-status" })),
        h("div", { class: "tool-body" }));
      card.dataset.callId = callId;
      tools.append(card);
    }
    card.dataset.name = name;
    card.dataset.status = status;
    card.querySelector(".tool-name").textContent = name;
    card.querySelector(".tool-status").textContent = status === "started" ? "running…" : status === "finished" ? "done" : status;
    const bodyEl = card.querySelector(".tool-body");
    if (f.arguments !== undefined) card._args = f.arguments;
    if (f.result !== undefined) card._result = f.result;
    bodyEl.replaceChildren();
    if (card._args !== undefined) {
      bodyEl.append(h("div", { class: "tool-label", text: "Arguments" }), h("pre", { text: display(card._args) }));
    }
    if (card._result !== undefined) {
      bodyEl.append(h("div", { class: "tool-label", text: "Result" }), h("pre", { text: display(card._result) }));
    }
    if (card._args === undefined && card._result === undefined) {
      bodyEl.append(h("p", { class: "muted small", text: "No details." }));
    }
    scrollToBottom(false);
  }

  function handleProgress(f) {
    const bot = botForFrame();
    if (!bot) return;
    const t = state.turn;
    const parts = bubbleParts(bot);
    let prog = parts.progress;
    if (!prog) {
      prog = h("div", { class: "progress", "data-testid": "progress" });
      parts.bubble.prepend(prog);
    }
    const stage = typeof f.stage === "string" && f.stage ? f.stage : "working";
    if (!t.stages.includes(stage)) t.stages.push(stage);
    prog.dataset.stage = stage;
    prog.replaceChildren();
    const ol = h("ol", { class: "stages", "aria-label": "Progress" });
    t.stages.forEach((st) => {
      const current = st === stage;
      ol.append(h("li", { class: current ? "stage current" : "stage", "aria-current": current ? "step" : null, text: st }));
    });
    prog.append(ol);
    if (typeof f.message === "string" && f.message) prog.append(h("span", { class: "stage-message", text: f.message }));
  }

  // ───────────────────────────── memory hint ─────────────────────────────
  let hintTimer = 0;
  function handleMemory(f) {
    const status = str(f.status);
    const defaults = { started: "Compacting memory…", succeeded: "Memory compacted", failed: "Memory compaction failed; it will be retried" };
    const text = (typeof f.message === "string" && f.message.trim()) || defaults[status] || "Memory updated";
    el.memoryHint.textContent = text;
    el.memoryHint.dataset.status = status || "info";
    el.memoryHint.hidden = false;
    clearTimeout(hintTimer);
    // "started" waits for its outcome, but not forever (the outcome frame can be missed on a reconnect)
    hintTimer = setTimeout(() => { el.memoryHint.hidden = true; }, status === "started" ? 90000 : 6000);
    if (status === "succeeded") { // folded turns stay on the page, marked as summarized
      loadThread({ messages: !state.turn });
      loadStats();
    } else if (status === "failed") loadStats();
  }

  // ───────────────────────────── frames ─────────────────────────────
  function handleFrame(f) {
    const t = state.turn;
    switch (f.type) {
      case "start": {
        if (!t) return; // a turn this page no longer waits for
        t.started = true;
        t.messageId = str(f.messageId);
        t.botEl.dataset.messageId = t.messageId;
        t.userEl.dataset.botId = t.messageId;
        t.botEl.dataset.botId = t.messageId;
        break;
      }
      case "delta": {
        if (!t || typeof f.text !== "string") return;
        t.answer += f.text;
        scheduleRender();
        break;
      }
      case "tool":
        handleTool(f);
        break;
      case "progress":
        handleProgress(f);
        break;
      case "waiting":
        handleWaiting(f);
        break;
      case "memory":
        handleMemory(f);
        break;
      case "done": {
        const status = str(f.status);
        const unsaved = f.saved === false ? str(f.reason) || "unknown" : "";
        if (t && (!f.messageId || !t.messageId || f.messageId === t.messageId)) {
          endTurn(["completed", "blocked", "cancelled", "failed", "paused"].includes(status) ? status : "failed", unsaved);
        }
        if ((status === "completed" || status === "blocked") && !unsaved) {
          loadThread({ messages: true });
          loadStats();
        } else {
          refreshMemory();
        }
        break;
      }
      case "error": {
        const message = typeof f.message === "string" && f.message ? f.message : "Something went wrong.";
        if (t && !t.started) {
          // the server refused the message before the turn began
          endTurn("rejected");
          if (!el.input.value) { el.input.value = t.text; autosize(); updateComposer(); }
        }
        showChatError(message);
        if (f.code === "llm_unavailable" || f.code === "upstream_truncated") { state.healthChecksSoon = 6; checkModel(); }
        break;
      }
      default:
        break; // unknown frames are ignored
    }
  }

  // ───────────────────────────── model health ─────────────────────────────
  /** GET /healthz: the model banner shows while it says "model": "down"; checks sooner while down. */
  async function checkModel() {
    clearTimeout(state.healthTimer);
    const r = await api("GET", API.health);
    const down = Boolean(r.data && typeof r.data === "object" && r.data.model === "down");
    el.modelBanner.hidden = !down;
    const soon = down || state.healthChecksSoon-- > 0; // after a failed turn the server may not know yet
    state.healthTimer = setTimeout(checkModel, soon ? HEALTH_MS.down : HEALTH_MS.up);
  }

  function showChatError(message) {
    const note = h("p", { class: "chat-error", role: "alert", "data-testid": "chat-error", text: message });
    el.messages.append(note);
    scrollToBottom(true);
    setTimeout(() => { note.classList.add("fade"); }, 8000);
    setTimeout(() => { note.remove(); }, 9000);
  }

  // ───────────────────────────── pins and feedback ─────────────────────────────
  async function addPin(payload, fromMessage) {
    const r = await api("POST", API.pins, payload);
    if (r.ok && r.data && Array.isArray(r.data.pinnedDecisions)) {
      renderPins(r.data.pinnedDecisions);
      renderEarlier();
      showPinError("");
      announce("Pinned.");
      if (fromMessage) toast("Pinned to memory.");
      loadStats();
      return true;
    }
    const message = r.message || "Couldn't pin that.";
    showPinError(message);
    if (fromMessage) toast(message, "error");
    return false;
  }

  function pinFromMessage(article) {
    const id = article.dataset.messageId;
    // a message the server holds is pinned by id (the server takes its stored text); others by text
    const inMemory = id && (state.serverIds.has(id) || (article.dataset.role === "assistant" && article.dataset.kept === "true"));
    if (inMemory) addPin({ messageId: id }, true);
    else addPin({ text: article._text || article.querySelector(".content").textContent }, true);
  }

  async function unpin(n) {
    const r = await api("DELETE", `${API.pins}/${encodeURIComponent(n)}`);
    if (r.ok && r.data && Array.isArray(r.data.pinnedDecisions)) {
      renderPins(r.data.pinnedDecisions);
      renderEarlier();
      showPinError("");
      announce("Unpinned.");
      loadStats();
    } else {
      showPinError(r.message || "Couldn't unpin that.");
      loadThread({ messages: false });
    }
  }

  /** POST /api/chat/notes/<n>/pin (promote) or DELETE /api/chat/notes/<n> (remove). */
  async function changeNote(method, path, done) {
    const r = await api(method, `${API.notes}/${path}`);
    if (r.ok && r.data && Array.isArray(r.data.pinnedDecisions)) {
      renderPins(r.data.pinnedDecisions);
      renderNotes(r.data.modelNotes);
      renderEarlier();
      showPinError("");
      announce(done);
      loadStats();
    } else {
      showPinError(r.message || "Couldn't change that note.");
      loadThread({ messages: false });
    }
  }

  async function sendFeedback(article, rating, reason) {
    const messageId = article.dataset.messageId;
    if (!messageId) return;
    const payload = { messageId, rating };
    if (reason) payload.reason = reason;
    const r = await api("POST", API.feedback, payload);
    if (!r.ok) {
      toast(r.message || "Couldn't send the feedback.", "error");
      return;
    }
    state.feedback.set(messageId, rating);
    for (const b of article.querySelectorAll('[data-testid="thumb-up"], [data-testid="thumb-down"]')) {
      b.setAttribute("aria-pressed", b.dataset.testid === `thumb-${rating}` ? "true" : "false");
    }
    const old = article.querySelector(".reasons");
    if (old) old.remove();
    if (rating === "down" && !reason) {
      const row = h("div", { class: "reasons", role: "group", "aria-label": "What went wrong? (optional)" },
        h("span", { class: "muted small", text: "What went wrong?" }),
        ...FEEDBACK_REASONS.map((rs) => h("button", {
          type: "button", class: "chip", "data-testid": "feedback-reason",
          onclick: () => sendFeedback(article, "down", rs),
        }, rs)));
      article.querySelector(".msg-foot").after(row);
    } else {
      announce("Thanks for the feedback.");
      if (reason) toast("Thanks, noted.");
    }
  }

  // ───────────────────────────── new chat ─────────────────────────────
  async function newChat() {
    if (!window.confirm("Start a new chat? The conversation, its summary and its pinned decisions will be forgotten.")) return;
    if (state.turn) {
      sendFrame({ type: "cancel" });
      endTurn("cancelled");
    }
    el.newChat.disabled = true;
    const r = await api("DELETE", API.thread);
    el.newChat.disabled = false;
    if (!r.ok) {
      toast(r.message || "Couldn't start a new chat.", "error");
      return;
    }
    const old = '[data-testid="message"], [data-testid="fold-divider"], [data-testid="earlier"], .chat-error';
    for (const node of el.messages.querySelectorAll(old)) node.remove();
    state.serverIds = new Set();
    state.feedback.clear();
    state.sawStart = true;
    state.summary = "";
    updateEmpty();
    renderSummary(undefined);
    renderPins([]);
    renderNotes([]);
    announce("New chat started.");
    refreshMemory();
    el.input.focus();
  }

  // ───────────────────────────── drawer (narrow screens) ─────────────────────────────
  const narrow = window.matchMedia("(max-width: 899px)");
  function setDrawer(open) {
    el.panel.classList.toggle("open", open);
    el.backdrop.hidden = !open;
    el.memoryToggle.setAttribute("aria-expanded", String(open));
    if (narrow.matches) {
      if (open) {
        el.panel.setAttribute("role", "dialog");
        el.panel.setAttribute("aria-modal", "true");
        el.drawerClose.focus();
      } else {
        el.panel.removeAttribute("role");
        el.panel.removeAttribute("aria-modal");
      }
    }
  }
  function syncDrawerMode() {
    if (!narrow.matches) {
      el.panel.classList.remove("open");
      el.panel.removeAttribute("role");
      el.panel.removeAttribute("aria-modal");
      el.panel.removeAttribute("inert");
      el.backdrop.hidden = true;
      el.memoryToggle.setAttribute("aria-expanded", "true");
    } else {
      el.memoryToggle.setAttribute("aria-expanded", String(el.panel.classList.contains("open")));
    }
  }

  // ───────────────────────────── wiring ─────────────────────────────
  el.composer.addEventListener("submit", (e) => { e.preventDefault(); sendMessage(); });
  el.input.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing && e.keyCode !== 229) {
      e.preventDefault();
      if (!state.turn) sendMessage();
    }
  });
  el.input.addEventListener("input", () => { autosize(); updateComposer(); });
  el.stop.addEventListener("click", stopTurn);
  el.newChat.addEventListener("click", newChat);
  el.retryNow.addEventListener("click", () => {
    if (state.wsOpen) loadThread(); else { state.attempt = 0; reconnectNow(); }
  });
  el.pinForm.addEventListener("submit", async (e) => {
    e.preventDefault();
    const text = el.pinInput.value.trim();
    if (!text) { showPinError("Type a decision to pin."); return; }
    el.pinAdd.disabled = true;
    const ok = await addPin({ text }, false);
    el.pinAdd.disabled = false;
    if (ok) el.pinInput.value = "";
  });
  el.memoryToggle.addEventListener("click", () => {
    if (!narrow.matches) { el.panel.scrollIntoView({ block: "nearest" }); return; }
    setDrawer(!el.panel.classList.contains("open"));
  });
  el.drawerClose.addEventListener("click", () => { setDrawer(false); el.memoryToggle.focus(); });
  el.backdrop.addEventListener("click", () => setDrawer(false));
  document.addEventListener("keydown", (e) => {
    if (e.key === "Escape" && narrow.matches && el.panel.classList.contains("open")) {
      setDrawer(false);
      el.memoryToggle.focus();
    }
  });
  if (narrow.addEventListener) narrow.addEventListener("change", syncDrawerMode);
  if (el.dismissNotice) {
    el.dismissNotice.addEventListener("click", () => { el.dismissNotice.closest(".notice").hidden = true; });
  }
  el.memoryHint.addEventListener("click", () => { if (narrow.matches) setDrawer(true); });
  document.addEventListener("visibilitychange", () => {
    if (document.visibilityState === "visible" && !state.wsOpen) { state.idle = false; state.attempt = 0; reconnectNow(); }
  });
  window.addEventListener("online", () => { if (!state.wsOpen) { state.attempt = 0; reconnectNow(); } });
  for (const [target, kind] of [[window, "focus"], [document, "keydown"], [document, "pointerdown"]]) {
    target.addEventListener(kind, backFromIdle, { capture: true, passive: true });
  }

  const fullPlaceholder = el.input.getAttribute("placeholder") || "";
  function syncPlaceholder() { el.input.setAttribute("placeholder", narrow.matches ? "Message…" : fullPlaceholder); }
  if (narrow.addEventListener) narrow.addEventListener("change", syncPlaceholder);

  // ───────────────────────────── start ─────────────────────────────
  syncPlaceholder();
  syncDrawerMode();
  renderPins([]);
  renderNotes([]);
  renderCompactions({});
  updateComposer();
  autosize();
  loadThread({ forceScroll: true });
  connect();
  checkModel();
  el.input.focus();
})();
