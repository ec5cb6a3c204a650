"""When a turn recalls archived turns, and how much (docs/contract.md: ``MEMORY_RECALL_WHEN``,
``MEMORY_RECALL_MAX_TOKENS``; docs/memory.md: Recall)."""

from __future__ import annotations

import pytest

from app.chat.turn import asks_something
from app.settings import BUNDLED_RECALL_MAX_TOKENS, Settings


@pytest.mark.parametrize("text, asks", [
    ("What was the hotel I picked?", True),
    ("Remind me of the hotel, please. Tell me its name.", True),
    ("Can you list the three options again?", True),
    ("I moved to Berlin last week, do you know a good cafe?", True),
    ("我上次订的是哪家酒店？", True),
    ("请告诉我那个酒店的名字", True),
    ("I went to a support group yesterday and it was so powerful.", False),
    ("My sister arrives on Friday.", False),
    ("我妹妹周五到。", False),
    ("Thanks!", False),
    # typed without the mark (docs/ablation.md: en unmarked)
    ("what's the name of my hotel", True),
    ("where do I live", True),
    ("你记得我住在哪吗", True),
    ("我的发布推迟到哪天了", True),  # an interrogative: recall runs, the record still keeps such a sentence
    ("whats my name", True),
    ("Have fun at the hotel", False),
    ("When I was young we lived in Lyon", False),
])
def test_a_message_asks_when_one_of_its_sentences_is_a_question_or_a_request(text, asks):
    assert asks_something(text) is asks


def test_auto_recalls_only_on_asks_with_the_bundled_model_and_caps_its_tokens():
    bundled = Settings.from_env({"BUNDLED_MODEL": "1", "MODEL_CONTEXT_TOKENS": "8192", "RESERVED_OUTPUT_TOKENS": "1024"})
    assert bundled.recall_asks_only is True
    assert bundled.recall_share_cap == pytest.approx(BUNDLED_RECALL_MAX_TOKENS / 7168)
    hosted = Settings.from_env({"MODEL_CONTEXT_TOKENS": "8192", "RESERVED_OUTPUT_TOKENS": "1024"})
    assert hosted.recall_asks_only is False
    assert hosted.recall_share_cap == pytest.approx(0.15)


def test_the_variables_override_auto_and_zero_means_no_cap():
    s = Settings.from_env({"BUNDLED_MODEL": "1", "MEMORY_RECALL_WHEN": " Always ", "MEMORY_RECALL_MAX_TOKENS": "0"})
    assert s.recall_asks_only is False and s.recall_share_cap == pytest.approx(0.15)
    s = Settings.from_env({"MEMORY_RECALL_WHEN": "asks", "MEMORY_RECALL_MAX_TOKENS": "300",
                           "MODEL_CONTEXT_TOKENS": "4096", "RESERVED_OUTPUT_TOKENS": "1096"})
    assert s.recall_asks_only is True and s.recall_share_cap == pytest.approx(0.1)
    s = Settings.from_env({"MEMORY_RECALL_SHARE": "0", "MEMORY_RECALL_MAX_TOKENS": "300"})
    assert s.recall_share_cap == 0.0


def test_with_recall_on_asks_a_statement_turn_recalls_nothing_and_a_question_recalls(
        make_live_app, app_settings, fake_llm, store):
    """Over the socket of a served app (``MEMORY_RECALL_WHEN=asks``): a folded turn reaches the prompt for a
    question that matches it, and no recall section is sent for a statement that matches it as well."""
    from app.memory.final_turn import FinalTurn
    from chat_support.fake_llm import Reply
    from chat_support.live_app import ChatClient
    from tests.fixtures.memory_data import CREATED, text_record
    from tests.fixtures.streamed_chat import seed_memory

    chat = ChatClient(make_live_app(app_settings.with_overrides(recall_when="asks", recall_max_tokens=160))).connect()
    try:
        thread_id = chat.thread()["threadId"]
        seed_memory(store, thread_id, turns=6, fold_turns=2, summary="They talked.", prefix="stored")
        store.commit_final_turn(thread_id, FinalTurn("My sister Ana is allergic to peanuts, remember it.", "Noted."))
        store.commit_final_turn(thread_id, FinalTurn("stored question 8", "stored answer 8"))
        state = store.load(thread_id)
        assert store.apply_compaction(thread_id, expected_gen=state.gen,
                                      folded_ids=[m.id for m in state.messages[:-2]], record=text_record("They talked."),
                                      notes=[], compacted_at=CREATED).outcome == "applied"
        fake_llm.default = Reply(text="Noted.")

        def recalled() -> list[str]:
            return [m["content"] for m in fake_llm.last_request().messages[1:]  # after the system prompt
                    if m["role"] == "system" and "<recalled>" in m["content"]]

        assert chat.turn("Ana's peanut allergy got worse this winter.")[-1]["status"] == "completed"
        assert recalled() == []
        assert chat.turn("Who is allergic to peanuts?")[-1]["status"] == "completed"
        [section] = recalled()
        assert "- Person (turn 7): My sister Ana is allergic to peanuts, remember it." in section
    finally:
        chat.close()


def test_the_prompt_fold_step_is_four_with_the_bundled_model_unless_set():
    assert Settings.from_env({"BUNDLED_MODEL": "1"}).fold_step == 4
    assert Settings.from_env({}).fold_step == 1
    assert Settings.from_env({"BUNDLED_MODEL": "1", "MEMORY_PROMPT_FOLD_STEP": "1"}).fold_step == 1
    assert Settings.from_env({"MEMORY_PROMPT_FOLD_STEP": "3"}).fold_step == 3
