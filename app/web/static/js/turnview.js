// @ts-check
/**
 * A turn on the page: sending the message, the frames of docs/contract.md (WebSocket `/ws/chat`) applied to
 * its bubbles, the end of the turn. The decisions are turn.js's and status.js's (no DOM there).
 */
import { announce, el, h, toast, uuid } from "./dom.js";
import { chat } from "./state.js";
import { MAX_INPUT } from "./config.js";
import { charLength, display, fmt, str } from "./format.js";
import { memoryHint, settledToolStatus, unkeptLabel, unsavedLabel } from "./status.js";
import {
  doneDecision, endKind, errorDecision, progressStage, toolInfo, waitingInfo, waitingText,
} from "./turn.js";
import { renderMarkdown } from "./markdown.js";
import {
  addActions, addCodeCopy, appendBubble, bubbleParts, dropForgotten, lastMessageId, makeBubble, scrollToBottom,
  setBubbleText, setNote, showChatError, tellDone, updateEmpty,
} from "./messages.js";
import { NOT_A_TURN } from "./turns.js";
import { autosize, restoreInput, updateComposer } from "./composer.js";
import { loadStats, loadThread, refreshMemory } from "./memory.js";
import { checkModelSoon } from "./health.js";
import { sendFrame } from "./socket.js";
import { api } from "./api.js";
import { API } from "./config.js";

/** @typedef {import("./state.js").Turn} Turn */
/** @typedef {import("./frames.js").ServerFrame} ServerFrame */

/**
 * Send `text` again after `ms` (a rate limit said when), unless the person changed the box or a turn runs.
 * @param {string} text
 * @param {number} ms
 */
function resendLater(text, ms) {
  window.setTimeout(() => {
    if (!chat.turn && el.input.value.trim() === text.trim()) sendMessage();
  }, ms);
}

/**
 * Send a message (the box's text, or `textArg`) and show its turn.
 * @param {string} [textArg]
 */
export function sendMessage(textArg) {
  const text = (textArg !== undefined ? textArg : el.input.value).trim();
  if (!text || chat.turn) return;
  if (charLength(text) > MAX_INPUT) {
    toast(`That message is too long (${fmt(charLength(text))} characters; the limit is ${fmt(MAX_INPUT)}).`, "error");
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
  /** @type {Turn} */
  const turn = {
    clientId, text, userEl, botEl, messageId: "", answer: "", started: false, stopping: false, stages: [],
    sentAt: Date.now(), waitTimer: 0,
  };
  chat.turn = turn;
  turn.waitTimer = window.setInterval(() => showWaiting(turn), 250);
  if (textArg === undefined) {
    el.input.value = "";
    autosize();
  }
  updateComposer();
  scrollToBottom(true);
  chat.stickToBottom = true;
}

/**
 * While a turn has no answer text yet: after a moment, say what it waits for, with the seconds elapsed
 * ("waiting for the model… 4 s"), updated until the first text arrives.
 * @param {Turn} t
 */
function showWaiting(t) {
  if (t !== chat.turn) return;
  const text = waitingText(t, Date.now());
  if (text === null) return;
  const content = bubbleParts(t.botEl).content;
  let note = /** @type {HTMLElement | null} */ (content.querySelector('[data-testid="waiting"]'));
  if (!note) {
    note = h("span", { class: "waiting", "data-testid": "waiting" });
    content.append(note);
  }
  if (note.textContent !== text) note.textContent = text;
  if (t.waitReason) note.dataset.reason = t.waitFor;
}

/** Stop the turn in flight (cancel frame; without a socket it ends here as interrupted). */
export function stopTurn() {
  const t = chat.turn;
  if (!t || t.stopping) return;
  t.stopping = true;
  if (!sendFrame({ type: "cancel" })) endTurn("interrupted");
  updateComposer();
}

function scheduleRender() {
  if (chat.rafPending) return;
  chat.rafPending = true;
  requestAnimationFrame(() => {
    chat.rafPending = false;
    const t = chat.turn;
    if (!t) return;
    renderMarkdown(bubbleParts(t.botEl).content, t.answer);
    scrollToBottom(false);
  });
}

/**
 * Settle the turn in flight. outcome: a `done` status (status.js: DONE_STATUSES), interrupted or rejected.
 * unsaved: done said "saved": false (its reason): the answer stays, marked not saved.
 * @param {string} outcome
 * @param {string} [unsaved]
 */
export function endTurn(outcome, unsaved = "") {
  const t = chat.turn;
  if (!t) return;
  chat.turn = null;
  clearInterval(t.waitTimer);
  const bot = t.botEl;
  bot.classList.remove("streaming");
  bot.removeAttribute("aria-busy");
  bot.dataset.status = outcome;
  const parts = bubbleParts(bot);
  // close any tool card still running
  for (const card of bot.querySelectorAll('[data-testid="tool-card"][data-status="started"]')) {
    if (!(card instanceof HTMLElement)) continue;
    card.dataset.status = settledToolStatus(outcome);
    const st = card.querySelector(".tool-status");
    if (st) st.textContent = card.dataset.status === "finished" ? "done" : "stopped";
  }
  const prog = parts.progress;
  if (prog) prog.dataset.done = "1";
  setBubbleText(bot, t.answer);
  if (t.answer) renderMarkdown(parts.content, t.answer);
  else parts.content.replaceChildren();

  const kind = endKind(outcome, unsaved);
  if (kind === "unsaved") {
    addCodeCopy(parts.content);
    bot.dataset.kept = "false";
    t.userEl.dataset.kept = "false";
    bot.dataset.botId = t.messageId;
    const label = unsavedLabel(unsaved);
    setNote(bot, label, "unsaved");
    setNote(t.userEl, NOT_A_TURN, "unsaved");
    addActions(bot);
    announce(`The answer is complete but ${label}.`);
  } else if (kind === "kept") {
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
    const label = unkeptLabel(outcome);
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
      setNote(t.userEl, NOT_A_TURN, "unsaved");
    }
    const retry = h("button", {
      type: "button", class: "btn btn-small btn-ghost", "data-testid": "retry",
      onclick: () => { if (!chat.turn) restoreInput(t.text, true); },
    }, "Edit & resend");
    bubbleParts(outcome === "rejected" ? t.userEl : bot).actions.replaceChildren(retry);
    announce(outcome === "rejected" ? "The message was not sent." : `The answer ${label}.`);
  }
  updateEmpty();
  updateComposer();
  scrollToBottom(false);
}

