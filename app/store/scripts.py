"""The store's Lua scripts: every one a named file under ``app/store/lua/`` (docs/architecture.md), loaded here."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from redis.commands.core import Script

if TYPE_CHECKING:
    from app.store.redis_client import StoreClient

LUA_DIR = Path(__file__).with_name("lua")


def lua_script(client: StoreClient, name: str) -> Script:
    """The script ``lua/<name>`` (e.g. ``"commit_turn.lua"``) registered on ``client``: sent by its SHA on its
    first call (no connection is made here).

    Raises:
        FileNotFoundError: no such file.
    """
    return client.register_script((LUA_DIR / name).read_text())
