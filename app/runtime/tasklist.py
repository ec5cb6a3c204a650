"""``/tasklist <goal>``: an agent that plans a short task list, works through it, and may pause.

Life of a run (its state in ``run:{hex}:<run id>``, never in memory)::

    plan (structured call)  ->  [pause?]  ->  task 1  ->  [pause?]  ->  task 2 ... ->  final summary
                                                  \\-> a task answers "blocked" -> blocked summary

When it pauses (``paused``: nothing written; the turn's done frame says ``paused``):
  * before the first task, when the plan has more than ``CONFIRM_PLAN_OVER`` tasks;
  * before a task the planner marked ``needsConfirmation``.
The person continues with ``/tasklist continue`` (or a bare "yes" / "continue" / "ok" ...),
or drops the run with ``/tasklist cancel``.  A new ``/tasklist <goal>`` replaces a waiting run.

Each task is one structured model call answering ``{"status": "done"|"blocked", "output"}``.
The run ends with one streamed model call writing a short final answer; that answer is the
only assistant text memory keeps, with the goal as the user text (source ``tasklist-agent``).
The task list, its Markdown artifact, task outputs and checkpoints stay in the run state.
"""

from __future__ import annotations


from app.chat.turn import ProducerResult, TurnIO
from app.llm.provider import LLMError
from app.runtime.budget import Room
from app.runtime.llm_calls import complete_json, invalid_answer, stream_text
from app.runtime.run_store import Run, RunStore, new_run_id


SOURCE = "tasklist-agent"
MAX_TASKS = 6
CONFIRM_PLAN_OVER = 3     # a plan of more tasks than this waits for the person before starting
MAX_TITLE_CHARS = 200
MAX_OUTPUT_CHARS = 4000   # a task's output kept in the run state (characters)
NOTES_SHARE = 0.5         # share of the free prompt room that task notes may take

PLAN_SCHEMA = {
    "type": "object",
    "properties": {"tasks": {"type": "array", "minItems": 1, "maxItems": MAX_TASKS, "items": {
        "type": "object",
        "properties": {"title": {"type": "string"}, "needsConfirmation": {"type": "boolean"}},
        "required": ["title", "needsConfirmation"], "additionalProperties": False}}},
    "required": ["tasks"], "additionalProperties": False,
}
TASK_SCHEMA = {
    "type": "object",
    "properties": {"status": {"type": "string", "enum": ["done", "blocked"]}, "output": {"type": "string"}},
    "required": ["status", "output"], "additionalProperties": False,
}
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


def validate_plan(value: dict) -> list[dict]:
    """The planner's tasks as ``[{"title", "needsConfirmation"}]``.

    Raises:
        ValueError: not 1 to ``MAX_TASKS`` tasks with non-blank titles.
    """
    tasks = value.get("tasks")
    if not isinstance(tasks, list) or not tasks:
        raise ValueError("tasks must be a non-empty list")
    if len(tasks) > MAX_TASKS:
        raise ValueError(f"at most {MAX_TASKS} tasks")
    plan = []
    for task in tasks:
        if not isinstance(task, dict) or not isinstance(task.get("title"), str) or not task["title"].strip():
            raise ValueError("every task needs a non-empty title")
        confirm = task.get("needsConfirmation", False)
        if not isinstance(confirm, bool):
            raise ValueError("needsConfirmation must be true or false")
        plan.append({"title": " ".join(task["title"].split())[:MAX_TITLE_CHARS], "needsConfirmation": confirm})
    return plan


