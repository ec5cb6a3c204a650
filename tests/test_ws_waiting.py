"""A turn that waits behind a busy bundled model says so (docs/contract.md: WebSocket, the ``waiting`` frame).

The bundled model's server answers one request at a time, so while another turn of the same web process
streams from it, a new turn gets ``{"type":"waiting","for":"model_busy",...}`` right after ``start`` and
before its first delta.  With a hosted provider (many requests at once) no such frame is sent.
"""

from __future__ import annotations

from chat_support.fake_llm import Reply, split_tokens
from chat_support.live_app import ChatClient, answer_text, frame_kinds

SLOW = "This answer takes its time, one piece after another, until it ends."


def busy_then_second(server, fake_llm) -> list[dict]:
    """Client A streams a slow answer; meanwhile client B (another session) sends a turn; B's frames to done."""
    first, second = ChatClient(server).connect(), ChatClient(server).connect()
    try:
        fake_llm.default = Reply(tokens=split_tokens(SLOW), token_delay=0.1)
        first.send({"type": "message", "text": "take your time"})
        first.recv_until(lambda f: f["type"] == "delta")  # A's stream is open
        fake_llm.default = Reply(text="Quick answer.")
        frames = second.turn("and me?", timeout=30)
        rest = first.recv_until(lambda f: f["type"] == "done", timeout=30)
        assert rest[-1]["status"] == "completed"
        assert [m["text"] for m in first.thread()["messages"]] == ["take your time", SLOW]
        # once A is done, B's next turn waits for nothing
        assert frame_kinds(second.turn("again", timeout=30)) == ["start", "delta", "done"]
        return frames
    finally:
        first.close()
        second.close()


def test_a_turn_behind_a_busy_bundled_model_is_told_so_before_its_first_token(make_live_app, app_settings, fake_llm):
    server = make_live_app(app_settings.with_overrides(bundled_model=True))
    frames = busy_then_second(server, fake_llm)
    assert frame_kinds(frames) == ["start", "waiting", "delta", "done"]
    assert frames[1] == {"type": "waiting", "for": "model_busy",
                         "message": "The model is answering another message first."}
    assert answer_text(frames) == "Quick answer." and frames[-1]["status"] == "completed"


def test_with_a_hosted_provider_no_waiting_frame_is_sent(make_live_app, app_settings, fake_llm):
    server = make_live_app(app_settings.with_overrides(bundled_model=False))
    frames = busy_then_second(server, fake_llm)
    assert frame_kinds(frames) == ["start", "delta", "done"]
    assert answer_text(frames) == "Quick answer."
