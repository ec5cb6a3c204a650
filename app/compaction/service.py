"""A compaction in two speeds: the fold (no model, at once) and the refinement (the model, later, batched).

docs/memory.md: A compaction.  Lifecycle of one **fold** (``run_compaction``, the task ``workers.compact_thread``,
asked after every commit that leaves more than ``MEMORY_RECENT_TURNS`` whole turns stored)::

    hold the marker for as long as the attempt may run ─► load the thread (never data from the task
      message) ─► still due? plan (pure): the oldest whole turns beyond the recent window
      ─► fold them without the model (``compose(..., answer=None)``: no gain rule, a fold that
         frees little still folds; the archive keeps every word)
      ─► apply_compaction (Lua compare-and-set: generation unchanged, folded ids still the oldest)
           applied: history (step ``fold``), publish "succeeded", release the marker, request
                    again if still due, then ask for a refinement (one pending per thread)
           stale:   discard, history, release the marker, request again if due
           failed:  nothing written; a store failure is retried with backoff (the marker held
                    meanwhile); a reason a retry will not fix (``corrupt``, ``fact_guard``,
                    ``internal``) blocks the thread's folds for ``COMPACTION_BLOCKED_SECONDS``
                    (history outcome ``blocked``), so turns do not ask again at every commit.

Lifecycle of one **refinement** (``run_refinement``, the task ``workers.refine_thread``)::

    hold the refinement marker ─► a turn of the thread streams, or a turn ended less than
      COMPACTION_IDLE_SECONDS ago with fewer than COMPACTION_REFINE_AFTER_FOLDS folds unrefined?
      ─► publish itself again later (``reschedule_in``), nothing else
      ─► else: the turns folded since the last refinement (``Archive.newest_turns``), the model asked
         for a gist and notes (``produce``, at most two calls), composed on the current record
      ─► apply_refinement (Lua compare-and-set on ``gen``): applied or stale (discarded, asked
         again later); a model failure is retried with backoff, and after the last retry the
         turns are marked refined without a gist (the record already holds their statements).

No WATCH is held across the model call and a write is never retried from a stale
snapshot: every attempt re-reads.  Store failures in requests are logged and never
reach a turn.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Sequence

from celery.utils.time import get_exponential_backoff_interval

from app.compaction.requests import STREAMING, SendRefine, retry_marker_ttl, running_marker_ttl
from app.llm.provider import LLMError
from app.llm.structured import answer_schema, strict_answer_schema
from app.memory import compaction as domain
from app.memory.compaction import CompactionAnswer, CompactionPlan, CompactionResult, Strategy
from app.memory.state import ThreadState, thread_label, utc_now_iso
from app.store.compaction_history import HISTORY_MAX
from app.store.compaction_outcome import Outcome, Reason, reason_of
from app.store.thread_store import CompactionCommit, CorruptState, StoreUnavailable

if TYPE_CHECKING:  # the layer above, for types only (docs/architecture.md)
    from app.extensions import Services
    from app.llm.structured import StructuredAnswer
    from app.memory.limits import MemoryLimits
    from app.memory.recall import ArchivedTurn
    from app.memory.tokens import TokenCounter
    from app.settings import Settings
    from app.store.compaction_markers import RefineStatus

log = logging.getLogger(__name__)

TIME_MARGIN_SECONDS = 15.0
"""Time kept free before the task's time limit for the commit, the event and the history (seconds)."""
RETRY_BACKOFF_MAX_SECONDS = 600
RETRYABLE = frozenset({Reason.RATE_LIMITED, Reason.TIMEOUT, Reason.UNAVAILABLE, Reason.INVALID_ANSWER,
                       Reason.STORE_UNAVAILABLE})

