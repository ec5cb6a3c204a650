"""Forget against the Procfile's ``web`` (gunicorn, gevent, production) on a Redis of its own, the fake model
streaming (docs/memory.md: "Forget and provenance"; docs/contract.md: Forget and provenance):

- a forget of 50 turns of a thread at its archive's limit (2,000 turns, about 2 MB, written straight into the store)
  beside another visitor's streaming answer on the same web process: the forget completes in one request and the
  visitor's answer arrives whole and is saved (how long the stream stalls is measured by ``bench.abuse --forget``,
  not asserted here);
- process caches never outlive their thread: after a thread's keys expired, the same browser session's new
  conversation (its first turns served by a second web process) is never recalled the old conversation's archived
  turn by the web process that served the old one.
"""

from __future__ import annotations

import json
import threading
import time

import pytest

from app.store.keys import ThreadKeys
from bench.abuse import seed_archive_at_limit
from chat_support.fake_llm import FakeLLM, Reply
from chat_support.live_app import ChatClient, answer_text
from chat_support.processes import stop_group
from chat_support.servers import free_port
from tests.fixtures.celery_worker import wait_until
from tests.fixtures.deployed_web import Deployed, Visitor

TOKENS = [f" w{i}" for i in range(120)]


@pytest.fixture
def model():
    with FakeLLM(default=Reply(tokens=TOKENS, token_delay=0.02)) as llm:
        yield llm


@pytest.fixture
def web(model, procfile, tmp_path):
    with procfile.deployed_web(model, tmp_path, WEB_CONCURRENCY="1", TURNS_PER_MINUTE_PER_SESSION="0",
                      TURNS_PER_MINUTE_PER_CLIENT="0") as deployed:
        yield deployed


def turn(chat: ChatClient, text: str) -> list[dict]:
    chat.send({"type": "message", "text": text})
    frames = chat.recv_until(lambda f: f["type"] in ("done", "error"), timeout=60)
    assert frames[-1]["type"] == "done" and frames[-1]["status"] == "completed", frames
    return [f for f in frames if f["type"] != "memory"]


def test_a_forget_of_many_turns_at_the_archive_limit_beside_a_streaming_visitor(web):
    owner, visitor = Visitor(web), Visitor(web)
    try:
        tid = owner.thread()["threadId"]
        turn(owner.connect(), "hello, a first turn")
        size = seed_archive_at_limit(web.redis, tid)
        assert size > 1_900_000 and web.redis.zcard(ThreadKeys(tid).archive) == 2000
        chosen = list(range(100, 2000, 38))[:50]

        chat = visitor.connect()
        chat.send({"type": "message", "text": "tell me something long"})
        frames = chat.recv_until(lambda f: f["type"] == "delta", timeout=30)
        outcome: dict = {}

        def forget() -> None:
            outcome["response"] = owner.session.post(web.url + "/api/chat/forget", json={"turns": chosen}, timeout=120,
                                                     headers={"Origin": web.url, "Cookie": owner.cookie})

        runner = threading.Thread(target=forget)
        runner.start()
        seen = []  # the job's status, as the page would poll it while the forget runs
        while runner.is_alive() and not seen:
            status = owner.request("GET", "/api/chat/forget/status").json()
            if status["running"]:
                seen.append(status)
            time.sleep(0.02)
        runner.join(timeout=120)
        forgotten = outcome["response"]
        frames += chat.recv_until(lambda f: f["type"] in ("done", "error"), timeout=60)

        assert seen and seen[0]["turns"] == chosen and seen[0]["startedAt"] > 0
        assert owner.request("GET", "/api/chat/forget/status").json() == {"running": False, "turns": [],
                                                                          "startedAt": None}

        assert forgotten.status_code == 200, forgotten.text
        assert [(f["turn"], f["archive"]) for f in forgotten.json()["forgotten"]] == [(t, True) for t in chosen]
        assert web.redis.zcard(ThreadKeys(tid).archive) == 1950
        assert sorted(json.loads(web.redis.hget(ThreadKeys(tid).state, "fgt"))) == chosen
        frames = [f for f in frames if f["type"] != "memory"]
        assert answer_text(frames) == "".join(TOKENS)  # the visitor's answer arrived whole
        assert frames[-1] == {"type": "done", "status": "completed", "messageId": frames[0]["messageId"], "turn": 1}
        assert visitor.thread()["messages"][-1]["text"] == "".join(TOKENS).strip()  # and was saved (trimmed)
        again = owner.request("POST", "/api/chat/forget", json={"turns": chosen[:5]})
        assert again.status_code == 200 and not any(f["archive"] for f in again.json()["forgotten"])
    finally:
        owner.close()
        visitor.close()


PLANTED = "My locker code is zebrafinch-4471, keep it safe."
QUESTION = "Which locker code zebrafinch did I give you, and what about the garden?"


def seed_archive(web: Deployed, tid: str, planted: bool) -> None:
    """Twelve archived turns (turn 5 holding ``PLANTED`` when ``planted``), marked folded."""
    keys = ThreadKeys(tid)
    members = {}
    for n in range(1, 13):
        person = PLANTED if planted and n == 5 else f"We talked about the garden, part {n}."
        members[json.dumps({"n": n, "m": [
            {"id": f"u-old-{n}-{planted}", "role": "user", "text": person, "createdAt": "2026-01-01T00:00:00.000Z"},
            {"id": f"a-old-{n}-{planted}", "role": "assistant", "text": "Noted.",
             "createdAt": "2026-01-01T00:00:01.000Z"}]})] = n
    web.redis.zadd(keys.archive, members)
    web.redis.hset(keys.state, mapping={"ft": 12, "ab": sum(len(m) for m in members)})


def test_an_expired_thread_is_never_recalled_into_the_same_sessions_new_conversation(web, model, procfile, tmp_path):
    second_env = dict(web.env, PORT=str(free_port()))
    second = Deployed(f"http://127.0.0.1:{second_env['PORT']}", tmp_path / "web-2.log", web.redis, model,
                      second_env)
    second.proc = procfile.start_web(second_env, second.log)
    visitor = Visitor(web)
    other = ChatClient(second, session=visitor.session)  # the same browser session, served by the second process
    try:
        tid = visitor.thread()["threadId"]
        first = visitor.connect()
        turn(first, "hello, the old conversation")
        seed_archive(web, tid, planted=True)
        turn(first, QUESTION)
        assert "4471" in json.dumps(model.last_request("stream").body)  # the first process recalled turn 5
        first.close()

        keys = ThreadKeys(tid)
        for key in [*keys.ttl_keys(), keys.archive]:
            web.redis.pexpire(key, 1)  # the thread's keys expire
        wait_until(lambda: not web.redis.exists(keys.state, keys.archive), 10, message="the keys to expire")

        other.connect(timeout=30)
        turn(other, "hello, a new conversation")  # the new conversation begins on the second process
        seed_archive(web, tid, planted=False)  # and is folded into twelve archived turns of its own
        other.close()

        frames = turn(visitor.connect(), QUESTION)  # the first process serves the new conversation again
        assert "saved" not in frames[-1]
        prompt = json.dumps(model.last_request("stream").body)
        assert "garden, part" in prompt  # the new archive is recalled
        assert "4471" not in prompt and "zebrafinch-4471" not in json.dumps(visitor.request(
            "GET", "/api/chat/export").json())
    finally:
        visitor.close()
        other.close()
        stop_group(second.proc)
