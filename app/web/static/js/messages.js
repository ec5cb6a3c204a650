// @ts-check
/**
 * The conversation: message bubbles, their actions (copy, pin, thumbs), the re-render from server memory
 * (GET /api/chat/thread, docs/contract.md: HTTP), the fold divider and "Earlier in this conversation".
 * A bubble's facts are data attributes: data-saved (in memory when last loaded), data-local (sent by this
 * page; with data-turn and data-anchor), data-kept (its turn was written), data-bot-id, data-summarized,
 * data-turn-guess (the turn number its position gives, turns.js numberMessages; checked before use),
 * data-memory-turn (the turn number shown under a person's message: the one `done` gave, else the guess).
 */
import { announce, el, h, icon, toast } from "./dom.js";
import { chat, memory } from "./state.js";
import { fmtTime, str, summaryPreview } from "./format.js";
import { renderMarkdown } from "./markdown.js";
import { openMemory } from "./drawer.js";
import { api } from "./api.js";
import { API } from "./config.js";
import { personNote } from "./turns.js";

const FEEDBACK_REASONS = ["forgot something I said", "incorrect", "not helpful"];

/**
 * What `done` frames told this page (docs/contract.md: the done frame), by message id, so that a bubble drawn
 * again from memory keeps it: a person message's memory turn number, an answer's quiet note.
 */
const told = { turns: /** @type {Map<string, number>} */ (new Map()), notes: /** @type {Map<string, string>} */ (new Map()) };

/**
 * Show the memory turn number `n` under a person's message ("turn 3"; data-memory-turn).
 * @param {HTMLElement} article
 * @param {number} n
 */
export function markTurn(article, n) {
  if (!(n > 0) || article.dataset.role !== "user") return;
  article.dataset.memoryTurn = String(n);
  const foot = article.querySelector(".msg-foot");
  if (!foot) return;
  let label = foot.querySelector('[data-testid="turn-number"]');
  if (!label) {
    label = h("span", { class: "turn-no", "data-testid": "turn-number" });
    foot.prepend(label);
  }
  label.textContent = personNote(n, true);
}

/**
 * Keep and show what a `done` frame told about the turn of `userEl` and `botEl`: its memory turn number
 * (0: none) and the note under the answer ("" for none).
 * @param {HTMLElement} userEl
 * @param {HTMLElement} botEl
 * @param {number} turn
 * @param {string} note
 */
export function tellDone(userEl, botEl, turn, note) {
  if (turn > 0) {
    if (userEl.dataset.messageId) told.turns.set(userEl.dataset.messageId, turn);
    markTurn(userEl, turn);
  }
  if (note) {
    const id = botEl.dataset.botId || botEl.dataset.messageId;
    if (id) told.notes.set(id, note);
    setNote(botEl, note, "limit");
  }
}

/**
 * The text of a bubble as written (markdown for the assistant's): its element's `_text` property, which
 * the browser tests read too (tests/test_browser_chat.py).
 * @param {Element} article
 * @returns {string}
 */
export const bubbleText = (article) => /** @type {{_text?: string}} */ (/** @type {unknown} */ (article))._text || "";
/** @param {Element} article @param {string} text */
export const setBubbleText = (article, text) => {
  /** @type {{_text?: string}} */ (/** @type {unknown} */ (article))._text = text;
};

/** @param {Element | null | undefined} node */
const ds = (node) => (node instanceof HTMLElement ? node.dataset : {});

export function updateEmpty() {
  el.empty.hidden = !!el.messages.querySelector('[data-testid="message"], [data-testid="earlier"]');
}

export function nearBottom() {
  const m = el.messages;
  return m.scrollHeight - m.scrollTop - m.clientHeight < 80;
}

/** @param {boolean} [force] scroll even when the person scrolled up */
export function scrollToBottom(force) {
  if (force || chat.stickToBottom) el.messages.scrollTop = el.messages.scrollHeight;
}

/**
 * A bubble. Local bubbles are created by this page (a turn it sent); server bubbles come from
 * /api/chat/thread.
 * @param {{id?: string, role?: unknown, text?: string, createdAt?: string, local?: boolean, turn?: string, anchor?: string}} opts
 * @returns {HTMLElement}
 */
