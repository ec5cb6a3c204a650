"""``/ws/chat`` turns end to end: the real app served on loopback, real Redis, the fake model over real HTTP.

Covers the frame sequence, what the model receives, commit-once, one turn in flight,
two tabs of one session, and a store that fails at commit time.
"""

from __future__ import annotations

import threading

from app.memory.context import PINS_HEADER, format_summary
from chat_support.fake_llm import Reply, split_tokens, words
from chat_support.live_app import ChatClient, answer_text, frame_kinds
from tests.fixtures.memory_data import text_record
from tests.fixtures.streamed_chat import seed_memory


def texts(client: ChatClient) -> list[tuple[str, str]]:
    """The thread as ``(role, text)`` pairs, read through ``GET /api/chat/thread``."""
    return [(m["role"], m["text"]) for m in client.thread()["messages"]]


def last_user_text(body: dict) -> str:
    return body["messages"][-1]["content"]


def test_full_frame_sequence_and_memory(chat, fake_llm):
    tokens = words(15)
    fake_llm.default = Reply(tokens=tokens, token_delay=0.005)
    frames = chat.turn("  What is the plan?  ", message_id="client-msg-1")

    start, *deltas, done = frames
    assert start["type"] == "start" and start["messageId"].startswith("m_")
    assert frame_kinds(frames) == ["start", "delta", "done"] and all(f["text"] for f in deltas)
    assert "".join(f["text"] for f in deltas) == "".join(tokens)  # every piece, in order, once
    assert done == {"type": "done", "status": "completed", "messageId": start["messageId"], "turn": 1}

    messages = chat.thread()["messages"]
    assert [(m["id"], m["role"], m["text"]) for m in messages] == [
        ("client-msg-1", "user", "What is the plan?"),
        (start["messageId"], "assistant", "".join(tokens)),
    ]
    assert all(set(m) == {"id", "role", "text", "createdAt"} for m in messages)
    assert fake_llm.last_request().messages[-1] == {"role": "user", "content": "What is the plan?"}


def test_consecutive_turns_build_the_thread_without_doubling(chat, fake_llm):
    """B3 through the socket: turn 2's prompt holds turn 1 once, and memory is [U1, A1, U2, A2]."""
    fake_llm.default = lambda body: Reply(text=f"re: {last_user_text(body)}")
    assert chat.turn("one")[-1]["status"] == "completed"
    assert chat.turn("two")[-1]["status"] == "completed"
    assert [(m["role"], m["content"]) for m in fake_llm.last_request().messages[1:]] == [
        ("user", "one"), ("assistant", "re: one"), ("user", "two")]
    assert texts(chat) == [("user", "one"), ("assistant", "re: one"), ("user", "two"), ("assistant", "re: two")]


def test_model_receives_exactly_the_stored_memory(chat, fake_llm, store, app_settings):
    thread_id = chat.thread()["threadId"]
    seeded = seed_memory(store, thread_id, turns=6, fold_turns=2, summary="They are planning a trip to Lisbon.",
                         pins=("Budget is 900 EUR", "Travel by train"))
    answer = "Noted: train, 900 EUR."
    fake_llm.default = Reply(text=answer)

    frames = chat.turn("And the hotel?")
    assert frames[-1]["status"] == "completed"

    sent = fake_llm.last_request().messages
    expected = [
        {"role": "system", "content": app_settings.system_prompt},
        {"role": "system", "content": format_summary(text_record("They are planning a trip to Lisbon."))},
        {"role": "system", "content": PINS_HEADER + "1. Budget is 900 EUR\n2. Travel by train"},
    ]
    for user, assistant in seeded.recent:
        expected += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    expected.append({"role": "user", "content": "And the hotel?"})
    assert sent == expected
    # the folded turns live only in the summary
    assert not any("stored question 1" == m["content"] for m in sent)
    stored = texts(chat)
    assert stored[-2:] == [("user", "And the hotel?"), ("assistant", answer)]
    assert len(stored) == 2 * len(seeded.recent) + 2


