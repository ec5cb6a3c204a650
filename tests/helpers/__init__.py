"""Helpers shared by several test modules (no fixtures, no tests: fixtures live in ``tests/fixtures/``).

- ``config_env``: production environments for the entry points run as subprocesses, and the check of a
  ``config error`` line.
- ``processes``: the Procfile's process types run as the platform runs them; a process tree from /proc.
- ``model_server``: the bundled model's real llama.cpp server (``scripts/model_server.py``).
- ``tool_scripts``: fake-model scripts and predicates for tool and task-list turns, and thread read-backs.
- ``browser``: Playwright steps on the chat page (connect, send, wait).
- ``errors``: answers that must not show exception text.
"""
