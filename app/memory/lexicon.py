"""The memory rules' word lists and the patterns built from them: the one place both come from.

The lists live in per-language data files beside this module (``data/en.toml``, ``data/zh.toml``; the
fact guard's named patterns in ``data/facts.toml``), each list with the rule group it belongs to and
where it came from.  This module reads them once and builds the patterns the rules match with; the
rules (``compaction.forms``, ``compaction.facts``, ``recall``, ``compaction.record``) and the tests
read the same tables.

Rule groups: every list and every switchable step names a group (``GROUPS``).  Setting the environment
variable ``MEMORY_RULES_OFF`` to comma-separated group names switches those groups off in the process
(read at import): a list of a switched-off group is empty, a pattern built from it matches nothing, a
step of it is skipped.  ``bench/ablation.py`` measures each group that way (docs/ablation.md); the
service never sets it.

Entries are plain phrases: built patterns escape them.  Two marks only: a ``+`` after a letter lets it
repeat (``hmm+``), and ``…`` stands for a short gap (up to 40 characters in English, 20 in Chinese).

Raises (at import):
    ValueError: ``MEMORY_RULES_OFF`` names a group that does not exist.
"""

from __future__ import annotations

import os
import re
import tomllib
from functools import cache
from pathlib import Path
from typing import Any, Iterable

from app.memory.text import CJK

DATA = Path(__file__).with_name("data")

POLICY_STEPS = ("policy.about", "policy.shorten", "policy.assistant", "policy.person")
"""The steps of the record's fitting policy (``compaction.record.fit_record``), in the order it tries them."""


@cache
def table(name: str) -> dict[str, Any]:
    """The parsed data file ``data/<name>.toml`` (``en``, ``zh``, ``facts``).

    Raises:
        FileNotFoundError: no such file.
    """
    with (DATA / f"{name}.toml").open("rb") as handle:
        return tomllib.load(handle)


def _groups() -> tuple[str, ...]:
    found: dict[str, None] = {}
    for language in ("en", "zh"):
        for entry in table(language).values():
            for group in entry["uses"].values() if "uses" in entry else (entry["group"],):
                found.setdefault(group)
    for script in table("facts").values():
        for entry in script.values():
            found.setdefault(entry["group"])
    for step in POLICY_STEPS:
        found.setdefault(step)
    return tuple(found)


GROUPS: tuple[str, ...] = _groups()
"""Every rule group's name, in the order the data files list them, then the fitting policy's steps."""


def _switched_off() -> frozenset[str]:
    names = frozenset(n.strip() for n in os.environ.get("MEMORY_RULES_OFF", "").split(",") if n.strip())
    unknown = sorted(names - set(GROUPS))
    if unknown:
        raise ValueError(f"MEMORY_RULES_OFF names unknown rule groups: {', '.join(unknown)} "
                         f"(known: {', '.join(GROUPS)})")
    return names


OFF: frozenset[str] = _switched_off()
"""The rule groups switched off in this process (empty unless a benchmark set ``MEMORY_RULES_OFF``)."""


def on(group: str) -> bool:
    """True unless ``group`` is switched off.

    Raises:
        KeyError: ``group`` is not one of ``GROUPS``.
    """
    if group not in GROUPS:
        raise KeyError(group)
    return group not in OFF


def words(language: str, section: str, key: str = "words") -> tuple[str, ...]:
    """The entries of one list: ``data/<language>.toml`` ``[section]`` ``key``, lower-cased for English.

    A list written as one string is split on white space (or into characters, for ``surnames``-like strings
    without spaces).  Empty when the section's group is switched off.

    Raises:
        KeyError: no such section or key.
    """
    entry = table(language)[section]
    if not on(entry["group"]):
        return ()
    value = entry[key]
    if isinstance(value, str):
        return tuple(value.split()) if any(ch.isspace() for ch in value.strip()) else tuple(value.strip())
    return tuple(value)


def word_set(language: str, section: str, key: str = "words") -> frozenset[str]:
    """``words(...)`` as a set (lower case for English entries)."""
    entries = words(language, section, key)
    return frozenset(e.lower() for e in entries) if language == "en" else frozenset(entries)


