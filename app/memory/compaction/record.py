"""Which lines the record of the earlier conversation keeps, and how it is fitted to its limits.

The record is data (``app.memory.record``: ``Record`` and ``RecordLine``, stored as JSON);
rendered (``Record.render``) it reads::

    Statements kept from earlier turns:
    - About: The person introduced themselves and planned a dinner.
    - Person (turn 1): Hi, my name is Lin Wei.
    - Person (turn 2) [replaced by turn 5]: The dinner is on Friday.
    - Assistant (turn 3): Redis listens on port 6379 by default.
    - Told (turn 4): How about calling it "Lumen"?
    - Person (turn 4): Ok, let's use that name.
    - Person (turn 5): Actually, the dinner moved to next Tuesday.
    (turns 1–5 of this conversation)

Every line carries the number of the turn it comes from (the N-th person turn of the
thread, counted across compactions; docs/contract.md: Model context for a turn), so the
model reads the order of what was said and a later statement replaces an earlier one.

Each compaction **appends** the lines of the turns it folds (``statement_lines``):

- every sentence of the person's, word for word, unless its *form* says it carries
  nothing to keep: a question or request for an answer, a greeting, thanks, an
  acknowledgement, or an instruction about the current reply only (``forms``; no list
  of fact words decides it); a question that opens with a statement clause keeps that
  clause;
- for a turn in which the person asked something, the one answer sentence that adds
  the most facts the person did not give (``Assistant``);
- when the model wrote one, a short ``About:`` line, else an ``Asked:`` line with the
  opening words of each message that left no other line;

and rewrites only the footer's turn range, so a compaction writes what the folded
turns add and never re-words what memory already holds, and a record that grew keeps
its beginning: a model server that caches the prompt's prefix (llama.cpp does) does
not read the whole record again after every compaction.  A person's line that corrects
an earlier one ("moved to", "actually", ``改到``, ``更正``) marks that one
``[replaced by turn N]`` when both share the subject's content words
(``mark_replaced``; never otherwise).

When the record would pass its limits (characters and tokens), ``fit_record``
makes room by a fixed policy, oldest and least referenced first, down to
``FIT_SHARE`` of the limits so that the next few compactions append again without
dropping anything, and reports every line and fact it had to let go:

1. ``Asked:`` and ``About:`` lines, oldest first;
2. long lines are cut to ``SHORT_LINE_CHARS`` (the clauses that carry their facts first);
3. ``Assistant:`` lines (and an older record's ``Told:`` and free-text lines), least referenced first, then
   oldest;
4. ``Person:`` lines, least referenced first, then oldest.

Each step earns its place under a tight limit (docs/ablation.md: the fitting policy's steps); a line a
correction replaced and a line whose facts stand elsewhere go with their kind.

"Referenced" counts how many of a line's retrieval tokens (``app.memory.words.tokens``: words,
identifiers and numbers, Chinese words) appear in the rest of memory (other lines, notes, pins and the turns kept verbatim).  Every folded turn
stays in the thread's archive (``app.store.archive``) whatever the record lets go, and is
recalled from there when a new message asks for it (``app.memory.recall``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from enum import StrEnum
from functools import lru_cache
from typing import TYPE_CHECKING, Callable, Iterable, Sequence

from app.memory import lexicon
from app.memory.cache import ByteCache, text_bytes
from app.memory.compaction import forms
from app.memory.compaction.facts import extract_facts, fact_present, states_decision
from app.memory.record import ABOUT, ASKED, ASSISTANT, HEADER, LABELS, PERSON, TEXT, TOLD, Record, RecordLine  # noqa: F401 (re-exported)
from app.memory.state import ThreadMessage
from app.memory.text import CJK_RE, FENCED_CODE_RE, cut_at_word, grapheme_prefix
from app.memory.tokens import TokenCounter
from app.memory.words import tokens as tokenize

if TYPE_CHECKING:
    import pysbd

FIT_SHARE = 0.6
"""A record over its limits is cut down to this share of them (room for the next compactions' lines).  Every cut
changes the record near its beginning, so the chat server reads the whole prompt after it again (about 8 s for
1,000 tokens with the bundled model here): at 0.85 a 60-turn conversation was cut every 2-8 turns, at 0.6 a third
less often, with the same planted facts retained and the same LoCoMo evidence in the prompt (the archive and recall
keep what a cut lets go; docs/benchmarks.md: Performance)."""
ASKED_MAX_CHARS = 80
"""Longest ``Asked:`` line (the opening of a person's message that carried no statement), ``…`` included."""
_CUT_STRIP = " ,;:，；：、"
"""What a cut line never ends with, before its ``…``."""
LINE_MAX_CHARS = 400
"""Longest line kept from one message; a longer sentence is cut at a word edge (the archive keeps it whole)."""
JOIN_MAX_CHARS = 240
"""Sentences of one message are joined into one line while the line stays this short."""
SHORT_LINE_CHARS = 120
"""A line cut when the record needs room keeps at most about this many characters."""
ASSISTANT_LINES_PER_TURN = 1
"""Sentences kept from the answer to a turn in which the person asked something (the one that adds the most
facts the person did not give): a small model's answers restate or invent much, and the person's own words
are what memory must keep.  The answer to a turn that only told something keeps no sentence (a ``Told:`` line
of an older record, what the person accepted, is still read and kept)."""
REPLACED_SHARE = 0.5
"""A correction marks an earlier line replaced only when at least this share of the earlier line's content
units (and at least one) are in the correction: both speak of the same subject."""
_CLAUSE_SPLIT_RE = re.compile(r"(?<=[,;:，；：、])\s*")
_MARKDOWN_RE = re.compile(r"^\s*(?:[-*•>]+|\d+[.)]|#+)\s+|\*\*|__")


# ------------------------------------------------------------------------------------------ sentences


@lru_cache(maxsize=2)
def _segmenter(language: str) -> pysbd.Segmenter:
    import pysbd

    return pysbd.Segmenter(language=language, clean=False)


SBD_WINDOW_CHARS = 1000
"""pysbd reads a paragraph at most this many characters at a time: its cost grows with the square of what it
reads (``"好。" * 6000`` took 7 s read whole, 0.8 s by windows), so a longer paragraph is read window by window, each window's
sentences but its last kept (``_segment``): linear in the paragraph, the same sentences as a whole read
wherever pysbd decides from the text near a sentence end."""


SENTENCES_CACHE_MAX_BYTES = 4 * 1024 * 1024
"""The process's cache of split texts (a compaction splits each message several times) is bounded to this many
bytes, least recently used out; a text of more than 64 KiB is split without being kept."""
_split_cache: ByteCache[tuple[str, ...]] = ByteCache(SENTENCES_CACHE_MAX_BYTES, 64 * 1024)


def sentences(text: str) -> list[str]:
    """``text`` split into sentences (pysbd; Chinese rules when it holds Chinese), whitespace collapsed.

    Linear in ``len(text)`` (``SBD_WINDOW_CHARS``); a text split before (``SENTENCES_CACHE_MAX_BYTES``)
    is not split again.
    """
    found = _split_cache.get(text)
    if found is None:
        found = tuple(_split(text))
        _split_cache.put(text, found, 2 * text_bytes(text) + 64 * len(found) + 200)
    return list(found)


def _split(text: str) -> list[str]:
    out: list[str] = []
    for paragraph in text.split("\n"):
        paragraph = _MARKDOWN_RE.sub("", paragraph).strip()
        if not paragraph:
            continue
        segmenter = _segmenter("zh" if CJK_RE.search(paragraph) else "en")
        for piece in _segment(segmenter, paragraph):
            piece = " ".join(piece.split())
            if piece:
                out.append(piece)
    return out


def _segment(segmenter: pysbd.Segmenter, paragraph: str) -> list[str]:
    """pysbd's sentences of ``paragraph``, read ``SBD_WINDOW_CHARS`` characters at a time.

    Each window keeps its sentences but the last (which may go on past the window) and the next window
    starts where they end; a window with a single sentence is cut at its last white space past its middle
    (else at a character boundary): a sentence longer than a window comes out in pieces.
    """
    out: list[str] = []
    rest = paragraph
    while len(rest) > SBD_WINDOW_CHARS:
        window = grapheme_prefix(rest, SBD_WINDOW_CHARS) or rest[:SBD_WINDOW_CHARS]
        pieces = segmenter.segment(window)
        end = 0
        for piece in pieces[:-1]:
            at = window.find(piece, end)
            if at < 0:  # not a piece of the window as written: stop here
                break
            out.append(piece)
            end = at + len(piece)
        if end == 0:
            space = max(window.rfind(" "), window.rfind("\t"))
            end = space + 1 if space >= len(window) // 2 else len(window)
            out.append(window[:end])
        rest = rest[end:]
    out.extend(segmenter.segment(rest) if rest.strip() else [])
    return out


def _clauses(sentence: str) -> list[str]:
    return [c for c in _CLAUSE_SPLIT_RE.split(sentence) if c.strip()]


def condense(sentence: str, facts: Sequence[str], max_chars: int) -> str:
    """``sentence`` cut to at most about ``max_chars`` characters, keeping every fact in ``facts``.

    Keeps the whole sentence when it fits; otherwise the clauses that carry a fact or a
    decision, joined with `` … ``; a clause still too long keeps a window around its facts.
    """
    if len(sentence) <= max_chars:
        return sentence
    wanted = [c.strip() for c in _clauses(sentence)
              if any(fact_present(f, c) for f in facts) or (not facts and states_decision(c))]
    if not wanted:
        wanted = [_clauses(sentence)[0].strip()]
    text = " … ".join(w.rstrip(",;:，；：、") for w in wanted)
    if len(text) <= max_chars:
        return text
    spans: list[list[int]] = []
    found = sorted((at, len(fact)) for fact in facts if (at := text.find(fact)) >= 0)
    for at, length in found:
        start, end = _word_edge(text, max(at - 30, 0), -1), _word_edge(text, min(at + length + 30, len(text)), 1)
        if spans and start <= spans[-1][1]:
            spans[-1][1] = max(spans[-1][1], end)  # overlapping windows become one
        else:
            spans.append([start, end])
    if not spans:
        spans = [[0, _word_edge(text, max_chars, 1)]]
    # a cut shows as "…" where text was left out, before, between and after the windows
    pieces = [text[a:b].strip(" ,;:，；：、") for a, b in spans]
    return ("… " if spans[0][0] > 0 else "") + " … ".join(pieces) + (" …" if spans[-1][1] < len(text) else "")


def _word_edge(text: str, at: int, step: int) -> int:
    """``at`` moved to the start (``step`` -1) or the end (``step`` 1) of the Latin word it falls in; a CJK
    character is a word of its own, so it never moves there."""
    while 0 < at < len(text) and text[at - 1].isalnum() and text[at].isalnum() and not CJK_RE.match(text[at]):
        at += step
    return at


def _facts_in(text: str) -> list[str]:
    return extract_facts(text)


def asked_line(turn: Sequence[ThreadMessage], number: int = 0) -> RecordLine | None:
    """An ``Asked:`` line: the opening words of what the person asked (the first sentence that asks or requests,
    else the first sentence: "Hello! Can you help me?" gives "Can you help me?"), for a turn that left no other
    line."""
    person = next((m for m in turn if m.role == "user"), None)
    if person is None:
        return None
    said = sentences(person.text)
    asking = next((s for s in said if forms.sentence_form(s) in (forms.QUESTION, forms.REQUEST)), None)
    first = cut_at_word(asking or (said or [""])[0], ASKED_MAX_CHARS, mark="…", strip=_CUT_STRIP)
    return RecordLine(ASKED, first, number) if first else None


def _cut(sentence: str, max_chars: int) -> str:
    """``sentence`` whole when it fits ``max_chars``, else its beginning cut at a word plus `` …``."""
    return cut_at_word(sentence, max_chars, mark=" …", strip=_CUT_STRIP)


def statement_lines(turn: Sequence[ThreadMessage], known_facts: Iterable[str] = (), *,
                    number: int = 0) -> list[RecordLine]:
    """The record lines of one whole turn (see the module docstring).

    Args:
        turn: a user message and the assistant messages after it.
        known_facts: facts memory already holds; an answer's sentence is kept only when it
            adds facts that are neither there nor in the person's message.
        number: the turn's number (0: not known).

    Returns:
        ``person`` lines (the
        person's sentences kept by form, joined into one line while they fit ``JOIN_MAX_CHARS``); then,
        when the person asked something or stated nothing, up to ``ASSISTANT_LINES_PER_TURN``
        ``assistant`` lines.
    """
    lines: list[RecordLine] = []
    covered = set(known_facts)
    for message in turn:
        if message.role != "user":
            continue
        pieces = statement_sentences(message.text)
        for sentence in sentences(message.text):
            covered.update(_facts_in(sentence))  # what the person named is nothing an answer adds
        lines.extend(RecordLine(PERSON, text, number) for text in _join([_cut(p, LINE_MAX_CHARS) for p in pieces]))
    if any(line.kind == PERSON for line in lines) and not asks(turn):
        # The person told something and asked nothing: the answer acknowledges or restates it, and a small
        # model restates with changes ("4月2日" came back as "March 2, 2025 at 9:20 UTC"). Their words stand.
        return lines
    candidates: list[tuple[int, int, str]] = []
    for message in turn:
        if message.role != "assistant":
            continue
        plain = FENCED_CODE_RE.sub(" ", message.text)
        for index, sentence in enumerate(sentences(plain)):
            new = [f for f in _facts_in(sentence) if f not in covered and not any(f in c for c in covered)]
            if new:
                candidates.append((len(new), index, condense(sentence, new, JOIN_MAX_CHARS // 2)))
    chosen = sorted(sorted(candidates, key=lambda c: (-c[0], c[1]))[:ASSISTANT_LINES_PER_TURN], key=lambda c: c[1])
    lines.extend(RecordLine(ASSISTANT, text, number) for _, _, text in chosen)
    return lines


def asks(turn: Sequence[ThreadMessage]) -> bool:
    """True when the person asked or requested something in ``turn`` (a question or a request sentence)."""
    return any(forms.sentence_form(sentence) in (forms.QUESTION, forms.REQUEST)
               for m in turn if m.role == "user" for sentence in sentences(m.text))


def statement_sentences(text: str) -> list[str]:
    """The parts of a person's message the record keeps, in order: every sentence whose form is a statement
    (``forms.sentence_form``), and the statement clauses of a question or request
    (``forms.statement_clauses``).  The fact guard reads these, so it never demands what a greeting or a
    question named (``"Hey Mel!"``, ``"What is a Bloom filter?"``)."""
    kept: list[str] = []
    for sentence in sentences(text):
        form = forms.sentence_form(sentence)
        if form == forms.STATEMENT:
            kept.append(sentence)
        elif form in (forms.QUESTION, forms.REQUEST):
            kept.extend(forms.statement_clauses(sentence))
    return kept


def _join(pieces: list[str]) -> list[str]:
    joined: list[str] = []
    for piece in pieces:
        if joined and len(joined[-1]) + 1 + len(piece) <= JOIN_MAX_CHARS:
            joined[-1] = joined[-1] + " " + piece
        else:
            joined.append(piece)
    return joined


def mark_replaced(lines: Sequence[RecordLine]) -> tuple[RecordLine, ...]:
    """``lines`` with each earlier ``person`` or ``told`` line that a later correction replaced marked
    ``replaced_by`` that correction's turn.

    Grounded only: the later line corrects (``forms.corrects``: "moved to", "actually", ``改到``, ...), comes
    from a later turn, and holds at least ``REPLACED_SHARE`` of the earlier line's words
    (``app.memory.words.tokens``: content words, identifiers and numbers, Chinese words; and at least one); the earlier line keeps its text (the model reads both, in order).  Lines already marked stay
    as they are.
    """
    out = list(lines)
    for later_index, later in enumerate(out):
        if later.kind != PERSON or not later.turn or not forms.corrects(later.text):
            continue
        later_units = set(tokenize(later.text))
        for index in range(later_index):
            earlier = out[index]
            if earlier.kind not in (PERSON, TOLD) or earlier.replaced_by or not earlier.turn \
                    or earlier.turn >= later.turn:
                continue
            units = set(tokenize(earlier.text))
            shared = units & later_units
            if shared and len(shared) >= REPLACED_SHARE * len(units):
                out[index] = replace(earlier, replaced_by=later.turn)
    return tuple(out)


# ------------------------------------------------------------------------------------------ fitting


class FitStep(StrEnum):
    """A step of the fitting policy (``fit_record``), in the order it is tried; each is the rule group
    ``policy.<step>`` a benchmark may switch off (``lexicon.POLICY_STEPS``; docs/ablation.md)."""

    ABOUT = "about"
    """Drop the ``About:`` and ``Asked:`` lines."""
    SHORTEN = "shorten"
    """Cut long lines to their facts (``SHORT_LINE_CHARS``)."""
    ASSISTANT = "assistant"
    """Drop answer lines (``Assistant``, ``Told``, free text), least referenced and oldest first."""
    PERSON = "person"
    """Drop the person's lines, least referenced and oldest first."""


@dataclass(frozen=True)
class FitReport:
    """What ``fit_record`` had to do.

    Attributes:
        dropped_lines: how many lines were removed.
        shortened_lines: how many lines were cut to their facts.
        dropped_facts: facts that are in no remaining line any more (let go by the policy).
        steps: the policy steps used (``FitStep``), in order.
    """

    dropped_lines: int = 0
    shortened_lines: int = 0
    dropped_facts: tuple[str, ...] = ()
    steps: tuple[FitStep, ...] = field(default_factory=tuple)


def record_cost(record: Record, counter: TokenCounter) -> tuple[int, int]:
    """(characters, tokens) of the rendered record."""
    text = record.render()
    return len(text), counter.count(text)


def fit_record(record: Record, *, max_chars: int, max_tokens: int, counter: TokenCounter,
               reference_text: str = "") -> tuple[Record, FitReport]:
    """Make ``record`` fit ``max_chars`` characters and ``max_tokens`` tokens by the module's policy.

    Args:
        record: the record with the new lines appended.
        max_chars: the summary limit in characters.
        max_tokens: the summary limit in tokens.
        counter: the model's token counter.
        reference_text: the rest of memory (notes, pins, kept turns) for reference counts.

    Returns:
        The fitted record and what was done: ``record`` itself when it fits, else one cut down to
        ``FIT_SHARE`` of both limits.  It may end with no line at all when not even one fits.
    """
    lines = list(record.lines)
    original_facts = {f for line in lines if line.kind not in (ABOUT, ASKED) for f in _facts_in(line.text)}

    def fits() -> bool:
        chars, tokens = record_cost(replace(record, lines=tuple(lines)), counter)
        return chars <= max_chars and tokens <= max_tokens

    steps: list[FitStep] = []
    dropped = shortened = 0
    if fits():
        return record, FitReport()
    max_chars, max_tokens = int(max_chars * FIT_SHARE), int(max_tokens * FIT_SHARE)  # room for what comes next

    units = {id(line): set(tokenize(line.text)) for line in lines}
    reference_units = set(tokenize(reference_text))

    def references(line: RecordLine) -> int:
        mine = units.get(id(line)) or set(tokenize(line.text))
        others = set(reference_units)
        for other in lines:
            if other is not line:
                others |= units.get(id(other)) or set(tokenize(other.text))
        return len(mine & others)

    def drop_where(step: FitStep, predicate: Callable[..., bool],
                   order: Callable[[RecordLine], tuple[int, int]] | None = None) -> bool:
        nonlocal dropped
        if not lexicon.on(f"policy.{step}"):  # switched off (``lexicon``: a benchmark's ablation)
            return fits()
        candidates = [line for line in lines if predicate(line)]
        if order is not None:
            candidates.sort(key=order)
        for line in candidates:
            if fits():
                return True
            if not predicate(line):  # dropping an earlier line can make this one needed again
                continue
            if step not in steps:
                steps.append(step)
            lines.remove(line)
            dropped += 1
        return fits()

    if drop_where(FitStep.ABOUT, lambda line: line.kind in (ABOUT, ASKED)):
        return _done(record, lines, dropped, shortened, steps, original_facts)
    for i, line in enumerate(lines if lexicon.on(f"policy.{FitStep.SHORTEN}") else ()):
        if fits():
            break
        if len(line.text) > SHORT_LINE_CHARS:
            short = condense(line.text, _facts_in(line.text), SHORT_LINE_CHARS)
            if short != line.text:
                lines[i] = replace(line, text=short)
                shortened += 1
                if FitStep.SHORTEN not in steps:
                    steps.append(FitStep.SHORTEN)
    if fits():
        return _done(record, lines, dropped, shortened, steps, original_facts)

    age = {id(line): index for index, line in enumerate(lines)}
    for step, kinds in ((FitStep.ASSISTANT, (ASSISTANT, TOLD, TEXT)), (FitStep.PERSON, (PERSON,))):
        if drop_where(step, lambda line, k=kinds: line.kind in k,
                      lambda line: (references(line), age.get(id(line), 0))):
            break
    return _done(record, lines, dropped, shortened, steps, original_facts)


def _done(record: Record, lines: list[RecordLine], dropped: int, shortened: int, steps: list[FitStep],
          original_facts: set[str]) -> tuple[Record, FitReport]:
    text = "\n".join(line.text for line in lines if line.kind not in (ABOUT, ASKED))
    lost = tuple(sorted(f for f in original_facts if not fact_present(f, text)))
    return replace(record, lines=tuple(lines)), FitReport(dropped, shortened, lost, tuple(steps))
