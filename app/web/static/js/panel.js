// @ts-check
/**
 * The memory panel, drawn from what the server answered (docs/contract.md: HTTP): the summary, the
 * person's pinned decisions, the model's notes, the context meter and the token chart
 * (GET /api/chat/stats), the compaction history and the prompt inspector (GET /api/chat/inspector).
 * The summary's lines with the turn each came from, and the earliest turn the archive still keeps.
 * Drawing only: the buttons (unpin, pin or remove a note) are handled by memory.js, which also loads;
 * the turn buttons (open a turn, forget it) by forget.js.
 */
import { el, h, s } from "./dom.js";
import { memory } from "./state.js";
import {
  compactionText, fmt, fmtMs, fmtTime, num, pinText, promptBudget, SECTION_LABELS, SECTIONS, str,
} from "./format.js";
import { compactionOutcome } from "./status.js";
import { turnRefs } from "./turns.js";

/** @typedef {Record<string, any>} Stats the body of GET /api/chat/stats */

/** @param {unknown} text */
export function renderSummary(text) {
  if (typeof text === "string" && text.trim()) {
    el.summary.textContent = text;
    el.summary.classList.remove("muted");
  } else {
    el.summary.textContent = "No summary yet";
    el.summary.classList.add("muted");
  }
}

/** @type {Readonly<Record<string, string>>} */
const KIND_LABELS = Object.freeze({ about: "About", asked: "Asked", person: "Person", assistant: "Assistant", told: "Told" });

/**
 * The record's lines (hydration `record.lines`: {kind, text, turn, replacedBy}), each with the turn it came
 * from: a button opens that turn (data-testid="line-source"), another forgets it ("line-forget"), both
 * with data-turn. Hidden when there is no line.
 * @param {unknown} record
 */
export function renderRecord(record) {
  const r = record && typeof record === "object" ? /** @type {{lines?: unknown}} */ (record) : {};
  /** @type {Record<string, any>[]} */
  const lines = Array.isArray(r.lines) ? r.lines.filter((l) => l && typeof l === "object" && typeof l.text === "string") : [];
  el.recordLines.replaceChildren();
  for (const line of lines) {
    const turn = Number.isInteger(line.turn) && line.turn > 0 ? line.turn : null;
    const label = KIND_LABELS[str(line.kind)] || "";
    const li = h("li", { class: line.replacedBy ? "record-line replaced" : "record-line", "data-testid": "record-line",
      "data-turn": turn || undefined },
      h("span", { class: "record-text" },
        label ? h("span", { class: "record-kind muted", text: `${label}: ` }) : null,
        h("span", { text: line.text }),
        Number.isInteger(line.replacedBy) ? h("span", { class: "muted small", text: ` (replaced by turn ${line.replacedBy})` }) : null));
    if (turn) {
      li.append(h("span", { class: "note-actions" },
        h("button", {
          type: "button", class: "btn btn-small btn-ghost", "data-testid": "line-source", "data-turn": turn,
          title: "Why does it know this? Open the turn it came from", "aria-label": `Open turn ${turn}, where this came from`,
        }, `turn ${turn}`),
        h("button", {
          type: "button", class: "icon-btn", "data-testid": "line-forget", "data-turn": turn,
          title: `Forget turn ${turn}`, "aria-label": `Forget turn ${turn}, where this came from`,
        }, "✕")));
    }
    el.recordLines.append(li);
  }
  el.recordDetails.hidden = lines.length === 0;
}

/**
 * The earliest turn still kept (hydration `earliestKeptTurn`), said only when turns before it were dropped.
 * @param {unknown} n
 */
export function renderEarliest(n) {
  const turn = Number.isInteger(n) ? /** @type {number} */ (n) : 0;
  el.earliestKept.textContent = turn > 1
    ? `The archive keeps turns from turn ${turn} on; ${turn === 2 ? "turn 1 is" : `turns 1–${turn - 1} are`} no longer kept.` : "";
  el.earliestKept.hidden = turn <= 1;
}

/**
 * The person's pinned decisions; each has an unpin button with its 1-based data-index.
 * @param {unknown} pins
 */
export function renderPins(pins) {
  memory.pins = Array.isArray(pins) ? pins.map(pinText).filter(Boolean) : [];
  el.pins.replaceChildren();
  memory.pins.forEach((text, i) => {
    const n = i + 1;
    el.pins.append(h("li", { class: "pin", "data-testid": "pin", "data-by": "person" },
      h("span", { class: "pin-text", text }),
      h("button", {
        type: "button", class: "icon-btn unpin", "data-testid": "unpin", "data-index": n,
        title: "Unpin", "aria-label": `Unpin decision ${n}`,
      }, "✕")));
  });
  el.pinsEmpty.hidden = memory.pins.length > 0;
  el.pins.hidden = memory.pins.length === 0;
  el.pinsCount.textContent = memory.pins.length ? `(${memory.pins.length})` : "";
}