def test_repeated_client_message_id_adds_nothing(chat, fake_llm):
    fake_llm.default = Reply(text="First answer.")
    first = chat.turn("hello", message_id="dup-1")
    assert first[-1]["status"] == "completed"
    fake_llm.default = Reply(text="Second answer.")
    second = chat.turn("hello", message_id="dup-1")
    assert second[-1]["type"] == "done"

    messages = chat.thread()["messages"]
    assert [(m["id"], m["text"]) for m in messages] == [("dup-1", "hello"), (first[0]["messageId"], "First answer.")]


def test_second_message_during_a_turn_gets_turn_in_progress(chat, fake_llm):
    tokens = words(20)
    fake_llm.default = Reply(tokens=tokens, token_delay=0.02)
    chat.send({"type": "message", "text": "first"})
    chat.recv_until(lambda f: f["type"] == "delta")
    chat.send({"type": "message", "text": "second"})
    frames = chat.recv_until(lambda f: f["type"] == "done")
    errors = [f for f in frames if f["type"] == "error"]
    assert [e["code"] for e in errors] == ["turn_in_progress"]
    assert frames[-1]["status"] == "completed"
    assert texts(chat) == [("user", "first"), ("assistant", "".join(tokens))]
    assert len(fake_llm.chat_requests()) == 1

    # once done, the connection takes the next turn
    fake_llm.default = Reply(text="ok")
    assert chat.turn("third")[-1]["status"] == "completed"
    assert texts(chat)[-2:] == [("user", "third"), ("assistant", "ok")]


