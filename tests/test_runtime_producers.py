"""Every producer end to end: the real websocket, real Redis, the fake model over HTTP.

docs/memory.md: "The boundary: what enters memory".

For each producer (plain chat, tool, resource, task list final / blocked / paused then resumed,
delivery completed / blocked with a long report / failed, cancelled runs) the stored thread holds
exactly the expected texts or is unchanged; hydration carries no forbidden key; and none of the
runtime's own strings (tool arguments and results, resource contents, plan items, task outputs)
reaches a stored message, the summary, or the next turn's prompt.
"""

from __future__ import annotations

import json
import re

import pytest

from app.memory.final_turn import TRUNCATION_NOTICE
from app.memory.hydration import find_forbidden_key
from app.runtime.resources import read_resource
from app.runtime.run_store import RUN_TTL_SECONDS, RunStore
from app.store.keys import ThreadKeys
from chat_support.fake_llm import Reply
from chat_support.live_app import ChatClient, answer_text, frame_kinds
from tests.fixtures.runs import commit_recorded_final
from tests.fixtures.streamed_chat import wait_for
from tests.helpers.tool_scripts import (
    PLAN_ITEMS,
    has_tool_results,
    last_user,
    matching,
    only_run,
    planner,
    run_keys,
    script_tasklist,
    stage,
    texts,
    worker_for,
)

# ------------------------------------------------------------------------------------------ helpers


def frames_of(frames: list[dict], kind: str) -> list[dict]:
    return [f for f in frames if f["type"] == kind]


def assert_clean(client: ChatClient, fake_llm, forbidden_strings: list[str], *, summary: str = "") -> dict:
    """Hydration has no forbidden key; no runtime string is in a stored message, the summary or
    the next turn's prompt (a plain chat turn sent now).  Returns the hydration."""
    dto = client.thread()
    assert find_forbidden_key(dto) is None
    stored = [m["text"] for m in dto["messages"]]
    for needle in forbidden_strings:
        assert not any(needle in t for t in stored), needle
        assert needle not in summary and needle not in dto.get("summaryPreview", ""), needle
        assert needle not in json.dumps(dto), needle
    fake_llm.enqueue(Reply(text="Sure."), when=lambda b: last_user(b) == "next question")
    frames = client.turn("next question")
    assert frames[-1]["status"] == "completed"
    prompt = fake_llm.last_request().messages
    assert all(m["role"] in ("system", "user", "assistant") for m in prompt)
    assert not any("tool_calls" in m for m in prompt)
    for needle in forbidden_strings:
        assert not any(needle in (m.get("content") or "") for m in prompt), needle
    # after the system messages, the prompt is the stored thread verbatim, then the new text
    assert [(m["role"], m["content"]) for m in prompt if m["role"] != "system"] == [
        (m["role"], m["text"]) for m in dto["messages"]] + [("user", "next question")]
    return dto


# ------------------------------------------------------------------------------------------ plain chat and tools


def test_plain_chat_stores_the_two_texts_and_offers_tools(chat, fake_llm):
    fake_llm.default = Reply(text="Hello there, how can I help?")
    frames = chat.turn("Hi!")
    assert frame_kinds(frames) == ["start", "delta", "done"] and answer_text(frames) == "Hello there, how can I help?"
    assert frames[-1]["status"] == "completed"
    assert texts(chat) == [("user", "Hi!"), ("assistant", "Hello there, how can I help?")]
    assert [t["function"]["name"] for t in fake_llm.last_request().tools] == [
        "calculator", "current_time", "read_resource"]
    assert_clean(chat, fake_llm, [])