def validate_task_result(value: dict) -> dict:
    """A worker's answer as ``{"status": "done"|"blocked", "output"}``.

    Raises:
        ValueError: an unknown status or a missing output.
    """
    status = value.get("status")
    output = value.get("output")
    if status not in ("done", "blocked"):
        raise ValueError('status must be "done" or "blocked"')
    if not isinstance(output, str):
        raise ValueError("output must be a string")
    return {"status": status, "output": output.strip()[:MAX_OUTPUT_CHARS]}


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
        """Start or resume a run; returns ``final``, ``blocked``, ``paused`` or ``cancelled``."""
        store = RunStore(io.services.redis, io.thread_id, **({"ttl_seconds": self.store_ttl} if self.store_ttl else {}))
        if self.goal is None:
            run = self._resume(store)
        else:
            store.drop_paused()  # a new task list replaces one that was waiting
            run = Run(new_run_id(), "tasklist", self.goal)
            try:
                self._plan(io, store, run)
            except LLMError:
                run.status = "failed"
                run.checkpoint("plan", "failed")
                store.save_quietly(run)
                raise
        try:
            return self._work(io, store, run)
        except LLMError:
            run.status = "failed"
            run.checkpoint(f"task:{run.state.get('next', 0)}", "failed")
            store.save_quietly(run)
            raise

    def _resume(self, store: RunStore) -> Run:
        run_id = store.take_paused()
        run = store.load(run_id) if run_id else None
        if run is None or run.kind != "tasklist" or run.status != "paused":
            raise LLMError("nothing_to_resume", "There is no paused task list to continue.", "bad_request", False)
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
        tasks = complete_json(io.services, messages, name="task_plan", schema=PLAN_SCHEMA, validate=validate_plan)
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
                return self._finish(io, store, run, "final")
            gate = self._gate(run, index)
            if gate:
                return self._pause(io, store, run, gate)
            io.emit({"type": "progress", "stage": f"task {index + 1}/{len(tasks)}", "message": tasks[index]["title"]})
            messages = self._memory(io) + [
                {"role": "system", "content": WORKER},
                {"role": "user", "content": f"Goal: {run.goal}\n\nDone so far:\n{self._notes(io, run, index)}\n\n"
                                            f"Current task ({index + 1} of {len(tasks)}): {tasks[index]['title']}"}]
            result = complete_json(io.services, messages, name="task_result", schema=TASK_SCHEMA,
                                   validate=validate_task_result)
            if io.cancelled.is_set():
                return self._cancel(store, run)
            run.state["results"] = run.state["results"][:index] + [result]
            if result["status"] == "blocked":
                run.state["blockedAt"] = index
                run.checkpoint(f"task:{index}", "blocked")
                run.artifact = render_artifact(run)
                store.save(run)
                return self._finish(io, store, run, "blocked")
            run.state["next"] = index + 1
            run.checkpoint(f"task:{index}", "done")
            run.artifact = render_artifact(run)
            store.save(run)

    def _pause(self, io: TurnIO, store: RunStore, run: Run, gate: dict) -> ProducerResult:
        run.state["awaiting"] = gate
        run.status = "paused"
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
        return ProducerResult("paused", message, SOURCE, user_text=run.goal)

    def _finish(self, io: TurnIO, store: RunStore, run: Run, status: str) -> ProducerResult:
        io.emit({"type": "progress", "stage": "summary", "message": "Writing the final answer"})
        done = run.state["next"]
        notes = self._notes(io, run, len(run.state.get("results", [])))
        situation = FINISHER if status == "final" else BLOCKER
        messages = self._memory(io) + [
            {"role": "system", "content": situation},
            {"role": "user", "content": f"Goal: {run.goal}\n\nTask results ({done} of {len(run.state['tasks'])} "
                                        f"done):\n{notes}"}]
        text, completed = stream_text(io.services, messages, delta=io.delta, cancelled=io.cancelled, stats=io.stats)
        if not completed:
            return self._cancel(store, run)
        if not text.strip():
            raise invalid_answer()
        store.finish(run, status=status, text=text, source=SOURCE, user_text=run.goal, step="final",
                     user_id=io.user_id, assistant_id=io.message_id)
        return ProducerResult(status, text, SOURCE, user_text=run.goal)

    def _cancel(self, store: RunStore, run: Run) -> ProducerResult:
        run.status = "cancelled"
        run.checkpoint(f"task:{run.state.get('next', 0)}", "cancelled")
        store.save_quietly(run)
        return ProducerResult("cancelled", "", SOURCE, user_text=run.goal)


class DropTaskListProducer:
    """``/tasklist cancel``: drop the waiting run; nothing is written (``cancelled``)."""

    source = SOURCE

    def run(self, io: TurnIO) -> ProducerResult:
        dropped = RunStore(io.services.redis, io.thread_id).drop_paused()
        io.delta("Dropped the paused task list." if dropped else "There was no paused task list.")
        return ProducerResult("cancelled", "", SOURCE)
