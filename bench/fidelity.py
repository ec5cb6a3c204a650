"""Memory fidelity with a real model: do planted facts survive compaction, and can the model answer them?

A planted-fact probe through the real system (web, Celery worker, store, the
websocket, ``bench/replay.py``'s ``System`` and ``Replayer``):

1. **Plant** 40 facts, half English and half Chinese, in the first 12 turns:
   identifiers, dates, numbers with units, person names, places, decisions and
   preferences (``FACTS``).
2. **Bury** them under filler turns taken from the real conversations in
   ``--data`` (LoCoMo utterances in English, KdConv utterances in Chinese, read at
   run time), then wait until compaction is idle.
3. For each fact, measure on the memory the next turn would use:

   * **retained**: one of the fact's accepted spellings is in what the next prompt
     would contain (``assemble_context`` on the stored ThreadState: the record, the
     person's pins, the recent turns), matched deterministically;
   * **answered**: the chat model, asked the fact's question with exactly that context
     (a direct call, nothing committed to memory), answers with an accepted spelling.

In the same run, with the same model, transcript and prompt budget, two baselines:

* **sliding window**: the newest whole turns of the transcript that fit the same
  number of prompt tokens as this project's memory used (no summary);
* **rolling summary**: LangChain's ``SummarizationMiddleware`` (its own code and its
  default prompt, run in-process against the same compaction endpoint), fed the
  transcript turn by turn, summarizing at the same cadence as this project and keeping
  the same 4 recent turns;

and, for reference, **full history** (every turn verbatim) while it still fits the window.

``--fake`` uses a paraphrasing fake model (``FidelityFake``: its gists and summaries
drop names, dates and ids; its decisions carry no value) instead of a real one: a
fast regression check of the fact guard that ``.ci/run`` runs.  It measures retained
only (a fake cannot answer), and exits 1 when this project's retention of the planted facts
misses 95 % in either language (``LANGUAGE_TARGET``, docs/benchmarks.md: Memory fidelity), when a compaction
made memory bigger, or when a compaction request passed the window.  Retention is measured in
the prompt each fact's question would get (the record, the recent turns and what recall brings
back for that question).  The per-group shares (``TARGETS``: ids, dates and numbers 95 %,
names and places 85 %, decisions and preferences 75 %) are printed beside it as warnings.

Usage::

    python -m bench.fidelity --fake                       # CI: fake model, retained only
    python -m bench.fidelity                              # the bundled model (both servers)
    OPENAI_BASE_URL=... OPENAI_API_KEY=... CHAT_MODEL=... python -m bench.fidelity

Output (``--out``, default ``test-output/fidelity``): ``report.md``, ``results.json``
(numbers only) and ``fidelity.png``.  Units: tokens (cl100k_base, the app's counter),
seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import threading
import time
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, cast

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionMessageParam

ROOT = Path(__file__).resolve().parent.parent

from bench.replay import Conversation, Replayer, System, SystemError_, _clip, load_kdconv, load_locomo, say  # noqa: E402

KINDS = ("id", "date", "number", "name", "place", "decision", "preference")
GROUPS = {"ids, dates, numbers": ("id", "date", "number"), "names, places": ("name", "place"),
          "decisions, preferences": ("decision", "preference")}
TARGETS = {"ids, dates, numbers": 0.95, "names, places": 0.85, "decisions, preferences": 0.75}
LANGUAGE_TARGET = 0.95
METHODS = ("memory", "sliding", "rolling", "full")
METHOD_NAMES = {"memory": "this project's memory", "sliding": "sliding window", "rolling": "rolling summary (LangChain)",
                "full": "full history (reference)"}


@dataclass(frozen=True)
class Fact:
    """One planted fact: where it is planted, how it may be spelled, and the question that probes it."""

    id: str
    lang: str          # "en" or "zh"
    kind: str          # one of KINDS
    turn: int          # index into PLANTS
    accept: tuple[str, ...]
    question: str


PLANTS = [
    ("en", "Hi, I'm Lin Wei. I work at Northwind Logistics in Rotterdam, and my manager is Priya Raman."),
    ("zh", "我们决定把数据库迁移推迟到4月2日，负责人是王芳。我的同事陈静负责测试。"),
    ("en", "We have an incident: ticket INC-4471. The outage started on 14 March 2025 at 09:20 UTC, and "
           "Marta Kowalski is on call."),
    ("zh", "工单号是INC-5820，系统在2025年3月14日上线，项目经理是刘洋。"),
    ("en", "Some facts about our setup: we run 3 replicas, the data center is in Frankfurt, and the server "
           "rack weighs 68 kg."),
    ("zh", "我们的办公室在杭州西湖区。下周三我要去深圳出差，客户来自成都。"),
    ("en", "We decided to use PostgreSQL 16 instead of MySQL, and we ruled out Kubernetes for now. The "
           "migration budget is 9000 euros."),
    ("zh", "项目预算是两万元，集群需要3个副本，服务器内存64GB，延迟要低于20毫秒。"),
    ("en", "We decided to ship the release on Friday. The feature flag is billing_v2, the order for the new "
           "servers is QV-58213, and the contract renewal is due on 2025-06-30."),
    ("zh", "订单号是QV-77310。我们决定不做移动端，先做网页版。每天早上9点开站会。"),
    ("en", "About me: I prefer answers in bullet points, my favourite editor is Neovim, and I'm flying to "
           "Lisbon next week."),
    ("zh", "我喜欢简洁的回答，我更喜欢用微信联系。"),
]

FACTS = [
    Fact("en-name-lin", "en", "name", 0, ("Lin Wei",), "What is my name?"),
    Fact("en-place-rotterdam", "en", "place", 0, ("Rotterdam",), "In which city do I work?"),
    Fact("en-name-priya", "en", "name", 0, ("Priya Raman", "Priya"), "Who is my manager?"),
    Fact("en-id-inc", "en", "id", 2, ("INC-4471",), "What is the incident ticket number?"),
    Fact("en-date-outage", "en", "date", 2, ("14 March 2025", "March 14, 2025", "2025-03-14", "14th March 2025",
                                             "March 14th, 2025", "March 14 2025"), "On what date did the outage start?"),
    Fact("en-date-time", "en", "date", 2, ("09:20", "9:20"), "At what time did the outage start?"),
    Fact("en-name-marta", "en", "name", 2, ("Marta Kowalski", "Marta"), "Who is on call for the incident?"),
    Fact("en-number-replicas", "en", "number", 4, ("3 replicas", "three replicas", "3"),
         "How many replicas do we run?"),
    Fact("en-place-frankfurt", "en", "place", 4, ("Frankfurt",), "Where is the data center?"),
    Fact("en-number-rack", "en", "number", 4, ("68 kg", "68kg", "68 kilograms", "68"), "How much does the server rack weigh?"),
    Fact("en-decision-postgres", "en", "decision", 6, ("PostgreSQL", "Postgres"), "Which database did we decide to use?"),
    Fact("en-decision-kubernetes", "en", "decision", 6, ("Kubernetes",), "Which tool did we rule out for now?"),
    Fact("en-number-budget", "en", "number", 6, ("9000 euros", "9,000 euros", "€9000", "€9,000", "9000 EUR", "9000"),
         "What is the migration budget?"),
    Fact("en-decision-friday", "en", "decision", 8, ("Friday",), "On which day did we decide to ship the release?"),
    Fact("en-id-flag", "en", "id", 8, ("billing_v2",), "What is the name of the feature flag?"),
    Fact("en-id-order", "en", "id", 8, ("QV-58213",), "What is the order number for the new servers?"),
    Fact("en-date-renewal", "en", "date", 8, ("2025-06-30", "30 June 2025", "June 30, 2025", "June 30th, 2025"),
         "When is the contract renewal due?"),
    Fact("en-preference-bullets", "en", "preference", 10, ("bullet points", "bullet"), "How do I like answers to be formatted?"),
    Fact("en-preference-editor", "en", "preference", 10, ("Neovim",), "What is my favourite editor?"),
    Fact("en-place-lisbon", "en", "place", 10, ("Lisbon",), "Where am I flying next week?"),
    Fact("zh-date-migration", "zh", "date", 1, ("4月2日", "4月2号", "四月二日", "四月二号"), "数据库迁移推迟到哪一天？"),
    Fact("zh-name-wangfang", "zh", "name", 1, ("王芳",), "数据库迁移的负责人是谁？"),
    Fact("zh-decision-postpone", "zh", "decision", 1, ("推迟",), "我们对数据库迁移做了什么决定？"),
    Fact("zh-name-chenjing", "zh", "name", 1, ("陈静",), "谁负责测试？"),
    Fact("zh-id-ticket", "zh", "id", 3, ("INC-5820",), "工单号是多少？"),
    Fact("zh-date-launch", "zh", "date", 3, ("2025年3月14日", "3月14日", "3月14号"), "系统是哪天上线的？"),
    Fact("zh-name-liuyang", "zh", "name", 3, ("刘洋",), "项目经理是谁？"),
    Fact("zh-place-hangzhou", "zh", "place", 5, ("杭州",), "我们的办公室在哪个城市？"),
    Fact("zh-place-shenzhen", "zh", "place", 5, ("深圳",), "下周三我要去哪里出差？"),
    Fact("zh-place-chengdu", "zh", "place", 5, ("成都",), "客户来自哪里？"),
    Fact("zh-number-budget", "zh", "number", 7, ("两万元", "2万元", "20000元", "两万", "2万"), "项目预算是多少？"),
    Fact("zh-number-replicas", "zh", "number", 7, ("3个副本", "三个副本", "3个", "三个"), "集群需要几个副本？"),
    Fact("zh-number-memory", "zh", "number", 7, ("64GB", "64 GB", "64G"), "服务器内存多大？"),
    Fact("zh-number-latency", "zh", "number", 7, ("20毫秒", "20ms", "20 毫秒", "20 ms"), "延迟要低于多少？"),
    Fact("zh-id-order", "zh", "id", 9, ("QV-77310",), "订单号是多少？"),
    Fact("zh-decision-web", "zh", "decision", 9, ("网页版", "网页"), "我们决定先做哪个版本？"),
    Fact("zh-date-standup", "zh", "date", 9, ("9点", "九点", "9:00", "09:00"), "每天几点开站会？"),
    Fact("zh-preference-concise", "zh", "preference", 11, ("简洁",), "我喜欢什么样的回答？"),
    Fact("zh-preference-wechat", "zh", "preference", 11, ("微信",), "我更喜欢用什么联系？"),
    Fact("zh-decision-mobile", "zh", "decision", 9, ("不做移动端", "不做移动", "不开发移动端", "移动端"),
         "我们决定不做哪个端？"),
]


# ============================================================================================ data statements

DATA_KIND = "data"
LOCOMO_SOURCE = slice(1, None)      # conversations after the first (the first gives the English filler)
KDCONV_SOURCE_START = 67            # the music and travel dialogues (the first three film ones give the filler)


def _short(value, limit: int = 40) -> bool:
    text = str(value).strip()
    return 2 <= len(text) <= limit


def locomo_statements(records: list[dict], count: int) -> list[tuple[str, str, str]]:
    """``count`` LoCoMo statements that QA evidence points to, as ``(statement, answer, question)``.

    Category 4 (single-hop) items with one evidence id, whose short gold answer (two words or more, or
    holding a digit, so that a common word cannot count as kept by chance) is spelled in the evidence
    utterance and not in the fake model's reply; one per utterance and answer, in dataset order
    (``records`` after the first).
    """
    from bench.locomo_qa import build_turns, parse_evidence

    out: list[tuple[str, str, str]] = []
    for record in records[LOCOMO_SOURCE]:
        _, _, dia_text = build_turns(record)
        used: set[str] = {normalize(a) for _, a, _ in out}
        for item in record.get("qa") or []:
            if len(out) >= count:
                return out
            if item.get("category") != 4 or not _short(item.get("answer", "")):
                continue
            evidence, dropped = parse_evidence(item.get("evidence"), dia_text)
            if len(evidence) != 1 or dropped or evidence[0] in used:
                continue
            text, answer = dia_text[evidence[0]], str(item["answer"]).strip()
            if len(answer.split()) < 2 and not any(ch.isdigit() for ch in answer):
                continue
            if len(text) > 400 or not spelled((answer,), text) or spelled((answer,), FidelityFake.REPLY) \
                    or normalize(answer) in used:
                continue
            used.update((evidence[0], normalize(answer)))
            out.append((text, answer, str(item["question"])))
    return out


def kdconv_statements(records: list[dict], count: int) -> list[tuple[str, str, str]]:
    """``count`` KdConv turns that their dialogue knowledge points to, as ``(statement, value, question)``.

    The first speaker's turns (even index) with a triple whose value (not ``Information``, 2-12
    characters) is spelled in the turn; the question asks for that relation of the head entity.  One per
    dialogue, from ``KDCONV_SOURCE_START`` on.
    """
    out: list[tuple[str, str, str]] = []
    for record in records[KDCONV_SOURCE_START:]:
        if len(out) >= count:
            break
        found = None
        for index, message in enumerate(record.get("messages") or []):
            text = " ".join(str(message.get("message") or "").split())
            if index % 2 or len(text) > 200:
                continue
            for attr in message.get("attrs") or []:
                value = str(attr.get("attrvalue") or "").strip()
                if attr.get("attrname") != "Information" and 2 <= len(value) <= 12 and value in text:
                    found = (text, value, f"{attr.get('name')}的{attr.get('attrname')}是什么？")
                    break
            if found:
                break
        if found:
            out.append(found)
    return out


def data_facts(data: Path, per_language: int, first_turn: int) -> tuple[list[str], list["Fact"]]:
    """Statements from the data (LoCoMo and KdConv) as planted turns and facts of kind ``data``.

    Returns ``(turn texts, facts)``; fact ``turn`` indices start at ``first_turn``.
    """
    import json as _json

    if per_language <= 0:
        return [], []
    locomo = _json.loads((data / "locomo10.json").read_text(encoding="utf-8"))
    kdconv = _json.loads((data / "kdconv-sample.json").read_text(encoding="utf-8"))
    english, chinese = locomo_statements(locomo, per_language), kdconv_statements(kdconv, per_language)
    turns: list[str] = []
    facts: list[Fact] = []
    for lang, items in (("en", english), ("zh", chinese)):
        for i, (text, answer, question) in enumerate(items):
            facts.append(Fact(f"{lang}-data-{i + 1}", lang, DATA_KIND, first_turn + len(turns), (answer,), question))
            turns.append(text)
    return turns, facts


# ============================================================================================ matching


def normalize(text: str) -> str:
    """Compare form: NFKC, case-folded, spaces collapsed."""
    return re.sub(r"\s+", " ", unicodedata.normalize("NFKC", text).casefold())


def spelled(accept: tuple[str, ...], text: str) -> bool:
    """True when one accepted spelling occurs in ``text`` (not inside a longer Latin word or number)."""
    haystack = normalize(text)
    for spelling in accept:
        needle = normalize(spelling)
        start = r"(?<![a-z0-9])" if needle[:1].isascii() and needle[:1].isalnum() else ""
        end = r"(?![a-z0-9])" if needle[-1:].isascii() and needle[-1:].isalnum() else ""
        if re.search(start + re.escape(needle) + end, haystack):
            return True
    return False


# ============================================================================================ the fake


class FidelityFake:
    """A paraphrasing fake model for ``--fake``: it keeps the gist and drops every concrete fact.

    * chat (streamed or not): a fixed polite reply of about 60 words without any fact;
    * compaction (structured): a gist with no name, number, date or identifier, and each
      decision as "a decision was made" (no value; the app must refuse it as a note);
    * LangChain's summarization request (plain chat naming "Messages to summarize"): a
      summary that paraphrases the same way.
    """

    REPLY = ("Thank you for telling me. I will keep that in mind while we talk, and I am happy to help with "
             "whatever comes next, whether it is planning, writing, checking details or simply thinking out "
             "loud together about the options you have and the steps that would make sense from here.")

    def __init__(self):
        self.compaction_requests: list[dict] = []
        self._lock = threading.Lock()

    def __call__(self, body: dict):
        from chat_support.fake_llm import Reply

        rf = body.get("response_format")
        if isinstance(rf, dict) and rf.get("type") in ("json_object", "json_schema"):
            with self._lock:
                self.compaction_requests.append(body)
            return Reply(json={"summary": "The person shared details about their work, an incident and their plans.",
                               "pinnedDecisions": ["A decision was made about it."]})
        text = json.dumps(body.get("messages") or [], ensure_ascii=False)
        if "Messages to summarize" in text:
            return Reply(text="## SESSION INTENT\nThe user is chatting about work.\n## SUMMARY\nThe user described "
                              "their job, an incident, their setup and some plans; small talk followed.")
        return Reply(text=self.REPLY)


# ============================================================================================ the run


def filler_turns(data: Path, count: int) -> list[str]:
    """``count`` filler texts, English and Chinese alternating, from LoCoMo and KdConv (clipped to 200 chars)."""
    english = [t for c in load_locomo(data, 1, user_side="first") for t in c.turns]
    chinese = [t for c in load_kdconv(data, 3, user_side="first") for t in c.turns]
    english = [_clip(t, 200) for t in english if len(t) > 20]
    chinese = [_clip(t, 120) for t in chinese if len(t) > 6]
    out = []
    for i in range(count):
        source = english if i % 2 == 0 else chinese
        out.append(source[(i // 2) % len(source)])
    return out


class TranscriptReplayer(Replayer):
    """``Replayer`` that also keeps each completed turn's texts (for the baselines)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.transcript: list[tuple[str, str]] = []

    def _turn(self, ws, result, state, n, text, user_id):
        turn = super()._turn(ws, result, state, n, text, user_id)
        if turn.status in ("completed", "blocked"):
            self.transcript.append((text, state.answer))
        return turn


