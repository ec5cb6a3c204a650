"""The chat server's proxy puts people first (``scripts/slot_cache.py``; docs/bundled-model.md: The bundled model).

The proxy runs for real on loopback in front of the fake model server keeping llama.cpp's one slot (a stand-in for
the proxy's own logic: queueing, preemption, wait events and the path guard; what llama.cpp does with a cancelled
prompt is tested with the real model in ``tests/test_warmup_preemption.py``).  A warm-up (``X-Model-Warmup: 1``)
is answered at once and run by the proxy as a streamed one-token request; any turn preempts it by closing its
upstream connection; a streamed turn that waits behind another turn hears ``x.wait`` events.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

from app.llm.cache_key import CACHE_HEADER, thread_cache_key
from chat_support.fake_llm import FakeLLM, Reply
from scripts import slot_cache
from tests.helpers.model_server import slot_proxy

SECRET = "s" * 64
SYSTEM = "You are a helpful assistant."
KEY_A = thread_cache_key(SECRET, "thread-a")
KEY_B = thread_cache_key(SECRET, "thread-b")


def request(url: str, body: dict, key: str | None = None, warm: bool = False) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json", **({CACHE_HEADER: key} if key else {}),
               **({slot_cache.WARMUP_HEADER: "1"} if warm else {})}
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def chat(text: str) -> dict:
    return {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]}


def is_warmup(body: dict) -> bool:
    """The proxy's upstream request for a warm-up: streamed, one token (no turn here asks for one; the base state's read is not streamed)."""
    return body.get("max_tokens") == 1 and body.get("stream") is True


@pytest.fixture
def proxied(tmp_path):
    """``(proxy url, SlotCache, stand-in)``: the proxy in front of the fake one-slot server; a warm-up's upstream
    request stalls (as a long prompt being read does) until its connection is closed."""
    directory = tmp_path / "slots"
    directory.mkdir()
    standin = FakeLLM(Reply(text="ok"), slot_dir=directory, require_model=False).start()
    standin.add_rule(Reply(stall=True, stall_max=60), when=is_warmup, name="warm")
    try:
        with slot_proxy(standin.address, directory) as (url, cache):
            yield url, cache, standin
    finally:
        standin.stop()


def wait_for(predicate, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError("condition not reached")


def warm_requests(standin: FakeLLM) -> list:
    return [r for r in standin.requests if r.body and is_warmup(r.body)]


def test_a_warmup_is_answered_at_once_and_read_upstream_as_a_streamed_one_token_request(proxied):
    url, cache, standin = proxied
    status, answer = request(url + "/v1/chat/completions", chat("warm me"), KEY_A, warm=True)
    assert (status, answer) == (202, {"object": "x.warmup", "status": "queued"})
    (upstream,) = wait_for(lambda: warm_requests(standin))
    assert upstream.body["stream"] is True and upstream.body["max_tokens"] == 1
    assert slot_cache.WARMUP_HEADER.lower() not in upstream.headers and CACHE_HEADER.lower() not in upstream.headers
    assert request(url + "/v1/chat/completions", chat("warm me"), warm=True)[0] == 400  # a warm-up needs a key


def test_a_turn_of_the_same_thread_preempts_its_warmup_and_finds_the_slot_as_the_warmup_left_it(proxied):
    url, cache, standin = proxied
    request(url + "/v1/chat/completions", chat("warm me"), KEY_A, warm=True)
    (upstream,) = wait_for(lambda: warm_requests(standin))
    status, answer = request(url + "/v1/chat/completions", chat("warm me, then my question"), KEY_A)
    assert status == 200
    upstream.wait(10)
    assert upstream.outcome == "aborted"  # the proxy closed the warm-up's connection: the server stops reading
    assert answer["slot_before"][:2] == [SYSTEM, "warm me"]  # the part the warm-up read, never restored over
    time.sleep(0.1)
    with cache.lock:  # the turn's save comes after its answer went out, under the lock
        warm_at = cache.events.index(("warm", KEY_A))
    assert ("preempted", KEY_A) in cache.events[warm_at:]
    assert ("restore", KEY_A) not in cache.events[warm_at:] and ("save", KEY_A) in cache.events[warm_at:]
    time.sleep(0.3)
    assert len(warm_requests(standin)) == 1  # not resumed: the turn read the thread's prompt itself


def test_another_threads_turn_preempts_a_warmup_which_keeps_its_part_and_resumes_after_the_turn(proxied):
    url, cache, standin = proxied
    request(url + "/v1/chat/completions", chat("warm me"), KEY_A, warm=True)
    wait_for(lambda: warm_requests(standin))
    status, answer = request(url + "/v1/chat/completions", chat("b's question"), KEY_B)
    assert status == 200 and [t for t in answer["slot_before"] if "warm me" in t] == []  # never a's text
    second = wait_for(lambda: warm_requests(standin)[1:])[0]  # resumed after the turn ...
    events = list(cache.events)
    preempted = events.index(("preempted", KEY_A))
    # ... from the part it had read: saved before b's turn, restored before the warm-up ran again
    assert events[preempted + 1] == ("save", KEY_A)
    turn_b = [n for n, e in enumerate(events) if e[1] == KEY_B and e[0] in ("restore", "save")]
    resumed = events.index(("warm", KEY_A), preempted)
    assert preempted < turn_b[0] and turn_b[-1] < resumed and events[resumed + 1] == ("restore", KEY_A)
    assert second.time >= [r for r in standin.requests if r.body and "b's question" in json.dumps(r.body)][0].time


def test_a_forget_stops_the_threads_warmup_at_once_and_keeps_nothing_of_it(proxied):
    url, cache, standin = proxied
    request(url + "/v1/chat/completions", chat("warm me"), KEY_A, warm=True)
    wait_for(lambda: warm_requests(standin))
    assert request(url + "/v1/chat/completions", chat("b's question"), KEY_B)[0] == 200  # a's part is saved ...
    second = wait_for(lambda: warm_requests(standin)[1:])[0]  # ... and a's warm-up goes on from it
    started = time.monotonic()
    conn = http.client.HTTPConnection(*urllib.parse.urlsplit(url).netloc.split(":"), timeout=10)
    conn.request("DELETE", "/cache", headers={CACHE_HEADER: KEY_A})
    assert conn.getresponse().status == 204
    assert time.monotonic() - started < 5  # not after the warm-up (stalled here for up to 60 s)
    second.wait(10)
    assert second.outcome == "aborted"
    time.sleep(0.3)
    assert not (cache.directory / f"{KEY_A}.bin").exists() and cache.holder is None
    assert len(warm_requests(standin)) == 2 and KEY_A not in cache.pending


def test_the_newest_warmup_of_a_thread_replaces_an_older_one(proxied):
    url, cache, standin = proxied
    request(url + "/v1/chat/completions", chat("warm me 1"), KEY_A, warm=True)
    first = wait_for(lambda: warm_requests(standin))[0]
    request(url + "/v1/chat/completions", chat("warm me 2"), KEY_A, warm=True)
    first.wait(10)
    assert first.outcome == "aborted"
    second = wait_for(lambda: warm_requests(standin)[1:])[0]
    assert "warm me 2" in json.dumps(second.body["messages"])


def behind_a_slow_turn(url: str, cache, text: str) -> tuple[int, list[str]]:
    """Thread a's turn "slow" holds the slot; thread b's streamed turn ``text`` is sent meanwhile: its status and
    the data of its events, in order, once a's turn ended too."""
    slow = threading.Thread(target=request, args=(url + "/v1/chat/completions", chat("slow"), KEY_A))
    slow.start()
    wait_for(lambda: cache.turn_holds_slot)
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.request("POST", "/v1/chat/completions", body=json.dumps({**chat(text), "stream": True}),
                 headers={"Content-Type": "application/json", CACHE_HEADER: KEY_B})
    resp = conn.getresponse()
    events = [line[6:] for line in resp.read().decode().splitlines() if line.startswith("data: ")]
    slow.join(30)
    return resp.status, events


