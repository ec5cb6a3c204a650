"""Compaction with I/O: asking for one after a turn (``requests``) and running one (``service``).

The rules are pure and live in ``app.memory.compaction``; the Celery task in
``workers/tasks.py`` only calls ``service.run_compaction``.  The web side asks for
compactions through ``requests.CompactionRequests``, which publishes the task by
name, so nothing under ``app`` imports the worker package.
"""