STEP_FOLD, STEP_REFINE = "fold", "refine"
"""The ``step`` of a history entry and a memory event (docs/memory.md: A compaction)."""
STREAMING_POLL_SECONDS = 5.0
"""How soon a refinement that found a turn streaming looks again (seconds; at most ``COMPACTION_IDLE_SECONDS``)."""
REFINE_MAX_TURNS = 32
"""Most folded turns one refinement shows the model (the newest; older unrefined ones keep the folds' record)."""
MESSAGE_FOLDED = "Older turns were moved to the record."
MESSAGE_STARTED = "Summarizing older turns to keep memory short."
MESSAGE_SUCCEEDED = "Older turns were summarized."
MESSAGE_RETRYING = "Older turns could not be summarized yet. They are kept as they are; trying again later."
MESSAGE_FAILED = "Older turns could not be summarized. They are kept as they are."
MESSAGE_STALE = "Memory changed while summarizing. Nothing was lost."


def retry_countdown(settings: Settings, retries: int) -> float:
    """Seconds before retry ``retries + 1``: Celery's exponential backoff with "equal jitter".

    ``interval`` is Celery's ``get_exponential_backoff_interval`` without its (whole-second) full jitter:
    ``b * 2**retries`` capped at ``RETRY_BACKOFF_MAX_SECONDS``, ``b`` being ``COMPACTION_RETRY_BACKOFF_SECONDS``
    (fractions of a second kept); the wait is uniform between ``interval / 2`` and ``interval``.
    """
    interval = get_exponential_backoff_interval(settings.compaction_retry_backoff, retries,
                                                RETRY_BACKOFF_MAX_SECONDS, full_jitter=False)
    return round(interval / 2 + random.uniform(0, interval / 2), 3)


@dataclass(frozen=True)
class Prepared:
    """A thread read for compaction (``state``, as loaded) and the plan made from it."""

    thread_id: str
    state: ThreadState
    plan: CompactionPlan


@dataclass
class CompactionOutcome:
    """What one attempt did.

    Attributes:
        outcome: ``applied``, ``stale``, ``failed`` or ``skipped`` (``Outcome``, ``app.store.compaction_outcome``).
        reason: a category (a ``Reason`` but for the first): the strategy (``llm``, ``extractive``) when applied; ``not_due`` or
            ``no_gain`` when skipped; a stale reason (``generation``, ``messages``, ``missing``);
            ``rate_limited``, ``timeout``, ``unavailable``, ``bad_request``, ``invalid_answer``,
            ``store_unavailable``, ``corrupt``, ``fact_guard`` or ``internal`` when failed.
        retry_in: seconds until the next attempt when the task should be retried, else None.
        entry: the history entry recorded (numbers and categories only), or None.
        result: what was (or would have been) written.
    """

    outcome: Outcome
    reason: Reason | str = ""
    retry_in: float | None = None
    entry: dict | None = None
    result: CompactionResult | None = field(default=None, repr=False)


def prepare(services: Services, thread_id: str) -> Prepared | None:
    """Read the thread and plan a fold; None when no compaction is due any more.

    Raises:
        StoreUnavailable: the store failed.
        CorruptState: the stored thread is invalid.
    """
    settings = services.settings
    state = services.store.load(thread_id)
    tokens = domain.uncompacted_tokens(state.messages, services.counter)
    if not domain.compaction_due(len(state.messages), tokens, settings.limits, settings.prompt_budget):
        return None
    plan = domain.plan_compaction(state, settings.limits, services.counter, settings.prompt_budget,
                                  fixed_prompt_tokens=domain.fixed_prompt_tokens(settings.limits, services.counter))
    if plan is None:
        return None
    return Prepared(thread_id, state, plan)


def _compose(services: Services, prepared: Prepared, answer: CompactionAnswer | None) -> CompactionResult:
    """``domain.compose`` with the process's limits: the gain rule for a model ``answer``; without one, a fold
    that frees little still folds (docs/memory.md: A compaction)."""
    settings = services.settings
    return domain.compose(prepared.state, prepared.plan, answer, limits=settings.limits, counter=services.counter,
                          prompt_budget=settings.prompt_budget)


