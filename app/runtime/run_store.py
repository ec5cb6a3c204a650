"""Runtime state of task-list and delivery runs, kept apart from ThreadState.

One Redis hash per run, ``run:{<thread hex>}:<run id>`` (built by ``ThreadKeys.run``), with
its own TTL (``RUN_TTL_SECONDS``, refreshed by every save; memory writes never touch it)::

    kind         "tasklist" | "delivery"
    status       planning | running | a ``TurnStatus``: paused, final, completed, blocked, failed, cancelled
    goal         the person's goal
    state        JSON: the plan, progress, stage outputs, what a pause waits for
    checkpoints  JSON list of {"step", "status", "at"} (the last ``MAX_CHECKPOINTS``)
    artifact     the run's Markdown artifact (the task list as a checklist, or the report)
    final        JSON {status, source, userText, text, userId, assistantId} once finished
    createdAt, updatedAt

``run:{<thread hex>}:paused`` names the thread's task-list run waiting for confirmation.

Only ``app.runtime`` reads these keys.  Hydration and prompt assembly read the
ThreadState hash alone, so nothing here can reach a browser or a later prompt.
Redis failures raise ``StoreUnavailable``, as the ThreadState store's do.
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass, field

import redis

from app.memory.state import utc_now_iso
from app.memory.status import TurnStatus
from app.store.keys import ThreadKeys
from app.store.redis_client import StoreClient
from app.store.thread_store import StoreUnavailable

RUN_TTL_SECONDS = 86400  # a paused task list can be resumed for a day
MAX_CHECKPOINTS = 50


def new_run_id() -> str:
    """A fresh run id: ``r_`` + 32 hex characters."""
    return "r_" + uuid.uuid4().hex

log = logging.getLogger(__name__)


def _unavailable(exc: redis.RedisError) -> StoreUnavailable:
    return StoreUnavailable(f"{type(exc).__name__}: {exc}")


@dataclass
class Run:
    """A task-list or delivery run as stored (see the module docstring for the fields)."""

    id: str
    kind: str
    goal: str
    status: str = "planning"
    state: dict = field(default_factory=dict)
    checkpoints: list = field(default_factory=list)
    artifact: str = ""
    final: dict | None = None
    created_at: str = field(default_factory=utc_now_iso)
    updated_at: str = ""

    def checkpoint(self, step: str, status: str) -> None:
        """Record that ``step`` reached ``status`` (kept with the run, never in memory)."""
        self.checkpoints.append({"step": step, "status": status, "at": utc_now_iso()})
        del self.checkpoints[:-MAX_CHECKPOINTS]

    def to_hash(self) -> dict:
        return {
            "kind": self.kind, "status": self.status, "goal": self.goal,
            "state": json.dumps(self.state, ensure_ascii=False),
            "checkpoints": json.dumps(self.checkpoints, ensure_ascii=False),
            "artifact": self.artifact,
            "final": json.dumps(self.final, ensure_ascii=False) if self.final else "",
            "createdAt": self.created_at, "updatedAt": self.updated_at,
        }

    @classmethod
    def from_hash(cls, run_id: str, raw: dict) -> "Run":
        return cls(id=run_id, kind=raw.get("kind", ""), goal=raw.get("goal", ""), status=raw.get("status", ""),
                   state=json.loads(raw.get("state") or "{}"), checkpoints=json.loads(raw.get("checkpoints") or "[]"),
                   artifact=raw.get("artifact", ""), final=json.loads(raw["final"]) if raw.get("final") else None,
                   created_at=raw.get("createdAt", ""), updated_at=raw.get("updatedAt", ""))


class RunStore:
    """Runs of one thread.

    Args:
        client: ``redis.Redis`` with ``decode_responses=True``.
        thread_id: the thread the runs belong to.
        ttl_seconds: expiry of a run's keys, refreshed on every save.

    Every Redis failure raises ``StoreUnavailable`` (its text is for logs only).
    """

    def __init__(self, client: StoreClient, thread_id: str, ttl_seconds: int = RUN_TTL_SECONDS):
        self.redis = client
        self.keys = ThreadKeys(thread_id)
        self.ttl = ttl_seconds

    def save(self, run: Run) -> None:
        """Write the whole run and refresh its TTL."""
        run.updated_at = utc_now_iso()
        name = self.keys.run(run.id)
        try:
            pipe = self.redis.pipeline(transaction=True)
            pipe.hset(name, mapping=run.to_hash())
            pipe.expire(name, self.ttl)
            pipe.execute()
        except redis.RedisError as exc:
            raise _unavailable(exc) from exc

    def finish(self, run: Run, *, status: TurnStatus, text: str, source: str, user_text: str, step: str,
               user_id: str, assistant_id: str) -> None:
        """Mark ``run`` finished with the final turn it produced, and save.

        ``run.final`` keeps the exact turn (texts and stable ids) so a second observer can write it
        again harmlessly: the store's dedupe by message id drops it.

        Raises:
            ValueError: ``status`` does not write memory (``TurnStatus.writes_memory``).
            StoreUnavailable: Redis failed.
        """
        if not TurnStatus(status).writes_memory:
            raise ValueError(f"a run finishing {status} writes no final turn")
        run.status = status
        run.final = {"status": status, "source": source, "userText": user_text, "text": text,
                     "userId": user_id, "assistantId": assistant_id}
        run.checkpoint(step, status)
        self.save(run)

    def save_quietly(self, run: Run) -> None:
        """``save``, logging instead of raising when the store fails (a run that is ending anyway)."""
        try:
            self.save(run)
        except StoreUnavailable:
            log.warning("run %s: state not saved", run.id)

    def load(self, run_id: str) -> Run | None:
        """The run, or None when it is unknown or expired."""
        try:
            raw = self.redis.hgetall(self.keys.run(run_id))
        except redis.RedisError as exc:
            raise _unavailable(exc) from exc
        if not raw:
            return None
        try:
            return Run.from_hash(run_id, raw)
        except (ValueError, KeyError):
            return None

    def set_paused(self, run_id: str) -> None:
        """Make ``run_id`` the thread's run waiting for confirmation (replacing any other)."""
        try:
            self.redis.set(self.keys.paused_run, run_id, ex=self.ttl)
        except redis.RedisError as exc:
            raise _unavailable(exc) from exc

    def paused_id(self) -> str | None:
        """The id of the run waiting for confirmation, without claiming it (None on failure)."""
        try:
            return self.redis.get(self.keys.paused_run)  # type: ignore[return-value]  # decode_responses: str
        except redis.RedisError:
            return None

    def take_paused(self) -> str | None:
        """Claim the run waiting for confirmation (atomic GETDEL: two resumes cannot both get it)."""
        try:
            return self.redis.getdel(self.keys.paused_run)  # type: ignore[return-value]  # decode_responses: str
        except redis.RedisError as exc:
            raise _unavailable(exc) from exc

    def drop_paused(self) -> str | None:
        """Forget the waiting run: mark it cancelled and release it; returns its id (or None)."""
        run_id = self.take_paused()
        if run_id:
            run = self.load(run_id)
            if run is not None:
                run.status = "cancelled"
                run.checkpoint("dropped", "cancelled")
                self.save(run)
        return run_id
