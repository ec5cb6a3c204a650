// @ts-check
/**
 * Formatting of numbers, times and values for display. No DOM access: unit tested in
 * tests/js/format.test.js.
 */

const nf = new Intl.NumberFormat();

/**
 * The prompt's sections, in the order the model receives them (docs/contract.md: Model context for a turn);
 * GET /api/chat/stats counts every one of them ("summary": the record and the folded turns shown word for
 * word after it), and they add up to the turn's prompt tokens.
 */
export const SECTIONS = Object.freeze(["system", "summary", "pins", "recent", "recall", "input"]);

/** @type {Readonly<Record<string, string>>} */
export const SECTION_LABELS = Object.freeze({
  system: "System", summary: "Summary", pins: "Pins", recent: "Recent turns", recall: "Recalled", input: "New input",
});

/**
 * A finite number, else 0.
 * @param {unknown} v
 * @returns {number}
 */
export const num = (v) => (typeof v === "number" && Number.isFinite(v) ? v : 0);

/**
 * A rounded number with the locale's grouping ("12,000").
 * @param {unknown} v
 */
export const fmt = (v) => nf.format(Math.round(num(v)));

/**
 * A string, else "".
 * @param {unknown} v
 * @returns {string}
 */
export const str = (v) => (typeof v === "string" ? v : "");

/**
 * Length in code points, as the server (Python) counts it.
 * @param {string} t
 */
export function charLength(t) {
  let n = 0;
  // eslint-disable-next-line no-unused-vars
  for (const _ of t) n += 1;
  return n;
}

/**
 * A time ("14:05"), with the date too when withDate ("Dec 3, 14:05"); "" for an invalid date.
 * @param {unknown} iso
 * @param {boolean} [withDate]
 */