def test_tool_turn_stores_only_the_final_answer(chat, fake_llm, redis_client):
    fake_llm.add_rule(Reply(tool_calls=[{"id": "call_mul", "name": "calculator",
                                         "arguments": {"expression": "12345*6789"}}]),
                      stream=True, when=lambda b: b.get("tools") and not has_tool_results(b), times=1)
    fake_llm.add_rule(Reply(text="That is 83,810,205 in total."), when=has_tool_results, times=1)
    frames = chat.turn("How much is twelve thousand three hundred forty-five times six thousand seven hundred eighty-nine?")

    assert [f["type"] for f in frames][:3] == ["start", "tool", "tool"]
    started, finished = frames_of(frames, "tool")
    assert started == {"type": "tool", "id": "call_mul", "name": "calculator",
                       "arguments": {"expression": "12345*6789"}, "status": "started"}
    assert finished == {"type": "tool", "id": "call_mul", "name": "calculator",
                        "arguments": {"expression": "12345*6789"}, "result": "83810205", "status": "finished"}
    assert answer_text(frames) == "That is 83,810,205 in total."
    assert frames[-1]["status"] == "completed"

    follow_up = fake_llm.last_request()
    assistant, tool = follow_up.messages[-2:]
    assert assistant["role"] == "assistant" and assistant["tool_calls"][0]["id"] == "call_mul"
    assert json.loads(assistant["tool_calls"][0]["function"]["arguments"]) == {"expression": "12345*6789"}
    assert tool == {"role": "tool", "tool_call_id": "call_mul", "content": "83810205"}

    assert texts(chat) == [
        ("user", "How much is twelve thousand three hundred forty-five times six thousand seven hundred eighty-nine?"),
        ("assistant", "That is 83,810,205 in total.")]
    assert run_keys(redis_client, chat.thread()["threadId"]) == []  # a tool turn keeps no run state
    assert_clean(chat, fake_llm, ["12345*6789", "83810205", "call_mul", "calculator"])


def test_resource_turn_reads_the_document_and_stores_only_the_answer(chat, fake_llm):
    contents = read_resource("resource://docs/memory")
    fake_llm.add_rule(Reply(tool_calls=[{"id": "call_doc", "name": "read_resource",
                                         "arguments": {"uri": "resource://docs/memory"}}]),
                      when=lambda b: not has_tool_results(b), times=1)
    fake_llm.add_rule(Reply(text="It keeps four recent turns and a short summary."), when=has_tool_results, times=1)
    frames = chat.turn("How does your memory work?")

    finished = frames_of(frames, "tool")[-1]
    assert finished["name"] == "read_resource" and finished["status"] == "finished"
    assert finished["result"] == contents
    assert fake_llm.last_request().messages[-1] == {"role": "tool", "tool_call_id": "call_doc", "content": contents}
    assert texts(chat) == [("user", "How does your memory work?"),
                           ("assistant", "It keeps four recent turns and a short summary.")]
    assert_clean(chat, fake_llm, ["resource://docs/memory", "folds the oldest turns into the summary",
                                  "# How this chat remembers"])


def test_several_tool_rounds_then_an_answer(chat, fake_llm):
    fake_llm.add_rule(Reply(tool_calls=[{"id": "c1", "name": "current_time", "arguments": {"timezone": "Asia/Tokyo"}},
                                        {"id": "c2", "name": "calculator", "arguments": {"expression": "2**10"}}]),
                      when=lambda b: not has_tool_results(b), times=1)
    fake_llm.add_rule(Reply(tool_calls=[{"id": "c3", "name": "calculator", "arguments": {"expression": "1024/4"}}]),
                      when=lambda b: sum(m["role"] == "tool" for m in b["messages"]) == 2, times=1)
    fake_llm.add_rule(Reply(text="Done: 256."), when=lambda b: sum(m["role"] == "tool" for m in b["messages"]) == 3)
    frames = chat.turn("Time in Tokyo, and a quarter of 2 to the 10th?")
    finished = [f for f in frames_of(frames, "tool") if f["status"] == "finished"]
    assert [(f["id"], f["name"]) for f in finished] == [("c1", "current_time"), ("c2", "calculator"),
                                                        ("c3", "calculator")]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+09:00 \([A-Z][a-z]+day, Asia/Tokyo\)",
                        finished[0]["result"])
    assert [f["result"] for f in finished[1:]] == ["1024", "256"]
    assert texts(chat) == [("user", "Time in Tokyo, and a quarter of 2 to the 10th?"), ("assistant", "Done: 256.")]
    assert len(fake_llm.chat_requests("stream")) == 3


def test_bad_tool_call_gets_an_error_result_and_the_turn_still_completes(chat, fake_llm):
    fake_llm.add_rule(Reply(tool_calls=[{"id": "x1", "name": "calculator", "arguments": {"expression": "__import__('os')"}},
                                        {"id": "x2", "name": "shell", "arguments": {"cmd": "ls"}}]),
                      when=lambda b: not has_tool_results(b), times=1)
    fake_llm.add_rule(Reply(text="I can only do arithmetic."), when=has_tool_results)
    frames = chat.turn("Run something for me")
    results = [f["result"] for f in frames_of(frames, "tool") if f["status"] == "finished"]
    assert results == ["error: only numbers, + - * / // % ** and parentheses are allowed",
                       "error: there is no tool named 'shell'"]
    assert texts(chat) == [("user", "Run something for me"), ("assistant", "I can only do arithmetic.")]


