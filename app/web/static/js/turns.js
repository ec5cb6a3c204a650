// @ts-check
/**
 * Turn numbers and the words of forgetting (docs/contract.md: "Turn numbers"; the routes /api/chat/turns/<n>
 * and /api/chat/forget). Turn N is the N-th person turn of the thread, counted across compactions. The
 * hydration does not number its messages, so the page numbers them by position and checks the guess
 * against GET /api/chat/turns/<n> (whose messages carry ids) before it forgets anything: see probeOrder.
 * No DOM access: unit tested in tests/js/turns.test.js.
 */

/** @typedef {{id?: unknown, role?: unknown, text?: unknown, createdAt?: unknown}} Msg */

/**
 * The note under a person's message whose turn memory did not keep (failed, stopped, interrupted, or complete
 * but not written): it took no turn number, so the numbers under the person's other messages still count
 * their messages that memory holds.
 */
export const NOT_A_TURN = "not saved — not a turn of memory";

/**
 * The memory turn number a `done` frame gives its turn (docs/contract.md: the done frame, `turn`): a
 * positive integer, or 0 when it gives none (the turn was not written).
 * @param {{turn?: unknown}} frame
 * @returns {number}
 */
export function doneTurn(frame) {
  const n = frame ? frame.turn : null;
  return typeof n === "number" && Number.isInteger(n) && n > 0 ? n : 0;
}

/**
 * The words under a person's message: "turn N" when memory holds its turn as turn N (`turn` > 0), else
 * NOT_A_TURN when its turn was not written, else "" (written, number not known).
 * @param {number} turn
 * @param {boolean} written
 * @returns {string}
 */
export function personNote(turn, written) {
  if (turn > 0) return `turn ${turn}`;
  return written ? "" : NOT_A_TURN;
}

/**
 * How many person turns came before the hydration's recent `messages` (the folded turns), best guess:
 * the record's last turn, else the earliest kept turn plus the archived turns shown, else the archived
 * turns shown.
 * @param {{record?: any, archived?: unknown, earliestKeptTurn?: unknown}} hydration
 * @returns {number} at least 0
 */
export function foldedTurns(hydration) {
  const record = hydration && hydration.record;
  const last = record && typeof record === "object" ? record.lastTurn : null;
  if (Number.isInteger(last) && last > 0) return last;
  const archivedTurns = countPersonTurns(hydration && hydration.archived);
  const earliest = hydration ? hydration.earliestKeptTurn : null;
  if (archivedTurns && Number.isInteger(earliest) && /** @type {number} */ (earliest) > 0) {
    return /** @type {number} */ (earliest) + archivedTurns - 1;
  }
  return archivedTurns;
}

/**
 * The number of person messages in a list (a list of turns' messages: one person message per turn).
 * @param {unknown} messages
 */
export function countPersonTurns(messages) {
  return Array.isArray(messages) ? messages.filter((m) => m && typeof m === "object" && m.role === "user").length : 0;
}

/**
 * The guessed turn number of each message: `archived` (the newest folded turns, oldest first) end at
 * turn `folded`; `recent` start at `folded + 1`. A message before any person message of its list takes
 * the number of the turn before (an answer whose question was folded earlier).
 * @param {unknown} archived
 * @param {unknown} recent
 * @param {number} folded
 * @returns {Map<string, number>} message id -> turn number (only numbers of at least 1)
 */
export function numberMessages(archived, recent, folded) {
  /** @type {Map<string, number>} */
  const out = new Map();
  /** @param {unknown} list @param {number} before */
  const walk = (list, before) => {
    let current = before;
    for (const m of /** @type {Msg[]} */ (Array.isArray(list) ? list : [])) {
      if (!m || typeof m !== "object") continue;
      if (m.role === "user") current += 1;
      if (typeof m.id === "string" && m.id && current >= 1) out.set(m.id, current);
    }
  };
  walk(archived, folded - countPersonTurns(archived));
  walk(recent, folded);
  return out;
}

/**
 * The turn numbers to try, nearest first, when looking for the turn that holds a message: the guess,
 * then one above, one below, two above... (a forgotten turn leaves a gap, so a guess by position can be
 * off by the turns forgotten). Numbers below 1 are left out.
 * @param {number} guess
 * @param {number} [spread] how far from the guess to look, each way
 * @returns {number[]}
 */
export function probeOrder(guess, spread = 8) {
  const g = Math.max(1, Math.floor(guess) || 1);
  const out = [g];
  for (let d = 1; d <= spread; d++) {
    out.push(g + d);
    if (g - d >= 1) out.push(g - d);
  }
  return out;
}

/**
 * True when the answer of GET /api/chat/turns/<n> holds the message `id`.
 * @param {unknown} turn
 * @param {string} id
 */
export function turnHolds(turn, id) {
  const messages = turn && typeof turn === "object" ? /** @type {{messages?: unknown}} */ (turn).messages : null;
  return Boolean(id) && Array.isArray(messages) && messages.some((m) => m && typeof m === "object" && m.id === id);
}

