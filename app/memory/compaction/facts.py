"""The fact guard: the names, numbers, dates, identifiers and decisions a compaction must keep.

``extract_facts`` reads English and Chinese.  Latin-script facts come from
regular expressions (ISO/written/numeric dates, weekdays, clock
times, backticked code, identifiers such as ``INC-4471`` or ``eu-west-2``,
code names, acronyms, numbers with their unit, capitalized names).  Chinese
facts come from regular expressions for dates, times and numbers with units or
counters (``2025年3月14日``, ``4月2日``, ``9点20分``, ``9000欧元``, ``3个副本``,
``两万元``) and from jieba's part-of-speech tags for person, place and
organization names (``nr``, ``ns``, ``nt``; the dictionary loads on first use,
about a second).  Identifiers written next to Chinese characters
(``工单号是INC-4471``) are found because word boundaries are ASCII-only.

``states_decision`` tells a sentence that decides, rules out or prefers
something ("we decided to ...", "决定…", "不做…", "I prefer ...").

Other scripts (Cyrillic, Arabic, Devanagari, ...) are not read beyond their
digits and Latin identifiers: ``unread_share`` says how much of a text that is,
so a retention figure never claims to have checked what it could not read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Sequence

from app.memory import lexicon, segment
from app.memory.cache import ByteCache, text_bytes
from app.memory.text import CJK_RE, FENCED_CODE_RE

# ------------------------------------------------------------------------------------------ data
# The fact kinds are named patterns (app/memory/data/facts.toml); the word lists are data (en.toml, zh.toml).

_LATIN_PATTERNS = [pattern for _, pattern in lexicon.fact_patterns("latin")]
_ZH_PATTERNS = [pattern for _, pattern in lexicon.fact_patterns("zh")]

# A number and its unit or counted noun: 68 kg, 3 replicas, 9000 euros, $300, 12,000 requests, 40%.
_NUMBERS = lexicon.on("facts.numbers")
_UNIT_STOPWORDS = lexicon.stop_words("units")
_UPPER_UNITS = frozenset(lexicon.words("en", "units", "upper"))
_EXCLUDED_TOKENS = frozenset(lexicon.words("en", "units", "not_facts"))
_NUMBER = r"[$€£¥]?\d{1,3}(?:,\d{3})+(?:\.\d+)?|[$€£¥]?\d+(?:\.\d+)?"
_NUMBER_UNIT_RE = re.compile(rf"(?<![\w.,$€£¥-])({_NUMBER})(%|(?: ?)([A-Za-z][A-Za-z]*)\b)?", re.A)
_TRAILING = ".,;:!?)]}'\"’”。，；：！？）】」"

_NAMES = lexicon.on("facts.names")
_NAME_WORD = r"[A-Z](?:[a-z]+|(?=['’][A-Z]))(?:['’-][A-Za-z]+)*"
_NAME_RE = re.compile(rf"(?<![A-Za-z0-9]){_NAME_WORD}(?: (?:{_NAME_WORD}|[A-Z]\.))*(?![A-Za-z0-9])")
_NOT_NAMES = lexicon.stop_words("names")

_ZH_NAMES = lexicon.on("facts.zh_names")
_ZH_PERSON_FLAGS = frozenset(lexicon.words("zh", "names", "person_flags"))
_ZH_PLACE_FLAGS = frozenset(lexicon.words("zh", "names", "place_flags"))
_ZH_SURNAMES = frozenset(lexicon.words("zh", "names", "surnames"))
_ZH_TOP_SURNAMES = frozenset(lexicon.words("zh", "names", "top_surnames"))
_ZH_COMPOUND_SURNAMES = lexicon.words("zh", "names", "compound_surnames")
_ZH_NOT_NAMES = frozenset(lexicon.words("zh", "names", "not_names"))
_NON_SPACE_RE = re.compile(r"\S+")

# ------------------------------------------------------------------------------------------ decisions

_DECISION_EN = lexicon.cue("en", "decisions")
_DECISION_ZH = lexicon.cue("zh", "decisions")
_ZH_PREFERENCE = lexicon.zh_preference()


_SENTENCE_END_RE = re.compile(r"(?<=[.!?。！？])\s*")


def states_decision(text: str) -> bool:
    """True when a sentence of ``text`` that does not ask (no final ``?``/``？``) decides, rules out, prefers or
    commits to something (English or Chinese cues)."""
    return any(_DECISION_EN.search(s) or _DECISION_ZH.search(s) or _ZH_PREFERENCE.search(s)
               for s in _SENTENCE_END_RE.split(text) if not s.rstrip().endswith(("?", "？")))


# ------------------------------------------------------------------------------------------ extraction


def _is_sentence_start(text: str, index: int) -> bool:
    """True when only spaces, quotes and brackets stand between ``index`` and the text's start or a sentence
    end (reads back over those characters only: linear over all the names of a text)."""
    at = index
    while at > 0 and text[at - 1] in _OPENERS:
        at -= 1
    return at == 0 or text[at - 1] in ".!?\n:。！？：…"


_OPENERS = frozenset(" \t\"'“‘([*-")


def _names(text: str) -> list[tuple[int, str]]:
    """Capitalized word runs that are not stop words and do not merely open a sentence."""
    found = []
    for match in _NAME_RE.finditer(text):
        position = match.start()
        run: list[str] = []
        run_start = position
        for word in match.group(0).split(" ") + [""]:
            if word and word.lower().rstrip(".") not in _NOT_NAMES:
                if not run:
                    run_start = position
                run.append(word)
            elif run:
                while run and _initial(run[-1]):  # a trailing initial is no name
                    run.pop()
                if run and (len(run) > 1 or not _is_sentence_start(text, run_start)):
                    found.append((run_start, " ".join(run)))
                run = []
            position += len(word) + 1
    return found


def _ordinal(value: str) -> bool:
    """True for an ordinal number such as ``21st``."""
    return value[:-2].isdigit() and value[:-2].isascii() and value[-2:] in ("st", "nd", "rd", "th")


def _counting_word(value: str) -> bool:
    """True for ``一个``, ``两个``, ``三个人``: counting words, not facts (``一个月`` is a duration)."""
    return value[:1] in "一二两三四五六七八九十" and value[1:] in ("个", "个人") and len(value) > 1


def _initial(word: str) -> bool:
    """True for an initial such as ``J.``."""
    return len(word) == 2 and word[1] == "." and "A" <= word[0] <= "Z"


def _latin(text: str) -> list[tuple[int, str]]:
    spans: list[tuple[int, str]] = []
    for pattern in _LATIN_PATTERNS:
        for match in pattern.finditer(text):
            value = match.group(1) if match.groups() else match.group(0)
            value = value if value.endswith("%") else value.rstrip(_TRAILING)
            if not value or value in _EXCLUDED_TOKENS or _ordinal(value):
                continue
            spans.append((match.start(), value))
    for match in _NUMBER_UNIT_RE.finditer(text) if _NUMBERS else ():
        number, suffix, word = match.group(1), match.group(2), match.group(3)
        if suffix == "%":
            spans.append((match.start(), number + "%"))
        elif word and (word in _UPPER_UNITS or (word[1:].islower() or len(word) == 1)) and \
                word.lower() not in _UNIT_STOPWORDS and (len(word) > 1 or word in "kgmsbKGMB"):
            spans.append((match.start(), text[match.start():match.end()].rstrip(_TRAILING)))
        elif any(c in "$€£¥.," for c in number) or len(number) > 1:  # two digits or more, money, decimals
            spans.append((match.start(), number))
    if _NAMES:
        spans.extend(_names(text))
    return spans


def _chinese(text: str) -> list[tuple[int, str]]:
    spans: list[tuple[int, str]] = []
    for pattern in _ZH_PATTERNS:
        for match in pattern.finditer(text):
            value = match.group(0).rstrip(_TRAILING)
            if _counting_word(value):
                continue  # 一个, 两个: counting words, not facts
            spans.append((match.start(), value))
    if not _ZH_NAMES:
        return spans
    posseg = segment.tagger()
    dictionary = posseg.dt.word_tag_tab
    for run in _NON_SPACE_RE.finditer(text):  # each run of non-space characters that holds a Chinese character
        if not CJK_RE.search(run.group(0)):
            continue
        offset = run.start()
        pairs = [(p.word, p.flag) for p in posseg.cut(run.group(0))]
        merged: list[tuple[str, str]] = []
        for word, flag in pairs:  # 欧阳 + 娜娜: a compound surname and the given name jieba split off
            if merged and merged[-1][0] in _ZH_COMPOUND_SURNAMES and flag in _ZH_PERSON_FLAGS:
                merged[-1] = (merged[-1][0] + word, "nr")
            else:
                merged.append((word, flag))
        for word, flag in merged:
            if len(word) >= 2 and word not in _ZH_NOT_NAMES and CJK_RE.match(word) and (
                    flag in _ZH_PLACE_FLAGS or (flag in _ZH_PERSON_FLAGS and _chinese_person_name(word) and (
                        len(word) >= 3 or word not in dictionary or word[0] in _ZH_TOP_SURNAMES))):
                spans.append((offset, word))
            offset += len(word)
    return spans


def _chinese_person_name(word: str) -> bool:
    """True for 2-4 characters starting with a common surname (single or compound).

    Two-character words that jieba's dictionary itself tags as names are mostly common
    nouns (``武功``, ``王朝``): the caller keeps only names jieba found in the text
    (not in its dictionary) or of three characters and more.
    """
    if word.startswith(_ZH_COMPOUND_SURNAMES):
        return 3 <= len(word) <= 4
    return word[0] in _ZH_SURNAMES and 2 <= len(word) <= 3


MAX_FACTS = 200
"""CPU budget: the most facts read from one text (the first ones; a real message holds a few dozen at most)."""
CACHE_MAX_BYTES = 8 * 1024 * 1024
"""The process's cache of facts per text is bounded to this many bytes (texts and facts; least recently used
out); a text larger than ``CACHE_ENTRY_MAX_BYTES`` is read without being kept."""
CACHE_ENTRY_MAX_BYTES = 64 * 1024
_cache: ByteCache[tuple[str, ...]] = ByteCache(CACHE_MAX_BYTES, CACHE_ENTRY_MAX_BYTES)


def _extract(text: str) -> tuple[str, ...]:
    found = _cache.get(text)
    if found is None:
        found = _read_facts(text)
        _cache.put(text, found, text_bytes(text) + sum(text_bytes(f) + 8 for f in found) + 200)
    return found


def _read_facts(text: str) -> tuple[str, ...]:
    plain = FENCED_CODE_RE.sub(lambda m: " " * len(m.group(0)), text)
    spans = _latin(plain)
    if CJK_RE.search(plain):
        spans.extend(_chinese(plain))
    spans.sort(key=lambda s: s[0])
    unique: dict[str, None] = {}
    for _, value in spans:
        value = value.strip()
        if value:
            unique.setdefault(value)
            if len(unique) >= MAX_FACTS:
                break
    kept = _outermost(list(unique))
    return tuple(v for v in kept if fact_present(v, text))  # only what can be checked word for word


def _outermost(facts: list[str]) -> list[str]:
    """``facts`` (unique) without those contained in another of them, in order; one search of all the facts
    per fact (a fact found twice in them, with a separator between facts, is inside another)."""
    joined = "\x00".join(facts)
    if any("\x00" in f for f in facts):
        return [v for v in facts if not any(v != other and v in other for other in facts)]
    return [v for v in facts if joined.count(v) < 2]


def extract_facts(text: str) -> list[str]:
    """The facts in ``text``, in order of first appearance; each appears in ``text`` word for word.

    A fact contained in a longer fact of the same text (``4471`` in ``INC-4471``,
    ``3月14日`` in ``2025年3月14日``) is left out.  Single digits count only with a
    unit or counted noun (``3 replicas``, ``3个副本``).  Code inside fenced blocks
    is not read.

    Returns:
        Unique facts (strings), in order of first appearance.
    """
    return list(_extract(text))


def fact_present(fact: str, text: str) -> bool:
    """True when ``fact`` appears in ``text`` word for word (not inside a longer Latin word or number).

    Linear in ``len(text)`` (string searches, no pattern compiled per fact)."""
    if not fact:
        return True
    start = _ascii_alnum(fact[0])
    end = _ascii_alnum(fact[-1])
    at = text.find(fact)
    while at >= 0:
        after = at + len(fact)
        if not (start and at > 0 and _ascii_alnum(text[at - 1])) and \
                not (end and after < len(text) and _ascii_alnum(text[after])):
            return True
        at = text.find(fact, at + 1)
    return False


def _ascii_alnum(char: str) -> bool:
    return char.isascii() and char.isalnum()


def unread_share(text: str) -> float:
    """Share (0.0-1.0) of ``text``'s letters in scripts the guard does not read (neither Latin nor CJK)."""
    letters = [ch for ch in text if ch.isalpha()]
    if not letters:
        return 0.0
    unread = sum(1 for ch in letters if not (ch.isascii() or "\u00c0" <= ch <= "\u024f" or CJK_RE.match(ch)))
    return unread / len(letters)