def test_provider_rejecting_tools_gets_plain_chat_and_the_page_says_tools_are_off(live_app, chat, fake_llm):
    fake_llm.add_rule(Reply(status=400, error_message="tools are not supported by this server"),
                      when=lambda b: "tools" in b)
    fake_llm.default = Reply(text="Plain answer.")
    assert "tools are off for this provider" not in chat.http.get(live_app.url + "/").text

    frames = chat.turn("first")
    assert frames[-1]["status"] == "completed" and answer_text(frames) == "Plain answer."
    assert [("tools" in r.body) for r in fake_llm.chat_requests()] == [True, False]
    frames = chat.turn("second")
    assert frames[-1]["status"] == "completed"
    assert [("tools" in r.body) for r in fake_llm.chat_requests()] == [True, False, False]  # remembered
    assert texts(chat) == [("user", "first"), ("assistant", "Plain answer."),
                           ("user", "second"), ("assistant", "Plain answer.")]
    page = chat.http.get(live_app.url + "/").text
    assert 'data-testid="tools-off"' in page and 'data-tools-enabled="false"' in page


def test_tools_enabled_off_sends_no_tools(make_live_app, app_settings, fake_llm):
    server = make_live_app(app_settings.with_overrides(tools_enabled=False))
    client = ChatClient(server).connect()
    try:
        fake_llm.default = Reply(text="No tools here.")
        assert client.turn("hello")[-1]["status"] == "completed"
        assert "tools" not in fake_llm.last_request().body
        assert 'data-testid="tools-off"' in client.http.get(server.url + "/").text
    finally:
        client.close()


def test_cancelled_tool_turn_stores_nothing(chat, fake_llm):
    chat.turn("keep me")  # one stored turn, to see that it stays exactly as it is
    before = chat.thread()["messages"]
    fake_llm.add_rule(Reply(tool_calls=[{"id": "k1", "name": "calculator", "arguments": {"expression": "6*7"}}]),
                      when=lambda b: not has_tool_results(b), times=1)
    fake_llm.add_rule(Reply(text="The answer is forty two and more words follow here", token_delay=0.3),
                      when=has_tool_results, times=1)
    chat.send({"type": "message", "text": "six times seven?"})
    chat.recv_until(lambda f: f["type"] == "delta")
    chat.send({"type": "cancel"})
    frames = chat.recv_until(lambda f: f["type"] == "done")
    assert frames[-1]["status"] == "cancelled"
    assert chat.thread()["messages"] == before


# ------------------------------------------------------------------------------------------ task list


def test_tasklist_final_stores_the_goal_and_the_summary(chat, fake_llm, redis_client):
    script_tasklist(fake_llm)
    frames = chat.turn("/tasklist Plan a picnic for Saturday")
    assert frames[-1]["status"] == "completed"
    assert [(f["stage"], f["message"]) for f in frames_of(frames, "progress")] == [
        ("plan", "Planning the task list"), ("plan", "2 tasks planned"),
        ("task 1/2", PLAN_ITEMS[0]), ("task 2/2", PLAN_ITEMS[1]), ("summary", "Writing the final answer")]
    assert answer_text(frames) == "Your picnic is planned."
    assert texts(chat) == [("user", "Plan a picnic for Saturday"), ("assistant", "Your picnic is planned.")]

    thread_id = chat.thread()["threadId"]
    run = only_run(redis_client, thread_id)
    assert (run.kind, run.status, run.goal) == ("tasklist", "final", "Plan a picnic for Saturday")
    assert [t["title"] for t in run.state["tasks"]] == PLAN_ITEMS
    assert [r["output"] for r in run.state["results"]] == ["OUTPUT-1 finished", "OUTPUT-2 finished"]
    assert "- [x] 1. Pick the park PLANITEM-ALPHA" in run.artifact
    assert [c["step"] for c in run.checkpoints] == ["plan", "task:0", "task:1", "final"]
    key = ThreadKeys(thread_id).run(run.id)
    assert 0 < redis_client.ttl(key) <= RUN_TTL_SECONDS < redis_client.ttl(ThreadKeys(thread_id).state)
    # the memory hash knows nothing of the run
    assert not any("PLANITEM" in v or "OUTPUT-" in v for v in redis_client.hgetall(ThreadKeys(thread_id).state).values())
    # the work prompt of task 2 carried task 1's output (in the run, not in memory)
    task2 = matching(fake_llm, worker_for(2))[0]
    assert "OUTPUT-1 finished" in last_user(task2.body)
    assert_clean(chat, fake_llm, ["PLANITEM", "OUTPUT-1", "OUTPUT-2", "# Task list"])


