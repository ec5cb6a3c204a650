"""Sentence forms: which of a person's sentences the record keeps, decided by form, never by vocabulary.

A person's sentence enters the record unless its *form* says it carries nothing to
keep (docs/memory.md).  ``sentence_form`` names the form of one sentence
(English or Chinese):

- ``question``: ends with ``?``/``？``, or (Chinese) ends with a question particle
  (``吗``, ``呢``, ``么``) or asks with an interrogative and ``啊``/``呀``;
- ``request``: asks the assistant for an answer ("explain …", "can you …", "tell me …",
  ``请…``, ``帮我…``, ``告诉我…``);
- ``greeting``: a short salutation without a statement of the speaker's own
  ("Hey Mel!", ``你好！``);
- ``thanks``: a short thank-you without a statement of the speaker's own;
- ``acknowledgement``: a short reply that only receives what was said ("OK.", "Got it",
  "That's really cool!", ``好的``, ``嗯嗯``);
- ``instruction``: about the current reply only ("just acknowledge", "one sentence please",
  ``用一句话回答``);
- ``statement``: everything else: what the record keeps, whatever its words.

The cues are *form words* (interrogatives, particles, salutations and reply verbs),
never words of a topic: replacing a sentence's names, numbers, dates or nouns
by others never changes its form (tests/test_compaction_forms.py checks it on LoCoMo and
KdConv sentences).  A question that opens with a statement clause ("I moved to Berlin
last week, do you know a good cafe?") keeps that clause (``statement_clauses``).

``corrects`` tells a sentence that changes something said before ("moved to",
"actually", ``改到``, ``更正``).
"""

from __future__ import annotations

import re
from enum import StrEnum

from app.memory import lexicon
from app.memory.compaction.facts import extract_facts
from app.memory.text import CJK_RE


class Form(StrEnum):
    """The form of a sentence (``sentence_form``; see the module docstring): a member equals its plain string."""

    STATEMENT = "statement"
    QUESTION = "question"
    REQUEST = "request"
    GREETING = "greeting"
    THANKS = "thanks"
    ACKNOWLEDGEMENT = "acknowledgement"
    INSTRUCTION = "instruction"


STATEMENT, QUESTION, REQUEST, GREETING, THANKS, ACKNOWLEDGEMENT, INSTRUCTION = (
    Form.STATEMENT, Form.QUESTION, Form.REQUEST, Form.GREETING, Form.THANKS, Form.ACKNOWLEDGEMENT, Form.INSTRUCTION)
FORMS = tuple(Form)

SHORT_WORDS = 6
"""A greeting, thanks or acknowledgement is at most this many words (longer sentences say more)."""
SHORT_CJK = 8
"""… or, in Chinese, at most this many characters (punctuation not counted)."""

_WORD_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9'’-]*")

# The cues are data (app/memory/data/en.toml, zh.toml), built into patterns by ``lexicon``.

# --- English -------------------------------------------------------------------------------------
_GREETING_RE = lexicon.cue("en", "greetings", at="start")
_THANKS_RE = lexicon.thanks_pattern()
_ACK_RE = lexicon.cue("en", "interjections", at="start")
_LEADING_ACK_RE = lexicon.leading_interjections()
_VOCATIVE_RE = re.compile(r"^(?:[\s,!.~…]*\b[A-Z][a-z]+\b)+[\s,!.~…]*$")
_DEICTIC_EVAL_RE = lexicon.evaluation_pattern()
_ASK_START_RE = lexicon.ask_start_pattern()
_UNMARKED_QUESTION_RE = lexicon.unmarked_question_pattern()
_REQUEST_RE = lexicon.request_pattern()
_POLITE_ASK_RE = lexicon.cue("en", "request_politeness", "asks", at="start")
_REPLY_WORDS_RE = lexicon.cue("en", "reply_words")
_REPLY_ONLY_RE = lexicon.reply_only_pattern()

# --- Chinese -------------------------------------------------------------------------------------
_ZH_QUESTION_END_RE = lexicon.cue("zh", "questions", "particles", at="end")
_ZH_ASKS_RE = lexicon.cue("zh", "questions", "interrogatives")
_ZH_ASK_END_RE = lexicon.cue("zh", "questions", "ask_particles", at="end")
_ZH_REQUEST_RE = lexicon.cue("zh", "requests", at="start")
_ZH_GREETING_RE = lexicon.cue("zh", "greetings", at="start")
_ZH_THANKS_RE = lexicon.cue("zh", "thanks", at="start")
_ZH_ACK_RE = lexicon.zh_acknowledgement()
_ZH_REPLY_RE = lexicon.cue("zh", "reply_instructions")

# --- correcting -----------------------------------------------------------------------------------
_CORRECTION_EN_RE = lexicon.cue("en", "corrections")
_CORRECTION_ZH_RE = lexicon.cue("zh", "corrections")


def _has_word(text: str) -> bool:
    """True when ``text`` holds a letter, a digit or ``_`` (what ``\\w`` matches)."""
    return any(ch.isalnum() or ch == "_" for ch in text)


def _plain_len(sentence: str) -> int:
    """Words (Latin) or characters (Chinese) of ``sentence``, punctuation not counted."""
    if CJK_RE.search(sentence):
        return len(CJK_RE.findall(sentence)) + len(_WORD_RE.findall(CJK_RE.sub(" ", sentence)))
    return len(_WORD_RE.findall(sentence))


def _short(sentence: str) -> bool:
    return _plain_len(sentence) <= (SHORT_CJK if CJK_RE.search(sentence) else SHORT_WORDS)


