"""Is the configured model endpoint answering?  The model half of ``GET /healthz`` (docs/memory.md: Identity and
degradation).

The probe is one cheap request, ``GET {OPENAI_BASE_URL}/models`` (the SDK's default base URL when unset) with
the configured API key, cached for ``CACHE_SECONDS`` per endpoint and process so frequent health checks stay
cheap.  Outcomes:

- ``"down"``: the connection is refused or reset, times out while connecting, the server closes it without an
  answer (a crashed process), or answers 5xx, 401 or 403 (every turn would fail the same way);
- ``"up"``: any other HTTP answer (some OpenAI-compatible servers have no ``/models``: a 404 still shows a
  live server), or the connection was accepted but the answer is slow: some single-threaded servers answer
  ``/models`` only between completions, so while a long reply streams the probe waits in their queue; a busy
  server is not a dead one.  (llama.cpp's own server, the bundled model's, answers it from its HTTP threads at
  any time, 503 while it loads the model.)

Never raises; exception text is only logged, as its type name.  Uses ``requests`` (pinned in
``requirements.txt``), which honours the same proxy variables as the ``openai`` SDK's client.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

import requests

from app.settings import Settings

log = logging.getLogger(__name__)

DEFAULT_BASE_URL = "https://api.openai.com/v1"
CACHE_SECONDS = 5.0
CONNECT_TIMEOUT = 1.0  # seconds
READ_TIMEOUT = 2.0  # seconds
DOWN_STATUSES = frozenset({401, 403})


@dataclass
class _Entry:
    status: str
    checked_at: float


class ModelProbe:
    """The cached status of one model endpoint.

    Args:
        base_url: the OpenAI-compatible base URL (``.../v1``).
        api_key: sent as ``Authorization: Bearer``; None sends no header.
        cache_seconds: how long a result is reused.
    """

    def __init__(self, base_url: str, api_key: str | None, cache_seconds: float = CACHE_SECONDS):
        self.url = base_url.rstrip("/") + "/models"
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.cache_seconds = cache_seconds
        self._entry: _Entry | None = None
        self._lock = threading.Lock()

    def status(self) -> str:
        """``"up"`` or ``"down"``, probing at most once per ``cache_seconds`` (concurrent callers wait for it)."""
        entry = self._entry
        if entry is not None and time.monotonic() - entry.checked_at < self.cache_seconds:
            return entry.status
        with self._lock:
            entry = self._entry
            if entry is None or time.monotonic() - entry.checked_at >= self.cache_seconds:
                entry = self._entry = _Entry(self.probe(), time.monotonic())
            return entry.status

    def probe(self) -> str:
        """One uncached request; ``"up"`` or ``"down"`` (see the module docstring)."""
        try:
            response = requests.get(self.url, headers=self.headers, timeout=(CONNECT_TIMEOUT, READ_TIMEOUT),
                                    allow_redirects=False)
        except requests.ReadTimeout:
            return "up"  # connected and queued: a busy server
        except requests.RequestException as exc:
            log.warning("model endpoint %s does not answer: %s", self.url, type(exc).__name__)
            return "down"
        if response.status_code >= 500 or response.status_code in DOWN_STATUSES:
            log.warning("model endpoint %s answered HTTP %s", self.url, response.status_code)
            return "down"
        return "up"


_probes: dict[tuple[str, str | None], ModelProbe] = {}
_probes_lock = threading.Lock()


def model_status(settings: Settings) -> str:
    """``"up"`` or ``"down"`` for the chat model endpoint of ``settings`` (``OPENAI_BASE_URL``, ``OPENAI_API_KEY``)."""
    key = ((settings.openai_base_url or DEFAULT_BASE_URL), settings.openai_api_key)
    with _probes_lock:
        probe = _probes.get(key)
        if probe is None:
            probe = _probes[key] = ModelProbe(*key)
    return probe.status()