def test_tasklist_blocked_stores_the_goal_and_the_blocked_answer(chat, fake_llm, redis_client):
    script_tasklist(fake_llm, second="blocked")
    frames = chat.turn("/tasklist Plan a picnic for Saturday")
    assert frames[-1]["status"] == "blocked"
    assert answer_text(frames) == "I could not finish: the budget is missing."
    assert texts(chat) == [("user", "Plan a picnic for Saturday"),
                           ("assistant", "I could not finish: the budget is missing.")]
    run = only_run(redis_client, chat.thread()["threadId"])
    assert (run.status, run.state["blockedAt"], run.state["next"]) == ("blocked", 1, 1)
    assert "- [!] 2. List the food PLANITEM-BRAVO" in run.artifact
    assert_clean(chat, fake_llm, ["PLANITEM", "OUTPUT-2: no budget was given"])


def test_tasklist_paused_for_a_task_then_resumed(chat, fake_llm, redis_client):
    fake_llm.default = Reply(text="Earlier answer.")
    chat.turn("earlier question")
    before = chat.thread()
    script_tasklist(fake_llm, confirm=(1,))
    frames = chat.turn("/tasklist Plan a picnic for Saturday", message_id="goal-msg")
    assert frames[-1]["status"] == "paused"
    paused_text = answer_text(frames)
    assert "Task 2 needs your confirmation" in paused_text and "- [ ] 2. List the food PLANITEM-BRAVO" in paused_text
    assert chat.thread() == before  # nothing written
    thread_id = before["threadId"]
    run = only_run(redis_client, thread_id)
    assert (run.status, run.state["next"], run.state["awaiting"]) == ("paused", 1, {"kind": "task", "index": 1})
    assert redis_client.get(ThreadKeys(thread_id).paused_run) == run.id
    assert not matching(fake_llm, worker_for(2))  # task 2 not started
    assert_clean(chat, fake_llm, ["PLANITEM", "OUTPUT-1", "Paused"])  # a normal turn in between
    between = chat.thread()["messages"]

    frames = chat.turn("/tasklist continue", message_id="confirm-msg")
    assert frames[-1]["status"] == "completed"
    assert [f["stage"] for f in frames_of(frames, "progress")] == ["task 2/2", "summary"]
    stored = chat.thread()["messages"]
    assert stored[:-2] == between
    assert [(m["id"], m["role"], m["text"]) for m in stored[-2:]] == [
        ("confirm-msg", "user", "Plan a picnic for Saturday"),
        (frames[0]["messageId"], "assistant", "Your picnic is planned.")]
    assert redis_client.get(ThreadKeys(thread_id).paused_run) is None
    assert only_run(redis_client, thread_id).status == "final"
    assert len(matching(fake_llm, worker_for(1))) == 1  # task 1 was not done twice

    # nothing left to continue
    chat.send({"type": "message", "text": "/tasklist continue"})
    error = chat.recv_until(lambda f: f["type"] in ("error", "done"))[-1]
    assert error == {"type": "error", "code": "nothing_to_resume",
                     "message": "There is no paused task list to continue."}
    assert chat.thread()["messages"] == stored


def test_long_plan_pauses_before_starting_and_a_bare_yes_resumes(chat, fake_llm, redis_client):
    items = [f"Step PLANITEM-{n}" for n in range(1, 5)]
    script_tasklist(fake_llm, items=items, summary="All four steps are done.")
    frames = chat.turn("/tasklist Move the blog to a new host")
    assert frames[-1]["status"] == "paused"
    assert "The plan has 4 tasks. Shall I start?" in answer_text(frames)
    assert not matching(fake_llm, worker_for(1))
    assert chat.thread()["messages"] == []

    frames = chat.turn("Yes!")
    assert frames[-1]["status"] == "completed"
    assert [f["stage"] for f in frames_of(frames, "progress")] == [
        "task 1/4", "task 2/4", "task 3/4", "task 4/4", "summary"]
    assert texts(chat) == [("user", "Move the blog to a new host"), ("assistant", "All four steps are done.")]
    # a "yes" with nothing waiting is plain chat
    fake_llm.default = Reply(text="Yes to what?")
    assert chat.turn("yes")[-1]["status"] == "completed"
    assert texts(chat)[-2:] == [("user", "yes"), ("assistant", "Yes to what?")]


