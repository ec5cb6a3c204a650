"""Run state apart from ThreadState, producer dispatch, and the validators of structured answers (issue 6)."""

from __future__ import annotations

import pytest

from app.chat.turn import ChatProducer
from app.extensions import Services
from app.memory.final_turn import FinalTurn
from app.memory.hydration import build_hydration
from app.runtime import capabilities
from app.runtime.delivery import DeliveryProducer, validate_review
from app.runtime.llm_calls import parse_json_object
from app.runtime.producers import CommandError, choose_producer, commit_recorded_final, is_confirmation
from app.runtime.run_store import RUN_TTL_SECONDS, Run, RunStore
from app.runtime.tasklist import DropTaskListProducer, TaskListProducer, render_artifact, validate_plan, \
    validate_task_result
from app.runtime.tool_chat import ToolChatProducer
from app.store.keys import ThreadKeys, provider_caps_key

THREAD = "chat:" + "ab" * 32


@pytest.fixture
def services(settings):
    svc = Services(settings)
    yield svc
    capabilities.forget()
    svc.redis.close()


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
    capabilities.mark_unsupported(services, capabilities.TOOLS)
    assert type(choose_producer(services, THREAD, "hello")) is ChatProducer
    assert services.redis.hget(provider_caps_key(settings.openai_base_url), "tools") == "1"
    capabilities.forget()  # this process forgets; Redis still knows (another process learned it)
    assert capabilities.tools_enabled(services) is False
    capabilities.forget(services)
    assert capabilities.tools_enabled(services) is True
    off.redis.close()


def test_is_confirmation():
    assert [is_confirmation(t) for t in ("yes", " Continue. ", "go ahead!", "no", "yes and no", "")] == [
        True, True, True, False, False, False]


def test_validators_of_structured_answers():
    assert validate_plan({"tasks": [{"title": "  Pick   a park ", "needsConfirmation": False},
                                    {"title": "Buy food", "needsConfirmation": True}]}) == [
        {"title": "Pick a park", "needsConfirmation": False}, {"title": "Buy food", "needsConfirmation": True}]
    assert validate_plan({"tasks": [{"title": "x" * 300}]}) == [{"title": "x" * 200, "needsConfirmation": False}]
    for bad, reason in [({"tasks": []}, "tasks must be a non-empty list"), ({}, "tasks must be a non-empty list"),
                        ({"tasks": [{"title": "t"}] * 7}, "at most 6 tasks"),
                        ({"tasks": [{"title": " "}]}, "every task needs a non-empty title"),
                        ({"tasks": [{"title": "t", "needsConfirmation": "yes"}]},
                         "needsConfirmation must be true or false")]:
        with pytest.raises(ValueError) as caught:
            validate_plan(bad)
        assert str(caught.value) == reason
    assert validate_task_result({"status": "blocked", "output": " no budget "}) == {"status": "blocked",
                                                                                   "output": "no budget"}
    with pytest.raises(ValueError):
        validate_task_result({"status": "maybe", "output": ""})
    assert validate_review({"verdict": "approved", "report": "All good."}) == {
        "verdict": "approved", "report": "# Delivery Report\n\nAll good."}
    assert validate_review({"verdict": "blocked", "report": "# Delivery Report\nNo."})["report"] == "# Delivery Report\nNo."
    with pytest.raises(ValueError):
        validate_review({"verdict": "approved", "report": "  "})


def test_parse_json_object():
    assert parse_json_object('```json\n{"a": 1}\n```') == {"a": 1}
    assert parse_json_object('Here it is: {"a": {"b": 2}} thanks') == {"a": {"b": 2}}
    for bad in ("[1, 2]", "no json", ""):
        with pytest.raises(ValueError):
            parse_json_object(bad)
