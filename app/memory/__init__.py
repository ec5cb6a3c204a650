"""The memory domain: pure Python value types and rules, no Flask, Redis, Celery or openai.

The seed design in a few modules:

- ``state``: ThreadMessage, Pin, ThreadState.
- ``record``: the record of the folded turns as data (its lines, its text, its stored form).
- ``migration``: the one reader of a stored record, in every shape a version wrote.
- ``limits``: MemoryLimits, the bounds of one ThreadState.
- ``schemas``: marshmallow schemas for the stored state, the compaction output and the hydration DTO.
- ``final_turn``: which finished turns are written and how their text is cleaned.
- ``tokens``: tiktoken token counting with a cache.
- ``context``: the prompt for a turn, under a token budget.
- ``recall``: BM25 retrieval of folded turns from the thread's archive, within a share of the budget.
- ``compaction``: what to fold, the compaction prompt, the fact guard, the pin merge.
- ``hydration``: the browser's view of a thread and the forbidden-key guard.
"""