/**
 * The model's notes: proposed by compactions, shown apart from the person's decisions; pin or remove
 * each (buttons with the note's 1-based data-index).
 * @param {unknown} notes
 */
export function renderNotes(notes) {
  memory.notes = Array.isArray(notes) ? notes.filter((t) => typeof t === "string" && t) : [];
  el.notes.replaceChildren();
  memory.notes.forEach((text, i) => {
    const n = i + 1;
    el.notes.append(h("li", { class: "note-item", "data-testid": "note", "data-by": "model" },
      h("span", { class: "pin-text", text }),
      h("span", { class: "note-actions" },
        h("button", {
          type: "button", class: "btn btn-small", "data-testid": "promote-note", "data-index": n,
          title: "Make this your pinned decision", "aria-label": `Pin note ${n} as your decision`,
        }, "Pin"),
        h("button", {
          type: "button", class: "icon-btn", "data-testid": "remove-note", "data-index": n,
          title: "Remove this note", "aria-label": `Remove note ${n}`,
        }, "✕"))));
  });
  el.notesEmpty.hidden = memory.notes.length > 0;
  el.notes.hidden = memory.notes.length === 0;
  el.notesCount.textContent = memory.notes.length ? `(${memory.notes.length})` : "";
}

/** @param {string} text "" hides the error */
export function showPinError(text) {
  el.pinError.textContent = text || "";
  el.pinError.hidden = !text;
}

/**
 * Context meter: the last turn's prompt tokens, by section, against the prompt budget. The header is the sum
 * of the legend (every section that was sent); a compaction applied after that turn is said, since the
 * lines the panel lists then are newer than the prompt the meter counts.
 * @param {Stats} stats
 */
export function renderMeter(stats) {
  const turns = Array.isArray(stats.turns) ? stats.turns : [];
  const budget = promptBudget(stats);
  const last = turns.length ? turns[turns.length - 1] : null;
  el.meter.replaceChildren();
  if (!last || budget <= 0) {
    el.meter.append(h("p", { class: "muted", text: budget > 0 ? `No turns yet · budget ${fmt(budget)} tokens` : "No turns yet." }));
    return;
  }
  const sections = last.sections && typeof last.sections === "object" ? last.sections : {};
  const used = SECTIONS.reduce((a, k) => a + num(sections[k]), 0) || num(last.promptTokens);
  const lastAt = Date.parse(str(last.at));
  /** @type {Record<string, any>[]} */
  const comps = Array.isArray(stats.compactions) ? stats.compactions : [];
  const compactedSince = comps.some((c) => c && c.outcome === "applied" && Date.parse(str(c.at)) > lastAt);
  const pct = Math.round((used / budget) * 100);
  const bar = h("div", {
    class: "meter-bar", role: "img",
    "aria-label": `Context ${pct}% full: ${fmt(used)} of ${fmt(budget)} prompt tokens. ` +
      SECTIONS.map((k) => `${SECTION_LABELS[k]} ${fmt(sections[k])}`).join(", "),
  });
  for (const k of SECTIONS) {
    const v = num(sections[k]);
    if (v <= 0) continue;
    const seg = h("span", { class: `seg seg-${k}`, title: `${SECTION_LABELS[k]}: ${fmt(v)} tokens`, "data-section": k });
    seg.style.width = `${Math.min(100, (v / budget) * 100)}%`;
    bar.append(seg);
  }
  el.meter.append(
    h("div", { class: "meter-head" },
      h("strong", { text: `${fmt(used)} / ${fmt(budget)}` }), " prompt tokens ",
      h("span", { class: pct >= 90 ? "pct warn" : "pct", text: `(${pct}%)` })),
    bar,
    h("ul", { class: "legend" }, ...SECTIONS.map((k) => h("li", null,
      h("span", { class: `swatch seg-${k}`, "aria-hidden": "true" }),
      `${SECTION_LABELS[k]} `, h("span", { class: "legend-num", text: fmt(sections[k]) })))),
    h("p", { class: "muted small", text:
      `+ ${fmt(stats.reservedOutputTokens)} reserved for the answer · window ${fmt(stats.contextTokens)}` +
      (last.completionTokens !== undefined ? ` · last answer ${fmt(last.completionTokens)} tokens` : "") +
      (typeof last.firstTokenMs === "number" ? ` · first token ${fmtMs(last.firstTokenMs)}` : "") }),
  );
  if (compactedSince) {
    el.meter.append(h("p", { class: "muted small", "data-testid": "meter-compacted",
      text: "Memory was compacted after this turn: the next prompt shows it." }));
  }
}