def test_a_streamed_turn_behind_another_threads_turn_hears_wait_events_then_its_answer(proxied):
    url, cache, standin = proxied
    standin.add_rule(Reply(text="slow answer", first_token_delay=3.0), when=lambda b: "slow" in json.dumps(b),
                     name="slow")
    status, events = behind_a_slow_turn(url, cache, "mine")
    waits = [e for e in events if e.startswith('{"object": "x.wait"')]
    assert status == 200 and json.loads(waits[0]) == {"object": "x.wait", "reason": "another_turn"}
    assert 2 <= len(waits) <= 4  # the first at once, then every 2 s while the 3 s turn ran
    assert events[:len(waits)] == waits and events[-1] == "[DONE]"
    assert "ok" in "".join(json.loads(e)["choices"][0]["delta"].get("content") or ""
                           for e in events[len(waits):-1] if '"choices"' in e)


def test_a_waiting_streamed_turn_whose_upstream_fails_ends_with_one_error_event(proxied):
    url, cache, standin = proxied
    standin.add_rule(Reply(text="slow answer", first_token_delay=1.0), when=lambda b: "slow" in json.dumps(b))
    standin.add_rule(Reply(status=500, error_message="boom"), when=lambda b: "fails" in json.dumps(b))
    status, events = behind_a_slow_turn(url, cache, "fails")
    assert status == 200 and json.loads(events[0])["object"] == "x.wait"
    assert json.loads(events[-1]) == {"error": {"message": "The model server could not answer.", "code": 500}}
    assert [e for e in events if "error" in e] == events[-1:] and "boom" not in "".join(events)


