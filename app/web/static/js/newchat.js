// @ts-check
/** "New chat": DELETE /api/chat/thread (docs/contract.md: HTTP), then an empty page. */
import { api } from "./api.js";
import { API } from "./config.js";
import { announce, el, toast } from "./dom.js";
import { chat, memory } from "./state.js";
import { sendFrame } from "./socket.js";
import { endTurn } from "./turnview.js";
import { updateEmpty } from "./messages.js";
import { renderNotes, renderPins, renderSummary } from "./panel.js";
import { refreshMemory } from "./memory.js";

export async function newChat() {
  if (!window.confirm("Start a new chat? The conversation, its summary and its pinned decisions will be forgotten.")) return;
  if (chat.turn) {
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
  memory.serverIds = new Set();
  memory.feedback.clear();
  memory.sawStart = true;
  memory.summary = "";
  updateEmpty();
  renderSummary(undefined);
  renderPins([]);
  renderNotes([]);
  announce("New chat started.");
  refreshMemory();
  el.input.focus();
}
