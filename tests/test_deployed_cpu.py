"""Crafted messages against the Procfile's ``web`` as deployed (gunicorn, gevent, one process): the turn's CPU
runs in gevent's thread pool (``app.chat.turn.off_the_event_loop``), and another socket of the same process
streams its answer whole meanwhile (docs/benchmarks.md: Performance).

Values only (no timing): every crafted message ends in a completed turn (stored word for word) or in the
contract's ``input_too_long``, the socket keeps working after it, and a second visitor's turn that streams
while the crafted messages are prepared completes with the model's exact text and is stored.  How long
another socket pauses is measured by ``bench/cpu_input.py`` (its last lines), not here.
"""

from __future__ import annotations

import threading

import pytest

from chat_support.fake_llm import FakeLLM, Reply
from chat_support.live_app import answer_text
from tests.fixtures.deployed_web import Visitor

ANSWER = " ".join(f"word{i}" for i in range(60))


def repeat(unit: str, n: int = 12_000) -> str:
    return (unit * (n // len(unit) + 1))[:n]


CRAFTED = [repeat("abc12"), repeat("abcdefghij"), repeat("好。"), repeat("😀", 3000), repeat("aя好1ع😀-.ß x"),
           repeat("12:"), " ".join(str(i) for i in range(10, 10 ** 6))[:12_000], "最后 ask INC-4471 again"]


@pytest.fixture(scope="module")
def deployed(procfile, tmp_path_factory):
    with FakeLLM() as model:
        model.default = Reply(text=ANSWER, token_delay=0.02)
        with procfile.deployed_web(model, tmp_path_factory.mktemp("deployed-cpu"), WEB_CONCURRENCY="1") as web:
            yield web


def test_crafted_messages_complete_or_are_refused_while_another_socket_streams_whole(deployed):
    streaming, crafting = Visitor(deployed), Visitor(deployed)
    try:
        other = streaming.connect()
        crafted = crafting.connect()
        assert other.turn("warm up", timeout=60)[-1]["status"] == "completed"
        results: dict = {}

        def stream_meanwhile():
            results["frames"] = [other.turn(f"tell me more {i}", timeout=120) for i in range(3)]

        thread = threading.Thread(target=stream_meanwhile)
        thread.start()
        outcomes = []
        for text in CRAFTED:
            frames = crafted.turn(text, timeout=120)
            last = frames[-1]
            outcomes.append(last.get("status") if last["type"] == "done" else last["code"])
            if last["type"] == "done":
                assert answer_text(frames) == ANSWER
        thread.join(timeout=300)
        assert not thread.is_alive()
        assert set(outcomes) <= {"completed", "input_too_long"} and outcomes[0] == outcomes[-1] == "completed"
        assert [(f[-1]["status"], answer_text(f)) for f in results["frames"]] == [("completed", ANSWER)] * 3
        stored = [m["text"] for m in crafting.thread()["messages"] if m["role"] == "user"]
        kept = [text.strip() for text, outcome in zip(CRAFTED, outcomes, strict=True) if outcome == "completed"]
        assert stored[-len(kept[-2:]):] == kept[-2:]  # the recent window holds the newest, word for word
        assert "Traceback" not in deployed.log_text()
    finally:
        streaming.close()
        crafting.close()
