"""The compaction task: re-read, fold, validate, commit with one compare-and-set, publish (issue 4).

Lifecycle of one compaction::

    turn committed ─► request_compaction: due? ─► SET NX EX marker ─► enqueue (thread id, version)
    compact_thread ─► load the thread (never data from the message) ─► still due? plan (pure)
      ─► publish "started" ─► model, structured output ─► validate (over a limit: ask once
         more, then failure; a copied previous summary: ask once more, then cut the copy
         out) ─► fact guard (ask once more naming what is missing, then carry it) ─► pin merge
      ─► apply_compaction (one Lua CAS: gen unchanged, folded ids still the oldest)
           applied: publish "succeeded", record, release marker, request again if still due
           stale:   discard, log, record, release marker, request again if still due
           failed:  nothing written; publish "failed", record; retry with backoff and
                    jitter (bounded) for transient errors, keeping the marker; after the
                    last retry release the marker (the next turn triggers again); past
                    the hard cap on stored messages fold extractively instead.

No WATCH is held across the model call and a write is never retried from a stale
snapshot: every attempt re-reads.  Redis failures in ``request_compaction`` are
logged and never reach the turn.
"""

from __future__ import annotations

import json
import logging
import random
import time
from dataclasses import dataclass, field

from celery import shared_task
from celery.exceptions import SoftTimeLimitExceeded

from app.celery_setup import COMPACTION_QUEUE
from app.extensions import Services, services
from app.llm.provider import LLMError
from app.llm.structured import StructuredAnswer, compaction_json_schema, structured_client
from app.memory import compaction as domain
from app.memory.state import PINNED_BY_PERSON, ThreadState, utc_now_iso
from app.store.keys import ThreadKeys
from app.store.thread_store import CompactionCommit, CorruptState, StoreUnavailable

log = logging.getLogger(__name__)

TASK_NAME = "workers.compaction.compact_thread"
HISTORY_MAX = 50
TIME_MARGIN_SECONDS = 15.0
"""Time kept free before the task's time limit for the commit, the event and the history (seconds)."""
RETRYABLE = frozenset({"rate_limited", "timeout", "unavailable", "invalid_answer", "store_unavailable"})

MESSAGE_STARTED = "Summarizing older turns to keep memory short."
MESSAGE_SUCCEEDED = "Older turns were summarized."
MESSAGE_RETRYING = "Older turns could not be summarized yet. They are kept as they are; trying again later."
MESSAGE_FAILED = "Older turns could not be summarized. They are kept as they are."
MESSAGE_STALE = "Memory changed while summarizing. Nothing was lost."

