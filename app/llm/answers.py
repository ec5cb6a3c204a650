"""Field types for the pydantic models of structured answers, whose errors read as instructions.

What a validator raises is told to the model when it is asked again (``StructuredClient.ask``),
so the messages say what to answer: ``status must be "done" or "blocked"``.  A missing field
gets the same message as a wrong one.

* ``one_of("status", "done", "blocked")``: one of the strings (a JSON-schema ``enum``).
* ``text("output", max_chars=4000)``: a string, trimmed (and cut); ``non_blank=True`` refuses a blank one.

Both return an ``Annotated`` type: name it at module level and annotate fields with the name
(``Status = one_of(...)``, then ``status: Status``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field


def one_of(field: str, *values: str) -> Any:
    """An answer field that must be one of ``values``."""
    message = f"{field} must be " + " or ".join(f'"{v}"' for v in values)

    def check(value):
        if value not in values:
            raise ValueError(message)
        return value

    return Annotated[Literal[values], BeforeValidator(check), Field(default=None, validate_default=True)]


def text(field: str, *, non_blank: bool = False, max_chars: int | None = None) -> Any:
    """An answer field that must be a string (not blank with ``non_blank``); kept trimmed, at most ``max_chars``
    characters."""
    message = f"{field} must be a non-empty string" if non_blank else f"{field} must be a string"

    def check(value):
        if not isinstance(value, str) or (non_blank and not value.strip()):
            raise ValueError(message)
        return value.strip()[:max_chars]

    return Annotated[str, BeforeValidator(check), Field(default=None, validate_default=True)]
