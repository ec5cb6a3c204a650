"""Unit tests of ``app.memory.compaction``: the pure rules, no Redis, no model.

When a compaction is due and what it folds; the record (appended lines, the fitting
policy); model notes (grounded or refused); the model's prompt (only the folded
turns, always within the window, Chinese included) and answer; ``compose`` (the
fact guard and the gain rule).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings as hsettings, strategies as st

from app.memory import compaction as c
from app.memory.compaction.notes import merge_notes, note_problem
from app.memory.compaction.record import (
    ABOUT,
    ASSISTANT,
    FIT_SHARE,
    HEADER,
    LINE_MAX_CHARS,
    PERSON,
    TEXT,
    Record,
    RecordLine,
    condense,
    fit_record,
    statement_lines,
    statement_sentences,
)
from app.memory.migration import read_record
from app.memory.state import Pin, ThreadMessage, ThreadState
from app.memory.tokens import counter_for
from app.settings import MemoryLimits

LIMITS = MemoryLimits()
BUDGET = 8192 - 1024
COUNTER = counter_for(None, "cl100k_base")
CREATED = "2026-01-01T00:00:00.000Z"
FIXED = c.fixed_prompt_tokens(LIMITS, COUNTER)
LONG_ANSWER = ("That is a good question. There are several things to consider here, and the details depend on "
               "your setup, your team and your goals. In general it helps to start small, measure what matters "
               "and iterate: write down what you expect, try it, and compare what happens with what you "
               "expected. Most teams find that a short checklist and a regular review keep things on track.")


def message(mid: str, role: str, text: str) -> ThreadMessage:
    return ThreadMessage(mid, role, text, CREATED)


def thread(turns: int, *, summary: str = "", pins=(), notes=(), texts=None, gen: int = 3,
           version: int = 7, folded: int = 0) -> ThreadState:
    messages = []
    for n in range(1, turns + 1):
        user, answer = texts(n) if texts else (f"What about question number {n}?", f"answer number {n}")
        messages += [message(f"u{n}", "user", user), message(f"a{n}", "assistant", answer)]
    return ThreadState(tuple(messages), read_record(summary), tuple(pins), None, version, gen, tuple(notes),
                       folded_turns=folded)


def plan_of(state, limits=LIMITS, budget=BUDGET):
    return c.plan_compaction(state, limits, COUNTER, budget, fixed_prompt_tokens=c.fixed_prompt_tokens(limits, COUNTER))


def compose(state, answer=None, *, limits=LIMITS, budget=BUDGET):
    return c.compose(state, plan_of(state, limits, budget), answer, limits=limits, counter=COUNTER,
                     prompt_budget=budget)


PLANTED = [
    ("Hi, my name is Lin Wei and I work at Northwind in Rotterdam.", LONG_ANSWER),
    ("Our incident ticket is INC-4471; the outage started on 14 March 2025 at 09:20 UTC.", LONG_ANSWER),
    ("我们决定把数据库迁移推迟到4月2日，负责人是王芳。", "好的。" + "我们可以先整理迁移清单，然后逐项确认风险和回滚方案，再安排演练。" * 3),
    ("What is a database index? One sentence.", LONG_ANSWER),
    ("Tell me a joke about caching.", LONG_ANSWER),
    ("Thanks, that was fun.", LONG_ANSWER),
]


def planted(n: int):
    return PLANTED[(n - 1) % len(PLANTED)]


# ------------------------------------------------------------------------------------------ due


def test_exactly_eight_messages_are_not_due():
    assert c.compaction_due(8, 100, LIMITS, BUDGET) is False  # P6


def test_ten_messages_are_due_with_a_batch_of_one():
    assert c.compaction_due(10, 100, MemoryLimits(compact_batch_turns=1), BUDGET) is True


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


def test_token_caps_are_shares_of_the_prompt_budget():
    assert (c.summary_token_cap(BUDGET), c.notes_token_cap(BUDGET)) == (1792, 358)
    assert (c.summary_token_cap(1500 - 1024), c.notes_token_cap(1500 - 1024)) == (119, 23)


# ------------------------------------------------------------------------------------------ plan


def test_plan_of_six_turns_folds_the_two_oldest_and_keeps_eight_messages():
    plan = plan_of(thread(6))
    assert plan.folded_ids == ["u1", "a1", "u2", "a2"]
    assert [m.id for m in plan.kept] == ["u3", "a3", "u4", "a4", "u5", "a5", "u6", "a6"]
    assert (plan.folded_turns, plan.kept_turns, plan.expected_gen, plan.version) == (2, 4, 3, 7)


def test_plan_of_four_turns_folds_nothing():
    assert plan_of(thread(4)) is None


def test_kept_turns_fit_thirty_five_percent_of_the_budget():
    big = "lorem ipsum " * 500
    state = thread(6, texts=lambda n: (big, "ok"))
    assert COUNTER.message("user", big) + COUNTER.message("assistant", "ok") == 1011  # two fit in 2508, three do not
    plan = plan_of(state)
    assert plan.kept_turns == 2
    assert plan.folded_ids == ["u1", "a1", "u2", "a2", "u3", "a3", "u4", "a4"]


def test_a_turn_is_never_split():
    plan = plan_of(thread(7))
    assert len(plan.folded) % 2 == 0
    assert [m.role for m in plan.kept] == ["user", "assistant"] * 4


# ------------------------------------------------------------------------------------------ prompt


def test_the_model_sees_only_the_folded_turns_never_the_summary_or_pins():
    state = thread(6, summary="Statements kept from earlier turns:\n- Person: I am Marta.\n(turns 1–2 of this conversation)",
                   pins=[Pin("Use Postgres")])
    prompt = c.build_compaction_prompt(plan_of(state), LIMITS, COUNTER, BUDGET)
    assert [m["role"] for m in prompt] == ["system", "user"]
    assert prompt[1]["content"] == ("TURNS (oldest first):\n[person] What about question number 1?\n"
                                    "[assistant] answer number 1\n"
                                    "[person] What about question number 2?\n[assistant] answer number 2\n\n"
                                    "Answer with the JSON object only.")
    assert "Marta" not in str(prompt) and "Postgres" not in str(prompt)
    assert '{"summary": "...", "pinnedDecisions": ["..."]}' in prompt[0]["content"]
    assert "at most 300 characters" in prompt[0]["content"] and "at most 3 items" in prompt[0]["content"]


def test_a_second_attempt_carries_the_previous_answer_and_the_feedback():
    prompt = c.build_compaction_prompt(plan_of(thread(6)), LIMITS, COUNTER, BUDGET, previous_answer='{"summary": "x"}',
                                       feedback=["summary: these names are not in the turns: Bob"])
    assert [m["role"] for m in prompt] == ["system", "user", "assistant", "user"]
    assert prompt[3]["content"] == ("That answer was not accepted:\n- summary: these names are not in the turns: Bob\n"
                                    "Answer again with the complete JSON object only.")


@pytest.mark.parametrize("context_tokens", [1500, 4096])
def test_compaction_prompts_of_thirty_chinese_turns_always_fit_the_window(context_tokens):
    budget = context_tokens - 1024
    text = "我们讨论了数据库迁移、缓存策略和监控告警的细节😀，负责人是王芳，时间定在4月2日。" * 6
    state = thread(30, texts=lambda n: (f"第{n}轮：" + text, "好的，" + text))
    for n in range(5, 31):
        sub = ThreadState(state.messages[: 2 * n], "", (), None, 1, 1)
        plan = plan_of(sub, budget=budget)
        prompt = c.build_compaction_prompt(plan, LIMITS, COUNTER, budget)
        assert COUNTER.prompt(prompt) <= budget
        assert ("[…]" in prompt[1]["content"]) == (context_tokens == 1500)  # 1,500: every turn is clipped


def test_a_window_too_small_for_any_prompt_is_refused_before_a_request():
    budget = 150
    plan = plan_of(thread(6), budget=budget)
    with pytest.raises(c.PromptTooLong):
        c.build_compaction_prompt(plan, LIMITS, COUNTER, budget)


# ------------------------------------------------------------------------------------------ answer


def test_a_valid_answer_is_accepted_and_trimmed():
    answer = c.validate_answer({"summary": "  They talked.  ", "pinnedDecisions": [" Use tea ", "  "]})
    assert (answer.summary, answer.pinnedDecisions) == ("They talked.", ["Use tea"])


@pytest.mark.parametrize("raw, kind", [
    ([], "shape"), ({"pinnedDecisions": []}, "shape"), ({"summary": "", "pinnedDecisions": []}, "shape"),
    ({"summary": "x", "pinnedDecisions": [], "compactedAt": "now"}, "shape"),  # P2
    ({"summary": "x", "pinnedDecisions": [], "recentMessages": []}, "shape"),  # P2
    ({"summary": 3, "pinnedDecisions": []}, "shape"),
    ({"summary": "x" * 301, "pinnedDecisions": []}, "limit"),
    ({"summary": "x", "pinnedDecisions": ["a", "b", "c", "d"]}, "limit"),
])
def test_invalid_answers_are_refused_with_their_kind(raw, kind):
    with pytest.raises(c.InvalidCompactionOutput) as err:
        c.validate_answer(raw)
    assert err.value.kind == kind


def test_the_answer_schema_sent_bounds_the_output():
    from app.llm.structured import answer_schema, strict_answer_schema

    schema = answer_schema(c.CompactionAnswer)
    assert schema["properties"]["summary"]["maxLength"] == 300
    assert schema["properties"]["pinnedDecisions"]["maxItems"] == 3
    assert schema["additionalProperties"] is False
    assert strict_answer_schema(c.CompactionAnswer)["required"] == ["summary", "pinnedDecisions"]


# ------------------------------------------------------------------------------------------ record


def test_a_record_renders_and_reads_back():
    record = Record(1, 8, (RecordLine(ABOUT, "Introductions."), RecordLine(PERSON, "I am Lin Wei."),
                           RecordLine(ASSISTANT, "Redis listens on 6379.")))
    text = record.render()
    assert text == ("Statements kept from earlier turns:\n- About: Introductions.\n- Person: I am Lin Wei.\n"
                    "- Assistant: Redis listens on 6379.\n(turns 1–8 of this conversation)")
    assert read_record(record.to_stored()) == read_record(text) == record


def test_a_free_text_summary_of_earlier_versions_reads_as_sentences():
    record = read_record("They met Marta. She works in Oslo.\nKey facts: INC-1.")
    assert [(line.kind, line.text) for line in record.lines] == [
        (TEXT, "They met Marta."), (TEXT, "She works in Oslo."), (TEXT, "Key facts: INC-1.")]


def test_a_turn_keeps_the_persons_fact_sentences_and_answer_sentences_that_add_facts():
    turn = (message("u1", "user", "Hi! My name is Lin Wei. How are you today? I prefer short answers."),
            message("a1", "assistant", "Nice to meet you, Lin Wei! Redis listens on port 6379 by default. "
                                       "PostgreSQL uses 5432. MySQL uses 3306. Anything else?\n```\nx_y = 1\n```"))
    lines = statement_lines(turn)
    assert [(line.kind, line.text) for line in lines] == [
        (PERSON, "My name is Lin Wei. I prefer short answers."),
        (ASSISTANT, "PostgreSQL uses 5432.")]  # one answer sentence: the first with the most new facts


def test_the_answer_to_a_turn_that_only_told_something_adds_no_line():
    """A small model restates what it was told with changes: the person's words stand, alone."""
    for said, restated in (
            ("我们决定把数据库迁移推迟到4月2日，负责人是王芳。",
             "We need to delay the database migration until March 2, 2025, at 9:20 UTC."),
            ("Hi, my name is Lin Wei. I work at Northwind Logistics in Rotterdam.",
             "Hello Lin Wei! I'm a .NET developer working at Northwind Logistics in Rotterdam.")):
        lines = statement_lines((message("u1", "user", said), message("a1", "assistant", restated)))
        assert [(line.kind, line.text) for line in lines] == [(PERSON, said)]


