"""Final turns: only what the person was finally told enters memory.

Real app on loopback, real Redis, the fake model over real HTTP.  The store's
``commit_final_turn`` is wrapped (and still called) to see which final turns reach it.
"""

from __future__ import annotations

import json
import threading

from app.store.keys import ThreadKeys
from chat_support.fake_llm import Reply
from chat_support.live_app import ChatClient, answer_text
from tests.fixtures.runs import commit_recorded_final
from tests.helpers.tool_scripts import has_tool_results, matching, only_run, script_tasklist, texts, worker_for


def record_commits(monkeypatch, live_app) -> list:
    """Record every ``FinalTurn`` the app's store is asked to write (the real store still writes it)."""
    store = live_app.app.extensions["chat"].store
    seen = []
    original = store.commit_final_turn

    def recording(thread_id, turn, **options):
        seen.append(turn)
        return original(thread_id, turn, **options)

    monkeypatch.setattr(store, "commit_final_turn", recording)
    return seen


def test_p19_tool_turn_stores_exactly_the_question_and_the_answer(chat, fake_llm, live_app, redis_client,
                                                                  monkeypatch):
    commits = record_commits(monkeypatch, live_app)
    fake_llm.add_rule(Reply(tool_calls=[{"id": "call_p19", "name": "calculator", "arguments": {"expression": "1+1"}}]),
                      when=lambda b: not has_tool_results(b), times=1)
    fake_llm.add_rule(Reply(text="1+1 is 2"), when=has_tool_results, times=1)

    frames = chat.turn("1+1=?")

    tool_frames = [f for f in frames if f["type"] == "tool"]
    assert [(f["status"], f.get("result")) for f in tool_frames] == [("started", None), ("finished", "2")]
    assert frames[-1]["status"] == "completed"
    assert texts(chat) == [("user", "1+1=?"), ("assistant", "1+1 is 2")]
    assert all(set(m) == {"id", "role", "text", "createdAt"} for m in chat.thread()["messages"])
    # written once, as a tool answer
    assert [(t.user_text, t.assistant_text, t.status, t.source) for t in commits] == [
        ("1+1=?", "1+1 is 2", "completed", "tool")]
    # nothing of the tool call anywhere in the stored hash
    raw = json.dumps(redis_client.hgetall(ThreadKeys(chat.thread()["threadId"]).state))
    for needle in ("call_p19", "calculator", "expression", "tool_calls", '"tool"'):
        assert needle not in raw


def test_p19_resource_turn_is_written_with_source_mcp_resource(chat, fake_llm, live_app, monkeypatch):
    commits = record_commits(monkeypatch, live_app)
    fake_llm.add_rule(Reply(tool_calls=[{"name": "read_resource", "arguments": {"uri": "resource://docs/tools"}}]),
                      when=lambda b: not has_tool_results(b), times=1)
    fake_llm.add_rule(Reply(text="There are three tools."), when=has_tool_results, times=1)
    assert chat.turn("Which tools do you have?")[-1]["status"] == "completed"
    assert [(t.user_text, t.assistant_text, t.source) for t in commits] == [
        ("Which tools do you have?", "There are three tools.", "mcp-resource")]
    assert texts(chat) == [("user", "Which tools do you have?"), ("assistant", "There are three tools.")]


def test_p20_paused_run_stores_nothing_and_resumed_stores_goal_and_summary_once(chat, fake_llm, live_app,
                                                                                redis_client, monkeypatch):
    commits = record_commits(monkeypatch, live_app)
    thread_id = chat.thread()["threadId"]
    state_key = ThreadKeys(thread_id).state
    script_tasklist(fake_llm, confirm=(1,), summary="The picnic plan is ready.")

    frames = chat.turn("/tasklist Plan a picnic for Saturday")
    assert frames[-1] == {"type": "done", "status": "paused", "messageId": frames[0]["messageId"]}
    assert "Paused — waiting for your confirmation" in answer_text(frames)
    assert commits == []
    assert redis_client.exists(state_key) == 0  # not even an empty hash was written
    assert chat.thread() == {"threadId": thread_id, "messages": [], "pinnedDecisions": [], "restored": False}

    frames = chat.turn("/tasklist continue")
    assert frames[-1]["status"] == "completed"
    assert texts(chat) == [("user", "Plan a picnic for Saturday"), ("assistant", "The picnic plan is ready.")]
    assert [(t.user_text, t.assistant_text, t.status, t.source) for t in commits] == [
        ("Plan a picnic for Saturday", "The picnic plan is ready.", "final", "tasklist-agent")]
    # the run's own record of the completion, written again, adds nothing
    run = only_run(redis_client, thread_id)
    assert commit_recorded_final(live_app.app.extensions["chat"], thread_id, run.id).appended is False
    assert texts(chat) == [("user", "Plan a picnic for Saturday"), ("assistant", "The picnic plan is ready.")]


def test_p20_two_tabs_confirming_at_once_resume_the_run_once(live_app, fake_llm, redis_client):
    first = ChatClient(live_app).connect()
    second = ChatClient(live_app, session=first.http).connect()  # the same session, another tab
    try:
        # task 2 takes a moment, so both confirmations arrive while the run is being resumed
        fake_llm.add_rule(Reply(json={"status": "done", "output": "OUTPUT-2 finished"}, delay=0.5), when=worker_for(2))
        script_tasklist(fake_llm, confirm=(1,), summary="The picnic plan is ready.")
        assert first.turn("/tasklist Plan a picnic for Saturday")[-1]["status"] == "paused"

        results = {}

        def confirm(name, client):
            client.send({"type": "message", "text": "/tasklist continue"})
            results[name] = client.recv_until(
                lambda f: f["type"] == "done" or (f["type"] == "error" and f["code"] == "nothing_to_resume"),
                timeout=15)

        threads = [threading.Thread(target=confirm, args=(n, c)) for n, c in (("a", first), ("b", second))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
        endings = sorted(r[-1].get("status") or r[-1].get("code") for r in results.values())
        # one tab runs the rest of the list; the other is told there is nothing (left) to continue
        assert endings == ["completed", "nothing_to_resume"]
        assert len(matching(fake_llm, worker_for(2))) == 1
        assert texts(first) == [("user", "Plan a picnic for Saturday"), ("assistant", "The picnic plan is ready.")]
    finally:
        first.close()
        second.close()
