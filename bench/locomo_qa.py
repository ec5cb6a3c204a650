"""LoCoMo QA: does the evidence of each question reach the prompt the product would send? (docs/benchmarks.md: Memory fidelity)

Data: ``locomo10.json`` (LoCoMo, Maharana et al., ACL 2024, CC BY-NC 4.0), read at run time from ``--data``
(default ``../shared/data`` beside the checkout) and never copied into the repository.  Nothing written here
holds dataset text: the report and ``locomo.json`` carry numbers and ids only.

Replay, per conversation (the product's own code path, in process)
-----------------------------------------------------------------
* Store: ``ThreadStore`` (``app.extensions.Services``) on a real ``redis-server`` started for the run
  (``REDIS_URL`` when set).
* Turns: the conversation's utterances in order, sessions ``session_1``, ``session_2``, ... (enumerated from
  the ``session_<N>`` lists).  Speaker A is the person; a *person turn* is one speaker-A utterance, and its
  committed answer is speaker B's real utterances that follow it up to the next speaker-A utterance, joined
  with a newline (B's lines before the first A line of the conversation go to the first answer; a last A line
  without a reply gets ``NO_REPLY``).  The first person line of a session starts with the session's date in
  parentheses; a shared image is given as ``[shares a photo: <BLIP caption>]`` (as ``bench/replay.py``).
* Each turn goes as the turn runner does it (``app.chat.turn``): ``Turn.prepare`` (load the state, assemble the
  prompt; its token count is checked against the budget), ``ThreadStore.commit_final_turn``, then
  ``Services.compaction_requests.after_commit``; the fold it publishes is run at once, in process, by
  ``app.compaction.service.run_compaction`` (the Celery task's body), retries included, until none is due.
* Refinements (the model's part, docs/memory.md: A compaction) run when the product would run them, by
  ``app.compaction.service.run_refinement`` (the task's body), retries included: at once when a fold asks for
  one with its batch due (``COMPACTION_REFINE_AFTER_FOLDS`` folds without one; never with the bundled model),
  and otherwise at the next pause, when the thread is quiet: before a session's first turn (LoCoMo's sessions
  are hours or days apart, far more than ``COMPACTION_IDLE_SECONDS``) and after the conversation's last turn.
  Turns within a session count as typed faster than ``COMPACTION_IDLE_SECONDS`` apart: a pending refinement
  waits through them, and runs between two of them only once its batch is due.  No turn streams while a
  refinement runs (the replay is sequential), so the replay marks no activity.
* Compaction model: with ``--fake`` the replay fake model (``bench/replay.py`` ``ReplayFakeModel`` on
  ``chat_support.fake_llm``; a one-sentence gist and decision-like lines as proposed notes); otherwise
  ``OPENAI_BASE_URL`` / ``COMPACTION_BASE_URL`` when set, else the bundled model (both servers, as
  ``make run``).

Turn numbers
------------
Turn N is the N-th committed person turn, 1-based (``dia_turn_map``).  A ``dia_id`` ("D3:7") maps to the turn
that holds the utterance: a speaker-A utterance to its own turn, a speaker-B utterance to the turn whose answer
it is part of.

Evidence-in-prompt
------------------
After the whole conversation, for each QA item of categories 1-4 with at least one evidence id that names an
existing utterance (``parse_evidence``; malformed and dangling ids are dropped and counted), the prompt the
product would send for the question as the person's new message is assembled (``Turn.prepare``, so whatever
the product puts there, recall included, is measured).  An evidence utterance *reaches* a prompt
(``evidence_reaches``) when, in the prompt without the question itself:

* ``verbatim``: its text (NFKC, case-folded, spaces collapsed) occurs, or
* ``tagged``: some line or excerpt is tagged ``(turn N)`` for its turn N (a record line made from that turn
  or a recalled excerpt of it), or
* ``line``: an untagged record line (``- Person: <sentence>``, 20+ characters) holds a sentence of it (the
  record before turn numbers existed).

A question counts as reached when *all* its evidence utterances reach the prompt (``evidence share`` also
gives the share of single evidence utterances).  A stricter figure, ``strict``, only accepts a tagged text or
a line that holds at least half of the utterance's distinct words of 3+ letters.

Contexts compared, in the same run, on the same replayed thread:

* ``product``: this project's prompt (``Turn.prepare``);
* ``record``: the same with ``MEMORY_RECALL_SHARE=0`` (recall off: the record alone; identical to ``product``
  where the product has no recall);
* ``sliding``: the system prompt and the newest whole turns of the transcript that fit the product's prompt
  tokens for that question (equal memory tokens), then the question;
* ``full``: every turn verbatim (reference, 100 % by construction; its tokens pass the window).

Reported per category (1 multi-hop, 2 temporal, 3 open-domain, 4 single-hop; the LoCoMo evaluation code's
names) and per position of the question's earliest evidence turn in its conversation (early / middle / late
third), with prompt tokens (median, max) and the check that every prompt of the first three contexts is
within ``MODEL_CONTEXT_TOKENS - RESERVED_OUTPUT_TOKENS``.  Ratios are against the sliding window of the same
run.

Session recall
--------------
Beside evidence-in-prompt, the metric public memory systems publish: for each question, whether a session
of its gold evidence (``"D3:5"``: session 3) is among the sessions of the first 5 / 10 turns recall ranks
for the question as the person's next message (``recall_ranking``: ``ArchiveIndex.scores`` over recall's
tokens, as ``app.memory.recall`` ranks the archived turns before it leaves out what memory already holds and
fits its budget; nothing when the product would not recall for that message).  A turn's sessions are those
of the utterances it holds (``session_recall``).  Reported as ``session recall@5`` / ``@10``: the share of
questions with a hit.

Answered (``--answered N``)
---------------------------
A fixed sample of N QA items (``random.Random(--seed)`` over all measured items) is asked of the chat model
(``OPENAI_BASE_URL``, temperature 0) with each context; the answer is scored with token F1 against the gold
answer as the LoCoMo evaluation scores it (``answer_f1``: commas removed, lower-cased, punctuation and the
words a/an/the/and removed, NLTK Porter stems; category 1 splits prediction and gold at commas and averages
the best match per gold part; category 3 scores the gold answer's part before ``;``).  The person's message
is the question followed by ``ANSWER_HINT``.  The full history is asked only when it fits the window.

Usage::

    python -m bench.locomo_qa --fake --conversations 1 --target          # CI (.ci/run)
    python -m bench.locomo_qa --fake                                     # all 10 conversations, fake model
    python -m bench.locomo_qa                                            # compaction by the bundled model
    python -m bench.locomo_qa --answered 120                             # + answered, needs the chat model

Exit status: 0; 1 with ``--target`` when the product's evidence-in-prompt is below ``--min-evidence``
(default 0.50) or below ``--min-ratio`` (default 3.0) times the sliding window, or a prompt passed the budget;
2 when the data or the system is missing.

Output (``--out``, default ``docs/fidelity``): ``locomo.md``, ``locomo.json`` (numbers only), ``locomo.png``.
Units: tokens (the app's counter), seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import secrets
import statistics
import string
import subprocess
import sys
import tempfile
import threading
import time
import unicodedata
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent

LOCOMO_FILE = "locomo10.json"
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
POSITIONS = ("early", "middle", "late")
CONTEXTS = ("product", "record", "sliding", "full")
CONTEXT_NAMES = {"product": "this project", "record": "this project, recall off (record alone)",
                 "sliding": "sliding window (same tokens)", "full": "full history (reference)"}
NO_REPLY = "(no reply)"
ANSWER_HINT = " Answer with a short phrase, using the conversation's own words where possible."
DIA_ID_RE = re.compile(r"D\d+:\d+")
SESSION_RECALL_KS = (5, 10)
"""Session recall is reported at these depths (turns of recall's ranking)."""
TURN_TAG_RE = re.compile(r"\(turn (\d+)\)")


def say(message: str) -> None:
    print(message, flush=True)


# ============================================================================================ the data


@dataclass(frozen=True)
class PersonTurn:
    """One committed turn of a replay.

    Attributes:
        number: the turn number N (1-based, the N-th person turn).
        person: the person's text as sent (date prefix and photo caption included).
        answer: the committed answer (speaker B's utterances, newline-joined, or ``NO_REPLY``).
        dia_ids: the dataset ids of the utterances this turn holds (A's first).
        session: the N of the ``session_<N>`` that holds the person's line (a pause comes before a new one).
    """

    number: int
    person: str
    answer: str
    dia_ids: tuple[str, ...]
    session: int = 0


@dataclass(frozen=True)
class Question:
    """One QA item of categories 1-4.

    Attributes:
        index: position in the conversation's ``qa`` list.
        category: 1-4 (``CATEGORIES``).
        question: the question text.
        answer: the gold answer as a string.
        evidence: the evidence ids that name an existing utterance, in order, unique.
        dropped: evidence entries that were malformed or named no utterance.
    """

    index: int
    category: int
    question: str
    answer: str
    evidence: tuple[str, ...]
    dropped: int = 0


def session_numbers(conversation: dict) -> list[int]:
    """The N of every ``session_<N>`` list, ascending (``_date_time`` keys alone do not count)."""
    return sorted(int(m.group(1)) for key, value in conversation.items()
                  if (m := re.fullmatch(r"session_(\d+)", key)) and isinstance(value, list))


def utterance_text(utterance: dict) -> str:
    """An utterance's text with its shared photo as ``[shares a photo: <caption>]``, spaces collapsed."""
    text = " ".join(str(utterance.get("text") or "").split())
    caption = " ".join(str(utterance.get("blip_caption") or "").split())
    if caption:
        text = f"{text} [shares a photo: {caption}]".strip()
    return text


def build_turns(record: dict) -> tuple[list[PersonTurn], dict[str, int], dict[str, str]]:
    """The person turns of one conversation (module docstring: Replay), and two maps.

    Returns:
        (turns, dia_turn_map: dia_id -> turn number, dia_text: dia_id -> the utterance's text).
    """
    conversation = record["conversation"]
    speaker_a = conversation["speaker_a"]
    turns: list[dict] = []
    leading: list[tuple[str, str]] = []  # B's lines before the first A line
    dia_turn: dict[str, int] = {}
    dia_text: dict[str, str] = {}
    for number in session_numbers(conversation):
        date = " ".join(str(conversation.get(f"session_{number}_date_time") or "").split())
        first_person = True
        for utterance in conversation[f"session_{number}"]:
            text = utterance_text(utterance)
            dia_id = str(utterance.get("dia_id") or "")
            if not text:
                continue
            if dia_id:
                dia_text[dia_id] = text
            if utterance.get("speaker") == speaker_a:
                person = f"({date}) {text}" if first_person and date else text
                first_person = False
                turns.append({"person": person, "answers": [], "ids": [dia_id] if dia_id else [], "session": number})
                if leading:
                    turns[-1]["answers"] += [t for _, t in leading]
                    turns[-1]["ids"] += [i for i, _ in leading if i]
                    leading = []
            elif turns:
                turns[-1]["answers"].append(text)
                if dia_id:
                    turns[-1]["ids"].append(dia_id)
            else:
                leading.append((dia_id, text))
    out = []
    for n, t in enumerate(turns, 1):
        out.append(PersonTurn(n, t["person"], "\n".join(t["answers"]) or NO_REPLY, tuple(t["ids"]), t["session"]))
        for dia_id in t["ids"]:
            dia_turn[dia_id] = n
    return out, dia_turn, dia_text


def parse_evidence(evidence, known: set[str] | dict) -> tuple[tuple[str, ...], int]:
    """The well-formed evidence ids that name a known utterance (in order, unique), and how many were dropped.

    An entry may hold several ids (``"D8:6; D9:17"``); ``"D"`` or ``"D:11:26"`` hold none.  An entry that gives
    no known id counts as dropped, as does each well-formed id that names no utterance.
    """
    found: list[str] = []
    dropped = 0
    for entry in evidence or []:
        ids = DIA_ID_RE.findall(str(entry))
        if not ids:
            dropped += 1
        for dia_id in ids:
            if dia_id not in known:
                dropped += 1
            elif dia_id not in found:
                found.append(dia_id)
    return tuple(found), dropped


def load_questions(record: dict, dia_text: dict[str, str], categories=tuple(CATEGORIES)) -> tuple[list[Question], int]:
    """The QA items of ``categories`` with at least one known evidence id, and how many items had none."""
    out, without = [], 0
    for index, item in enumerate(record.get("qa") or []):
        if item.get("category") not in categories or "answer" not in item:
            continue
        evidence, dropped = parse_evidence(item.get("evidence"), dia_text)
        if not evidence:
            without += 1
            continue
        out.append(Question(index, int(item["category"]), str(item["question"]), str(item["answer"]), evidence,
                            dropped))
    return out, without


def position(turn_number: int, total_turns: int) -> str:
    """``early``, ``middle`` or ``late``: which third of ``total_turns`` turn ``turn_number`` (1-based) is in."""
    share = (turn_number - 1) / max(total_turns, 1)
    return POSITIONS[min(int(share * 3), 2)]


# ============================================================================================ evidence


def normalize(text: str) -> str:
    """Compare form: NFKC, case-folded, whitespace collapsed to one space."""
    return re.sub(r"\s+", " ", unicodedata.normalize("NFKC", text).casefold()).strip()


def tagged_texts(text: str) -> dict[int, list[str]]:
    """Every ``(turn N)`` tag in ``text`` and what follows it up to the next tag or line (``{N: [texts]}``)."""
    out: dict[int, list[str]] = {}
    matches = list(TURN_TAG_RE.finditer(text))
    for i, match in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(text)
        segment = text[match.end():end]
        segment = segment.split("\n- ", 1)[0]
        out.setdefault(int(match.group(1)), []).append(segment)
    return out


_WORD_RE = re.compile(r"[^\W\d_]{3,}")


def _words(text: str) -> set[str]:
    return set(_WORD_RE.findall(normalize(text)))


_LABEL_RE = re.compile(r"^[^:\n]{1,40}?:\s+")
_DATE_RE = re.compile(r"^\([^()]{1,40}\)\s*")
LINE_MIN_CHARS = 20
"""An untagged record line counts for an utterance only when it holds at least this many characters."""


def record_lines(text: str) -> list[str]:
    """The untagged list lines of ``text`` (``- Label: sentence``), normalised, label and date prefix removed."""
    out = []
    for line in text.split("\n"):
        if not line.startswith("- ") or TURN_TAG_RE.search(line):
            continue
        body = _DATE_RE.sub("", _LABEL_RE.sub("", line[2:], count=1), count=1)
        body = normalize(body)
        if len(body) >= LINE_MIN_CHARS:
            out.append(body)
    return out


@dataclass(frozen=True)
class PromptText:
    """A prompt's memory text (every message but the last, the question), ready for evidence checks."""

    normalized: str
    tags: dict
    lines: tuple = ()

    @classmethod
    def of(cls, messages: list[dict]) -> "PromptText":
        body = "\n".join(m["content"] for m in messages[:-1] if isinstance(m.get("content"), str))
        return cls(normalize(body), tagged_texts(body), tuple(record_lines(body)))


def evidence_reaches(prompt: PromptText, dia_id: str, dia_turn: dict[str, int], dia_text: dict[str, str],
                     *, strict: bool = False) -> str | None:
    """How the utterance ``dia_id`` reaches the prompt: ``"verbatim"``, ``"tagged"``, ``"line"``, or None.

    ``verbatim``: the utterance's whole text is in the prompt; ``tagged``: a text tagged ``(turn N)`` for its
    turn; ``line``: an untagged record line (``- Label: sentence``, at least ``LINE_MIN_CHARS`` characters)
    whose sentence is part of the utterance (a record made before turn tags).  With ``strict`` a tagged text
    or a line must also hold at least half of the utterance's distinct words (3+ letters).
    """
    text = normalize(dia_text[dia_id])
    if text and text in prompt.normalized:
        return "verbatim"
    wanted = _words(text)

    def enough(segment: str) -> bool:
        return not strict or not wanted or len(wanted & _words(segment)) * 2 >= len(wanted)

    if any(enough(segment) for segment in prompt.tags.get(dia_turn.get(dia_id, -1), ())):
        return "tagged"
    if any(line in text and enough(line) for line in prompt.lines):
        return "line"
    return None


def session_of(dia_id: str) -> int | None:
    """The session number of a ``dia_id`` (``"D3:5"`` -> 3), or None when it is not one."""
    match = re.match(r"D(\d+):", dia_id)
    return int(match.group(1)) if match else None


def session_recall(ranked, turn_sessions: dict[int, set[int]], evidence, ks=SESSION_RECALL_KS) -> dict[int, bool]:
    """For each depth k of ``ks``: whether a session of ``evidence`` is among the sessions of ``ranked[:k]``.

    Args:
        ranked: turn numbers, best first (``recall_ranking``).
        turn_sessions: turn number -> the sessions of the utterances it holds.
        evidence: the question's evidence ids (``"D3:5"``).
    """
    gold = {session_of(e) for e in evidence} - {None}
    return {k: bool(gold & {s for n in ranked[:k] for s in turn_sessions.get(n, ())}) for k in ks}


def recall_ranking(services, thread_id: str, text: str) -> list[int]:
    """The archived turns recall ranks for ``text`` as the person's next message, best first (turn numbers).

    The turn's own archive index (``Turn.load_state``) scored on recall's tokens (``ArchiveIndex.scores``,
    the relative floor applied); empty when the product would not recall for ``text`` (``Turn.recall_share``
    0) or nothing matches.
    """
    from app.chat.turn import Turn
    from app.memory.recall import tokenize

    live = Turn(services, None, thread_id, text, None)
    live.load_state()
    if live.archive is None or live.recall_share() <= 0:
        return []
    return [turn.number for _, turn in live.archive.scores(tokenize(text))]


# ============================================================================================ answered (F1)


_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES_RE = re.compile(r"\b(a|an|the|and)\b")
_stemmer = None


def _stem(word: str) -> str:
    global _stemmer
    if _stemmer is None:
        from nltk.stem import PorterStemmer

        _stemmer = PorterStemmer()
    return _stemmer.stem(word)


def normalize_answer(text) -> str:
    """LoCoMo's answer normalisation: commas out, lower case, punctuation out, a/an/the/and out, spaces collapsed."""
    text = str(text).replace(",", "").lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES_RE.sub(" ", text).split())


