// @ts-check
/**
 * "New chat": DELETE /api/chat/thread (docs/contract.md: HTTP), then an empty page: no bubble, no notice
 * (forget results and errors, the memory hint, pin errors) and no history of the old conversation (an
 * entry the old conversation's compaction records after the clear is not shown either: panel.js
 * historySince). An answer "outcome unknown" reads the thread again and shows what memory holds.
 */
import { api } from "./api.js";
import { API } from "./config.js";
import { announce, el, toast } from "./dom.js";
import { chat, memory } from "./state.js";
import { sendFrame } from "./socket.js";
import { endTurn } from "./turnview.js";
import { updateEmpty } from "./messages.js";
import { historySince, renderCompactions, renderNotes, renderPins, renderSummary } from "./panel.js";
import { loadStats, loadThread, refreshMemory } from "./memory.js";

/** Take every notice of the old conversation off the page. */
function clearNotices() {
  for (const node of [el.forgetResult, el.forgetError, el.pinError, el.memoryHint]) {
    node.textContent = "";
    node.hidden = true;
    delete node.dataset.state;
  }
  el.forgetPreview.replaceChildren();
  el.forgetPreview.hidden = true;
  el.forgetPhrase.value = "";
}

export async function newChat() {
  if (!window.confirm("Start a new chat? The conversation, its summary and its pinned decisions will be forgotten.")) return;
  if (chat.turn) {
    sendFrame({ type: "cancel" });
    endTurn("cancelled");
  }
  el.newChat.disabled = true;
  const askedAt = Date.now();
  const r = await api("DELETE", API.thread);
  el.newChat.disabled = false;
  if (r.unknown) { // the clear may have happened: show what memory holds
    toast(r.message, "error");
    loadThread({ messages: true });
    loadStats();
    return;
  }
  if (!r.ok) {
    toast(r.message || "Couldn't start a new chat.", "error");
    return;
  }
  const old = '[data-testid="message"], [data-testid="fold-divider"], [data-testid="earlier"], .chat-error';
  for (const node of el.messages.querySelectorAll(old)) node.remove();
  memory.serverIds = new Set();
  memory.feedback.clear();
  memory.sawStart = true;
  memory.summary = "";
  updateEmpty();
  renderSummary(undefined);
  renderPins([]);
  renderNotes([]);
  clearNotices();
  historySince(askedAt);
  renderCompactions({ compactions: [] });
  announce("New chat started.");
  refreshMemory();
  el.input.focus();
}