def test_questions_and_requests_are_no_statements_whatever_they_name():
    def lines(user: str, answer: str = "Fine.") -> list[tuple[str, str]]:
        return [(line.kind, line.text) for line in
                statement_lines((message("u1", "user", user), message("a1", "assistant", answer)))]

    assert lines("What is a Bloom filter? Two sentences.",
                 "A Bloom filter was described by Burton Howard Bloom in 1970.") == [
        (ASSISTANT, "A Bloom filter was described by Burton Howard Bloom in 1970.")]  # the answer to a question
    assert lines("Explain Redis persistence briefly.") == []
    assert lines("Give me a Python one-liner to reverse a string.") == []
    assert lines("请解释一下Redis的持久化。") == []
    assert lines("Is INC-4471 still open?", "Yes, it is.") == []  # asking names no fact of the person's
    assert lines("We moved the launch to Tuesday, can you update the plan?") == [
        (PERSON, "We moved the launch to Tuesday")]  # the statement clause of a question is kept
    # the guard reads the same sentences: it never demands "Bloom" or "Redis" from a question
    assert statement_sentences("What is a Bloom filter? We run Redis 7 in Frankfurt.") == [
        "We run Redis 7 in Frankfurt."]


def test_a_sentence_cut_to_its_facts_ends_on_whole_words_and_shows_the_cuts():
    sentence = ("The Bloom filter works by maintaining a bit array of m bits and k hash functions, each mapping an "
                "element to one of the positions, which answers membership queries for INC-4471 quickly and "
                "cheaply without storing the elements themselves at any point in time whatsoever.")
    cut = condense(sentence, ["INC-4471"], 120)
    assert cut.startswith("… ") and cut.endswith(" …") and "INC-4471" in cut
    inner = cut[2:-2]
    assert inner in sentence and sentence[sentence.index(inner) - 1] == " "  # starts on a word
    assert sentence[sentence.index(inner) + len(inner)] == " "  # and ends on one


