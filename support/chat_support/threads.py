"""Threads for tests and benchmarks: valid thread ids, the default conversation's texts, and a thread's compaction
history as the store holds it (``app.store.keys.ThreadKeys``).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

WORDS = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
         "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen", "twenty"]


def thread_id_for(name: str) -> str:
    """A valid thread id (``chat:`` + 64 hex) derived from ``name``."""
    return "chat:" + hashlib.sha256(name.encode()).hexdigest()


def user_text(n: int) -> str:
    """Turn ``n``'s user text: small talk without any extractable fact (lower case, no digits)."""
    return f"tell me something nice about the number {WORDS[(n - 1) % len(WORDS)]} please"


ANSWER_TAIL = (" people have liked it for a very long time, it shows up in songs and games, and it is easy to "
               "remember when you count things on your fingers with friends, or when you sing along to an old tune "
               "on a quiet evening")


def assistant_text(n: int) -> str:
    """Turn ``n``'s assistant text (no extractable fact; long enough that folding it frees tokens)."""
    return f"the number {WORDS[(n - 1) % len(WORDS)]} is a lovely number indeed," + ANSWER_TAIL


def history(client: Any, thread_id: str) -> list[dict]:
    """The compaction history of a thread, newest first: the JSON entries of its ``compactions`` list, read with
    ``client`` (a redis-py client, or a cluster client)."""
    from app.store.keys import ThreadKeys  # the app's key layout; imported here so the fake model needs no app

    return [json.loads(e) for e in client.lrange(ThreadKeys(thread_id).compactions, 0, -1)]
