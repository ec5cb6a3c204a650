"""Sessions never see each other's cache on the bundled model's server (docs/bundled-model.md: The bundled model).

The chat server has one slot and keeps prompt state only in that slot and in one slot file per thread, which its
supervisor restores before that thread's requests (``scripts/slot_cache.py``; no RAM prompt cache), so two
sessions chatting at once make it switch the slot between them on almost every request. Through the real app
(served on loopback, the test Redis) and the real bundled model (``scripts/model_server.py --role chat``), two
browser sessions chat at the same time, each with its own planted word. Every request the app sent to the model
and every answer the model streamed back is recorded by a forwarding HTTP proxy between them (the fake model
server in its forwarding mode, ``upstream=``). Expected: each session's prompts hold its own word and never the
other's; no answer (as streamed by the server, and as the session received it) holds the other session's word; and
the two sessions' requests really alternated on the one slot.

Needs the verified GGUF file (``make test`` fetches it first).
"""

from __future__ import annotations

import threading

import pytest

from chat_support.fake_llm import FakeLLM
from chat_support.live_app import ChatClient, answer_text
from chat_support.servers import free_ports
from scripts import local_model

WORDS = {"a": "MARZIPANTO", "b": "QUILBERRY"}
TURNS = [
    "Remember this: my secret code word is {word}. Reply with the code word only.",
    "Write one short sentence about the sea.",
    "What is my secret code word? Answer with the word only.",
]


def prompt_text(request: dict) -> str:
    return "\n".join(str(m.get("content")) for m in request.get("messages", []))


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_two_sessions_at_once_never_see_each_others_words(bundled_model, make_live_app, settings, tmp_path):
    (port,) = free_ports(1)
    model = bundled_model.start(port, tmp_path / "model.log")
    proxy = FakeLLM(upstream=f"http://127.0.0.1:{port}").start()  # forwards and records every exchange
    try:
        live = make_live_app(settings.with_overrides(
            openai_base_url=proxy.url, openai_api_key="local", chat_model=local_model.MODEL_NAME,
            compaction_model=local_model.MODEL_NAME, bundled_model=True, tools_enabled=False,
            reserved_output_tokens=40))
        answers: dict[str, list[str]] = {"a": [], "b": []}
        errors: list[BaseException] = []
        start = threading.Barrier(2)

        def chat(name: str):
            client = ChatClient(live).connect(timeout=120)
            try:
                start.wait(60)
                for n, text in enumerate(TURNS, start=1):
                    frames = client.turn(text.format(word=WORDS[name]), message_id=f"{name}-{n}", timeout=300)
                    assert frames[-1]["type"] == "done" and frames[-1]["status"] == "completed", frames
                    answers[name].append(answer_text(frames))
            except BaseException as exc:  # reported below, from the test's thread
                errors.append(exc)
            finally:
                client.close()

        threads = [threading.Thread(target=chat, args=(name,)) for name in WORDS]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(600)
        assert errors == []
        assert [len(answers[name]) for name in WORDS] == [len(TURNS)] * 2
    finally:
        proxy.stop()
        bundled_model.stop(model)

    # per POST .../chat/completions: the request body, and the status and answer text the server streamed back
    exchanges = [{"request": r.body, "status": r.status, "answer": r.answer}
                 for r in proxy.chat_requests() if r.wait(10)]
    assert len(exchanges) == 2 * len(TURNS) and {e["status"] for e in exchanges} == {200}
    owners = []
    for exchange in exchanges:
        prompt, answer = prompt_text(exchange["request"]), exchange["answer"]
        mine = [name for name, word in WORDS.items() if word in prompt]
        assert len(mine) == 1, prompt  # each prompt holds its own session's word only
        owners.append(mine[0])
        other = WORDS["b" if mine[0] == "a" else "a"]
        assert other.lower() not in answer.lower(), (mine, answer)
    assert sorted(owners) == ["a"] * len(TURNS) + ["b"] * len(TURNS)
    # the slot really changed hands: the sessions' requests interleaved
    switches = sum(1 for x, y in zip(owners, owners[1:], strict=False) if x != y)
    assert switches >= 2, owners
    for name, said in answers.items():
        other = WORDS["b" if name == "a" else "a"]
        assert [text for text in said if other.lower() in text.lower()] == [], (name, said)