def _ask(services: Services, messages: list[dict], deadline: float, max_gist_chars: int,
         calls: list[int] | None = None) -> StructuredAnswer:
    """One structured model call, never past ``deadline`` (``time.monotonic()`` seconds).

    The schema sent bounds the gist to ``max_gist_chars`` (a grammar-constrained model cannot write more).
    """
    settings = services.settings
    remaining = deadline - time.monotonic()
    if remaining < 1.0:
        raise LLMError("llm_unavailable", "The model took too long to answer. Please try again.", Reason.TIMEOUT, True)
    if calls is not None:
        calls.append(services.counter.prompt(messages))
    schema = answer_schema(CompactionAnswer)
    schema = {**schema, "properties": {**schema["properties"],
                                       "summary": {**schema["properties"]["summary"], "maxLength": max_gist_chars}}}
    return services.compaction_llm.complete_json(
        messages, schema=schema, strict_schema=strict_answer_schema(CompactionAnswer),
        timeout=min(settings.compaction_llm_timeout, remaining), max_tokens=domain.MAX_OUTPUT_TOKENS)


def produce(services: Services, prepared: Prepared, *, deadline: float | None = None,
            fallback: CompactionResult | None = None, calls: list[int] | None = None) -> CompactionResult:
    """Ask the model for the gist and proposed decisions and compose what is written.

    At most two model calls: the first, and once more when the answer passes a limit,
    names facts the turns do not hold or makes memory shrink too little; after that the
    fold goes on without the model's answer (``fallback``, the extractive result).  The
    gist asked for is as long as the gain rule leaves room for (``gist_chars``; at most
    300 characters).  With ``COMPACTION_STRATEGY=extractive``, when there is no room for a
    gist, or when not even the clipped turns fit the compaction prompt, no model is called.

    Raises:
        LLMError: the provider failed (``rate_limited``, ``timeout``, ``unavailable``,
            ``bad_request``, ``invalid_answer``).
        InvalidCompactionOutput: ``shape``: the answer is not the expected JSON object.
        FactGuardFailure: a composed result lost a guarded fact (never written).
    """
    settings = services.settings
    limits, counter, budget = settings.limits, services.counter, settings.prompt_budget
    if deadline is None:
        deadline = time.monotonic() + max(settings.compaction_time_limit - TIME_MARGIN_SECONDS, 1.0)
    extractive = fallback or _compose(services, prepared, None)
    if settings.compaction_strategy == "extractive":
        return extractive
    short = thread_label(prepared.thread_id)
    max_gist = domain.gist_chars(extractive.room_tokens)
    if not max_gist:
        log.info("compaction for %s: no room for a gist (%d tokens); folding without the model",
                 short, extractive.room_tokens)
        return extractive
    try:
        prompt = domain.build_compaction_prompt(prepared.plan, limits, counter, budget, max_gist_chars=max_gist)
    except domain.PromptTooLong:
        log.info("compaction for %s: the window is too small for a model prompt; folding without the model", short)
        return extractive
    answer = _ask(services, prompt, deadline, max_gist, calls)
    try:
        return _compose(services, prepared, domain.validate_answer(answer.data))
    except domain.InvalidCompactionOutput as exc:
        if exc.kind == domain.AnswerProblem.SHAPE:
            raise
        log.info("compaction for %s: answer not accepted (%s); asking once more", short, exc.kind)
        feedback = exc.problems
    try:
        prompt = domain.build_compaction_prompt(prepared.plan, limits, counter, budget, max_gist_chars=max_gist,
                                                previous_answer=answer.raw, feedback=feedback)
        second = _ask(services, prompt, deadline, max_gist, calls)
        return _compose(services, prepared, domain.validate_answer(second.data))
    except (LLMError, domain.InvalidCompactionOutput, domain.PromptTooLong) as exc:
        log.info("compaction for %s: second answer not usable (%s); folding without the model's answer", short,
                 getattr(exc, "kind", None) or getattr(exc, "category", None) or type(exc).__name__)
        return extractive


def commit(services: Services, prepared: Prepared, result: CompactionResult) -> CompactionCommit:
    """Write a result with the Lua compare-and-set; ``lastCompactedAt`` is set here, never by the model.

    Raises:
        StoreUnavailable: the store failed (nothing was written).
    """
    plan = prepared.plan
    return services.store.apply_compaction(
        prepared.thread_id, expected_gen=plan.expected_gen, folded_ids=plan.folded_ids,
        record=result.record, notes=list(result.notes), compacted_at=utc_now_iso())


