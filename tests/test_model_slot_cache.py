"""Each thread's prompt cache on the bundled chat server, kept across other threads' turns and never shared
(``scripts/slot_cache.py``; docs/bundled-model.md: The bundled model).

The proxy runs for real on loopback in front of a stand-in of llama.cpp's one-slot server with slot files
(the fake model server with ``slot_dir``: its slot holds the texts of the last request, and each answer says what
the slot held when the request came).  Threads chat at once, in random interleavings: a request about one thread
never finds another thread's text in the slot, and a thread's next request finds its own previous one there even
after other threads' turns.  The slow test does the same with the real bundled model (``scripts/model_server.py``
and llama.cpp's own ``/slots`` save and restore), reading llama.cpp's ``timings`` of each answer.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
import urllib.error
import urllib.request

import pytest

from app.llm.cache_key import CACHE_HEADER, cache_headers, thread_cache_key
from app.llm.client import CancelEvent, LLMClient, StreamStats
from chat_support.fake_llm import FakeLLM, Reply
from chat_support.servers import free_ports
from scripts import slot_cache
from tests.helpers.model_server import slot_proxy

SECRET = "s" * 64
SYSTEM = "You are a helpful assistant."


def post(url: str, body: dict, key: str | None = None) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json", **({CACHE_HEADER: key} if key else {})}
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


@pytest.fixture
def proxied(tmp_path):
    """``(proxy url, SlotCache, stand-in)``: the proxy on a free loopback port in front of the stand-in (the fake
    model server keeping llama.cpp's slot, answering ``"ok"``; no model name needed, as with llama.cpp)."""
    directory = tmp_path / "slots"
    directory.mkdir()
    standin = FakeLLM(Reply(text="ok"), slot_dir=directory, require_model=False).start()
    try:
        with slot_proxy(standin.address, directory) as (url, cache):
            yield url, cache, standin
    finally:
        standin.stop()


def test_no_thread_ever_finds_another_threads_text_and_each_finds_its_own_after_others(proxied):
    url, cache, standin = proxied
    threads = {f"thread-{n}": thread_cache_key(SECRET, f"thread-{n}") for n in range(4)}
    seen: dict[str, list[list[str]]] = {name: [] for name in threads}
    errors: list[BaseException] = []

    def chat(name: str, seed: int):
        rng = random.Random(seed)
        messages = [{"role": "system", "content": SYSTEM}]
        try:
            for turn in range(8):
                messages.append({"role": "user", "content": f"{name} says {turn}"})
                status, answer = post(url + "/v1/chat/completions", {"messages": messages}, threads[name])
                assert status == 200, answer
                seen[name].append(answer["slot_before"])
                messages.append({"role": "assistant", "content": "ok"})
                time.sleep(rng.random() * 0.01)
        except BaseException as exc:  # reported from the test's thread
            errors.append(exc)

    workers = [threading.Thread(target=chat, args=(name, n)) for n, name in enumerate(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)
    assert errors == []
    for name, befores in seen.items():
        for turn, before in enumerate(befores):
            others = [text for text in before if text.startswith("thread-") and not text.startswith(name + " ")]
            assert others == [], (name, turn, before)  # never another thread's text
            if turn:  # its own previous turn is in the slot again, whatever ran in between
                assert f"{name} says {turn - 1}" in before, (name, turn, before)
            else:  # a new thread starts from the base state: the system prompt alone
                assert before == [SYSTEM, "ok"], before
    # the turns really interleaved, so the slot changed hands and was restored
    restores = [name for action, name in cache.events if action == "restore" and name != slot_cache.BASE]
    assert len(restores) >= 4
    # one file per thread, named by its key (never the thread's id), and the base state
    names = sorted(p.name for p in cache.directory.iterdir())
    assert names == sorted([f"{key}.bin" for key in threads.values()] + ["base.bin"])
    assert not [n for n in names if "thread" in n]


def test_a_request_without_a_key_never_finds_a_threads_text_and_is_never_saved(proxied):
    url, cache, standin = proxied
    key = thread_cache_key(SECRET, "thread-x")
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "thread-x secret"}]
    assert post(url + "/v1/chat/completions", {"messages": messages}, key)[0] == 200
    status, answer = post(url + "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hello"}]})
    assert status == 200 and [t for t in answer["slot_before"] if "thread-x" in t] == []
    status, answer = post(url + "/v1/chat/completions", {"messages": messages + [{"role": "assistant",
                                                                                   "content": "ok"}]}, key)
    assert "thread-x secret" in answer["slot_before"] and "Hello" not in answer["slot_before"]
    assert sorted(p.name for p in cache.directory.iterdir()) == sorted([f"{key}.bin", "base.bin"])