export function makeBubble(opts) {
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
  setBubbleText(article, opts.text || "");
  const turn = opts.id ? told.turns.get(opts.id) : undefined;
  if (turn) markTurn(article, turn);
  const note = opts.id ? told.notes.get(opts.id) : undefined;
  if (note) setNote(article, note, "limit");
  return article;
}

/**
 * The parts of a bubble.
 * @param {Element} article
 */
export function bubbleParts(article) {
  /** @param {string} sel */
  const q = (sel) => /** @type {HTMLElement} */ (article.querySelector(sel));
  return {
    content: q(".content"),
    progress: /** @type {HTMLElement | null} */ (article.querySelector('[data-testid="progress"]')),
    bubble: q(".bubble"),
    tools: q(".tools"),
    note: q(".msg-foot .note"),
    actions: q(".msg-foot .actions"),
  };
}

/**
 * Put text on the clipboard; the button says "Copied" for a moment. Resolves true on success.
 * @param {string} text
 * @param {HTMLElement} [button]
 */
export async function copyText(text, button) {
  let ok;
  try {
    await navigator.clipboard.writeText(text);
    ok = true;
  } catch { // no async clipboard (an insecure origin): the old way
    const area = /** @type {HTMLTextAreaElement} */ (h("textarea", { class: "visually-hidden", readonly: true }));
    area.value = text;
    document.body.append(area);
    area.select();
    try { ok = document.execCommand("copy"); } catch { ok = false; }
    area.remove();
  }
  if (button) {
    button.dataset.copied = ok ? "true" : "false";
    setTimeout(() => { delete button.dataset.copied; }, 1500);
  }
  announce(ok ? "Copied." : "Couldn't copy.");
  return ok;
}

/**
 * A "Copy" button on each code block of rendered markdown: it copies the block's exact code.
 * @param {HTMLElement} content
 */