@cache
def stop_words(use: str) -> frozenset[str]:
    """The English stop words of one use, lower case: ``function`` (recall and note grounding skip them),
    ``names`` (a capitalised one is never a name) or ``units`` (never the unit after a number).

    ``data/en.toml`` ``[stop_words]`` writes each word once, under a key naming every use that reads it;
    ``uses`` names each use's group.  Empty when that group is switched off.

    Raises:
        KeyError: no such use.
    """
    entry = table("en")["stop_words"]
    if not on(entry["uses"][use]):
        return frozenset()
    return frozenset(word.lower() for key, value in entry.items() if key not in ("source", "uses")
                     and use in key.split() for word in value.split())


# --------------------------------------------------------------------------------------------- patterns


def phrase(entry: str, *, gap: int = 40) -> str:
    """The pattern of one entry: escaped; ``x+`` lets ``x`` repeat; ``…`` is a gap of 1 to ``gap``
    characters (lazy)."""
    out = []
    for index, char in enumerate(entry):
        if char == "…":
            out.append(f".{{1,{gap}}}?")
        elif char == "+" and index > 0:
            out.append("+")
        else:
            out.append(re.escape(char))
    return "".join(out)


def alternation(entries: Iterable[str], *, gap: int = 40) -> str:
    """``(?:a|b|…)`` of the entries' patterns, longest entry first; ``(?!)`` (nothing) when there is none."""
    unique = sorted(set(entries), key=lambda e: (-len(e), e))
    if not unique:
        return "(?!)"
    return "(?:" + "|".join(phrase(e, gap=gap) for e in unique) + ")"


def build(body: str, flags: int = 0) -> re.Pattern[str]:
    """The one place the memory rules' patterns are compiled (``flags``: ``re`` flags).

    Raises:
        re.error: ``body`` is not a pattern (a data file's entry gone wrong).
    """
    return re.compile(body, flags)


def zh_alternation(entries: Iterable[str]) -> str:
    """``alternation`` for Chinese entries (gaps of up to 20 characters)."""
    return alternation(entries, gap=20)


# --------------------------------------------------------------------------------------------- fact kinds

MONTH = (r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?|"
         r"Sep(?:t(?:ember)?)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)")
ZH_DIGIT = "零〇一二两三四五六七八九十百千万亿"
ZH_NUM = rf"(?:(?<!\d)\d+(?:\.\d+)?|(?<![{ZH_DIGIT}])[{ZH_DIGIT}]+)"
"""A number, Arabic or Chinese; it starts where its run of digits starts."""


def _unit_alternation(key: str) -> str:
    entries = table("zh")["units"][key]
    return "|".join(re.escape(e) for e in sorted(entries, key=lambda e: (-len(e), e)))


@cache
def fact_patterns(script: str) -> tuple[tuple[str, re.Pattern[str]], ...]:
    """``(kind, pattern)`` of every fact kind of ``script`` (``latin`` or ``zh``) whose group is on.

    Raises:
        KeyError: no such script.
    """
    pieces = {"A": r"(?<![A-Za-z0-9])", "Z": r"(?![A-Za-z0-9])", "MONTH": MONTH, "CJK": CJK,
              "ZH_DIGIT": ZH_DIGIT, "ZH_NUM": ZH_NUM, "ZH_UNITS": _unit_alternation("units"),
              "ZH_COUNTERS": _unit_alternation("counters")}
    built = []
    for kind, entry in table("facts")[script].items():
        if not on(entry["group"]):
            continue
        body = entry["pattern"]
        for name, piece in pieces.items():
            body = body.replace(f"<<{name}>>", piece)
        built.append((kind, build(body, re.A if entry.get("ascii") else 0)))
    return tuple(built)


# --------------------------------------------------------------------------------------------- cue patterns

_ZH_END = r"[\s。.!！~～…]*$"


@cache
def cue(language: str, section: str, key: str = "words", at: str = "anywhere") -> re.Pattern[str]:
    """The pattern of one list: its entries ``at`` the sentence's ``start`` (after punctuation),
    ``anywhere`` or at its ``end`` (before closing punctuation); English on word boundaries, case-insensitive.

    Matches nothing when the list's group is switched off.

    Raises:
        KeyError: no such list; ValueError: ``at`` is none of the three.
    """
    entries = words(language, section, key)
    if language == "en":
        body = {"start": r"^\W*{}\b", "anywhere": r"\b{}\b", "end": r"\b{}\W*$"}[at].format(alternation(entries))
        return build(body, re.I)
    if at not in ("start", "anywhere", "end"):
        raise ValueError(at)
    body = {"start": r"^\W*{}", "anywhere": "{}", "end": "{}" + _ZH_END}[at].format(zh_alternation(entries))
    return build(body)


