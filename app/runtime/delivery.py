"""``/delivery <goal>``: a plan -> build -> review workflow with a ``progress`` frame per stage.

Stages (one model call each; outputs kept in the run state ``run:{hex}:<run id>``)::

    plan    plain answer: the approach
    build   plain answer: the work itself, following the plan
    review  structured answer ``DeliveryReview``: {"verdict": "approved"|"blocked", "report": Markdown}

The review's report is streamed to the person and is the run's final text: ``completed``
when approved, ``blocked`` otherwise.  Memory keeps the goal and that report (source
``delivery-chain``; the memory core cuts a report over ``DELIVERY_FINAL_MAX_CHARS`` to that
length with a notice).  A provider failure or an unusable review makes the run ``failed``,
a cancel ``cancelled``: neither writes anything.  The plan and build outputs never leave
the run state.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, field_validator

from app.llm.answers import one_of, text
from app.llm.provider import LLMError
from app.memory.status import TurnStatus
from app.runtime.budget import Room
from app.runtime.llm_calls import complete_text, structured_answer
from app.runtime.producer import ProducerResult, TurnIO, run_state_unavailable
from app.runtime.run_store import Run, RunStore, new_run_id
from app.store.thread_store import StoreUnavailable

SOURCE = "delivery-chain"
STAGES = ("plan", "build", "review")
REPORT_HEADER = "# Delivery Report"
DELTA_CHARS = 400  # the report is streamed in pieces of this many characters
MAX_STAGE_OUTPUT_CHARS = 20000

PLANNER = "You are the planning stage of a delivery workflow. Write a short plan (a few steps) for the goal."
BUILDER = "You are the build stage of a delivery workflow. Carry out the plan for the goal and give the result."
REVIEWER = (f"You are the review stage of a delivery workflow. Check the build against the goal. Answer verdict "
            f"\"approved\" when it meets the goal, \"blocked\" when it cannot be delivered, and a Markdown report "
            f"for the person starting with the line \"{REPORT_HEADER}\": what was delivered and any open issues.")
STAGE_MESSAGES = {"plan": "Planning", "build": "Building", "review": "Reviewing"}


Verdict = Annotated[Literal["approved", "blocked"], *one_of("verdict", "approved", "blocked")]
Report = Annotated[str, *text("report", non_blank=True)]


class DeliveryReview(BaseModel):
    """The review stage's answer: ``{"verdict": "approved"|"blocked", "report"}``; the report is trimmed
    and starts with ``REPORT_HEADER`` (added when the model left it out)."""

    verdict: Verdict
    report: Report

    @field_validator("report")
    @classmethod
    def _headed(cls, report: str) -> str:
        return report if report.startswith(REPORT_HEADER) else f"{REPORT_HEADER}\n\n{report}"


class DeliveryProducer:
    """The delivery workflow as a turn producer.

    Args:
        goal: what to deliver.
    """

    source = SOURCE

    def __init__(self, goal: str):
        self.goal = goal

    def run(self, io: TurnIO) -> ProducerResult:
        """Run the stages; returns ``completed``, ``blocked`` or ``cancelled``.

        Raises:
            LLMError: the provider failed, or the review was unusable (the run is marked ``failed``).
            ProducerError: the run state is unreachable.
        """
        try:
            return self._run(io)
        except StoreUnavailable:
            raise run_state_unavailable() from None

    def _run(self, io: TurnIO) -> ProducerResult:
        store = RunStore(io.services.redis, io.thread_id)
        run = Run(new_run_id(), "delivery", self.goal, status="running", state={"stage": None})
        store.save(run)
        try:
            return self._stages(io, store, run)
        except LLMError:
            run.status = TurnStatus.FAILED
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
        review: DeliveryReview | None = None
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
                review = structured_answer(io.services, self._prompt(io, REVIEWER, [
                    ("Plan", outputs["plan"]), ("Build", outputs["build"])]), DeliveryReview, name="delivery_review")
                outputs[stage] = review.verdict
            if io.cancelled.is_set():
                return self._cancel(store, run)
            run.state[stage] = outputs[stage][:MAX_STAGE_OUTPUT_CHARS]
            run.checkpoint(stage, "done")
            store.save(run)
        assert review is not None, "STAGES ends with the review"
        status = TurnStatus.COMPLETED if review.verdict == "approved" else TurnStatus.BLOCKED
        report = review.report
        for start in range(0, len(report), DELTA_CHARS):
            if not io.delta(report[start:start + DELTA_CHARS]):
                return self._cancel(store, run)
        run.artifact = report
        store.finish(run, status=status, text=report, source=SOURCE, user_text=self.goal, step="report",
                     user_id=io.user_id, assistant_id=io.message_id)
        return ProducerResult(status, report, SOURCE, user_text=self.goal)

    @staticmethod
    def _cancel(store: RunStore, run: Run) -> ProducerResult:
        run.status = TurnStatus.CANCELLED
        run.checkpoint(run.state.get("stage") or "start", "cancelled")
        store.save_quietly(run)
        return ProducerResult(TurnStatus.CANCELLED, "", SOURCE)
