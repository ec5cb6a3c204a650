// @ts-check
/**
 * The page's elements, and small DOM helpers: element builders (text goes in through textContent only),
 * icons, the screen-reader announcer, the toast.
 */

/** @param {string} id */
const byId = (id) => /** @type {HTMLElement} */ (document.getElementById(id));
/** @param {string} sel */
const q = (sel) => /** @type {HTMLElement} */ (document.querySelector(sel));

/** The elements of templates/index.html the page uses. */
export const el = {
  messages: byId("messages"),
  empty: byId("empty-state"),
  composer: /** @type {HTMLFormElement} */ (byId("composer")),
  input: /** @type {HTMLTextAreaElement} */ (byId("message-input")),
  send: /** @type {HTMLButtonElement} */ (byId("send")),
  stop: /** @type {HTMLButtonElement} */ (byId("stop")),
  charCount: byId("char-count"),
  newChat: /** @type {HTMLButtonElement} */ (byId("new-chat")),
  connection: q('[data-testid="connection"]'),
  connectionText: q('[data-testid="connection"] .connection-text'),
  banner: byId("banner"),
  bannerText: q("#banner .banner-text"),
  retryNow: byId("retry-now"),
  modelBanner: byId("model-banner"),
  memoryHint: q('[data-testid="memory-hint"]'),
  memoryToggle: byId("memory-toggle"),
  panel: byId("memory-panel"),
  backdrop: byId("drawer-backdrop"),
  drawerClose: byId("drawer-close"),
  summary: byId("summary"),
  earliestKept: byId("earliest-kept"),
  recordDetails: byId("record-details"),
  recordLines: byId("record-lines"),
  forgetForm: /** @type {HTMLFormElement} */ (byId("forget-form")),
  forgetPhrase: /** @type {HTMLInputElement} */ (byId("forget-phrase")),
  forgetFind: /** @type {HTMLButtonElement} */ (byId("forget-find")),
  forgetPreview: byId("forget-preview"),
  forgetError: byId("forget-error"),
  forgetResult: byId("forget-result"),
  exportJson: /** @type {HTMLAnchorElement} */ (byId("export-json")),
  exportMarkdown: /** @type {HTMLButtonElement} */ (byId("export-markdown")),
  turnDialog: byId("turn-dialog"),
  turnDialogBody: byId("turn-dialog-body"),
  turnDialogTitle: byId("turn-dialog-title"),
  turnDialogForget: /** @type {HTMLButtonElement} */ (byId("turn-dialog-forget")),
  confirmDialog: byId("confirm-dialog"),
  confirmText: byId("confirm-text"),
  confirmQuote: byId("confirm-quote"),
  confirmOk: /** @type {HTMLButtonElement} */ (byId("confirm-ok")),
  pins: byId("pins"),
  pinsEmpty: byId("pins-empty"),
  pinsCount: byId("pins-count"),
  notes: byId("notes"),
  notesEmpty: byId("notes-empty"),
  notesCount: byId("notes-count"),
  summarySection: byId("summary-section"),
  pinForm: /** @type {HTMLFormElement} */ (byId("pin-form")),
  pinInput: /** @type {HTMLInputElement} */ (byId("pin-input")),
  pinAdd: /** @type {HTMLButtonElement} */ (byId("pin-add")),
  pinError: byId("pin-error"),
  meter: byId("context-meter"),
  chart: byId("token-chart"),
  compactions: byId("compactions"),
  compactionsEmpty: byId("compactions-empty"),
  inspector: byId("inspector"),
  inspectorBody: byId("inspector-body"),
  toast: byId("toast"),
  srStatus: byId("sr-status"),
  dismissNotice: /** @type {HTMLElement | null} */ (document.getElementById("dismiss-notice")),
};

/** @typedef {Node | string | number | null | undefined | false} Child */

/**
 * Build an element. attrs: "class", "text" (textContent), "dataset", "on<event>" handlers, other
 * attributes (true: present and empty; undefined, null, false: absent).
 * @param {string} tag
 * @param {Record<string, unknown> | null} [attrs]
 * @param {...Child} children
 * @returns {HTMLElement}
 */
export function h(tag, attrs, ...children) {
  const node = document.createElement(tag);
  if (attrs) {
    for (const [k, v] of Object.entries(attrs)) {
      if (v === undefined || v === null || v === false) continue;
      if (k === "class") node.className = String(v);
      else if (k === "text") node.textContent = String(v);
      else if (k === "dataset") Object.assign(node.dataset, v);
      else if (k.startsWith("on") && typeof v === "function") node.addEventListener(k.slice(2), /** @type {EventListener} */ (v));
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

/**
 * Build an SVG element ("text": its textContent).
 * @param {string} tag
 * @param {Record<string, unknown>} [attrs]
 * @returns {SVGElement}
 */
export function s(tag, attrs) {
  const node = /** @type {SVGElement} */ (document.createElementNS(SVG_NS, tag));
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "text") node.textContent = String(v);
    else node.setAttribute(k, String(v));
  }
  return node;
}

/** Tiny stroke icons drawn here (emoji fonts are not everywhere). */
const ICONS = {
  pin: ["M9 3h6l-1 6 3 3v2H7v-2l3-3z", "M12 14v7"],
  copy: ["M9 9h11v11H9z", "M5 15H4V4h11v1"],
  up: ["M7 11v9H3v-9z", "M7 11l4-8c1.6 0 2.6 1.2 2.3 2.8L12.6 10H19a2 2 0 0 1 2 2.3l-1.2 6A2 2 0 0 1 17.8 20H7"],
};

/**
 * An icon; flip turns it upside down (thumbs down).
 * @param {keyof typeof ICONS} name
 * @param {boolean} [flip]
 */
export function icon(name, flip) {
  const svg = s("svg", { viewBox: "0 0 24 24", width: 16, height: 16, "aria-hidden": "true", focusable: "false", class: "icon" });
  if (flip) svg.classList.add("flip");
  for (const d of ICONS[name]) {
    svg.append(s("path", { d, fill: "none", stroke: "currentColor", "stroke-width": 1.8, "stroke-linejoin": "round", "stroke-linecap": "round" }));
  }
  return svg;
}

/**
 * Say `text` to screen readers.
 * @param {string} text
 */
export function announce(text) {
  el.srStatus.textContent = "";
  // a fresh text node so repeated messages are announced again
  setTimeout(() => { el.srStatus.textContent = text; }, 30);
}

let toastTimer = 0;
/**
 * Show a toast for 5 s.
 * @param {string} text
 * @param {"info" | "error"} [kind]
 */
export function toast(text, kind) {
  el.toast.textContent = text;
  el.toast.dataset.kind = kind || "info";
  el.toast.hidden = false;
  clearTimeout(toastTimer);
  toastTimer = window.setTimeout(() => { el.toast.hidden = true; }, 5000);
}

/** A random UUID (crypto.randomUUID needs a secure context; getRandomValues does not). */
export function uuid() {
  if (window.crypto && typeof crypto.randomUUID === "function") return crypto.randomUUID();
  const b = new Uint8Array(16);
  crypto.getRandomValues(b);
  b[6] = (b[6] & 0x0f) | 0x40;
  b[8] = (b[8] & 0x3f) | 0x80;
  const hex = Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
}

/** The narrow layout (the memory panel is a drawer). */
export const narrow = window.matchMedia("(max-width: 899px)");