DROPPED_MESSAGE = "turns {first}–{last} are no longer kept"
"""The history entry's message when a fold made the archive's cap drop its oldest turns (docs/contract.md)."""


def dropped_figures(committed: CompactionCommit) -> dict:
    """``{"droppedTurns": [first, last], "message": "turns F–L are no longer kept"}`` when the fold made the
    archive drop turns, else ``{}``."""
    if not committed.dropped_turns:
        return {}
    first, last = committed.dropped_turns
    return {"droppedTurns": [first, last], "message": DROPPED_MESSAGE.format(first=first, last=last)}


def _fold_figures(prepared: Prepared, result: CompactionResult | None, started: float, attempt: int) -> dict:
    return {"step": STEP_FOLD, **_figures(prepared, result, started, attempt)}


def run_compaction(services: Services, thread_id: str, seen_version: int, *, attempt: int = 0,
                   send_refine: SendRefine | None = None) -> CompactionOutcome:
    """One attempt of the fold task (the body of ``workers.compact_thread``; tests call it directly).

    Args:
        services: the process's ``Services`` (store, settings, counter, compaction requests).
        thread_id: the thread to compact.
        seen_version: the version the request saw (the marker's value).
        attempt: 0 for the first attempt, n for the n-th retry.
        send_refine: publishes the refinement task (``SendRefine``); None: no refinement is asked.

    Returns:
        The outcome; ``retry_in`` is set when the caller should retry after that many seconds.
    """
    settings = services.settings
    started = time.monotonic()
    short = thread_label(thread_id)
    can_retry = attempt < settings.compaction_max_retries
    requests = services.compaction_requests

    def fail(reason: Reason | str, prepared: Prepared | None, retryable: bool) -> CompactionOutcome:
        retry = retryable and can_retry
        retry_in = retry_countdown(settings, attempt) if retry else None
        outcome = Outcome.FAILED if retryable else Outcome.BLOCKED
        figures = _fold_figures(prepared, None, started, attempt) if prepared is not None else \
            {"step": STEP_FOLD, "attempt": attempt, "durationMs": int((time.monotonic() - started) * 1000)}
        entry = _record(services, thread_id, outcome, reason, figures)
        _publish(services, thread_id, "failed", MESSAGE_RETRYING if retry else MESSAGE_FAILED,
                 reason=reason, retrying=retry, step=STEP_FOLD)
        log.warning("fold of %s failed (%s), attempt %d%s", short, reason, attempt + 1,
                    f"; retrying in {retry_in:.1f} s" if retry else
                    ("; giving up until the next turn" if retryable else "; folds blocked"))
        if retry_in is not None:  # retrying
            requests.hold(thread_id, seen_version, retry_marker_ttl(settings, retry_in))
        elif retryable:
            requests.release(thread_id, seen_version)
        else:
            requests.block(thread_id, str(reason))
        return CompactionOutcome(outcome, reason, retry_in, entry)

    # The marker was set for the time a task may wait in the queue; hold it while this attempt may run.
    requests.hold(thread_id, seen_version, running_marker_ttl(settings))
    try:
        prepared = prepare(services, thread_id)
    except StoreUnavailable:
        return fail(Reason.STORE_UNAVAILABLE, None, True)
    except CorruptState:
        log.error("fold of %s skipped: stored state is invalid", short)
        return fail(Reason.CORRUPT, None, False)
    if prepared is None:
        log.info("fold of %s skipped: not due (seen version %s)", short, seen_version)
        requests.release(thread_id, seen_version)
        return CompactionOutcome(Outcome.SKIPPED, Reason.NOT_DUE)

    try:
        result = _compose(services, prepared, None)
    except domain.FactGuardFailure:
        log.exception("fold of %s: the fact guard refused the fold", short)
        return fail(Reason.FACT_GUARD, prepared, False)
    except Exception:
        log.exception("fold of %s: unexpected error", short)
        return fail(Reason.INTERNAL, prepared, False)

    try:
        committed = commit(services, prepared, result)
    except StoreUnavailable:
        return fail(Reason.STORE_UNAVAILABLE, prepared, True)

    if committed.outcome == Outcome.APPLIED:
        entry = _record(services, thread_id, Outcome.APPLIED, result.strategy,
                        {**_fold_figures(prepared, result, started, attempt), **dropped_figures(committed)})
        _publish(services, thread_id, "succeeded", MESSAGE_FOLDED, summaryLength=len(result.summary),
                 noteCount=len(result.notes), turnsFolded=prepared.plan.folded_turns,
                 factRetention=result.retention, step=STEP_FOLD)
        log.info("fold of %s applied: folded %d turns, kept %d, tokens %d -> %d, summary %d chars, "
                 "facts %d checked, %d kept, %d let go by policy (%s), %d answer facts not kept, %d ms",
                 short, prepared.plan.folded_turns, prepared.plan.kept_turns, result.tokens_before,
                 result.tokens_after, len(result.summary), result.facts_checked, result.facts_kept,
                 result.facts_dropped, ",".join(result.policy_steps) or "-", result.facts_skipped, entry["durationMs"])
        requests.release(thread_id, seen_version)
        _request_again_if_due(services, thread_id)
        requests.request_refinement(thread_id, committed.folded_turns or committed.version,
                                    committed.unrefined_folds or 1, send_refine)
        return CompactionOutcome(Outcome.APPLIED, result.strategy, None, entry, result)

    log.info("fold of %s discarded: stale (%s); seen version %s, read version %s",
             short, committed.detail, seen_version, prepared.state.version)
    entry = _record(services, thread_id, Outcome.STALE, committed.detail,
                    {"step": STEP_FOLD, "attempt": attempt, "durationMs": int((time.monotonic() - started) * 1000)},
                    cleared=prepared.state.cleared)
    requests.release(thread_id, seen_version)
    if not _request_again_if_due(services, thread_id):
        _publish(services, thread_id, "failed", MESSAGE_STALE, reason=Outcome.STALE, retrying=False, step=STEP_FOLD)
    return CompactionOutcome(Outcome.STALE, committed.detail, None, entry, result)


