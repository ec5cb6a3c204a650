"""The memory domain's text toolkit: one tokenizer and one overlap measure.

Recall scores archived turns by these tokens; note grounding, record-line keys, pin comparison, the record's
reference counts and forget's quoting rule compare texts by them.

Tokens (``tokens``): text is NFKC-normalised and case-folded; identifiers and numbers are whole tokens
(``INC-4471``, ``eu-west-2``, ``v2.3.1``, ``12,000``, ``14:30``); Latin words are tokens (``'s`` dropped;
letters with diacritics belong to the word: ``müller``); Chinese runs are segmented with jieba
(``app.memory.segment``: its dictionary loads on first use, about a second per process); runs of scripts
written without spaces (Thai, Lao, Khmer, Myanmar, kana) give their overlapping pairs of grapheme clusters;
every other script's words are runs of the ``regex`` module's Unicode ``\\w`` (letters with their combining
marks: Cyrillic, Greek, Arabic, Hebrew, Devanagari, Hangul, ...), Hebrew points and Arabic harakat dropped,
one-letter words left out.  Function words (``lexicon``: the ``function`` stop words of data/en.toml, ``[function_words]`` of data/zh.toml)
are left out unless asked for: they say nothing about which turn is meant.

``overlap``: the share of one text's distinct tokens found in another.  ``key``: the form two texts compare
equal in (every word, function words included, in order; punctuation, case and list marks do not count).
"""

from __future__ import annotations

from typing import Iterable

import regex

from app.memory import lexicon, segment
from app.memory.text import CJK, fold

# Scripts written without spaces between words (UAX #29's default word breaks leave a whole phrase as one
# run there): Thai, Lao, Khmer, Myanmar, and Japanese kana (with the prolonged sound mark).
_UNSPACED = r"\p{Thai}\p{Lao}\p{Khmer}\p{Myanmar}\p{Hiragana}\p{Katakana}\u30fc"
# The alternatives of a token, most specific first (the first that matches at a position wins):
_ID_RE = regex.compile(r"[0-9a-z]+(?:[-_./:#@][0-9a-z]+)+")  # INC-4471, eu-west-2, v2.3.1, 14:30, a.b@c.d
_OTHER_RE = regex.compile(
    r"(?P<zh>\d+(?:[年月日号点时分][0-9]*)+)"  # 2025年3月14日, 4月2日, 9点20分
    r"|(?P<num>\d+(?:[.,]\d+)*%?)"
    r"|(?P<word>\p{Latin}[\p{Latin}\p{M}]*(?:['’]\p{Latin}[\p{Latin}\p{M}]*)*)"
    rf"|(?P<cjk>[{CJK}]+)"
    rf"|(?P<unspaced>[{_UNSPACED}][{_UNSPACED}\p{{M}}]*)"
    # Any other script's letters with their marks (regex's Unicode ``\w``): Cyrillic, Greek, Arabic, Hebrew,
    # Devanagari, Hangul, ...; it stops where Latin, Han, an unspaced script or a digit begins.
    rf"|(?P<other>(?:(?![\p{{Latin}}{CJK}{_UNSPACED}\d_])\w)+)")
_START_RE = regex.compile(r"[^\W_]")  # where a token may start: a letter, mark or digit of any script
_ALNUM_RUN_RE = regex.compile(r"[0-9a-z]*")
_ALNUM = frozenset("0123456789abcdefghijklmnopqrstuvwxyz")
_GRAPHEME = regex.compile(r"\X")
_POINTED = regex.compile(r"[\p{Hebrew}\p{Arabic}]")
_POINTS = regex.compile(r"\p{Mn}")  # Hebrew points and Arabic harakat: optional in writing

_EN_FUNCTION = lexicon.stop_words("function")
_ZH_FUNCTION = lexicon.word_set("zh", "function_words")


def _unspaced_words(run: str) -> list[str]:
    """A run of an unspaced script as overlapping pairs of grapheme clusters (``"ありがとう"`` gives
    ``"あり", "りが", "がと", "とう"``; a run of one cluster is itself), so that a word quoted inside another
    sentence still shares tokens with the text it came from."""
    clusters = _GRAPHEME.findall(run)
    if len(clusters) < 2:
        return clusters
    return [a + b for a, b in zip(clusters, clusters[1:], strict=False)]


def tokens(text: str, *, function_words: bool = False) -> list[str]:
    """``text``'s tokens, in order (see the module docstring); with ``function_words``, those too.

    Linear in ``len(text)``: an identifier is tried once per run of letters and digits (a run that does
    not end in a separator and more letters or digits holds no identifier wherever it is entered), so a
    long run such as ``"abc12" * 2400`` costs what plain words of the same length cost.

    >>> tokens("Ticket INC-4471 moved to Tuesday, 14:30")
    ['ticket', 'inc-4471', 'moved', 'tuesday', '14:30']
    """
    lowered = fold(text)
    out: list[str] = []
    no_id_before = 0  # positions below this lie in a run of letters and digits that holds no identifier
    pos = 0
    while (start := _START_RE.search(lowered, pos)) is not None:
        at = start.start()
        match = None
        if at >= no_id_before and lowered[at] in _ALNUM:
            match = _ID_RE.match(lowered, at)
            if match is None:
                run = _ALNUM_RUN_RE.match(lowered, at)  # always matches (it may match nothing)
                no_id_before = run.end() if run else at
        if match is not None:
            out.append(match.group(0).rstrip(".,"))
            pos = match.end()
            continue
        match = _OTHER_RE.match(lowered, at)
        if match is None:  # not reached: every start character begins one of the alternatives
            pos = at + 1
            continue
        pos = match.end()
        kind, value = match.lastgroup, match.group(0)
        if kind == "cjk":
            words = segment.words(value) if len(value) > 1 else (value,)  # one character is one word
            out.extend(w for w in words if w.strip() and (function_words or w not in _ZH_FUNCTION))
        elif kind == "unspaced":
            out.extend(_unspaced_words(value))
        elif kind == "other":
            if _POINTED.match(value):
                value = _POINTS.sub("", value)
            if function_words or len(_GRAPHEME.findall(value)) > 1:  # one letter says nothing (Arabic و)
                out.append(value)
        elif kind == "word":
            if value.endswith(("'s", "’s")):
                value = value[:-2]
            if function_words or (value not in _EN_FUNCTION and len(value) > 1):
                out.append(value)
        else:
            out.append(value.rstrip(".,"))
    return out


def token_set(text: str) -> frozenset[str]:
    """The distinct ``tokens`` of ``text``."""
    return frozenset(tokens(text))


def overlap(text: str, sources: Iterable[str]) -> float:
    """Largest share (0.0-1.0) of ``text``'s distinct tokens found in one of ``sources`` (0.0 when ``text`` has
    none)."""
    own = token_set(text)
    if not own:
        return 0.0
    return max((len(own & token_set(source)) / len(own) for source in sources), default=0.0)


def key(text: str) -> str:
    """The form two texts compare equal in: every token, function words included, joined by spaces (a text
    without any, such as an emoji, compares as itself, folded)."""
    return " ".join(tokens(text, function_words=True)) or " ".join(fold(text).split())
