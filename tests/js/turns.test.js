// Turn numbers and the words of forgetting: app/web/static/js/turns.js.
import { test } from "node:test";
import assert from "node:assert/strict";
import {
  countPersonTurns, doneTurn, foldedTurns, NOT_A_TURN, personNote, forgottenText, groupPreview, numberMessages, pinsQuotingText, previewTurns,
  probeOrder, turnHolds, turnRefs, whereText,
} from "../../app/web/static/js/turns.js";

const u = (id) => ({ id, role: "user", text: id });
const a = (id) => ({ id, role: "assistant", text: id });

test("folded turns: the record's last turn, else the earliest kept plus the archived turns", () => {
  assert.equal(foldedTurns({ record: { firstTurn: 1, lastTurn: 7, lines: [] }, archived: [u("x")] }), 7);
  assert.equal(foldedTurns({ archived: [u("a"), a("b"), u("c"), a("d")], earliestKeptTurn: 13 }), 14);
  assert.equal(foldedTurns({ archived: [u("a"), a("b"), u("c"), a("d")], earliestKeptTurn: null }), 2);
  assert.equal(foldedTurns({ messages: [u("a")] }), 0);
  assert.equal(foldedTurns({ record: { lastTurn: 0 } }), 0);
  assert.equal(countPersonTurns([u("a"), a("b"), null, u("c")]), 2);
  assert.equal(countPersonTurns("nope"), 0);
});

test("numbering: archived turns end at the folded count, recent turns start after it", () => {
  const archived = [u("u3"), a("a3"), u("u4"), a("a4")];
  const recent = [u("u5"), a("a5"), a("a5b"), u("u6"), a("a6")];
  const n = numberMessages(archived, recent, 4);
  assert.deepEqual([...n], [["u3", 3], ["a3", 3], ["u4", 4], ["a4", 4], ["u5", 5], ["a5", 5], ["a5b", 5], ["u6", 6], ["a6", 6]]);
});

test("numbering: an answer whose question was folded takes the turn before; no turn 0", () => {
  const n = numberMessages([], [a("orphan"), u("u3"), a("a3")], 2);
  assert.deepEqual([...n], [["orphan", 2], ["u3", 3], ["a3", 3]]);
  const fresh = numberMessages(undefined, [a("hello"), u("u1")], 0);
  assert.deepEqual([...fresh], [["u1", 1]]);
  const odd = numberMessages(null, [u(""), { role: "user" }, u("u3"), "x"], 0);
  assert.deepEqual([...odd], [["u3", 3]]);
});

test("probe order: the guess, then nearest first, never below 1", () => {
  assert.deepEqual(probeOrder(5, 2), [5, 6, 4, 7, 3]);
  assert.deepEqual(probeOrder(1, 3), [1, 2, 3, 4]);
  assert.deepEqual(probeOrder(0, 1), [1, 2]);
  assert.deepEqual(probeOrder(NaN, 1), [1, 2]);
  assert.equal(probeOrder(10).length, 17);
});

test("a turn holds a message by id", () => {
  const turn = { turn: 3, where: "recent", reason: null, messages: [u("m_1"), a("m_2")] };
  assert.equal(turnHolds(turn, "m_2"), true);
  assert.equal(turnHolds(turn, "m_9"), false);
  assert.equal(turnHolds(turn, ""), false);
  assert.equal(turnHolds({ where: "gone", messages: [] }, "m_1"), false);
  assert.equal(turnHolds(null, "m_1"), false);
});

test("turn references in record lines and recalled excerpts", () => {
  assert.deepEqual(turnRefs("- Person (turn 3): budget\n  Assistant (turn 3): ok\n- Person (turn 12): x"), [3, 12]);
  assert.deepEqual(turnRefs("turn 4 without brackets (turn 0) (turn 1234567)"), []);
  assert.deepEqual(turnRefs(null), []);
});

test("where a turn lives, in plain words", () => {
  assert.match(whereText("recent", null), /recent turns/);
  assert.match(whereText("archive", null), /archive/);
  assert.equal(whereText("gone", "forgotten"), "Gone: you asked to forget it.");
  assert.match(whereText("gone", "archive_limit"), /only the newest turns/);
  assert.equal(whereText("gone", "something"), "Gone: no longer kept.");
});

test("pins quoting the forgotten text, in plain words", () => {
  assert.equal(pinsQuotingText([]), "");
  assert.equal(pinsQuotingText(undefined), "");
  assert.equal(pinsQuotingText([2]), "Your pin 2 quotes what was forgotten; it stays until you unpin it.");
  assert.equal(pinsQuotingText([1, 3, 4]),
    "Your pins 1, 3 and 4 quote what was forgotten; they stay until you unpin them.");
  assert.equal(pinsQuotingText([0, "2", 5]), "Your pin 5 quotes what was forgotten; it stays until you unpin it.");
});

test("the forget preview grouped by place, in turn order, and its turns", () => {
  const items = [
    { place: "pins", turn: null, text: "Budget 9000" },
    { place: "record", turn: 7, text: "Person (turn 7): budget 9000" },
    { place: "archive", turn: 7, text: "budget 9000 for all" },
    { place: "recent", turn: 12, text: "what about 9000?" },
    { place: "archive", turn: 2, text: "9000 euros" },
    { place: "notes", turn: null, text: "budget is 9000" },
    { place: "elsewhere", turn: 3, text: "odd" },
    { place: "recent", text: 42 },
    null,
  ];
  const groups = groupPreview(items);
  assert.deepEqual(groups.map((g) => g.place), ["recent", "archive", "record", "notes", "pins", "elsewhere"]);
  assert.deepEqual(groups[1], { place: "archive", label: "Archive of folded turns",
    items: [{ turn: 2, text: "9000 euros" }, { turn: 7, text: "budget 9000 for all" }] });
  assert.equal(groups[4].label, "Your pinned decisions");
  assert.equal(groups[5].label, "elsewhere");
  assert.deepEqual(previewTurns(items), [2, 3, 7, 12]);
  assert.deepEqual(groupPreview(undefined), []);
  assert.deepEqual(previewTurns({}), []);
});

test("what a forget did, in plain words", () => {
  assert.equal(forgottenText({ turn: 3, recent: true, archive: false, recordLines: 1, notes: 0 }), "Turn 3 was forgotten.");
  assert.equal(forgottenText([{ turn: 9 }, { turn: 2 }]), "Turns 2, 9 were forgotten.");
  assert.equal(forgottenText([]), "Nothing was forgotten.");
});

test("the person's messages are numbered as memory numbers them: a turn that was not written takes none", () => {
  // the person sends four messages; the second one's turn fails after text was shown (done: failed)
  const dones = [
    { type: "done", status: "completed", turn: 1 },
    { type: "done", status: "failed", code: "llm_unavailable" },
    { type: "done", status: "completed", turn: 2 },
    { type: "done", status: "completed", turn: 3, finish: "length" },
  ];
  const notes = dones.map((f) => personNote(doneTurn(f), f.status === "completed"));
  assert.deepEqual(notes, ["turn 1", NOT_A_TURN, "turn 2", "turn 3"]);
  assert.equal(NOT_A_TURN, "not saved — not a turn of memory");
  // the person's own count of the messages memory kept agrees with the last number shown
  assert.equal(notes.filter((n) => n !== NOT_A_TURN).length, 3);
  assert.equal(personNote(0, true), ""); // written, number not told: nothing shown rather than a wrong one
  assert.equal(doneTurn({ turn: "2" }), 0);
  assert.equal(doneTurn({}), 0);
});
