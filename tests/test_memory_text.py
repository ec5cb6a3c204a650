"""Cutting text by characters and by tokens, never inside a grapheme cluster (pure, no servers)."""

from __future__ import annotations

import pytest

from app.memory.final_turn import TRUNCATION_NOTICE, truncate_delivery_report
from app.memory.text import SENTENCE_BREAKS, clip_to_tokens, cut_at_word, grapheme_prefix
from app.memory.tokens import TokenCounter

FAMILY = "\U0001F468\u200D\U0001F469\u200D\U0001F467"   # 👨‍👩‍👧: three people joined by two ZWJs
RAINBOW_FLAG = "\U0001F3F3\uFE0F\u200D\U0001F308"        # 🏳️‍🌈
GERMAN_FLAG = "\U0001F1E9\U0001F1EA"                      # 🇩🇪: two regional indicators
THUMBS_UP = "\U0001F44D\U0001F3FD"                        # 👍🏽: a skin tone modifier
E_ACUTE = "e\u0301"                                      # é as e + combining acute accent


@pytest.mark.parametrize("cluster", [FAMILY, RAINBOW_FLAG, GERMAN_FLAG, THUMBS_UP, E_ACUTE])
def test_a_cut_never_ends_inside_a_cluster(cluster):
    text = "ab" + cluster * 3
    boundaries = [0, 1, 2] + [2 + k * len(cluster) for k in (1, 2, 3)]
    for limit in range(len(text) + 1):
        prefix = grapheme_prefix(text, limit)
        assert text.startswith(prefix)
        assert len(prefix) == max(b for b in boundaries if b <= limit)  # the longest whole-cluster prefix
        assert not prefix.endswith("\u200D")
    assert grapheme_prefix(text, 2 + len(cluster) - 1) == "ab"
    assert grapheme_prefix(text, 2 + len(cluster)) == "ab" + cluster


def test_the_cut_keeps_flags_paired_after_a_run_of_them():
    flags = GERMAN_FLAG * 5  # regional indicators pair up from the start of the run
    for limit in range(len(flags)):
        assert len(grapheme_prefix(flags, limit)) == limit - limit % 2


def test_line_breaks_end_clusters():
    text = "one\r\ntwo\n" + FAMILY * 2
    assert grapheme_prefix(text, 4) == "one"      # CR LF is one cluster
    assert grapheme_prefix(text, 5) == "one\r\n"
    assert grapheme_prefix(text, 9 + len(FAMILY) + 1) == "one\r\ntwo\n" + FAMILY


def test_a_delivery_report_cut_in_an_emoji_zwj_sequence_keeps_the_sequence_whole_or_leaves_it_out():
    keep = 8000 - len(TRUNCATION_NOTICE)
    for offset in range(1, len(FAMILY)):
        report = "a" * (keep - offset) + FAMILY * 10
        cut = truncate_delivery_report(report, 8000)
        prefix = cut[: -len(TRUNCATION_NOTICE)]
        assert cut.endswith(TRUNCATION_NOTICE) and len(cut) <= 8000
        assert prefix == "a" * (keep - offset)  # the family did not fit whole: it is left out
        assert "\u200D" not in prefix
    report = "a" * (keep - len(FAMILY)) + FAMILY * 10
    assert truncate_delivery_report(report, 8000) == "a" * (keep - len(FAMILY)) + FAMILY + TRUNCATION_NOTICE


def test_cut_at_word_prefers_breaks_in_the_second_half():
    assert cut_at_word("short", 10) == "short"
    assert cut_at_word("alpha beta gamma delta", 16, mark="…") == "alpha beta…"
    assert cut_at_word("alpha, beta gamma", 12, mark="…", strip=" ,;:-") == "alpha…"
    assert cut_at_word("abcdefghijklmnop", 8, mark="…") == "abcdefg…"   # no break in the second half
    text = "First sentence. Second one, with a clause; and more words here"
    assert cut_at_word(text, 50, breaks=SENTENCE_BREAKS) == "First sentence. Second one, with a clause"
    assert cut_at_word(text, 30, breaks=SENTENCE_BREAKS) == "First sentence. Second one"  # ". " is before half
    assert cut_at_word(text, 28, breaks=SENTENCE_BREAKS) == "First sentence."
    assert cut_at_word("x" * 6 + FAMILY + "y", 8) == "x" * 6  # no break: cut before the cluster


def test_clip_to_tokens_keeps_the_longest_prefix_that_fits():
    counter = TokenCounter()
    text = " ".join(f"word{i}" for i in range(400))
    assert clip_to_tokens(text, counter.count(text), counter.count, mark=" […]") == text
    for limit in (5, 17, 60, 200):
        clipped = clip_to_tokens(text, limit, counter.count, mark=" […]")
        assert counter.count(clipped) <= limit and clipped.endswith(" […]")
        prefix = clipped[: -len(" […]")]
        assert text.startswith(prefix)
        longer = text[: len(prefix) + 7]  # one more word or so no longer fits
        assert counter.count(longer.rstrip() + " […]") > limit
    assert clip_to_tokens(text, 1, counter.count, mark=" […]") == ""   # not even the mark fits
    assert clip_to_tokens(text, 0, counter.count) == ""
    assert clip_to_tokens("", 0, counter.count) == ""


def test_clip_to_tokens_never_splits_a_cluster():
    counter = TokenCounter()
    text = FAMILY * 200  # 13 tokens a family
    assert clip_to_tokens(text, 12, counter.count) == ""
    for limit, families in ((13, 1), (33, 2), (100, 7)):
        assert clip_to_tokens(text, limit, counter.count) == FAMILY * families