def fold_at_cap(services: Services, thread_id: str) -> bool:
    """The turn's own fold when its commit met the hard cap (the worker's folds are behind or down): the same
    model-free fold and compare-and-set as ``run_compaction``, in the caller's process, without a marker;
    recorded in the history (step ``fold``, ``atCap``).  Never raises.

    Returns:
        True when a fold was applied (or another one changed the thread meanwhile): commit again.
    """
    started = time.monotonic()
    try:
        prepared = prepare(services, thread_id)
        if prepared is None:
            return False
        result = _compose(services, prepared, None)
        committed = commit(services, prepared, result)
    except Exception as exc:  # a store failure, a corrupt thread, the fact guard: the turn says memory_full
        log.warning("fold of %s at the hard cap failed: %s", thread_label(thread_id), type(exc).__name__)
        return False
    if committed.outcome == Outcome.APPLIED:
        _record(services, thread_id, Outcome.APPLIED, result.strategy,
                {**_fold_figures(prepared, result, started, 0), "atCap": True, **dropped_figures(committed)})
        _publish(services, thread_id, "succeeded", MESSAGE_FOLDED, turnsFolded=prepared.plan.folded_turns,
                 step=STEP_FOLD)
        log.info("fold of %s at the hard cap applied in the turn: folded %d turns", thread_label(thread_id),
                 prepared.plan.folded_turns)
    return True


@dataclass
class RefineOutcome(CompactionOutcome):
    """What one refinement attempt did (``CompactionOutcome``), and ``reschedule_in``: seconds after which the
    task publishes itself again because the thread was not quiet yet (None otherwise)."""

    reschedule_in: float | None = None


