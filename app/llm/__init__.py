"""The LLM side: the openai SDK client and error mapping (``provider``), streaming chat (``client``),
structured (JSON) answers on one ladder of ``response_format`` modes (``structured``, ``answers``)."""
