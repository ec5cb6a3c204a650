"""The web layer: every HTTP route and the rules around them.

- ``routes``: the chat page, hydration, clearing a thread, health.
- ``api``: the JSON API by feature (stats and inspector, pins, feedback, metrics).
- ``responses``: ``guarded_json`` and the one JSON error shape, ``error_response``, with its handlers.
- ``security``: same-origin rules, including the chat blueprint's websocket origin check.

The web layer may import the chat layer (``app.chat``); the chat layer never imports this one.
"""
