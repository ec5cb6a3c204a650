"""The compaction model's answer: exactly ``{"summary", "pinnedDecisions"}``, checked before anything is used.

``summary`` is the fold's gist (one ``About:`` line of the record, at most
``GIST_MAX_CHARS``); ``pinnedDecisions`` are proposed decisions, kept as notes
only when grounded (``notes.note_problem``).  Which messages remain,
``lastCompactedAt`` and versions are never taken from the answer.

``CompactionAnswer`` (pydantic) gives both the JSON schema sent to the provider
(``app.llm.structured.answer_schema``) and the validation of what comes back;
``gist_problems`` refuses a gist that names a
fact not found in the folded turns (an invented name, number or date, or one
copied from older memory).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Iterable

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from app.memory.compaction.facts import extract_facts, fact_present
from app.memory.compaction.prompt import GIST_MAX_CHARS, NOTES_PER_COMPACTION


class AnswerProblem(StrEnum):
    """Why a compaction answer is not accepted (``InvalidCompactionOutput.kind``; logged, never stored)."""

    SHAPE = "shape"
    LIMIT = "limit"
    UNGROUNDED = "ungrounded"
    GROWTH = "growth"


class InvalidCompactionOutput(ValueError):
    """The model's answer is not acceptable.

    Attributes:
        kind: ``shape`` (not a JSON object, missing or extra keys, wrong types, empty
            summary: a failure), ``limit`` (over a limit), ``ungrounded`` (the gist names
            facts the turns do not hold) or ``growth`` (memory would not shrink enough);
            the last three are asked once more, then the fold goes on without the answer.
        problems: sentences naming each problem (for logs and for the model's second
            attempt; never shown to people, never stored).
    """

    def __init__(self, kind: AnswerProblem, problems: list[str]):
        super().__init__("; ".join(problems))
        self.kind = kind
        self.problems = problems


class CompactionAnswer(BaseModel):
    """What a compaction model answers (its JSON schema is sent as the response format)."""

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True, strict=True)

    summary: str = Field(min_length=1, max_length=GIST_MAX_CHARS,
                         description="One or two short sentences on what the folded turns were about.")
    pinnedDecisions: list[str] = Field(default_factory=list, max_length=NOTES_PER_COMPACTION,
                                       description="What the person decided, ruled out or prefers.")

    @field_validator("pinnedDecisions")
    @classmethod
    def _drop_blank(cls, value: list[str]) -> list[str]:
        return [v.strip() for v in value if v.strip()]


def validate_answer(raw: Any) -> CompactionAnswer:
    """Check a parsed model answer.

    Raises:
        InvalidCompactionOutput: ``shape`` for a non-object, missing or extra keys, wrong
            types or an empty summary; ``limit`` when only lengths or counts are passed.
    """
    if not isinstance(raw, dict):
        raise InvalidCompactionOutput(AnswerProblem.SHAPE, ["the answer must be a JSON object"])
    try:
        return CompactionAnswer.model_validate(raw)
    except ValidationError as exc:
        problems, limit_only = [], True
        for error in exc.errors():
            where = ".".join(str(p) for p in error["loc"]) or "answer"
            limit_only = limit_only and error["type"] in {"string_too_long", "too_long"}
            problems.append(f"{where}: {error['msg']}")
        if limit_only:
            problems.append(f"limits: summary at most {GIST_MAX_CHARS} characters; at most "
                            f"{NOTES_PER_COMPACTION} pinnedDecisions")
        raise InvalidCompactionOutput(AnswerProblem.LIMIT if limit_only else AnswerProblem.SHAPE, problems) from None


def gist_problems(gist: str, sources: Iterable[str]) -> list[str]:
    """Facts (names, numbers, dates, identifiers) in ``gist`` that appear in none of ``sources``."""
    text = "\n".join(sources)
    return [f for f in extract_facts(gist) if not fact_present(f, text)]