def refine_plan(state: ThreadState, turns: Sequence[ArchivedTurn], limits: MemoryLimits, counter: TokenCounter,
                prompt_budget: int) -> CompactionPlan:
    """A plan over archived turns (``ArchivedTurn``, oldest first) for the model's prompt: their messages
    as ``folded`` (each clipped, if need be, so the prompt fits), the stored messages as ``kept``."""
    from app.memory.state import ThreadMessage

    folded = tuple(ThreadMessage.from_dict(m) if isinstance(m, dict) else m
                   for turn in turns for m in turn.messages)
    cost = domain.messages_cost(folded, counter)
    fold_budget = max(prompt_budget - domain.fixed_prompt_tokens(limits, counter), prompt_budget // 4)
    per_message = fold_budget if cost <= fold_budget else max(fold_budget // max(len(folded), 1) - 8, 32)
    return CompactionPlan(folded=folded, kept=tuple(state.messages), folded_turns=len(turns),
                          kept_turns=len(state.messages) // 2, expected_gen=state.gen, version=state.version,
                          message_token_limit=per_message)


def run_refinement(services: Services, thread_id: str, token: int, *, attempt: int = 0) -> RefineOutcome:
    """One attempt of the refinement task (the body of ``workers.refine_thread``; tests call it directly).

    Args:
        services: the process's ``Services``.
        thread_id: the thread to refine.
        token: the value its marker holds (``ThreadKeys.refining``).
        attempt: 0 for the first attempt, n for the n-th retry after a model failure.

    Returns:
        The outcome: ``reschedule_in`` when the thread is not quiet yet (the marker is held for that wait);
        ``retry_in`` after a transient failure; else final (the marker released).
    """
    settings = services.settings
    started = time.monotonic()
    requests = services.compaction_requests
    requests.hold(thread_id, token, running_marker_ttl(settings), refine=True)
    try:
        state = services.store.load(thread_id)
        status = services.store.refine_status(thread_id)
    except StoreUnavailable:
        return _retry_refinement(services, thread_id, token, attempt)
    except CorruptState:
        requests.release(thread_id, token, refine=True)
        return RefineOutcome(Outcome.SKIPPED, Reason.CORRUPT)
    if state.folded_turns <= status.refined_turns:
        requests.release(thread_id, token, refine=True)
        return RefineOutcome(Outcome.SKIPPED, Reason.NOT_DUE)
    wait = _refine_wait(settings, status)
    if wait is not None:
        requests.hold(thread_id, token, retry_marker_ttl(settings, wait), refine=True)
        log.info("refinement of %s waits %.1f s: the thread is %s", thread_label(thread_id), wait, status.activity)
        return RefineOutcome(Outcome.SKIPPED, Reason.NOT_QUIET, reschedule_in=wait)

    unrefined = state.folded_turns - status.refined_turns
    try:
        turns = [t for t in services.archive.newest_turns(thread_id, newest=min(unrefined, REFINE_MAX_TURNS))
                 if t.number > status.refined_turns]
    except StoreUnavailable:
        return _retry_refinement(services, thread_id, token, attempt)
    calls: list[int] = []

    def figures(**more: int | float) -> dict:
        return {"step": STEP_REFINE, "attempt": attempt, "durationMs": int((time.monotonic() - started) * 1000),
                "turnsRefined": len(turns), "modelCalls": len(calls), "promptTokens": sum(calls), **more}

    result, failure = _refined(services, thread_id, state, turns, started, calls) if turns else (None, None)
    gave_up: Reason | str | None = None
    if failure is not None:
        gave_up, retryable = failure
        if retryable and attempt < settings.compaction_max_retries:
            entry = _record(services, thread_id, Outcome.FAILED, gave_up, figures(), cleared=state.cleared)
            _publish(services, thread_id, "failed", MESSAGE_RETRYING, reason=gave_up, retrying=True,
                     step=STEP_REFINE)
            return _retry_refinement(services, thread_id, token, attempt, gave_up, entry)
        log.warning("refinement of %s failed (%s); the turns stay as the folds wrote them", thread_label(thread_id),
                    gave_up)
    try:
        committed = services.store.apply_refinement(
            thread_id, expected_gen=state.gen, refined_turns=state.folded_turns,
            record=result.record if result is not None else state.record,
            notes=list(result.notes if result is not None else state.notes))
    except StoreUnavailable:
        return _retry_refinement(services, thread_id, token, attempt)
    more: dict[str, int | float] = {} if result is None else {
        "summaryChars": len(result.summary), "notesCount": len(result.notes), "factRetention": result.retention}
    return _settle_refinement(services, thread_id, token, committed, state, result, gave_up, figures(**more))


def _refine_wait(settings: Settings, status: RefineStatus) -> float | None:
    """Seconds the refinement waits (``status``: ``RefineStatus``), or None when it runs now: a turn streams
    (``STREAMING_POLL_SECONDS``), or one ended less than ``COMPACTION_IDLE_SECONDS`` ago with fewer than
    ``COMPACTION_REFINE_AFTER_FOLDS`` folds unrefined (what is left of that idle time, plus half a second)."""
    # With the bundled model the compaction server shares the chat server's CPUs: a call started between two
    # turns would slow the next ones down, so only a quiet thread is refined (the K-folds rule is off).
    batch_due = status.unrefined_folds >= settings.compaction_refine_after_folds and not settings.bundled_model
    if not (status.activity == STREAMING or (status.activity is not None and not batch_due)):
        return None
    wait = STREAMING_POLL_SECONDS if status.activity == STREAMING else status.activity_ms / 1000 + 0.5
    return round(min(max(wait, 1.0), settings.compaction_idle_seconds), 3)


def _refined(services: Services, thread_id: str, state: ThreadState, turns: list, started: float,
             calls: list[int]) -> tuple[CompactionResult | None, tuple[Reason | str, bool] | None]:
    """The model's refinement of ``turns`` (``ArchivedTurn``, oldest first) composed on ``state``; publishes
    "started".  ``(result, None)``, the result None when the model added nothing (the record stays as the folds
    left it); ``(None, (reason, retryable))`` when the model or the composition failed (``_classify``)."""
    settings = services.settings
    base = replace(state, folded_turns=turns[0].number - 1)
    prepared = Prepared(thread_id, base, refine_plan(state, turns, settings.limits, services.counter,
                                                     settings.prompt_budget))
    _publish(services, thread_id, "started", MESSAGE_STARTED, step=STEP_REFINE)
    deadline = started + max(settings.compaction_time_limit - TIME_MARGIN_SECONDS, 1.0)
    try:
        fallback = _compose(services, prepared, None)
        result = produce(services, prepared, deadline=deadline, fallback=fallback, calls=calls)
    except Exception as exc:  # LLMError, a bad answer, a time limit, anything unexpected
        reason, retryable = _classify(exc)
        if not isinstance(exc, (LLMError, domain.InvalidCompactionOutput)) and reason != Reason.TIMEOUT:
            log.exception("refinement of %s: unexpected error", thread_label(thread_id))
        return None, (reason, retryable)
    return (None if result is fallback else result), None


def _retry_refinement(services: Services, thread_id: str, token: int, attempt: int,
                      reason: Reason | str = Reason.STORE_UNAVAILABLE, entry: dict | None = None) -> RefineOutcome:
    """A failed refinement to retry (a store failure unless ``reason`` says otherwise; nothing written): its
    marker held for the backoff (``retry_countdown``), the outcome with ``retry_in`` set."""
    retry_in = retry_countdown(services.settings, attempt)
    services.compaction_requests.hold(thread_id, token, retry_marker_ttl(services.settings, retry_in), refine=True)
    return RefineOutcome(Outcome.FAILED, reason, retry_in, entry)


def _settle_refinement(services: Services, thread_id: str, token: int, committed: CompactionCommit,
                       state: ThreadState, result: CompactionResult | None, gave_up: Reason | str | None,
                       figures: dict) -> RefineOutcome:
    """After ``apply_refinement``: history, event, log and marker for an applied refinement (a failed one when
    the model gave up: the turns are marked refined without a gist) or a stale one (asked again after
    ``COMPACTION_IDLE_SECONDS``)."""
    requests, short = services.compaction_requests, thread_label(thread_id)
    if committed.outcome == Outcome.APPLIED and gave_up is not None:
        entry = _record(services, thread_id, Outcome.FAILED, gave_up, figures, cleared=state.cleared)
        _publish(services, thread_id, "failed", MESSAGE_FAILED, reason=gave_up, retrying=False, step=STEP_REFINE)
        requests.release(thread_id, token, refine=True)
        return RefineOutcome(Outcome.FAILED, gave_up, None, entry)
    if committed.outcome == Outcome.APPLIED:
        reason = result.strategy if result is not None else Strategy.EXTRACTIVE
        entry = _record(services, thread_id, Outcome.APPLIED, reason, figures, cleared=state.cleared)
        _publish(services, thread_id, "succeeded", MESSAGE_SUCCEEDED, turnsRefined=figures["turnsRefined"],
                 modelCalls=figures["modelCalls"], step=STEP_REFINE)
        log.info("refinement of %s applied (%s): %d turns, %d model calls, %d prompt tokens, %d ms",
                 short, reason, figures["turnsRefined"], figures["modelCalls"], figures["promptTokens"],
                 entry["durationMs"])
        requests.release(thread_id, token, refine=True)
        return RefineOutcome(Outcome.APPLIED, reason, None, entry, result)
    log.info("refinement of %s discarded: stale (%s)", short, committed.detail)
    entry = _record(services, thread_id, Outcome.STALE, committed.detail, figures, cleared=state.cleared)
    wait = float(services.settings.compaction_idle_seconds)
    requests.hold(thread_id, token, retry_marker_ttl(services.settings, wait), refine=True)
    return RefineOutcome(Outcome.STALE, committed.detail, None, entry, result, reschedule_in=wait)


# ------------------------------------------------------------------------------------------ helpers


def _classify(exc: BaseException) -> tuple[Reason | str, bool]:
    if isinstance(exc, LLMError):
        return reason_of(exc.category), exc.category in RETRYABLE
    if isinstance(exc, domain.InvalidCompactionOutput):
        return Reason.INVALID_ANSWER, True
    if type(exc).__name__ == "SoftTimeLimitExceeded":  # celery's, raised inside the task
        return Reason.TIMEOUT, True
    if isinstance(exc, StoreUnavailable):
        return Reason.STORE_UNAVAILABLE, True
    return Reason.INTERNAL, False


def _figures(prepared: Prepared, result: CompactionResult | None, started: float, attempt: int) -> dict:
    figures: dict[str, int | float] = {"attempt": attempt, "durationMs": int((time.monotonic() - started) * 1000),
               "turnsFolded": prepared.plan.folded_turns}
    if result is not None:
        figures.update(
            tokensBefore=result.tokens_before,
            tokensAfter=result.tokens_after,
            summaryChars=len(result.summary),
            notesCount=len(result.notes),
            factRetention=result.retention,
            factsChecked=result.facts_checked,
            factsDropped=result.facts_dropped,
            factsSkipped=result.facts_skipped,
            unreadShare=result.unread_share,
        )
    return figures


def _record(services: Services, thread_id: str, outcome: Outcome, reason: Reason | str, figures: dict,
            cleared: int | None = None) -> dict:
    """Push one history entry (numbers and categories only), capped at ``HISTORY_MAX``; return it.  With
    ``cleared`` (the clear counter of the state the work read) nothing is recorded when the thread was cleared
    since: a new conversation never lists the old one's work (docs/memory.md: New chat: clearing is final)."""
    entry = {"at": int(time.time() * 1000), "outcome": outcome, "reason": reason, **figures}
    try:
        services.store.history.record_compaction(thread_id, entry, HISTORY_MAX, cleared=cleared)
    except StoreUnavailable as exc:
        log.warning("compaction history for %s not recorded: %s", thread_label(thread_id), exc)
    return entry


def _publish(services: Services, thread_id: str, status: str, message: str, **numbers: object) -> None:
    """Publish ``{"type":"memory","status",...}`` on the thread's events channel (best effort)."""
    try:
        services.store.publish_event(thread_id, {"type": "memory", "status": status, "message": message, **numbers})
    except StoreUnavailable as exc:
        log.warning("memory event for %s not published: %s", thread_label(thread_id), exc)


def _request_again_if_due(services: Services, thread_id: str) -> bool:
    """After an applied or stale compaction: enqueue another one when the thread is still due."""
    try:
        state = services.store.load(thread_id)
    except (StoreUnavailable, CorruptState):
        return False
    tokens = domain.uncompacted_tokens(state.messages, services.counter)
    return services.compaction_requests.after_commit(thread_id, message_count=len(state.messages),
                                                     uncompacted_tokens=tokens, version=state.version)
