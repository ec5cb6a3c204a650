"""What a chat turn asks of the model besides its prompt: the answer's token bound and the sampler settings
(docs/contract.md: Configuration; README: The bundled model).

``answer_options(settings)`` is merged into every streamed chat request (``app.llm.client.LLMClient``) before
the producer's own arguments, which win.
"""

from __future__ import annotations

from app.settings import Settings


def answer_options(settings: Settings) -> dict:
    """The chat-completion fields of a turn's request: ``{"max_tokens": int, ...}`` (tokens)."""
    return {"max_tokens": settings.reserved_output_tokens}
