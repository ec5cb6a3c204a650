"""The chat runtime: tools, MCP-style resources, the task-list agent and the delivery workflow.

Each is a turn *producer* (``app.runtime.producer.Producer``): it may stream text and display-only
``tool``/``progress`` frames, and it returns one final result.  Only that result's texts
enter memory, through the turn runner and the final-turn adapter.  Everything else a
producer makes (tool arguments and results, resource contents, plans, task outputs,
checkpoints, artifacts) lives in the turn's own prompt or in the runtime's Redis keys
``run:{hex}:...`` with their own TTL, which neither hydration nor prompt assembly reads.

Modules: ``producer`` (the interface: ``Producer``, ``TurnIO``, ``ProducerResult``), ``chat``
(the one streaming loop, and plain chat), ``tools`` and ``resources`` (the built-in tools and
documents), ``tool_chat`` (chat with tools), ``tasklist`` (``/tasklist``), ``delivery``
(``/delivery``), ``run_store`` (run state), ``llm_calls`` (non-streaming model calls),
``capabilities`` (whether tools are offered), ``budget`` (prompt room), ``producers`` (dispatch).
The runtime imports nothing of ``app.chat`` or ``app.web``: the turn runner implements ``TurnIO``.
"""