# Delete the marker only when it still holds the version this task was enqueued with.
_RELEASE_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
# Record one history entry when the thread exists, with the thread's remaining TTL.
_HISTORY_LUA = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('LPUSH', KEYS[2], ARGV[1])
redis.call('LTRIM', KEYS[2], 0, tonumber(ARGV[2]) - 1)
local ttl = redis.call('TTL', KEYS[1])
if ttl > 0 then redis.call('EXPIRE', KEYS[2], ttl) else redis.call('EXPIRE', KEYS[2], tonumber(ARGV[3])) end
return 1
"""


# ------------------------------------------------------------------------------------------ settings


def marker_ttl(settings) -> int:
    """Seconds the pending-compaction marker lives: every attempt at its time limit plus the backoffs.

    The marker is a safety net only: the task releases it at its final outcome.
    """
    attempts = settings.compaction_max_retries + 1
    backoffs = sum(retry_countdown(settings, n, jitter=1.5) for n in range(settings.compaction_max_retries))
    return int(settings.compaction_time_limit * attempts + backoffs + 60)


def retry_countdown(settings, attempt: int, *, jitter: float | None = None) -> float:
    """Seconds before retry number ``attempt + 1``: ``backoff * 2**attempt`` times a jitter in [0.5, 1.5)."""
    factor = jitter if jitter is not None else 0.5 + random.random()
    return round(settings.compaction_retry_backoff * (2 ** attempt) * factor, 3)


# ------------------------------------------------------------------------------------------ request


def request_compaction(services: Services, thread_id: str, *, message_count: int, uncompacted_tokens: int,
                       version: int) -> bool:
    """Enqueue a compaction after a committed turn when one is due (issue 4 item 2).

    Called by the turn runner right after a committed turn.  When
    ``compaction_due`` says so, sets the one-pending marker (SET NX EX, holding
    ``version``) and enqueues ``compact_thread(thread_id, version)`` on the
    ``compaction`` queue: the thread id and version only, never the data.  A
    second request while one is pending does nothing; a duplicate delivery is
    harmless (the task re-reads and commits with a compare-and-set).

    Args:
        services: the process's services (store, settings).
        thread_id: ``chat:`` + 64 hex.
        message_count: messages stored after the commit.
        uncompacted_tokens: tokens of the stored messages' texts
            (``app.memory.compaction.uncompacted_tokens``).
        version: the thread's version after the commit.

    Returns:
        True when a compaction was enqueued.  Redis or broker failures are logged and
        give False; nothing is raised to the turn.
    """
    settings = services.settings
    if not domain.compaction_due(message_count, uncompacted_tokens, settings.limits, settings.prompt_budget):
        return False
    try:
        if not services.store.mark_compaction_pending(thread_id, version, marker_ttl(settings)):
            return False
    except StoreUnavailable as exc:
        log.warning("compaction for %s not requested: store unavailable (%s)", thread_id[:13], exc)
        return False
    except Exception:
        log.exception("compaction for %s not requested", thread_id[:13])
        return False
    try:
        compact_thread.apply_async(args=[thread_id, int(version)], queue=COMPACTION_QUEUE)
    except Exception as exc:
        log.warning("compaction for %s not enqueued: %s", thread_id[:13], type(exc).__name__)
        _release_marker(services, thread_id, version)
        return False
    log.info("compaction requested for %s at version %s", thread_id[:13], version)
    return True


# ------------------------------------------------------------------------------------------ phases


@dataclass(frozen=True)
class Prepared:
    """A thread read for compaction and the plan made from it."""

    thread_id: str
    state: ThreadState
    plan: domain.CompactionPlan


def prepare(services: Services, thread_id: str) -> Prepared | None:
    """Read the thread and plan a fold; None when no compaction is due any more.

    Raises:
        StoreUnavailable: Redis failed.
        CorruptState: the stored thread is invalid.
    """
    settings = services.settings
    state = services.store.load(thread_id)
    tokens = domain.uncompacted_tokens(state.messages, services.counter)
    if not domain.compaction_due(len(state.messages), tokens, settings.limits, settings.prompt_budget):
        return None
    plan = domain.plan_compaction(state, settings.limits, services.counter, settings.prompt_budget)
    if plan is None:
        return None
    return Prepared(thread_id, state, plan)


def _ask(services: Services, messages: list[dict], deadline: float) -> StructuredAnswer:
    """One model call, never past ``deadline`` (``time.monotonic()`` seconds)."""
    settings = services.settings
    remaining = deadline - time.monotonic()
    if remaining < 1.0:
        raise LLMError("llm_unavailable", "The model took too long to answer. Please try again.", "timeout", True)
    client = structured_client(settings)
    return client.complete_json(messages, schema=compaction_json_schema(settings.limits),
                                strict_schema=compaction_json_schema(settings.limits, with_lengths=False),
                                timeout=min(settings.compaction_llm_timeout, remaining))


def _valid(answer: StructuredAnswer, state: ThreadState, limits) -> domain.CompactionOutput:
    output = domain.validate_output(answer.data, limits)
    if domain.copies_previous_summary(output.summary, state.summary):
        raise domain.InvalidCompactionOutput(domain.PROBLEM_COPY, [
            "summary: it contains the previous summary word for word; rewrite the previous summary and the "
            "folded turns together into one shorter text"])
    return output


def produce(services: Services, prepared: Prepared, *, deadline: float | None = None) -> domain.CompactionResult:
    """Ask the model for the fold and turn its answer into what is written (issue 4 items 3-5).

    At most three model calls: the first; once more when the answer passes a limit or
    copies the previous summary (a second answer over a limit is a failure; a second
    copy is cut out of the answer, and an answer that was nothing but the copy is
    condensed extractively, so no stored summary ever contains the previous one,
    acceptance B5); once more naming facts that went missing (then whatever is still
    missing is carried).  With ``COMPACTION_STRATEGY=extractive`` no model is called.
    Every call ends before ``deadline`` (``time.monotonic()`` seconds; default: the
    task's time limit less a margin).

    Raises:
        LLMError: the provider failed (``rate_limited``, ``timeout``, ``unavailable``,
            ``bad_request``, ``invalid_answer``).
        InvalidCompactionOutput: the answer is not acceptable (``shape``, ``limit``, ``copy``).
    """
    settings = services.settings
    limits = settings.limits
    state, plan = prepared.state, prepared.plan
    if deadline is None:
        deadline = time.monotonic() + max(settings.compaction_time_limit - TIME_MARGIN_SECONDS, 1.0)
    if settings.compaction_strategy == "extractive":
        return domain.extractive_compaction(state, plan, limits)
    counter = services.counter
    prompt = domain.build_compaction_prompt(state, plan, limits, counter=counter)
    answer = _ask(services, prompt, deadline)
    try:
        output = _valid(answer, state, limits)
    except domain.InvalidCompactionOutput as exc:
        if exc.kind == domain.PROBLEM_SHAPE:
            raise
        log.info("compaction for %s: answer not accepted (%s); asking once more", prepared.thread_id[:13], exc.kind)
        answer = _ask(services, domain.build_compaction_prompt(
            state, plan, limits, counter=counter, previous_answer=answer.raw, feedback=exc.problems), deadline)
        try:
            output = _valid(answer, state, limits)
        except domain.InvalidCompactionOutput as again:
            if again.kind != domain.PROBLEM_COPY:
                raise
            output = domain.validate_output(answer.data, limits)
            remainder = domain.remove_previous_summary(output.summary, state.summary)
            log.info("compaction for %s: the previous summary was copied again; %s", prepared.thread_id[:13],
                     "keeping only what was added" if remainder else "condensing without the model's summary")
            if not remainder:
                return domain.extractive_compaction(state, plan, limits, model_pins=output.pinned_decisions,
                                                    strategy="condensed")
            output = domain.CompactionOutput(remainder, output.pinned_decisions)

    try:
        result = domain.finish_compaction(state, plan, output, limits)
    except domain.InvalidCompactionOutput:  # carrying facts re-created the previous summary (degenerate)
        return domain.extractive_compaction(state, plan, limits, model_pins=output.pinned_decisions,
                                            strategy="condensed")
    if result.missing:
        missing = result.missing
        log.info("compaction for %s: %d facts missing (retention %.2f); asking once more",
                 prepared.thread_id[:13], len(missing), result.model_retention)
        try:
            second = _ask(services, domain.build_compaction_prompt(
                state, plan, limits, counter=counter, previous_answer=answer.raw,
                feedback=[domain.missing_facts_feedback(missing)]), deadline)
            retry_result = domain.finish_compaction(state, plan, _valid(second, state, limits), limits)
            if retry_result.model_retention >= result.model_retention:
                result = retry_result
        except (LLMError, domain.InvalidCompactionOutput) as exc:
            log.info("compaction for %s: second answer unusable (%s); carrying the missing facts",
                     prepared.thread_id[:13], getattr(exc, "category", None) or getattr(exc, "kind", "invalid"))
    return result


def commit(services: Services, prepared: Prepared, result: domain.CompactionResult) -> CompactionCommit:
    """Write a result with the Lua compare-and-set (issue 4 item 6); ``lastCompactedAt`` is set here.

    Raises:
        StoreUnavailable: Redis failed (nothing was written).
    """
    plan = prepared.plan
    return services.store.apply_compaction(
        prepared.thread_id, expected_gen=plan.expected_gen, folded_ids=plan.folded_ids,
        summary=result.summary, pins=list(result.pins), compacted_at=utc_now_iso())


# ------------------------------------------------------------------------------------------ run


@dataclass
class RunOutcome:
    """What one task attempt did.

    Attributes:
        outcome: ``applied``, ``stale``, ``failed`` or ``skipped`` (not due).
        reason: a category: ``rate_limited``, ``timeout``, ``unavailable``, ``bad_request``,
            ``invalid_answer``, ``store_unavailable``, ``corrupt``, ``internal``, ``not_due``,
            a stale reason (``generation``, ``messages``, ``missing``), or ``""``.
        retry_in: seconds until the next attempt when the task should be retried, else None.
        figures: the numbers recorded in the history entry.
    """

    outcome: str
    reason: str = ""
    retry_in: float | None = None
    figures: dict = field(default_factory=dict)


def run_compaction(services: Services, thread_id: str, seen_version: int, *, attempt: int = 0) -> RunOutcome:
    """One attempt of the compaction task (the body of ``compact_thread``; unit tests call it directly).

    Args:
        services: the process's services.
        thread_id: the thread to compact.
        seen_version: the version the request saw (the marker's value; logged).
        attempt: 0 for the first attempt, n for the n-th retry.

    Returns:
        The outcome; ``retry_in`` is set when the caller should retry after that many seconds.
    """
    settings = services.settings
    started = time.monotonic()
    short = thread_id[:13]
    can_retry = attempt < settings.compaction_max_retries

    def fail(reason: str, prepared: Prepared | None, retryable: bool) -> RunOutcome:
        retry = retryable and can_retry
        retry_in = retry_countdown(settings, attempt) if retry else None
        figures = _figures(prepared, None, started, attempt) if prepared else {"attempt": attempt}
        if prepared is not None:
            _record(services, thread_id, "failed", reason, figures)
            _publish(services, thread_id, "failed", MESSAGE_RETRYING if retry else MESSAGE_FAILED,
                     reason=reason, retrying=retry)
        log.warning("compaction for %s failed (%s), attempt %d%s", short, reason, attempt + 1,
                    f"; retrying in {retry_in:.1f} s" if retry else "; giving up until the next turn")
        if not retry:
            _release_marker(services, thread_id, seen_version)
        return RunOutcome("failed", reason, retry_in, figures)

    try:
        prepared = prepare(services, thread_id)
    except StoreUnavailable:
        return fail("store_unavailable", None, True)
    except CorruptState:
        log.error("compaction for %s skipped: stored state is invalid", short)
        return fail("corrupt", None, False)
    if prepared is None:
        log.info("compaction for %s skipped: not due (seen version %s)", short, seen_version)
        _release_marker(services, thread_id, seen_version)
        return RunOutcome("skipped", "not_due")

    _publish(services, thread_id, "started", MESSAGE_STARTED)
    deadline = started + max(settings.compaction_time_limit - TIME_MARGIN_SECONDS, 1.0)
    try:
        result = produce(services, prepared, deadline=deadline)
    except (LLMError, domain.InvalidCompactionOutput, SoftTimeLimitExceeded, Exception) as exc:
        reason, retryable = _classify(exc)
        if isinstance(exc, (LLMError, domain.InvalidCompactionOutput, SoftTimeLimitExceeded)):
            log.info("compaction for %s: model step failed: %s", short, reason)
        else:
            log.exception("compaction for %s: unexpected error", short)
        if len(prepared.state.messages) >= domain.hard_cap_messages(settings.limits):
            log.warning("compaction for %s: %d messages at the hard cap; folding extractively",
                        short, len(prepared.state.messages))
            result = domain.extractive_compaction(prepared.state, prepared.plan, settings.limits)
        else:
            return fail(reason, prepared, retryable)

    problem = _final_check(result, settings.limits)
    if problem:
        log.error("compaction for %s: result over a limit (%s); not written", short, problem)
        return fail("invalid_answer", prepared, True)
    try:
        committed = commit(services, prepared, result)
    except StoreUnavailable:
        return fail("store_unavailable", prepared, True)

    figures = _figures(prepared, result, started, attempt, services)
    if committed.outcome == "applied":
        _record(services, thread_id, "applied", result.strategy, figures)
        _publish(services, thread_id, "succeeded", MESSAGE_SUCCEEDED, summaryLength=len(result.summary),
                 pinnedDecisionCount=len(result.pins), turnsFolded=prepared.plan.folded_turns,
                 factRetention=result.model_retention)
        log.info("compaction for %s applied (%s): folded %d turns, kept %d, tokens %d -> %d, summary %d chars, "
                 "%d pins, fact retention %.2f (model %.2f, %d carried, %d lost), %d ms",
                 short, result.strategy, prepared.plan.folded_turns, prepared.plan.kept_turns,
                 figures["tokensBefore"], figures["tokensAfter"], len(result.summary), len(result.pins),
                 result.retention, result.model_retention, result.facts_carried, result.facts_lost,
                 figures["durationMs"])
        _release_marker(services, thread_id, seen_version)
        _request_again_if_due(services, thread_id)
        return RunOutcome("applied", result.strategy, None, figures)

    log.info("compaction for %s discarded: stale (%s); seen version %s, read version %s",
             short, committed.detail, seen_version, prepared.state.version)
    _record(services, thread_id, "stale", committed.detail, figures)
    _release_marker(services, thread_id, seen_version)
    if not _request_again_if_due(services, thread_id):
        _publish(services, thread_id, "failed", MESSAGE_STALE, reason="stale", retrying=False)
    return RunOutcome("stale", committed.detail, None, figures)


@shared_task(bind=True, name=TASK_NAME, acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def compact_thread(self, thread_id: str, seen_version: int):
    """Celery task (queue ``compaction``): compact one thread (see ``run_compaction``).

    Args:
        thread_id: ``chat:`` + 64 hex.  Message text never travels in the task.
        seen_version: the version the request saw.

    Retries (``self.retry`` with a countdown, bounded by ``COMPACTION_MAX_RETRIES``) for
    transient failures; the pending marker is kept while a retry waits.
    """
    svc = services()
    outcome = run_compaction(svc, thread_id, seen_version, attempt=self.request.retries)
    if outcome.retry_in is not None:
        raise self.retry(countdown=outcome.retry_in, max_retries=svc.settings.compaction_max_retries)
    return outcome.outcome


# ------------------------------------------------------------------------------------------ helpers


def _classify(exc: BaseException) -> tuple[str, bool]:
    if isinstance(exc, LLMError):
        return exc.category, exc.category in RETRYABLE
    if isinstance(exc, domain.InvalidCompactionOutput):
        return "invalid_answer", True
    if isinstance(exc, SoftTimeLimitExceeded):
        return "timeout", True
    if isinstance(exc, StoreUnavailable):
        return "store_unavailable", True
    return "internal", False


def _final_check(result: domain.CompactionResult, limits) -> str:
    """A last bound check before writing (the stored-state schema would refuse the thread otherwise)."""
    if len(result.summary) > limits.summary_max_chars:
        return "summary"
    if len(result.pins) > limits.pinned_max and any(p.by != PINNED_BY_PERSON for p in result.pins):
        return "pins"
    if any(not p.text.strip() or len(p.text) > limits.pinned_max_chars for p in result.pins):
        return "pin text"
    return ""


def _figures(prepared: Prepared | None, result: domain.CompactionResult | None, started: float, attempt: int,
             services: Services | None = None) -> dict:
    figures = {"attempt": attempt, "durationMs": int((time.monotonic() - started) * 1000)}
    if prepared is None:
        return figures
    plan = prepared.plan
    figures.update(turnsFolded=plan.folded_turns, tokensBefore=plan.tokens_before)
    if result is not None and services is not None:
        figures.update(
            tokensAfter=domain.memory_tokens(result.summary, [p.text for p in result.pins], plan.kept,
                                             services.counter),
            summaryChars=len(result.summary),
            pinsCount=len(result.pins),
            factRetention=result.model_retention,
            factRetentionFinal=result.retention,
            factsCarried=result.facts_carried,
            factsLost=result.facts_lost,
        )
    return figures


def _record(services: Services, thread_id: str, outcome: str, reason: str, figures: dict) -> None:
    """Push one history entry (numbers and categories only) on ``ThreadKeys.compactions``, capped at 50."""
    keys = ThreadKeys(thread_id)
    entry = {"at": int(time.time() * 1000), "outcome": outcome, "reason": reason, **figures}
    try:
        services.redis.eval(_HISTORY_LUA, 2, keys.state, keys.compactions,
                            json.dumps(entry, separators=(",", ":")), HISTORY_MAX,
                            services.settings.memory_ttl_seconds)
    except Exception as exc:
        log.warning("compaction history for %s not recorded: %s", thread_id[:13], type(exc).__name__)
    from app.observability.metrics import observe_compaction
    observe_compaction(services.redis, entry)  # issue 7: counters for /metrics, aggregated through Redis


def _publish(services: Services, thread_id: str, status: str, message: str, **numbers) -> None:
    """Publish ``{"type":"memory","status",...}`` on the thread's events channel (best effort)."""
    frame = {"type": "memory", "status": status, "message": message, **numbers}
    try:
        services.redis.publish(ThreadKeys(thread_id).events, json.dumps(frame, separators=(",", ":")))
    except Exception as exc:
        log.warning("memory event for %s not published: %s", thread_id[:13], type(exc).__name__)


def _release_marker(services: Services, thread_id: str, version: int) -> None:
    """Delete the pending marker if it still holds ``version`` (a newer request's marker is left alone)."""
    try:
        services.redis.eval(_RELEASE_LUA, 1, ThreadKeys(thread_id).compacting, str(version))
    except Exception as exc:
        log.warning("compaction marker for %s not released (it expires): %s", thread_id[:13], type(exc).__name__)


def _request_again_if_due(services: Services, thread_id: str) -> bool:
    """After an applied or stale compaction: enqueue another one when the thread is still due."""
    try:
        state = services.store.load(thread_id)
    except (StoreUnavailable, CorruptState):
        return False
    tokens = domain.uncompacted_tokens(state.messages, services.counter)
    return request_compaction(services, thread_id, message_count=len(state.messages),
                              uncompacted_tokens=tokens, version=state.version)
