// @ts-check
/**
 * Provenance, forgetting and export (docs/contract.md: HTTP): a remembered line or a recalled excerpt opens
 * the turn it came from (GET /api/chat/turns/<n>, shown as plain text in a dialog); "Forget this" on a
 * message or a line forgets its turn (DELETE /api/chat/turns/<n>) after asking; "Forget everything
 * about…" previews (GET /api/chat/forget?phrase=…) and forgets the chosen turns (POST /api/chat/forget);
 * the thread downloads as JSON (GET /api/chat/export) or as Markdown built here (exportmd.js).
 * Stored text only ever goes in through textContent.
 */
import { api } from "./api.js";
import { API } from "./config.js";
import { announce, el, h, toast } from "./dom.js";
import { chat, memory } from "./state.js";
import { dropForgotten } from "./messages.js";
import { loadStats, loadThread } from "./memory.js";
import { exportMarkdown } from "./exportmd.js";
import {
  forgottenText, groupPreview, pinsQuotingText, previewTurns, probeOrder, turnHolds, whereText,
} from "./turns.js";

/** @typedef {{turn: number, where: string, reason: string | null, messages: {id: string, role: string, text: string, createdAt: string}[]}} TurnData */

/** @param {number} n */
const turnUrl = (n) => `${API.turns}/${encodeURIComponent(String(n))}`;

/**
 * A dialog element's methods, where the browser has them.
 * @param {HTMLElement} node
 * @returns {{showModal?: () => void, close?: (v?: string) => void, open?: boolean, returnValue?: string}}
 */
const dialog = (node) => /** @type {any} */ (node);

/**
 * Open a dialog at its top: its title takes the focus (showModal would focus the first button, below a long
 * answer, and scroll the text being asked about out of view), and every scrolled part goes back to its top.
 * @param {HTMLElement} node
 */
function openDialog(node) {
  const d = dialog(node);
  if (typeof d.showModal === "function") { if (!d.open) d.showModal(); } else node.setAttribute("open", "");
  const title = node.querySelector(".dialog-title");
  if (title instanceof HTMLElement) {
    title.tabIndex = -1;
    title.focus({ preventScroll: true });
  }
  for (const part of [node, ...node.querySelectorAll(".dialog-body")]) part.scrollTop = 0;
}

/** @param {HTMLElement} node */
function closeDialog(node) {
  const d = dialog(node);
  if (typeof d.close === "function") d.close(); else node.removeAttribute("open");
}

/**
 * GET /api/chat/turns/<n>; null with a message when it failed.
 * @param {number} n
 * @returns {Promise<{turn: TurnData | null, message: string, status: number}>}
 */
async function getTurn(n) {
  const r = await api("GET", turnUrl(n));
  if (r.ok && r.data && typeof r.data === "object") return { turn: r.data, message: "", status: r.status };
  return {
    turn: null, status: r.status,
    message: r.status === 404 ? `There is no turn ${n} in this conversation.` : r.message || "Couldn't load that turn.",
  };
}

/**
 * A turn's messages as plain text blocks.
 * @param {TurnData} turn
 */
function turnBlocks(turn) {
  const list = Array.isArray(turn.messages) ? turn.messages : [];
  return list.filter((m) => m && typeof m === "object").map((m) =>
    h("div", { class: `turn-msg turn-msg-${m.role === "user" ? "user" : "assistant"}`, "data-testid": "turn-message",
      "data-role": m.role === "user" ? "user" : "assistant" },
      h("div", { class: "turn-who muted small", text: m.role === "user" ? "You" : "Assistant" }),
      h("div", { class: "turn-text", text: typeof m.text === "string" ? m.text : "" })));
}

/** The turn shown in the turn dialog (its "Forget this turn" button forgets it). */
let shownTurn = /** @type {TurnData | null} */ (null);

/**
 * "Why does it know this?": turn n in the turn dialog, with where it lives now.
 * @param {number} n
 */