def test_greetings_that_only_name_someone_add_no_line():
    for text in ("Hey Mel!", "Thanks, Melanie!", "Wow, Melanie!", "Totally agree, Mel."):
        assert statement_lines((message("u1", "user", text),)) == []
    assert [line.text for line in statement_lines((message("u1", "user", "Hi, I'm Lin Wei."),))] == ["Hi, I'm Lin Wei."]


def test_a_turn_without_facts_or_decisions_adds_no_line():
    turn = (message("u1", "user", "Tell me a joke about caching."), message("a1", "assistant", LONG_ANSWER))
    assert statement_lines(turn) == []


def test_a_long_sentence_is_kept_whole_and_a_very_long_one_is_cut_at_a_word_edge():
    sentence = ("Well, as I was saying earlier, after a lot of back and forth with the whole team, and many long "
                "meetings that went on and on until late in the evening, with pizza, coffee and far too many slides, "
                "we finally opened ticket INC-4471, which tracks the outage, and we will review it weekly.")
    [line] = statement_lines((message("u1", "user", sentence),))
    assert line.text == sentence  # whatever its words: the form decides, and it is a statement
    longer = sentence[:-1] + ", and then " + sentence[0].lower() + sentence[1:].replace("INC-4471", "INC-4472")
    [cut] = statement_lines((message("u1", "user", longer),))
    assert cut.text.endswith(" …") and len(cut.text) <= LINE_MAX_CHARS
    assert longer.startswith(cut.text[:-2]) and longer[len(cut.text) - 2] in " ,"  # ends on a whole word


