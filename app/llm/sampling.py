"""What a chat turn asks of the model besides its prompt: the answer's token bound and the sampler settings
(docs/contract.md: Configuration; README: The bundled model).

``answer_options(settings)`` is merged into every streamed chat request (``app.llm.client.LLMClient``) before
the producer's own arguments, which win.

A hosted provider gets only ``max_tokens``.  The bundled model (llama.cpp's server) also gets its repetition
samplers, each a field of llama.cpp's ``/v1/chat/completions`` body (``BUNDLED_SAMPLERS``): the small model
otherwise loops (one sentence ten times, a numbered list that restarts) or copies an earlier answer:

- DRY ("don't repeat yourself"): a token that would extend a sequence already in the context (prompt included)
  beyond ``dry_allowed_length`` tokens is penalised by ``dry_multiplier * dry_base ** (length - allowed)``,
  over the last ``dry_penalty_last_n`` tokens (``MODEL_CONTEXT_TOKENS``: the whole context; this llama.cpp
  refuses -1), so neither a line of the answer nor a
  stretch of an earlier answer can be written again;
- ``repeat_penalty`` over the last ``repeat_last_n`` tokens, and OpenAI-style ``presence_penalty`` /
  ``frequency_penalty``: mild, so names and the person's own words can still be used.
"""

from __future__ import annotations

from app.settings import Settings

BUNDLED_SAMPLERS = {
    "dry_multiplier": 0.8,
    "dry_base": 1.75,
    "dry_allowed_length": 3,
    "repeat_penalty": 1.1,
    "repeat_last_n": 256,
    "presence_penalty": 0.3,
    "frequency_penalty": 0.3,
}
"""llama.cpp sampler fields sent with every chat turn to the bundled model (see the module docstring)."""


def answer_options(settings: Settings) -> dict:
    """The chat-completion fields of a turn's request.

    Returns:
        ``{"max_tokens": settings.answer_max_tokens}`` (tokens; ``ANSWER_MAX_TOKENS``) and, with the bundled model
        (``BUNDLED_MODEL``), the ``BUNDLED_SAMPLERS`` fields and ``dry_penalty_last_n`` (tokens: the whole context).
    """
    options: dict = {"max_tokens": settings.answer_max_tokens}
    if settings.bundled_model:
        options.update(BUNDLED_SAMPLERS, dry_penalty_last_n=settings.model_context_tokens)
    return options
