"""Compaction, the pure part: when it is due, what to fold, what the model is asked, and what is written.

No Flask, Redis, Celery or openai here (``app.compaction`` does the I/O):

- ``policy``: when a compaction is due, which whole turns it folds, the token caps.
- ``forms``: which of a person's sentences the record keeps, by form (English and Chinese).
- ``facts``: the fact guard's reader (English and Chinese) and checks (a gist invents nothing; figures).
- ``record``: which numbered statements the record keeps, appended per fold and fitted to its limits.
- ``notes``: the model's proposed decisions, kept as notes only when grounded.
- ``prompt``: the model's prompt (only the folded turns; a short gist and proposals back).
- ``answer``: the model's answer, validated.
- ``compose``: what is written, checked by the fact guard and the gain rule.
"""

from app.memory.compaction.answer import AnswerProblem, CompactionAnswer, InvalidCompactionOutput, validate_answer
from app.memory.compaction.compose import (
    CompactionResult,
    FactGuardFailure,
    RecordOverLimit,
    Strategy,
    compose,
    memory_cost,
    messages_cost,
)
from app.memory.compaction.facts import check_facts, extract_facts, fact_present, facts_of, states_decision
from app.memory.compaction.notes import normalize_pin
from app.memory.compaction.policy import (
    CompactionPlan,
    compaction_due,
    hard_cap_messages,
    notes_token_cap,
    plan_compaction,
    summary_token_cap,
    uncompacted_tokens,
)
from app.memory.compaction.prompt import (
    MAX_OUTPUT_TOKENS,
    PromptTooLong,
    build_compaction_prompt,
    fixed_prompt_tokens,
    gist_chars,
)

__all__ = [
    "AnswerProblem", "Strategy",
    "MAX_OUTPUT_TOKENS", "CompactionAnswer", "CompactionPlan", "CompactionResult", "FactGuardFailure", "RecordOverLimit",
    "InvalidCompactionOutput", "PromptTooLong", "build_compaction_prompt",
    "check_facts", "compaction_due", "compose", "extract_facts", "fact_present", "facts_of",
    "fixed_prompt_tokens", "gist_chars", "hard_cap_messages", "memory_cost", "messages_cost", "normalize_pin",
    "notes_token_cap", "plan_compaction", "states_decision", "summary_token_cap",
    "uncompacted_tokens", "validate_answer",
]