export async function openTurn(n) {
  if (!Number.isInteger(n) || n < 1) return;
  const { turn, message } = await getTurn(n);
  shownTurn = turn;
  el.turnDialogTitle.textContent = `Turn ${n}`;
  el.turnDialogBody.replaceChildren();
  if (!turn) {
    el.turnDialogBody.append(h("p", { class: "error-text", "data-testid": "turn-where", text: message }));
    el.turnDialogForget.hidden = true;
  } else {
    el.turnDialog.dataset.where = String(turn.where || "");
    el.turnDialogBody.append(h("p", { class: "turn-where", "data-testid": "turn-where", text: whereText(turn.where, turn.reason) }),
      ...turnBlocks(turn));
    // a turn the archive dropped may still have summary lines and notes made from it: those can go
    el.turnDialogForget.hidden = turn.where === "gone" && turn.reason === "forgotten";
    el.turnDialogForget.dataset.turn = String(n);
  }
  openDialog(el.turnDialog);
}

/** The pending answer of the confirm dialog. @type {((ok: boolean) => void) | null} */
let confirmResolve = null;

/**
 * Ask before forgetting: the confirm dialog with `text` and, when given, the turn's messages.
 * @param {string} text
 * @param {TurnData | null} turn
 * @param {string} okLabel
 * @returns {Promise<boolean>}
 */
function ask(text, turn, okLabel) {
  if (confirmResolve) confirmResolve(false);
  el.confirmText.textContent = text;
  el.confirmQuote.replaceChildren(...(turn ? turnBlocks(turn) : []));
  el.confirmQuote.hidden = !turn;
  el.confirmOk.textContent = okLabel;
  openDialog(el.confirmDialog);
  return new Promise((resolve) => { confirmResolve = resolve; });
}

/** @param {boolean} ok */
function answer(ok) {
  const resolve = confirmResolve;
  confirmResolve = null;
  closeDialog(el.confirmDialog);
  if (resolve) resolve(ok);
}

/**
 * What a forget did, said in the panel (data-testid="forget-result") and in a toast.
 * @param {unknown} forgotten
 * @param {unknown} pinsQuoting
 */
function sayForgotten(forgotten, pinsQuoting) {
  const pins = pinsQuotingText(pinsQuoting);
  const text = forgottenText(forgotten) + (pins ? ` ${pins}` : "");
  el.forgetResult.dataset.state = "known";
  el.forgetResult.textContent = text;
  el.forgetResult.hidden = false;
  toast(text);
  announce(text);
}

/** @param {number} ms */
const sleep = (ms) => new Promise((resolve) => { setTimeout(resolve, ms); });

/** Longest pause between two checks of a forget whose outcome is unknown, milliseconds. */
const CHECK_MAX_MS = 10000;

/**
 * A forget answered "outcome unknown" (its reply was lost; docs/contract.md: HTTP): say so, then read each
 * turn again (GET /api/chat/turns/<n>, backing off up to CHECK_MAX_MS) until every one answers, and say
 * which were forgotten. The panel's notice has data-state "checking" meanwhile, then "known".
 * @param {number[]} turns
 * @param {Set<string> | null} ids the turns' message ids when known
 */
async function settleForget(turns, ids) {
  const label = turns.length === 1 ? `turn ${turns[0]}` : `turns ${turns.join(", ")}`;
  el.forgetResult.dataset.state = "checking";
  el.forgetResult.textContent = `Checking whether ${label} ${turns.length === 1 ? "was" : "were"} forgotten…`;
  el.forgetResult.hidden = false;
  for (let wait = 500; ; wait = Math.min(wait * 2, CHECK_MAX_MS)) {
    const answers = await Promise.all(turns.map((n) => getTurn(n)));
    if (answers.every((a) => a.turn || a.status === 404)) {
      const gone = turns.filter((_n, i) => {
        const t = answers[i].turn;
        return t && t.where === "gone" && t.reason === "forgotten";
      });
      const kept = turns.filter((n) => !gone.includes(n));
      if (gone.length) dropForgotten(ids);
      const text = [gone.length ? `${gone.length === 1 ? `Turn ${gone[0]} was` : `Turns ${gone.join(", ")} were`} forgotten.` : "",
        kept.length ? `${kept.length === 1 ? `Turn ${kept[0]} was` : `Turns ${kept.join(", ")} were`} not forgotten.` : ""]
        .filter(Boolean).join(" ");
      el.forgetResult.dataset.state = "known";
      el.forgetResult.textContent = text;
      announce(text);
      reloadAll();
      return;
    }
    await sleep(wait);
  }
}