def lines_record(n: int) -> Record:
    lines = []
    for i in range(n):
        lines.append(RecordLine(ABOUT, f"They talked about topic number {i}, what came of it for the team and for the customers, "
                                       "and what they would look at again in the weeks that followed."))
        lines.append(RecordLine(PERSON, f"My ticket is INC-{1000 + i} and it is about the billing flow."))
        lines.append(RecordLine(ASSISTANT, f"Port {7000 + i} is the one to open for it."))
    return Record(1, 2 * n, tuple(lines))


def test_fitting_drops_about_lines_first_then_answers_then_the_persons_oldest():
    record = lines_record(12)
    chars = len(record.render())
    about_chars = sum(len(line.render()) + 1 for line in record.lines if line.kind == ABOUT)
    assert chars * (1 - FIT_SHARE) < about_chars < chars  # one character over: the About lines alone make room
    fitted, report = fit_record(record, max_chars=chars - 1, max_tokens=10_000, counter=COUNTER)
    assert report.steps == ("about",) and report.dropped_facts == ()
    abouts = [line.text for line in record.lines if line.kind == ABOUT]
    remaining = [line.text for line in fitted.lines if line.kind == ABOUT]
    assert remaining == abouts[len(abouts) - len(remaining):] and len(remaining) < len(abouts)  # oldest went
    persons_only = len(replace(record, lines=tuple(line for line in record.lines if line.kind == PERSON)).render())
    limit = int((persons_only + 150) / FIT_SHARE)  # room for the person's lines and a few answers
    fitted, report = fit_record(record, max_chars=limit, max_tokens=10_000, counter=COUNTER)
    assert report.steps == ("about", "assistant")
    assert len(fitted.render()) <= FIT_SHARE * limit  # cut down to FIT_SHARE of the limit: room for what comes next
    dropped = len(report.dropped_facts)
    assert report.dropped_facts == tuple(str(7000 + i) for i in range(dropped)) and 0 < dropped < 12  # oldest first
    assert sum(line.kind == PERSON for line in fitted.lines) == 12
    fitted, report = fit_record(record, max_chars=400, max_tokens=10_000, counter=COUNTER)
    assert report.steps[-1] == "person" and "INC-1000" in report.dropped_facts
    assert "INC-1011" in fitted.render()  # the newest stay