def test_tasklist_cancel_command_drops_the_waiting_run(chat, fake_llm, redis_client):
    script_tasklist(fake_llm, confirm=(0,))
    assert chat.turn("/tasklist Plan a picnic for Saturday")[-1]["status"] == "paused"
    frames = chat.turn("/tasklist cancel")
    assert frames[-1]["status"] == "cancelled"
    assert answer_text(frames) == "Dropped the paused task list."
    assert only_run(redis_client, chat.thread()["threadId"]).status == "cancelled"
    assert chat.thread()["messages"] == []
    chat.send({"type": "message", "text": "/tasklist continue"})
    assert chat.recv_until(lambda f: f["type"] == "error")[-1]["code"] == "nothing_to_resume"


def test_tasklist_without_a_goal_is_refused(chat, fake_llm):
    chat.send({"type": "message", "text": "/tasklist   "})
    assert chat.recv_until(lambda f: f["type"] == "error")[-1] == {
        "type": "error", "code": "empty_input", "message": "Give it a goal: /tasklist <goal>"}
    assert fake_llm.chat_requests() == []


def test_cancelled_tasklist_run_stores_nothing(chat, fake_llm, redis_client):
    fake_llm.add_rule(Reply(json={"tasks": [{"title": t, "needsConfirmation": False} for t in PLAN_ITEMS]}),
                      when=planner)
    fake_llm.add_rule(Reply(json={"status": "done", "output": "slow"}, delay=1.0), when=worker_for(1))
    chat.send({"type": "message", "text": "/tasklist Plan a picnic for Saturday"})
    chat.recv_until(lambda f: f["type"] == "progress" and f["stage"] == "task 1/2")
    chat.send({"type": "cancel"})
    frames = chat.recv_until(lambda f: f["type"] == "done")
    assert frames[-1]["status"] == "cancelled"
    thread_id = chat.thread()["threadId"]
    wait_for(lambda: only_run(redis_client, thread_id).status == "cancelled", timeout=5, message="run cancelled")
    assert not matching(fake_llm, worker_for(2))  # it stopped
    assert chat.thread()["messages"] == []


def test_structured_calls_fall_back_to_json_object_when_json_schema_is_refused(chat, fake_llm):
    fake_llm.reject_json_schema = True
    script_tasklist(fake_llm)
    frames = chat.turn("/tasklist Plan a picnic for Saturday")
    assert frames[-1]["status"] == "completed"
    kinds = [r.response_format["type"] for r in fake_llm.chat_requests("structured")]
    assert kinds == ["json_schema", "json_object", "json_object", "json_object"]  # the refusal is remembered
    assert texts(chat) == [("user", "Plan a picnic for Saturday"), ("assistant", "Your picnic is planned.")]


def test_invalid_plan_is_asked_once_more_then_fails_without_writing(chat, fake_llm):
    fake_llm.add_rule(Reply(json={"tasks": []}), when=planner)
    frames = chat.turn("/tasklist Plan a picnic for Saturday")
    assert frames[-2] == {"type": "error", "code": "llm_unavailable",
                          "message": "The model's answer could not be used. Please try again."}
    assert frames[-1]["status"] == "failed"
    assert len(matching(fake_llm, planner)) == 2
    assert "tasks must be a non-empty list" in last_user(matching(fake_llm, planner)[1].body)
    assert chat.thread()["messages"] == []


# ------------------------------------------------------------------------------------------ delivery


def script_delivery(fake_llm, *, verdict="approved", report="# Delivery Report\n\nThe landing page is live."):
    fake_llm.add_rule(Reply(text="PLANTEXT: outline, write, publish"), when=stage("planning stage"))
    fake_llm.add_rule(Reply(text="BUILDTEXT: the page was written"), when=stage("build stage"))
    fake_llm.add_rule(Reply(json={"verdict": verdict, "report": report}), when=stage("review stage"))


