"""``/delivery <goal>``: a plan -> build -> review workflow with a ``progress`` frame per stage.

Stages (one model call each; outputs kept in the run state ``run:{hex}:<run id>``)::

    plan    plain answer: the approach
    build   plain answer: the work itself, following the plan
    review  structured answer {"verdict": "approved"|"blocked", "report": Markdown}

The review's report is streamed to the person and is the run's final text: ``completed``
when approved, ``blocked`` otherwise.  Memory keeps the goal and that report (source
``delivery-chain``; the memory core cuts a report over ``DELIVERY_FINAL_MAX_CHARS`` to that
length with a notice).  A provider failure or an unusable review makes the run ``failed``,
a cancel ``cancelled``: neither writes anything.  The plan and build outputs never leave
the run state.
"""

from __future__ import annotations


from app.chat.turn import ProducerResult, TurnIO
from app.llm.provider import LLMError
from app.runtime.budget import Room
from app.runtime.llm_calls import complete_json, complete_text
from app.runtime.run_store import Run, RunStore, new_run_id


SOURCE = "delivery-chain"
STAGES = ("plan", "build", "review")
REPORT_HEADER = "# Delivery Report"
DELTA_CHARS = 400  # the report is streamed in pieces of this many characters
MAX_STAGE_OUTPUT_CHARS = 20000

REVIEW_SCHEMA = {
    "type": "object",
    "properties": {"verdict": {"type": "string", "enum": ["approved", "blocked"]}, "report": {"type": "string"}},
    "required": ["verdict", "report"], "additionalProperties": False,
}
PLANNER = "You are the planning stage of a delivery workflow. Write a short plan (a few steps) for the goal."
BUILDER = "You are the build stage of a delivery workflow. Carry out the plan for the goal and give the result."
REVIEWER = (f"You are the review stage of a delivery workflow. Check the build against the goal. Answer verdict "
            f"\"approved\" when it meets the goal, \"blocked\" when it cannot be delivered, and a Markdown report "
            f"for the person starting with the line \"{REPORT_HEADER}\": what was delivered and any open issues.")
STAGE_MESSAGES = {"plan": "Planning", "build": "Building", "review": "Reviewing"}


def validate_review(value: dict) -> dict:
    """A review as ``{"verdict", "report"}`` (the report starting with ``REPORT_HEADER``).

    Raises:
        ValueError: unknown verdict or a blank report.
    """
    verdict, report = value.get("verdict"), value.get("report")
    if verdict not in ("approved", "blocked"):
        raise ValueError('verdict must be "approved" or "blocked"')
    if not isinstance(report, str) or not report.strip():
        raise ValueError("report must be a non-empty string")
    report = report.strip()
    if not report.startswith(REPORT_HEADER):
        report = f"{REPORT_HEADER}\n\n{report}"
    return {"verdict": verdict, "report": report}


class DeliveryProducer:
    """The delivery workflow as a turn producer.

    Args:
        goal: what to deliver.
    """

    source = SOURCE

    def __init__(self, goal: str):
        self.goal = goal

    def run(self, io: TurnIO) -> ProducerResult:
        """Run the stages; returns ``completed``, ``blocked`` or ``cancelled`` (raises ``LLMError`` on failure)."""
        store = RunStore(io.services.redis, io.thread_id)
        run = Run(new_run_id(), "delivery", self.goal, status="running", state={"stage": None})
        store.save(run)
        try:
            return self._stages(io, store, run)
        except LLMError:
            run.status = "failed"
            run.checkpoint(run.state.get("stage") or "start", "failed")
            store.save_quietly(run)
            raise

    def _prompt(self, io: TurnIO, system: str, parts: list[tuple[str, str]]) -> list[dict]:
        """Memory (without the command), the stage's instruction, the goal and earlier outputs cut to fit."""
        room = Room(io.services.counter, io.context.budget, io.context.prompt_tokens)
        share = room.left // (2 * max(1, len(parts))) if parts else 0
        body = f"Goal: {self.goal}" + "".join(f"\n\n{label}:\n{room.clip(text, share)}" for label, text in parts)
        return io.context.to_openai()[:-1] + [{"role": "system", "content": system}, {"role": "user", "content": body}]

    def _stages(self, io: TurnIO, store: RunStore, run: Run) -> ProducerResult:
        outputs: dict[str, str] = {}
        review = None
        for stage in STAGES:
            if io.cancelled.is_set():
                return self._cancel(store, run)
            run.state["stage"] = stage
            io.emit({"type": "progress", "stage": stage, "message": STAGE_MESSAGES[stage]})
            if stage == "plan":
                outputs[stage] = complete_text(io.services, self._prompt(io, PLANNER, []))
            elif stage == "build":
                outputs[stage] = complete_text(io.services, self._prompt(io, BUILDER, [("Plan", outputs["plan"])]))
            else:
                review = complete_json(io.services, self._prompt(io, REVIEWER, [
                    ("Plan", outputs["plan"]), ("Build", outputs["build"])]),
                    name="delivery_review", schema=REVIEW_SCHEMA, validate=validate_review)
                outputs[stage] = review["verdict"]
            if io.cancelled.is_set():
                return self._cancel(store, run)
            run.state[stage] = outputs[stage][:MAX_STAGE_OUTPUT_CHARS]
            run.checkpoint(stage, "done")
            store.save(run)
        status = "completed" if review["verdict"] == "approved" else "blocked"
        report = review["report"]
        for start in range(0, len(report), DELTA_CHARS):
            if not io.delta(report[start:start + DELTA_CHARS]):
                return self._cancel(store, run)
        run.artifact = report
        store.finish(run, status=status, text=report, source=SOURCE, user_text=self.goal, step="report",
                     user_id=io.user_id, assistant_id=io.message_id)
        return ProducerResult(status, report, SOURCE, user_text=self.goal)

    @staticmethod
    def _cancel(store: RunStore, run: Run) -> ProducerResult:
        run.status = "cancelled"
        run.checkpoint(run.state.get("stage") or "start", "cancelled")
        store.save_quietly(run)
        return ProducerResult("cancelled", "", SOURCE)