def test_fitting_keeps_a_line_whose_facts_are_referenced_elsewhere_longer():
    record = Record(1, 12, tuple(line for line in lines_record(6).lines if line.kind == PERSON))
    one_line_less = COUNTER.count(Record(1, 12, record.lines[1:]).render())
    fitted, report = fit_record(record, max_chars=10_000, max_tokens=one_line_less, counter=COUNTER,
                                reference_text="we still talk about INC-1000")
    assert "INC-1000" in fitted.render() and "INC-1005" in fitted.render()
    assert report.dropped_facts[:2] == ("INC-1001", "INC-1002")  # the least referenced, oldest first
    assert "INC-1000" not in report.dropped_facts


def test_fitting_respects_the_token_limit_with_chinese_lines():
    lines = tuple(RecordLine(PERSON, f"第{i}次会议决定把数据库迁移推迟到4月{i % 28 + 1}日，负责人是王芳和李娜。")
                  for i in range(60))
    record = Record(1, 60, lines)
    fitted, report = fit_record(record, max_chars=2500, max_tokens=300, counter=COUNTER)
    assert COUNTER.count(fitted.render()) <= 300 and len(fitted.render()) <= 2500
    assert report.steps == ("person",) and fitted.lines[-1] == lines[-1]


@hsettings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from(["Lin Wei", "INC-4471", "9000 euros", "4月2日", "王芳", "hello there", "ok"]),
                min_size=1, max_size=40), st.integers(min_value=60, max_value=2500))
def test_fitting_never_passes_the_limits_and_reports_every_fact_it_lets_go(words, max_chars):
    lines = tuple(RecordLine(PERSON, f"Item {i}: {w}.") for i, w in enumerate(words))
    record = Record(1, len(words), lines)
    fitted, report = fit_record(record, max_chars=max_chars, max_tokens=10_000, counter=COUNTER)
    text = fitted.render()
    assert len(text) <= max_chars
    kept = "\n".join(line.text for line in fitted.lines)
    for fact in c.facts_of(line.text for line in lines):
        assert c.fact_present(fact, kept) or fact in report.dropped_facts


# ------------------------------------------------------------------------------------------ notes


FOLDED = (message("u1", "user", "We decided to move the launch to Friday and we will not build a mobile app."),
          message("a1", "assistant", "Understood. HTTP 200 means OK and 401 means unauthorized."),
          message("u2", "user", "我们决定把数据库迁移推迟到4月2日，负责人是王芳。"))


@pytest.mark.parametrize("proposal, problem", [
    ("We will not build a mobile app.", None),
    ("Launch moved to Friday (decided).", None),
    ("数据库迁移推迟到4月2日，王芳负责", None),
    ("200", "bare value"),
    ("UTC", "bare value"),
    ("What is a database index?", "question"),
    ("HTTP 401 means unauthorized, we decided to check the token.", "not grounded"),
    ("The launch is on Friday and the mobile app is nice.", "not a decision"),
    ("We decided to move the launch to Friday 13 March.", "fact not in the person's words"),
    ("我们决定把数据库迁移推迟到5月9日，负责人是王芳。", "fact not in the person's words"),
])
def test_a_proposed_note_is_kept_only_when_grounded_in_the_persons_words(proposal, problem):
    assert note_problem(proposal, FOLDED, existing=[]) == problem


def test_a_note_never_repeats_a_pin_and_notes_are_capped_oldest_first():
    merged = merge_notes(["Old note one decided.", "Old note two decided."],
                         ["We will not build a mobile app.", "we decided to move the launch to friday"], FOLDED,
                         pins=["We decided to move the launch to Friday"], max_count=2, max_chars=200,
                         max_tokens=1000, counter=COUNTER)
    assert merged.notes == ("Old note two decided.", "We will not build a mobile app.")
    assert merged.refused == (("we decided to move the launch to friday", "duplicate"),)
    assert merged.dropped == ("Old note one decided.",)


# ------------------------------------------------------------------------------------------ compose


def test_a_fold_without_the_model_keeps_every_planted_fact_and_shrinks_memory():
    state = thread(6, texts=planted, pins=[Pin("Answer in English")])
    result = compose(state)
    assert result.summary == (
        "Statements kept from earlier turns:\n"
        "- Person (turn 1): Hi, my name is Lin Wei and I work at Northwind in Rotterdam.\n"
        "- Person (turn 2): Our incident ticket is INC-4471; the outage started on 14 March 2025 at 09:20 UTC.\n"
        "(turns 1–2 of this conversation)")
    assert result.strategy == "extractive" and result.notes == ()
    assert (result.facts_checked, result.facts_kept, result.facts_dropped) == (6, 6, 0)
    assert result.tokens_after < result.tokens_before


