// @ts-check
/** The message box: its send and stop buttons, the character count, its height. */
import { el, narrow } from "./dom.js";
import { chat, conn } from "./state.js";
import { MAX_INPUT } from "./config.js";
import { charLength, fmt } from "./format.js";

/** The buttons and the count after any change of the text, the connection or the turn. */
export function updateComposer() {
  const len = charLength(el.input.value);
  const t = chat.turn;
  const busy = !!t;
  el.send.hidden = busy;
  el.stop.hidden = !busy;
  el.stop.disabled = busy && !!t.stopping;
  el.stop.textContent = busy && t.stopping ? "Stopping…" : "Stop";
  const tooLong = len > MAX_INPUT;
  el.send.disabled = busy || !conn.open || tooLong || el.input.value.trim() === "";
  el.send.title = !conn.open ? "Not connected" : tooLong ? "Message too long" : "";
  if (len >= MAX_INPUT * 0.8) {
    el.charCount.hidden = false;
    el.charCount.textContent = `${fmt(len)} / ${fmt(MAX_INPUT)}`;
    el.charCount.classList.toggle("over", tooLong);
  } else {
    el.charCount.hidden = true;
  }
}

/** Grow the box with its text, up to a third of the window. */
export function autosize() {
  el.input.style.height = "auto";
  el.input.style.height = Math.min(el.input.scrollHeight, Math.max(120, window.innerHeight * 0.35)) + "px";
}

/**
 * Put `text` back in the box (a message to resend) and focus it.
 * @param {string} text
 * @param {boolean} [focus]
 */
export function restoreInput(text, focus) {
  el.input.value = text;
  autosize();
  updateComposer();
  if (focus) el.input.focus();
}

const fullPlaceholder = el.input.getAttribute("placeholder") || "";
/** A shorter placeholder on narrow screens. */
export function syncPlaceholder() {
  el.input.setAttribute("placeholder", narrow.matches ? "Message…" : fullPlaceholder);
}
