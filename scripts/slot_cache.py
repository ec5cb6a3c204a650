"""Each thread's prompt cache kept across other threads' turns on the bundled chat server (README: The bundled model).

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
slot is erased when it holds that key).  ``GET`` requests (models, health) pass without the lock.  Paths under ``/slots`` are refused (403): only this
proxy saves and restores, and only into its own directory (llama.cpp's ``--slot-save-path``, a private
directory made for this server's run, mode 0700, removed when it stops).  Files are KV states, not text; they
live only while the server runs.

A failed restore (a file llama.cpp cannot read, e.g. after an upgrade) erases the slot and deletes the file; a
failed save deletes the file: the thread's next turn reads its prompt again, nothing else changes.
"""

from __future__ import annotations

import hashlib
import http.client
import ipaddress
import json
import sys
import os
import re
import shutil
import tempfile
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

CACHE_HEADER = "X-Model-Cache-Key"
KEY_RE = re.compile(r"^[0-9a-f]{64}$")
BASE = "base"
MAX_FILES = 64  # LOCAL_MODEL_SLOT_FILES: slot files kept (threads), the base state included
MAX_MIB = 1024  # LOCAL_MODEL_SLOT_MIB: their total size, MiB
UPSTREAM_TIMEOUT = 600.0  # seconds: the longest answer a request may take on the internal server
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

    def finish(self, key: str | None, ok: bool) -> None:
        """Step 3 (under ``lock``): after a whole answer (``ok``) to a request with a key, save the slot as that
        key's file and keep the files within their bounds.  After a request without a key, or a failed one, the
        slot holds no known state (the next request restores)."""
        if key is None or not ok:
            self.holder = None
            return
        if self._action("save", key):
            self._note("save", key)
            self.holder = key
            self.bound(keep=key)
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
            self._note("drop", name)
            count, total = count - 1, total - size
            if name == BASE:
                self.base_digest = None

    def drop(self, key: str) -> None:
        """Delete ``key``'s slot file (a forget in the thread; README: "Forget and provenance"); when the slot
        holds that key's state, erase it.  Call under ``lock``."""
        self.path(key).unlink(missing_ok=True)
        if self.holder == key:
            self.holder = None
            self._action("erase")
        self._note("forget", key)

    def close(self) -> None:
        """Remove the directory and every file in it."""
        shutil.rmtree(self.directory, ignore_errors=True)


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

        def _forward(self, method: str, body: bytes | None) -> bool:
            """Send the request upstream and its answer back; True when the answer was 200 and went out whole."""
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP and k != CACHE_HEADER}
            conn = http.client.HTTPConnection(*cache.upstream, timeout=UPSTREAM_TIMEOUT)
            try:
                try:
                    conn.request(method, self.path, body=body, headers=headers)
                    resp = conn.getresponse()
                except (OSError, http.client.HTTPException):
                    self._reply(503, "The model server is not available.")
                    return False
                self.send_response(resp.status)
                for name, value in resp.getheaders():
                    if name.lower() not in _HOP:
                        self.send_header(name, value)
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                try:
                    while chunk := resp.read1(65536):
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                        self.wfile.flush()
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                except (OSError, http.client.HTTPException):
                    self.close_connection = True  # the client went away (or upstream broke): stop upstream too
                    return False
                return resp.status == 200
            finally:
                conn.close()

        def do_GET(self):
            if self.path.startswith("/slots"):
                return self._reply(403, "Slots are managed by the proxy.")
            self._forward("GET", None)

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path.startswith("/slots"):
                return self._reply(403, "Slots are managed by the proxy.")
            key = self.headers.get(CACHE_HEADER)
            if key is not None and not KEY_RE.match(key):
                return self._reply(400, f"{CACHE_HEADER} must be 64 lowercase hex characters.")
            with cache.lock:
                cache.prepare(key, body)
                ok = self._forward("POST", body)
                cache.finish(key, ok)

        def do_DELETE(self):
            # DELETE /cache with the key's header: drop that thread's slot file.  Loopback only (the web
            # processes run beside the model server); anything else is refused.
            if self.path != "/cache":
                return self._reply(404, "Not found.")
            if not _loopback(self.client_address[0]):
                return self._reply(403, "Only from this machine.")
            key = self.headers.get(CACHE_HEADER)
            if key is None or not KEY_RE.match(key):
                return self._reply(400, f"{CACHE_HEADER} must be 64 lowercase hex characters.")
            with cache.lock:
                cache.drop(key)
            self.send_response(204)
            self.send_header("Content-Length", "0")
            self.end_headers()

    server = _QuietServer((host, port), Handler)
    server.daemon_threads = True
    return server


class _QuietServer(ThreadingHTTPServer):
    """A client that goes away mid-request (a cancelled turn, a reset connection) is normal here: one line on
    stderr for anything else, never a traceback per request."""

    def handle_error(self, request, client_address):
        kind = sys.exc_info()[0]
        if kind is not None and issubclass(kind, (ConnectionError, TimeoutError)):
            return
        print(f"slot cache proxy: request failed ({kind.__name__ if kind else 'unknown'})", file=sys.stderr)