def token_f1(prediction, gold) -> float:
    """Token F1 of the Porter-stemmed normalised tokens (0.0 when nothing is shared)."""
    predicted = [_stem(w) for w in normalize_answer(prediction).split()]
    wanted = [_stem(w) for w in normalize_answer(gold).split()]
    same = sum((Counter(predicted) & Counter(wanted)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(predicted), same / len(wanted)
    return 2 * precision * recall / (precision + recall)


def multi_f1(prediction, gold) -> float:
    """Multi-hop: prediction and gold split at commas; the mean over gold parts of the best part's F1."""
    predictions = [p.strip() for p in str(prediction).split(",")]
    golds = [g.strip() for g in str(gold).split(",")]
    return sum(max(token_f1(p, g) for p in predictions) for g in golds) / len(golds)


def answer_f1(category: int, prediction, gold) -> float:
    """The LoCoMo score of one answer: category 1 ``multi_f1``; 2 and 4 ``token_f1``; 3 on the gold before ``;``."""
    gold = str(gold)
    if category == 3:
        gold = gold.split(";")[0].strip()
    if category == 1:
        return multi_f1(prediction, gold)
    return token_f1(prediction, gold)


# ============================================================================================ contexts


class Transcript:
    """The committed turns as chat messages, with each turn's token cost cached (for sliding and full)."""

    def __init__(self, counter, system_prompt: str):
        self.counter = counter
        self.system = {"role": "system", "content": system_prompt}
        self.pairs: list[list[dict]] = []
        self.costs: list[int] = []

    def add(self, person: str, answer: str) -> None:
        pair = [{"role": "user", "content": person}, {"role": "assistant", "content": answer}]
        self.pairs.append(pair)
        self.costs.append(sum(self.counter.message(m["role"], m["content"]) for m in pair))

    def sliding(self, question: str, budget: int) -> list[dict]:
        """The system prompt, the newest whole turns and the question, within ``budget`` prompt tokens."""
        tail = {"role": "user", "content": question}
        used = self.counter.prompt([self.system, tail])
        start = len(self.pairs)
        while start > 0 and used + self.costs[start - 1] <= budget:
            start -= 1
            used += self.costs[start]
        return [self.system] + [m for pair in self.pairs[start:] for m in pair] + [tail]

    def full(self, question: str) -> list[dict]:
        return [self.system] + [m for pair in self.pairs for m in pair] + [{"role": "user", "content": question}]


def product_prompt(services, thread_id: str, text: str) -> list[dict]:
    """The prompt the product would send for ``text`` as the person's next message (``Turn.prepare``)."""
    from app.chat.turn import Turn

    return Turn(services, None, thread_id, text, None).prepare().to_openai()


# ============================================================================================ the system


class RedisServer:
    """A ``redis-server`` on a free loopback port, no persistence, in a temporary folder."""

    def __init__(self):
        from chat_support.servers import free_port

        self.port = free_port()
        self.dir = tempfile.TemporaryDirectory(prefix="locomo-redis-")
        self.proc = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> "RedisServer":
        import redis

        self.proc = subprocess.Popen(["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no", "--dir", self.dir.name],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
        client = redis.Redis.from_url(self.url)
        deadline = time.monotonic() + 20
        while True:
            try:
                client.ping()
                return self
            except redis.ConnectionError as exc:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("redis-server did not start") from exc
                time.sleep(0.1)

    def stop(self) -> None:
        if self.proc is not None:
            from chat_support.servers import stop

            stop(self.proc)
            self.proc = None
        self.dir.cleanup()


class RecordingFake:
    """``ReplayFakeModel`` that also keeps every compaction request body (for the window check)."""

    def __init__(self):
        from bench.replay import ReplayFakeModel

        self.model = ReplayFakeModel()
        self.compaction_requests: list[dict] = []
        self._lock = threading.Lock()

    def __call__(self, body: dict):
        rf = body.get("response_format")
        if isinstance(rf, dict) and rf.get("type") in ("json_object", "json_schema"):
            with self._lock:
                self.compaction_requests.append(body)
        return self.model(body)


class Bench:
    """Everything one run starts (Redis, a model) and the product's ``Services`` built on it."""

    def __init__(self, *, fake: bool, log_dir: Path):
        self.fake = fake
        self.log_dir = log_dir
        self.stops: list = []
        self.fake_model: RecordingFake | None = None
        self.model_desc = ""
        self.env: dict[str, str] = {}
        self.queue: list[tuple[str, int]] = []
        self.refinements: list[tuple[str, int, float]] = []  # (thread id, token, countdown s) the folds asked for

    def start(self) -> "Bench":
        from bench.replay import System

        env = dict(os.environ)
        env.update(APP_ENV="test")
        if len(env.get("SECRET_KEY", "")) < 32:
            env["SECRET_KEY"] = secrets.token_hex(32)
        if not (env.get("REDIS_URL") or env.get("REDIS_TLS_URL")):
            server = RedisServer().start()
            self.stops.append(server.stop)
            env["REDIS_URL"] = server.url
        if self.fake:
            from chat_support.fake_llm import FakeLLM

            self.fake_model = RecordingFake()
            llm = FakeLLM(default=self.fake_model).start()
            self.stops.append(llm.stop)
            env.update(OPENAI_BASE_URL=llm.url, OPENAI_API_KEY="fake", CHAT_MODEL="fake-chat",
                       COMPACTION_MODEL="fake-compact")
            env.pop("COMPACTION_BASE_URL", None)
            env.pop("BUNDLED_MODEL", None)
            self.model_desc = "fake compaction model (bench/replay.py ReplayFakeModel)"
        else:
            # The bundled model's two servers, or the configured provider (bench/replay.py System).
            system = System(None, fake=False, log_dir=self.log_dir)
            system._start_model(env)
            self.stops.append(system.stop)
            self.system = system
            self.model_desc = system.model_desc
        self.env = env
        return self

    def stop(self) -> None:
        for stop in reversed(self.stops):
            try:
                stop()
            except Exception:
                pass
        self.stops.clear()

    def services(self, **overrides: str):
        """A ``Services`` for this run's environment plus ``overrides`` (variables, e.g. MEMORY_RECALL_SHARE)."""
        from app.extensions import Services
        from app.settings import Settings

        services = Services(Settings.from_env({**self.env, **overrides}))
        services.send_compaction = lambda thread_id, version: self.queue.append((thread_id, version))
        return services


# ============================================================================================ the replay


@dataclass
class ConversationRun:
    """What one conversation's replay and measurement gave (numbers and ids only)."""

    sample_id: str
    turns: int = 0
    questions: int = 0
    without_evidence: int = 0
    dropped_ids: int = 0
    seconds: float = 0.0
    compactions: Counter = field(default_factory=Counter)
    refinements: Counter = field(default_factory=Counter)
    turn_prompt_max: int = 0
    turn_prompts_over: int = 0
    full_tokens: int = 0
    rows: list = field(default_factory=list)  # one dict per question


def run_compactions(bench: Bench, services, counts: Counter) -> None:
    """Run every fold task the requests published, as the worker would (retries at once); the refinements an
    applied fold asks for go to ``bench.refinements`` (``run_refinements`` runs them)."""
    from app.compaction.service import run_compaction

    max_retries = services.settings.compaction_max_retries

    def send_refine(thread_id: str, token: int, countdown: float) -> None:
        bench.refinements.append((thread_id, token, countdown))

    while bench.queue:
        thread_id, version = bench.queue.pop(0)
        attempt = 0
        while True:
            outcome = run_compaction(services, thread_id, version, attempt=attempt, send_refine=send_refine)
            counts[outcome.outcome] += 1
            if outcome.entry and outcome.outcome == "applied" and \
                    outcome.entry.get("tokensAfter", 0) >= outcome.entry.get("tokensBefore", 0):
                counts["grew"] += 1
            if outcome.retry_in is None or attempt >= max_retries:
                break
            attempt += 1


def run_refinements(bench: Bench, services, counts: Counter, *, quiet: bool) -> None:
    """Run the refinements the folds asked for that the product would run now (module docstring: Replay).

    ``quiet``: a pause (the thread has had no turn for ``COMPACTION_IDLE_SECONDS``): every pending refinement
    runs.  Otherwise (between two turns of a session) one runs when it was published without a countdown or its
    batch is due now (``COMPACTION_REFINE_AFTER_FOLDS`` folds without one; never with the bundled model); the
    others stay pending.  Retries run at once; a refinement that has to wait (a stale one waits for quiet again)
    stays pending.  ``counts`` gets each attempt's outcome.
    """
    from app.compaction.service import run_refinement

    settings = services.settings
    pending = []
    for thread_id, token, countdown in bench.refinements:
        due = quiet or countdown <= 0
        if not due and not settings.bundled_model:
            status = services.store.refine_status(thread_id)
            due = status.unrefined_folds >= settings.compaction_refine_after_folds
        if not due:
            pending.append((thread_id, token, countdown))
            continue
        attempt = 0
        while True:
            outcome = run_refinement(services, thread_id, token, attempt=attempt)
            counts[outcome.outcome] += 1
            if outcome.retry_in is None or attempt >= settings.compaction_max_retries:
                break
            attempt += 1
        if outcome.reschedule_in is not None:
            pending.append((thread_id, token, outcome.reschedule_in))
    bench.refinements = pending


def replay(bench: Bench, services, record: dict, *, progress_every: int = 100) -> tuple[str, list[PersonTurn], dict,
                                                                                          dict, Transcript, ConversationRun]:
    """Replay one conversation through the product (module docstring: Replay); returns the thread and maps."""
    from app.memory.final_turn import FinalTurn

    settings, store, counter = services.settings, services.store, services.counter
    turns, dia_turn, dia_text = build_turns(record)
    run = ConversationRun(record["sample_id"], turns=len(turns))
    transcript = Transcript(counter, settings.system_prompt)
    thread_id = "chat:" + secrets.token_hex(32)
    started = time.monotonic()
    session = turns[0].session if turns else 0
    for turn in turns:
        from app.chat.turn import Turn

        if turn.session != session:  # a pause between two sessions: the thread is quiet
            run_refinements(bench, services, run.refinements, quiet=True)
            session = turn.session
        live = Turn(services, None, thread_id, turn.person, None)
        context = live.prepare()
        tokens = counter.prompt(context.to_openai())
        run.turn_prompt_max = max(run.turn_prompt_max, tokens)
        run.turn_prompts_over += tokens > settings.prompt_budget
        commit = store.commit_final_turn(thread_id, FinalTurn(turn.person, turn.answer, "completed", "chat"),
                                         expected_cleared=live.cleared_seen)
        transcript.add(turn.person, turn.answer)
        if commit.appended:
            uncompacted = sum(counter.count(m.text) for m in live.state.messages) + \
                counter.count(turn.person) + counter.count(turn.answer)
            services.compaction_requests.after_commit(thread_id, message_count=commit.message_count,
                                                      uncompacted_tokens=uncompacted, version=commit.version)
        run_compactions(bench, services, run.compactions)
        run_refinements(bench, services, run.refinements, quiet=False)
        if progress_every and turn.number % progress_every == 0:
            say(f"locomo: {run.sample_id} turn {turn.number}/{len(turns)}, "
                f"{run.compactions['applied']} folds and {run.refinements['applied']} refinements applied, "
                f"{time.monotonic() - started:.0f} s")
    run_refinements(bench, services, run.refinements, quiet=True)  # the thread is quiet before the questions
    run.seconds = round(time.monotonic() - started, 1)
    return thread_id, turns, dia_turn, dia_text, transcript, run


def measure(services_on, services_off, thread_id: str, record: dict, turns: list[PersonTurn], dia_turn: dict,
            dia_text: dict, transcript: Transcript, run: ConversationRun, *, keep_prompts: bool = False) -> dict:
    """Evidence-in-prompt of every question for the four contexts; fills ``run.rows``; returns prompts kept."""
    counter, budget = services_on.counter, services_on.settings.prompt_budget
    questions, run.without_evidence = load_questions(record, dia_text)
    run.questions = len(questions)
    run.dropped_ids = sum(q.dropped for q in questions)
    run.full_tokens = counter.prompt(transcript.full(""))
    kept = {}
    turn_sessions = {t.number: {number for d in t.dia_ids if (number := session_of(d)) is not None} for t in turns}
    for q in questions:
        prompts = {"product": product_prompt(services_on, thread_id, q.question),
                   "record": product_prompt(services_off, thread_id, q.question)}
        tokens = {name: counter.prompt(p) for name, p in prompts.items()}
        prompts["sliding"] = transcript.sliding(q.question, tokens["product"])
        tokens["sliding"] = counter.prompt(prompts["sliding"])
        tokens["full"] = run.full_tokens + counter.message("user", q.question)
        first = min(dia_turn[e] for e in q.evidence)
        row: dict[str, Any] = {
            "sample": run.sample_id, "qa": q.index, "category": q.category, "evidence": len(q.evidence),
            "position": position(first, len(turns)), "tokens": tokens,
            "over_budget": {n: tokens[n] > budget for n in ("product", "record", "sliding")},
            "reached": {}, "strict": {}, "share": {}, "how": {},
            "session_recall": session_recall(recall_ranking(services_on, thread_id, q.question), turn_sessions,
                                             q.evidence)}
        for name in CONTEXTS:
            if name == "full":
                text = PromptText(normalize("\n".join(m["content"] for pair in transcript.pairs for m in pair)), {})
            else:
                text = PromptText.of(prompts[name])
            how = [evidence_reaches(text, e, dia_turn, dia_text) for e in q.evidence]
            strict = [evidence_reaches(text, e, dia_turn, dia_text, strict=True) for e in q.evidence]
            row["reached"][name] = all(how)
            row["strict"][name] = all(strict)
            row["share"][name] = round(sum(h is not None for h in how) / len(how), 4)
            row["how"][name] = dict(Counter(h or "missing" for h in how))
        run.rows.append(row)
        if keep_prompts:
            kept[(run.sample_id, q.index)] = (q, prompts)
    return kept


# ============================================================================================ answered


def ask_all(settings, sample: list, *, max_tokens: int = 48) -> dict:
    """Ask the chat model each sampled question with each context; returns F1 per context (and timings).

    ``sample`` holds ``(question, prompts)``; a prompt is re-assembled with ``ANSWER_HINT`` appended to the
    question (the product's prompt for that text), and the full history is asked only when it fits the window.
    """
    from app.llm.provider import make_openai_client

    client = make_openai_client(settings, read_timeout=300.0, max_retries=1)
    scores: dict[str, list[float]] = {name: [] for name in CONTEXTS}
    skipped: Counter = Counter()
    started = time.monotonic()
    # Context by context, so that consecutive prompts share their prefix (the chat server's prompt cache reads
    # only what differs; the F1 scores do not depend on the order).
    for name in CONTEXTS:
        for q, prompts in sample:
            messages = prompts[name]
            if name == "full" and messages is None:
                skipped[name] += 1
                continue
            completion = client.chat.completions.create(model=settings.chat_model, messages=messages, temperature=0,
                                                        max_tokens=max_tokens, stream=False)
            answer = (completion.choices[0].message.content or "") if completion.choices else ""
            scores[name].append(answer_f1(q.category, answer, q.answer))
    return {"f1": {n: (round(statistics.mean(v), 4) if v else None) for n, v in scores.items()},
            "asked": {n: len(v) for n, v in scores.items()}, "skipped": dict(skipped),
            "seconds": round(time.monotonic() - started, 1)}


def answered_prompts(services_on, services_off, transcripts: dict, threads: dict, q: Question, sample_id: str):
    """The four contexts for ``q`` with ``ANSWER_HINT`` after the question (full: None when over the window)."""
    text = q.question + ANSWER_HINT
    counter, budget = services_on.counter, services_on.settings.prompt_budget
    product = product_prompt(services_on, threads[sample_id], text)
    record = product_prompt(services_off, threads[sample_id], text)
    transcript = transcripts[sample_id]
    sliding = transcript.sliding(text, counter.prompt(product))
    full = transcript.full(text)
    return {"product": product, "record": record, "sliding": sliding,
            "full": full if counter.prompt(full) <= budget else None}


# ============================================================================================ report


def rate(values) -> float | None:
    values = list(values)
    return round(sum(values) / len(values), 4) if values else None


def summarize(rows: list[dict]) -> dict:
    """Shares per context: all, per category, per position; tokens; budget checks."""
    out: dict = {"questions": len(rows)}
    for name in CONTEXTS:
        entry = {"reached": rate(r["reached"][name] for r in rows),
                 "strict": rate(r["strict"][name] for r in rows),
                 "evidence_share": rate(r["share"][name] for r in rows),
                 "by_category": {CATEGORIES[c]: rate(r["reached"][name] for r in rows if r["category"] == c)
                                 for c in CATEGORIES},
                 "by_position": {p: rate(r["reached"][name] for r in rows if r["position"] == p) for p in POSITIONS},
                 "tokens_median": statistics.median(r["tokens"][name] for r in rows) if rows else None,
                 "tokens_max": max((r["tokens"][name] for r in rows), default=None),
                 "how": dict(sum((Counter(r["how"][name]) for r in rows), Counter()))}
        if name != "full":
            entry["over_budget"] = sum(r["over_budget"][name] for r in rows)
        out[name] = entry
    out["session_recall"] = {f"at{k}": rate(r["session_recall"][k] for r in rows) for k in SESSION_RECALL_KS}
    out["counts"] = {"by_category": {CATEGORIES[c]: sum(r["category"] == c for r in rows) for c in CATEGORIES},
                     "by_position": {p: sum(r["position"] == p for r in rows) for p in POSITIONS}}
    return out


def ratio(value, base) -> float | None:
    if value is None or base is None:
        return None
    if base == 0:
        return float("inf") if value > 0 else None
    return round(value / base, 2)


def pct(value) -> str:
    return "–" if value is None else f"{100 * value:.1f} %"


def fmt_ratio(value) -> str:
    return "–" if value is None else ("∞" if value == float("inf") else f"{value:.2f}×")


def pick(*path: str) -> Callable[[dict], Any]:
    """A reader of ``entry[path[0]][path[1]]...`` (one bar group of the plot)."""
    def read(entry: dict) -> Any:
        value: Any = entry
        for key in path:
            value = value[key]
        return value
    return read


def write_plot(summary: dict, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = [("all", pick("reached"))]
    groups += [(CATEGORIES[c], pick("by_category", CATEGORIES[c])) for c in CATEGORIES]
    groups += [(p, pick("by_position", p)) for p in POSITIONS]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(13, 4.8), gridspec_kw={"width_ratios": [4, 1]})
    width = 0.8 / len(CONTEXTS)
    for i, name in enumerate(CONTEXTS):
        values = [100 * (get(summary[name]) or 0) for _, get in groups]
        ax.bar([x + i * width for x in range(len(groups))], values, width, label=CONTEXT_NAMES[name])
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(groups))])
    ax.set_xticklabels([label for label, _ in groups], fontsize=8)
    ax.set_ylabel("% of questions with all evidence in the prompt")
    ax.set_ylim(0, 105)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    ax2.bar(range(len(CONTEXTS)), [summary[n]["tokens_median"] or 0 for n in CONTEXTS],
            color=[f"C{i}" for i in range(len(CONTEXTS))])
    ax2.set_xticks(range(len(CONTEXTS)))
    ax2.set_xticklabels(["project", "recall off", "sliding", "full"], fontsize=7)
    ax2.set_yscale("log")
    ax2.set_title("prompt tokens (median)", fontsize=9)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(out: Path, results: dict) -> str:
    s = results["summary"]
    base = s["sliding"]
    names = [CONTEXT_NAMES[n] for n in CONTEXTS]
    lines = [f"# LoCoMo QA: evidence in the prompt ({results['model']})", "",
             f"Command: `{results['command']}`", "",
             f"Data: LoCoMo `locomo10.json` (Maharana et al., ACL 2024; CC BY-NC 4.0), {len(results['conversations'])} "
             f"conversations, {s['questions']} questions of categories 1-4 with evidence "
             f"({results['without_evidence']} without a usable evidence id left out, {results['dropped_ids']} "
             f"malformed or dangling ids dropped). Speaker A is the person, speaker B's lines are the committed "
             f"answers. Window {results['context_tokens']} tokens, {results['reserved_output_tokens']} reserved "
             f"(prompt budget {results['budget']}); recent window {results['recent_turns']} turns.", "",
             "Share of questions whose every evidence turn is in the prompt (verbatim, a line/excerpt tagged "
             "`(turn N)` for it, or an untagged record line holding one of its sentences); ratios against the sliding window of this run at the same prompt tokens.", "",
             "| | " + " | ".join(names) + " |", "|" + "---|" * (len(CONTEXTS) + 1)]

    def row(label, get, ratios=True):
        cells = []
        for n in CONTEXTS:
            value = get(s[n])
            cell = pct(value)
            if ratios and n in ("product", "record"):
                cell += f" ({fmt_ratio(ratio(value, get(base)))})"
            cells.append(cell)
        return f"| {label} | " + " | ".join(cells) + " |"

    lines.append(row("**all questions**", lambda e: e["reached"]))
    lines.append(row("strict (a tagged text or line holds half its words)", lambda e: e["strict"]))
    lines.append(row("evidence turns (share)", lambda e: e["evidence_share"]))
    for c in CATEGORIES:
        label = f"category {c} {CATEGORIES[c]} (n={s['counts']['by_category'][CATEGORIES[c]]})"
        lines.append(row(label, lambda e, c=c: e["by_category"][CATEGORIES[c]]))
    for p in POSITIONS:
        lines.append(row(f"evidence {p} third (n={s['counts']['by_position'][p]})", lambda e, p=p: e["by_position"][p]))
    lines.append("| session recall " + " / ".join(f"@{k}" for k in SESSION_RECALL_KS) + " (a gold evidence session "
                 "among the sessions of recall's top turns) | "
                 + " / ".join(pct(s["session_recall"][f"at{k}"]) for k in SESSION_RECALL_KS) + " | – | – | – |")
    lines.append("| prompt tokens, median / max | " + " | ".join(
        f"{s[n]['tokens_median']:.0f} / {s[n]['tokens_max']}" for n in CONTEXTS) + " |")
    lines.append("| prompts over the budget | " + " | ".join(
        str(s[n].get("over_budget", "– (reference)")) for n in CONTEXTS) + " |")
    lines += ["", "How evidence turns reached the prompt: " + "; ".join(
        f"{CONTEXT_NAMES[n]}: " + ", ".join(f"{k} {v}" for k, v in sorted(s[n]["how"].items())) for n in CONTEXTS), ""]
    lines += ["| conversation | turns | questions | this project | recall off | sliding | folds applied / "
              "failed / skipped / stale / grew | refinements applied / failed / skipped / stale | replay s | "
              "max turn prompt |", "|---|---|---|---|---|---|---|---|---|---|"]
    for c in results["conversations"]:
        lines.append(f"| {c['sample_id']} | {c['turns']} | {c['questions']} | {pct(c['reached']['product'])} | "
                     f"{pct(c['reached']['record'])} | {pct(c['reached']['sliding'])} | "
                     f"{c['compactions'].get('applied', 0)} / {c['compactions'].get('failed', 0)} / "
                     f"{c['compactions'].get('skipped', 0)} / {c['compactions'].get('stale', 0)} / "
                     f"{c['compactions'].get('grew', 0)} | "
                     + " / ".join(str(c.get("refinements", {}).get(k, 0)) for k in ("applied", "failed", "skipped",
                                                                                    "stale"))
                     + f" | {c['seconds']} | {c['turn_prompt_max']} |")
    checks = results["checks"]
    lines += ["", f"Budget: {checks['turn_prompts_over']} replay-turn prompts and "
              f"{checks['question_prompts_over']} question prompts over {results['budget']} tokens; "
              f"{checks['compaction_requests_over']} compaction requests over the window "
              f"({checks['compaction_requests']} checked).", ""]
    if results.get("answered"):
        a = results["answered"]
        lines += [f"Answered ({a['sample']} questions, seed {a['seed']}, token F1 as LoCoMo scores it, "
                  f"{a['seconds']} s): " + ", ".join(f"{CONTEXT_NAMES[n]} {a['f1'][n] if a['f1'][n] is not None else '–'}"
                                                    f" (asked {a['asked'][n]})" for n in CONTEXTS), ""]
    if results.get("target"):
        t = results["target"]
        lines += [f"Target: evidence ≥ {pct(t['min_evidence'])} and ≥ {t['min_ratio']}× the sliding window: "
                  + ("met" if t["met"] else "NOT met: " + "; ".join(t["problems"])), ""]
    lines += ["![LoCoMo evidence in prompt](locomo.png)", ""]
    text = "\n".join(lines)
    (out / "locomo.md").write_text(text)
    return text