export function addCodeCopy(content) {
  for (const pre of content.querySelectorAll("pre")) {
    if (pre.parentElement && pre.parentElement.classList.contains("code-wrap")) continue;
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

/**
 * Pin / copy / thumbs buttons for a settled message. The pin button is handled by memory.js (a click
 * on [data-testid="pin-message"] in the conversation).
 * @param {HTMLElement} article
 */
export function addActions(article) {
  const { actions } = bubbleParts(article);
  actions.replaceChildren();
  const role = article.dataset.role;
  const text = bubbleText(article);
  if (role === "assistant" && text) {
    const copy = h("button", {
      type: "button", class: "icon-btn", "data-testid": "copy-answer",
      title: "Copy the answer (as written, in Markdown)", "aria-label": "Copy the answer",
    }, icon("copy"));
    copy.addEventListener("click", () => copyText(bubbleText(article), copy));
    actions.append(copy);
  }
  actions.append(h("button", {
    type: "button", class: "icon-btn", "data-testid": "pin-message",
    title: "Pin this as a decision", "aria-label": "Pin this message as a decision",
  }, icon("pin")));
  const messageId = article.dataset.messageId;
  if (role === "assistant" && messageId) {
    const current = memory.feedback.get(messageId);
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
  addMenu(article);
}

/**
 * The message's menu ("More"): "Forget this" forgets the message's whole turn (handled by forget.js, a click
 * on [data-testid="forget-message"] in the conversation). Only for a message the server has an id for.
 * @param {HTMLElement} article
 */
export function addMenu(article) {
  if (!(article.dataset.messageId || article.dataset.botId)) return;
  const { actions } = bubbleParts(article);
  const old = actions.querySelector('[data-testid="message-menu"]');
  if (old) old.remove();
  actions.append(h("details", { class: "msg-menu", "data-testid": "message-menu" },
    h("summary", { class: "icon-btn", title: "More", "aria-label": "More actions for this message" }, "⋯"),
    h("div", { class: "menu-list", role: "group", "aria-label": "Message actions" },
      h("button", {
        type: "button", class: "menu-item", "data-testid": "forget-message",
        title: "Forget this turn: your message and the answer, everywhere the memory holds them",
      }, "Forget this"))));
}

/**
 * Write each bubble's guessed turn number (data-turn-guess) from numberMessages' map, and show a number
 * under each person's message memory holds: the one a `done` frame gave it, else the guess.
 * @param {Map<string, number>} numbers message id -> turn
 */
export function tagTurns(numbers) {
  for (const b of el.messages.querySelectorAll('[data-testid="message"]')) {
    if (!(b instanceof HTMLElement)) continue;
    const id = b.dataset.messageId || "";
    const n = numbers.get(id) || numbers.get(b.dataset.botId || "");
    if (n) b.dataset.turnGuess = String(n);
    if (b.dataset.role === "user" && b.dataset.kept !== "false") markTurn(b, told.turns.get(id) || n || 0);
  }
}

/**
 * Take forgotten messages off the page before the conversation is drawn again from memory: the bubbles of
 * `ids` (their message or bot id), or, when the ids are not known (a forget by phrase), every bubble that
 * came from memory (saved, kept, summarized, archived); the turn in flight and unsent bubbles stay.
 * @param {Set<string> | null} ids
 */
export function dropForgotten(ids) {
  const inFlight = chat.turn ? chat.turn.clientId : null;
  for (const b of el.messages.querySelectorAll('[data-testid="message"]')) {
    if (!(b instanceof HTMLElement) || (inFlight && b.dataset.turn === inFlight)) continue;
    const hit = ids
      ? ids.has(b.dataset.messageId || "") || ids.has(b.dataset.botId || "")
      : b.dataset.saved === "1" || b.dataset.kept === "true" || b.dataset.summarized === "true";
    if (hit) b.remove();
  }
  if (!el.messages.querySelector('[data-testid="message"][data-summarized="true"]')) {
    for (const d of el.messages.querySelectorAll('[data-testid="fold-divider"]')) d.remove();
  }
  updateEmpty();
}

/**
 * The note under a bubble ("not saved", "blocked", ...).
 * @param {HTMLElement} article
 * @param {string} text
 * @param {string} [kind]
 */
export function setNote(article, text, kind) {
  const { note } = bubbleParts(article);
  note.textContent = text || "";
  note.dataset.kind = kind || "";
}

/** @param {HTMLElement} article */
export function appendBubble(article) {
  el.messages.append(article);
  updateEmpty();
}

/** The id of the last bubble shown ("" when none). */
export function lastMessageId() {
  const all = el.messages.querySelectorAll('[data-testid="message"]');
  return all.length ? ds(all[all.length - 1]).messageId || "" : "";
}

/**
 * @typedef {{id?: unknown, role?: unknown, text?: unknown, createdAt?: unknown}} ThreadMessage
 */

/**
 * Re-render the conversation from server memory, keeping this page's own unsaved bubbles.
 * folded: the thread has a summary. Then what this page showed that memory no longer holds word for
 * word (a compaction folded it into the summary) stays, marked data-summarized="true", before a
 * divider; nothing the person saw disappears while the page is open.
 * archived: the folded turns the thread's archive keeps (hydration's "archived"), shown the same way,
 * so that after a reload the earlier conversation is still there, dimmed.
 * @param {unknown} messages
 * @param {boolean} folded
 * @param {unknown} archived
 */
export function renderThread(messages, folded, archived) {
  /** @type {ThreadMessage[]} */
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
  const inFlight = chat.turn ? chat.turn.clientId : null;
  const keep = [];
  /** @type {HTMLElement[]} */
  const summarized = [];
  for (const b of el.messages.querySelectorAll('[data-testid="message"]')) {
    if (!(b instanceof HTMLElement)) continue;
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
  for (const m of /** @type {ThreadMessage[]} */ (Array.isArray(archived) ? archived : [])) {
    if (!m || typeof m !== "object" || typeof m.text !== "string" || ids.has(str(m.id))) continue;
    let b = byId.get(str(m.id));
    if (b) byId.delete(str(m.id));
    else {
      b = makeBubble({ id: str(m.id), role: m.role, text: m.text, createdAt: str(m.createdAt) });
      b.dataset.summarized = "true";
      b.dataset.archived = "true";
      addMenu(b);
    }
    ordered.push(b);
  }
  for (const b of summarized) if (byId.has(b.dataset.messageId)) ordered.push(b);
  for (const b of el.messages.querySelectorAll('[data-testid="message"], [data-testid="fold-divider"]')) b.remove();
  for (const b of ordered) el.messages.append(b);
  if (ordered.length) el.messages.append(foldDivider());
  for (const b of fresh) el.messages.append(b);
  for (const b of keep) {
    const anchor = b.dataset.anchor
      ? el.messages.querySelector(`[data-testid="message"][data-message-id="${CSS.escape(b.dataset.anchor)}"]`)
      : null;
    if (anchor) {
      // after the anchor and any local bubbles already placed after it
      let after = anchor;
      while (after.nextElementSibling && ds(after.nextElementSibling).local === "1" &&
        ds(after.nextElementSibling).anchor === b.dataset.anchor) after = after.nextElementSibling;
      after.after(b);
    } else if (!b.dataset.anchor) {
      const first = el.messages.querySelector('[data-testid="message"]:not([data-summarized])');
      if (first && !ds(first).local) el.messages.insertBefore(b, first); else el.messages.append(b);
    } else {
      el.messages.append(b);
    }
  }
  memory.serverIds = ids;
  updateEmpty();
}

/** The line after the turns a compaction folded: it opens the memory panel at the summary. */
function foldDivider() {
  return h("div", { class: "fold-divider", "data-testid": "fold-divider", role: "separator" },
    h("button", { type: "button", class: "linklike", onclick: () => openMemory(el.summarySection) },
      "Earlier turns are now kept as a summary"));
}

/**
 * The first item of the conversation when this page did not show the thread from its start (a reload):
 * "Earlier in this conversation", collapsible, with the summary and the pinned decisions.
 */
export function renderEarlier() {
  let node = el.messages.querySelector('[data-testid="earlier"]');
  if (memory.sawStart !== false || !memory.summary) {
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
  const preview = /** @type {HTMLElement} */ (node.querySelector(".earlier-preview"));
  preview.textContent = summaryPreview(memory.summary);
  const body = /** @type {HTMLElement} */ (node.querySelector(".earlier-body"));
  body.replaceChildren(
    h("p", { class: "muted small", text: "Older turns are kept as this summary; the model reads it, not the turns themselves." }),
    h("div", { class: "earlier-text", "data-testid": "earlier-summary", text: memory.summary }));
  if (memory.pins.length) {
    body.append(h("p", { class: "earlier-label", text: `Your pinned decisions (${memory.pins.length})` }),
      h("ol", { class: "earlier-pins" }, ...memory.pins.map((t) => h("li", { "data-by": "person", text: t }))));
  }
  body.append(h("button", {
    type: "button", class: "btn btn-small btn-ghost", "data-testid": "earlier-open-memory",
    onclick: () => openMemory(el.summarySection),
  }, memory.pins.length || memory.notes.length ? "Open memory: summary, decisions and notes" : "Open memory"));
  updateEmpty();
}

/**
 * An error under the conversation, fading after 8 s.
 * @param {string} message
 */
export function showChatError(message) {
  const note = h("p", { class: "chat-error", role: "alert", "data-testid": "chat-error", text: message });
  el.messages.append(note);
  scrollToBottom(true);
  setTimeout(() => { note.classList.add("fade"); }, 8000);
  setTimeout(() => { note.remove(); }, 9000);
}

/**
 * POST /api/chat/feedback; after a thumbs-down, the reasons to choose from (a second POST).
 * @param {HTMLElement} article
 * @param {"up" | "down"} rating
 * @param {string} [reason]
 */
export async function sendFeedback(article, rating, reason) {
  const messageId = article.dataset.messageId;
  if (!messageId) return;
  /** @type {{messageId: string, rating: string, reason?: string}} */
  const payload = { messageId, rating };
  if (reason) payload.reason = reason;
  const r = await api("POST", API.feedback, payload);
  if (!r.ok) {
    toast(r.message || "Couldn't send the feedback.", "error");
    return;
  }
  memory.feedback.set(messageId, rating);
  for (const b of article.querySelectorAll('[data-testid="thumb-up"], [data-testid="thumb-down"]')) {
    b.setAttribute("aria-pressed", ds(b).testid === `thumb-${rating}` ? "true" : "false");
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
    const foot = article.querySelector(".msg-foot");
    if (foot) foot.after(row);
  } else {
    announce("Thanks for the feedback.");
    if (reason) toast("Thanks, noted.");
  }
}