def test_a_greeting_that_only_names_someone_is_neither_recorded_nor_guarded():
    # "Hey Mel!" keeps no record line, so the fact guard must not demand "Mel" (it refused every such fold)
    def texts(n):
        if n == 1:
            return ("Hey Mel! I moved to Lisbon in 2021 and I still love the light there in the evenings.",
                    "That sounds like a wonderful place to live, thank you for telling me about it. A city where "
                    "the evenings feel that good is worth a lot, and it is lovely that it still surprises you after "
                    "all this time. Tell me more whenever you like, it is always nice to hear about the places "
                    "people call home and what makes them feel that way.")
        return (f"What about question number {n}?", LONG_ANSWER)
    result = compose(thread(6, texts=texts))
    assert result.summary == ("Statements kept from earlier turns:\n"
                              "- Person (turn 1): I moved to Lisbon in 2021 and I still love the light there in the "
                              "evenings.\n"
                              "- Asked (turn 2): What about question number 2?\n(turns 1–2 of this conversation)")
    assert (result.facts_dropped, result.strategy) == (0, "extractive")


def test_a_model_answer_adds_an_about_line_and_grounded_notes_only():
    state = thread(6, texts=planted)
    answer = c.validate_answer({"summary": "Lin Wei introduced himself and reported outage INC-4471.",
                                "pinnedDecisions": ["What is INC-4471?", "200"]})
    result = compose(state, answer)
    assert result.summary.splitlines()[1] == "- About: Lin Wei introduced himself and reported outage INC-4471."
    assert (result.strategy, result.notes, result.notes_refused) == ("llm", (), 2)


def test_a_gist_that_invents_facts_is_refused_as_ungrounded():
    answer = c.validate_answer({"summary": "Wang Fang reported an outage in September 2025.", "pinnedDecisions": []})
    with pytest.raises(c.InvalidCompactionOutput) as err:
        compose(thread(6, texts=planted), answer)
    assert err.value.kind == "ungrounded" and "Wang Fang" in err.value.problems[0]


def test_a_gist_naming_facts_of_older_memory_for_unrelated_turns_is_refused_as_ungrounded():
    """The facts are in memory already, but not in the turns this gist is about."""
    summary = "Statements kept from earlier turns:\n- Person: 我们决定把数据库迁移推迟到4月2日，负责人是王芳。\n" \
              "(turns 1–1 of this conversation)"
    state = thread(6, summary=summary, texts=lambda n: (f"Tell me about film number {n}, please?", LONG_ANSWER))
    answer = c.validate_answer({"summary": "请提供电影的详细信息，以便我将数据库迁移推迟到4月2日。负责人是王芳。",
                                "pinnedDecisions": []})
    with pytest.raises(c.InvalidCompactionOutput) as err:
        compose(state, answer)
    assert err.value.kind == "ungrounded" and "4月2日" in err.value.problems[0]


def test_a_gist_repeating_older_memory_that_only_an_answer_echoed_is_refused_as_ungrounded():
    """A small chat model repeats the record's facts in unrelated answers; a gist of them would write them again."""
    summary = "Statements kept from earlier turns:\n- Person: 我们决定把数据库迁移推迟到4月2日，负责人是王芳。\n" \
              "(turns 1–1 of this conversation)"
    echo = "这部电影很好看。另外，数据库迁移推迟到4月2日，负责人是王芳。" + "导演讲了一个关于家庭的故事。" * 6
    state = thread(6, summary=summary, texts=lambda n: (f"电影{n}的票房怎么样？", echo))
    answer = c.validate_answer({"summary": "询问电影票房；数据库迁移推迟到4月2日。", "pinnedDecisions": []})
    with pytest.raises(c.InvalidCompactionOutput) as err:
        compose(state, answer)
    assert err.value.kind == "ungrounded" and "earlier turns" in err.value.problems[0]
    assert "4月2日" in err.value.problems[0]