def test_delivery_completed_stores_the_goal_and_the_report(chat, fake_llm, redis_client):
    script_delivery(fake_llm)
    frames = chat.turn("/delivery Build a landing page")
    assert [(f["stage"], f["message"]) for f in frames_of(frames, "progress")] == [
        ("plan", "Planning"), ("build", "Building"), ("review", "Reviewing")]
    assert frames[-1]["status"] == "completed"
    assert answer_text(frames) == "# Delivery Report\n\nThe landing page is live."
    assert texts(chat) == [("user", "Build a landing page"),
                           ("assistant", "# Delivery Report\n\nThe landing page is live.")]
    run = only_run(redis_client, chat.thread()["threadId"])
    assert (run.kind, run.status) == ("delivery", "completed")
    assert run.state["plan"].startswith("PLANTEXT") and run.state["build"].startswith("BUILDTEXT")
    assert [c["step"] for c in run.checkpoints] == ["plan", "build", "review", "report"]
    review = matching(fake_llm, stage("review stage"))[0]
    assert "BUILDTEXT: the page was written" in last_user(review.body)
    assert_clean(chat, fake_llm, ["PLANTEXT", "BUILDTEXT"])


def test_delivery_blocked_with_a_long_report_is_truncated_in_memory(chat, fake_llm):
    report = "# Delivery Report\n" + "A" * 8200
    script_delivery(fake_llm, verdict="blocked", report=report)
    frames = chat.turn("/delivery Build a landing page")
    assert frames[-1]["status"] == "blocked"
    assert answer_text(frames) == report  # the person saw all of it
    (user, assistant) = chat.thread()["messages"]
    assert user["text"] == "Build a landing page"
    assert len(assistant["text"]) == 8000
    assert assistant["text"].startswith("# Delivery Report\n")
    assert assistant["text"].endswith(TRUNCATION_NOTICE)
    assert assistant["text"] == report[: 8000 - len(TRUNCATION_NOTICE)] + TRUNCATION_NOTICE
    assert_clean(chat, fake_llm, ["PLANTEXT", "BUILDTEXT"])


def test_delivery_failed_writes_nothing(chat, fake_llm, redis_client):
    fake_llm.default = Reply(text="Earlier answer.")
    chat.turn("earlier question")
    before = chat.thread()
    fake_llm.add_rule(Reply(text="PLANTEXT"), when=stage("planning stage"))
    fake_llm.add_rule(Reply(status=400), when=stage("build stage"))
    frames = chat.turn("/delivery Build a landing page")
    assert [f["stage"] for f in frames_of(frames, "progress")] == ["plan", "build"]
    assert frames[-2] == {"type": "error", "code": "llm_unavailable", "message": "The model provider refused the request."}
    assert frames[-1]["status"] == "failed"
    assert chat.thread() == before
    run = only_run(redis_client, before["threadId"])
    assert run.status == "failed" and run.checkpoints[-1]["step"] == "build"


def test_cancelled_delivery_writes_nothing(chat, fake_llm, redis_client):
    fake_llm.add_rule(Reply(text="PLANTEXT"), when=stage("planning stage"))
    fake_llm.add_rule(Reply(text="BUILDTEXT", delay=1.0), when=stage("build stage"))
    fake_llm.add_rule(Reply(json={"verdict": "approved", "report": "# Delivery Report\nok"}), when=stage("review stage"))
    chat.send({"type": "message", "text": "/delivery Build a landing page"})
    chat.recv_until(lambda f: f["type"] == "progress" and f["stage"] == "build")
    chat.send({"type": "cancel"})
    assert chat.recv_until(lambda f: f["type"] == "done")[-1]["status"] == "cancelled"
    thread_id = chat.thread()["threadId"]
    wait_for(lambda: only_run(redis_client, thread_id).status == "cancelled", timeout=5, message="run cancelled")
    assert not matching(fake_llm, stage("review stage"))
    assert chat.thread()["messages"] == []


# ------------------------------------------------------------------------------------------ written once


def test_run_and_turn_runner_both_writing_store_the_turn_once(chat, fake_llm, redis_client, live_app):
    services = live_app.app.extensions["chat"]
    script_delivery(fake_llm)
    frames = chat.turn("/delivery Build a landing page", message_id="deliver-1")
    thread_id = chat.thread()["threadId"]
    run = only_run(redis_client, thread_id)
    assert run.final["userId"] == "deliver-1" and run.final["assistantId"] == frames[0]["messageId"]
    # the workflow's own observer writes the same completion again: nothing is added
    again = commit_recorded_final(services, thread_id, run.id)
    assert again.appended is False and again.message_count == 2
    assert texts(chat) == [("user", "Build a landing page"),
                           ("assistant", "# Delivery Report\n\nThe landing page is live.")]