def _tells_a_fact(sentence: str) -> bool:
    """True when a short sentence holds a fact past its opening words and a name it addresses ("Hi, I'm Lin
    Wei.", "Thanks, I moved to Berlin."): then it is no mere greeting, thanks or acknowledgement."""
    rest = _VOCATIVE_END_RE.sub("", _VOCATIVE_LEAD_RE.sub("", sentence, count=1), count=1)
    return bool(extract_facts(rest))


_VOCATIVE_LEAD_RE = re.compile(r"^\W*\w+[\s,!.]*(?:[A-Z][a-z]+\b[\s,!.]*)?")  # "Hey Jon, " / "Thanks, "
_VOCATIVE_END_RE = re.compile(r",\s*[A-Z][a-z]+[\s!.~…]*$")  # ", Mel."


def is_question(sentence: str) -> bool:
    """True when ``sentence`` asks: ``?``/``？``; Chinese question particles or an interrogative with ``啊``; an
    English question typed without its mark ("where do I live") when no ``.``/``!`` ends it."""
    text = sentence.rstrip()
    if text.endswith(("?", "？")):
        return True
    if CJK_RE.search(text):
        return bool(_ZH_QUESTION_END_RE.search(text) or (_ZH_ASKS_RE.search(text) and _ZH_ASK_END_RE.search(text)))
    return not text.endswith((".", "!", "…")) and bool(_UNMARKED_QUESTION_RE.search(text))


def may_ask(sentence: str) -> bool:
    """True when ``sentence`` asks or requests (``sentence_form``), or is Chinese holding an interrogative
    ("我叫什么名字", typed without ``？``): enough to look in the archive, never enough to leave the sentence out of
    the record (an interrogative also says "some", "several": "我想买几本书")."""
    return sentence_form(sentence) in (QUESTION, REQUEST) or bool(CJK_RE.search(sentence)
                                                                  and _ZH_ASKS_RE.search(sentence))


def sentence_form(sentence: str) -> Form:
    """The form of one sentence: one of ``FORMS`` (see the module docstring).

    Args:
        sentence: one sentence (``record.sentences`` splits a message), English or Chinese.

    Returns:
        ``statement`` unless the form says the sentence carries nothing to keep.
    """
    text = sentence.strip()
    if not _has_word(text):
        return ACKNOWLEDGEMENT
    cjk = bool(CJK_RE.search(text))
    if (cjk or text.endswith(("?", "？"))) and is_question(text):
        return QUESTION
    if cjk:
        if _ZH_REQUEST_RE.search(text):
            return REQUEST
        if _ZH_REPLY_RE.search(text) and _plain_len(text) <= 16:
            return INSTRUCTION
        if _short(text) and not _tells_a_fact(text):
            if _ZH_THANKS_RE.search(text):
                return THANKS
            if _ZH_GREETING_RE.search(text):
                return GREETING
            if _ZH_ACK_RE.search(text):
                return ACKNOWLEDGEMENT
        return STATEMENT
    if _REQUEST_RE.search(text):
        return REQUEST
    if _POLITE_ASK_RE.search(text) and _REPLY_WORDS_RE.search(text) is None:
        return REQUEST  # "Could you go through the steps again."
    if _REPLY_WORDS_RE.search(text) and _REPLY_ONLY_RE.search(text) and _plain_len(text) <= 10:
        return INSTRUCTION
    if is_question(text):
        return QUESTION  # typed without its mark ("where do I live")
    if _short(text) and not _tells_a_fact(text):
        if _THANKS_RE.search(text):
            return THANKS
        if _GREETING_RE.search(text):
            return GREETING
        if _acknowledges(text):
            return ACKNOWLEDGEMENT
    return STATEMENT


def _acknowledges(text: str) -> bool:
    """Interjections ("OK", "Wow", "Got it"), then nothing but a name ("Yeah, Gina!") or an evaluation of what
    was said ("That's really cool."); never a sentence that goes on to say something ("No, the meeting is
    on Tuesday")."""
    rest = _LEADING_ACK_RE.sub("", text, count=1)
    if rest != text and (not _has_word(rest) or _VOCATIVE_RE.match(rest)):
        return True
    return bool(_DEICTIC_EVAL_RE.match(rest))


def carries_nothing(sentence: str) -> bool:
    """True when the form of ``sentence`` says it carries nothing to keep (anything but a statement)."""
    return sentence_form(sentence) != STATEMENT


_CLAUSE_RE = re.compile(r"(?<=[,;，；])\s*|\s+[-–—]\s+")


def statement_clauses(sentence: str) -> list[str]:
    """The clauses of a question or request that are statements of their own, in order.

    "I moved to Berlin last week, do you know a good cafe?" gives ``["I moved to Berlin last week"]``;
    a clause that asks, greets or acknowledges gives nothing, and the clauses after the first one that
    asks belong to its question ("Could you plan a trip, with some ideas about where to go?" gives
    ``[]``); the last clause (the one that asks) never counts.  ``[]`` for a sentence of one clause.
    """
    clauses = [c.strip() for c in _CLAUSE_RE.split(sentence.strip()) if c and c.strip()]
    if len(clauses) < 2:
        return []
    kept = []
    for clause in clauses[:-1]:
        bare = clause.rstrip(",;，；").strip()
        if _ASK_START_RE.search(bare) or (CJK_RE.search(bare) and (_ZH_ASKS_RE.search(bare) or is_question(bare))):
            break  # what follows continues this question
        if sentence_form(bare) == STATEMENT and _plain_len(bare) >= 3:
            kept.append(bare)
    return kept


def corrects(sentence: str) -> bool:
    """True when ``sentence`` changes something said before ("moved to", "actually", ``改到``, ``更正``)."""
    return bool(_CORRECTION_EN_RE.search(sentence) or _CORRECTION_ZH_RE.search(sentence))
