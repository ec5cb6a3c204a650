"""Nothing waits behind a warm-up, and no prefix is read twice, with the real bundled model (docs/bundled-model.md;
``scripts/slot_cache.py``).

llama.cpp's chat server runs for real (``scripts/model_server.py child``, the settings of ``--role chat``: batches of
``LOCAL_MODEL_BATCH`` tokens) behind the slot proxy, served in this process so the test can read the proxy's
record of each warm-up (how far llama.cpp said it had read, from its ``prompt_progress`` events).  A thread's
~2,000-token prompt is warmed; a turn sent once the server has read part of it starts at once: the server stops
reading the warm-up (it reads in steps of ``WARMUP_CHUNK`` tokens and stops after the step under way), and what it
read is never read again — by the same thread's turn (which finds it in the slot) nor by the warm-up resumed after
another thread's turn.  What is
compared is llama.cpp's own ``timings`` (``prompt_n``: tokens read, ``cache_n``: tokens reused) and the order of
events, never wall-clock.
"""

from __future__ import annotations

import http.client
import json
import random
import subprocess
import threading
import time

import pytest

from app.llm.cache_key import CACHE_HEADER, thread_cache_key
from chat_support.servers import free_ports
from scripts import slot_cache
from tests.fixtures.lanes import starts_processes

SECRET = "s" * 64
SYSTEM = "You are a helpful assistant. Answer briefly."
WORDS = ("harbour lantern orchard violin granite meadow ledger copper thistle canyon pepper wool compass marble "
         "saffron glacier ribbon tunnel walnut beacon").split()


def conversation(seed: int, turns: int = 24) -> list[dict]:
    """A system prompt and ``turns`` user/assistant pairs of plain sentences (about 2,000 tokens in all)."""
    rng = random.Random(seed)
    messages = [{"role": "system", "content": SYSTEM}]
    for n in range(turns):
        noted = " ".join(rng.choice(WORDS) for _ in range(18))
        messages.append({"role": "user", "content": f"On day {n} I walked past the {rng.choice(WORDS)} and noted: "
                                                     f"{noted}. Please keep it in mind."})
        messages.append({"role": "assistant", "content": f"Noted for day {n}: {rng.choice(WORDS)} and "
                                                          f"{rng.choice(WORDS)}, among {len(noted.split())} words."})
    return messages


@pytest.fixture(scope="module")
@starts_processes()
def real(tmp_path_factory):
    """``(host, port, SlotCache)``: the proxy in this process before the real llama.cpp chat server."""
    from scripts import local_model, model_server

    tmp = tmp_path_factory.mktemp("warm")
    directory = slot_cache.slot_dir(str(tmp))
    internal, public = free_ports(2)
    log = open(tmp / "model.log", "w")
    proc = subprocess.Popen(model_server.child_argv(local_model.fetch(), "127.0.0.1", internal, "chat",
                                                    str(directory)), stdout=log, stderr=subprocess.STDOUT)
    cache = server = None
    try:
        model_server.start_check(proc, f"http://127.0.0.1:{internal}/v1", load_timeout=240,
                                 stopping=threading.Event(), completion_timeout=240)
        cache = slot_cache.SlotCache(("127.0.0.1", internal), directory)
        server = slot_cache.make_proxy(cache, "127.0.0.1", public)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        yield "127.0.0.1", public, cache
    finally:
        if cache is not None:
            cache.stop()
        if server is not None:
            server.shutdown()
            server.server_close()
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def send(real, messages: list[dict], key: str, *, warm: bool = False, max_tokens: int = 4) -> dict:
    """A streamed chat request through the proxy; returns ``{"status", "timings", "text", "events"}`` (for a
    warm-up: the proxy's answer)."""
    host, port, _cache = real
    conn = http.client.HTTPConnection(host, port, timeout=600)
    body = {"messages": messages, "stream": not warm, "max_tokens": max_tokens, "temperature": 0, "seed": 7}
    headers = {"Content-Type": "application/json", CACHE_HEADER: key, **({"X-Model-Warmup": "1"} if warm else {})}
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body), headers=headers)
    resp = conn.getresponse()
    raw = resp.read().decode()
    conn.close()
    if warm:
        return {"status": resp.status, "answer": json.loads(raw)}
    events = [json.loads(line[6:]) for line in raw.splitlines()
              if line.startswith("data: ") and line[6:].strip() != "[DONE]"]
    timings = next((e["timings"] for e in reversed(events) if "timings" in e), None)
    text = "".join((c.get("delta") or {}).get("content") or "" for e in events for c in e.get("choices") or [])
    return {"status": resp.status, "timings": timings, "text": text, "events": events}