/** The page again after a forget: the conversation from memory and the whole panel. */
function reloadAll() {
  loadThread({ messages: true });
  loadStats();
}

/** @returns {boolean} true when a turn is in flight (a forget waits for it: the turn could commit meanwhile) */
function busy() {
  if (!chat.turn) return false;
  toast("Wait for the answer to finish, then forget.", "error");
  return true;
}

/**
 * Ask, then DELETE /api/chat/turns/<n>; the turn's bubbles leave the page, the thread and panel reload.
 * @param {number} n
 * @param {TurnData | null} turn its messages when known (shown in the question, and taken off the page)
 */
export async function forgetTurn(n, turn) {
  if (busy()) return false;
  let data = turn;
  if (!data) {
    const got = await getTurn(n);
    if (!got.turn) { toast(got.message, "error"); return false; }
    data = got.turn;
  }
  if (data.where === "gone" && data.reason === "forgotten") { toast(whereText(data.where, data.reason), "error"); return false; }
  const ok = await ask(`Forget turn ${n}? Your message and the answer are removed from the recent turns and the archive, ` +
    "and every summary line and note made from them. Your pinned decisions stay.", data, "Forget");
  if (!ok || busy()) return false;
  const r = await api("DELETE", turnUrl(n));
  if (r.unknown) {
    await settleForget([n], new Set((data.messages || []).map((m) => m && m.id).filter(Boolean)));
    return true;
  }
  if (!r.ok || !r.data || typeof r.data !== "object") {
    toast(r.status === 404 ? `There is no turn ${n} to forget.` : r.message || "Couldn't forget that.", "error");
    reloadAll();
    return false;
  }
  dropForgotten(new Set((data.messages || []).map((m) => m && m.id).filter(Boolean)));
  sayForgotten(r.data.forgotten, r.data.pinsQuoting);
  reloadAll();
  return true;
}

/**
 * The guessed turn of a bubble: the number its position in the loaded thread gave (data-turn-guess), else
 * the folded turns plus the person messages shown up to it (a bubble this page added).
 * @param {HTMLElement} article
 */
function guessTurn(article) {
  const tagged = Number(article.dataset.turnGuess);
  if (Number.isInteger(tagged) && tagged > 0) return tagged;
  let n = memory.folded;
  for (const b of el.messages.querySelectorAll('[data-testid="message"]:not([data-summarized="true"])')) {
    if (!(b instanceof HTMLElement)) continue;
    if (b.dataset.role === "user") n += 1;
    if (b === article) break;
  }
  return Math.max(n, 1);
}

/**
 * The turn that holds a bubble's message: the guess checked against GET /api/chat/turns/<n> (whose messages
 * carry ids), then the turns near it; null when none holds it.
 * @param {HTMLElement} article
 * @returns {Promise<TurnData | null>}
 */
async function findTurn(article) {
  const ids = [article.dataset.messageId, article.dataset.botId]
    .filter(/** @returns {x is string} */ (x) => typeof x === "string" && x !== "");
  if (!ids.length) return null;
  let ceiling = Infinity; // a 404 means no turn that high
  for (const n of probeOrder(guessTurn(article))) {
    if (n >= ceiling) continue;
    const { turn, status } = await getTurn(n);
    if (status === 404) { ceiling = Math.min(ceiling, n); continue; }
    if (!turn) return null; // the server failed: don't guess on
    if (ids.some((id) => turnHolds(turn, id))) return { ...turn, turn: n };
  }
  return null;
}

/** @param {HTMLElement} article a message bubble: forget its turn */
async function forgetMessage(article) {
  if (busy()) return;
  const menu = article.querySelector('[data-testid="message-menu"]');
  if (menu) menu.removeAttribute("open");
  const turn = await findTurn(article);
  if (!turn) { toast("This message is not in memory any more, or not yet.", "error"); return; }
  await forgetTurn(turn.turn, turn);
}

/** The preview of the last GET /api/chat/forget (its phrase and turns). */
let preview = { phrase: "", turns: /** @type {number[]} */ ([]) };