/**
 * Chart: prompt tokens per turn, stacked by section, with the budget line and compaction markers.
 * @param {Stats} stats
 */
export function renderChart(stats) {
  /** @type {Record<string, any>[]} */
  const turns = (Array.isArray(stats.turns) ? stats.turns : []).slice(-40);
  const budget = promptBudget(stats);
  el.chart.replaceChildren();
  if (!turns.length) {
    el.chart.append(h("p", { class: "muted", text: "No turns yet." }));
    return;
  }
  const W = 300, H = 110, padL = 4, padR = 4, padT = 8, padB = 14;
  // scale to the turns (so small prompts stay visible); the budget line is drawn when it is in range
  const peak = Math.max(...turns.map((t) => num(t.promptTokens)), 1);
  const maxTok = budget > 0 && budget <= peak * 1.6 ? Math.max(budget, peak) * 1.08 : peak * 1.25;
  const innerW = W - padL - padR, innerH = H - padT - padB;
  const slot = innerW / Math.max(turns.length, 8);
  const barW = Math.max(2, slot * 0.7);
  /** @param {number} v */
  const y = (v) => padT + innerH - (v / maxTok) * innerH;
  const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart-svg", role: "img",
    "aria-label": `Prompt tokens for the last ${turns.length} turns; latest ${fmt(turns[turns.length - 1].promptTokens)}` +
      (budget ? ` of a ${fmt(budget)} token budget` : "") });
  svg.append(s("line", { x1: padL, x2: W - padR, y1: padT + innerH, y2: padT + innerH, class: "axis" }));
  turns.forEach((t, i) => {
    const x = padL + i * slot + (slot - barW) / 2;
    const g = s("g", { class: `bar status-${str(t.status) || "completed"}` });
    const sec = t.sections && typeof t.sections === "object" ? t.sections : {};
    let acc = 0;
    const secSum = SECTIONS.reduce((a, k) => a + num(sec[k]), 0);
    if (secSum > 0) {
      for (const k of SECTIONS) {
        const v = num(sec[k]);
        if (v <= 0) continue;
        g.append(s("rect", { x, width: barW, y: y(acc + v), height: Math.max(0.5, y(acc) - y(acc + v)), class: `seg-${k}` }));
        acc += v;
      }
    } else {
      const v = num(t.promptTokens);
      g.append(s("rect", { x, width: barW, y: y(v), height: Math.max(0.5, y(0) - y(v)), class: "seg-recent" }));
    }
    g.append(s("title", { text:
      `Turn ${i + 1} (${str(t.status) || "?"}) · ${fmtTime(t.at, true)}\n` +
      `${fmt(t.promptTokens)} prompt tokens: ` + SECTIONS.map((k) => `${k} ${fmt(sec[k])}`).join(", ") +
      `\n${fmt(t.completionTokens)} completion tokens · first token ${fmtMs(t.firstTokenMs)}` }));
    svg.append(g);
  });
  // compaction markers: a small triangle before the first turn after an applied compaction
  /** @type {Record<string, any>[]} */
  const comps = Array.isArray(stats.compactions) ? stats.compactions : [];
  for (const c of comps) {
    if (c.outcome !== "applied") continue;
    const at = Date.parse(c.at);
    if (Number.isNaN(at)) continue;
    const idx = turns.findIndex((t) => Date.parse(t.at) > at);
    if (idx <= 0) continue;
    const x = padL + idx * slot;
    const m = s("path", { d: `M${x - 3} ${H - 1} L${x + 3} ${H - 1} L${x} ${H - 6} Z`, class: "marker" });
    m.append(s("title", { text: `Compaction applied ${fmtTime(c.at, true)}` }));
    svg.append(m);
  }
  if (budget > 0 && budget <= maxTok) {
    svg.append(s("line", { x1: padL, x2: W - padR, y1: y(budget), y2: y(budget), class: "budget" }));
    svg.append(s("text", { x: W - padR, y: y(budget) - 2, class: "budget-label", "text-anchor": "end", text: `budget ${fmt(budget)}` }));
  }
  svg.append(s("text", { x: padL, y: padT - 1, class: "budget-label", text: `max ${fmt(peak)}` +
    (budget > maxTok ? ` · budget ${fmt(budget)} (off the scale)` : "") }));
  el.chart.append(svg);
}

