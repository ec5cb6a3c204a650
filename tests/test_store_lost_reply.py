"""A memory-changing script whose reply is lost (docs/contract.md: the done frame; README: Budgets, honest outcomes).

Between the store and the real test Redis runs a TCP proxy that, once armed, lets the next script (``EVALSHA``)
through and closes the connection instead of returning its reply, or drops the script before Redis sees it.  The
store never sends the script again: it settles the outcome by reading the thread back."""

from __future__ import annotations

import socket
import threading
from urllib.parse import urlparse

import pytest

from app.memory.final_turn import FinalTurn
from app.store.redis_client import make_redis
from app.store.thread_store import StoreUnavailable, ThreadStore
from tests.fixtures.memory_data import new_thread_id


class LossyProxy:
    """Forwards TCP to Redis; ``arm("reply")`` loses the reply of the next script, ``arm("command")`` the script."""

    def __init__(self, host: str, port: int):
        self.upstream = (host, port)
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.mode: str | None = None
        self.lock = threading.Lock()
        self.scripts_sent = 0  # scripts that reached Redis through the proxy
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self, mode: str) -> None:
        with self.lock:
            self.mode = mode

    def _take(self, data: bytes) -> str | None:
        with self.lock:
            if self.mode is None or b"EVALSHA" not in data.upper():
                return None
            mode, self.mode = self.mode, None
            return mode

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.upstream)
            state = {"kill_on_reply": False}
            threading.Thread(target=self._up, args=(client, upstream, state), daemon=True).start()
            threading.Thread(target=self._down, args=(client, upstream, state), daemon=True).start()

    def _up(self, client: socket.socket, upstream: socket.socket, state: dict) -> None:
        try:
            while data := client.recv(65536):
                mode = self._take(data)
                if mode == "command":
                    break
                if b"EVALSHA" in data.upper():
                    self.scripts_sent += 1
                state["kill_on_reply"] = mode == "reply"
                upstream.sendall(data)
        except OSError:
            pass
        _close(client, upstream)

    def _down(self, client: socket.socket, upstream: socket.socket, state: dict) -> None:
        try:
            while data := upstream.recv(65536):
                if state["kill_on_reply"]:
                    break
                client.sendall(data)
        except OSError:
            pass
        _close(client, upstream)

    def close(self) -> None:
        self.server.close()


def _close(*socks: socket.socket) -> None:
    for s in socks:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        s.close()


@pytest.fixture
def lossy(settings):
    url = urlparse(settings.redis_url)
    proxy = LossyProxy(url.hostname or "127.0.0.1", url.port or 6379)
    proxied = settings.redis_url.replace(f"{url.hostname}:{url.port}", f"127.0.0.1:{proxy.port}")
    client = make_redis(proxied, socket_timeout=2.0)
    yield proxy, ThreadStore(client, settings.limits, settings.memory_ttl_seconds)
    client.close()
    proxy.close()


def test_a_commit_whose_reply_is_lost_is_settled_as_written_and_sent_once(lossy, store):
    proxy, lossy_store = lossy
    lossy_store.commit_final_turn(new_thread_id(), FinalTurn("warm the script cache", "ok"))  # EVALSHA now loads
    tid = new_thread_id()
    lossy_store.commit_final_turn(tid, FinalTurn("first", "one"))
    sent = proxy.scripts_sent
    proxy.arm("reply")
    result = lossy_store.commit_final_turn(tid, FinalTurn("My locker is 4471.", "Noted."))
    assert (result.appended, result.settled) == (True, True)
    assert proxy.scripts_sent == sent + 1  # never sent again
    assert [m.text for m in store.load(tid).messages] == ["first", "one", "My locker is 4471.", "Noted."]


def test_a_commit_lost_before_redis_saw_it_is_reported_as_not_saved(lossy, store):
    proxy, lossy_store = lossy
    lossy_store.commit_final_turn(new_thread_id(), FinalTurn("warm the script cache", "ok"))
    tid = new_thread_id()
    lossy_store.commit_final_turn(tid, FinalTurn("first", "one"))
    proxy.arm("command")
    with pytest.raises(StoreUnavailable):
        lossy_store.commit_final_turn(tid, FinalTurn("My locker is 4471.", "Noted."))
    assert [m.text for m in store.load(tid).messages] == ["first", "one"]


def test_a_fold_whose_reply_is_lost_is_settled_as_applied_and_a_second_try_is_stale(lossy, store):
    from tests.fixtures.memory_data import CREATED, text_record

    proxy, lossy_store = lossy
    threads = [new_thread_id(), new_thread_id()]
    for tid in threads:
        for n in range(1, 6):
            lossy_store.commit_final_turn(tid, FinalTurn(f"person {n}", f"answer {n}"))
    warm, tid = threads  # a first fold loads the script (a lost NOSCRIPT reply would mean nothing ran)
    warm_state = store.load(warm)
    assert lossy_store.apply_compaction(warm, expected_gen=warm_state.gen, folded_ids=[m.id for m in warm_state.messages[:2]],
                                        record=text_record("x"), notes=[], compacted_at=CREATED).outcome == "applied"
    state = store.load(tid)
    folded = [m.id for m in state.messages[:2]]
    proxy.arm("reply")
    first = lossy_store.apply_compaction(tid, expected_gen=state.gen, folded_ids=folded,
                                         record=text_record("They met."), notes=[], compacted_at=CREATED)
    assert first.outcome == "applied"
    after = store.load(tid)
    assert [m.text for m in after.messages][0] == "person 2" and after.gen == state.gen + 1
    again = lossy_store.apply_compaction(tid, expected_gen=state.gen, folded_ids=folded,
                                         record=text_record("They met."), notes=[], compacted_at=CREATED)
    assert again.outcome == "stale" and len(store.load(tid).messages) == 8