def test_for_turns_that_only_told_things_a_gist_retelling_the_answers_adds_no_line():
    told = "Hi, I'm Lin Wei. I work at Northwind Logistics in Rotterdam."
    invented = ("Lin Wei is an excellent candidate for an open role at Northwind Logistics, with experience in "
                "finance, logistics and supply chain management.")
    state = thread(6, texts=lambda n: (told, invented + " " + LONG_ANSWER) if n == 1 else
                   (f"My ticket number is INC-{n}.", LONG_ANSWER))
    answer = c.validate_answer({"summary": invented, "pinnedDecisions": []})
    result = compose(state, answer)
    assert result.strategy == "llm" and "- About:" not in result.summary
    assert "- Person (turn 1): " + told in result.summary.splitlines()
    grounded = c.validate_answer({"summary": "Lin Wei of Northwind Logistics in Rotterdam gave ticket INC-2.",
                                  "pinnedDecisions": []})
    assert "- About: Lin Wei of Northwind Logistics in Rotterdam gave ticket INC-2." in \
        compose(state, grounded).summary.splitlines()


def test_a_gist_that_copies_the_answer_adds_no_line_but_a_gist_in_its_own_words_does():
    answer_text = ("A Bloom filter is a data structure used to quickly determine whether an element exists in a "
                   "set of elements. It works by distributing the elements into buckets. " + LONG_ANSWER)
    state = thread(6, texts=lambda n: ("What is a Bloom filter?", answer_text) if n == 1 else
                   (f"question number {n}", LONG_ANSWER))
    copied = c.validate_answer({"summary": "Bloom filter is a data structure used to quickly determine whether an "
                                           "element exists in a set of elements.", "pinnedDecisions": []})
    assert "- About:" not in compose(state, copied).summary
    own = c.validate_answer({"summary": "The person asked what a Bloom filter is.", "pinnedDecisions": []})
    assert "- About: The person asked what a Bloom filter is." in compose(state, own).summary.splitlines()


def test_a_gist_that_only_repeats_what_the_person_said_adds_no_line():
    said = "We have an incident: ticket INC-4471. The outage started on 14 March 2025 at 09:20 UTC."
    state = thread(6, texts=lambda n: (said, LONG_ANSWER) if n == 1 else (f"What about question number {n}?",
                                                                          LONG_ANSWER))
    answer = c.validate_answer({"summary": said, "pinnedDecisions": []})
    result = compose(state, answer)
    assert result.strategy == "llm"
    assert [line for line in result.summary.splitlines() if line.startswith("- ")] == ["- Person (turn 1): " + said]


def test_an_answer_that_would_not_shrink_memory_enough_is_refused_as_growth():
    state = thread(6, texts=lambda n: (f"My ticket is INC-{n}.", "Noted."))
    answer = c.validate_answer({"summary": "The person listed tickets " + "and more tickets " * 12,
                                "pinnedDecisions": []})
    with pytest.raises(c.InvalidCompactionOutput) as err:
        compose(state, answer)
    assert err.value.kind == "growth"


def test_repeated_folds_append_never_rewrite_and_stay_within_both_limits():
    limits = MemoryLimits(summary_max_chars=800)
    state = thread(6, texts=planted)
    summaries = []
    n = 6
    for _cycle in range(10):
        result = compose(state, limits=limits)
        assert len(result.summary) <= 800 and COUNTER.count(result.summary) <= c.summary_token_cap(BUDGET)
        assert [s for s in summaries if s in result.summary] == []  # no earlier summary is nested inside
        lines = result.summary.splitlines()
        assert len(lines) == len(set(lines))  # no line twice
        summaries.append(result.summary)
        plan = plan_of(state)
        kept = list(plan.kept)
        for _ in range(2):
            n += 1
            user, answer = planted(n)
            user = user.replace("4471", str(4471 + n)).replace("Lin Wei", f"Lin Wei {n}")
            kept += [message(f"u{n}", "user", user), message(f"a{n}", "assistant", answer)]
        state = ThreadState(tuple(kept), result.record, (), None, state.version + 1, state.gen + 1, result.notes,
                            folded_turns=state.folded_turns + plan.folded_turns)
    assert summaries[-1].endswith("\n(turns 1–20 of this conversation)")


def test_a_persons_pin_is_never_touched_by_twenty_compactions():
    pin = Pin("Ship the release on Friday, after the review — 不要在周末发布。")
    state = thread(6, texts=planted, pins=[pin])
    for _ in range(20):
        result = compose(state)
        state = ThreadState(plan_of(state).kept + state.messages[:4], result.record, state.pins, None,
                            state.version + 1, state.gen + 1, result.notes)
        assert state.pins == (pin,)


