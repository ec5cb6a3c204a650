"""``GET /healthz`` reports the model endpoint (contract: HTTP; docs/memory.md: Identity and degradation).

The probe (``app.llm.health``) is checked against real HTTP servers that answer each way (the fake model server
with a rule for ``/v1/models``), and ``/healthz`` of
the app served for real against the bundled model's real llama.cpp server (``scripts/model_server.py``), stopped and started again
on the same port: 503 ``"model": "down"`` while it is stopped, 200 ``"up"`` again without restarting the app.
"""

from __future__ import annotations

import socket
import threading

import pytest
import requests

from app.llm import health
from chat_support.fake_llm import FakeLLM, Reply
from chat_support.polling import wait_until
from chat_support.servers import free_ports

EXCEPTION_WORDS = ("Traceback", "Error", "refused", "Exception", "errno")


class Answering:
    """A real HTTP server on loopback (the fake model server) whose ``GET /v1/models`` answers ``status``;
    ``requests`` counts the requests it got."""

    def __init__(self, status: int):
        self.fake = FakeLLM().start()
        self.fake.add_rule(Reply(status=status), path="/v1/models")  # 200: an empty model list
        self.url = self.fake.url

    @property
    def requests(self) -> int:
        return len(self.fake.requests)

    def close(self):
        self.fake.stop()


@pytest.mark.parametrize("status, expected", [(200, "up"), (404, "up"), (500, "down"), (503, "down"),
                                              (401, "down")])
def test_probe_status_follows_the_answer(status, expected):
    server = Answering(status)
    try:
        assert health.ModelProbe(server.url, "key").probe() == expected
        assert server.requests == 1
    finally:
        server.close()


def test_probe_says_down_when_nothing_listens():
    (port,) = free_ports(1)
    assert health.ModelProbe(f"http://127.0.0.1:{port}/v1", None).probe() == "down"


def test_probe_says_down_when_the_server_hangs_up_without_answering():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()

        def hang_up():
            conn, _ = listener.accept()
            conn.recv(1024)
            conn.close()  # as a process that crashes while handling the request

        threading.Thread(target=hang_up, daemon=True).start()
        assert health.ModelProbe(f"http://127.0.0.1:{listener.getsockname()[1]}/v1", None).probe() == "down"


def test_probe_says_up_for_a_busy_server_that_accepted_the_request():
    # a server that answers /v1/models only between completions: the request waits in its queue
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()  # the kernel accepts the connection; nobody answers within the read timeout
        assert health.ModelProbe(f"http://127.0.0.1:{listener.getsockname()[1]}/v1", None).probe() == "up"


def test_status_is_cached_for_a_few_seconds():
    server = Answering(200)
    try:
        probe = health.ModelProbe(server.url, None, cache_seconds=60)
        assert [probe.status() for _ in range(5)] == ["up"] * 5
        assert server.requests == 1
        expired = health.ModelProbe(server.url, None, cache_seconds=0)
        assert [expired.status() for _ in range(3)] == ["up"] * 3
        assert server.requests == 4
    finally:
        server.close()


# -- /healthz with the real bundled model server --------------------------------------------------------------------

def answer_with(url: str, status: int) -> tuple[requests.Response] | None:
    """``(response,)`` when ``GET url`` answers ``status`` (a Response of an error status is falsy itself)."""
    response = requests.get(url, timeout=10)
    return (response,) if response.status_code == status else None


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_healthz_follows_the_real_model_server_down_and_up_without_an_app_restart(bundled_model, make_live_app,
                                                                                  settings, tmp_path):
    (port,) = free_ports(1)
    log = tmp_path / "model.log"
    proc = bundled_model.start(port, log)
    try:
        live = make_live_app(settings.with_overrides(openai_base_url=f"http://127.0.0.1:{port}/v1",
                                                     openai_api_key="local"))
        url = live.url + "/healthz"
        first = requests.get(url, timeout=10)
        assert (first.status_code, first.json()) == (200, {"status": "ok", "store": "up", "model": "up"})

        bundled_model.stop(proc)
        down = wait_until(lambda: answer_with(url, 503), 30, "/healthz to say the model is down", interval=0.5)[0]
        assert down.json() == {"status": "degraded", "store": "up", "model": "down"}
        assert not any(word in down.text for word in EXCEPTION_WORDS)

        proc = bundled_model.start(port, log)  # the same port, a new process; the app is not restarted
        up = wait_until(lambda: answer_with(url, 200), 30, "/healthz to say the model is up again", interval=0.5)[0]
        assert up.json() == {"status": "ok", "store": "up", "model": "up"}
    finally:
        if proc.poll() is None:
            bundled_model.stop(proc)
