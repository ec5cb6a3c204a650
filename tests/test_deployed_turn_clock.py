"""A turn's clock measures silence, not length, against the app as deployed (the Procfile's ``web``: gunicorn,
gevent), with the fake model server as a process of its own (``--cut-plan``; 30 pieces 0.2 s apart: 6 s).

Two sockets of one gevent process at once, limits first token 2 s and gap 1 s: one answer goes silent after
three pieces and fails plainly once the gap passes (its watchdog is a greenlet there), nothing stored; the
other streams for 6 s, three times the first-token limit, and completes, stored as turn 1 of its thread
(docs/contract.md: Configuration, WebSocket).
"""

from __future__ import annotations

import threading
import time

import pytest
import requests

from chat_support.fake_llm import FakeLLMProcess, plan_pieces as pieces
from chat_support.live_app import ChatClient, answer_text
from chat_support.processes import prod_env, stop_group
from chat_support.servers import free_port, wait_http

GAP_MESSAGE = "The model stopped answering: no text for 1 s. The part shown was not saved."


@pytest.mark.slow
def test_a_silent_answer_fails_at_its_gap_while_a_long_one_completes(procfile, settings, tmp_path):
    log = open(tmp_path / "model.log", "w")
    model = FakeLLMProcess(tokens=30, token_delay=0.2, extra_args=["--cut-plan"], stderr=log, startup_timeout=15)
    model.start()
    web_log = tmp_path / "web.log"
    port = free_port()
    web = procfile.start("web", prod_env(settings.with_overrides(openai_base_url=model.url), PORT=str(port),
                                WEB_CONCURRENCY="1", WEB_THREADS="8", LLM_FIRST_TOKEN_TIMEOUT_SECONDS="2",
                                LLM_TOKEN_GAP_TIMEOUT_SECONDS="1"), web_log)
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz", web, web_log)
        server = type("Server", (), {"url": f"http://127.0.0.1:{port}", "ws_url": f"ws://127.0.0.1:{port}/ws/chat"})
        steady, silent = ChatClient(server).connect(), ChatClient(server).connect()
        results: dict[str, tuple[list[dict], float]] = {}

        def turn(name: str, chat: ChatClient, text: str) -> None:
            started = time.monotonic()
            frames = chat.turn(text, timeout=30)
            results[name] = ([f for f in frames if f["type"] != "memory"], time.monotonic() - started)

        try:
            runs = [threading.Thread(target=turn, args=("steady", steady, "Say something.")),
                    threading.Thread(target=turn, args=("silent", silent, "Say something [hang 3]."))]
            for run in runs:
                run.start()
            for run in runs:
                run.join(40)
            steady_thread, silent_thread = (  # the production cookie is Secure: sent by hand over plain HTTP
                requests.get(server.url + "/api/chat/thread", headers={"Cookie": chat.cookie_header()},
                             timeout=10).json() for chat in (steady, silent))
        finally:
            steady.close()
            silent.close()
        frames, elapsed = results["steady"]
        assert frames[-1]["status"] == "completed" and frames[-1]["turn"] == 1
        assert answer_text(frames) == "".join(pieces(30)) and elapsed >= 5.5
        assert [m["text"] for m in steady_thread["messages"]] == ["Say something.", "".join(pieces(30))]
        frames, elapsed = results["silent"]
        assert answer_text(frames) == "".join(pieces(30)[:3])
        assert [(f["code"], f["message"]) for f in frames if f["type"] == "error"] == [("llm_unavailable", GAP_MESSAGE)]
        assert frames[-1]["status"] == "failed" and "turn" not in frames[-1]
        assert 1.0 <= elapsed < 4.0, elapsed  # three pieces (0.4 s), then the 1 s gap: not the 6 s of the other
        assert silent_thread["messages"] == []
        assert "Traceback" not in web_log.read_text()
    finally:
        assert stop_group(web) == 0
        model.stop()
        log.close()
