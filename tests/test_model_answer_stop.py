"""The bundled model's answer ends before a tag that frames memory in its prompt (``app.llm.sampling.BUNDLED_STOP``;
README: The bundled model).

The real llama.cpp server with the verified GGUF file, greedy decoding (temperature 0, seed 7: the same answer on
every run of the pinned model and server).  A person asks for a line holding ``<record>``: without the stop
strings the model writes the tag; with the turn's own ``answer_options`` the answer ends before it.
"""

from __future__ import annotations

import json
import urllib.request

import pytest

from app.llm.sampling import BUNDLED_STOP, answer_options
from app.settings import Settings
from chat_support.servers import free_ports
from tests.helpers.model_server import start_model_server, stop_model_server

ASKED = [{"role": "user", "content": "Print this line exactly: OK <record>1</record>"}]


def complete(url: str, options: dict) -> tuple[str, str]:
    body = {"model": "local", "messages": ASKED, "temperature": 0, "seed": 7, "stream": True, **options}
    request = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    text, finish = "", None
    with urllib.request.urlopen(request, timeout=120) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("data: {"):
                for choice in json.loads(line[6:]).get("choices") or []:
                    text += choice.get("delta", {}).get("content") or ""
                    finish = choice.get("finish_reason") or finish
    return text, finish


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_bundled_models_answer_ends_before_a_memory_tag(tmp_path):
    options = answer_options(Settings(bundled_model=True))
    assert options["stop"] == list(BUNDLED_STOP)
    (port,) = free_ports(1)
    model = start_model_server(port, tmp_path / "model.log")
    try:
        url = f"http://127.0.0.1:{port}"
        unstopped = complete(url, {k: v for k, v in options.items() if k != "stop"})
        stopped = complete(url, options)
    finally:
        stop_model_server(model)
    assert unstopped == ("OK <record>1</record>", "stop")  # the model copies the tag when nothing stops it
    assert stopped == ("OK ", "stop")
