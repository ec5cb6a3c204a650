"""What the record keeps is decided by a sentence's form, never by its vocabulary (app/memory/compaction/forms.py).

The sentences come from data nobody here wrote, read at test time from ``../shared/data``
(LoCoMo, English; KdConv, Chinese; never copied into the repository): questions, session
greetings and statements as the data has them, and the turns the data's own annotations
point at (LoCoMo's QA evidence, KdConv's knowledge triples).  A few short hand-written
sentences check the forms the data has too few of (requests, reply instructions).
"""

from __future__ import annotations

import json
import re
from functools import lru_cache

import pytest

from app.memory.compaction import forms
from app.memory.compaction.facts import extract_facts
from app.memory.compaction.record import PERSON, sentences, statement_lines, statement_sentences
from app.memory.state import ThreadMessage
from chat_support.form_cases import LABELLED
from tests.helpers.public_data import public_data


@lru_cache(maxsize=1)
def locomo() -> list[dict]:
    return json.loads(public_data("locomo10.json").read_text())


@lru_cache(maxsize=1)
def kdconv() -> list[dict]:
    return json.loads(public_data("kdconv-sample.json").read_text())


def locomo_sessions(conversation: dict) -> list[list[dict]]:
    talk = conversation["conversation"]
    keys = sorted((k for k in talk if re.fullmatch(r"session_\d+", k)), key=lambda k: int(k.split("_")[1]))
    return [talk[k] for k in keys]


@lru_cache(maxsize=1)
def english_sentences() -> list[str]:
    return [s for conv in locomo()[:3] for session in locomo_sessions(conv) for t in session
            for s in sentences(t["text"])]


@lru_cache(maxsize=1)
def chinese_sentences() -> list[str]:
    return [s for conv in kdconv() for m in conv["messages"] for s in sentences(m["message"])]


def user(text: str, mid: str = "u1") -> ThreadMessage:
    return ThreadMessage(mid, "user", text, "2026-01-01T00:00:00.000Z")


def answer(text: str, mid: str = "a1") -> ThreadMessage:
    return ThreadMessage(mid, "assistant", text, "2026-01-01T00:00:00.000Z")


def test_the_data_is_there():
    assert len(locomo()) == 10 and len(kdconv()) == 200
    assert len(english_sentences()) > 3000 and len(chinese_sentences()) > 4000


def _same_shape(fact: str, latin: str, chinese: str) -> str:
    if re.search(r"[\u4e00-\u9fff]", fact):
        return chinese
    if fact[:1].isdigit():
        return "7" if fact.isdigit() else "7 things"
    return latin.capitalize() if fact[:1].isupper() else latin


def swap_facts(sentence: str, latin: str, chinese: str) -> str:
    """``sentence`` with every name, number, date and identifier the fact guard finds replaced by another
    word of the same shape (a capitalised word for a name, a digit for a number)."""
    for fact in sorted(extract_facts(sentence), key=len, reverse=True):
        if not sentence.startswith(fact):  # a capitalised run that opens a sentence holds its first word
            sentence = sentence.replace(fact, _same_shape(fact, latin, chinese))
    return sentence


@pytest.mark.slow  # about 14 s each: every sentence of the data, twice
@pytest.mark.parametrize("latin, chinese", [("blick", "东西"), ("vorpal", "那里")])
def test_a_sentences_fate_never_depends_on_its_names_numbers_or_dates(latin, chinese):
    changed = 0
    for sentence in english_sentences() + chinese_sentences():
        other = swap_facts(sentence, latin, chinese)
        changed += other != sentence
        assert forms.sentence_form(other) == forms.sentence_form(sentence), (sentence, other)
        assert bool(statement_sentences(other)) == bool(statement_sentences(sentence)), (sentence, other)
    assert changed > 1500  # the swap touched many sentences of both languages


@pytest.mark.slow  # about 7 s: reads every sentence of the data
def test_statements_without_any_fact_are_kept_word_for_word():
    # what the old detectors could not see: sentences of the data in which the fact guard finds nothing
    plain = [s for s in english_sentences() + chinese_sentences()
             if not extract_facts(s) and forms.sentence_form(s) == forms.STATEMENT]
    assert len(plain) > 1000
    for sentence in plain[:400]:
        lines = statement_lines((user(sentence),), number=7)
        assert [(line.kind, line.text, line.turn) for line in lines] == [(PERSON, sentence, 7)], sentence


def test_locomo_question_evidence_turns_keep_their_statements():
    kept = total = 0
    for conv in locomo():
        turns = {t["dia_id"]: t for session in locomo_sessions(conv) for t in session}
        for qa in conv["qa"]:
            if qa.get("category") not in (1, 2, 3, 4):
                continue
            for dia in qa["evidence"]:
                turn = turns.get(dia)
                if turn is None:
                    continue
                total += 1
                kept += bool(statement_sentences(turn["text"]))
    assert total > 2000
    assert kept / total >= 0.99  # the rest are turns that only ask ("Wow! Did you see that band?")