/** A tool card's arguments and result so far (a later frame may carry only one). @type {WeakMap<Element, {args?: unknown, result?: unknown}>} */
const toolData = new WeakMap();

/** @param {import("./frames.js").ToolFrame} f */
function handleTool(f) {
  const bot = chat.turn ? chat.turn.botEl : null;
  if (!bot) return;
  const tools = bubbleParts(bot).tools;
  const { name, status, callId, label } = toolInfo(f);
  /** @type {HTMLElement | null} */
  let card = null;
  const cards = /** @type {HTMLElement[]} */ (Array.from(tools.querySelectorAll('[data-testid="tool-card"]')));
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
  /** @param {string} sel */
  const part = (sel) => /** @type {HTMLElement} */ (/** @type {HTMLElement} */ (card).querySelector(sel));
  part(".tool-name").textContent = name;
  part(".tool-status").textContent = label;
  const data = toolData.get(card) || {};
  if (f.arguments !== undefined) data.args = f.arguments;
  if (f.result !== undefined) data.result = f.result;
  toolData.set(card, data);
  const bodyEl = part(".tool-body");
  bodyEl.replaceChildren();
  if (data.args !== undefined) {
    bodyEl.append(h("div", { class: "tool-label", text: "Arguments" }), h("pre", { text: display(data.args) }));
  }
  if (data.result !== undefined) {
    bodyEl.append(h("div", { class: "tool-label", text: "Result" }), h("pre", { text: display(data.result) }));
  }
  if (data.args === undefined && data.result === undefined) {
    bodyEl.append(h("p", { class: "muted small", text: "No details." }));
  }
  scrollToBottom(false);
}

