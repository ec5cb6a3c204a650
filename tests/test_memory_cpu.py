"""CPU per turn: tokenising, sentence splitting and fact reading are linear in their input, recall keeps to its
budget, and the turn's preparation runs off the event loop under gevent (docs/memory.md: Recall;
docs/benchmarks.md: Performance).

No test here measures time: each asserts a count of operations, a bound on what a step reads, or (for the
fact guard's patterns) that the ``regex`` engine finishes a scan of a large adversarial text within a
generous timeout that a quadratic pattern cannot meet.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import regex

from app.memory import recall as recall_module, words as words_module
from app.memory.compaction import facts as facts_module, record as record_module
from app.memory.compaction.facts import MAX_FACTS, extract_facts
from app.memory.compaction.record import SBD_WINDOW_CHARS, sentences
from app.memory.recall import MAX_CANDIDATES, MAX_QUERY_TOKENS, MAX_STEPS, ArchivedTurn, ArchiveIndex, recall, tokenize
from app.memory.state import ThreadMessage
from app.memory.tokens import TokenCounter

N = 12_000  # MAX_INPUT_CHARS


def repeat(unit: str, n: int = N) -> str:
    return (unit * (n // len(unit) + 1))[:n]


ADVERSARIAL = {
    "letter_digit_run": repeat("abc12"),
    "one_word": repeat("abcdefghij"),
    "hao": repeat("好。"),
    "emoji": repeat("😀", 50_000),
    "mixed_scripts": repeat("aя好1ع😀-.ß\u0301 x"),
    "dotted_digits": repeat("1."),
    "colons": repeat("12:"),
    "dashes": repeat("a-"),
    "han_digits": repeat("一二三四五"),
}


class Counting:
    """A compiled pattern that counts its ``match`` calls and the characters each could read."""

    def __init__(self, pattern):
        self.pattern, self.calls = pattern, 0

    def match(self, text, pos=0):
        self.calls += 1
        return self.pattern.match(text, pos)

    def __getattr__(self, name):
        return getattr(self.pattern, name)


# -- tokenising -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(ADVERSARIAL))
def test_an_identifier_is_tried_at_most_once_per_run_of_letters_and_digits(name, monkeypatch):
    text = ADVERSARIAL[name]
    counting = Counting(words_module._ID_RE)
    monkeypatch.setattr(words_module, "_ID_RE", counting)
    tokens = tokenize(text)
    runs = len(regex.findall(r"[0-9a-z]+", text.casefold()))
    assert counting.calls <= runs
    assert len(tokens) <= len(text)


def test_a_letter_digit_run_gives_its_words_and_numbers():
    assert tokenize(repeat("abc12", 25)) == ["abc", "12"] * 5
    assert tokenize("abc12-x") == ["abc12-x"]  # an identifier still is one token


# -- recall's budget --------------------------------------------------------------------------------------


def _turn(number: int, person: str, answer: str = "noted") -> ArchivedTurn:
    return ArchivedTurn(number, (ThreadMessage(f"u{number}", "user", person, "2025-01-01T00:00:00Z"),
                                 ThreadMessage(f"a{number}", "assistant", answer, "2025-01-01T00:00:00Z")))


def test_recall_scores_with_at_most_its_query_tokens_and_candidates(monkeypatch):
    index = ArchiveIndex()
    index.add(_turn(i, f"word{i} word{i + 1} shared{i % 7} plan") for i in range(1, MAX_CANDIDATES + 300))
    seen = {}
    original = recall_module._Scorer.get_batch_scores

    def spy(self, query, doc_ids):
        seen["query"], seen["docs"] = list(query), list(doc_ids)
        return original(self, query, doc_ids)

    monkeypatch.setattr(recall_module._Scorer, "get_batch_scores", spy)
    query = " ".join(f"word{i}" for i in range(1, 400)) + " plan"
    ranked = index.scores(tokenize(query))
    assert ranked
    assert len(seen["query"]) == MAX_QUERY_TOKENS
    assert "plan" not in seen["query"]  # in every turn: the rarest tokens were kept
    assert len(seen["docs"]) <= MAX_CANDIDATES


def test_recall_examines_at_most_its_steps(monkeypatch):
    index = ArchiveIndex()
    index.add(_turn(i, f"the lisbon release plan {i}") for i in range(1, 200))
    calls = []
    original = recall_module._left_over
    monkeypatch.setattr(recall_module, "_left_over", lambda text, held: calls.append(text) or original(text, held))
    held = [f"the lisbon release plan {i}" for i in range(1, 200)] + ["noted"]  # memory holds every turn
    assert recall(index, "lisbon release plan", held=held, max_tokens=2000, counter=TokenCounter()) == []
    assert len(calls) <= 2 * MAX_STEPS  # the person's words and the answer, per turn examined


# -- sentence splitting --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(ADVERSARIAL))
def test_pysbd_never_reads_more_than_a_window_at_a_time(name, monkeypatch):
    text = ADVERSARIAL[name]
    reads: list[int] = []
    original = record_module._segmenter

    class Spy:
        def __init__(self, segmenter):
            self.segmenter = segmenter

        def segment(self, window):
            reads.append(len(window))
            return self.segmenter.segment(window)

    monkeypatch.setattr(record_module, "_segmenter", lambda language: Spy(original(language)))
    record_module._split_cache.clear()
    got = sentences(text)
    assert max(reads) <= SBD_WINDOW_CHARS
    assert sum(reads) <= 2 * len(text)  # each character read at most about twice: linear
    assert "".join(got).replace(" ", "") == "".join(text.split()) or name in ("mixed_scripts",)


def test_a_split_text_is_kept_within_the_cache_bound_and_handed_out_as_a_new_list():
    text = "The meeting moved to Tuesday. Lin Wei agreed."
    first = sentences(text)
    first.append("changed by a caller")
    assert sentences(text) == ["The meeting moved to Tuesday.", "Lin Wei agreed."]
    assert record_module._split_cache.currsize <= record_module.SENTENCES_CACHE_MAX_BYTES
    big = repeat("Sentence here. ", 40_000)  # 80 kB in memory: split, not kept
    sentences(big)
    assert big not in record_module._split_cache


def test_short_paragraphs_are_split_as_pysbd_splits_them():
    text = "My name is Lin Wei. The meeting moved to Tuesday, 14:30! Dr. Smith agreed."
    assert sentences(text) == ["My name is Lin Wei.", "The meeting moved to Tuesday, 14:30!", "Dr. Smith agreed."]
    long = " ".join(f"Sentence number {i} is here." for i in range(200))
    assert sentences(long) == [f"Sentence number {i} is here." for i in range(200)]


# -- fact reading -----------------------------------------------------------------------------------------

_SCALE = 200_000  # sixteen times a message: a quadratic scan takes minutes here, a linear one well under a second


@pytest.mark.parametrize("unit", ["a-", "1.", "12:", "http://a", "a1.", "a.b@", "1,", "x_", "aB", "Ab ", "好a",
                                  "一二三", "123", "#a1", "3月", "😀"])
def test_every_fact_pattern_scans_an_adversarial_text_in_linear_time(unit):
    text = repeat(unit, _SCALE)
    patterns = [*facts_module._LATIN_PATTERNS, facts_module._NUMBER_UNIT_RE, facts_module._NAME_RE,
                *facts_module._ZH_PATTERNS]
    for pattern in patterns:
        compiled = regex.compile(pattern.pattern, pattern.flags & (regex.A | regex.I | regex.S) | regex.V0)
        for _ in compiled.finditer(text, timeout=5.0):  # raises TimeoutError on a superlinear scan
            pass


@pytest.mark.parametrize("unit", ["10 11 12 13 14 ", "X1-1 X2-2 X3-3 ", "Ab Cd Ef ", "9个苹果，"])
def test_a_text_full_of_facts_gives_at_most_max_facts(unit):
    text = " ".join(unit.replace("1", str(i)) for i in range(N // len(unit)))
    facts = extract_facts(text)
    assert 0 < len(facts) <= MAX_FACTS


def test_facts_are_found_as_before_in_a_normal_message():
    text = ("Ticket INC-4471 moved to Tuesday, 14:30 UTC; Lin Wei pays 9000 euros. Mail a.b@c.de or see "
            "https://example.com/x. 我们决定2025年3月14日上线3个副本。")
    assert extract_facts(text) == ["INC-4471", "Tuesday", "14:30 UTC", "Lin Wei", "9000 euros", "2025年3月14日",
                                   "3个副本"]  # URLs and addresses are no fact kind (docs/ablation.md: Decisions)


# -- the turn's preparation under gevent ------------------------------------------------------------------


def test_cpu_work_runs_off_the_event_loop_only_under_gevent():
    """Under gevent the event loop keeps running while the work runs (ticks > 0); called directly it cannot."""
    script = textwrap.dedent("""
        from gevent import monkey
        monkey.patch_all()
        import threading, time
        import gevent
        from app.chat.turn import off_the_event_loop

        def busy():
            end = time.process_time() + 0.5
            while time.process_time() < end:
                pass
            return threading.get_ident()

        def ticks_during(run):
            ticks = [0]
            def ticker():
                while True:
                    gevent.sleep(0.005)
                    ticks[0] += 1
            g = gevent.spawn(ticker)
            gevent.sleep(0.02)
            before = ticks[0]
            ident = run(busy)
            during = ticks[0] - before
            g.kill()
            return during, ident

        offloaded, ident = ticks_during(off_the_event_loop)
        direct, _ = ticks_during(lambda work: work())
        try:
            off_the_event_loop(lambda: 1 / 0)
            raised = False
        except ZeroDivisionError:
            raised = True
        print(offloaded > 0, direct, ident != threading.get_ident(), raised)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "0", "True", "True"]


def test_cpu_work_runs_right_here_without_gevent():
    import threading

    from app.chat.turn import off_the_event_loop

    assert off_the_event_loop(threading.get_ident) == threading.get_ident()