def test_the_proxy_refuses_slot_paths_and_malformed_keys(proxied):
    url, _cache, standin = proxied
    assert post(url + "/slots/0?action=restore", {"filename": "base.bin"})[0] == 404
    assert post(url + "/v1/chat/completions", {"messages": []}, key="thread-1")[0] == 400
    assert post(url + "/v1/chat/completions", {"messages": []}, key="A" * 64)[0] == 400
    assert [r.path for r in standin.requests if r.path.startswith("/slots") or "chat" in r.path] == []


def test_slot_files_stay_within_their_count_and_bytes_oldest_out(tmp_path):
    cache = slot_cache.SlotCache(("127.0.0.1", 9), tmp_path, max_files=3, max_bytes=10_000)
    for n, name in enumerate(["base", "a" * 64, "b" * 64, "c" * 64, "d" * 64]):
        path = tmp_path / f"{name}.bin"
        path.write_bytes(b"x" * 3000)
        os.utime(path, (1000 + n, 1000 + n))
    cache.bound(keep="d" * 64)
    # the least recently used thread files went first; the base state stays while a thread file can go
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted(["base.bin", f"{'c' * 64}.bin", f"{'d' * 64}.bin"])
    cache.max_bytes = 5000
    cache.bound(keep="d" * 64)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{'d' * 64}.bin"]
    cache.max_bytes = 1000  # the one just saved goes too when it alone is over the bound
    cache.bound(keep="d" * 64)
    assert list(tmp_path.iterdir()) == []


def test_a_forget_drops_the_threads_slot_file_and_its_next_request_starts_from_the_base_state(proxied, settings):
    from app.llm.cache_key import drop_thread_cache

    url, cache, _standin = proxied
    bundled = settings.with_overrides(bundled_model=True, openai_base_url=url + "/v1")
    key = thread_cache_key(bundled.secret_key, "chat:forgetful")
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "thread-f secret"}]
    assert post(url + "/v1/chat/completions", {"messages": messages}, key)[0] == 200
    with cache.lock:  # the proxy saves after the answer went out, under the lock
        assert cache.path(key).exists()
    assert drop_thread_cache(settings.with_overrides(bundled_model=False, openai_base_url=url + "/v1"),
                             "chat:forgetful") is False  # a hosted provider: nothing is sent
    assert cache.path(key).exists()
    assert drop_thread_cache(bundled, "chat:forgetful") is True
    assert not cache.path(key).exists() and ("forget", key) in cache.events
    status, answer = post(url + "/v1/chat/completions", {"messages": [messages[0], {"role": "user", "content": "hi"}]},
                          key)
    assert status == 200 and [t for t in answer["slot_before"] if "secret" in t] == []
    bad = urllib.request.Request(url + "/cache", headers={CACHE_HEADER: "x"}, method="DELETE")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(bad, timeout=10)
    assert refused.value.code == 400
    assert slot_cache._loopback("127.0.0.1") and slot_cache._loopback("::1")
    assert not slot_cache._loopback("10.0.0.5") and not slot_cache._loopback("::ffff:192.168.1.2")