@dataclass
class MethodResult:
    """What one memory method kept and answered."""

    method: str
    prompt_tokens: int = 0
    retained: dict = field(default_factory=dict)   # fact id -> bool
    answered: dict = field(default_factory=dict)   # fact id -> bool (empty: not measured)
    answers: dict = field(default_factory=dict)    # fact id -> the answer's first 80 characters (never reported)
    note: str = ""
    model_seconds: float = 0.0
    calls: int = 0


class Asker:
    """Asks the chat model questions with a given context (direct calls, nothing written to memory)."""

    def __init__(self, settings, max_tokens: int = 48):
        from app.llm.provider import make_openai_client

        self.settings = settings
        self.client = make_openai_client(settings, read_timeout=180.0, max_retries=1)
        self.max_tokens = max_tokens
        self.seconds = 0.0
        self.calls = 0

    def ask(self, messages: list[dict]) -> str:
        # role/content dicts, the shape of openai's message TypedDicts (a plain dict is not one to mypy)
        params = cast("list[ChatCompletionMessageParam]", messages)
        started = time.monotonic()
        completion = self.client.chat.completions.create(model=self.settings.chat_model, messages=params,
                                                         temperature=0, max_tokens=self.max_tokens, stream=False)
        self.seconds += time.monotonic() - started
        self.calls += 1
        return (completion.choices[0].message.content or "") if completion.choices else ""


