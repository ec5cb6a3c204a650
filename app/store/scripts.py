"""The store's Lua scripts: every one a named file under ``app/store/lua/`` (docs/architecture.md), loaded here."""

from __future__ import annotations

from pathlib import Path

from redis.commands.core import Script

LUA_DIR = Path(__file__).with_name("lua")


def lua_script(client, name: str) -> Script:
    """The script ``lua/<name>`` (e.g. ``"commit_turn.lua"``) registered on ``client``: sent by its SHA on its
    first call (no connection is made here).

    Raises:
        FileNotFoundError: no such file.
    """
    return client.register_script((LUA_DIR / name).read_text())
