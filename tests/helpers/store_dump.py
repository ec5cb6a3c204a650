"""Everything a Redis store holds, as one text (tests that check a word is nowhere in the store)."""

from __future__ import annotations

import json


def store_text(client, match: str = "*") -> str:
    """Every key matching ``match`` (SCAN) and its value read by its type, joined by newlines.

    ``client`` must decode responses.  Raises AssertionError for a key of a type not read here.
    """
    out = []
    for key in client.scan_iter(match=match, count=1000):
        kind = client.type(key)
        out.append(key)
        if kind == "hash":
            out.append(json.dumps(client.hgetall(key), ensure_ascii=False))
        elif kind == "list":
            out.extend(client.lrange(key, 0, -1))
        elif kind == "zset":
            out.extend(client.zrange(key, 0, -1))
        elif kind == "set":
            out.extend(client.smembers(key))
        elif kind == "string":
            out.append(client.get(key) or "")
        elif kind == "stream":
            out.append(json.dumps(client.xrange(key), ensure_ascii=False))
        else:
            assert kind == "none", f"{key} is a {kind}: read it too"
    return "\n".join(out)
