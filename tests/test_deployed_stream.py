"""A model stream that ends before its answer is whole, against the app as deployed.

The Procfile's ``web`` command (gunicorn, gevent) runs with a production environment (``chat_support.processes``),
its model the fake model server as a process of its own (``chat_support.fake_llm --cut-plan``: ``CutPlan``) whose
body ends when its connection closes. An answer is whole only with ``data: [DONE]`` or a ``finish_reason``
(``app.llm.client.SSEStream``); a stream cut after a few pieces, or whose server process is killed mid-answer,
ends the turn with ``error`` ``upstream_truncated`` and ``done`` ``failed``, and the thread in Redis is exactly as
before the turn (docs/contract.md: WebSocket); the page keeps the partial text marked "failed — not saved". The
stream reader itself, on the same server: a ``finish_reason`` without ``[DONE]`` is a whole answer, a cut after
text is never retried, a cut before any text is retried once.
"""

from __future__ import annotations

import signal
import time

import pytest
import requests

from app.llm.client import CancelEvent, LLMClient, StreamStats
from app.llm.provider import LLMError
from chat_support.fake_llm import FakeLLMProcess, plan_pieces as pieces
from chat_support.live_app import ChatClient, answer_text, frame_kinds
from chat_support.processes import prod_env, stop_group
from chat_support.servers import free_port, wait_http

TRUNCATED = ("upstream_truncated",
             "The model's answer was cut off before it finished, so it was not saved. Please try again.")


@pytest.fixture
def cut_model(tmp_path):
    """``(url, process)`` of the fake model server started as its own process with the cut plan (40 pieces,
    10 ms apart; HTTP/1.0-style bodies that end when the connection closes); stopped after the test."""
    log = open(tmp_path / "cut_model.log", "w")
    model = FakeLLMProcess(tokens=40, token_delay=0.01, extra_args=["--cut-plan"], stderr=log, startup_timeout=15)
    try:
        model.start()
        yield model.url, model.proc
    finally:
        model.stop()
        log.close()


def thread_hashes(redis_client) -> dict[str, dict]:
    """Every thread hash in the test database (``mem:{hex}``), as Redis holds it."""
    return {key: redis_client.hgetall(key) for key in redis_client.scan_iter("mem:{*}")
            if redis_client.type(key) == "hash"}


@pytest.mark.slow
def test_a_cut_or_killed_model_stream_fails_the_turn_and_stores_nothing(procfile, settings, cut_model, redis_client,
                                                                         tmp_path):
    model_url, model = cut_model
    port = free_port()
    log = tmp_path / "web.log"
    web = procfile.start("web", prod_env(settings.with_overrides(openai_base_url=model_url), PORT=str(port),
                                WEB_CONCURRENCY="1", WEB_THREADS="8"), log)
    try:
        health = wait_http(f"http://127.0.0.1:{port}/healthz", web, log)
        assert (health.status_code, health.json()["model"]) == (200, "up")
        server = type("Server", (), {"url": f"http://127.0.0.1:{port}", "ws_url": f"ws://127.0.0.1:{port}/ws/chat"})
        client = ChatClient(server).connect()
        try:
            whole = client.turn("Say something.", timeout=30)
            stored = thread_hashes(redis_client)
            cut = client.turn("Say something [cut 5].", timeout=30)
            after_cut = thread_hashes(redis_client)
            client.send({"type": "message", "text": "Say something [hang 3]."})
            head = []
            while "t2" not in answer_text(head):
                head.append(client.recv(timeout=30))
            model.send_signal(signal.SIGKILL)  # the model server dies mid-answer
            model.wait(10)
            killed = head + client.recv_until(lambda f: f["type"] == "done", timeout=30)
            killed = [f for f in killed if f["type"] != "memory"]
            after_kill = thread_hashes(redis_client)
            thread = requests.get(server.url + "/api/chat/thread", headers={"Cookie": client.cookie_header()},
                                  timeout=10).json()
        finally:
            client.close()
        assert frame_kinds(whole) == ["start", "delta", "done"] and whole[-1]["status"] == "completed"
        assert answer_text(whole) == "".join(pieces(40))
        for frames, shown in ((cut, pieces(40)[:5]), (killed, pieces(40)[:3])):
            assert frame_kinds(frames) == ["start", "delta", "error", "done"]
            error, done = frames[-2], frames[-1]
            assert (error["code"], error["message"]) == TRUNCATED
            assert (done["status"], done["code"], done["messageId"]) == ("failed", "upstream_truncated",
                                                                         frames[0]["messageId"])
            assert answer_text(frames) == "".join(shown)  # the partial text was shown, and only that
        # Redis holds the whole turn and nothing of the two cut ones: the hash did not change at all.
        assert len(stored) == 1 and after_cut == stored and after_kill == stored
        assert [(m["role"], m["text"]) for m in thread["messages"]] == [
            ("user", "Say something."), ("assistant", "".join(pieces(40)))]
        assert "Traceback" not in log.read_text()
    finally:
        assert stop_group(web) == 0


