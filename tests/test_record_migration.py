"""The record as data: its stored form (format 2), the summaries earlier versions stored (read by
``app.memory.migration`` only), the text it renders, and a thread upgraded by its next write (real Redis)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings as hsettings, strategies as st

from app.memory import compaction as c
from app.memory.context import format_summary
from app.memory.migration import EMPTY, TEXT_FORMAT, read_record, stored_format
from app.memory.record import (
    ABOUT,
    ASKED,
    ASSISTANT,
    FORMAT_VERSION,
    KINDS,
    PERSON,
    TEXT,
    TOLD,
    Record,
    RecordLine,
    UnsupportedRecordFormat,
)
from app.memory.tokens import counter_for
from app.settings import MemoryLimits
from app.store.keys import ThreadKeys
from app.store.thread_store import CorruptState
from tests.fixtures.memory_data import CREATED, new_thread_id, turn

RECORD = Record(1, 7, (
    RecordLine(ABOUT, "Lin Wei introduced himself and planned a dinner."),
    RecordLine(PERSON, "Hi, I'm Lin Wei.", 1),
    RecordLine(PERSON, "The dinner is on Friday.", 2, 5),
    RecordLine(ASSISTANT, "Redis listens on port 6379 by default.", 3),
    RecordLine(TOLD, 'How about calling it "Lumen"?', 4),
    RecordLine(PERSON, "Ok, let's use that name.", 4),
    RecordLine(PERSON, "Actually, the dinner moved to next Tuesday.", 5),
    RecordLine(ASKED, "Tell me a joke about caching.", 6),
    RecordLine(TEXT, "They met Marta in Oslo."),
))
RENDERED = """Statements kept from earlier turns:
- About: Lin Wei introduced himself and planned a dinner.
- Person (turn 1): Hi, I'm Lin Wei.
- Person (turn 2) [replaced by turn 5]: The dinner is on Friday.
- Assistant (turn 3): Redis listens on port 6379 by default.
- Told (turn 4): How about calling it "Lumen"?
- Person (turn 4): Ok, let's use that name.
- Person (turn 5): Actually, the dinner moved to next Tuesday.
- Asked (turn 6): Tell me a joke about caching.
- They met Marta in Oslo.
(turns 1–7 of this conversation)"""
STORED = {"fmt": 2, "firstTurn": 1, "lastTurn": 7, "lines": [
    {"kind": "about", "text": "Lin Wei introduced himself and planned a dinner.", "turn": None, "replacedBy": None},
    {"kind": "person", "text": "Hi, I'm Lin Wei.", "turn": 1, "replacedBy": None},
    {"kind": "person", "text": "The dinner is on Friday.", "turn": 2, "replacedBy": 5},
    {"kind": "assistant", "text": "Redis listens on port 6379 by default.", "turn": 3, "replacedBy": None},
    {"kind": "told", "text": 'How about calling it "Lumen"?', "turn": 4, "replacedBy": None},
    {"kind": "person", "text": "Ok, let's use that name.", "turn": 4, "replacedBy": None},
    {"kind": "person", "text": "Actually, the dinner moved to next Tuesday.", "turn": 5, "replacedBy": None},
    {"kind": "asked", "text": "Tell me a joke about caching.", "turn": 6, "replacedBy": None},
    {"kind": "text", "text": "They met Marta in Oslo.", "turn": None, "replacedBy": None}]}


# ------------------------------------------------------------------------------------------ format 2


def test_the_record_is_stored_as_json_with_its_format_version_and_renders_the_same_text_as_before():
    assert RECORD.render() == RENDERED  # what every prompt and the page are built from, byte for byte
    assert json.loads(RECORD.to_stored()) == STORED and RECORD.to_stored().startswith('{"fmt":2,')
    assert FORMAT_VERSION == 2 and stored_format(RECORD.to_stored()) == 2
    assert read_record(RECORD.to_stored()) == RECORD
    assert read_record(RECORD.to_stored()).render() == RENDERED


def test_an_empty_field_is_the_empty_record_and_a_record_without_lines_renders_nothing():
    assert read_record("") == read_record("  \n") == Record() and stored_format("") == EMPTY
    assert Record(1, 4, ()).render() == "" and read_record(Record(1, 4, ()).to_stored()) == Record(1, 4, ())


LINE_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=40)
LINES = st.lists(st.builds(RecordLine, st.sampled_from(KINDS), LINE_TEXT, st.integers(0, 500), st.integers(0, 500)),
                 max_size=8)


@hsettings(max_examples=200, deadline=None)
@given(first=st.integers(0, 50), last=st.integers(0, 500), lines=LINES)
def test_any_record_reads_back_from_its_stored_form(first, last, lines):
    record = Record(first, last, tuple(lines))
    again = read_record(record.to_stored())
    assert again == record and again.render() == record.render()


# What a compaction writes: one trimmed line of words, numbers and punctuation (never a line break).
WRITTEN_TEXT = st.text(st.sampled_from("abcXYZ 019.,;:!?()[]-–'\"中文😀"), min_size=1, max_size=40).map(
    lambda t: " ".join(t.split())).filter(bool)
WRITTEN_LINES = st.lists(st.builds(RecordLine, st.sampled_from((PERSON, ASSISTANT, TOLD, ASKED)), WRITTEN_TEXT,
                                   st.integers(1, 500), st.sampled_from((0, 0, 7))), min_size=1, max_size=8)


@hsettings(max_examples=200, deadline=None)
@given(last=st.integers(1, 500), lines=WRITTEN_LINES, about=st.booleans())
def test_a_record_an_earlier_version_stored_as_text_reads_back_as_the_same_record(last, lines, about):
    lines = ([RecordLine(ABOUT, "They talked about numbers.")] if about else []) + lines
    record = Record(1, last, tuple(lines))
    assert read_record(record.render()) == record  # format 1: the text itself
    assert read_record(read_record(record.render()).to_stored()).render() == record.render()


# ------------------------------------------------------------------------------------------ format 1


def test_a_rendered_record_of_an_earlier_version_reads_as_its_lines():
    assert stored_format(RENDERED) == TEXT_FORMAT
    assert read_record(RENDERED) == RECORD


def test_the_oldest_records_read_with_their_header_unnumbered_lines_and_an_ascii_dash():
    old = read_record("Earlier turns, kept as notes:\n- Person: I am Marta.\n- Assistant: Oslo has 700000 people.\n"
                      "- Asked (turn x): not a number\n(turns 1-2 of this conversation)")
    assert old == Record(1, 2, (RecordLine(PERSON, "I am Marta."), RecordLine(ASSISTANT, "Oslo has 700000 people."),
                                RecordLine(TEXT, "Asked (turn x): not a number")))
    assert old.render() == ("Statements kept from earlier turns:\n- Person: I am Marta.\n"
                            "- Assistant: Oslo has 700000 people.\n- Asked (turn x): not a number\n"
                            "(turns 1–2 of this conversation)")


def test_free_text_of_an_earlier_version_reads_as_text_lines_one_per_sentence_covering_turn_one():
    record = read_record("They met Marta. She works in Oslo.\nKey facts: INC-1.")
    assert record == Record(1, 1, (RecordLine(TEXT, "They met Marta."), RecordLine(TEXT, "She works in Oslo."),
                                   RecordLine(TEXT, "Key facts: INC-1.")))
    # JSON that is no versioned record is free text too
    assert read_record('{"note": "x"}') == Record(1, 1, (RecordLine(TEXT, '{"note": "x"}'),))
    assert read_record("42").lines == (RecordLine(TEXT, "42"),) and stored_format("42") == TEXT_FORMAT


def test_a_free_text_summary_enters_the_prompt_as_the_records_lines():
    message = format_summary(read_record("They met Marta. She works in Oslo."))
    assert "<record>\nStatements kept from earlier turns:\n- They met Marta.\n- She works in Oslo.\n" \
           "(turns 1–1 of this conversation)\n</record>" in message


# ------------------------------------------------------------------------------------------ other formats


def test_a_format_newer_than_this_version_is_refused_with_a_clear_error():
    newer = json.dumps({**STORED, "fmt": 3, "lines": [{"kind": "person", "text": "x", "provenance": "turn 3"}]})
    assert stored_format(newer) == 3
    with pytest.raises(UnsupportedRecordFormat, match="record format 3 is newer than this version reads \\(2\\)"):
        read_record(newer)


@pytest.mark.parametrize("change", [
    {"fmt": 1}, {"fmt": "2"}, {"fmt": 2.0}, {"firstTurn": -1}, {"lastTurn": "5"}, {"lines": {}},
    {"lines": [{"kind": "gist", "text": "x", "turn": None, "replacedBy": None}]},
    {"lines": [{"kind": "person", "text": "x", "turn": 0, "replacedBy": None}]},
    {"lines": [{"kind": "person", "text": "x", "turn": "3", "replacedBy": None}]},
    {"lines": [{"kind": "person", "text": "x", "turn": True, "replacedBy": None}]},
    {"lines": [{"kind": "person", "text": 3, "turn": 1, "replacedBy": None}]},
    {"lines": [{"kind": "person", "text": "x", "turn": 1, "replacedBy": None, "source": "tool"}]},
    {"extra": 1},
])
def test_a_versioned_record_not_of_its_shape_is_refused(change):
    with pytest.raises(ValueError):
        read_record(json.dumps({**STORED, **change}))


# ------------------------------------------------------------------------------------------ the store (real Redis)


LIMITS = MemoryLimits()
BUDGET = 8192 - 1024
COUNTER = counter_for(None, "cl100k_base")
LEGACY = ("Earlier turns, kept as notes:\n- Person (turn 1): I am Marta and I live in Oslo.\n"
          "- Person (turn 2): Our ticket is INC-4471.\n(turns 1–2 of this conversation)")


def test_a_thread_stored_as_text_reads_the_same_and_is_upgraded_by_its_next_fold(store, redis_client):
    tid = new_thread_id()
    for i in range(3, 9):
        store.commit_messages(tid, *turn(i, f"Tell me about question number {i}?", f"Answer {i}."),
                              dedupe_by_text=False)
    key = ThreadKeys(tid).state
    redis_client.hset(key, mapping={"summary": LEGACY, "ft": 2})
    before = store.load(tid)
    assert [(line.kind, line.turn, line.text) for line in before.record.lines] == [
        (PERSON, 1, "I am Marta and I live in Oslo."), (PERSON, 2, "Our ticket is INC-4471.")]
    assert before.summary == LEGACY.replace("Earlier turns, kept as notes:", "Statements kept from earlier turns:")
    assert redis_client.hget(key, "summary") == LEGACY  # reading rewrites nothing

    plan = c.plan_compaction(before, LIMITS, COUNTER, BUDGET,
                             fixed_prompt_tokens=c.fixed_prompt_tokens(LIMITS, COUNTER))
    result = c.compose(before, plan, None, limits=LIMITS, counter=COUNTER, prompt_budget=BUDGET, require_gain=False)
    assert store.apply_compaction(tid, expected_gen=before.gen, folded_ids=plan.folded_ids, record=result.record,
                                  notes=[], compacted_at=CREATED).outcome == "applied"
    raw = redis_client.hget(key, "summary")
    assert stored_format(raw) == FORMAT_VERSION and json.loads(raw)["fmt"] == 2  # upgraded by the write
    after = store.load(tid)
    assert after.record == result.record and after.record.lines[:2] == before.record.lines  # appended to
    assert after.summary.startswith(before.summary.rsplit("\n", 1)[0] + "\n- Asked (turn 3): ")


def test_a_thread_of_a_newer_format_is_unreadable_and_never_overwritten(store, redis_client):
    tid = new_thread_id()
    store.commit_messages(tid, *turn(1), dedupe_by_text=False)
    newer = json.dumps({**STORED, "fmt": 3})
    redis_client.hset(ThreadKeys(tid).state, "summary", newer)
    with pytest.raises(CorruptState):
        store.load(tid)
    assert redis_client.hget(ThreadKeys(tid).state, "summary") == newer
    store.clear(tid)  # a clear still repairs it (docs/contract.md: memory_unreadable)
    assert store.load(tid).record == Record()


def test_the_summary_limit_applies_to_the_text_a_thread_holds_as_its_version_wrote_it(store, redis_client):
    tid = new_thread_id()
    store.commit_messages(tid, *turn(1), dedupe_by_text=False)
    key = ThreadKeys(tid).state
    # 2500 characters stored as text under the oldest header: today's header makes the text 6 characters longer,
    # and the thread still reads (a thread valid when written never becomes unreadable by being read anew)
    head, tail = "Earlier turns, kept as notes:\n- Person (turn 1): ", "\n(turns 1–1 of this conversation)"
    legacy = head + "x" * (2500 - len(head) - len(tail)) + tail
    redis_client.hset(key, "summary", legacy)
    assert len(store.load(tid).summary) == 2506
    # format 2 is checked on the text it renders: 2500 characters read, 2501 do not
    frame = len(Record(1, 1, (RecordLine(PERSON, "", 1),)).render())
    fits = Record(1, 1, (RecordLine(PERSON, "y" * (2500 - frame), 1),))
    assert len(fits.render()) == 2500 and len(fits.to_stored()) > 2500
    redis_client.hset(key, "summary", fits.to_stored())
    assert store.load(tid).record == fits
    over = Record(1, 1, (RecordLine(PERSON, "y" * (2501 - frame), 1),))
    redis_client.hset(key, "summary", over.to_stored())
    with pytest.raises(CorruptState):
        store.load(tid)


def test_a_refinement_writes_the_record_in_format_2(store, redis_client):
    tid = new_thread_id()
    store.commit_messages(tid, *turn(1), dedupe_by_text=False)
    redis_client.hset(ThreadKeys(tid).state, mapping={"summary": LEGACY, "ft": 2})
    state = store.load(tid)
    assert store.apply_refinement(tid, expected_gen=state.gen, refined_turns=2, record=state.record,
                                  notes=["Marta lives in Oslo"]).outcome == "applied"
    raw = redis_client.hget(ThreadKeys(tid).state, "summary")
    assert json.loads(raw) == {"fmt": 2, **state.record.to_dict()}
    assert store.load(tid).record == state.record


def test_nothing_parses_memory_back_from_text():
    """Only ``app.memory.migration`` reads a summary's text; the record is data everywhere else."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    readers = [p.relative_to(root).as_posix() for p in sorted((root / "app").rglob("*.py"))
               if "read_record(" in p.read_text() or "parse_record" in p.read_text()]
    assert readers == ["app/memory/migration.py", "app/store/stored_state.py"]
    assert "parse_record" not in (root / "app/memory/migration.py").read_text()
    assert "import re\n" not in (root / "app/memory/migration.py").read_text()  # read without regular expressions
