"""What a chat turn asks of the model besides its prompt: the answer's token bound and the sampler settings
(docs/contract.md: Configuration; docs/bundled-model.md: The bundled model).

``answer_options(settings)`` is merged into every streamed chat request (``app.llm.client.LLMClient``) before
the producer's own arguments, which win.

A hosted provider gets only ``max_tokens``.  The bundled model (llama.cpp's server) also gets its repetition
samplers, each a field of llama.cpp's ``/v1/chat/completions`` body (``BUNDLED_SAMPLERS``; each one verified to be
honoured: the server's ``generation_settings`` echo them, and "write this sentence twenty times" ends in 119
tokens of distinct numbered lines instead of 200 tokens of one line): the small model otherwise loops (one
sentence ten times, a numbered list that restarts) or copies an earlier answer.

- DRY ("don't repeat yourself"): a token that would extend a sequence already among the last
  ``dry_penalty_last_n`` tokens beyond ``dry_allowed_length`` tokens is penalised by
  ``dry_multiplier * dry_base ** (length - allowed)``.  The window is the answer's cap (``ANSWER_MAX_TOKENS``): the
  answer itself and the end of its prompt (the new message, the answer before it), so an answer cannot repeat a
  line of itself nor copy the previous answer; llama.cpp counts the prompt's tokens in that window, and over the
  whole context DRY kept the person's own facts from being quoted (asked for a planted locker code "4817", the
  model wrote "1234" or "4815");
- ``repeat_penalty``, ``presence_penalty`` and ``frequency_penalty`` are sent neutral (1.0, 0, 0): they penalise
  single tokens of the prompt too, digits included, and made the model misquote numbers ("B 12" for "B12").
  Measured on three planted facts x 3 seeds (bench-like prompts, the real server): all on 5 of 9 right, DRY alone
  over the answer's window with ``dry_allowed_length`` 5 8 of 9, none 9 of 9.
"""

from __future__ import annotations

from app.settings import Settings

BUNDLED_SAMPLERS = {
    "dry_multiplier": 0.8,
    "dry_base": 1.75,
    "dry_allowed_length": 5,
    "repeat_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
}
"""llama.cpp sampler fields sent with every chat turn to the bundled model (see the module docstring)."""


def answer_options(settings: Settings) -> dict:
    """The chat-completion fields of a turn's request.

    Returns:
        ``{"max_tokens": settings.answer_max_tokens}`` (tokens; ``ANSWER_MAX_TOKENS``) and, with the bundled model
        (``BUNDLED_MODEL``), the ``BUNDLED_SAMPLERS`` fields and ``dry_penalty_last_n`` (tokens: the answer cap).
    """
    options: dict = {"max_tokens": settings.answer_max_tokens}
    if settings.bundled_model:
        options.update(BUNDLED_SAMPLERS, dry_penalty_last_n=settings.answer_max_tokens)
    return options
