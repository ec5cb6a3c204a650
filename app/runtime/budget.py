"""Token room for what the runtime adds to a turn's prompt (tool definitions, tool results, run notes).

The assembled prompt of a turn already fits ``MODEL_CONTEXT_TOKENS - RESERVED_OUTPUT_TOKENS``
(``AssembledContext.budget``).  Whatever the runtime adds inside the turn must fit in what is
left, so long tool results and run notes are cut to the room there is.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from app.memory.text import clip_to_tokens

if TYPE_CHECKING:
    from app.memory.tokens import TokenCounter

TRUNCATED = "\n[cut to fit the model's context]"


class Room:
    """Tokens still free in a turn's prompt.

    Args:
        counter: the chat model's ``TokenCounter``.
        budget: tokens the prompt may use (``AssembledContext.budget``).
        used: tokens already used (``AssembledContext.prompt_tokens``).
    """

    def __init__(self, counter: TokenCounter, budget: int, used: int) -> None:
        self.counter = counter
        self.budget = budget
        self.used = used

    @property
    def left(self) -> int:
        """Tokens still free (never negative)."""
        return max(0, self.budget - self.used)

    def cost(self, value: object) -> int:
        """Tokens of a text, or of a JSON value (dumped compactly)."""
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, separators=(",", ":"))
        return self.counter.count(text)

    def take(self, tokens: int) -> None:
        """Use ``tokens`` of the room."""
        self.used += tokens

    def clip(self, text: str, max_tokens: int) -> str:
        """``text`` cut (with a notice) to at most ``max_tokens`` tokens; "" when there is no room."""
        return clip_to_tokens(text, max_tokens, self.counter.count, mark=TRUNCATED)