/** Epoch ms of this page's last "New chat": history entries of work that began before it are not shown. */
let since = 0;

/**
 * Show only the history of work that began at or after `ms` (epoch milliseconds): after "New chat", a
 * compaction of the old conversation that ends later (and is recorded as discarded) is not this one's.
 * @param {number} ms
 */
export function historySince(ms) {
  since = ms;
}

/**
 * An entry's start, epoch ms: its `at` (when it ended) less its `durationMs`.
 * @param {Record<string, unknown>} c
 */
const began = (c) => num(c.at) - (typeof c.durationMs === "number" ? c.durationMs : 0);

/**
 * The last five compactions, newest first (of the conversation shown: ``historySince``).
 * @param {Stats} stats
 */
export function renderCompactions(stats) {
  /** @type {Record<string, unknown>[]} */
  const all = (Array.isArray(stats.compactions) ? stats.compactions : []).filter((c) => !since || began(c) >= since);
  const comps = all.slice(-5).reverse();
  el.compactions.replaceChildren();
  for (const c of comps) {
    const outcome = compactionOutcome(c.outcome);
    const { badge, detail } = compactionText(c, outcome);
    el.compactions.append(h("li", { class: "compaction", "data-outcome": outcome, "data-testid": "compaction" },
      h("div", { class: "compaction-head" },
        h("span", { class: `badge badge-${outcome}`, text: badge }),
        h("time", { datetime: str(c.at), text: fmtTime(c.at, true) })),
      h("div", { class: "muted small compaction-detail", text: detail })));
  }
  if (all.length > comps.length) {
    el.compactions.append(h("li", { class: "muted small", text: `+ ${fmt(all.length - comps.length)} earlier` }));
  }
  el.compactionsEmpty.hidden = comps.length > 0;
  el.compactions.hidden = comps.length === 0;
}

/**
 * The last turn's prompt, message by message, in the order the model received it.
 * @param {{messages?: unknown}} data the body of GET /api/chat/inspector
 */
export function renderInspector(data) {
  /** @type {Record<string, any>[]} */
  const prompt = Array.isArray(data.messages) ? data.messages : [];
  el.inspectorBody.replaceChildren();
  if (!prompt.length) {
    el.inspectorBody.append(h("p", { class: "muted", text: "Nothing yet." }));
    return;
  }
  const total = prompt.reduce((a, m) => a + num(m && m.tokens), 0);
  el.inspectorBody.append(h("p", { class: "muted small", text: `${prompt.length} messages · ${fmt(total)} tokens, in the order the model received them` }));
  const ol = h("ol", { class: "inspector-list" });
  for (const m of prompt) {
    if (!m || typeof m !== "object") continue;
    // a folded turn's message shown word for word after the record counts as the summary (GET /api/chat/stats)
    const folded = m.origin === "folded";
    const origin = folded || SECTIONS.includes(m.origin) ? m.origin : "other";
    const text = str(m.text);
    const missing = m.text === null || m.text === undefined;
    const pre = h("pre", { class: missing ? "inspector-text muted" : "inspector-text" });
    pre.textContent = missing ? str(m.note) || "Not available."
      : text.length > 6000 ? text.slice(0, 6000) + "\n… (truncated)" : text;
    const refs = origin === "system" || origin === "input" || missing ? [] : turnRefs(text).slice(0, 12);
    ol.append(h("li", { class: "inspector-item", "data-origin": origin },
      h("div", { class: "inspector-head" },
        h("span", { class: `badge origin seg-${folded ? "summary" : origin}`, text: folded ? "folded turn" : origin }),
        h("span", { class: "muted small", text: `${str(m.role) || "?"} · ${fmt(m.tokens)} tokens` })),
      pre,
      refs.length ? h("div", { class: "turn-refs" }, h("span", { class: "muted small", text: "From: " }),
        ...refs.map((n) => h("button", {
          type: "button", class: "btn btn-small btn-ghost", "data-testid": "turn-ref", "data-turn": n,
          title: "Open the turn this came from", "aria-label": `Open turn ${n}`,
        }, `turn ${n}`))) : null));
  }
  el.inspectorBody.append(ol);
}

/** Any failure of GET /api/chat/stats: the panels say "not available"; nothing breaks. */
export function renderStatsUnavailable() {
  for (const node of [el.meter, el.chart]) {
    node.replaceChildren(h("p", { class: "muted", text: "Not available." }));
  }
}
