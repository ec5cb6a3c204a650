"""What a chat turn asks of the model besides its prompt (``app.llm.sampling``) and the answer-cap settings."""

from __future__ import annotations

import pytest

from app.llm.sampling import BUNDLED_SAMPLERS, answer_options
from app.settings import (
    BUNDLED_ANSWER_MAX_TOKENS,
    BUNDLED_PROMPT_ANSWER_MAX_TOKENS,
    DEFAULT_SYSTEM_PROMPT,
    ConfigError,
    Settings,
)


def test_hosted_provider_gets_only_max_tokens_of_the_reserved_output():
    assert answer_options(Settings()) == {"max_tokens": 1024}
    assert answer_options(Settings(reserved_output_tokens=700)) == {"max_tokens": 700}


def test_bundled_model_gets_the_short_cap_and_llama_cpp_repetition_samplers():
    options = answer_options(Settings(bundled_model=True))
    assert options == {"max_tokens": BUNDLED_ANSWER_MAX_TOKENS, "dry_multiplier": 0.8, "dry_base": 1.75,
                       "dry_allowed_length": 5, "dry_penalty_last_n": 224, "repeat_penalty": 1.0,
                       "presence_penalty": 0.0, "frequency_penalty": 0.0}
    assert BUNDLED_ANSWER_MAX_TOKENS == 224
    assert set(BUNDLED_SAMPLERS) < set(options)
    # DRY looks back over as many tokens as an answer may take
    assert answer_options(Settings(bundled_model=True, answer_max_tokens_setting=300))["dry_penalty_last_n"] == 300


def test_answer_max_tokens_setting_wins_and_never_exceeds_reserved_output():
    assert answer_options(Settings(bundled_model=True, answer_max_tokens_setting=400))["max_tokens"] == 400
    assert answer_options(Settings(answer_max_tokens_setting=300)) == {"max_tokens": 300}
    # auto with the bundled model stays under a smaller reserve
    assert answer_options(Settings(bundled_model=True, reserved_output_tokens=128))["max_tokens"] == 128
    with pytest.raises(ConfigError, match="ANSWER_MAX_TOKENS must not be larger than RESERVED_OUTPUT_TOKENS"):
        Settings.from_env({"ANSWER_MAX_TOKENS": "2000", "RESERVED_OUTPUT_TOKENS": "1024"})
    with pytest.raises(ConfigError, match="ANSWER_MAX_TOKENS must be at least 16"):
        Settings.from_env({"ANSWER_MAX_TOKENS": "3"})
    assert Settings.from_env({"ANSWER_MAX_TOKENS": "512"}).answer_max_tokens == 512
    assert Settings.from_env({"ANSWER_MAX_TOKENS": "", "BUNDLED_MODEL": "1"}).answer_max_tokens == 224


def test_prompt_answer_window_is_bundled_only_by_default():
    assert Settings().prompt_answer_max_tokens == 0
    assert Settings(bundled_model=True).prompt_answer_max_tokens == BUNDLED_PROMPT_ANSWER_MAX_TOKENS == 96
    assert Settings.from_env({"MEMORY_PROMPT_ANSWER_MAX_TOKENS": "0", "BUNDLED_MODEL": "1"}) \
        .prompt_answer_max_tokens == 0
    assert Settings.from_env({"MEMORY_PROMPT_ANSWER_MAX_TOKENS": "200"}).prompt_answer_max_tokens == 200
    with pytest.raises(ConfigError, match="MEMORY_PROMPT_ANSWER_MAX_TOKENS must be 0 .no limit. or at least 16"):
        Settings.from_env({"MEMORY_PROMPT_ANSWER_MAX_TOKENS": "5"})


def test_system_prompt_asks_for_short_answers_in_the_persons_language_and_never_mentions_memory():
    assert Settings().system_prompt == DEFAULT_SYSTEM_PROMPT
    text = DEFAULT_SYSTEM_PROMPT.lower()
    for asked in ("briefly", "language of their latest message", "never repeat yourself", "never quote earlier"):
        assert asked in text
    # "as a record" was echoed by the bundled model as "Here's a record of what I wrote ...", and the tags named
    # here were answered as "Record: ... Recalled: ..." from the first turn on
    assert "record" not in text and "recalled" not in text and "<" not in text
