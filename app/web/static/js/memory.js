// @ts-check
/**
 * Loading server memory and changing it (docs/contract.md: HTTP): GET /api/chat/thread, /api/chat/stats and
 * /api/chat/inspector; pins (POST/DELETE /api/chat/pins) and model notes (POST /api/chat/notes/<n>/pin,
 * DELETE /api/chat/notes/<n>). Newer loads win: an answer to an older one is dropped.
 */
import { api } from "./api.js";
import { API } from "./config.js";
import { announce, el, toast } from "./dom.js";
import { chat, conn, memory, seq } from "./state.js";
import { str } from "./format.js";
import { bubbleText, renderEarlier, renderThread, scrollToBottom, tagTurns } from "./messages.js";
import {
  renderChart, renderCompactions, renderEarliest, renderInspector, renderMeter, renderNotes, renderPins,
  renderRecord, renderStatsUnavailable, renderSummary, showPinError,
} from "./panel.js";
import { foldedTurns, numberMessages } from "./turns.js";
import { updateBanner } from "./connection.js";

/**
 * GET /api/chat/thread; messages=true re-renders the conversation too (not while a turn is in flight).
 * Resolves true when its answer was used.
 * @param {{messages?: boolean, forceScroll?: boolean}} [opts]
 */
export async function loadThread({ messages = true, forceScroll = false } = {}) {
  // Two counters: a newer panel-only load must not swallow an older full render.
  const threadSeq = ++seq.thread;
  const msgSeq = messages ? ++seq.messages : seq.messages;
  const r = await api("GET", API.thread);
  const latest = threadSeq === seq.thread;
  const latestMessages = messages && msgSeq === seq.messages;
  if (!latest && !latestMessages) return false; // newer loads are on their way
  if (!r.ok || !r.data || typeof r.data !== "object") {
    memory.lastFetchFailed = true;
    if (!conn.open) updateBanner();
    else toast(r.message || "Couldn't load the conversation.", "error");
    return false;
  }
  memory.lastFetchFailed = false;
  updateBanner();
  const d = r.data;
  const summary = str(d.summary) || str(d.summaryPreview);
  if (memory.sawStart === null) memory.sawStart = !summary; // a page opened on a summarized thread
  const folded = foldedTurns(d);
  if (latestMessages && !chat.turn) {
    renderThread(d.messages, Boolean(summary), d.archived);
    tagTurns(numberMessages(d.archived, d.messages, folded));
    scrollToBottom(forceScroll);
  } else if (latest && Array.isArray(d.messages)) {
    memory.serverIds = new Set(d.messages.map((/** @type {{id?: string}} */ m) => m && m.id));
  }
  if (latest) {
    memory.summary = summary;
    memory.folded = folded;
    memory.earliestKept = Number.isInteger(d.earliestKeptTurn) ? d.earliestKeptTurn : null;
    renderSummary(summary);
    renderRecord(d.record);
    renderEarliest(d.earliestKeptTurn);
    renderPins(d.pinnedDecisions);
    renderNotes(d.modelNotes);
    renderEarlier();
  }
  return true;
}

/** GET /api/chat/stats, then the inspector: the meter, the chart, the compactions. */
export async function loadStats() {
  const statsSeq = ++seq.stats;
  const r = await api("GET", API.stats);
  if (statsSeq !== seq.stats) return;
  if (!r.ok || !r.data || typeof r.data !== "object") {
    renderStatsUnavailable();
    return;
  }
  const stats = r.data;
  for (const [fn, name] of /** @type {const} */ ([[renderMeter, "meter"], [renderChart, "chart"], [renderCompactions, "compactions"]])) {
    try { fn(stats); } catch (err) { console.warn(`stats ${name} could not be drawn`, err); }
  }
  loadInspector(statsSeq);
}

/** @param {number} statsSeq the stats load it belongs to */
async function loadInspector(statsSeq) {
  const r = await api("GET", API.inspector);
  if (statsSeq !== seq.stats) return;
  try {
    renderInspector(r.ok && r.data && typeof r.data === "object" ? r.data : {});
  } catch (err) { console.warn("inspector could not be drawn", err); }
}

/** The panel again (the conversation stays as shown). */
export function refreshMemory() {
  loadThread({ messages: false });
  loadStats();
}

/**
 * POST /api/chat/pins; resolves true when pinned.
 * @param {{text: string} | {messageId: string}} payload
 * @param {boolean} fromMessage a message's pin button (a toast says what happened)
 */
export async function addPin(payload, fromMessage) {
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
  if (r.unknown) loadThread({ messages: false }); // the pin may be there: the panel shows what memory holds
  if (fromMessage) toast(message, "error");
  return false;
}

/**
 * A message's pin button: a message the server holds is pinned by id (the server takes its stored
 * text); others by text.
 * @param {HTMLElement} article
 */
export function pinFromMessage(article) {
  const id = article.dataset.messageId;
  const inMemory = id && (memory.serverIds.has(id) || (article.dataset.role === "assistant" && article.dataset.kept === "true"));
  if (inMemory) addPin({ messageId: id }, true);
  else {
    const content = article.querySelector(".content");
    addPin({ text: bubbleText(article) || (content ? content.textContent || "" : "") }, true);
  }
}

/** @param {number} n the decision's 1-based position */
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

/**
 * POST /api/chat/notes/<n>/pin (promote) or DELETE /api/chat/notes/<n> (remove).
 * @param {"POST" | "DELETE"} method
 * @param {string} path
 * @param {string} done what to announce when it worked
 */
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

/**
 * The button with data-testid `testid` that `event` hit inside `container`, or null.
 * @param {Event} event
 * @param {HTMLElement} container
 * @param {string} testid
 * @returns {HTMLElement | null}
 */
function hit(event, container, testid) {
  const target = event.target instanceof Element ? event.target.closest(`[data-testid="${testid}"]`) : null;
  return target instanceof HTMLElement && container.contains(target) ? target : null;
}

/** Wire the pin form, the unpin and note buttons, and the messages' pin buttons. */
export function wireMemory() {
  el.pinForm.addEventListener("submit", async (e) => {
    e.preventDefault();
    const text = el.pinInput.value.trim();
    if (!text) { showPinError("Type a decision to pin."); return; }
    el.pinAdd.disabled = true;
    const ok = await addPin({ text }, false);
    el.pinAdd.disabled = false;
    if (ok) el.pinInput.value = "";
  });
  el.pins.addEventListener("click", (e) => {
    const button = hit(e, el.pins, "unpin");
    if (button) unpin(Number(button.dataset.index));
  });
  el.notes.addEventListener("click", (e) => {
    const promote = hit(e, el.notes, "promote-note");
    if (promote) { changeNote("POST", `${promote.dataset.index}/pin`, "Pinned as your decision."); return; }
    const remove = hit(e, el.notes, "remove-note");
    if (remove) changeNote("DELETE", `${remove.dataset.index}`, "Note removed.");
  });
  el.messages.addEventListener("click", (e) => {
    const button = hit(e, el.messages, "pin-message");
    const article = button && button.closest('[data-testid="message"]');
    if (article instanceof HTMLElement) pinFromMessage(article);
  });
}
