"""Tool and task-list turns against the fake model: rule predicates, scripted task lists, read-backs.

- Predicates on a chat request's body: ``has_tool_results``, ``stage(marker)``, ``planner``, ``worker_for(n)``,
  ``finisher``, ``blocker``; ``system_text`` / ``last_user`` read it.
- ``script_tasklist(fake_llm, ...)``: the fake model answers a whole task list (plan, each task, the summary).
- ``matching(fake_llm, predicate)``: the chat requests that satisfied ``predicate``.
- ``texts(client)``: the stored thread as ``(role, text)``; ``only_run(redis, thread_id)``: the thread's one run.
"""

from __future__ import annotations

from app.runtime.run_store import RunStore
from app.store.keys import ThreadKeys
from chat_support.fake_llm import Reply
from chat_support.live_app import ChatClient


def texts(client: ChatClient) -> list[tuple[str, str]]:
    """The thread as ``(role, text)`` pairs, read through ``GET /api/chat/thread``."""
    return [(m["role"], m["text"]) for m in client.thread()["messages"]]


def system_text(body: dict) -> str:
    return "\n".join(m.get("content") or "" for m in body.get("messages", []) if m.get("role") == "system")


def last_user(body: dict) -> str:
    return next((m.get("content") or "" for m in reversed(body.get("messages", [])) if m.get("role") == "user"), "")


def has_tool_results(body: dict) -> bool:
    return any(m.get("role") == "tool" for m in body.get("messages", []))


def stage(marker: str):
    """A fake-LLM rule predicate: the request's system messages contain ``marker``."""
    return lambda body: marker in system_text(body)


def planner(body):
    return stage("Plan the person's goal")(body)


def worker_for(task_no: int):
    return lambda body: stage("working through a task list")(body) and f"Current task ({task_no} of" in last_user(body)


def finisher(body):
    return stage("task list for the person's goal is finished")(body)


def blocker(body):
    return stage("task list for the person's goal stopped")(body)


def matching(fake_llm, predicate) -> list:
    """The chat requests whose body satisfies ``predicate``, oldest first."""
    return [r for r in fake_llm.chat_requests() if predicate(r.body)]


def run_keys(redis_client, thread_id: str) -> list[str]:
    """The Redis keys of ``thread_id``'s runtime runs, sorted."""
    tag = ThreadKeys(thread_id).tag
    return sorted(k for k in redis_client.keys("run:*") if k.startswith(f"run:{tag}:r_"))


def only_run(redis_client, thread_id: str):
    """The thread's one run (a ``Run``); fails when it has none or several."""
    keys = run_keys(redis_client, thread_id)
    assert len(keys) == 1, keys
    return RunStore(redis_client, thread_id).load(keys[0].rsplit(":", 1)[1])


PLAN_ITEMS = ["Pick the park PLANITEM-ALPHA", "List the food PLANITEM-BRAVO"]


def script_tasklist(fake_llm, *, items=PLAN_ITEMS, confirm=(), second="done", summary="Your picnic is planned."):
    """Rules for a whole task list: the plan of ``items`` (the indexes in ``confirm`` need a confirmation), each
    task ``done`` (the second ends with status ``second``), then ``summary``, or the blocked answer."""
    fake_llm.add_rule(Reply(json={"tasks": [{"title": t, "needsConfirmation": i in confirm}
                                            for i, t in enumerate(items)]}), when=planner)
    for n in range(1, len(items) + 1):
        status = second if n == 2 else "done"
        output = "OUTPUT-%d: no budget was given" % n if status == "blocked" else "OUTPUT-%d finished" % n
        fake_llm.add_rule(Reply(json={"status": status, "output": output}), when=worker_for(n))
    fake_llm.add_rule(Reply(text=summary), when=finisher)
    fake_llm.add_rule(Reply(text="I could not finish: the budget is missing."), when=blocker)