# ------------------------------------------------------------------------------------------ checks


@dataclass(frozen=True)
class FactCheck:
    """Which expected facts a candidate memory still holds.

    Attributes:
        facts: every expected fact.
        missing: the facts found nowhere in the candidate.
    """

    facts: tuple[str, ...]
    missing: tuple[str, ...]

    @property
    def retention(self) -> float:
        """Share of expected facts kept, 0.0 to 1.0 (1.0 when there are none)."""
        if not self.facts:
            return 1.0
        return round((len(self.facts) - len(self.missing)) / len(self.facts), 4)


def check_facts(facts: Sequence[str], *texts: str | Iterable[str]) -> FactCheck:
    """Check that each fact appears word for word in one of ``texts`` (strings or lists of strings)."""
    parts: list[str] = []
    for text in texts:
        parts.extend([text] if isinstance(text, str) else list(text))
    haystack = "\n".join(parts)
    missing = tuple(f for f in facts if not fact_present(f, haystack))
    return FactCheck(tuple(facts), missing)


def facts_of(texts: Iterable[str]) -> list[str]:
    """The facts of several texts, in order, without duplicates or facts contained in a longer one."""
    facts: dict[str, None] = {}
    for text in texts:
        for fact in extract_facts(text):
            facts.setdefault(fact)
    return _outermost(list(facts))