/** @param {string} text "" hides the error */
function showForgetError(text) {
  el.forgetError.textContent = text;
  el.forgetError.hidden = !text;
}

/**
 * GET /api/chat/forget?phrase=…: the items holding the phrase, grouped by place, a checkbox for each turn
 * (checked), and the button that forgets the checked turns.
 * @param {string} phrase
 */
async function showPreview(phrase) {
  showForgetError("");
  el.forgetResult.hidden = true;
  const r = await api("GET", `${API.forget}?phrase=${encodeURIComponent(phrase)}`);
  el.forgetPreview.replaceChildren();
  if (!r.ok || !r.data || typeof r.data !== "object") {
    showForgetError(r.message || "Couldn't look for that.");
    el.forgetPreview.hidden = true;
    return;
  }
  const items = Array.isArray(r.data.items) ? r.data.items : [];
  const groups = groupPreview(items);
  preview = { phrase, turns: previewTurns(items) };
  el.forgetPreview.hidden = false;
  if (!groups.length) {
    el.forgetPreview.append(h("p", { class: "muted", "data-testid": "forget-nothing", text: "Nothing in memory holds that." }));
    return;
  }
  for (const g of groups) {
    const list = h("ul", { class: "forget-items" });
    for (const it of g.items) {
      const text = h("span", { class: "forget-text", text: it.text });
      if (it.turn) {
        const box = h("input", { type: "checkbox", checked: true, "data-testid": "forget-turn", "data-turn": it.turn,
          "aria-label": `Forget turn ${it.turn}` });
        list.append(h("li", { class: "forget-item", "data-testid": "forget-item", "data-place": g.place, "data-turn": it.turn },
          h("label", null, box, h("span", { class: "muted small", text: ` turn ${it.turn} ` }), text)));
      } else {
        list.append(h("li", { class: "forget-item", "data-testid": "forget-item", "data-place": g.place },
          text, h("span", { class: "muted small", text: g.place === "pins"
            ? " (your pin: unpin it yourself)" : " (not from a known turn)" })));
      }
    }
    el.forgetPreview.append(h("section", { class: "forget-group", "data-testid": "forget-group", "data-place": g.place },
      h("h4", { text: g.label }), list));
  }
  if (preview.turns.length) {
    el.forgetPreview.append(h("div", { class: "forget-actions" },
      h("button", { type: "button", class: "btn btn-small btn-danger", "data-testid": "forget-confirm" }, "Forget the checked turns"),
      h("button", { type: "button", class: "btn btn-small btn-ghost", "data-testid": "forget-cancel" }, "Cancel")));
  }
}

/** The turns checked in the preview, ascending. */
function checkedTurns() {
  const set = new Set();
  for (const box of el.forgetPreview.querySelectorAll('[data-testid="forget-turn"]')) {
    const input = /** @type {HTMLInputElement} */ (box);
    if (input.checked) set.add(Number(input.dataset.turn));
  }
  return [...set].filter((n) => preview.turns.includes(n)).sort((a, b) => a - b);
}

/** POST /api/chat/forget with the checked turns. */
async function forgetChecked() {
  if (busy()) return;
  const turns = checkedTurns();
  if (!turns.length) { showForgetError("Check at least one turn to forget."); return; }
  const ok = await ask(`Forget ${turns.length === 1 ? `turn ${turns[0]}` : `turns ${turns.join(", ")}`}? ` +
    "They are removed from the recent turns and the archive, with every summary line and note made from them. " +
    "Your pinned decisions stay.", null, "Forget");
  if (!ok || busy()) return;
  const r = await api("POST", API.forget, { phrase: preview.phrase, turns });
  if (r.unknown) {
    el.forgetPreview.replaceChildren();
    el.forgetPreview.hidden = true;
    await settleForget(turns, null);
    return;
  }
  if (!r.ok || !r.data || typeof r.data !== "object") {
    showForgetError(r.message || "Couldn't forget that.");
    reloadAll();
    return;
  }
  el.forgetPreview.replaceChildren();
  el.forgetPreview.hidden = true;
  el.forgetPhrase.value = "";
  dropForgotten(null);
  sayForgotten(r.data.forgotten, r.data.pinsQuoting);
  reloadAll();
}

