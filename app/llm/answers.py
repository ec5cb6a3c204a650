"""Field checks for the pydantic models of structured answers, whose errors read as instructions.

What a validator raises is told to the model when it is asked again (``StructuredClient.ask``),
so the messages say what to answer: ``status must be "done" or "blocked"``.  A missing field
gets the same message as a wrong one.

* ``one_of("status", "done", "blocked")``: one of the strings; its field's type is
  ``Literal["done", "blocked"]`` (a JSON-schema ``enum``).
* ``text("output", max_chars=4000)``: a string, trimmed (and cut); ``non_blank=True`` refuses a blank one.

Both return the metadata of an ``Annotated`` type (a validator and the field's default): name the type at
module level with the field's Python type first, then annotate fields with the name::

    Status = Annotated[Literal["done", "blocked"], *one_of("status", "done", "blocked")]
    Output = Annotated[str, *text("output", max_chars=4000)]

(the Python type is written out so that type checkers read it; pydantic reads the metadata).
"""

from __future__ import annotations

from typing import Any

from pydantic import BeforeValidator, Field


def one_of(field: str, *values: str) -> tuple[Any, ...]:
    """The checks of an answer field that must be one of ``values`` (its type: ``Literal[values]``)."""
    message = f"{field} must be " + " or ".join(f'"{v}"' for v in values)

    def check(value: object) -> object:
        if value not in values:
            raise ValueError(message)
        return value

    return BeforeValidator(check), Field(default=None, validate_default=True)


def text(field: str, *, non_blank: bool = False, max_chars: int | None = None) -> tuple[Any, ...]:
    """The checks of an answer field that must be a string (not blank with ``non_blank``), kept trimmed and
    at most ``max_chars`` characters (its type: ``str``)."""
    message = f"{field} must be a non-empty string" if non_blank else f"{field} must be a string"

    def check(value: object) -> str:
        if not isinstance(value, str) or (non_blank and not value.strip()):
            raise ValueError(message)
        return value.strip()[:max_chars]

    return BeforeValidator(check), Field(default=None, validate_default=True)