@cache
def ask_start_pattern() -> re.Pattern[str]:
    """An English clause that opens as a question does: an interrogative, an auxiliary, "any…" (``[ask_openers]``)."""
    openers = [*words("en", "ask_openers", "interrogatives"), *words("en", "ask_openers", "auxiliaries"),
               *words("en", "ask_openers")]
    return build(rf"^\W*{alternation(openers)}\b", re.I)


@cache
def unmarked_question_pattern() -> re.Pattern[str]:
    """An English question typed without its mark: an interrogative then an auxiliary ("where do …", "what
    time is …"), a contracted interrogative ("what's …"), or an auxiliary then its subject ("do you …", "is
    Anna …"); never an interrogative that opens a clause ("when I was young")."""
    interrogatives = words("en", "ask_openers", "interrogatives")
    wh = alternation(interrogatives)
    contracted = alternation(words("en", "ask_openers", "contracted"))
    aux = alternation(words("en", "ask_openers", "auxiliaries"))
    subjects = alternation(words("en", "ask_openers", "subjects"))
    return build(rf"^\W*(?:(?i:{wh}(?:\s+(?!{subjects}\b)\w+)?\s+{aux}\b|{contracted}\b|{aux}\s+{subjects}\b)"
                 rf"|(?i:{aux})\s+[A-Z][a-z]+\b)")


@cache
def request_pattern() -> re.Pattern[str]:
    """An English request: fillers, a polite frame, then a verb that asks for an answer ("ok, could you
    please explain …")."""
    fillers = alternation(words("en", "request_fillers"))
    polite = alternation(words("en", "request_politeness"))
    return build(rf"^\W*(?:{fillers}[, ]+)*(?:{polite} )?{alternation(words('en', 'request_verbs'))}\b", re.I)


@cache
def reply_only_pattern() -> re.Pattern[str]:
    """An English sentence that opens as an instruction about the reply ("just one sentence", "keep it short")."""
    fillers = alternation(words("en", "request_fillers"))
    return build(rf"^\W*(?:{fillers}[, ]+)*{alternation(words('en', 'reply_words', 'openers'))}\b", re.I)


@cache
def thanks_pattern() -> re.Pattern[str]:
    """An English thank-you, optionally after a short interjection ("oh, thanks")."""
    opener = alternation(words("en", "thanks", "openers"))
    return build(rf"^\W*(?:{opener},? )?{alternation(words('en', 'thanks'))}\b", re.I)


@cache
def leading_interjections() -> re.Pattern[str]:
    """The run of interjections that opens an English sentence ("Oh wow, …")."""
    return build(rf"^(?:\W*{alternation(words('en', 'interjections'))}\b[\s,!.~…]*)+", re.I)


@cache
def evaluation_pattern() -> re.Pattern[str]:
    """A whole short evaluation of what was said ("That's really cool!"): an opener and up to three words."""
    return build(rf"^\W*{alternation(words('en', 'evaluations'))}(?:\s+[A-Za-z'’-]+){{0,3}}\W*$", re.I)


@cache
def zh_acknowledgement() -> re.Pattern[str]:
    """A Chinese sentence made only of acknowledgements and their particles (``好的好的``, ``嗯嗯，明白了``)."""
    ack = zh_alternation(words("zh", "acknowledgements"))
    particle = zh_alternation(words("zh", "acknowledgements", "particles"))
    return build(rf"^(?:[\W\s]*{ack}(?:{particle})*)+[\W\s]*$")


@cache
def zh_preference() -> re.Pattern[str]:
    """The person's own preference in Chinese: a subject, an optional adverb, a verb (``我更喜欢``)."""
    def a(key: str) -> str:
        return zh_alternation(words("zh", "decisions", key))
    return build(rf"{a('subjects')}(?:{a('adverbs')})?{a('preferences')}")