/** GET /api/chat/export, downloaded as Markdown (exportmd.js). */
async function downloadMarkdown() {
  const r = await api("GET", API.export);
  if (!r.ok || !r.data || typeof r.data !== "object") {
    toast(r.message || "Couldn't export the conversation.", "error");
    return;
  }
  const blob = new window.Blob([exportMarkdown(r.data)], { type: "text/markdown;charset=utf-8" });
  const url = window.URL.createObjectURL(blob);
  const a = h("a", { href: url, download: "chat-export.md", hidden: true });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => window.URL.revokeObjectURL(url), 10000);
}

/**
 * The button with data-testid `testid` an event hit inside `container`, or null.
 * @param {Event} event
 * @param {HTMLElement} container
 * @param {string} testid
 * @returns {HTMLElement | null}
 */
function hit(event, container, testid) {
  const target = event.target instanceof Element ? event.target.closest(`[data-testid="${testid}"]`) : null;
  return target instanceof HTMLElement && container.contains(target) ? target : null;
}

/** Wire the turn buttons, the messages' "Forget this", the phrase form, the dialogs and the exports. */
export function wireForget() {
  el.exportJson.setAttribute("href", API.export);
  el.recordLines.addEventListener("click", (e) => {
    const source = hit(e, el.recordLines, "line-source");
    if (source) { openTurn(Number(source.dataset.turn)); return; }
    const forget = hit(e, el.recordLines, "line-forget");
    if (forget) forgetTurn(Number(forget.dataset.turn), null);
  });
  el.inspectorBody.addEventListener("click", (e) => {
    const ref = hit(e, el.inspectorBody, "turn-ref");
    if (ref) openTurn(Number(ref.dataset.turn));
  });
  el.messages.addEventListener("click", (e) => {
    const button = hit(e, el.messages, "forget-message");
    const article = button && button.closest('[data-testid="message"]');
    if (article instanceof HTMLElement) forgetMessage(article);
  });
  el.turnDialogForget.addEventListener("click", () => {
    const n = Number(el.turnDialogForget.dataset.turn);
    const turn = shownTurn;
    closeDialog(el.turnDialog);
    forgetTurn(n, turn && turn.turn === n ? turn : null);
  });
  el.confirmOk.addEventListener("click", () => answer(true));
  el.confirmDialog.addEventListener("close", () => { if (confirmResolve) answer(false); });
  for (const node of [el.turnDialog, el.confirmDialog]) {
    node.addEventListener("click", (e) => {
      const target = e.target instanceof Element ? e.target.closest("[data-close]") : null;
      if (target) { if (node === el.confirmDialog) answer(false); else closeDialog(node); }
    });
  }
  el.forgetForm.addEventListener("submit", async (e) => {
    e.preventDefault();
    const phrase = el.forgetPhrase.value.trim();
    if (!phrase) { showForgetError("Type what to forget."); return; }
    el.forgetFind.disabled = true;
    await showPreview(phrase);
    el.forgetFind.disabled = false;
  });
  el.forgetPreview.addEventListener("click", (e) => {
    if (hit(e, el.forgetPreview, "forget-confirm")) { forgetChecked(); return; }
    if (hit(e, el.forgetPreview, "forget-cancel")) { el.forgetPreview.replaceChildren(); el.forgetPreview.hidden = true; }
  });
  el.forgetPreview.addEventListener("change", (e) => {
    // one turn, one choice: its boxes in every place follow the one changed
    const target = e.target instanceof Element && e.target.matches('input[data-testid="forget-turn"]') ? e.target : null;
    if (!target) return;
    const box = /** @type {HTMLInputElement} */ (target);
    for (const other of el.forgetPreview.querySelectorAll(`[data-testid="forget-turn"][data-turn="${CSS.escape(box.dataset.turn || "")}"]`)) {
      /** @type {HTMLInputElement} */ (other).checked = box.checked;
    }
  });
  el.exportMarkdown.addEventListener("click", downloadMarkdown);
  document.addEventListener("click", (e) => { // an open message menu closes on a click elsewhere
    for (const menu of el.messages.querySelectorAll('[data-testid="message-menu"][open]')) {
      if (!(e.target instanceof Node && menu.contains(e.target))) menu.removeAttribute("open");
    }
  });
}