def probe(method: MethodResult, context, asker: Asker | None, facts: list[Fact]) -> None:
    """Fill ``retained`` from the context's text and, with an ``asker``, ``answered`` by asking each question.

    ``context`` is one prompt (a list of messages) for every fact, or a function of the fact giving the prompt its
    question would get (this project's memory: the excerpts recalled depend on the question).
    """
    prompt_for = context if callable(context) else (lambda fact: context)
    prompts = {fact.id: prompt_for(fact) for fact in facts}
    for fact in facts:
        text = "\n".join(m["content"] for m in prompts[fact.id] if isinstance(m.get("content"), str))
        method.retained[fact.id] = spelled(fact.accept, text)
    if asker is None:
        return
    before, calls = asker.seconds, asker.calls
    for fact in facts:
        answer = asker.ask(prompts[fact.id] + [{"role": "user", "content": fact.question}])
        method.answered[fact.id] = spelled(fact.accept, answer)
        method.answers[fact.id] = answer[:80]
    method.model_seconds, method.calls = asker.seconds - before, asker.calls - calls


def memory_context(store, thread_id: str, settings, counter, question: str = "") -> list[dict]:
    """What the prompt of a turn sending ``question`` would be, without that input: exactly what the chat turn
    assembles (``app.chat.turn``): the thread and its archive of folded turns, excerpts recalled for the
    question inside ``MEMORY_RECALL_SHARE`` (``assemble_context``)."""
    from app.memory.context import assemble_context
    from app.store.archive import load_turn_memory

    state, archive = load_turn_memory(store, thread_id)
    ctx = assemble_context(state, question or "?", system_prompt=settings.system_prompt, counter=counter,
                           context_tokens=settings.model_context_tokens,
                           reserved_output_tokens=settings.reserved_output_tokens,
                           archive=archive, recall_share=settings.limits.recall_share)
    return ctx.to_openai()[:-1]


