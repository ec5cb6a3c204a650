"""The prompt warm-up after a compaction (docs/contract.md: ``PROMPT_WARMUP``; docs/bundled-model.md).

The real app served on loopback, a real Celery worker, the test Redis and the fake LLM over HTTP (its request
log is what the chat server received).  Two sessions chat; one session's thread folds; the web process that
holds that socket sends the chat model the thread's new prompt prefix, and the session's next turn starts with
exactly that prefix; the fold that turn asks for is warmed again, once.
"""

from __future__ import annotations

from app.chat.connection import CompactionWarmup
from app.llm.warmup import PromptWarmup
from app.memory.context import RECORD_HEADER
from app.settings import MemoryLimits, Settings
from chat_support.fake_llm import Reply
from chat_support.live_app import ChatClient

WORD_A, WORD_B = "MARZIPANTO", "QUILBERRY"


def is_warmup(request) -> bool:
    return request.is_chat and not request.stream and request.body.get("max_tokens") == 1


def answer(body: dict) -> Reply:
    asked = body["messages"][-1]["content"]
    return Reply(text=f"Answer about {asked} " + "Here is some more detail about it, with a few more words. " * 4)


def test_after_a_compaction_the_socket_warms_its_own_new_prompt_prefix(make_compaction_rig, make_live_app, fake_llm):
    rig = make_compaction_rig(compaction_strategy="extractive", limits=MemoryLimits(recent_turns=1),
                              prompt_warmup="on")  # a fold after every turn past the first; no refinement
    rig.worker()
    live = make_live_app(rig.settings)
    fake_llm.default = answer
    other = ChatClient(live).connect()
    mine = ChatClient(live).connect()

    def folded() -> list[dict]:
        """The fold's frame the socket hears after a turn's done (the fold is asked for once the done is sent)."""
        return [f for f in mine.recv_until(lambda f: f["type"] == "memory", timeout=30)
                if f["type"] == "memory"]

    try:
        assert other.turn(f"My code word is {WORD_B}, noted on 2026-12-01.")[-1]["status"] == "completed"
        assert mine.turn(f"My code word is {WORD_A}, noted on 2026-12-02.")[-1]["status"] == "completed"
        assert mine.turn("The venue is Hall 7 in Lyon.")[-1]["status"] == "completed"  # turn 1 is due
        assert [(f["status"], f["step"]) for f in folded()] == [("succeeded", "fold")]
        [warm] = fake_llm.wait_for_requests(1, kind=is_warmup, timeout=10)
        thread_id = mine.thread()["threadId"]
        state = rig.store.load(thread_id)
        assert state.summary and WORD_A in state.summary  # the first turn was folded into the record
        sent = warm.messages
        assert [m["role"] for m in sent] == ["system", "system", "user", "assistant"]
        assert sent[0]["content"] == rig.settings.system_prompt
        assert sent[1]["content"].startswith(RECORD_HEADER) and WORD_A in sent[1]["content"]
        assert [m["content"] for m in sent[2:]] == [m.text for m in state.messages[-2:]]
        assert all(WORD_B not in m["content"] for m in sent)  # the session's own prompt only
        assert warm.body["model"] == rig.settings.chat_model

        assert mine.turn("What is my code word?")[-1]["status"] == "completed"
        turn = fake_llm.last_request("stream")
        assert turn.messages[:len(sent)] == sent  # the next turn starts with the warmed prefix
        assert turn.messages[-1] == {"role": "user", "content": "What is my code word?"}
        # That turn made the venue's turn due: its fold is warmed too, once, after the turn
        assert [(f["status"], f["step"]) for f in folded()] == [("succeeded", "fold")]
        first, second = fake_llm.wait_for_requests(2, kind=is_warmup, timeout=10)
        assert first is warm and second.time >= turn.end_time
        state = rig.store.load(thread_id)
        assert [m.text for m in state.messages][0] == "What is my code word?" and len(state.messages) == 2
        assert second.messages[1]["content"].startswith(RECORD_HEADER) and state.summary in second.messages[1]["content"]
        assert "Hall 7" in state.summary
        assert [m["content"] for m in second.messages[2:]] == [m.text for m in state.messages]
    finally:
        mine.close()
        other.close()


def test_with_a_fold_step_the_warmed_prefix_shows_the_folded_turn_verbatim_and_the_next_turn_starts_with_it(
        make_compaction_rig, make_live_app, fake_llm):
    rig = make_compaction_rig(compaction_strategy="extractive", limits=MemoryLimits(recent_turns=1),
                              prompt_warmup="on", prompt_fold_step=4)
    rig.worker()
    live = make_live_app(rig.settings)
    fake_llm.default = answer
    mine = ChatClient(live).connect()
    try:
        assert mine.turn(f"My code word is {WORD_A}, noted on 2026-12-02.")[-1]["status"] == "completed"
        assert mine.turn("The venue is Hall 7 in Lyon.")[-1]["status"] == "completed"  # turn 1 is due
        mine.recv_until(lambda f: f["type"] == "memory", timeout=30)
        [warm] = fake_llm.wait_for_requests(1, kind=is_warmup, timeout=10)
        state = rig.store.load(mine.thread()["threadId"])
        assert state.record.last_turn == 1 and WORD_A in state.summary  # memory folded turn 1 ...
        sent = warm.messages  # ... the prompt shows it verbatim (before the 4th fold), no record message
        assert [m["role"] for m in sent] == ["system", "user", "assistant", "user", "assistant"]
        assert sent[1]["content"] == f"My code word is {WORD_A}, noted on 2026-12-02."
        assert mine.turn("What is my code word?")[-1]["status"] == "completed"
        turn = fake_llm.last_request("stream")
        assert turn.messages[:len(sent)] == sent
        assert turn.messages[len(sent):] == [{"role": "user", "content": "What is my code word?"}]
    finally:
        mine.close()


def test_no_warmup_while_a_turn_is_in_flight_nor_for_a_remote_provider(settings, fake_llm, store):
    from tests.fixtures.celery_worker import seed_turns, thread_id_for

    assert (Settings(prompt_warmup="auto", bundled_model=True).warms_prompts,
            Settings(prompt_warmup="auto").warms_prompts, Settings(prompt_warmup="on").warms_prompts,
            Settings(prompt_warmup="off", bundled_model=True).warms_prompts) == (True, False, True, False)
    assert Settings.from_env({"PROMPT_WARMUP": " Off "}).prompt_warmup == "off"
    warm_settings = settings.with_overrides(openai_base_url=fake_llm.url, prompt_warmup="on")
    from app.extensions import Services

    services = Services(warm_settings)
    tid = thread_id_for("warmup busy")
    seed_turns(services.store, tid, 2)
    busy = CompactionWarmup(services, tid, PromptWarmup(warm_settings), lambda: True)
    assert busy.run() is False
    assert fake_llm.chat_requests() == []
    idle = CompactionWarmup(services, tid, PromptWarmup(warm_settings), lambda: False)
    assert idle.run() is True
    [warm] = fake_llm.chat_requests()
    assert is_warmup(warm) and [m["role"] for m in warm.messages] == ["system", "user", "assistant", "user",
                                                                      "assistant"]
    remote = CompactionWarmup(Services(warm_settings.with_overrides(prompt_warmup="auto")), tid,
                              PromptWarmup(warm_settings), lambda: False)
    remote({"type": "memory", "status": "succeeded"})
    assert remote.thread is None  # auto with a remote provider: nothing started
