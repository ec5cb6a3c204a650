"""An OpenAI-compatible model server whose streams end early: ``python -m tests.cut_model --port N``.

A real HTTP server process (``http.server``, HTTP/1.0: a body ends when the connection closes,
as with many proxies and small servers), for the tests of answers that never finish
(``tests/test_deployed_stream.py``).  ``POST /v1/chat/completions`` with ``"stream": true``
answers ``"Echo:"`` then `` t1``, `` t2``, ... (``--tokens`` pieces in all, one event each, every
``--delay`` seconds).  What the last user message says decides how the stream ends:

- ``[cut N]``: after N pieces the connection is closed: no ``finish_reason``, no ``data: [DONE]``;
- ``[hang N]``: after N pieces nothing more is sent (the test kills the process meanwhile);
- ``[nodone N]``: N pieces and a ``finish_reason`` of ``stop``, then the connection is closed
  without ``data: [DONE]`` (a whole answer all the same);
- otherwise: every piece, a ``finish_reason`` of ``stop``, then ``data: [DONE]``.

``GET /v1/models`` answers one model (the app's health probe).  One line
``cut_model listening on <port>`` is printed once the port is bound.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PLAN = re.compile(r"\[(cut|hang|nodone) (\d+)\]")


def pieces(count: int) -> list[str]:
    """The answer's pieces: ``"Echo:"``, ``" t1"``, ``" t2"``, ... (``count`` in all)."""
    return ["Echo:"] + [f" t{n}" for n in range(1, count)]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"
    tokens = 40
    delay = 0.01

    def log_message(self, *_args) -> None:  # quiet
        pass

    def _json(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path.rstrip("/").endswith("/models"):
            self._json(200, {"object": "list", "data": [{"id": "cut-model", "object": "model"}]})
        else:
            self._json(404, {"error": {"message": "not found"}})

    def _event(self, payload: str) -> None:
        self.wfile.write(f"data: {payload}\n\n".encode())
        self.wfile.flush()

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        if not self.path.rstrip("/").endswith("/chat/completions") or not body.get("stream"):
            self._json(404, {"error": {"message": "only streamed chat completions"}})
            return
        users = [m.get("content") or "" for m in body.get("messages", []) if m.get("role") == "user"]
        found = PLAN.search(users[-1] if users else "")
        action, at = (found.group(1), int(found.group(2))) if found else (None, self.tokens)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()  # no Content-Length, no chunking: the body ends when the connection closes

        def chunk(delta: dict, finish: str | None = None) -> str:
            return json.dumps({"id": "cut-1", "object": "chat.completion.chunk", "created": int(time.time()),
                               "model": body.get("model", "cut-model"),
                               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})

        self._event(chunk({"role": "assistant", "content": ""}))
        for piece in pieces(self.tokens)[:at]:
            self._event(chunk({"content": piece}))
            time.sleep(self.delay)
        if action == "cut":
            return  # the handler returns: HTTP/1.0 closes the connection
        if action == "hang":
            while True:
                time.sleep(60)
        self._event(chunk({}, "stop"))
        if action != "nodone":
            self._event("[DONE]")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--tokens", type=int, default=40)
    parser.add_argument("--delay", type=float, default=0.01, help="seconds between two pieces")
    args = parser.parse_args(argv)
    Handler.tokens, Handler.delay = args.tokens, args.delay
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    print(f"cut_model listening on {args.port}", flush=True)
    try:
        server.serve_forever(poll_interval=0.1)
    finally:
        server.server_close()


if __name__ == "__main__":
    sys.exit(main())