export function fmtTime(iso, withDate) {
  const d = new Date(/** @type {string} */ (iso));
  if (Number.isNaN(d.getTime())) return "";
  /** @type {Intl.DateTimeFormatOptions} */
  const opts = withDate ? { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit" }
    : { hour: "2-digit", minute: "2-digit" };
  return d.toLocaleString(undefined, opts);
}

/**
 * A duration: "850 ms", "2.5 s" (no-break spaces); "–" when not a number.
 * @param {unknown} ms
 */
export function fmtMs(ms) {
  if (typeof ms !== "number" || !Number.isFinite(ms)) return "–";
  return ms < 1000 ? `${Math.round(ms)}\u00a0ms` : `${(ms / 1000).toFixed(1)}\u00a0s`;
}

/**
 * Anything (string, object, number) as readable text, bounded; a JSON string is pretty-printed.
 * @param {unknown} value
 * @param {number} [limit]
 */
export function display(value, limit = 4000) {
  /** @type {string | undefined} */
  let text;
  if (value === undefined) return "";
  if (typeof value === "string") {
    text = value;
    try { // pretty-print JSON strings
      const parsed = JSON.parse(value);
      if (parsed && typeof parsed === "object") text = JSON.stringify(parsed, null, 2);
    } catch { /* plain text */ }
  } else {
    try { text = JSON.stringify(value, null, 2); } catch { text = String(value); }
  }
  if (text === undefined) text = String(value);
  return text.length > limit ? text.slice(0, limit) + "\n… (truncated)" : text;
}

/**
 * Text with the five HTML metacharacters escaped.
 * @param {unknown} t
 */
export function escapeHtml(t) {
  /** @type {Record<string, string>} */
  const map = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
  return String(t).replace(/[&<>"']/g, (c) => map[c]);
}

/**
 * A pinned decision's text: a string, or an object with a "text" field (tolerated), else "".
 * @param {unknown} p
 */
export function pinText(p) {
  if (typeof p === "string") return p;
  if (p && typeof p === "object" && typeof (/** @type {{text?: unknown}} */ (p)).text === "string") {
    return /** @type {{text: string}} */ (p).text;
  }
  return "";
}

/**
 * The preview line of a summary: its first "- " bullet, else its first non-blank line, at most 120 characters.
 * @param {string} summary
 */
export function summaryPreview(summary) {
  const lines = summary.split("\n");
  const firstLine = lines.find((l) => /^-\s/.test(l)) || lines.find((l) => l.trim()) || "";
  return firstLine.replace(/^-\s*/, "").slice(0, 120);
}

/**
 * The prompt budget of GET /api/chat/stats: "budget", else contextTokens − reservedOutputTokens.
 * @param {{budget?: unknown, contextTokens?: unknown, reservedOutputTokens?: unknown}} stats
 */
export function promptBudget(stats) {
  return num(stats.budget) || (num(stats.contextTokens) - num(stats.reservedOutputTokens));
}

/** What a history entry's reason means, in words ("llm" and "extractive" are the stored values). */
/** @type {Readonly<Record<string, string>>} */
export const REASON_LABELS = Object.freeze({
  llm: "with the model's gist", extractive: "without the model", rate_limited: "rate limited",
  invalid_answer: "the model's answer was unusable",
});

/**
 * "21 facts checked: 20 kept, 1 only in an answer": the kept ones, and why the others are not.
 * @param {{factsChecked?: unknown, factsDropped?: unknown, factsSkipped?: unknown}} c
 */
export function factsText(c) {
  const checked = num(c.factsChecked), dropped = num(c.factsDropped), skipped = num(c.factsSkipped);
  const kept = Math.max(checked - dropped - skipped, 0);
  /** @param {number} n @param {string} one @param {string} many */
  const plural = (n, one, many) => `${fmt(n)} ${n === 1 ? one : many}`;
  const parts = [`${fmt(kept)} kept`];
  if (dropped) parts.push(`${fmt(dropped)} let go to fit`);
  if (skipped) parts.push(`${fmt(skipped)} only in ${skipped === 1 ? "an answer" : "answers"}`);
  return `${plural(checked, "fact", "facts")} checked: ${parts.join(", ")}`;
}

/**
 * The badge and the detail line of one compaction history entry (GET /api/chat/stats: compactions).
 * @param {Record<string, unknown>} c an entry
 * @param {string} outcome its outcome (status.js: compactionOutcome)
 * @returns {{badge: string, detail: string}}
 */
export function compactionText(c, outcome) {
  /** @param {string} k */
  const has = (k) => typeof c[k] === "number";
  const bits = [];
  if (outcome === "stale") {
    bits.push("discarded: the thread changed meanwhile"); // nothing was folded: no figures
  } else {
    const turns = `${fmt(c.turnsFolded)} turn${num(c.turnsFolded) === 1 ? "" : "s"}`;
    if (has("turnsFolded")) bits.push(outcome === "applied" ? `${turns} folded` : `${turns} to fold, none folded`);
    if (has("tokensBefore") && has("tokensAfter")) bits.push(`${fmt(c.tokensBefore)} → ${fmt(c.tokensAfter)} tokens`);
    if (has("summaryChars")) bits.push(`summary ${fmt(c.summaryChars)} chars`);
    if (has("notesCount")) bits.push(`${fmt(c.notesCount)} notes`);
    if (has("factsChecked") && num(c.factsChecked) > 0) bits.push(factsText(c));
    if (Number.isInteger(c.forgottenTurn) && num(c.forgottenTurn) > 0) bits.push(`turn ${c.forgottenTurn} forgotten`);
    const dropped = c.droppedTurns;
    if (Array.isArray(dropped) && dropped.length === 2 && dropped.every((n) => Number.isInteger(n) && n > 0)) {
      bits.push(dropped[0] === dropped[1] ? `turn ${dropped[0]} is no longer kept` : `turns ${dropped[0]}–${dropped[1]} are no longer kept`);
    }
  }
  if (has("durationMs")) bits.push(fmtMs(c.durationMs));
  const reason = REASON_LABELS[str(c.reason)] || str(c.reason).replace(/_/g, " ");
  const badge = outcome === "stale" ? "discarded" : outcome + (reason ? ` · ${reason}` : "");
  return { badge, detail: bits.join(" · ") };
}