def test_a_thirty_turn_chinese_conversation_keeps_every_planted_fact_after_every_fold():
    facts = ["2025年3月14日", "王芳", "INC-4471", "9000欧元", "杭州", "3个副本"]
    plants = {1: "我叫林伟，工单号是INC-4471。", 2: "项目在2025年3月14日上线，负责人是王芳。",
              3: "预算为9000欧元，集群需要3个副本。", 4: "我住在杭州。"}
    filler = "我们聊聊天气吧，今天阳光很好，适合出去走走，顺便买点水果。"
    answer = "好的。" + "这是一个很好的问题，我们可以从几个方面来看，先了解背景，再比较不同做法的优缺点。" * 3
    state = ThreadState()
    record, notes = Record(), ()
    messages: list[ThreadMessage] = []
    for n in range(1, 31):
        messages += [message(f"u{n}", "user", plants.get(n, filler)), message(f"a{n}", "assistant", answer)]
        state = ThreadState(tuple(messages), record, (), None, n, n, notes)
        if not c.compaction_due(len(messages), c.uncompacted_tokens(messages, COUNTER), LIMITS, BUDGET):
            continue
        result = compose(state)
        plan = plan_of(state)
        messages, record, notes = list(plan.kept), result.record, result.notes
        memory = "\n".join([record.render(), *notes, *(m.text for m in messages)])
        assert [f for f in facts if f not in memory] == []
    assert record.render().startswith("Statements kept from earlier turns:\n")


def test_the_fact_guard_refuses_a_result_that_lost_a_fact_by_accident(monkeypatch):
    import importlib

    compose_module = importlib.import_module("app.memory.compaction.compose")

    def lossy(record, **kwargs):
        from app.memory.compaction.record import FitReport
        return Record(record.first_turn, record.last_turn, record.lines[:-1]), FitReport()

    monkeypatch.setattr(compose_module, "fit_record", lossy)
    with pytest.raises(c.FactGuardFailure):
        compose(thread(6, texts=planted))


def test_a_record_written_under_the_earlier_header_reads_the_same():
    lines = "- Person: I am Marta.\n- Assistant: Oslo has 700000 people.\n(turns 1–2 of this conversation)"
    old, new = read_record("Earlier turns, kept as notes:\n" + lines), read_record(HEADER + "\n" + lines)
    assert old == new and [line.kind for line in new.lines] == [PERSON, ASSISTANT]
    assert new.render() == HEADER + "\n" + lines


def test_a_record_the_policy_could_not_fit_is_never_returned(monkeypatch):
    """When fitting leaves the record over the summary limit (a step switched off by the ablation, or a bug), the
    fold raises and writes nothing: the stored state would no longer validate (its summary over the limit)."""
    import importlib

    from app.memory.compaction.record import FitReport
    compose_module = importlib.import_module("app.memory.compaction.compose")  # the module, not the function
    limits = MemoryLimits(summary_max_chars=200)
    state = thread(6, texts=planted)
    assert len(compose(state, limits=limits).summary) <= 200  # the policy fits it
    monkeypatch.setattr(compose_module, "fit_record", lambda record, **_: (record, FitReport()))
    with pytest.raises(c.RecordOverLimit, match="characters after fitting; at most 200"):
        compose(state, limits=limits)


def test_composing_turns_again_adds_no_second_answer_line_for_a_turn_already_written():
    """A refinement composes folded turns once more (app/compaction/service.py: refine_plan); what memory knows
    has grown meanwhile, so another sentence of the same answer may add "new" facts: it is not appended."""
    answer = "Redis listens on port 6379. PostgreSQL listens on port 5432."
    first = thread(6, texts=lambda n: ("Which ports do the databases use?", answer) if n == 1 else
                   (f"What about question number {n}?", LONG_ANSWER))
    record = compose(first).record
    [written] = [line for line in record.lines if line.kind == ASSISTANT]
    assert written.text == "PostgreSQL listens on port 5432."
    kept = first.messages[2:]
    plan = c.CompactionPlan(folded=first.messages[:2], kept=kept, folded_turns=1, kept_turns=len(kept) // 2,
                            expected_gen=first.gen, version=first.version, message_token_limit=1000)
    known = replace(record, lines=record.lines + (RecordLine(PERSON, "PostgreSQL listens on port 5432.", 2),))
    base = replace(first, messages=kept, record=known, folded_turns=0)
    again = c.compose(base, plan, None, limits=LIMITS, counter=COUNTER, prompt_budget=BUDGET, require_gain=False)
    assert [line for line in again.record.lines if line.kind == ASSISTANT] == [written]
