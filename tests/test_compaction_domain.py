"""Unit tests of ``app.memory.compaction``: pure rules, no Redis, no model (issue 4 items 2-5, 7)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings as hsettings, strategies as st

from app.memory import compaction as c
from app.memory.state import PINNED_BY_MODEL, PINNED_BY_PERSON, Pin, ThreadMessage, ThreadState
from app.memory.tokens import counter_for
from app.settings import MemoryLimits

LIMITS = MemoryLimits()
BUDGET = 8192 - 1024
COUNTER = counter_for(None, "cl100k_base")
CREATED = "2026-01-01T00:00:00.000Z"


def message(mid: str, role: str, text: str) -> ThreadMessage:
    return ThreadMessage(mid, role, text, CREATED)


def thread(turns: int, *, summary: str = "", pins=(), texts=None, gen: int = 3, version: int = 7) -> ThreadState:
    messages = []
    for n in range(1, turns + 1):
        user, answer = texts(n) if texts else (f"question number {n}", f"answer number {n}")
        messages += [message(f"u{n}", "user", user), message(f"a{n}", "assistant", answer)]
    return ThreadState(tuple(messages), summary, tuple(pins), None, version, gen)


# ------------------------------------------------------------------------------------------ due


def test_exactly_eight_messages_are_not_due():
    assert c.compaction_due(8, 100, LIMITS, BUDGET) is False  # P6


def test_ten_messages_are_due():
    assert c.compaction_due(10, 100, LIMITS, BUDGET) is True


def test_batch_turns_wait_for_that_many_turns_beyond_the_window():
    limits = MemoryLimits(compact_batch_turns=3)
    assert [c.compaction_due(n, 100, limits, BUDGET) for n in (8, 10, 12, 14, 16)] == [False, False, False, True, True]


def test_tokens_past_seventy_percent_of_the_budget_are_due():
    threshold = int(0.7 * BUDGET)  # 5017
    assert c.compaction_due(4, threshold, LIMITS, BUDGET) is False
    assert c.compaction_due(4, threshold + 1, LIMITS, BUDGET) is True
    assert c.compaction_due(0, BUDGET, LIMITS, BUDGET) is False


def test_hard_cap_is_four_recent_windows():
    assert c.hard_cap_messages(LIMITS) == 32
    assert c.hard_cap_messages(MemoryLimits(recent_turns=2)) == 16


def test_uncompacted_tokens_counts_message_texts():
    state = thread(2)
    assert c.uncompacted_tokens(state.messages, COUNTER) == sum(COUNTER.count(m.text) for m in state.messages)


# ------------------------------------------------------------------------------------------ plan


def test_plan_of_six_turns_folds_the_two_oldest_and_keeps_eight_messages():
    plan = c.plan_compaction(thread(6), LIMITS, COUNTER, BUDGET)
    assert plan.folded_ids == ["u1", "a1", "u2", "a2"]
    assert [m.id for m in plan.kept] == ["u3", "a3", "u4", "a4", "u5", "a5", "u6", "a6"]
    assert (plan.folded_turns, plan.kept_turns, plan.expected_gen, plan.version) == (2, 4, 3, 7)
    assert [m.id for m in plan.reference] == [m.id for m in plan.kept]


def test_plan_of_four_turns_folds_nothing():
    assert c.plan_compaction(thread(4), LIMITS, COUNTER, BUDGET) is None


def test_kept_turns_fit_thirty_five_percent_of_the_budget():
    big = "lorem ipsum " * 500
    state = thread(6, texts=lambda n: (big, "ok"))
    per_turn = COUNTER.count(big) + COUNTER.count("ok")
    assert per_turn == 1003  # 35 % of 7168 is 2508.8 tokens: two turns fit, three do not
    plan = c.plan_compaction(state, LIMITS, COUNTER, BUDGET)
    assert plan.kept_turns == 2
    assert [m.id for m in plan.kept] == ["u5", "a5", "u6", "a6"]
    assert plan.folded_ids == ["u1", "a1", "u2", "a2", "u3", "a3", "u4", "a4"]


def test_a_turn_is_never_split():
    state = thread(7)
    plan = c.plan_compaction(state, LIMITS, COUNTER, BUDGET)
    assert len(plan.folded) % 2 == 0
    assert plan.kept[0].role == "user"
    assert [m.role for m in plan.kept] == ["user", "assistant"] * 4


def test_a_fold_is_capped_so_the_compaction_prompt_fits_the_budget():
    big = "lorem ipsum " * 200  # 401 tokens
    state = thread(16, texts=lambda n: (big, "fine"))
    budget = 2000
    plan = c.plan_compaction(state, LIMITS, COUNTER, budget)
    prompt = c.build_compaction_prompt(state, plan, LIMITS, counter=COUNTER)
    # The 35 % rule keeps one turn (402 tokens of 700); 15 are foldable, but only 4 fit the prompt.
    assert (plan.folded_turns, plan.kept_turns) == (4, 12)
    assert plan.folded_ids == ["u1", "a1", "u2", "a2", "u3", "a3", "u4", "a4"]
    assert COUNTER.prompt(prompt) <= budget


def test_one_turn_longer_than_the_budget_is_folded_with_its_text_clipped_in_the_prompt():
    huge = "lorem ipsum " * 4000  # 8001 tokens, more than the whole budget
    state = thread(6, texts=lambda n: (huge, "fine") if n == 1 else ("hi", "hello"))
    plan = c.plan_compaction(state, LIMITS, COUNTER, BUDGET)
    prompt = c.build_compaction_prompt(state, plan, LIMITS, counter=COUNTER)
    assert plan.folded_ids[:2] == ["u1", "a1"]
    assert COUNTER.prompt(prompt) <= BUDGET
    assert "[…]" in prompt[1]["content"]


# ------------------------------------------------------------------------------------------ prompt


def test_prompt_holds_previous_memory_the_folded_turns_and_the_kept_turns_for_reference():
    state = thread(6, summary="Earlier they met Marta.", pins=[Pin("Use Postgres", PINNED_BY_PERSON)])
    plan = c.plan_compaction(state, LIMITS, COUNTER, BUDGET)
    prompt = c.build_compaction_prompt(state, plan, LIMITS)
    assert [m["role"] for m in prompt] == ["system", "user"]
    system, user = prompt[0]["content"], prompt[1]["content"]
    assert '{"summary": "...", "pinnedDecisions": ["..."]}' in system
    assert "at most 2500 characters" in system and "At most 20 items, each at most 300 characters" in system
    fold_section = user.split("TURNS TO FOLD (oldest first):\n")[1].split("\n\nKEPT TURNS")[0]
    assert fold_section == ("[user] question number 1\n[assistant] answer number 1\n"
                            "[user] question number 2\n[assistant] answer number 2")
    assert "PREVIOUS SUMMARY:\nEarlier they met Marta." in user
    assert "1. Use Postgres" in user
    assert "KEPT TURNS (context only, do not summarize):\n[user] question number 3" in user


def test_second_attempt_prompt_carries_the_previous_answer_and_the_feedback():
    state = thread(6)
    plan = c.plan_compaction(state, LIMITS, COUNTER, BUDGET)
    prompt = c.build_compaction_prompt(state, plan, LIMITS, previous_answer='{"summary": "x"}',
                                       feedback=["summary: at most 2500 characters, got 3000"])
    assert [m["role"] for m in prompt] == ["system", "user", "assistant", "user"]
    assert prompt[2]["content"] == '{"summary": "x"}'
    assert prompt[3]["content"] == ("That answer was not accepted:\n- summary: at most 2500 characters, got 3000\n"
                                    "Answer again with the complete JSON object only.")


# ------------------------------------------------------------------------------------------ answer


def test_valid_answer_is_accepted_and_trimmed():
    out = c.validate_output({"summary": "  They talked.  ", "pinnedDecisions": [" Use tea ", "  "]}, LIMITS)
    assert out == c.CompactionOutput("They talked.", ("Use tea",))


@pytest.mark.parametrize("raw, kind", [
    ({"summary": "s", "pinnedDecisions": [], "compactedAt": "2026-01-01T00:00:00Z"}, "shape"),  # P2
    ({"summary": "s", "pinnedDecisions": [], "recentMessages": []}, "shape"),                  # P2
    ({"pinnedDecisions": []}, "shape"),                                                         # P7
    ({"summary": "s"}, "shape"),
    ({"summary": 3, "pinnedDecisions": []}, "shape"),
    ({"summary": "", "pinnedDecisions": []}, "shape"),
    (["s"], "shape"),
    ({"summary": "x" * 2501, "pinnedDecisions": []}, "limit"),                                  # P3
    ({"summary": "s", "pinnedDecisions": [f"d{i}" for i in range(21)]}, "limit"),               # P3
    ({"summary": "s", "pinnedDecisions": ["x" * 301]}, "limit"),                                # P3
])
def test_invalid_answers_are_refused_with_their_kind(raw, kind):
    with pytest.raises(c.InvalidCompactionOutput) as info:
        c.validate_output(raw, LIMITS)
    assert info.value.kind == kind
    if kind == "limit":
        assert info.value.problems[-1] == ("limits: summary at most 2500 characters; at most 20 pinned "
                                           "decisions of at most 300 characters")


def test_a_summary_that_nests_the_previous_one_is_a_copy():
    previous = "They planned the launch.\nKey facts: INC-4821; 2024-03-15."
    assert c.copies_previous_summary("Before: They planned the launch.\nKey facts: INC-4821; 2024-03-15. More.",
                                     previous) is True
    assert c.copies_previous_summary("They planned the launch. Then they ate.\nKey facts: INC-4821.", previous) is True
    assert c.copies_previous_summary("The launch was planned; lunch followed.", previous) is False
    assert c.copies_previous_summary("anything", "") is False


# ------------------------------------------------------------------------------------------ facts

PLANTED = ("I'm Marta Kowalski from the SRE team. Incident INC-4821 hit eu-west-2 on 2024-03-15; "
           "the runbook is at https://wiki.example.com/runbooks/inc-4821 and the flag is `billing_v2`. "
           "We lost 12,000 requests, about 3.5% of traffic, and the fix costs $300.")


def test_facts_are_extracted_in_order():
    assert c.extract_facts(PLANTED) == [
        "Marta Kowalski", "SRE", "INC-4821", "eu-west-2", "2024-03-15",
        "https://wiki.example.com/runbooks/inc-4821", "billing_v2", "12,000", "3.5%", "$300"]


def test_small_talk_has_no_facts():
    assert c.extract_facts("Hi! How are you today? I'm fine, thanks. Sure, let's keep going.") == []
    assert c.extract_facts("I have 3 cats.") == []  # single digits are too common to require


def test_written_dates_times_and_code_names_are_facts():
    text = "Ship on March 15, 2025 at 14:30 with PostgreSQL 16, getUser() and H100 nodes; call O'Brien."
    assert c.extract_facts(text) == ["March 15, 2025", "14:30", "PostgreSQL", "16", "getUser", "H100", "O'Brien"]


def test_facts_are_checked_word_for_word():
    facts = ["INC-4821", "Marta Kowalski", "2024-03-15"]
    check = c.check_facts(facts, "Marta Kowalski handled inc-4821 on 2024-03-150.", ["Deadline 2024-03-15"])
    assert check.missing == ("INC-4821",)
    assert check.retention == 0.6667
    assert c.check_facts([], "", []).retention == 1.0


def test_expected_facts_include_the_previous_summary_and_pins():
    state = thread(6, summary="Region eu-west-2 was affected.", pins=[Pin("Deadline is 2024-04-01")],
                   texts=lambda n: ("Incident INC-4821 continues", "noted") if n == 1 else ("hi", "hello"))
    plan = c.plan_compaction(state, LIMITS, COUNTER, BUDGET)
    assert c.expected_facts(state, plan) == ["eu-west-2", "2024-04-01", "INC-4821"]


def test_missing_facts_are_carried_on_one_key_facts_line():
    assert c.carry_missing_facts("They talked.", ["INC-4821", "eu-west-2"], 2500) == \
        "They talked.\nKey facts: INC-4821; eu-west-2."
    assert c.carry_missing_facts("They talked.\nKey facts: INC-4821.", ["eu-west-2"], 2500) == \
        "They talked.\nKey facts: INC-4821; eu-west-2."
    assert c.carry_missing_facts("They talked.", [], 2500) == "They talked."


def test_carrying_facts_stays_within_the_limit():
    summary = "A long sentence about the plan. " * 80  # 2560 characters
    out = c.carry_missing_facts(summary.strip()[:2500], ["INC-4821", "Marta Kowalski"], 2500)
    assert len(out) <= 2500
    assert out.endswith("\nKey facts: INC-4821; Marta Kowalski.")
    assert out.startswith("A long sentence about the plan.")


@hsettings(max_examples=200, deadline=None)
@given(st.text(max_size=400), st.lists(st.text(min_size=1, max_size=60), max_size=30), st.integers(100, 600))
def test_carry_never_passes_the_limit(summary, missing, limit):
    assert len(c.carry_missing_facts(summary, missing, limit)) <= limit


@hsettings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(list("abcXYZ019 -_.:/@$%,'`\n") + ["INC-", "https://", "March ", "Marta "]),
                max_size=80).map("".join))
def test_every_extracted_fact_appears_word_for_word_in_its_source(text):
    facts = c.extract_facts(text)
    assert c.check_facts(facts, text, []).missing == ()


# ------------------------------------------------------------------------------------------ pins


def test_pins_merge_without_normalized_duplicates_newest_last():
    old = [Pin("Use Postgres.", PINNED_BY_MODEL), Pin("Ship on Friday", PINNED_BY_PERSON)]
    merged = c.merge_pins(old, ["use  postgres", "- Ship on friday!", "Write tests first"], LIMITS)
    assert merged == (Pin("Use Postgres.", PINNED_BY_MODEL), Pin("Ship on Friday", PINNED_BY_PERSON),
                      Pin("Write tests first", PINNED_BY_MODEL))


def test_a_persons_wording_wins_over_a_model_duplicate():
    old = [Pin("use tabs", PINNED_BY_MODEL), Pin("Use TABS", PINNED_BY_PERSON)]
    assert c.merge_pins(old, [], LIMITS) == (Pin("Use TABS", PINNED_BY_PERSON),)


def test_over_the_limit_the_oldest_model_pins_go_and_person_pins_stay():
    old = [Pin(f"person decision {i}", PINNED_BY_PERSON) for i in range(5)] + \
          [Pin(f"model decision {i}", PINNED_BY_MODEL) for i in range(15)]
    merged = c.merge_pins(old, ["new one", "new two"], LIMITS)
    assert len(merged) == 20
    assert [p.text for p in merged if p.by == PINNED_BY_PERSON] == [f"person decision {i}" for i in range(5)]
    assert [p.text for p in merged if p.by == PINNED_BY_MODEL] == \
        [f"model decision {i}" for i in range(2, 15)] + ["new one", "new two"]


def test_person_pins_are_never_dropped_even_when_they_fill_the_limit():
    old = [Pin(f"person decision {i}", PINNED_BY_PERSON) for i in range(20)]
    assert c.merge_pins(old, ["model idea"], LIMITS) == tuple(old)


# ------------------------------------------------------------------------------------------ finish


def test_finish_carries_facts_the_model_dropped():
    state = thread(6, texts=lambda n: (PLANTED, "Noted.") if n == 1 else ("hi", "hello"))
    plan = c.plan_compaction(state, LIMITS, COUNTER, BUDGET)
    result = c.finish_compaction(state, plan, c.CompactionOutput("Marta reported an outage.", ()), LIMITS)
    assert result.summary == ("Marta reported an outage.\nKey facts: Marta Kowalski; SRE; INC-4821; eu-west-2; "
                              "2024-03-15; https://wiki.example.com/runbooks/inc-4821; billing_v2; 12,000; 3.5%; $300.")
    assert (result.model_retention, result.retention, result.facts_carried, result.facts_lost) == (0.0, 1.0, 10, 0)
    assert result.missing[0] == "Marta Kowalski"


# ------------------------------------------------------------------------------------------ extractive


def test_extractive_fold_keeps_first_sentences_and_facts_within_the_limits():
    state = thread(6, summary="They met.", pins=[Pin("Use Postgres", PINNED_BY_PERSON)],
                   texts=lambda n: (PLANTED, "Noted. I will track it.") if n == 1 else
                   (f"small talk turn {WORDSN[n]}. More words.", f"reply {WORDSN[n]}."))
    plan = c.plan_compaction(state, LIMITS, COUNTER, BUDGET)
    result = c.extractive_compaction(state, plan, LIMITS)
    assert result.summary == (
        "- I'm Marta Kowalski from the SRE team. → Noted.\n"
        "- small talk turn two. → reply two.\n"
        "Key facts: INC-4821; eu-west-2; 2024-03-15; https://wiki.example.com/runbooks/inc-4821; billing_v2; "
        "12,000; 3.5%; $300.")
    assert result.pins == (Pin("Use Postgres", PINNED_BY_PERSON),)
    assert result.retention == 1.0 and result.strategy == "extractive"
    assert c.extractive_compaction(state, plan, LIMITS) == result  # deterministic


def unique_word(k: int) -> str:
    """A lower-case word unique to ``k`` (no digits, so no facts)."""
    return "".join(chr(97 + (k // 26 ** i) % 26) for i in range(3))


WORDSN = {n: w for n, w in enumerate(["zero", "one", "two", "three", "four", "five", "six", "seven"])}


def test_repeated_extractive_folds_stay_bounded_and_never_copy_an_earlier_summary():
    limits = MemoryLimits(summary_max_chars=400)
    summaries: list[str] = []
    state = thread(6, texts=lambda n: (f"topic {unique_word(n)} is discussed at length here.", "Right."))
    for cycle in range(12):
        plan = c.plan_compaction(state, limits, COUNTER, BUDGET)
        result = c.extractive_compaction(state, plan, limits)
        assert len(result.summary) <= 400
        assert all(earlier not in result.summary for earlier in summaries)
        summaries.append(result.summary)
        kept = plan.kept
        fresh = []
        for n in range(2):
            k = 100 * cycle + n
            fresh += [message(f"u{k}", "user", f"topic {unique_word(k)} is discussed at length here."),
                      message(f"a{k}", "assistant", "Right.")]
        state = ThreadState(tuple(kept) + tuple(fresh), result.summary, result.pins, None, 0, cycle + 1)


def test_result_json_is_numbers_and_texts_only():
    state = thread(6)
    plan = c.plan_compaction(state, LIMITS, COUNTER, BUDGET)
    result = c.finish_compaction(state, plan, c.CompactionOutput("They talked about numbers.", ("Be brief",)), LIMITS)
    assert json.loads(json.dumps({"summary": result.summary, "pins": [p.to_dict() for p in result.pins]})) == \
        {"summary": "They talked about numbers.", "pins": [{"text": "Be brief", "by": "model"}]}


def test_a_second_copy_is_cut_out_of_the_answer():
    previous = "They planned the launch.\nKey facts: INC-4821."
    assert c.remove_previous_summary("Before: They planned the launch.\nKey facts: INC-4821.\nThen lunch.",
                                     previous) == "Before:\nThen lunch."
    assert c.remove_previous_summary("They planned the launch. Then lunch.", previous) == "Then lunch."
    assert c.remove_previous_summary("They planned the launch.", previous) == ""
    assert c.remove_previous_summary("A rewrite.", "") == "A rewrite."


def test_extractive_fold_drops_the_oldest_sentence_of_the_previous_summary_first():
    state = thread(6, summary="They met. They planned the launch.\nKey facts: INC-4821.")
    plan = c.plan_compaction(state, LIMITS, COUNTER, BUDGET)
    result = c.extractive_compaction(state, plan, LIMITS, model_pins=["Ship it"], strategy="condensed")
    assert result.summary == ("They planned the launch.\n- question number 1 → answer number 1\n"
                              "- question number 2 → answer number 2\nKey facts: INC-4821.")
    assert (result.pins, result.strategy) == ((Pin("Ship it", PINNED_BY_MODEL),), "condensed")
    assert not c.copies_previous_summary(result.summary, state.summary)
