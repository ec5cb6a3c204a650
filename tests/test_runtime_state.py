"""Run state apart from ThreadState, producer dispatch, and the models of structured answers."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from app.extensions import Services
from app.llm.structured import answer_problems, answer_schema, parse_json, strict_answer_schema
from app.memory.final_turn import FinalTurn
from app.memory.hydration import build_hydration
from app.runtime import capabilities
from app.runtime.chat import ChatProducer
from app.runtime.delivery import DeliveryProducer, DeliveryReview
from app.runtime.producers import CommandError, choose_producer, is_confirmation
from app.runtime.run_store import RUN_TTL_SECONDS, Run, RunStore
from app.runtime.tasklist import DropTaskListProducer, TaskListProducer, TaskPlan, TaskResult, render_artifact
from app.runtime.tool_chat import ToolChatProducer
from app.store.keys import ThreadKeys, provider_caps_key
from tests.fixtures.runs import commit_recorded_final, forget_provider_caps

THREAD = "chat:" + "ab" * 32


@pytest.fixture
def services(settings):
    svc = Services(settings)
    yield svc
    svc.redis.close()


def problems(model, value) -> str:
    """What ``model`` finds wrong with ``value``, as the model is told it."""
    with pytest.raises(ValidationError) as caught:
        model.model_validate(value)
    return "; ".join(answer_problems(caught.value))


def paused_run(services, goal="Plan a picnic") -> Run:
    store = RunStore(services.redis, THREAD)
    run = Run("r_" + "1" * 32, "tasklist", goal, status="paused",
              state={"tasks": [{"title": "Task PLANITEM", "needsConfirmation": True}], "next": 0, "results": [],
                     "awaiting": {"kind": "task", "index": 0}})
    run.checkpoint("task:0", "paused")
    run.artifact = render_artifact(run)
    store.save(run)
    store.set_paused(run.id)
    return run


def test_run_state_has_its_own_keys_and_ttl(services, redis_client, store):
    store.commit_final_turn(THREAD, FinalTurn("hello", "hi there", "completed"))
    run = paused_run(services)
    keys = ThreadKeys(THREAD)
    assert sorted(redis_client.keys("run:*")) == sorted([keys.run(run.id), keys.paused_run])
    assert keys.run(run.id) == "run:{" + "ab" * 32 + "}:" + run.id
    assert 0 < redis_client.ttl(keys.run(run.id)) <= RUN_TTL_SECONDS
    assert 0 < redis_client.ttl(keys.paused_run) <= RUN_TTL_SECONDS
    # a memory write neither reads nor refreshes run keys; the run's fields never enter the thread hash
    redis_client.expire(keys.run(run.id), 100)
    store.commit_final_turn(THREAD, FinalTurn("again", "sure", "completed"))
    assert redis_client.ttl(keys.run(run.id)) <= 100
    assert keys.run(run.id) not in keys.ttl_keys() and keys.paused_run not in keys.ttl_keys()
    state = store.load(THREAD)
    dto = build_hydration(THREAD, state)
    assert [m["text"] for m in dto["messages"]] == ["hello", "hi there", "again", "sure"]
    assert "PLANITEM" not in repr(dto) and "PLANITEM" not in repr(redis_client.hgetall(keys.state))


def test_run_round_trips_and_is_claimed_once(services):
    run = paused_run(services)
    store = RunStore(services.redis, THREAD)
    loaded = store.load(run.id)
    assert (loaded.kind, loaded.goal, loaded.status, loaded.state, loaded.artifact) == (
        "tasklist", "Plan a picnic", "paused", run.state,
        "# Task list\n\nGoal: Plan a picnic\n\n- [ ] 1. Task PLANITEM — *needs your confirmation*")
    assert [c["step"] for c in loaded.checkpoints] == ["task:0"]
    assert store.paused_id() == run.id
    assert store.take_paused() == run.id
    assert store.take_paused() is None  # GETDEL: a second confirmation gets nothing
    assert store.load("r_unknown") is None


def test_drop_paused_marks_the_run_cancelled(services):
    run = paused_run(services)
    store = RunStore(services.redis, THREAD)
    assert store.drop_paused() == run.id
    assert store.load(run.id).status == "cancelled"
    assert store.paused_id() is None
    assert store.drop_paused() is None


def test_commit_recorded_final_writes_once(services, store):
    run = paused_run(services)
    store_ = RunStore(services.redis, THREAD)
    assert commit_recorded_final(services, THREAD, run.id) is None  # not finished: nothing to write
    run.status = "final"
    run.final = {"status": "final", "source": "tasklist-agent", "userText": "Plan a picnic",
                 "text": "The picnic is planned.", "userId": "u-1", "assistantId": "m_1"}
    store_.save(run)
    assert commit_recorded_final(services, THREAD, run.id).appended is True
    assert commit_recorded_final(services, THREAD, run.id).appended is False
    assert [(m.id, m.text) for m in store.load(THREAD).messages] == [("u-1", "Plan a picnic"),
                                                                     ("m_1", "The picnic is planned.")]


def test_choose_producer(services):
    assert isinstance(choose_producer(services, THREAD, "hello"), ToolChatProducer)
    tasklist = choose_producer(services, THREAD, "/tasklist  Plan a picnic\nfor Saturday ")
    assert isinstance(tasklist, TaskListProducer) and tasklist.goal == "Plan a picnic\nfor Saturday"
    assert isinstance(choose_producer(services, THREAD, "/TaskList cancel"), DropTaskListProducer)
    delivery = choose_producer(services, THREAD, "/delivery Build a landing page")
    assert isinstance(delivery, DeliveryProducer) and delivery.goal == "Build a landing page"
    # confirmation words are plain chat while nothing waits
    assert isinstance(choose_producer(services, THREAD, "yes"), ToolChatProducer)
    with pytest.raises(CommandError) as caught:
        choose_producer(services, THREAD, "/tasklist continue")
    assert (caught.value.code, caught.value.message) == ("nothing_to_resume", "There is no paused task list to continue.")
    for text in ("/tasklist", "/delivery   "):
        with pytest.raises(CommandError) as caught:
            choose_producer(services, THREAD, text)
        assert caught.value.code == "empty_input"
    assert isinstance(choose_producer(services, THREAD, "/tasklisting things"), ToolChatProducer)

    paused_run(services)
    for text in ("/tasklist continue", "/tasklist yes", "yes", "Yes!", "go ahead", "OK."):
        producer = choose_producer(services, THREAD, text)
        assert isinstance(producer, TaskListProducer) and producer.goal is None, text
    assert isinstance(choose_producer(services, THREAD, "yes, but first tell me a joke"), ToolChatProducer)


def test_tools_off_by_setting_or_by_provider(settings, services):
    off = Services(settings.with_overrides(tools_enabled=False))
    assert type(choose_producer(off, THREAD, "hello")) is ChatProducer
    assert capabilities.tools_enabled(services) is True
    capabilities.mark_tools_refused(services)
    assert type(choose_producer(services, THREAD, "hello")) is ChatProducer
    assert services.redis.hget(provider_caps_key(settings.openai_base_url), "tools") == "1"
    # another process (a fresh Services) learns it from Redis
    assert capabilities.tools_enabled(Services(settings)) is False
    forget_provider_caps(services)
    assert capabilities.tools_enabled(services) is True
    off.redis.close()


def test_is_confirmation():
    assert [is_confirmation(t) for t in ("yes", " Continue. ", "go ahead!", "no", "yes and no", "")] == [
        True, True, True, False, False, False]


def test_models_of_structured_answers():
    assert TaskPlan.model_validate({"tasks": [{"title": "  Pick   a park ", "needsConfirmation": False},
                                              {"title": "Buy food", "needsConfirmation": True}]}).as_state() == [
        {"title": "Pick a park", "needsConfirmation": False}, {"title": "Buy food", "needsConfirmation": True}]
    assert TaskPlan.model_validate({"tasks": [{"title": "x" * 300}]}).as_state() == [
        {"title": "x" * 200, "needsConfirmation": False}]
    for bad, reason in [({"tasks": []}, "tasks must be a non-empty list"), ({}, "tasks must be a non-empty list"),
                        ({"tasks": [{"title": "t"}] * 7}, "at most 6 tasks"),
                        ({"tasks": [{"title": " "}]}, "every task needs a non-empty title"),
                        ({"tasks": ["a title"]}, "every task needs a non-empty title"),
                        ({"tasks": [{"title": "t", "needsConfirmation": "yes"}]},
                         "needsConfirmation must be true or false")]:
        assert problems(TaskPlan, bad) == reason
    assert TaskResult.model_validate({"status": "blocked", "output": " no budget "}).model_dump() == {
        "status": "blocked", "output": "no budget"}
    assert problems(TaskResult, {"status": "maybe", "output": ""}) == 'status must be "done" or "blocked"'
    assert problems(TaskResult, {"status": "done"}) == "output must be a string"
    assert DeliveryReview.model_validate({"verdict": "approved", "report": "All good."}).model_dump() == {
        "verdict": "approved", "report": "# Delivery Report\n\nAll good."}
    assert DeliveryReview.model_validate({"verdict": "blocked", "report": "# Delivery Report\nNo."}).report == \
        "# Delivery Report\nNo."
    assert problems(DeliveryReview, {"verdict": "approved", "report": "  "}) == "report must be a non-empty string"


def test_answer_schemas_come_from_the_models():
    plan = {"type": "object", "required": ["tasks"], "additionalProperties": False, "properties": {"tasks": {
        "type": "array", "minItems": 1, "maxItems": 6, "items": {
            "type": "object", "required": ["title", "needsConfirmation"], "additionalProperties": False,
            "properties": {"title": {"type": "string"}, "needsConfirmation": {"type": "boolean"}}}}}}
    assert answer_schema(TaskPlan) == strict_answer_schema(TaskPlan) == plan
    assert answer_schema(TaskResult) == {
        "type": "object", "required": ["status", "output"], "additionalProperties": False,
        "properties": {"status": {"type": "string", "enum": ["done", "blocked"]}, "output": {"type": "string"}}}
    assert answer_schema(DeliveryReview) == {
        "type": "object", "required": ["verdict", "report"], "additionalProperties": False,
        "properties": {"verdict": {"type": "string", "enum": ["approved", "blocked"]}, "report": {"type": "string"}}}


def test_an_answer_is_parsed_then_validated():
    assert parse_json('```json\n{"a": 1}\n```') == {"a": 1}
    assert parse_json('Here it is: {"a": {"b": 2}} thanks') == {"a": {"b": 2}}
    for bad in ("[1, 2]", "no json", ""):
        with pytest.raises(ValueError):
            TaskResult.model_validate(parse_json(bad))