@pytest.mark.browser
def test_the_page_shows_a_cut_answer_as_failed_and_not_saved(browser_page, make_live_app, app_settings, cut_model):
    model_url, _ = cut_model
    app = make_live_app(app_settings.with_overrides(openai_base_url=model_url))
    page = browser_page
    page.goto(app.url + "/")
    page.wait_for_selector('[data-testid="connection"][data-state="connected"]')
    box = page.get_by_test_id("message-input")
    box.fill("Say something [cut 5].")
    box.press("Enter")
    bot = page.locator('[data-testid="message"][data-role="assistant"]').last
    page.wait_for_function("""() => { const b = [...document.querySelectorAll(
        '[data-testid="message"][data-role="assistant"]')].pop(); return b && b.dataset.status === "failed"; }""")
    assert bot.locator(".content").inner_text().strip() == "".join(pieces(40)[:5])  # the partial text stays
    assert (bot.get_attribute("data-kept"), bot.locator(".note").inner_text()) == ("false", "failed — not saved")
    assert page.get_by_test_id("chat-error").last.inner_text() == TRUNCATED[1]
    response = page.request.get(app.url + "/api/chat/thread")
    assert response.ok and response.json()["messages"] == []
    assert page.errors == []


def stream(settings, url: str, text: str, stats: StreamStats | None = None) -> tuple[str, StreamStats]:
    """The joined text of ``LLMClient.stream_chat`` (one retry) for one user ``text`` against ``url``, and its stats."""
    client = LLMClient(settings.with_overrides(openai_base_url=url, llm_max_retries=1))
    stats = stats or StreamStats()
    deltas = client.stream_chat([{"role": "user", "content": text}], cancelled=CancelEvent(),
                                deadline=time.monotonic() + 20, stats=stats)
    return "".join(d.text for d in deltas), stats


def test_the_stream_reader_takes_a_finish_reason_or_done_as_the_end_and_nothing_else(settings, cut_model):
    url, _ = cut_model
    assert stream(settings, url, "hi")[0] == "".join(pieces(40))
    text, stats = stream(settings, url, "hi [nodone 4]")  # a finish_reason without [DONE]: whole
    assert (text, stats.finish_reason) == ("".join(pieces(40)[:4]), "stop")
    stats = StreamStats()
    with pytest.raises(LLMError) as cut:
        stream(settings, url, "hi [cut 4]", stats)
    assert (cut.value.code, cut.value.message, cut.value.category) == (*TRUNCATED, "truncated")
    assert stats.attempts == 1  # cut after text was shown: never retried
    stats = StreamStats()
    with pytest.raises(LLMError) as empty:  # cut before any text: retried (nothing was shown), then failed
        stream(settings, url, "hi [cut 0]", stats)
    assert (empty.value.code, stats.attempts) == ("upstream_truncated", 2)
