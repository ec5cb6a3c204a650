"""Cutting text to a length in characters or in tokens, never inside what a person sees as one character.

A person's "character" is a grapheme cluster (Unicode UAX #29: an emoji ZWJ sequence such as
👨‍👩‍👧, a flag, a letter with its combining marks); ``regex``'s ``\\X`` finds them.  Every cut here
ends on a cluster boundary, so a cut text never ends in a dangling U+200D or a lone modifier.

* ``grapheme_prefix(text, max_chars)``: the longest prefix of whole clusters (characters = code points).
* ``cut_at_word(text, max_chars, mark=..., breaks=...)``: a prefix cut back to a word (or sentence) break.
* ``clip_to_tokens(text, max_tokens, count, mark=...)``: the longest prefix whose token count fits.

And the forms text is compared in (one home for each): ``fold`` (NFKC, case-folded) and ``compare_form``
(folded, white space collapsed); ``CJK``/``CJK_RE``, the Han characters the domain reads; ``FENCED_CODE_RE``.
"""

from __future__ import annotations

import unicodedata
from typing import Callable

import regex

_GRAPHEME = regex.compile(r"\X")

# The Chinese (Han) characters the memory domain reads, as a regex class body (no brackets): CJK Unified
# Ideographs Extension A (U+3400-U+4DBF), CJK Unified Ideographs (U+4E00-U+9FFF) and CJK Compatibility
# Ideographs (U+F900-U+FAFF).  The one definition: recall, the fact guard, forms and notes use it.
CJK = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
# One Han character of ``CJK``.
CJK_RE = regex.compile(f"[{CJK}]")
# A fenced code block (three backticks to three backticks, or to the end of an unclosed block).
FENCED_CODE_RE = regex.compile(r"```.*?(?:```|\Z)", regex.S)

WORD_BREAKS = (" ",)
# A sentence end first, then a line, a clause, a list item, a word.
SENTENCE_BREAKS = (". ", "\n", "; ", ", ", " ")


def fold(text: str) -> str:
    """``text`` as comparisons read it: NFKC-normalised (full-width letters, digits and punctuation become
    their ASCII forms, ligatures are split) and case-folded.  Same length or longer; never raises."""
    return unicodedata.normalize("NFKC", text).casefold()


def compare_form(text: str) -> str:
    """``fold(text)`` with every run of white space (line breaks included) made one space, ends trimmed."""
    return " ".join(fold(text).split())


def grapheme_prefix(text: str, max_chars: int) -> str:
    """The longest prefix of ``text`` made of whole grapheme clusters and at most ``max_chars`` characters.

    ``text`` itself when it is short enough; ``""`` when ``max_chars <= 0`` or the first cluster is longer.
    """
    if len(text) <= max_chars:
        return text
    if max_chars <= 0:
        return ""
    # A cluster always ends after a line feed (UAX #29 GB4), so the scan may start after the last one.
    end = text.rfind("\n", 0, max_chars) + 1
    for match in _GRAPHEME.finditer(text, end):
        if match.end() > max_chars:
            break
        end = match.end()
    return text[:end]


def cut_at_word(text: str, max_chars: int, *, mark: str = "", breaks: tuple[str, ...] = WORD_BREAKS,
                strip: str | None = None) -> str:
    """``text`` cut to at most ``max_chars`` characters (``mark`` included) at a break.

    Text that fits is returned unchanged.  Otherwise the first ``max_chars - len(mark)``
    characters are cut back to the last occurrence of the first of ``breaks`` found at or past
    half of ``max_chars`` (a break starting with ``.`` keeps its full stop); with none there,
    they are cut at a grapheme boundary.  Then trailing characters in ``strip`` (white space
    when None) are removed and ``mark`` is appended.

    Args:
        text: the text (characters are code points).
        max_chars: the longest result, in characters.
        mark: what shows that the text was cut (for example ``"…"``), or ``""``.
        breaks: where a cut may fall, most preferred first (``WORD_BREAKS``, ``SENTENCE_BREAKS``).
        strip: characters removed from the end of the cut text before ``mark``.
    """
    if len(text) <= max_chars:
        return text
    cut = grapheme_prefix(text, max_chars - len(mark))
    for separator in breaks:
        at = cut.rfind(separator)
        if at >= max_chars // 2:
            cut = cut[: at + (1 if separator.startswith(".") else 0)]
            break
    return cut.rstrip(strip) + mark


def clip_to_tokens(text: str, max_tokens: int, count: Callable[[str], int], *, mark: str = "",
                   min_chars: int = 1) -> str:
    """``text`` when ``count(text) <= max_tokens``; else its longest prefix (whole grapheme clusters,
    trailing white space removed) that with ``mark`` appended counts at most ``max_tokens``, plus ``mark``.

    Args:
        text: the text.
        max_tokens: the most tokens the result may count.
        count: tokens of a text (for example ``TokenCounter.count``), or of the message it becomes.
        mark: appended when the text is cut (for example ``"\\n[cut to fit the model's context]"``).
        min_chars: a kept prefix shorter than this gives ``""`` (not worth showing).

    Returns:
        The text, the clipped text ending with ``mark``, or ``""`` when not even ``min_chars``
        characters fit.  Counts are assumed to grow with the prefix (true of BPE tokenizers up to
        rare merges; the result is checked).
    """
    if count(text) <= max_tokens:
        return text

    def fits(n: int) -> bool:
        return count(text[:n].rstrip() + mark) <= max_tokens

    if not fits(0):
        return ""
    # The longest fitting prefix length lies in [low, high]; start near four characters a token.
    low, high = 0, len(text) - 1
    guess = min(high, 4 * max(max_tokens, 1))
    while guess > low:
        if fits(guess):
            low = guess
            guess = min(high, guess * 2)
        else:
            high = guess - 1
            break
    while low < high:
        mid = (low + high + 1) // 2
        if fits(mid):
            low = mid
        else:
            high = mid - 1
    cut = grapheme_prefix(text, low).rstrip()
    while cut and count(cut + mark) > max_tokens:
        cut = grapheme_prefix(cut, len(cut) - 1).rstrip()
    if len(cut) < max(min_chars, 1):
        return ""
    return cut + mark