def test_the_cache_key_is_an_hmac_of_the_thread_id_sent_only_to_the_bundled_model(settings):
    key = thread_cache_key(SECRET, "th_1")
    assert len(key) == 64 and key == key.lower() and "th_1" not in key
    assert thread_cache_key(SECRET, "th_2") != key and thread_cache_key("t" * 64, "th_1") != key
    assert cache_headers(settings.with_overrides(bundled_model=True), "th_1") == {
        CACHE_HEADER: thread_cache_key(settings.secret_key, "th_1")}
    assert cache_headers(settings.with_overrides(bundled_model=False), "th_1") == {}  # a hosted provider
    assert cache_headers(settings.with_overrides(bundled_model=True), None) == {}
    with pytest.raises(ValueError):
        thread_cache_key("", "th_1")


def test_a_chat_stream_carries_its_threads_key_to_the_bundled_model_only(settings, fake_llm):
    for bundled in (True, False):
        client = LLMClient(settings.with_overrides(openai_base_url=fake_llm.url, bundled_model=bundled))
        list(client.stream_chat([{"role": "user", "content": "hi"}], cancelled=CancelEvent(),
                                deadline=time.monotonic() + 30, stats=StreamStats(), thread_id="th_9"))
    with_key, without = fake_llm.chat_requests()[-2:]
    assert with_key.headers.get(CACHE_HEADER.lower()) == thread_cache_key(settings.secret_key, "th_9")
    assert CACHE_HEADER.lower() not in without.headers


# -- the real bundled model ------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(600)
def test_with_the_real_model_a_thread_reads_only_its_new_tokens_after_another_threads_turn(
        bundled_model, settings, tmp_path, monkeypatch):
    from scripts import local_model

    monkeypatch.setenv("LOCAL_MODEL_SLOT_DIR", str(tmp_path / "slots"))
    (port,) = free_ports(1)
    model = bundled_model.start(port, tmp_path / "model.log")
    try:
        live = settings.with_overrides(openai_base_url=f"http://127.0.0.1:{port}/v1", openai_api_key="local",
                                       chat_model=local_model.MODEL_NAME, bundled_model=True,
                                       reserved_output_tokens=16)
        client = LLMClient(live)
        # The two threads' prompts share a long beginning: without isolation the second would reuse the first's.
        shared = "Here is the plan for our offsite, please keep it in mind. " * 12
        prompts = {name: [{"role": "system", "content": live.system_prompt},
                          {"role": "user", "content": shared + f"My code word is {word}. Say ok."}]
                   for name, word in (("a", "MARZIPANTO"), ("b", "QUILBERRY"))}

        def turn(name: str, text: str | None = None) -> StreamStats:
            if text:
                prompts[name].append({"role": "user", "content": text})
            stats = StreamStats()
            answer = "".join(d.text for d in client.stream_chat(
                prompts[name], cancelled=CancelEvent(), deadline=time.monotonic() + 300, stats=stats,
                thread_id=f"thread-{name}", temperature=0, seed=7))
            prompts[name].append({"role": "assistant", "content": answer})
            return stats

        a1 = turn("a")
        b1 = turn("b")
        a2 = turn("a", "Thanks.")
        b2 = turn("b", "Thanks.")
    finally:
        bundled_model.stop(model)
    assert a1.prompt_read is not None and a1.prompt_cached is not None  # llama.cpp's timings were read
    # a new thread starts from the system prompt alone: b1 reuses none of a1's shared beginning
    assert b1.prompt_cached <= a1.prompt_cached + 2 and b1.prompt_read >= a1.prompt_read - 2
    # after the other thread's turn, each thread reads only its new message (and the template's few tokens)
    for first, second in ((a1, a2), (b1, b2)):
        assert second.prompt_read <= 12, (first, second)
        assert second.prompt_cached >= first.prompt_tokens
    # the directory held one file per thread, named by its key: gone with the server
    assert not any((tmp_path / "slots").glob("*/*.bin"))