def test_agent_writing_before_the_turn_runner_is_deduplicated(chat, fake_llm, live_app, monkeypatch):
    """The task-list agent commits its own completion first; the turn runner's commit then adds nothing."""
    services = live_app.app.extensions["chat"]
    original = RunStore.finish

    def finish_and_write(self, run, **final):
        original(self, run, **final)  # the run records its final turn, then the agent writes it at once
        if run.kind == "tasklist":
            first = commit_recorded_final(services, self.keys.thread_id, run.id)
            assert first.appended is True

    monkeypatch.setattr(RunStore, "finish", finish_and_write)
    script_tasklist(fake_llm)
    frames = chat.turn("/tasklist Plan a picnic for Saturday", message_id="goal-1")
    assert frames[-1]["status"] == "completed"
    stored = chat.thread()["messages"]
    assert [(m["id"], m["text"]) for m in stored] == [("goal-1", "Plan a picnic for Saturday"),
                                                      (frames[0]["messageId"], "Your picnic is planned.")]


# ------------------------------------------------------------------------------------------ compaction


def test_compaction_keeps_recent_runtime_answers_verbatim(chat, fake_llm, live_app, redis_client):
    from app.compaction.service import run_compaction, run_refinement
    from app.store.keys import ThreadKeys
    from tests.fixtures.celery_worker import asked, assistant_text, record, user_text

    services = live_app.app.extensions["chat"]
    thread_id = chat.thread()["threadId"]
    fake_llm.default = lambda body: Reply(text=assistant_text(1 if "one" in last_user(body) else 2))
    for n in (1, 2):
        assert chat.turn(user_text(n))[-1]["status"] == "completed"
    # a tool answer, a resource answer, a task-list answer and a delivery report
    fake_llm.add_rule(Reply(tool_calls=[{"id": "t1", "name": "calculator", "arguments": {"expression": "12345*6789"}}]),
                      when=lambda b: last_user(b) == "multiply" and not has_tool_results(b), times=1)
    fake_llm.add_rule(Reply(text="It is 83,810,205."), when=lambda b: last_user(b) == "multiply", times=1)
    assert chat.turn("multiply")[-1]["status"] == "completed"
    fake_llm.add_rule(Reply(tool_calls=[{"id": "t2", "name": "read_resource",
                                         "arguments": {"uri": "resource://docs/commands"}}]),
                      when=lambda b: last_user(b) == "commands?" and not has_tool_results(b), times=1)
    fake_llm.add_rule(Reply(text="There are two commands."), when=lambda b: last_user(b) == "commands?", times=1)
    assert chat.turn("commands?")[-1]["status"] == "completed"
    script_tasklist(fake_llm)
    assert chat.turn("/tasklist Plan a picnic for Saturday")[-1]["status"] == "completed"
    script_delivery(fake_llm, verdict="blocked", report="# Delivery Report\n" + "B" * 8200)
    assert chat.turn("/delivery Build a landing page")[-1]["status"] == "blocked"

    before = services.store.load(thread_id)
    assert len(before.messages) == 12
    recent = [m.to_dict() for m in before.messages[-8:]]
    fake_llm.add_rule(Reply(json={"summary": "They chatted about the numbers one and two.", "pinnedDecisions": []}),
                      model="fake-compact")
    sent = []
    outcome = run_compaction(services, thread_id, before.version, send_refine=lambda *args: sent.append(args))
    assert outcome.outcome == "applied", outcome
    redis_client.delete(ThreadKeys(thread_id).active)  # quiet: the model's part runs now
    assert run_refinement(services, thread_id, sent[0][1]).outcome == "applied"

    hydrated = chat.thread()
    assert hydrated["messages"] == recent  # verbatim: ids, texts, lengths and timestamps unchanged
    assert [len(m["text"]) for m in hydrated["messages"]] == [len(m["text"]) for m in recent]
    assert all(set(m) == {"id", "role", "text", "createdAt"} for m in hydrated["messages"])
    assert [m["text"] for m in hydrated["messages"][1::2]] == [
        "It is 83,810,205.", "There are two commands.", "Your picnic is planned.",
        ("# Delivery Report\n" + "B" * 8200)[: 8000 - len(TRUNCATION_NOTICE)] + TRUNCATION_NOTICE]
    after = services.store.load(thread_id)
    assert after.summary == record(1, 2, asked(1), asked(2), "- About: They chatted about the numbers one and two.")
    assert find_forbidden_key(hydrated) is None
    compaction_prompt = json.dumps(fake_llm.last_request(lambda r: r.model == "fake-compact").messages)
    for needle in ["12345*6789", "PLANITEM", "OUTPUT-1", "PLANTEXT", "BUILDTEXT", "resource://docs/commands"]:
        assert needle not in compaction_prompt
        assert needle not in after.summary
    assert_clean(chat, fake_llm, ["12345*6789", "PLANITEM", "OUTPUT-1", "PLANTEXT", "BUILDTEXT"],
                 summary=after.summary)


