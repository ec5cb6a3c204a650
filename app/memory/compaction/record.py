"""The summary as a record of the earlier conversation: a header and one line per kept statement.

A stored summary reads::

    Statements kept from earlier turns:
    - About: The person introduced themselves and reported an outage.
    - Person: Hi, my name is Lin Wei.
    - Person: incident ticket INC-4471, the outage started on 14 March 2025 at 09:20 UTC
    - Assistant: Redis listens on port 6379 by default.
    (turns 1–8 of this conversation)

Each compaction **appends** the lines of the turns it folds (``statement_lines``:
the person's sentences that carry a fact or state a decision or preference, word
for word (not questions that give no id, number or date); for a turn in which the
person asked something, the one answer sentence that adds the most facts the person
did not give; and, when the model wrote one, a short ``About:`` line, else an ``Asked:``
line with the opening words of each message that carried nothing else) and
rewrites only the footer's turn range, so a compaction writes what the folded
turns add and never re-words what memory already holds, and a record that grew keeps
its beginning: a model server that caches the prompt's prefix (llama.cpp does) does
not read the whole record again after every compaction.

When the record would pass its limits (characters and tokens), ``fit_record``
makes room by a fixed policy, oldest and least referenced first, down to
``FIT_SHARE`` of the limits so that the next few compactions append again without
dropping anything, and reports every fact it had to let go:

1. ``Asked:`` and ``About:`` lines, oldest first;
2. long lines are cut to the clauses that carry their facts;
3. lines whose facts all appear in another line (and that decide nothing);
4. ``Assistant:`` lines, least referenced first, then oldest;
5. lines of an earlier free-text summary, oldest first;
6. ``Person:`` lines, least referenced first, then oldest.

"Referenced" counts how often a line's facts appear in the rest of memory (other
lines, notes, pins and the turns kept verbatim).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Iterable, Sequence

from app.memory.compaction.facts import CJK_RE, extract_facts, fact_present, states_decision
from app.memory.state import ThreadMessage
from app.memory.tokens import TokenCounter

ABOUT, ASKED, PERSON, ASSISTANT, TEXT = "about", "asked", "person", "assistant", "text"
LABELS = {ABOUT: "About", ASKED: "Asked", PERSON: "Person", ASSISTANT: "Assistant"}
_KINDS = {label: kind for kind, label in LABELS.items()}
HEADER = "Statements kept from earlier turns:"
LEGACY_HEADERS = ("Earlier turns, kept as notes:",)
"""Headers of records written by earlier versions, read as ``HEADER``."""
FOOTER = "(turns {first}–{last} of this conversation)"
_FOOTER_RE = re.compile(r"^\(turns (\d+)[–-](\d+) of this conversation\)$")
FIT_SHARE = 0.85
"""A record over its limits is cut down to this share of them (room for the next compactions' lines)."""
_LINE_RE = re.compile(r"^- (About|Asked|Person|Assistant): (.*)$")
ASKED_MAX_CHARS = 80
"""Longest ``Asked:`` line (the opening of a person's message that carried no fact)."""
LINE_MAX_CHARS = 240
"""Longest line kept from one message; longer ones keep the clauses that carry facts."""
SHORT_LINE_CHARS = 120
"""A line cut when the record needs room keeps at most about this many characters."""
ASSISTANT_LINES_PER_TURN = 1
"""Sentences kept from the answer to a turn in which the person asked something (the one that adds the most
facts the person did not give): a small model's answers restate or invent much, and the person's own words
are what memory must keep.  The answer to a turn that only told something keeps no sentence."""
_FIRST_PERSON_RE = re.compile(r"\b(?:i|i'm|i’m|i've|i'd|my|me|mine|we|we're|our|us)\b", re.I)
_SMALL_TALK_RE = re.compile(r"^\W*(?:hi|hey|hello|thanks|thank you|wow|totally|great|congrats|congratulations|bye|"
                            r"good (?:morning|night|evening|luck)|dear|cheers|aww|oh|haha|lol|yay|sure|ok|okay)\b",
                            re.I)
_REQUEST_RE = re.compile(
    r"^\W*(?:(?:please|pls|now|ok|okay|so|and)[, ]+)*(?:(?:can|could|would|will) you (?:please )?)?"
    r"(?:give|tell|explain|show|write|list|describe|compare|summari[sz]e|translate|define|suggest|recommend|"
    r"find|generate|calculate|convert|draft|outline)\b"
    r"|^\W*(?:请|帮我|给我|告诉我|解释|介绍|列出|推荐|翻译|写一|用一句话|用两句话|说说|讲讲)", re.I)
_CLAUSE_SPLIT_RE = re.compile(r"(?<=[,;:，；：、])\s*")
_MARKDOWN_RE = re.compile(r"^\s*(?:[-*•>]+|\d+[.)]|#+)\s+|\*\*|__")
_FENCED_CODE_RE = re.compile(r"```.*?(?:```|\Z)", re.S)


@dataclass(frozen=True)
class RecordLine:
    """One statement of the record.

    Attributes:
        kind: ``about`` (the model's gist of a fold), ``person``, ``assistant``, or ``text``
            (a line of an earlier free-text summary).
        text: the statement, one line, without its label.
    """

    kind: str
    text: str

    def render(self) -> str:
        """``- Person: ...``, ``- About: ...``, ``- Assistant: ...`` or ``- ...``."""
        label = LABELS.get(self.kind)
        return f"- {label}: {self.text}" if label else f"- {self.text}"


@dataclass(frozen=True)
class Record:
    """A parsed summary: the turn range it covers and its lines, oldest first.

    Attributes:
        first_turn: number of the first folded turn (1 once anything was folded, 0 for none).
        last_turn: number of the last folded turn.
        lines: the statements, oldest first.
    """

    first_turn: int = 0
    last_turn: int = 0
    lines: tuple[RecordLine, ...] = ()

    def render(self) -> str:
        """The summary text ("" for a record without lines): the header, the lines, the turn range."""
        if not self.lines:
            return ""
        footer = FOOTER.format(first=max(self.first_turn, 1), last=max(self.last_turn, 1))
        return "\n".join([HEADER, *(line.render() for line in self.lines), footer])


def parse_record(summary: str) -> Record:
    """Read a stored summary back into a ``Record``.

    A summary written before records existed (free text) becomes ``text`` lines, one
    per sentence, covering turns 1 to 1.
    """
    lines = [line.strip() for line in summary.strip().split("\n") if line.strip()]
    if not lines:
        return Record()
    first = last = 0
    if lines[0] == HEADER or lines[0] in LEGACY_HEADERS:
        lines = lines[1:]
    footer = _FOOTER_RE.match(lines[-1]) if lines else None
    if footer:
        first, last = int(footer.group(1)), int(footer.group(2))
        lines = lines[:-1]
    parsed: list[RecordLine] = []
    for line in lines:
        labelled = _LINE_RE.match(line)
        if labelled:
            kind = _KINDS[labelled.group(1)]
            parsed.append(RecordLine(kind, labelled.group(2).strip()))
        elif line.startswith("- "):
            parsed.append(RecordLine(TEXT, line[2:].strip()))
        else:
            parsed.extend(RecordLine(TEXT, s) for s in sentences(line))
    return Record(first or 1, last or 1, tuple(line for line in parsed if line.text))


# ------------------------------------------------------------------------------------------ sentences


@lru_cache(maxsize=2)
def _segmenter(language: str):
    import pysbd

    return pysbd.Segmenter(language=language, clean=False)


def sentences(text: str) -> list[str]:
    """``text`` split into sentences (pysbd; Chinese rules when it holds Chinese), whitespace collapsed."""
    out: list[str] = []
    for paragraph in text.split("\n"):
        paragraph = _MARKDOWN_RE.sub("", paragraph).strip()
        if not paragraph:
            continue
        segmenter = _segmenter("zh" if CJK_RE.search(paragraph) else "en")
        for piece in segmenter.segment(paragraph):
            piece = re.sub(r"\s+", " ", piece).strip()
            if piece:
                out.append(piece)
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


def asked_line(turn: Sequence[ThreadMessage]) -> RecordLine | None:
    """An ``Asked:`` line: the opening words of the person's message (for a turn that left no other line)."""
    person = next((m for m in turn if m.role == "user"), None)
    if person is None:
        return None
    first = (sentences(person.text) or [""])[0]
    if len(first) > ASKED_MAX_CHARS:
        cut = first[:ASKED_MAX_CHARS]
        space = cut.rfind(" ")
        first = (cut[:space] if space > ASKED_MAX_CHARS // 2 else cut).rstrip(" ,;:，；：") + "…"
    return RecordLine(ASKED, first) if first else None


def statement_lines(turn: Sequence[ThreadMessage], known_facts: Iterable[str] = ()) -> list[RecordLine]:
    """The record lines of one whole turn (see the module docstring).

    Args:
        turn: a user message and the assistant messages after it.
        known_facts: facts memory already holds; an answer's sentence is kept only when it
            adds facts that are neither there nor in the person's message.

    Returns:
        ``person`` lines (the person's sentences with a fact or a decision, joined into one
        line while they fit ``LINE_MAX_CHARS``), then, when the person asked something or
        stated nothing, up to ``ASSISTANT_LINES_PER_TURN`` ``assistant`` lines.
    """
    lines: list[RecordLine] = []
    covered = set(known_facts)
    for message in turn:
        if message.role != "user":
            continue
        pieces: list[str] = []
        for sentence in sentences(message.text):
            facts = _facts_in(sentence)
            covered.update(facts)  # what the person named, asked about or not, is nothing an answer adds
            if _states_something(sentence, facts):
                pieces.append(condense(sentence, facts, LINE_MAX_CHARS))
        lines.extend(RecordLine(PERSON, text) for text in _join(pieces))
    if lines and not asks(turn):
        # The person told something and asked nothing: the answer acknowledges or restates it, and a small
        # model restates with changes ("4月2日" came back as "March 2, 2025 at 9:20 UTC"). Their words stand.
        return lines
    candidates: list[tuple[int, int, str]] = []
    for message in turn:
        if message.role != "assistant":
            continue
        plain = _FENCED_CODE_RE.sub(" ", message.text)
        for index, sentence in enumerate(sentences(plain)):
            new = [f for f in _facts_in(sentence) if f not in covered and not any(f in c for c in covered)]
            if new:
                candidates.append((len(new), index, condense(sentence, new, LINE_MAX_CHARS // 2)))
    chosen = sorted(sorted(candidates, key=lambda c: (-c[0], c[1]))[:ASSISTANT_LINES_PER_TURN], key=lambda c: c[1])
    lines.extend(RecordLine(ASSISTANT, text) for _, _, text in chosen)
    return lines


def asks(turn: Sequence[ThreadMessage]) -> bool:
    """True when the person asked or requested something in ``turn`` (a question or a request sentence)."""
    return any(_is_question(sentence) for m in turn if m.role == "user" for sentence in sentences(m.text))


def statement_sentences(text: str) -> list[str]:
    """The sentences of a person's message that state something, as ``statement_lines`` keeps them: not
    the greetings that only name someone (``"Hey Mel!"``), nor questions that give no id, number or date
    (``"What is a Bloom filter?"``).  The fact guard reads these, so it never demands a name the record
    deliberately left out."""
    return [sentence for sentence in sentences(text) if _states_something(sentence, _facts_in(sentence))]


def _states_something(sentence: str, facts: Sequence[str]) -> bool:
    """True when a person's sentence is a statement the record keeps: it carries a fact or states a
    decision or preference, and is neither a greeting that only names someone ("Thanks, Melanie!")
    nor a question whose facts are only names or terms ("What is a Bloom filter?": asking names no
    fact of the person's; "Is INC-4471 still open?" gives one)."""
    if _is_question(sentence):
        return any(ch.isdigit() for fact in facts for ch in fact)
    if facts and _small_talk(sentence, facts):
        return False
    return bool(facts) or states_decision(sentence)


def _small_talk(sentence: str, facts: Sequence[str]) -> bool:
    """A short greeting, thanks or exclamation whose only facts are the names of who it is said to."""
    return (len(sentence.split()) <= 6 and bool(_SMALL_TALK_RE.match(sentence))
            and not _FIRST_PERSON_RE.search(sentence)  # "Hi, I'm Lin Wei." introduces someone
            and all(f[:1].isupper() and not any(ch.isdigit() for ch in f) for f in facts))


def _is_question(sentence: str) -> bool:
    """A question or a request ("What is ...?", "Explain Redis persistence briefly.", "请解释…"): what
    someone asks for is no statement of theirs, nor a preference."""
    return sentence.rstrip().endswith(("?", "？")) or bool(_REQUEST_RE.match(sentence))


def _join(pieces: list[str]) -> list[str]:
    joined: list[str] = []
    for piece in pieces:
        if joined and len(joined[-1]) + 1 + len(piece) <= LINE_MAX_CHARS:
            joined[-1] = joined[-1] + " " + piece
        else:
            joined.append(piece)
    return joined


# ------------------------------------------------------------------------------------------ fitting


@dataclass(frozen=True)
class FitReport:
    """What ``fit_record`` had to do.

    Attributes:
        dropped_lines: how many lines were removed.
        shortened_lines: how many lines were cut to their facts.
        dropped_facts: facts that are in no remaining line any more (let go by the policy).
        steps: the policy steps used, in order (``about``, ``shorten``, ``redundant``,
            ``assistant``, ``text``, ``person``).
    """

    dropped_lines: int = 0
    shortened_lines: int = 0
    dropped_facts: tuple[str, ...] = ()
    steps: tuple[str, ...] = field(default_factory=tuple)


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

    steps: list[str] = []
    dropped = shortened = 0
    if fits():
        return record, FitReport()
    max_chars, max_tokens = int(max_chars * FIT_SHARE), int(max_tokens * FIT_SHARE)  # room for what comes next

    def references(line: RecordLine) -> int:
        others = "\n".join(o.text for o in lines if o is not line) + "\n" + reference_text
        return sum(1 for f in _facts_in(line.text) if fact_present(f, others))

    def drop_where(step: str, predicate, order=None) -> bool:
        nonlocal dropped
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

    if drop_where("about", lambda line: line.kind in (ABOUT, ASKED)):
        return _done(record, lines, dropped, shortened, steps, original_facts)
    for i, line in enumerate(lines):
        if fits():
            break
        if len(line.text) > SHORT_LINE_CHARS:
            short = condense(line.text, _facts_in(line.text), SHORT_LINE_CHARS)
            if short != line.text:
                lines[i] = RecordLine(line.kind, short)
                shortened += 1
                if "shorten" not in steps:
                    steps.append("shorten")
    if fits():
        return _done(record, lines, dropped, shortened, steps, original_facts)

    def redundant(line: RecordLine) -> bool:
        facts = _facts_in(line.text)
        if not facts or states_decision(line.text) and line.kind == PERSON:
            return False
        others = "\n".join(o.text for o in lines if o is not line)
        return all(fact_present(f, others) for f in facts)

    age = {id(line): index for index, line in enumerate(lines)}
    for step, kind, order in (
            ("redundant", None, None),
            ("assistant", ASSISTANT, lambda line: (references(line), age.get(id(line), 0))),
            ("text", TEXT, None),
            ("person", PERSON, lambda line: (references(line), age.get(id(line), 0)))):
        predicate = redundant if kind is None else (lambda line, k=kind: line.kind == k)
        if drop_where(step, predicate, order):
            break
    return _done(record, lines, dropped, shortened, steps, original_facts)


def _done(record: Record, lines: list[RecordLine], dropped: int, shortened: int, steps: list[str],
          original_facts: set[str]) -> tuple[Record, FitReport]:
    text = "\n".join(line.text for line in lines if line.kind not in (ABOUT, ASKED))
    lost = tuple(sorted(f for f in original_facts if not fact_present(f, text)))
    return replace(record, lines=tuple(lines)), FitReport(dropped, shortened, lost, tuple(steps))
