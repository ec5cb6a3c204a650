"""The bare relay: the floor that ``bench/ws_load.py`` measures the chat's streaming against (docs/benchmarks.md: Performance).

``gunicorn bench.relay_app:app`` serves the real app (``wsgi:app``: the same Flask app, flask-sock,
settings and session cookie) plus one bench-only websocket route, ``/ws/relay``, which does the least a
streaming chat must do: for each ``{"type":"message","text"}`` frame it sends ``start``, asks the model
with the same HTTP client as the app (the ``openai`` SDK's ``with_streaming_response``, read line by
line), forwards each ``choices[*].delta.content`` as its own ``{"type":"delta","text"}`` frame, and sends
``done``.  No memory, no prompt assembly, no turn thread, no accounting, no coalescing.  The bench's
clients drive it exactly as they drive ``/ws/chat``.

Not part of the deployed app: nothing outside ``bench/`` imports this module.
"""

from __future__ import annotations

import json
import uuid

from flask import Blueprint

from app.chat.ws import sock
from app.extensions import services
from app.llm.provider import make_openai_client
from wsgi import app

relay_bp = Blueprint("bench_relay", __name__)


@sock.route("/ws/relay", bp=relay_bp)
def relay_socket(ws):
    """Relay each message's streamed answer, one frame per model delta, until the socket closes."""
    settings = services().settings
    client = make_openai_client(settings)
    while True:
        frame = json.loads(ws.receive())
        message_id = "m_" + uuid.uuid4().hex
        ws.send(json.dumps({"type": "start", "messageId": message_id}))
        with client.chat.completions.with_streaming_response.create(
                model=settings.chat_model, messages=[{"role": "user", "content": frame["text"]}], stream=True,
                stream_options={"include_usage": True}) as response:
            for line in response.iter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                for choice in json.loads(data).get("choices") or ():
                    text = (choice.get("delta") or {}).get("content")
                    if text:
                        ws.send(json.dumps({"type": "delta", "text": text}, ensure_ascii=False))
        ws.send(json.dumps({"type": "done", "status": "completed", "messageId": message_id}))


app.register_blueprint(relay_bp)
