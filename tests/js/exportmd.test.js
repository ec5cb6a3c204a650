// The Markdown export: app/web/static/js/exportmd.js.
import { test } from "node:test";
import assert from "node:assert/strict";
import { exportMarkdown } from "../../app/web/static/js/exportmd.js";

const EXPORT = {
  exportedAt: "2026-12-04T10:00:00.000Z",
  threadId: "t_abc",
  messages: [
    { id: "m_5", role: "user", text: "Which hotel?", createdAt: "2026-12-04T09:00:00.000Z" },
    { id: "m_6", role: "assistant", text: "The **river** one.\n\n- near\n- cheap\n", createdAt: "2026-12-04T09:00:02.000Z" },
  ],
  record: { firstTurn: 1, lastTurn: 4, lines: [
    { kind: "person", text: "budget is 9000 EUR", turn: 3, replacedBy: null },
    { kind: "told", text: "venue near\nthe river", turn: 4, replacedBy: 7 },
    { kind: "text", text: "free text", turn: null, replacedBy: null },
  ] },
  notes: ["prefers trains"],
  pins: ["Budget is 9000 EUR", { text: "Venue near the river", by: "person" }],
  archive: [{ turn: 3, messages: [{ id: "m_1", role: "user", text: "budget is 9000 EUR", createdAt: "2026-12-04T08:00:00.000Z" },
    { id: "m_2", role: "assistant", text: "Noted.", createdAt: "2026-12-04T08:00:01.000Z" }] }],
  compactions: [
    { at: "2026-12-04T08:30:00.000Z", outcome: "applied", message: "turns 1–2 are no longer kept", droppedTurns: [1, 2] },
    { at: "2026-12-04T08:40:00.000Z", outcome: "applied", droppedTurns: [3, 3] },
  ],
  earliestKeptTurn: 3,
};

test("the whole export, section by section", () => {
  assert.equal(exportMarkdown(EXPORT), [
    "# Chat export",
    "",
    "Exported 2026-12-04T10:00:00.000Z · thread t_abc.",
    "",
    "Turns before turn 3 are no longer kept.",
    "",
    "## Your pinned decisions",
    "",
    "1. Budget is 9000 EUR",
    "2. Venue near the river",
    "",
    "## Summary",
    "",
    "- Person (turn 3): budget is 9000 EUR",
    "- Told (turn 4) [replaced by turn 7]: venue near the river",
    "- free text",
    "",
    "## The model's notes",
    "",
    "- prefers trains",
    "",
    "## Archive of folded turns",
    "",
    "### Turn 3",
    "",
    "**You** · 2026-12-04T08:00:00.000Z",
    "",
    "budget is 9000 EUR",
    "",
    "**Assistant** · 2026-12-04T08:00:01.000Z",
    "",
    "Noted.",
    "",
    "## Recent conversation",
    "",
    "**You** · 2026-12-04T09:00:00.000Z",
    "",
    "Which hotel?",
    "",
    "**Assistant** · 2026-12-04T09:00:02.000Z",
    "",
    "The **river** one.\n\n- near\n- cheap",
    "",
    "## Compaction history",
    "",
    "- 2026-12-04T08:30:00.000Z · applied · turns 1–2 are no longer kept",
    "- 2026-12-04T08:40:00.000Z · applied · turn 3 is no longer kept",
  ].join("\n") + "\n");
});

test("an empty or odd export still reads", () => {
  const md = exportMarkdown({});
  assert.ok(md.startsWith("# Chat export\n\n## Your pinned decisions\n\nNothing pinned.\n"));
  for (const s of ["No summary.", "No notes.", "No archived turns.", "No recent messages.", "No compactions."]) {
    assert.ok(md.includes(s), s);
  }
  assert.ok(md.endsWith("No compactions.\n"));
  assert.equal(exportMarkdown(null), md);
  assert.ok(!exportMarkdown({ earliestKeptTurn: 1 }).includes("no longer kept"));
  const text = exportMarkdown({ record: "- Person (turn 1): hi\nloose sentence" });
  assert.ok(text.includes("## Summary\n\n- Person (turn 1): hi\n- loose sentence\n"));
});

test("stored text is written as is, never interpreted", () => {
  const md = exportMarkdown({ messages: [{ role: "user", text: "<script>alert(1)</script>" }] });
  assert.ok(md.includes("**You**\n\n<script>alert(1)</script>\n"));
});
