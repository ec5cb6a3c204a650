"""Each thread's prompt cache kept across other threads' turns on the bundled chat server (docs/bundled-model.md: The bundled model).

llama.cpp's chat server (``scripts/model_server.py --role chat``) has one slot: its KV cache holds the tokens of
the previous request only, so when two sessions alternate each turn would read its whole prompt again.  This
module is a small HTTP proxy that the model-server supervisor runs on the public (loopback) port, in front of the
llama.cpp server on an internal loopback port.  A chat request may carry ``X-Model-Cache-Key`` (``CACHE_HEADER``):
64 lowercase hex characters, the web process's HMAC-SHA256 of the thread id under the deployment's secret
(``app.llm.cache_key``; never the raw id).  For one request, under one lock (``SlotCache.lock``, so the steps of
two requests never interleave; every request that uses the slot passes it):

1. restore: when the slot does not already hold this key's state, POST ``/slots/0?action=restore`` with the key's
   file (``<key>.bin``) if it exists; else (a new thread) the *base* state (``base.bin``): the request's system
   prompt alone, which the proxy has the server read (a one-token completion without a key) and saves once per
   system prompt; without a system prompt, an erased slot.  A thread's slot state is therefore only ever built
   from its own requests and the system prompt: no thread can restore, or be computed on, another thread's cache;
2. forward the request, streaming the answer back as it comes (a client that goes away closes the upstream
   connection, so llama.cpp stops generating);
3. save: after an answer with status 200, POST ``/slots/0?action=save`` to the key's file, then drop the least
   recently used files beyond ``max_files`` files or ``max_bytes`` bytes (the base file last).

Requests without a key (the start check) start from the base state (or an erased slot) and are never saved.
``DELETE /cache`` with the header, from loopback only, deletes that key's file (a thread forgot a turn; the
slot is erased when it holds that key; a queued warm-up of that key goes and a running one stops at once, keeping
nothing).  ``GET`` requests (models, health) pass without the lock.  Only the
proxy's own routes (``ROUTES``: chat completions, completions, models, health, ``DELETE /cache``) pass, checked on
the path percent-decoded until stable with ``.``, ``..`` and ``//`` resolved (``clean_path``); anything else,
``/slots`` in any spelling included, answers 404: only this proxy saves and restores, and only into its own
directory (llama.cpp's ``--slot-save-path``, a private directory made for this server's run, mode 0700, removed
when it stops).  Files are KV states, not text; they live only while the server runs.

People first (docs/bundled-model.md: The bundled model):

- a warm-up (``X-Model-Warmup: 1`` with a key; ``app/llm/warmup.py``) is answered 202 at once and queued, the
  newest per key replacing an older one (a running one of that key is preempted).  A runner thread reads it while
  no turn is in the proxy, in steps of ``WARMUP_CHUNK`` tokens (``SlotCache._warm``: the prompt's tokens from
  llama.cpp's ``/apply-template`` and ``/tokenize``, then ever longer prefixes), so that a turn waits for one step
  at most (about 0.5 s here), not for a batch (``LOCAL_MODEL_BATCH``).  A turn (any other request) preempts it at
  once: for the same key the slot keeps what the warm-up read and the turn reads only the rest; for another key
  the part read is saved
  to the warm-up key's file before the turn's restore and the warm-up is queued again (it then reads only the
  rest).  A queued warm-up of a turn's own key is dropped (the turn reads that prompt);
- while a streamed turn waits for the slot behind another turn the proxy answers 200 with an event stream at
  once and sends ``data: {"object": "x.wait", "reason": "another_turn"}`` then, every ``WAIT_EVENT_SECONDS`` at
  most, again, then relays the upstream stream's body (llama.cpp's own events untouched); an upstream failure
  after that is one ``data: {"error": {"message", "code": <HTTP status>}}`` event and the end of the body;
- while any turn is in the proxy the compaction server is paused (``pauser``: ``scripts/cpu_yield.py``).

A failed restore (a file llama.cpp cannot read, e.g. after an upgrade) erases the slot and deletes the file; a
failed save deletes the file: the thread's next turn reads its prompt again, nothing else changes.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import ipaddress
import json
import os
import posixpath
import re
import shutil
import socket
import sys
import tempfile
import threading
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

CACHE_HEADER = "X-Model-Cache-Key"
WARMUP_HEADER = "X-Model-Warmup"  # "1": a prompt warm-up (app/llm/warmup.py), queued and preempted by turns
ROUTES = {  # the only routes passed on (method, decoded path); everything else answers 404
    ("POST", "/v1/chat/completions"), ("POST", "/chat/completions"), ("POST", "/v1/completions"),
    ("POST", "/completions"), ("GET", "/v1/models"), ("GET", "/models"), ("GET", "/health"), ("GET", "/v1/health"),
    ("DELETE", "/cache")}
CHAT_PATHS = ("/v1/chat/completions", "/chat/completions")
KEY_RE = re.compile(r"^[0-9a-f]{64}$")
BASE = "base"
MAX_FILES = 64  # LOCAL_MODEL_SLOT_FILES: slot files kept (threads), the base state included
MAX_MIB = 1024  # LOCAL_MODEL_SLOT_MIB: their total size, MiB
UPSTREAM_TIMEOUT = 600.0  # seconds: the longest answer a request may take on the internal server
WARMUP_CHUNK = 64  # tokens a warm-up reads per step (about 0.5 s here): the longest a preempting turn waits for it
WAIT_EVENT_SECONDS = 2.0  # a streamed turn waiting behind another turn hears an x.wait event at least this often
WAIT_EVENT = b'data: {"object": "x.wait", "reason": "another_turn"}\n\n'
_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "proxy-connection", "te",
        "trailer", "upgrade"}


def slot_dir(parent: str | None = None) -> Path:
    """A new private directory (mode 0700) for one server run's slot files, under ``parent`` (default the
    system's temporary directory; ``LOCAL_MODEL_SLOT_DIR``)."""
    if parent:
        Path(parent).mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix="llama-slots-", dir=parent or None))


