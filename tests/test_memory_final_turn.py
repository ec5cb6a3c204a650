"""The final-turn adapter: statuses, sources, trimming, delivery truncation, dedupe (pure, no servers)."""

from __future__ import annotations

import re

import pytest

from app.memory.final_turn import (
    SOURCES,
    TRUNCATION_NOTICE,
    FinalTurn,
    TurnRejected,
    prepare_final_turn,
    truncate_delivery_report,
)
from app.memory.schemas import MESSAGE_SCHEMA
from app.memory.state import ThreadState
from tests.fixtures.memory_data import CREATED, message, state, text_record, turn
from tests.fixtures.reference_memory import append_turn, is_duplicate

FIXED = {"now": lambda: CREATED}


def prepare(**kwargs):
    kwargs.setdefault("user_text", "hi")
    kwargs.setdefault("assistant_text", "hello")
    return prepare_final_turn(FinalTurn(**kwargs), **FIXED)


def rejected(**kwargs) -> str:
    with pytest.raises(TurnRejected) as info:
        prepare(**kwargs)
    return info.value.reason


# -- statuses ------------------------------------------------------------------------------------

@pytest.mark.parametrize("status", ["completed", "blocked", "final", None])
def test_completed_blocked_final_and_missing_status_are_written(status):
    user, assistant = prepare(status=status)
    assert (user.text, assistant.text) == ("hi", "hello")


@pytest.mark.parametrize("status", ["paused", "failed", "cancelled", "interrupted"])
def test_unfinished_statuses_are_not_written(status):
    assert rejected(status=status) == "not_final"


@pytest.mark.parametrize("status", ["streaming", "COMPLETED", "done"])
def test_unknown_status_is_not_written(status):
    assert rejected(status=status) == "unknown_status"


# -- sources ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("source", sorted(SOURCES))
def test_every_known_source_is_written_and_never_stored(source):
    user, assistant = prepare(source=source)
    for m in (user, assistant):
        assert set(m.to_dict()) == {"id", "role", "text", "createdAt"}
        assert source not in m.to_dict().values()


def test_known_sources_are_the_five_producers():
    assert SOURCES == {"chat", "tool", "mcp-resource", "tasklist-agent", "delivery-chain"}


def test_unknown_source_is_not_written():
    assert rejected(source="browser") == "unknown_source"


# -- texts ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value", [{"text": "hi"}, ["hi"], 42, 4.2, None, b"hi", True])
def test_assistant_text_that_is_not_a_string_is_not_written(value):
    assert rejected(assistant_text=value) == "invalid_text"


@pytest.mark.parametrize("value", [{"text": "hi"}, ["hi"], 42, None, b"hi"])
def test_user_text_that_is_not_a_string_is_not_written(value):
    assert rejected(user_text=value) == "invalid_text"


@pytest.mark.parametrize("value", ["", "   ", "\n\t ", "\u3000"])
def test_blank_text_is_not_written(value):
    assert rejected(assistant_text=value) == "blank_text"
    assert rejected(user_text=value) == "blank_text"


def test_padded_texts_are_stored_trimmed():
    user, assistant = prepare(user_text="  hi there \n", assistant_text="\t hello  ")
    assert (user.text, assistant.text) == ("hi there", "hello")


def test_text_with_a_lone_surrogate_is_not_written():
    # Such a str cannot be encoded as UTF-8, so it could never be stored or sent.
    assert rejected(assistant_text="broken \ud83d half") == "invalid_text"
    assert rejected(user_text="\udcff") == "invalid_text"


# -- ids and timestamps -------------------------------------------------------------------------------

def test_given_ids_are_kept_and_missing_ids_are_fresh():
    user, assistant = prepare(user_id="client-1", assistant_id="m_server")
    assert (user.id, assistant.id) == ("client-1", "m_server")
    user, assistant = prepare()
    assert re.fullmatch(r"m_[0-9a-f]{32}", user.id) and re.fullmatch(r"m_[0-9a-f]{32}", assistant.id)
    assert user.id != assistant.id


def test_prepared_messages_satisfy_the_message_schema():
    user, assistant = prepare_final_turn(FinalTurn("hi", "hello"))
    for m in (user, assistant):
        assert MESSAGE_SCHEMA.load(m.to_dict()) == m.to_dict()
    assert (user.role, assistant.role) == ("user", "assistant")


@pytest.mark.parametrize("ids", [("same", "same"), ("has space", None), (None, "x" * 129), ("", "a")])
def test_turn_with_invalid_or_shared_message_ids_is_not_written(ids):
    # An id the stored-state schema would refuse, or one id for both messages, would corrupt the thread.
    assert rejected(user_id=ids[0], assistant_id=ids[1]) == "invalid_id"


# -- delivery-chain truncation ----------------------------------------------------------------------------

