"""Chinese word segmentation: jieba, loaded once per process.

jieba's dictionary takes about a second to load, so it is loaded on first use (``words``, ``tagger``),
under a lock so two threads never load it twice.  A process that forks hands its child a fresh lock
(a thread of the parent may hold the old one at the fork: the child would wait for it for ever); the
Celery worker loads it ahead of the first compaction in each pool child (``workers/tasks.py``).
"""

from __future__ import annotations

import logging
import os
import threading
from types import ModuleType

_lock = threading.Lock()
_jieba: ModuleType | None = None


def _new_lock() -> None:
    """After ``fork()``: a lock of the child's own."""
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_new_lock)


def _loaded() -> ModuleType:
    """The ``jieba`` module with its dictionary and part-of-speech tagger loaded."""
    global _jieba
    if _jieba is None:
        with _lock:
            if _jieba is None:
                import jieba
                import jieba.posseg

                jieba.setLogLevel(logging.WARNING)
                jieba.initialize()
                _jieba = jieba
    return _jieba


def words(run: str) -> list[str]:
    """jieba's segmentation of ``run`` (a run of Chinese characters) into words, in order."""
    return _loaded().lcut(run)


def tagger() -> ModuleType:
    """``jieba.posseg``: ``tagger().cut(text)`` yields pairs with ``.word`` and ``.flag`` (part of speech,
    e.g. ``nr`` person name, ``ns`` place); ``tagger().dt.word_tag_tab`` maps a word to its tag."""
    return _loaded().posseg