@dataclass
class SlotCache:
    """The slot files of one chat server and the state of its one slot.

    Attributes:
        upstream: ``(host, port)`` of the internal llama.cpp server (loopback).
        directory: its ``--slot-save-path`` (one file per key: ``<key>.bin``, and ``base.bin``).
        max_files: most files kept; the least recently used go first (the base file last).
        max_bytes: most bytes kept in all files.
        holder: the key whose state the slot holds now, or None (not known, or a request without a key ran).
        base_digest: sha256 of the system prompt the base state holds (None: no base state).
        events: for tests and logs, ``(action, name)`` of each restore, erase, save and drop, oldest first
            (at most the last 1000).
    """

    upstream: tuple[str, int]
    directory: Path
    max_files: int = MAX_FILES
    max_bytes: int = MAX_MIB * 1024 * 1024
    holder: str | None = None
    base_digest: str | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    events: list = field(default_factory=list)
    pauser: Any = None  # begin()/end() around each turn: the compaction server yields (cpu_yield.Pauser)
    cond: threading.Condition = field(default_factory=threading.Condition)  # guards the warm-up fields below
    pending: dict = field(default_factory=dict)  # key -> request body of the warm-ups not started, oldest first
    warming: dict | None = None  # the running warm-up: {"key", "conn", "by"} ("by": the preempting key, or "")
    turns: int = 0  # turns (requests that are not warm-ups) in the proxy, waiting or running
    stopped: bool = False
    turn_holds_slot: bool = False  # a turn (not a warm-up) holds ``lock`` now
    known: dict = field(default_factory=dict)  # key -> (tokens, exact): what its slot state is known to begin with
    #  (exact: holds those tokens and no more; else it may hold more, e.g. a turn's answer after its prompt)
    batch: int = 128  # the server's n_batch (LOCAL_MODEL_BATCH), tokens
    chunk: int = WARMUP_CHUNK  # tokens read per warm-up step: a preempting turn waits for one step at most
    warmups: list = field(default_factory=list)  # for tests and logs: each warm-up run, as ``warming`` ended
    #  ({"key", "by", "ok", "cache": tokens reused at its start, "read": prompt tokens done when it ended,
    #  "read_when_preempted": ... when a turn or a forget preempted it, "held": tokens the slot then holds exactly
    #  (None: not known), "probed": whether a first request had to find out what the slot held}; last 100)

    def path(self, name: str) -> Path:
        return self.directory / f"{name}.bin"

    def _note(self, action: str, name: str) -> None:
        self.events.append((action, name))
        del self.events[:-1000]

    def _action(self, action: str, name: str | None = None) -> bool:
        """POST ``/slots/0?action=<action>`` to the internal server; True on 200."""
        body = json.dumps({"filename": f"{name}.bin"} if name else {}).encode()
        conn = http.client.HTTPConnection(*self.upstream, timeout=UPSTREAM_TIMEOUT)
        try:
            conn.request("POST", f"/slots/0?action={action}", body=body, headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            resp.read()
            return resp.status == 200
        except (OSError, http.client.HTTPException):
            return False
        finally:
            conn.close()

    def prepare(self, key: str | None, body: bytes = b"") -> None:
        """Step 1 (under ``lock``): make the slot hold ``key``'s state; for a key without a file (a new thread),
        the base state of the request's system prompt; without a key, the base state (or an empty slot)."""
        if key is not None and self.holder == key:
            return
        self.holder = None
        if key is not None and self._restore(key):
            self.holder = key
            return
        if key is not None:
            self.known.pop(key, None)
        system = _system_prompt(body) if key is not None else None
        if system is not None and self.base_digest != _digest(system):
            self.base_digest = None
            if self._action("erase") and self._prime(system) and self._action("save", BASE):
                self._note("save", BASE)
                self.base_digest = _digest(system)
                self.holder = key
                return
        if self._restore(BASE):
            self.holder = key
        elif self._action("erase"):
            self._note("erase", key or BASE)
            self.holder = key

    def _restore(self, name: str) -> bool:
        path = self.path(name)
        if not path.exists():
            return False
        if self._action("restore", name):
            os.utime(path)  # recently used
            self._note("restore", name)
            return True
        path.unlink(missing_ok=True)
        self._note("drop-unreadable", name)
        return False

    def _prime(self, system: str) -> bool:
        """Have the server read ``system`` alone (a one-token chat completion without a key): the base state."""
        body = json.dumps({"messages": [{"role": "system", "content": system}], "max_tokens": 1,
                           "temperature": 0}).encode()
        conn = http.client.HTTPConnection(*self.upstream, timeout=UPSTREAM_TIMEOUT)
        try:
            conn.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            resp.read()
            return resp.status == 200
        except (OSError, http.client.HTTPException):
            return False
        finally:
            conn.close()

    def finish(self, key: str | None, ok: bool, body: bytes | None = None) -> None:
        """Step 3 (under ``lock``): after a whole answer (``ok``) to a request with a key, save the slot as that
        key's file and keep the files within their bounds.  After a request without a key, or a failed one, the
        slot holds no known state (the next request restores).  ``body``: a chat turn's request, whose prompt
        tokens the saved state then begins with (``known``; its answer's tokens follow them)."""
        if key is not None:
            self.known.pop(key, None)
        if key is None or not ok:
            self.holder = None
            return
        if self._action("save", key):
            self._note("save", key)
            self.holder = key
            self.bound(keep=key)
            if body is not None:
                with contextlib.suppress(ValueError, AttributeError, TypeError):
                    tokens = self._prompt_tokens(json.loads(body))
                    if tokens is not None:
                        self.known[key] = (tokens, False)
        else:
            self.path(key).unlink(missing_ok=True)
            self.holder = None

    def bound(self, keep: str = "") -> None:
        """Drop the least recently used files (the base file last, ``keep`` only if it alone is too big) until at
        most ``max_files`` files and ``max_bytes`` bytes remain."""
        files = []
        for path in self.directory.glob("*.bin"):
            try:
                stat = path.stat()
            except OSError:
                continue
            name = path.name[:-4]
            files.append(((name == keep, name == BASE, stat.st_mtime), name, stat.st_size, path))
        files.sort()
        count, total = len(files), sum(size for _, _, size, _ in files)
        for _, name, size, path in files:
            if count <= self.max_files and total <= self.max_bytes:
                break
            path.unlink(missing_ok=True)
            self.known.pop(name, None)
            self._note("drop", name)
            count, total = count - 1, total - size
            if name == BASE:
                self.base_digest = None

    def forget_begins(self, key: str) -> None:
        """A forget of ``key``'s thread is coming (``drop``): its queued warm-up goes and a running one stops now,
        keeping nothing, so the forget does not wait for it.  Call before taking ``lock``."""
        with self.cond:
            self.pending.pop(key, None)
            self._preempt(key, only=key, discard=True)

    def drop(self, key: str) -> None:
        """Delete ``key``'s slot file (a forget in the thread; docs/memory.md: "Forget and provenance"); when the slot
        holds that key's state, erase it.  Call under ``lock``."""
        self.path(key).unlink(missing_ok=True)
        self.known.pop(key, None)
        with self.cond:
            self.pending.pop(key, None)
        if self.holder == key:
            self.holder = None
            self._action("erase")
        self._note("forget", key)

    def close(self) -> None:
        """Remove the directory and every file in it."""
        shutil.rmtree(self.directory, ignore_errors=True)

    # -- warm-ups: queued, newest per thread, run only while no turn is in the proxy, preempted by any turn --------

    def queue_warmup(self, key: str, body: bytes) -> None:
        """Queue a warm-up of ``key`` (replacing a queued older one; a running one of the same key is preempted)."""
        with self.cond:
            self.pending.pop(key, None)
            self.pending[key] = body
            self._preempt(key, only=key)
            self.cond.notify_all()

    def turn_begins(self, key: str | None) -> None:
        """A turn entered the proxy: a running warm-up stops now (its upstream connection is closed, so llama.cpp
        cancels it within one batch); a queued warm-up of the same key is dropped (the turn reads its prompt)."""
        with self.cond:
            self.turns += 1
            if key is not None:
                self.pending.pop(key, None)
            self._preempt(key)
        if self.pauser is not None:
            self.pauser.begin()

    def turn_ends(self) -> None:
        if self.pauser is not None:
            self.pauser.end()
        with self.cond:
            self.turns -= 1
            self.cond.notify_all()

    def _preempt(self, by: str | None, only: str | None = None, discard: bool = False) -> None:
        """(Under ``cond``.) Stop the running warm-up (when ``only``: only a warm-up of that key); ``discard``: a
        forget (nothing of it is kept)."""
        running = self.warming
        if running is None or (running["by"] and not discard) or (only is not None and running["key"] != only):
            return
        running["by"] = by or "-"
        running["discard"] = discard
        running["read_when_preempted"] = running["read"]
        conn = running["conn"]
        if conn is not None and conn.sock is not None:
            with _suppress_os():
                conn.sock.shutdown(socket.SHUT_RDWR)

    def stop(self) -> None:
        """No more warm-ups; the running one is preempted."""
        with self.cond:
            self.stopped = True
            self._preempt(None)
            self.cond.notify_all()

    def run_warmups(self) -> None:
        """The warm-up runner (one thread per proxy, until ``stop``): take the oldest queued warm-up when no turn
        is in the proxy, make the slot hold its key's state, have the server read the prompt (``_warm``, in steps) and
        save it.  When a turn preempts it, the slot holds the part read so far: for the same key the
        turn reads only the rest; for another key the part is saved to the warm-up key's file and the warm-up is
        queued again (it then reads only the rest)."""
        while True:
            with self.cond:
                while not self.stopped and (not self.pending or self.turns):
                    self.cond.wait(1.0)
                if self.stopped:
                    return
                key = next(iter(self.pending))
                body = self.pending.pop(key)
            with self.lock:
                with self.cond:
                    if self.turns or self.stopped:  # a turn came first: it goes first
                        self.pending.setdefault(key, body)
                        continue
                    self.warming = running = {"key": key, "conn": None, "by": "", "discard": False, "ok": False,
                                              "cache": None, "read": 0, "read_when_preempted": None,
                                              "tokens": None, "held": None, "probed": False}
                self._note("warm", key)
                self.prepare(key, body)
                ok = running["ok"] = self._warm(running, body)
                with self.cond:
                    self.warming = None
                    self.warmups.append({k: v for k, v in running.items() if k not in ("conn", "tokens")})
                    del self.warmups[:-100]
                by = running["by"]
                how = "read whole" if ok else ("failed" if not by else "preempted by a turn of " + (
                    "the same thread" if by == key else "another thread"))
                print(f"slot cache proxy: warm-up {key[:8]} {how}: {max(0, running['read'] - (running['cache'] or 0))}"
                      f" tokens read, {running['cache'] or 0} cached", flush=True)
                if ok or not by:
                    self.finish(key, ok)
                    self._learn(key, running if ok else None)
                    continue
                self._note("preempted", key)
                if running["discard"]:  # a forget: nothing of it stays
                    self.holder = None
                    self.known.pop(key, None)
                    self._action("erase")
                    continue
                self.holder = key  # the tokens read before the cancel stay in the slot
                if by != key:  # another thread's turn (or a newer warm-up of this key, or a stop): keep the part
                    self.finish(key, True)
                    with self.cond:
                        if not self.stopped:
                            self.pending.setdefault(key, body)
                self._learn(key, running)

    def _warm(self, running: dict, body: bytes) -> bool:
        """Have the server read a warm-up's prompt; True when it was read whole.

        In steps a turn need not wait for: the prompt's tokens (``_prompt_tokens``); how many of them the slot
        already holds, from ``known`` (the tokens of the key's last turn's prompt, or of its last warm-up) when
        that settles it, else from the first ``prompt_progress`` event of a streamed one-token completion of all
        of them, closed at once when more than ``chunk`` tokens are left (llama.cpp may still read one batch of
        it); then completions of ever longer prefixes (``n_predict`` 0), ``chunk`` tokens more each (after such a
        closed request the first one a batch past the cached part, so that nothing it read is cut off).  A turn
        that preempts the warm-up between two steps waits at most for one step of ``chunk`` tokens, not for a
        batch.  Without the tokens (a server without ``/apply-template`` or ``/tokenize``) the prompt is read as
        one streamed request, which a preempting turn cancels by closing it (llama.cpp stops within one batch)."""
        try:
            payload = json.loads(body)
            tokens = self._prompt_tokens(payload)
            payload.update(stream=True, max_tokens=1, return_progress=True)
            data = json.dumps(payload).encode()
        except (ValueError, AttributeError, TypeError):
            return False
        if tokens is None:
            return self._stream(running, "/v1/chat/completions", data)
        running["tokens"] = tokens
        start = self._cached_prefix(running["key"], tokens)
        running["probed"] = start is None
        if start is not None:
            running["cache"] = running["read"] = start
            done = min(len(tokens), start + self.chunk)
        else:
            probe = json.dumps({"prompt": tokens, "n_predict": 1, "stream": True, "return_progress": True,
                                "cache_prompt": True}).encode()
            if self._stream(running, "/completion", probe, close_after=self.chunk):
                running["held"] = len(tokens)
                return True
            with self.cond:
                if running["by"] or running["cache"] is None:
                    return False
            done = min(len(tokens), running["cache"] + self.batch)
        while True:
            step = json.dumps({"prompt": tokens[:done], "n_predict": 0, "cache_prompt": True}).encode()
            if self._post("/completion", step) is None:
                running["held"] = None
                return False
            with self.cond:
                running["read"] = running["held"] = done
                if done >= len(tokens):
                    return True
                if running["by"]:
                    return False
            done = min(len(tokens), done + self.chunk)

    def _cached_prefix(self, key: str, tokens: list[int]) -> int | None:
        """How many of ``tokens`` the slot (holding ``key``'s state) is known to hold, from ``known``; None
        when that is not known (no record, or the record is a prefix of ``tokens`` that may go on further)."""
        held, exact = self.known.get(key, (None, False))
        if held is None:
            return None
        same = 0
        for ours, theirs in zip(held, tokens, strict=False):
            if ours != theirs:
                break
            same += 1
        return same if exact or same < len(held) else None

    def _learn(self, key: str, running: dict | None) -> None:
        """After a warm-up: its slot state holds exactly the tokens it read in steps (``held``), or is not
        known (a failed warm-up, or one stopped in its first request)."""
        tokens, held = (running.get("tokens"), running.get("held")) if running else (None, None)
        if tokens is not None and held is not None:
            self.known[key] = (tokens[:held], True)
        else:
            self.known.pop(key, None)

    def _prompt_tokens(self, payload: dict) -> list[int] | None:
        """The token ids llama.cpp reads for a chat request's prompt (its ``/apply-template`` then ``/tokenize``,
        special tokens parsed), or None when the server cannot say."""
        template = self._post("/apply-template", json.dumps(payload).encode())
        if not isinstance(template, dict) or not isinstance(template.get("prompt"), str):
            return None
        answer = self._post("/tokenize", json.dumps({"content": template["prompt"], "parse_special": True}).encode())
        tokens = answer.get("tokens") if isinstance(answer, dict) else None
        if not isinstance(tokens, list) or not tokens or not all(isinstance(t, int) for t in tokens):
            return None
        return tokens

    def _post(self, path: str, data: bytes) -> Any:
        """POST JSON to the internal server; its parsed answer on 200, else None."""
        conn = http.client.HTTPConnection(*self.upstream, timeout=UPSTREAM_TIMEOUT)
        try:
            conn.request("POST", path, body=data, headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            raw = resp.read()
            return json.loads(raw) if resp.status == 200 else None
        except (OSError, http.client.HTTPException, ValueError):
            return None
        finally:
            conn.close()

    def _stream(self, running: dict, path: str, data: bytes, close_after: int | None = None) -> bool:
        """Forward a streamed one-token request, noting llama.cpp's ``prompt_progress`` in ``running`` (``cache``:
        tokens reused at its start; ``read``: prompt tokens done); True when it ended whole.  ``close_after``:
        close it after the first progress event when more than that many tokens are left to read."""
        conn = http.client.HTTPConnection(*self.upstream, timeout=UPSTREAM_TIMEOUT)
        try:
            conn.connect()
            with self.cond:
                running["conn"] = conn
                if running["by"]:
                    return False
            conn.request("POST", path, body=data, headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            pending = b""
            done = False
            while chunk := resp.read1(65536):
                *lines, pending = (pending + chunk).split(b"\n")
                for line in lines:
                    done = done or line.strip() == b"data: [DONE]" or b'"stop":true' in line.replace(b" ", b"")
                    if b'"prompt_progress"' in line:  # llama.cpp's, one per batch: how far it has read
                        with contextlib.suppress(ValueError, AttributeError, TypeError, KeyError):
                            progress = json.loads(line.removeprefix(b"data: "))["prompt_progress"]
                            if running["cache"] is None:
                                running["cache"] = int(progress.get("cache", 0))
                            running["read"] = int(progress["processed"])
                            if close_after is not None and int(progress["total"]) - running["read"] > close_after:
                                return False
            return resp.status == 200 and done
        except (OSError, http.client.HTTPException):
            return False
        finally:
            with self.cond:
                running["conn"] = None
            conn.close()


class _suppress_os:
    def __enter__(self):
        return self

    def __exit__(self, kind, _value, _tb):
        return kind is not None and issubclass(kind, OSError)


def clean_path(raw: str) -> str:
    """A request target's path, percent-decoded until it no longer changes, with ``.``, ``..`` and repeated
    slashes resolved (``"/%73lots/0?x"`` -> ``"/slots/0"``, ``"/v1//../slots"`` -> ``"/slots"``); the query is
    dropped.  Only what this gives is checked against ``ROUTES`` and sent upstream."""
    path = urllib.parse.urlsplit(raw).path if raw.startswith("/") else "/" + raw
    for _ in range(8):
        decoded = urllib.parse.unquote(path)
        if decoded == path:
            break
        path = decoded
    path = posixpath.normpath("/" + path.split("?", 1)[0].split("#", 1)[0])
    return "/" + path.lstrip("/")


def _system_prompt(body: bytes) -> str | None:
    """The text of a chat request's first message when it is a system message with text, else None."""
    try:
        messages = json.loads(body).get("messages")
        first = messages[0]
    except (ValueError, AttributeError, TypeError, IndexError, KeyError):
        return None
    if isinstance(first, dict) and first.get("role") == "system" and isinstance(first.get("content"), str):
        return first["content"]
    return None


def _loopback(address: str) -> bool:
    """True for a loopback peer address (127.0.0.0/8, ::1, or an IPv4-mapped loopback)."""
    try:
        return ipaddress.ip_address(address.removeprefix("::ffff:")).is_loopback
    except ValueError:
        return False


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def make_proxy(cache: SlotCache, host: str, port: int) -> ThreadingHTTPServer:
    """The proxy's HTTP server on ``host:port`` (not yet serving: call ``serve_forever`` in a thread)."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *_args):
            pass

        def _reply(self, status: int, message: str) -> None:
            body = json.dumps({"error": {"code": status, "message": message, "type": "proxy_error"}}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _forward(self, method: str, path: str, body: bytes | None, waited: bool = False) -> bool:
            """Send the request upstream and its answer back; True when the answer was 200 and went out whole.
            ``waited``: the 200 status and the event-stream headers already went out (with ``x.wait`` events):
            relay only the body, and an upstream failure as one ``error`` event."""
            headers = {k: v for k, v in self.headers.items()
                       if k.lower() not in _HOP and k not in (CACHE_HEADER, WARMUP_HEADER)}
            conn = http.client.HTTPConnection(*cache.upstream, timeout=UPSTREAM_TIMEOUT)
            try:
                try:
                    conn.request(method, path, body=body, headers=headers)
                    resp = conn.getresponse()
                except (OSError, http.client.HTTPException):
                    if waited:
                        return self._sse_error(503, "The model server is not available.")
                    self._reply(503, "The model server is not available.")
                    return False
                if waited and resp.status != 200:
                    resp.read()
                    return self._sse_error(resp.status, "The model server could not answer.")
                if not waited:
                    self.send_response(resp.status)
                    for name, value in resp.getheaders():
                        if name.lower() not in _HOP:
                            self.send_header(name, value)
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                try:
                    while chunk := resp.read1(65536):
                        self._chunk(chunk)
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                except (OSError, http.client.HTTPException):
                    self.close_connection = True  # the client went away (or upstream broke): stop upstream too
                    return False
                return resp.status == 200
            finally:
                conn.close()

        def _chunk(self, data: bytes) -> None:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        def _sse_error(self, status: int, message: str) -> bool:
            with _suppress_os():
                self._chunk(b"data: " + json.dumps({"error": {"message": message, "code": status}}).encode()
                            + b"\n\n")
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            self.close_connection = True
            return False

        def _wait_for_slot(self, streamed: bool) -> bool | None:
            """Take ``cache.lock``.  A streamed turn that finds it held by another turn first answers 200 with an
            event stream and sends ``data: {"object": "x.wait", "reason": "another_turn"}`` at once and every
            ``WAIT_EVENT_SECONDS`` until the lock is its own.  Returns whether the headers went out (None: the
            client went away while waiting; the lock is not held)."""
            if cache.lock.acquire(blocking=False):
                return False
            if not streamed:
                cache.lock.acquire()
                return False
            started = False
            while True:
                if not started and cache.turn_holds_slot:  # (a warm-up or a save gives the slot up at once)
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Cache-Control", "no-cache")
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    started = True
                if started:
                    try:
                        self._chunk(WAIT_EVENT)
                    except OSError:
                        self.close_connection = True
                        return None
                if cache.lock.acquire(timeout=WAIT_EVENT_SECONDS if started else 0.05):
                    return started

        def do_GET(self):
            path = clean_path(self.path)
            if ("GET", path) not in ROUTES:
                return self._reply(404, "Not found.")
            self._forward("GET", path, None)

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            path = clean_path(self.path)
            if ("POST", path) not in ROUTES:
                return self._reply(404, "Not found.")
            key = self.headers.get(CACHE_HEADER)
            if key is not None and not KEY_RE.match(key):
                return self._reply(400, f"{CACHE_HEADER} must be 64 lowercase hex characters.")
            if self.headers.get(WARMUP_HEADER) == "1":
                if key is None or path not in CHAT_PATHS:
                    return self._reply(400, f"A warm-up is a chat completion with {CACHE_HEADER}.")
                cache.queue_warmup(key, body)
                answer = json.dumps({"object": "x.warmup", "status": "queued"}).encode()
                self.send_response(202)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)
                return
            try:
                streamed = json.loads(body).get("stream") is True
            except (ValueError, AttributeError):
                streamed = False
            cache.turn_begins(key)
            try:
                waited = self._wait_for_slot(streamed)
                if waited is None:
                    return
                cache.turn_holds_slot = True
                try:
                    cache.prepare(key, body)
                    ok = self._forward("POST", path, body, waited=waited)
                    cache.finish(key, ok, body if path in CHAT_PATHS else None)
                finally:
                    cache.turn_holds_slot = False
                    cache.lock.release()
            finally:
                cache.turn_ends()

        def do_DELETE(self):
            # DELETE /cache with the key's header: drop that thread's slot file.  Loopback only (the web
            # processes run beside the model server); anything else is refused.
            if ("DELETE", clean_path(self.path)) not in ROUTES:
                return self._reply(404, "Not found.")
            if not _loopback(self.client_address[0]):
                return self._reply(403, "Only from this machine.")
            key = self.headers.get(CACHE_HEADER)
            if key is None or not KEY_RE.match(key):
                return self._reply(400, f"{CACHE_HEADER} must be 64 lowercase hex characters.")
            cache.forget_begins(key)
            with cache.lock:
                cache.drop(key)
            self.send_response(204)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_PUT(self):
            self._reply(404, "Not found.")

        do_PATCH = do_HEAD = do_OPTIONS = do_PUT

    server = _QuietServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=cache.run_warmups, name="slot-warmups", daemon=True).start()
    return server


class _QuietServer(ThreadingHTTPServer):
    """A client that goes away mid-request (a cancelled turn, a reset connection) is normal here: one line on
    stderr for anything else, never a traceback per request."""

    def handle_error(self, request, client_address):
        kind = sys.exc_info()[0]
        if kind is not None and issubclass(kind, (ConnectionError, TimeoutError)):
            return
        print(f"slot cache proxy: request failed ({kind.__name__ if kind else 'unknown'})", file=sys.stderr)
