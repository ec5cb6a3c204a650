"""``/tasklist <goal>``: an agent that plans a short task list, works through it, and may pause.

Life of a run (its state in ``run:{hex}:<run id>``, never in memory)::

    plan (structured call)  ->  [pause?]  ->  task 1  ->  [pause?]  ->  task 2 ... ->  final summary
                                                  \\-> a task answers "blocked" -> blocked summary

When it pauses (``paused``: nothing written; the turn's done frame says ``paused``):
  * before the first task, when the plan has more than ``CONFIRM_PLAN_OVER`` tasks;
  * before a task the planner marked ``needsConfirmation``.
The person continues with ``/tasklist continue`` (or a bare "yes" / "continue" / "ok" ...),
or drops the run with ``/tasklist cancel``.  A new ``/tasklist <goal>`` replaces a waiting run.

The plan is one structured model call answering ``TaskPlan``; each task is one answering
``TaskResult`` (``{"status": "done"|"blocked", "output"}``).
The run ends with one streamed model call writing a short final answer; that answer is the
only assistant text memory keeps, with the goal as the user text (source ``tasklist-agent``).
The task list, its Markdown artifact, task outputs and checkpoints stay in the run state.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from app.llm.answers import one_of, text
from app.llm.provider import LLMError
from app.llm.structured import invalid_answer
from app.memory.status import TurnStatus
from app.runtime.budget import Room
from app.runtime.chat import stream_reply
from app.runtime.llm_calls import call_deadline, structured_answer
from app.runtime.producer import ProducerError, ProducerResult, TurnIO, run_state_unavailable
from app.runtime.run_store import Run, RunStore, new_run_id
from app.store.thread_store import StoreUnavailable

SOURCE = "tasklist-agent"
MAX_TASKS = 6
CONFIRM_PLAN_OVER = 3     # a plan of more tasks than this waits for the person before starting
MAX_TITLE_CHARS = 200
MAX_OUTPUT_CHARS = 4000   # a task's output kept in the run state (characters)
NOTES_SHARE = 0.5         # share of the free prompt room that task notes may take

PLANNER = ("Plan the person's goal as a short list of 1 to {max} concrete tasks, in order. "
           "Set needsConfirmation to true for a task that changes something outside this chat "
           "or needs the person's decision before it is done; otherwise false.")
WORKER = ("You are working through a task list for the person's goal, one task at a time. Do the "
          "current task now and give its result in output. If it cannot be done (information is "
          "missing, it is impossible or unsafe), answer status \"blocked\" and say why in output.")
FINISHER = ("The task list for the person's goal is finished. Write the final answer for the person: "
            "a short summary of the outcome in a few sentences. Do not repeat the task list.")
BLOCKER = ("The task list for the person's goal stopped: a task could not be done. Tell the person "
           "briefly what was achieved and what is missing, in a few sentences. Do not repeat the task list.")


class PlannedTask(BaseModel):
    """One task of a plan: ``{"title", "needsConfirmation"}``; the title's white space is collapsed and
    it is cut to ``MAX_TITLE_CHARS`` characters; a missing ``needsConfirmation`` is false."""

    model_config = ConfigDict(populate_by_name=True)

    title: str = Field(default="", validate_default=True)
    needs_confirmation: bool = Field(default=False, alias="needsConfirmation")

    @model_validator(mode="before")
    @classmethod
    def _an_object(cls, value: object) -> dict:
        if not isinstance(value, dict):
            raise ValueError("every task needs a non-empty title")
        return value

    @field_validator("title", mode="before")
    @classmethod
    def _title(cls, value: object) -> str:
        if not isinstance(value, str) or not value.strip():
            raise ValueError("every task needs a non-empty title")
        return " ".join(value.split())[:MAX_TITLE_CHARS]

    @field_validator("needs_confirmation", mode="before")
    @classmethod
    def _boolean(cls, value: object) -> bool:
        if not isinstance(value, bool):
            raise ValueError("needsConfirmation must be true or false")
        return value


class TaskPlan(BaseModel):
    """The planner's answer: ``{"tasks": [PlannedTask]}`` with 1 to ``MAX_TASKS`` tasks."""

    tasks: list[PlannedTask] = Field(default=None, validate_default=True, min_length=1, max_length=MAX_TASKS)

    @field_validator("tasks", mode="before")
    @classmethod
    def _count(cls, value: object) -> list:
        if not isinstance(value, list) or not value:
            raise ValueError("tasks must be a non-empty list")
        if len(value) > MAX_TASKS:
            raise ValueError(f"at most {MAX_TASKS} tasks")
        return value

    def as_state(self) -> list[dict]:
        """The tasks as kept in the run state: ``[{"title", "needsConfirmation"}]``."""
        return [task.model_dump(by_alias=True) for task in self.tasks]


TaskStatus = Annotated[Literal["done", "blocked"], *one_of("status", "done", "blocked")]
TaskOutput = Annotated[str, *text("output", max_chars=MAX_OUTPUT_CHARS)]