def test_kdconv_knowledge_turns_keep_their_statements():
    turns = [m["message"] for conv in kdconv() for m in conv["messages"] if m.get("attrs")]
    kept = sum(bool(statement_sentences(t)) for t in turns)
    assert len(turns) > 3000 and kept / len(turns) >= 0.94


def test_questions_of_the_data_are_questions_in_both_languages():
    english = [s for s in english_sentences() if s.endswith("?")]
    chinese = [s for s in chinese_sentences() if s.endswith(("？", "?")) or re.search(r"吗[。]?$", s)]
    assert len(english) > 400 and len(chinese) > 1000
    assert {forms.sentence_form(s) for s in english} <= {forms.QUESTION, forms.STATEMENT}
    assert sum(forms.sentence_form(s) == forms.QUESTION for s in english) / len(english) >= 0.98
    assert all(forms.sentence_form(s) == forms.QUESTION for s in chinese)
    # no question of the data enters the record whole (its statement clauses may)
    for s in english + chinese:
        assert s not in statement_sentences(s), s


def test_a_question_keeps_its_statement_clause():
    kd = [s for s in chinese_sentences() if "，" in s and s.endswith("？")]
    with_clause = [s for s in kd if forms.statement_clauses(s)]
    assert len(with_clause) > 100
    for s in with_clause[:200]:
        for clause in forms.statement_clauses(s):
            assert clause in s and forms.sentence_form(clause) == forms.STATEMENT
    assert statement_sentences("I moved to Berlin last week, do you know a good cafe?") == [
        "I moved to Berlin last week"]


def test_session_openings_of_the_data_are_greetings():
    openings = [sentences(session[0]["text"])[0] for conv in locomo() for session in locomo_sessions(conv)]
    short = [s for s in openings if len(s.split()) <= 3 and not s.endswith("?")]
    assert len(short) > 100
    assert sum(forms.sentence_form(s) == forms.GREETING for s in short) / len(short) >= 0.95
    assert statement_sentences("Hey Mel! I went to a support group yesterday.") == [
        "I went to a support group yesterday."]  # a greeting beside a statement: the statement stays


@pytest.mark.parametrize("sentence, form", LABELLED)
def test_forms_the_data_has_few_of(sentence, form):
    assert forms.sentence_form(sentence) == form


def test_a_sentence_that_points_at_an_answer_is_kept_as_the_persons_own_line():
    """The person's words stand; no sentence of the answer is copied beside them (the acceptance cues were
    removed: docs/ablation.md, Decisions), and a question that points stays a question."""
    turn = (user("Ok, let's use that name.", "u2"), answer("Great, Lumen it is.", "a2"))
    assert [(line.kind, line.turn, line.text) for line in statement_lines(turn, number=2)] == [
        (PERSON, 2, "Ok, let's use that name.")]
    lines = statement_lines((user("就用第二个吧。"), answer("好的。")), number=3)
    assert [(line.kind, line.text) for line in lines] == [(PERSON, "就用第二个吧。")]
    assert statement_lines((user("Shall we go with the second option?"), answer("Yes.")), number=4) == []


@pytest.mark.parametrize("sentence, form", [
    ("where do I live", forms.QUESTION),
    ("what time is the meeting", forms.QUESTION),
    ("is Anna coming tomorrow", forms.QUESTION),
    ("Can you write it again", forms.REQUEST),
    ("where do I live.", forms.STATEMENT),  # the person's own full stop wins
    ("When I was younger we moved to Lyon", forms.STATEMENT),  # an interrogative that opens a clause
    ("Can't wait to see it", forms.STATEMENT),
    ("Do your research first", forms.STATEMENT),
])
def test_an_english_question_typed_without_its_mark_is_a_question(sentence, form):
    assert forms.sentence_form(sentence) == form


def test_a_chinese_interrogative_looks_in_the_archive_but_never_drops_the_sentence():
    assert forms.may_ask("我叫什么名字") and forms.sentence_form("我叫什么名字") == forms.STATEMENT
    assert forms.may_ask("我想买几本书。") and statement_sentences("我想买几本书。") == ["我想买几本书。"]
    assert not forms.may_ask("我们决定把发布推迟到4月2日。")


def test_the_clauses_after_an_asking_clause_belong_to_its_question():
    asked = ("Could you help me plan a relaxed weekend away with a few friends, with some ideas about where to go, "
             "what to see and how much walking is reasonable?")
    assert forms.statement_clauses(asked) == []
    assert statement_sentences(asked) == []
    told_then_asked = "We moved the dinner to Tuesday, can you remind me then, around six?"
    assert forms.statement_clauses(told_then_asked) == ["We moved the dinner to Tuesday"]


def test_the_asked_line_holds_what_was_asked_not_the_greeting_before_it():
    from app.memory.compaction.record import ASKED, asked_line
    line = asked_line((user("Hello! Can you help me keep track of a few things?"), answer("Of course.")), number=1)
    assert (line.kind, line.turn, line.text) == (ASKED, 1, "Can you help me keep track of a few things?")
    assert asked_line((user("你好！请介绍一下这个地方。"), answer("好的。"))).text == "请介绍一下这个地方。"
    assert asked_line((user("Hi Mel!"), answer("Hi!"))).text == "Hi Mel!"  # nothing asked: the first sentence