@pytest.mark.parametrize("path", [
    "/slots/0?action=save&filename=x", "/%73lots/0?action=save&filename=x", "/%2573lots/0?action=save",
    "/v1/../slots/0?action=restore", "//slots/0?action=erase", "/v1/%2e%2e/slots/0?action=save",
    "/./slots/0", "/v1/chat/completions/../../slots/0", "/props", "/v1/embeddings", "/%2Fslots/0",
])
def test_the_proxy_passes_only_its_own_routes_whatever_the_spelling(proxied, path):
    url, cache, standin = proxied
    before = len(standin.requests)
    assert request(url + path, {"filename": "x.bin"})[0] == 404
    get = urllib.request.Request(url + path)
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(get, timeout=10)
    assert refused.value.code == 404
    assert len(standin.requests) == before and not list(cache.directory.glob("x*"))


def test_the_known_routes_pass_decoded(proxied):
    url, cache, standin = proxied
    assert request(url + "/v1/chat/%63ompletions", chat("hi"))[0] == 200
    with urllib.request.urlopen(url + "/v1/models", timeout=10) as resp:
        assert resp.status == 200
    assert [r.path for r in standin.requests][-2:] == ["/v1/chat/completions", "/v1/models"]
    assert slot_cache.clean_path("/v1//chat/./completions?x=1") == "/v1/chat/completions"
    assert slot_cache.clean_path("/%252e%252e/%73lots") == "/slots"


def test_the_webs_warmup_is_queued_by_the_proxy_at_once_even_while_a_turn_streams(proxied, settings, store):
    """``PromptWarmup`` with the bundled model: the proxy takes the prefix and answers 202 at once, though the
    server is still reading it; a socket's turn in flight is no reason to skip it (the proxy lets turns go first)."""
    from app.chat.connection import CompactionWarmup
    from app.extensions import Services
    from app.llm.warmup import PromptWarmup
    from tests.fixtures.celery_worker import seed_turns, thread_id_for

    url, cache, standin = proxied
    bundled = settings.with_overrides(openai_base_url=url + "/v1", bundled_model=True, prompt_warmup="auto")
    services = Services(bundled)
    tid = thread_id_for("warmup queued")
    seed_turns(services.store, tid, 2)
    warmup = PromptWarmup(bundled)
    busy = CompactionWarmup(services, tid, warmup, lambda: True)
    assert busy.run() is True and warmup.sent == 1
    (upstream,) = wait_for(lambda: warm_requests(standin))  # the proxy reads it (and it stalls: still reading)
    assert upstream.outcome is None
    key = thread_cache_key(bundled.secret_key, tid)
    assert cache.warming is not None and cache.warming["key"] == key
    assert [m["role"] for m in upstream.body["messages"]] == ["system", "user", "assistant", "user", "assistant"]
    hosted = settings.with_overrides(openai_base_url=url + "/v1", bundled_model=False, prompt_warmup="on")
    assert PromptWarmup(hosted).queued(tid) is False and warmup.queued(tid) is True