class TaskResult(BaseModel):
    """A worker's answer: ``{"status": "done"|"blocked", "output"}``; the output is trimmed and cut to
    ``MAX_OUTPUT_CHARS`` characters."""

    status: TaskStatus
    output: TaskOutput


def render_artifact(run: Run) -> str:
    """The run's Markdown artifact: the goal and the task list as a checklist."""
    state = run.state
    done = state.get("next", 0)
    blocked = state.get("blockedAt")
    lines = ["# Task list", "", f"Goal: {run.goal}", ""]
    for i, task in enumerate(state.get("tasks", [])):
        if i < done:
            mark, note = "x", " — done"
        elif blocked == i:
            mark, note = "!", " — blocked"
        else:
            mark, note = " ", " — *needs your confirmation*" if task["needsConfirmation"] else ""
        lines.append(f"- [{mark}] {i + 1}. {task['title']}{note}")
    return "\n".join(lines)


class TaskListProducer:
    """The task-list agent as a turn producer.

    Args:
        goal: the goal of a new run (``/tasklist <goal>``); None to resume the waiting run.
        store_ttl: seconds a run's state is kept (tests shorten it).
    """

    source = SOURCE

    def __init__(self, goal: str | None = None, *, store_ttl: int | None = None):
        self.goal = goal
        self.store_ttl = store_ttl

    # -- entry ----------------------------------------------------------------------------------

    def run(self, io: TurnIO) -> ProducerResult:
        """Start or resume a run; returns ``final``, ``blocked``, ``paused`` or ``cancelled``.

        Raises:
            LLMError: the provider failed (the run is marked ``failed``).
            ProducerError: no run waits to be resumed, or the run state is unreachable.
        """
        try:
            return self._run(io)
        except StoreUnavailable:
            raise run_state_unavailable() from None

    def _run(self, io: TurnIO) -> ProducerResult:
        store = RunStore(io.services.redis, io.thread_id, **({"ttl_seconds": self.store_ttl} if self.store_ttl else {}))
        if self.goal is None:
            run = self._resume(store)
        else:
            store.drop_paused()  # a new task list replaces one that was waiting
            run = Run(new_run_id(), "tasklist", self.goal)
            try:
                self._plan(io, store, run)
            except LLMError:
                run.status = TurnStatus.FAILED
                run.checkpoint("plan", "failed")
                store.save_quietly(run)
                raise
        try:
            return self._work(io, store, run)
        except LLMError:
            run.status = TurnStatus.FAILED
            run.checkpoint(f"task:{run.state.get('next', 0)}", "failed")
            store.save_quietly(run)
            raise

    def _resume(self, store: RunStore) -> Run:
        run_id = store.take_paused()
        run = store.load(run_id) if run_id else None
        if run is None or run.kind != "tasklist" or run.status != TurnStatus.PAUSED:
            raise ProducerError("nothing_to_resume", "There is no paused task list to continue.")
        awaiting = run.state.pop("awaiting", None) or {}
        if awaiting.get("kind") == "plan":
            run.state["planConfirmed"] = True
        elif awaiting.get("kind") == "task":
            run.state.setdefault("confirmed", []).append(awaiting.get("index"))
        run.status = "running"
        run.checkpoint("resume", "confirmed")
        store.save(run)
        return run

    # -- steps ------------------------------------------------------------------------------------

    def _memory(self, io: TurnIO) -> list[dict]:
        """The turn's prompt without its last message (the command): system, summary, pins, recent."""
        return io.context.to_openai()[:-1]

    def _notes(self, io: TurnIO, run: Run, upto: int) -> str:
        """Results of the tasks before ``upto``, cut to the prompt room left."""
        room = Room(io.services.counter, io.context.budget, io.context.prompt_tokens)
        tasks, results = run.state.get("tasks", []), run.state.get("results", [])
        lines = [f"{i + 1}. {tasks[i]['title']}: {results[i]['output']}" for i in range(min(upto, len(results)))]
        text = "\n".join(lines) or "(none yet)"
        return room.clip(text, int(room.left * NOTES_SHARE))

    def _plan(self, io: TurnIO, store: RunStore, run: Run) -> None:
        io.emit({"type": "progress", "stage": "plan", "message": "Planning the task list"})
        messages = self._memory(io) + [
            {"role": "system", "content": PLANNER.format(max=MAX_TASKS)},
            {"role": "user", "content": f"Goal: {run.goal}"}]
        tasks = structured_answer(io.services, messages, TaskPlan, name="task_plan").as_state()
        run.state = {"tasks": tasks, "next": 0, "results": [], "confirmed": [], "planConfirmed": False}
        run.status = "running"
        run.checkpoint("plan", "done")
        run.artifact = render_artifact(run)
        store.save(run)
        io.emit({"type": "progress", "stage": "plan", "message": f"{len(tasks)} task{'s' * (len(tasks) != 1)} planned"})

    def _gate(self, run: Run, index: int) -> dict | None:
        """What the run must wait for before task ``index`` (None: go on)."""
        tasks = run.state["tasks"]
        if index == 0 and len(tasks) > CONFIRM_PLAN_OVER and not run.state.get("planConfirmed"):
            return {"kind": "plan", "index": 0}
        if tasks[index]["needsConfirmation"] and index not in run.state.get("confirmed", []):
            return {"kind": "task", "index": index}
        return None

    def _work(self, io: TurnIO, store: RunStore, run: Run) -> ProducerResult:
        tasks = run.state["tasks"]
        while True:
            if io.cancelled.is_set():
                return self._cancel(store, run)
            index = run.state["next"]
            if index >= len(tasks):
                return self._finish(io, store, run, TurnStatus.FINAL)
            gate = self._gate(run, index)
            if gate:
                return self._pause(io, store, run, gate)
            io.emit({"type": "progress", "stage": f"task {index + 1}/{len(tasks)}", "message": tasks[index]["title"]})
            messages = self._memory(io) + [
                {"role": "system", "content": WORKER},
                {"role": "user", "content": f"Goal: {run.goal}\n\nDone so far:\n{self._notes(io, run, index)}\n\n"
                                            f"Current task ({index + 1} of {len(tasks)}): {tasks[index]['title']}"}]
            result = structured_answer(io.services, messages, TaskResult, name="task_result").model_dump()
            if io.cancelled.is_set():
                return self._cancel(store, run)
            run.state["results"] = run.state["results"][:index] + [result]
            if result["status"] == "blocked":
                run.state["blockedAt"] = index
                run.checkpoint(f"task:{index}", "blocked")
                run.artifact = render_artifact(run)
                store.save(run)
                return self._finish(io, store, run, TurnStatus.BLOCKED)
            run.state["next"] = index + 1
            run.checkpoint(f"task:{index}", "done")
            run.artifact = render_artifact(run)
            store.save(run)

    def _pause(self, io: TurnIO, store: RunStore, run: Run, gate: dict) -> ProducerResult:
        run.state["awaiting"] = gate
        run.status = TurnStatus.PAUSED
        run.checkpoint("plan" if gate["kind"] == "plan" else f"task:{gate['index']}", "paused")
        run.artifact = render_artifact(run)
        store.save(run)
        store.set_paused(run.id)
        tasks = run.state["tasks"]
        if gate["kind"] == "plan":
            why = f"The plan has {len(tasks)} tasks. Shall I start?"
        else:
            why = f"Task {gate['index'] + 1} needs your confirmation before I do it."
        message = (f"**Paused — waiting for your confirmation.**\n\n{run.artifact}\n\n{why}\n\n"
                   "Reply **/tasklist continue** (or just “yes”) to go on, or **/tasklist cancel** to drop it. "
                   "Nothing of this task list is saved to memory until it finishes.")
        io.emit({"type": "progress", "stage": "waiting", "message": "Waiting for your confirmation"})
        io.delta(message)
        return ProducerResult(TurnStatus.PAUSED, message, SOURCE, user_text=run.goal)

    def _finish(self, io: TurnIO, store: RunStore, run: Run, status: TurnStatus) -> ProducerResult:
        io.emit({"type": "progress", "stage": "summary", "message": "Writing the final answer"})
        done = run.state["next"]
        notes = self._notes(io, run, len(run.state.get("results", [])))
        situation = FINISHER if status == TurnStatus.FINAL else BLOCKER
        messages = self._memory(io) + [
            {"role": "system", "content": situation},
            {"role": "user", "content": f"Goal: {run.goal}\n\nTask results ({done} of {len(run.state['tasks'])} "
                                        f"done):\n{notes}"}]
        reply = stream_reply(io, messages, deadline=call_deadline(io.services.settings))
        if reply.cancelled:
            return self._cancel(store, run)
        text = reply.text
        if not text.strip():
            raise invalid_answer()
        store.finish(run, status=status, text=text, source=SOURCE, user_text=run.goal, step="final",
                     user_id=io.user_id, assistant_id=io.message_id)
        return ProducerResult(status, text, SOURCE, user_text=run.goal)

    def _cancel(self, store: RunStore, run: Run) -> ProducerResult:
        run.status = TurnStatus.CANCELLED
        run.checkpoint(f"task:{run.state.get('next', 0)}", "cancelled")
        store.save_quietly(run)
        return ProducerResult(TurnStatus.CANCELLED, "", SOURCE, user_text=run.goal)


class DropTaskListProducer:
    """``/tasklist cancel``: drop the waiting run; nothing is written (``cancelled``)."""

    source = SOURCE

    def run(self, io: TurnIO) -> ProducerResult:
        """Drop the waiting run and say so (``cancelled``).

        Raises:
            ProducerError: the run state is unreachable.
        """
        try:
            dropped = RunStore(io.services.redis, io.thread_id).drop_paused()
        except StoreUnavailable:
            raise run_state_unavailable() from None
        io.delta("Dropped the paused task list." if dropped else "There was no paused task list.")
        return ProducerResult(TurnStatus.CANCELLED, "", SOURCE)
