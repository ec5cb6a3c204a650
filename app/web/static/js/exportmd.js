// @ts-check
/**
 * A readable Markdown rendering of GET /api/chat/export (docs/contract.md: HTTP): the conversation, the
 * archive of folded turns, the summary's lines, the model's notes, the person's pins and the compaction
 * history. Built in the page and downloaded as a file; never shown as HTML. No DOM access: unit tested
 * in tests/js/exportmd.test.js.
 */

/** @param {unknown} v */
const str = (v) => (typeof v === "string" ? v : v === null || v === undefined ? "" : String(v));

/** @param {unknown} role */
const who = (role) => (role === "user" ? "You" : role === "assistant" ? "Assistant" : str(role) || "Message");

/**
 * A message: a heading line naming who and when, then its text as written.
 * @param {any} m
 * @returns {string[]}
 */
function messageLines(m) {
  if (!m || typeof m !== "object") return [];
  const when = str(m.createdAt);
  return [`**${who(m.role)}**${when ? ` · ${when}` : ""}`, "", str(m.text).replace(/\s+$/, ""), ""];
}

/**
 * A pin, note or record line as one list item's text.
 * @param {any} item
 * @returns {string}
 */
function itemText(item) {
  if (typeof item === "string") return item;
  if (item && typeof item === "object") return str(item.text);
  return "";
}

/**
 * One list item: its text on one line (newlines become spaces so the list stays a list).
 * @param {string} text
 */
const bullet = (text) => `- ${text.replace(/\s*\n\s*/g, " ").trim()}`;

/** @type {Readonly<Record<string, string>>} */
const KIND_LABELS = Object.freeze({ about: "About", asked: "Asked", person: "Person", assistant: "Assistant", told: "Told", text: "" });

/**
 * The Markdown of an export.
 * @param {any} data the body of GET /api/chat/export
 * @returns {string} ends with one newline
 */
export function exportMarkdown(data) {
  const d = data && typeof data === "object" ? data : {};
  const out = ["# Chat export", ""];
  const meta = [];
  if (d.exportedAt) meta.push(`Exported ${str(d.exportedAt)}`);
  if (d.threadId) meta.push(`thread ${str(d.threadId)}`);
  if (meta.length) out.push(meta.join(" · ") + ".", "");
  if (Number.isInteger(d.earliestKeptTurn) && d.earliestKeptTurn > 1) {
    out.push(`Turns before turn ${d.earliestKeptTurn} are no longer kept.`, "");
  }

  /** @type {string[]} */
  const pins = Array.isArray(d.pins) ? d.pins.map(itemText).filter(Boolean) : [];
  out.push("## Your pinned decisions", "");
  if (pins.length) out.push(...pins.map((t, i) => `${i + 1}. ${t.replace(/\s*\n\s*/g, " ").trim()}`), "");
  else out.push("Nothing pinned.", "");

  const record = d.record;
  /** @type {string[]} */
  let lines = [];
  if (record && typeof record === "object" && Array.isArray(record.lines)) {
    lines = record.lines.filter((/** @type {any} */ l) => l && typeof l === "object" && typeof l.text === "string")
      .map((/** @type {any} */ l) => {
        const label = KIND_LABELS[str(l.kind)] ?? str(l.kind);
        const turn = Number.isInteger(l.turn) ? ` (turn ${l.turn})` : "";
        const replaced = Number.isInteger(l.replacedBy) ? ` [replaced by turn ${l.replacedBy}]` : "";
        const head = label || turn ? `${label || "Line"}${turn}${replaced}: ` : replaced ? `${replaced.trim()}: ` : "";
        return bullet(head + l.text);
      });
  } else if (typeof record === "string" && record.trim()) {
    lines = record.split("\n").filter((l) => l.trim()).map((l) => (l.startsWith("- ") ? l : bullet(l)));
  }
  out.push("## Summary", "");
  out.push(...(lines.length ? [...lines, ""] : ["No summary.", ""]));

  const notes = Array.isArray(d.notes) ? d.notes.map(itemText).filter(Boolean) : [];
  out.push("## The model's notes", "");
  out.push(...(notes.length ? [...notes.map(bullet), ""] : ["No notes.", ""]));

  const archive = Array.isArray(d.archive) ? d.archive.filter((/** @type {any} */ t) => t && typeof t === "object") : [];
  out.push("## Archive of folded turns", "");
  if (archive.length) {
    for (const t of archive) {
      out.push(`### Turn ${Number.isInteger(t.turn) ? t.turn : "?"}`, "");
      for (const m of Array.isArray(t.messages) ? t.messages : []) out.push(...messageLines(m));
    }
  } else out.push("No archived turns.", "");

  const messages = Array.isArray(d.messages) ? d.messages : [];
  out.push("## Recent conversation", "");
  if (messages.length) for (const m of messages) out.push(...messageLines(m));
  else out.push("No recent messages.", "");

  const comps = Array.isArray(d.compactions) ? d.compactions.filter((/** @type {any} */ c) => c && typeof c === "object") : [];
  out.push("## Compaction history", "");
  if (comps.length) {
    for (const c of comps) {
      const bits = [str(c.at), str(c.outcome), str(c.message)].filter(Boolean);
      if (Array.isArray(c.droppedTurns) && c.droppedTurns.length === 2 && !str(c.message).includes("no longer kept")) {
        const [first, last] = c.droppedTurns;
        bits.push(first === last ? `turn ${first} is no longer kept` : `turns ${first}–${last} are no longer kept`);
      }
      out.push(bullet(bits.join(" · ") || "compaction"));
    }
    out.push("");
  } else out.push("No compactions.", "");

  while (out.length && out[out.length - 1] === "") out.pop();
  return out.join("\n") + "\n";
}