def test_two_tabs_of_one_session_chat_at_once(live_app, fake_llm):
    """Two sockets sharing the cookie, three turns each at the same time: 6 turns stored, each once, in commit order."""
    # answer length depends on the text, so the tabs' turns interleave and finish at different times
    def reply(body):
        text = last_user_text(body)
        n = 4 + 7 * int(text[-1])
        return Reply(tokens=split_tokens(f"answer to {text}:") + words(n), token_delay=0.004)
    fake_llm.default = reply

    tab_a = ChatClient(live_app).connect()
    tab_b = ChatClient(live_app, session=tab_a.http).connect()
    assert tab_a.thread()["threadId"] == tab_b.thread()["threadId"]
    results: dict[str, list] = {"a": [], "b": []}

    def run(name, client, order):
        for i in order:
            text = f"tab {name} turn {i}"
            frames = client.turn(text)
            results[name].append((text, frames))

    threads = [threading.Thread(target=run, args=("a", tab_a, (0, 2, 1))),
               threading.Thread(target=run, args=("b", tab_b, (1, 0, 2)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    try:
        assert not any(t.is_alive() for t in threads)
        sent = {}
        for name in ("a", "b"):
            assert len(results[name]) == 3
            for text, frames in results[name]:
                assert frames[-1]["status"] == "completed", frames[-1]
                sent[text] = (frames[0]["messageId"], answer_text(frames))

        messages = tab_a.thread()["messages"]
        assert len(messages) == 12
        pairs = [(messages[i], messages[i + 1]) for i in range(0, 12, 2)]
        for user, assistant in pairs:  # every turn whole, user then its own answer
            assert user["role"] == "user" and assistant["role"] == "assistant"
            assert (assistant["id"], assistant["text"]) == sent[user["text"]]
        assert sorted(u["text"] for u, _ in pairs) == sorted(sent)  # nothing lost, nothing doubled
        # commit order: each tab's own turns stay in the order it sent them
        stored_order = [u["text"] for u, _ in pairs]
        for name, order in (("a", (0, 2, 1)), ("b", (1, 0, 2))):
            mine = [t for t in stored_order if t.startswith(f"tab {name}")]
            assert mine == [f"tab {name} turn {i}" for i in order]
    finally:
        tab_a.close()
        tab_b.close()


def test_memory_failure_at_commit_still_completes(make_live_app, app_settings, fake_llm, own_redis):
    """The store goes down mid-answer: the person still gets ``done`` completed (``"saved": false``) and every
    piece of the text."""
    server = make_live_app(app_settings.with_overrides(redis_url=own_redis.url, redis_socket_timeout=0.5))
    client = ChatClient(server).connect()
    try:
        tokens = words(30)
        fake_llm.default = Reply(tokens=tokens, token_delay=0.02)
        client.send({"type": "message", "text": "remember this"})
        head = client.recv_until(lambda f: f["type"] == "delta")
        own_redis.stop()  # memory was read; the commit will fail
        rest = client.recv_until(lambda f: f["type"] == "done", timeout=10)
        frames = [f for f in head + rest if f["type"] != "memory"]
        # completed (the whole answer was streamed) but not saved, and the done frame says so
        assert frames[-1] == {"type": "done", "status": "completed", "messageId": frames[0]["messageId"],
                              "saved": False, "reason": "store_unavailable"}
        assert answer_text(frames) == "".join(tokens)
        assert not [f for f in frames if f["type"] == "error"]

        # with the store down, the page still hydrates (empty) and a new turn still gets an answer
        hydration = client.thread()
        assert hydration["messages"] == [] and hydration["restored"] is False
        fake_llm.default = Reply(text="still here")
        again = client.turn("hello?")
        assert again[-1]["status"] == "completed" and answer_text(again) == "still here"
    finally:
        client.close()


def test_sessions_are_isolated_under_concurrency(live_app, fake_llm, n_clients=8):
    """Several sessions at once: each thread holds its own turn only; no prompt carries another's text."""
    fake_llm.default = lambda body: Reply(tokens=split_tokens(f"echo {last_user_text(body)}"), token_delay=0.005)
    clients = [ChatClient(live_app).connect() for _ in range(n_clients)]
    errors: list[BaseException] = []

    def run(i, client):
        try:
            frames = client.turn(f"secret of session {i}")
            assert frames[-1]["status"] == "completed"
        except BaseException as exc:  # pragma: no cover - surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    try:
        assert not errors
        for i, client in enumerate(clients):
            assert texts(client) == [("user", f"secret of session {i}"), ("assistant", f"echo secret of session {i}")]
        for request in fake_llm.chat_requests():
            assert len(request.messages) == 2  # system + this session's input only
    finally:
        for c in clients:
            c.close()


def test_the_tags_that_frame_memory_never_reach_the_person_nor_memory(chat, fake_llm):
    """``app.runtime.chat.TagStrip``: a model that copies ``<recalled>``/``<record>`` from its prompt (the bundled
    0.5B model did) has the tags taken out of what is shown and stored, also when a tag is split over tokens."""
    tokens = ["<rec", "alled>", "turn 3: the code", " is 4817</re", "called>\n", "Your code is 4817. <", "3 <",
              "record", ">"]
    fake_llm.default = Reply(tokens=tokens, token_delay=0.005)
    frames = chat.turn("What was my code?")
    assert frames[-1]["status"] == "completed"
    shown = "".join(f["text"] for f in frames if f["type"] == "delta")
    assert shown == "turn 3: the code is 4817\nYour code is 4817. <3 "
    assert texts(chat)[-1] == ("assistant", shown.rstrip())  # stored trimmed, as every answer


def test_tag_strip_holds_back_only_what_could_still_be_a_tag():
    from app.runtime.chat import TagStrip

    strip = TagStrip()
    assert [strip.feed(p) for p in ("a <", "b", " <reca", "lled", "> c </record", ">")] == \
        ["a ", "<b", " ", "", " c ", ""]
    assert strip.feed("x <rec") == "x " and strip.flush() == "<rec"  # the end of the stream releases it
    assert strip.feed("1 < 2") == "1 < 2" and strip.flush() == ""
    # the mark of an answer shown shortened in the prompt, which the model copied at the end of an answer
    assert [strip.feed(p) for p in ("She won it. [", "…", "]")] == ["She won it. ", "", ""]
    assert strip.feed("[1] [a]") == "[1] [a]" and strip.flush() == ""