/** @param {import("./frames.js").ProgressFrame} f */
function handleProgress(f) {
  const t = chat.turn;
  if (!t) return;
  const parts = bubbleParts(t.botEl);
  let prog = parts.progress;
  if (!prog) {
    prog = h("div", { class: "progress", "data-testid": "progress" });
    parts.bubble.prepend(prog);
  }
  const stage = progressStage(f);
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

/**
 * A turn whose `done` said `"saved": "unknown"` (docs/contract.md: the done frame): its answer is marked
 * "checking whether it was saved…" (note kind "checking") and GET /api/chat/thread is read, backing off up to
 * 10 s, until it answers (an empty thread only when GET /api/chat/turns/1 says 404: a store that is down
 * hydrates empty too); then the note goes (memory holds the answer) or says "not saved".
 * @param {HTMLElement} bot
 * @param {string} id the answer's message id
 */
async function checkSaved(bot, id) {
  setNote(bot, "checking whether it was saved…", "checking");
  for (let wait = 500; ; wait = Math.min(wait * 2, 10000)) {
    const r = await api("GET", API.thread);
    // the thread reads empty while the store is down too: an empty one is believed once turn 1 is a 404
    const empty = r.ok && r.data && !(Array.isArray(r.data.messages) && r.data.messages.length) && !r.data.summary;
    const known = r.ok && r.data && typeof r.data === "object" &&
      (!empty || (await api("GET", `${API.turns}/1`)).status === 404);
    if (known) {
      const held = [r.data.messages, r.data.archived].some((list) => Array.isArray(list) &&
        list.some((/** @type {any} */ m) => m && m.id === id));
      setNote(bot, held ? "" : "not saved", held ? "" : "unsaved");
      if (!held) bot.dataset.kept = "false";
      announce(held ? "The answer was saved." : "The answer is complete but not saved.");
      if (held) loadThread({ messages: !chat.turn }); // the page shows the turn as memory holds it
      return;
    }
    await new Promise((resolve) => { setTimeout(resolve, wait); });
  }
}

let hintTimer = 0;
/** @param {import("./frames.js").MemoryFrame} f */
function handleMemory(f) {
  const hint = memoryHint(f);
  el.memoryHint.textContent = hint.text;
  el.memoryHint.dataset.status = hint.status;
  el.memoryHint.hidden = false;
  clearTimeout(hintTimer);
  hintTimer = window.setTimeout(() => { el.memoryHint.hidden = true; }, hint.hideAfterMs);
  // a forget (from this tab or another of the session) takes its turn's bubbles off the page first
  if (f.step === "forget" && Array.isArray(f.messageIds)) dropForgotten(new Set(f.messageIds.map(String)));
  if (hint.reload === "thread") { // folded turns stay on the page, marked as summarized
    loadThread({ messages: !chat.turn });
    loadStats();
  } else if (hint.reload === "stats") loadStats();
}

/** The socket closed: the turn in flight is interrupted; a "started" memory hint may never see its outcome. */
export function socketClosed() {
  if (chat.turn) endTurn("interrupted");
  if (el.memoryHint.dataset.status === "started") el.memoryHint.hidden = true;
  updateComposer();
}

/**
 * One frame from the server (docs/contract.md: WebSocket `/ws/chat`).
 * @param {ServerFrame} f
 */
export function handleFrame(f) {
  const t = chat.turn;
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
    case "waiting": {
      if (!t || t.answer) return;
      Object.assign(t, waitingInfo(f));
      showWaiting(t);
      break;
    }
    case "memory":
      handleMemory(f);
      break;
    case "done": {
      const d = doneDecision(f, t);
      const bot = t && d.end !== null ? t.botEl : null;
      if (d.end !== null) endTurn(d.end, d.unsaved);
      if (bot && f.saved === "unknown") checkSaved(bot, str(f.messageId));
      if (d.end !== null && t) tellDone(t.userEl, t.botEl, d.turn, d.note); // its turn number, its length note
      if (d.reload === "thread") {
        loadThread({ messages: true });
        loadStats();
      } else {
        refreshMemory();
      }
      break;
    }
    case "error": {
      const d = errorDecision(f, t);
      if (d.reject && t) {
        // the server refused the message before the turn began
        endTurn("rejected");
        if (!el.input.value) restoreInput(t.text);
        if (d.resendAfterMs) resendLater(t.text, d.resendAfterMs);
      }
      showChatError(d.message);
      if (d.checkModel) checkModelSoon();
      break;
    }
    default:
      break; // unknown frames are ignored
  }
}