# ============================================================================================ main


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data",
                        help="folder with locomo10.json (default ../shared/data)")
    parser.add_argument("--conversations", type=int, default=10, help="the first K conversations (default 10)")
    parser.add_argument("--fake", action="store_true", help="fake compaction model (CI)")
    parser.add_argument("--target", action="store_true", help="exit 1 below --min-evidence / --min-ratio")
    parser.add_argument("--min-evidence", type=float, default=0.50, help="target evidence-in-prompt (default 0.50)")
    parser.add_argument("--min-ratio", type=float, default=3.0, help="target ratio to the sliding window (default 3)")
    parser.add_argument("--answered", type=int, default=0, metavar="N",
                        help="also ask N sampled questions of the chat model and score token F1 (needs a model)")
    parser.add_argument("--seed", type=int, default=21, help="seed of the --answered sample (default 21)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "fidelity",
                        help="where locomo.md, locomo.json and locomo.png go (default docs/fidelity)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    command = "python -m bench.locomo_qa " + " ".join(argv if argv is not None else sys.argv[1:])
    path = args.data / LOCOMO_FILE
    if not path.is_file():
        print(f"locomo: no {LOCOMO_FILE} in {args.data} (use --data)", file=sys.stderr)
        return 2
    records = json.loads(path.read_text(encoding="utf-8"))[: max(args.conversations, 1)]
    args.out.mkdir(parents=True, exist_ok=True)
    logs = ROOT / "test-output" / "locomo"
    logs.mkdir(parents=True, exist_ok=True)
    bench = Bench(fake=args.fake, log_dir=logs)
    try:
        bench.start()
    except Exception as exc:
        print(f"locomo: the system could not be started: {exc}", file=sys.stderr)
        bench.stop()
        return 2
    try:
        services_on = bench.services()
        services_off = bench.services(MEMORY_RECALL_SHARE="0")
        settings = services_on.settings
        say(f"locomo: {len(records)} conversations, compaction by {bench.model_desc}")
        runs, threads, transcripts, kept_all = [], {}, {}, {}
        for record in records:
            thread_id, turns, dia_turn, dia_text, transcript, run = replay(bench, services_on, record)
            kept = measure(services_on, services_off, thread_id, record, turns, dia_turn, dia_text, transcript, run,
                           keep_prompts=bool(args.answered))
            threads[run.sample_id], transcripts[run.sample_id] = thread_id, transcript
            kept_all.update(kept)
            part = summarize(run.rows)
            say(f"locomo: {run.sample_id}: {run.turns} turns in {run.seconds} s, {run.questions} questions; evidence "
                f"in prompt: project {pct(part['product']['reached'])}, recall off {pct(part['record']['reached'])}, "
                f"sliding {pct(part['sliding']['reached'])}; session recall "
                + ", ".join(f"@{k} {pct(part['session_recall'][f'at{k}'])}" for k in SESSION_RECALL_KS))
            runs.append(run)
        rows = [r for run in runs for r in run.rows]
        summary = summarize(rows)
        requests = bench.fake_model.compaction_requests if bench.fake_model else []
        checks = {"turn_prompts_over": sum(r.turn_prompts_over for r in runs),
                  "question_prompts_over": sum(summary[n]["over_budget"] for n in ("product", "record", "sliding")),
                  "compaction_requests": len(requests),
                  "compaction_requests_over": sum(services_on.counter.prompt(b["messages"]) > settings.prompt_budget
                                                  for b in requests)}
        results = {
            "command": command, "model": bench.model_desc, "budget": settings.prompt_budget,
            "context_tokens": settings.model_context_tokens, "reserved_output_tokens": settings.reserved_output_tokens,
            "recent_turns": settings.limits.recent_turns,
            "recall_share": os.environ.get("MEMORY_RECALL_SHARE", "default"),
            "without_evidence": sum(r.without_evidence for r in runs), "dropped_ids": sum(r.dropped_ids for r in runs),
            "summary": summary,
            "ratios_to_sliding": {n: ratio(summary[n]["reached"], summary["sliding"]["reached"])
                                  for n in ("product", "record", "full")},
            "checks": checks,
            "conversations": [{"sample_id": r.sample_id, "turns": r.turns, "questions": r.questions,
                               "seconds": r.seconds, "compactions": dict(r.compactions),
                               "refinements": dict(r.refinements),
                               "turn_prompt_max": r.turn_prompt_max, "full_tokens": r.full_tokens,
                               "reached": {n: rate(x["reached"][n] for x in r.rows) for n in CONTEXTS},
                               "session_recall": summarize(r.rows)["session_recall"]}
                              for r in runs],
            "load_average": [round(x, 2) for x in os.getloadavg()],
        }
        if args.answered:
            items = sorted(kept_all)
            chosen = random.Random(args.seed).sample(items, min(args.answered, len(items)))
            sample = [(kept_all[key][0], answered_prompts(services_on, services_off, transcripts, threads,
                                                          kept_all[key][0], key[0])) for key in chosen]
            say(f"locomo: answering {len(sample)} questions with {settings.chat_model} ...")
            results["answered"] = {"sample": len(sample), "seed": args.seed, **ask_all(settings, sample)}
        problems = []
        if args.target:
            value, base = summary["product"]["reached"] or 0, summary["sliding"]["reached"] or 0
            if value < args.min_evidence:
                problems.append(f"evidence in prompt {pct(value)} < {pct(args.min_evidence)}")
            if value < args.min_ratio * base:
                problems.append(f"{fmt_ratio(ratio(value, base))} the sliding window < {args.min_ratio}×")
            if checks["turn_prompts_over"] or checks["question_prompts_over"] or checks["compaction_requests_over"]:
                problems.append("prompts over the budget")
            results["target"] = {"min_evidence": args.min_evidence, "min_ratio": args.min_ratio,
                                 "met": not problems, "problems": problems}
        (args.out / "locomo.json").write_text(json.dumps(results, indent=2, ensure_ascii=False))
        write_plot(summary, args.out / "locomo.png",
                   f"LoCoMo QA, {len(runs)} conversations, {summary['questions']} questions; {bench.model_desc}")
        say(write_report(args.out, results))
        for problem in problems:
            print(f"locomo: {problem}", file=sys.stderr)
        return 1 if problems else 0
    finally:
        bench.stop()


if __name__ == "__main__":
    sys.exit(main())