def wait_idle(services, thread_id: str, timeout: float, check_alive, quiet: float = 3.0) -> bool:
    """Wait until no compaction has been pending for ``quiet`` seconds in a row (the marker is gone)."""
    from app.store.keys import ThreadKeys

    marker = ThreadKeys(thread_id).compacting
    deadline = time.monotonic() + timeout
    since = time.monotonic()
    while time.monotonic() < deadline:
        check_alive()
        if services.redis.exists(marker):
            since = time.monotonic()
        elif time.monotonic() - since >= quiet:
            return True
        time.sleep(0.2)
    return False


def sliding_context(transcript: list[tuple[str, str]], system_prompt: str, budget: int, counter) -> list[dict]:
    """The system prompt and the newest whole turns that fit ``budget`` prompt tokens."""
    kept: list[dict] = []
    used = counter.prompt([{"role": "system", "content": system_prompt}])
    for user, answer in reversed(transcript):
        pair = [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
        cost = sum(counter.message(m["role"], m["content"]) for m in pair)
        if used + cost > budget:
            break
        kept[:0] = pair
        used += cost
    return [{"role": "system", "content": system_prompt}] + kept


def rolling_context(transcript: list[tuple[str, str]], settings, counter, *, base_url: str, api_key: str,
                    model: str) -> tuple[list[dict], float, int, str]:
    """LangChain's ``SummarizationMiddleware`` fed the transcript turn by turn; its state as a prompt.

    It summarizes when the messages pass the same count that makes this project's compaction due
    (``2 * (recent_turns + compact_batch_turns)``) and keeps ``2 * recent_turns`` messages.

    Returns:
        (prompt messages, model seconds spent summarizing, summaries made, the LangChain version).
    """
    import langchain
    from langchain.agents.middleware import SummarizationMiddleware
    from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
    from langchain_openai import ChatOpenAI
    from langgraph.runtime import Runtime

    def tokens(messages: Iterable[Any]) -> int:
        return sum(counter.count(str(m.content if isinstance(m, BaseMessage) else m)) for m in messages)

    limits = settings.limits
    model_client = ChatOpenAI(base_url=base_url, api_key=api_key, model=model, temperature=0, max_retries=1,
                              timeout=300, max_tokens=settings.reserved_output_tokens)
    middleware = SummarizationMiddleware(
        model_client, trigger=("messages", 2 * (limits.recent_turns + limits.compact_batch_turns)),
        keep=("messages", 2 * limits.recent_turns),
        token_counter=tokens)
    runtime = Runtime()  # no agent graph around it: before_model does not read its runtime
    messages: list = []
    seconds, summaries = 0.0, 0
    for user, answer in transcript:
        messages += [HumanMessage(user), AIMessage(answer)]
        started = time.monotonic()
        update = middleware.before_model({"messages": messages}, runtime)
        if update is not None:
            seconds += time.monotonic() - started
            summaries += 1
            messages = [m for m in update["messages"] if type(m).__name__ != "RemoveMessage"]
    prompt = [{"role": "system", "content": settings.system_prompt}]
    for m in messages:
        prompt.append({"role": "assistant" if isinstance(m, AIMessage) else "user", "content": str(m.content)})
    return prompt, seconds, summaries, langchain.__version__


# ============================================================================================ report


def rate(values: list[bool]) -> float | None:
    return round(sum(values) / len(values), 4) if values else None


def breakdown(result: MethodResult, facts: list[Fact], which: str) -> dict:
    """Shares by kind, by group and by language for ``which`` (``retained`` or ``answered``)."""
    values = getattr(result, which)
    if not values:
        return {}
    planted = [f for f in facts if f.kind != DATA_KIND]
    data = [f for f in facts if f.kind == DATA_KIND]
    out: dict = {"all": rate([values[f.id] for f in planted])}
    for lang in ("en", "zh"):
        out[lang] = rate([values[f.id] for f in planted if f.lang == lang])
        for group, kinds in GROUPS.items():
            out[f"{lang} {group}"] = rate([values[f.id] for f in planted if f.lang == lang and f.kind in kinds])
    for kind in KINDS:
        out[kind] = rate([values[f.id] for f in planted if f.kind == kind])
    out[DATA_KIND] = rate([values[f.id] for f in data])
    for lang in ("en", "zh"):
        out[f"{DATA_KIND} {lang}"] = rate([values[f.id] for f in data if f.lang == lang])
    return out


def pct(value) -> str:
    return "–" if value is None else f"{100 * value:.0f} %"


def write_plot(methods: dict[str, MethodResult], facts: list[Fact], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{lang} {group}" for lang in ("en", "zh") for group in GROUPS]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8), sharey=True)
    for ax, which in zip(axes, ("retained", "answered"), strict=False):
        width = 0.8 / len(methods)
        for i, (name, result) in enumerate(methods.items()):
            shares = breakdown(result, facts, which)
            values = [100 * (shares.get(label) or 0) for label in labels] if shares else [0] * len(labels)
            ax.bar([x + i * width for x in range(len(labels))], values, width, label=METHOD_NAMES[name])
        ax.set_xticks([x + 0.4 - width / 2 for x in range(len(labels))])
        ax.set_xticklabels([label.replace(", ", ",\n") for label in labels], fontsize=7)
        ax.set_title(which)
        ax.set_ylim(0, 105)
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("% of planted facts")
    handles, names = axes[0].get_legend_handles_labels()
    fig.legend(handles, names, fontsize=8, loc="lower center", ncol=len(methods), frameon=False)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(out: Path, results: dict, methods: dict[str, MethodResult], facts: list[Fact]) -> None:
    planted = [f for f in facts if f.kind != DATA_KIND]
    data = [f for f in facts if f.kind == DATA_KIND]
    lines = [f"# Memory fidelity ({results['model']})", "", f"Command: `{results['command']}`", "",
             f"{len(planted)} planted facts ({sum(f.lang == 'en' for f in planted)} English, "
             f"{sum(f.lang == 'zh' for f in planted)} Chinese) in {len(PLANTS)} turns, and {len(data)} statements "
             f"from the data ({sum(f.lang == 'en' for f in data)} LoCoMo turns that QA evidence points to, "
             f"{sum(f.lang == 'zh' for f in data)} KdConv turns that their dialogue knowledge points to; rows "
             f"`data`, not in `all`), then "
             f"{results['filler_turns']} filler turns from LoCoMo and KdConv. Context window "
             f"{results['context_tokens']} tokens, {results['reserved_output_tokens']} reserved for the answer "
             f"(prompt budget {results['budget']}); recent window {results['recent_turns']} turns; compaction "
             f"batch {results['batch_turns']} turns. Load average at the end: {results['load_average']}.", ""]
    header = "| | " + " | ".join(METHOD_NAMES[m] for m in methods) + " |"
    lines += [header, "|" + "---|" * (len(methods) + 1)]
    lines.append("| prompt tokens (memory part) | " + " | ".join(str(methods[m].prompt_tokens) for m in methods) + " |")
    for which in ("retained", "answered"):
        shares = {m: breakdown(methods[m], facts, which) for m in methods}
        if not any(shares.values()):
            lines.append(f"| {which} | " + " | ".join("not measured (fake model)" for _ in methods) + " |")
            continue
        for key in ["all", "en", "zh", *[f"{lang} {group}" for lang in ("en", "zh") for group in GROUPS],
                    DATA_KIND, f"{DATA_KIND} en", f"{DATA_KIND} zh"]:
            lines.append(f"| {which}: {key} | " + " | ".join(pct(shares[m].get(key)) if shares[m] else "not measured"
                                                          for m in methods) + " |")
    lines += ["", "Per kind (retained / answered):", "", "| kind | " + " | ".join(METHOD_NAMES[m] for m in methods)
              + " |", "|" + "---|" * (len(methods) + 1)]
    for kind in (*KINDS, DATA_KIND):
        cells = []
        for m in methods:
            r, a = breakdown(methods[m], facts, "retained"), breakdown(methods[m], facts, "answered")
            cells.append(f"{pct(r.get(kind))} / {pct(a.get(kind)) if a else '–'}")
        lines.append(f"| {kind} | " + " | ".join(cells) + " |")
    c = results["compactions"]
    lines += ["", f"Compactions: {c['applied']} applied ({c['llm']} with the model's gist, {c['extractive']} "
              f"without), {c['failed']} failed, {c['stale']} stale; {c['grew']} made memory bigger; "
              f"{c['over_window']} compaction requests over the window. Model seconds per compaction: median "
              f"{c['seconds_median']}, total {c['seconds_total']}. Tokens before → after (median): "
              f"{c['tokens_before_median']} → {c['tokens_after_median']}.",
              f"Chat turns: {results['turns']['completed']} completed, median {results['turns']['seconds_median']} s "
              f"each. Rolling summary: {results['rolling']['summaries']} summaries, "
              f"{results['rolling']['seconds']} model seconds (LangChain {results['rolling']['langchain']}).",
              f"Probe questions: {results['probe']['calls']} calls, {results['probe']['seconds']} model seconds.",
              "", "Notes: " + "; ".join(n for n in (methods[m].note for m in methods) if n), "",
              "![fidelity](fidelity.png)", ""]
    (out / "report.md").write_text("\n".join(lines))


# ============================================================================================ main


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data",
                        help="folder with locomo10.json and kdconv-sample.json (default ../shared/data)")
    parser.add_argument("--fake", action="store_true", help="paraphrasing fake model; retained only (CI)")
    parser.add_argument("--filler", type=int, default=12, help="filler turns after the planted ones (default 12)")
    parser.add_argument("--out", type=Path, default=ROOT / "test-output" / "fidelity")
    parser.add_argument("--turn-timeout", type=float, default=240.0, help="seconds per chat turn")
    parser.add_argument("--settle-timeout", type=float, default=900.0, help="seconds to wait for compaction")
    parser.add_argument("--no-baselines", action="store_true", help="measure this project's memory only")
    parser.add_argument("--data-statements", type=int, default=10, metavar="N",
                        help="also plant N LoCoMo and N KdConv statements from the data (default 10; 0: none)")
    parser.add_argument("--locomo", action="store_true",
                        help="run the LoCoMo QA bench instead (bench/locomo_qa.py; the other options are its own)")
    parser.add_argument("--dump", action="store_true",
                        help="also write contexts.json (every method's context and answers) for inspection; it "
                             "holds dataset text, so never commit it")
    return parser


def main(argv: list[str] | None = None) -> int:
    raw = list(sys.argv[1:] if argv is None else argv)
    if "--locomo" in raw:
        from bench import locomo_qa

        return locomo_qa.main([a for a in raw if a != "--locomo"])
    args = build_parser().parse_args(argv)
    command = "python -m bench.fidelity " + " ".join(argv if argv is not None else sys.argv[1:])
    if not (args.data / "locomo10.json").is_file() or not (args.data / "kdconv-sample.json").is_file():
        print(f"fidelity: no conversation data in {args.data} (use --data)", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    extra_turns, extra_facts = data_facts(args.data, args.data_statements, len(PLANTS))
    facts = FACTS + extra_facts
    fillers = filler_turns(args.data, args.filler)
    turns = [text for _, text in PLANTS] + extra_turns + fillers

    system = System(None, fake=False, log_dir=args.out)
    fake = None
    if args.fake:
        from chat_support.fake_llm import FakeLLM

        fake = FidelityFake()
        llm = FakeLLM(default=fake).start()
        system._stops.append(llm.stop)
        os.environ.update(OPENAI_BASE_URL=llm.url, OPENAI_API_KEY="fake", CHAT_MODEL="fake-chat",
                          COMPACTION_MODEL="fake-compact")
        os.environ.pop("COMPACTION_BASE_URL", None)
    try:
        system.start()
    except SystemError_ as exc:
        print(f"fidelity: {exc}", file=sys.stderr)
        system.stop()
        return 2
    try:
        settings = system.settings()
        from app.extensions import Services

        services = Services(settings)
        counter = services.counter
        model_desc = "fake paraphrasing model" if args.fake else system.model_desc
        say(f"fidelity: {len(turns)} turns ({len(PLANTS)} planting, {len(extra_turns)} from the data, "
            f"{len(fillers)} filler) with {model_desc}")
        replayer = TranscriptReplayer(system.url, turn_timeout=args.turn_timeout, settle_timeout=args.settle_timeout,
                                      system_prompt=settings.system_prompt, check_alive=system.check_alive,
                                      progress_every=4)
        conversation = Conversation("fidelity", "planted-facts", "", turns, len(turns))
        started = time.monotonic()
        result = replayer.run(conversation)
        if result.error:
            print(f"fidelity: the conversation failed: {result.error}", file=sys.stderr)
            return 2
        say(f"fidelity: conversation done in {time.monotonic() - started:.0f} s; waiting for compaction to be idle")
        if not wait_idle(services, result.thread_id, args.settle_timeout, system.check_alive):
            print("fidelity: compaction still busy; measuring memory as it is", file=sys.stderr)
        say(f"fidelity: idle after {time.monotonic() - started:.0f} s; probing")

        asker = None if args.fake else Asker(settings)
        methods: dict[str, MethodResult] = {}
        contexts: dict[str, list[dict]] = {}
        mine = MethodResult("memory")
        per_fact = {f.id: memory_context(services.store, result.thread_id, settings, counter, f.question)
                    for f in facts}
        context = max(per_fact.values(), key=counter.prompt)  # the longest: the baselines get as many tokens
        mine.prompt_tokens = counter.prompt(context)
        contexts["memory"] = context
        probe(mine, lambda fact: per_fact[fact.id], asker, facts)
        methods["memory"] = mine
        say(f"fidelity: memory retained {pct(rate(list(mine.retained.values())))}"
            + (f", answered {pct(rate(list(mine.answered.values())))}" if mine.answered else ""))

        transcript = replayer.transcript
        rolling_info = {"summaries": 0, "seconds": 0.0, "langchain": "-"}
        if not args.no_baselines:
            sliding = MethodResult("sliding")
            window = sliding_context(transcript, settings.system_prompt, mine.prompt_tokens, counter)
            sliding.prompt_tokens = counter.prompt(window)
            contexts["sliding"] = window
            probe(sliding, window, asker, facts)
            methods["sliding"] = sliding

            rolling = MethodResult("rolling")
            base_url = getattr(settings, "compaction_base_url", None) or settings.openai_base_url
            prompt, seconds, summaries, version = rolling_context(
                transcript, settings, counter, base_url=base_url, api_key=settings.openai_api_key or "local",
                model=settings.compaction_model)
            rolling.prompt_tokens = counter.prompt(prompt)
            contexts["rolling"] = prompt
            rolling.note = f"rolling summary: LangChain {version} SummarizationMiddleware, default prompt"
            probe(rolling, prompt, asker, facts)
            methods["rolling"] = rolling
            rolling_info = {"summaries": summaries, "seconds": round(seconds, 1), "langchain": version}

            full = MethodResult("full")
            everything = [{"role": "system", "content": settings.system_prompt}]
            for user, answer in transcript:
                everything += [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
            full.prompt_tokens = counter.prompt(everything)
            if full.prompt_tokens <= settings.prompt_budget:
                probe(full, everything, asker, facts)
            else:
                full.note = f"full history: {full.prompt_tokens} tokens do not fit the {settings.prompt_budget} budget"
                probe(full, everything, None, facts)
            methods["full"] = full

        from app.observability.accounting import load_compactions

        entries = load_compactions(services, result.thread_id)
        applied = [e for e in entries if e.get("outcome") == "applied"]
        over_window = 0
        if fake is not None:
            over_window = sum(1 for body in fake.compaction_requests
                              if counter.prompt([m for m in body["messages"]]) > settings.prompt_budget)
        durations = [e.get("durationMs", 0) / 1000 for e in applied]
        compactions = {
            "applied": len(applied), "llm": sum(e.get("reason") == "llm" for e in applied),
            "extractive": sum(e.get("reason") == "extractive" for e in applied),
            "failed": sum(e.get("outcome") == "failed" for e in entries),
            "stale": sum(e.get("outcome") == "stale" for e in entries),
            # a fold's entry has tokens before and after; a refinement (the model's gist for folded turns) has none
            "grew": sum(1 for e in applied if e.get("step") != "refine"
                        and e.get("tokensAfter", 0) >= e.get("tokensBefore", 0)),
            "over_window": over_window,
            "seconds_median": round(statistics.median(durations), 1) if durations else None,
            "seconds_total": round(sum(durations), 1),
            "tokens_before_median": statistics.median([e.get("tokensBefore", 0) for e in applied]) if applied else None,
            "tokens_after_median": statistics.median([e.get("tokensAfter", 0) for e in applied]) if applied else None,
        }
        turn_seconds = [t.seconds for t in result.turns if t.status == "completed"]
        results = {
            "command": command, "model": model_desc, "budget": settings.prompt_budget,
            "context_tokens": settings.model_context_tokens, "recent_turns": settings.limits.recent_turns,
            "reserved_output_tokens": settings.reserved_output_tokens, "turn_timeout": settings.llm_turn_timeout,
            "load_average": [round(x, 2) for x in os.getloadavg()],
            "batch_turns": settings.limits.compact_batch_turns, "filler_turns": len(fillers),
            "facts": len(facts),
            "turns": {"completed": len(turn_seconds),
                      "seconds_median": round(statistics.median(turn_seconds), 1) if turn_seconds else None},
            "compactions": compactions, "rolling": rolling_info,
            "probe": {"calls": asker.calls if asker else 0, "seconds": round(asker.seconds, 1) if asker else 0},
            "methods": {m: {"prompt_tokens": r.prompt_tokens, "retained": breakdown(r, facts, "retained"),
                            "answered": breakdown(r, facts, "answered"), "note": r.note} for m, r in methods.items()},
            "per_fact": {f.id: {m: {"retained": r.retained.get(f.id), "answered": r.answered.get(f.id)}
                                for m, r in methods.items()} for f in facts},
        }
        (args.out / "results.json").write_text(json.dumps(results, indent=2, ensure_ascii=False))
        if args.dump:
            dump = {"contexts": contexts, "answers": {m: r.answers for m, r in methods.items()}}
            (args.out / "contexts.json").write_text(json.dumps(dump, indent=1, ensure_ascii=False))
        write_plot(methods, facts, args.out / "fidelity.png", f"Planted-fact probe, {model_desc}")
        write_report(args.out, results, methods, facts)
        say((args.out / "report.md").read_text())

        problems = []
        shares = breakdown(mine, facts, "retained")
        for lang in ("en", "zh"):
            value = shares.get(lang)
            if value is not None and value < LANGUAGE_TARGET:
                problems.append(f"{lang}: planted facts retained {pct(value)} < {pct(LANGUAGE_TARGET)}")
            for group, target in TARGETS.items():
                value = shares.get(f"{lang} {group}")
                if value is not None and value < target:
                    print(f"fidelity: warning: {lang} {group}: retained {pct(value)} < {pct(target)}", file=sys.stderr)
        if compactions["grew"]:
            grown = [(e.get("step"), e.get("reason"), e.get("tokensBefore"), e.get("tokensAfter")) for e in applied
                     if e.get("step") != "refine" and e.get("tokensAfter", 0) >= e.get("tokensBefore", 0)]
            problems.append(f"{compactions['grew']} compactions made memory bigger: {grown}")
        if over_window:
            problems.append(f"{over_window} compaction requests over the window")
        for problem in problems:
            print(f"fidelity: {problem}", file=sys.stderr)
        return 1 if problems and args.fake else 0
    finally:
        system.stop()


if __name__ == "__main__":
    sys.exit(main())