@pytest.mark.parametrize("status", ["completed", "blocked"])
def test_delivery_report_statuses_map_to_done(chat, fake_llm, status):
    script_delivery(fake_llm, verdict="approved" if status == "completed" else "blocked")
    assert chat.turn("/delivery Build a landing page")[-1]["status"] == status


def test_a_paused_run_belongs_to_its_session_only(live_app, chat, fake_llm, redis_client):
    script_tasklist(fake_llm, confirm=(0,))
    assert chat.turn("/tasklist Plan a picnic for Saturday")[-1]["status"] == "paused"
    other = ChatClient(live_app).connect()  # another browser: another session, another thread
    try:
        other.send({"type": "message", "text": "/tasklist continue"})
        assert other.recv_until(lambda f: f["type"] == "error")[-1]["code"] == "nothing_to_resume"
        fake_llm.default = Reply(text="Yes to what?")
        assert other.turn("yes")[-1]["status"] == "completed"  # plain chat there
        assert texts(other) == [("user", "yes"), ("assistant", "Yes to what?")]
    finally:
        other.close()
    assert only_run(redis_client, chat.thread()["threadId"]).status == "paused"
    assert chat.turn("yes")[-1]["status"] == "completed"
    assert texts(chat) == [("user", "Plan a picnic for Saturday"), ("assistant", "Your picnic is planned.")]


def test_a_new_task_list_replaces_the_waiting_one(chat, fake_llm, redis_client):
    script_tasklist(fake_llm, confirm=(0,))
    assert chat.turn("/tasklist Plan a picnic for Saturday")[-1]["status"] == "paused"
    thread_id = chat.thread()["threadId"]
    first = only_run(redis_client, thread_id)
    assert chat.turn("/tasklist Plan a barbecue")[-1]["status"] == "paused"
    runs = [RunStore(redis_client, thread_id).load(k.rsplit(":", 1)[1]) for k in run_keys(redis_client, thread_id)]
    assert sorted((r.goal, r.status) for r in runs) == [("Plan a barbecue", "paused"),
                                                        ("Plan a picnic for Saturday", "cancelled")]
    assert redis_client.get(ThreadKeys(thread_id).paused_run) != first.id
    assert chat.turn("/tasklist continue")[-1]["status"] == "completed"
    assert texts(chat) == [("user", "Plan a barbecue"), ("assistant", "Your picnic is planned.")]


def test_tool_results_are_cut_to_the_room_left_in_the_context(make_live_app, app_settings, fake_llm):
    from app.runtime.budget import TRUNCATED

    # 550 tokens of prompt budget: system prompt (~110) + tool definitions (~240) leave too little for the document
    server = make_live_app(app_settings.with_overrides(model_context_tokens=650, reserved_output_tokens=100))
    client = ChatClient(server).connect()
    try:
        fake_llm.add_rule(Reply(tool_calls=[{"id": "r1", "name": "read_resource",
                                             "arguments": {"uri": "resource://docs/commands"}}]),
                          when=lambda b: not has_tool_results(b), times=1)
        fake_llm.add_rule(Reply(text="Two commands."), when=has_tool_results, times=1)
        frames = client.turn("commands?")
        result = [f for f in frames_of(frames, "tool") if f["status"] == "finished"][0]["result"]
        full = read_resource("resource://docs/commands")
        assert result.endswith(TRUNCATED) and full.startswith(result[: -len(TRUNCATED)])
        assert len(result) < len(full)
        assert fake_llm.last_request().messages[-1]["content"] == result
        assert texts(client) == [("user", "commands?"), ("assistant", "Two commands.")]
    finally:
        client.close()


def test_no_tools_when_their_definitions_do_not_fit(make_live_app, app_settings, fake_llm):
    server = make_live_app(app_settings.with_overrides(model_context_tokens=300, reserved_output_tokens=100))
    client = ChatClient(server).connect()
    try:
        fake_llm.default = Reply(text="Short answer.")
        assert client.turn("hello")[-1]["status"] == "completed"
        assert "tools" not in fake_llm.last_request().body
        assert texts(client) == [("user", "hello"), ("assistant", "Short answer.")]
    finally:
        client.close()