/**
 * The turn numbers a text names as "(turn N)" (record lines and recalled excerpts, docs/contract.md:
 * Model context for a turn), in order of first appearance, each once.
 * @param {unknown} text
 * @returns {number[]}
 */
export function turnRefs(text) {
  if (typeof text !== "string") return [];
  /** @type {number[]} */
  const out = [];
  for (const m of text.matchAll(/\(turn (\d{1,6})\)/g)) {
    const n = Number(m[1]);
    if (n >= 1 && !out.includes(n)) out.push(n);
  }
  return out;
}

/**
 * Where a turn lives, in plain words (GET /api/chat/turns/<n>: where, reason).
 * @param {unknown} where "recent" | "archive" | "gone"
 * @param {unknown} reason null | "archive_limit" | "forgotten"
 */
export function whereText(where, reason) {
  if (where === "recent") return "Kept word for word among the recent turns.";
  if (where === "archive") return "Folded into the summary; the turn itself is kept in the archive.";
  if (reason === "forgotten") return "Gone: you asked to forget it.";
  if (reason === "archive_limit") return "Gone: the archive keeps only the newest turns, and this one was dropped.";
  return "Gone: no longer kept.";
}

/**
 * What a forget means for the pins, in plain words ("" when no pin quotes the forgotten text).
 * @param {unknown} pinsQuoting 1-based pin numbers
 */
export function pinsQuotingText(pinsQuoting) {
  const list = Array.isArray(pinsQuoting) ? pinsQuoting.filter((n) => Number.isInteger(n) && n > 0) : [];
  if (!list.length) return "";
  const names = list.length === 1 ? `pin ${list[0]}` : `pins ${list.slice(0, -1).join(", ")} and ${list[list.length - 1]}`;
  const verb = list.length === 1 ? "quotes" : "quote";
  const pronoun = list.length === 1 ? "it stays" : "they stay";
  return `Your ${names} ${verb} what was forgotten; ${pronoun} until you unpin ${list.length === 1 ? "it" : "them"}.`;
}

/** The places of a forget preview, in the order shown, with their headings. */
export const PLACES = Object.freeze([
  ["recent", "Recent turns"], ["archive", "Archive of folded turns"], ["record", "Summary lines"],
  ["notes", "The model's notes"], ["pins", "Your pinned decisions"],
]);

/**
 * @typedef {{place: string, label: string, items: {turn: number | null, text: string}[]}} PreviewGroup
 */

/**
 * The items of GET /api/chat/forget grouped by place (PLACES order; an unknown place last, under its
 * own name), each group's items in turn order (items without a turn last), empty groups left out.
 * @param {unknown} items
 * @returns {PreviewGroup[]}
 */
export function groupPreview(items) {
  /** @type {Map<string, {turn: number | null, text: string}[]>} */
  const byPlace = new Map();
  for (const it of Array.isArray(items) ? items : []) {
    if (!it || typeof it !== "object" || typeof it.text !== "string") continue;
    const place = typeof it.place === "string" && it.place ? it.place : "other";
    const turn = Number.isInteger(it.turn) && it.turn > 0 ? it.turn : null;
    if (!byPlace.has(place)) byPlace.set(place, []);
    /** @type {{turn: number | null, text: string}[]} */ (byPlace.get(place)).push({ turn, text: it.text });
  }
  const known = new Map(PLACES.map(([p, l]) => [p, l]));
  const order = [...PLACES.map(([p]) => p), ...[...byPlace.keys()].filter((p) => !known.has(p))];
  /** @type {PreviewGroup[]} */
  const out = [];
  for (const place of order) {
    const list = byPlace.get(place);
    if (!list || !list.length) continue;
    const sorted = list.map((x, i) => ({ x, i })).sort((a, b) =>
      (a.x.turn ?? Infinity) - (b.x.turn ?? Infinity) || a.i - b.i).map(({ x }) => x);
    out.push({ place, label: known.get(place) || place, items: sorted });
  }
  return out;
}

/**
 * The distinct turn numbers of a forget preview, ascending (what the POST may forget).
 * @param {unknown} items
 * @returns {number[]}
 */
export function previewTurns(items) {
  const set = new Set();
  for (const it of Array.isArray(items) ? items : []) {
    if (it && typeof it === "object" && Number.isInteger(it.turn) && it.turn > 0) set.add(it.turn);
  }
  return [...set].sort((a, b) => a - b);
}

/**
 * What a forget did, in plain words, from the answers' "forgotten" entries (one or many).
 * @param {unknown} forgotten
 */
export function forgottenText(forgotten) {
  const list = (Array.isArray(forgotten) ? forgotten : [forgotten])
    .filter((f) => f && typeof f === "object" && Number.isInteger(f.turn));
  if (!list.length) return "Nothing was forgotten.";
  const turns = list.map((f) => f.turn).sort((a, b) => a - b);
  return turns.length === 1 ? `Turn ${turns[0]} was forgotten.` : `Turns ${turns.join(", ")} were forgotten.`;
}