def test_long_delivery_report_is_cut_to_8000_with_the_notice():
    report = "# Delivery Report\n" + "A" * 8200
    _, assistant = prepare(assistant_text=report, source="delivery-chain", status="blocked")
    assert len(assistant.text) == 8000
    assert assistant.text.startswith("# Delivery Report\n")
    assert assistant.text.endswith(TRUNCATION_NOTICE)
    assert assistant.text == report[:8000 - len(TRUNCATION_NOTICE)] + TRUNCATION_NOTICE


def test_report_at_the_limit_is_kept_whole_and_one_over_is_cut():
    exact = "R" * 8000
    assert truncate_delivery_report(exact, 8000) == exact
    cut = truncate_delivery_report(exact + "S", 8000)
    assert len(cut) == 8000 and cut.endswith(TRUNCATION_NOTICE)


def test_truncation_removes_trailing_whitespace_before_the_notice():
    keep = 8000 - len(TRUNCATION_NOTICE)
    report = "B" * (keep - 5) + " " * 5 + "C" * 500
    cut = truncate_delivery_report(report, 8000)
    assert cut == "B" * (keep - 5) + TRUNCATION_NOTICE
    assert len(cut) == 8000 - 5


def test_truncation_is_deterministic():
    report = "x y " * 3000
    assert truncate_delivery_report(report, 8000) == truncate_delivery_report(report, 8000)


@pytest.mark.parametrize("wide", ["😀", "👍🏽", "中", "𠜎", "é"])
@pytest.mark.parametrize("offset", [0, 1, 2])
def test_truncation_never_splits_a_multibyte_character(wide, offset):
    keep = 8000 - len(TRUNCATION_NOTICE)
    report = "a" * (keep - offset) + wide * 600
    cut = truncate_delivery_report(report, 8000)
    assert len(cut) <= 8000
    assert cut.endswith(TRUNCATION_NOTICE)
    prefix = cut[: -len(TRUNCATION_NOTICE)]
    assert report.startswith(prefix)
    encoded = prefix.encode("utf-8")  # no lone surrogate: every character is whole
    assert report.encode("utf-8").startswith(encoded)
    assert encoded.decode("utf-8") == prefix
    assert len(cut.encode("utf-8")) <= len(report.encode("utf-8"))


def test_chat_answers_are_never_truncated():
    _, assistant = prepare(assistant_text="z" * 9000, source="chat")
    assert assistant.text == "z" * 9000


def test_truncation_limit_comes_from_the_caller():
    _, assistant = prepare_final_turn(FinalTurn("hi", "w" * 500, source="delivery-chain"),
                                      delivery_max_chars=200, **FIXED)
    assert len(assistant.text) == 200 and assistant.text.endswith(TRUNCATION_NOTICE)


# -- dedupe (the reference rule) -------------------------------------------------------------------------------

def test_turn_whose_assistant_id_is_stored_is_a_duplicate():
    st = state(2)
    user, _ = turn(9)
    assert is_duplicate(st, user, message("a2", "assistant", "other"), by_text=False) is True


def test_turn_whose_user_id_is_stored_is_a_duplicate():
    st = state(2)
    assert is_duplicate(st, message("u1", "user", "new"), message("a9", "assistant", "new"), by_text=False) is True


def test_id_less_turn_equal_to_the_last_pair_is_a_duplicate_only_when_deduping_by_text():
    st = state(2)  # last pair: U2 / A2
    user, assistant = message("x", "user", "U2"), message("y", "assistant", "A2")
    assert is_duplicate(st, user, assistant, by_text=True) is True
    assert is_duplicate(st, user, assistant, by_text=False) is False


def test_turn_equal_to_an_earlier_pair_but_not_the_last_is_new():
    st = state(2)  # U1/A1 is not the last pair
    assert is_duplicate(st, message("x", "user", "U1"), message("y", "assistant", "A1"), by_text=True) is False


def test_text_dedupe_is_exact():
    st = state(1)
    assert is_duplicate(st, message("x", "user", "u1"), message("y", "assistant", "A1"), by_text=True) is False
    assert is_duplicate(st, message("x", "user", "U1"), message("y", "assistant", "A1."), by_text=True) is False


def test_append_turn_appends_both_messages_and_bumps_the_version():
    st = ThreadState()
    user, assistant = turn(1)
    after = append_turn(st, user, assistant, by_text=True)
    assert after.messages == (user, assistant)
    assert after.version == 1


def test_append_turn_twice_with_the_same_ids_leaves_two_messages():
    user, assistant = turn(1)
    st = append_turn(ThreadState(), user, assistant, by_text=False)
    again = append_turn(st, user, assistant, by_text=False)
    assert again is st
    assert len(again.messages) == 2


def test_append_turn_keeps_summary_pins_and_generation():
    st = ThreadState(record=text_record("s"), pins=state(0, pins=("p",)).pins, gen=3, version=7)
    after = append_turn(st, *turn(1), by_text=True)
    assert (after.record, after.pinned_decisions, after.gen, after.version) == (text_record("s"), ["p"], 3, 8)
