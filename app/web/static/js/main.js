// @ts-check
/**
 * The chat page's entry point (templates/index.html loads it as a module, after the vendored marked and
 * DOMPurify scripts; no build step, no framework). It wires the modules together and starts.
 * The server's side of everything here is docs/contract.md.
 */
import { el, narrow } from "./dom.js";
import { chat, conn } from "./state.js";
import { connect, backFromIdle, reconnectNow, reconnectSoon, setSocketHooks } from "./socket.js";
import { handleFrame, sendMessage, socketClosed, stopTurn } from "./turnview.js";
import { autosize, syncPlaceholder, updateComposer } from "./composer.js";
import { loadStats, loadThread, wireMemory } from "./memory.js";
import { nearBottom } from "./messages.js";
import { renderCompactions, renderNotes, renderPins } from "./panel.js";
import { syncDrawerMode, wireDrawer } from "./drawer.js";
import { checkModel } from "./health.js";
import { newChat } from "./newchat.js";
import { wireForget } from "./forget.js";

setSocketHooks({
  onOpen(wasReconnect) {
    updateComposer();
    // the view must match server memory (a turn may have been committed while we were away)
    loadThread({ forceScroll: !wasReconnect }).then(() => { if (wasReconnect) loadStats(); });
    if (!wasReconnect) loadStats();
  },
  onFrame: handleFrame,
  onClose: socketClosed,
});

el.messages.addEventListener("scroll", () => { chat.stickToBottom = nearBottom(); }, { passive: true });
el.composer.addEventListener("submit", (e) => { e.preventDefault(); sendMessage(); });
el.input.addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey && !e.isComposing && e.keyCode !== 229) {
    e.preventDefault();
    if (!chat.turn) sendMessage();
  }
});
el.input.addEventListener("input", () => { autosize(); updateComposer(); });
el.stop.addEventListener("click", stopTurn);
el.newChat.addEventListener("click", newChat);
el.retryNow.addEventListener("click", () => {
  if (conn.open) loadThread(); else { conn.attempt = 0; reconnectNow(); }
});
wireMemory();
wireForget();
wireDrawer();
if (el.dismissNotice) {
  const notice = el.dismissNotice.closest(".notice");
  el.dismissNotice.addEventListener("click", () => { if (notice instanceof HTMLElement) notice.hidden = true; });
}
document.addEventListener("visibilitychange", () => {
  if (document.visibilityState === "visible" && !conn.open) { conn.idle = false; reconnectSoon(); }
});
window.addEventListener("online", reconnectSoon);
for (const [target, kind] of /** @type {const} */ ([[window, "focus"], [document, "keydown"], [document, "pointerdown"]])) {
  target.addEventListener(kind, backFromIdle, { capture: true, passive: true });
}
if (narrow.addEventListener) narrow.addEventListener("change", syncPlaceholder);

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