def wait_until_read(cache: slot_cache.SlotCache, key: str, tokens: int, timeout: float = 300) -> dict:
    """The running warm-up of ``key`` once llama.cpp said it had read at least ``tokens`` prompt tokens."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        running = cache.warming
        if running is not None and running["key"] == key and running["read"] >= tokens:
            return running
        time.sleep(0.01)
    raise AssertionError(f"the warm-up did not read {tokens} tokens: {cache.warmups}")


@pytest.mark.timeout(900)
def test_a_turn_preempts_its_threads_warmup_and_reads_only_what_the_warmup_had_not(real):
    _host, _port, cache = real
    key = thread_cache_key(SECRET, "thread-same")
    prefix = conversation(1)
    assert send(real, prefix, key, warm=True)["status"] == 202
    wait_until_read(cache, key, 256)  # at least one batch read, far from the end
    turn = send(real, prefix + [{"role": "user", "content": "What did I note on day 3?"}], key)
    assert turn["status"] == 200 and turn["text"]
    (run,) = [w for w in cache.warmups if w["key"] == key]
    total = turn["timings"]["prompt_n"] + turn["timings"]["cache_n"]
    print(f"same thread: prompt {total} tokens; warm-up read {run['read']} before the turn; the turn read "
          f"{turn['timings']['prompt_n']}, reused {turn['timings']['cache_n']}")
    assert total > 1500  # a realistic prompt (about 2,000 tokens)
    assert run["by"] == key and run["ok"] is False  # preempted by the turn ...
    assert 256 <= run["read"] < total - 300  # ... far from the end of its prefix: the turn did not wait for it
    # the warm-up reads in steps of WARMUP_CHUNK tokens: the turn waited for the end of one step, never a batch
    assert 0 <= run["read"] - run["read_when_preempted"] <= slot_cache.WARMUP_CHUNK
    # the turn found what the warm-up had read in the slot (no older file restored over it) and read only the rest
    assert turn["timings"]["cache_n"] >= run["read"]
    assert turn["timings"]["prompt_n"] <= total - run["read"]
    assert ("restore", key) not in cache.events


@pytest.mark.timeout(900)
def test_another_threads_turn_preempts_a_warmup_which_resumes_after_it_from_where_it_stopped(real):
    _host, _port, cache = real
    key_a, key_b = thread_cache_key(SECRET, "thread-warm"), thread_cache_key(SECRET, "thread-other")
    prefix = conversation(2)
    before = len(cache.warmups)
    assert send(real, prefix, key_a, warm=True)["status"] == 202
    wait_until_read(cache, key_a, 256)
    other = send(real, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Say hello."}], key_b)
    assert other["status"] == 200 and other["text"]
    first = cache.warmups[before]
    assert first["key"] == key_a and first["by"] == key_b and first["ok"] is False
    assert 0 <= first["read"] - first["read_when_preempted"] <= slot_cache.WARMUP_CHUNK
    # the warm-up resumes after the turn, from the part it had read (restored from its file), and ends
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and not [w for w in cache.warmups[before + 1:] if w["ok"]]:
        time.sleep(0.05)
    (resumed,) = [w for w in cache.warmups[before + 1:] if w["key"] == key_a]
    print(f"other thread: warm-up read {first['read']} before b's turn; resumed reusing {resumed['cache']}, "
          f"read {resumed['read']}")
    assert resumed["ok"] is True and resumed["cache"] >= first["read"]
    events = cache.events
    b_saved = events.index(("save", key_b))
    assert events.index(("save", key_a)) < events.index(("restore", key_b)) if ("restore", key_b) in events \
        else True  # (b is a new thread: it starts from the base state)
    assert b_saved < len(events) - 1 - events[::-1].index(("restore", key_a))  # resumed after b's turn
    # the thread's next turn reuses the whole warmed prefix
    turn = send(real, prefix + [{"role": "user", "content": "What did I note on day 5?"}], key_a)
    assert turn["timings"]["cache_n"] >= turn["timings"]["prompt_n"] + turn["timings"]["cache_n"] - 40


@pytest.mark.timeout(900)
def test_a_rebuilt_prefix_is_warmed_from_what_the_threads_last_turn_left_without_a_first_batch(real):
    """After a turn the proxy knows the tokens its prompt left in the slot; a warm-up of a prompt that differs
    early (a fold rebuilt the record) starts reading at the first different token in steps at once, with no first
    request of a whole batch to find that out, so a turn even at its very start waits for one step at most."""
    _host, _port, cache = real
    key = thread_cache_key(SECRET, "thread-rebuilt")
    before = conversation(3, turns=6)
    turn = send(real, before + [{"role": "user", "content": "What did I note on day 2?"}], key)
    assert turn["status"] == 200
    rebuilt = [{"role": "system", "content": SYSTEM + " The record: the person walks daily."}] + conversation(4)[1:]
    first = len(cache.warmups)
    assert send(real, rebuilt, key, warm=True)["status"] == 202
    wait_until_read(cache, key, 64)
    again = send(real, rebuilt + [{"role": "user", "content": "What did I note on day 1?"}], key)
    assert again["status"] == 200
    (run,) = [w for w in cache.warmups[first:] if w["key"] == key]
    total = again["timings"]["prompt_n"] + again["timings"]["cache_n"]
    print(f"rebuilt prefix: the warm-up started at token {run['cache']} without a probe: {not run['probed']}; "
          f"read {run['read']} of {total}; the turn reused {again['timings']['cache_n']}")
    assert run["probed"] is False and run["by"] == key
    assert 0 < run["cache"] < 40  # the first token after the system prompt's unchanged start
    assert 0 <= run["read"] - run["read_when_preempted"] <= slot_cache.WARMUP_CHUNK
    assert again["timings"]["cache_n"] >= run["read"]
