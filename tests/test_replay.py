"""The replay: a long generated conversation through the real system, and the replay's parts.

The long replay uses real components only: the app served on loopback (websocket and
HTTP API), a real Celery worker consuming the compaction queue of the real Redis
(``tests/fixtures/celery_worker.py``), and the fake OpenAI-compatible model over real
HTTP answering as ``bench/replay.py``'s ``ReplayFakeModel`` does.  The same
``Replayer`` that ``bench/replay.py`` runs on LoCoMo and KdConv drives it and checks
memory through the public API; the test then also reads the thread from the store.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from app.memory import compaction as domain
from app.memory.state import ThreadMessage, ThreadState
from app.memory.tokens import counter_for
from app.settings import MemoryLimits
from bench.replay import (
    Conversation,
    Replayer,
    ReplayFakeModel,
    _clip,
    account,
    kdconv_turns,
    load_kdconv,
    load_locomo,
    locomo_turns,
)
from chat_support.live_app import LiveServer

ROOT = Path(__file__).resolve().parent.parent
TURNS = 120
NAMES = ["Marta Kowalski", "Jonas Berg", "Priya Natarajan", "Tomás Ruiz"]
CITIES = ["北京", "上海", "深圳", "成都"]


def generated_turns(count: int = TURNS) -> list[str]:
    """``count`` user turns alternating English and Chinese, each with names, numbers, dates or ids."""
    turns = []
    for n in range(1, count + 1):
        if n % 2:
            turns.append(
                f"Turn {n}: {NAMES[n % 4]} moved the review of project Falcon to March {n % 28 + 1}, 2025, and "
                f"the ticket is INC-{4800 + n}. We decided to keep the budget at ${1200 + 10 * n}. Can you keep "
                f"that in mind while we plan the next sprint together?")
        else:
            turns.append(
                f"第{n}轮：我们决定把{CITIES[n % 4]}办公室的预算调整为{3000 + 7 * n}元，负责人是王小明，"
                f"截止日期是2025年{n % 12 + 1}月{n % 28 + 1}日。请记住这个安排，下次开会的时候提醒我。")
    return turns


# ------------------------------------------------------------------------------------ the long replay


@pytest.mark.slow  # about 10 s: a long conversation through the compaction service
def test_a_long_english_and_chinese_conversation_loses_and_duplicates_no_turn(make_compaction_rig, fake_llm):
    fake_llm.default = ReplayFakeModel()
    rig = make_compaction_rig()
    settings = rig.settings
    assert settings.limits == MemoryLimits()  # recent window 4 turns, summary 2500 chars, 20 pins
    rig.worker()
    server = LiveServer(rig.app)
    turns = generated_turns()
    try:
        replayer = Replayer(server.url, fake_llm=fake_llm, summary_limit=settings.limits.summary_max_chars,
                            turn_timeout=15.0, settle_timeout=40.0, system_prompt=settings.system_prompt,
                            progress_every=1000, log=lambda _: None)
        result = replayer.run(Conversation("generated", "mixed", "", turns, len(turns)))
    finally:
        hub = server.app.extensions.get("chat_events")
        if hub is not None:
            hub.stop()
        server.stop()

    assert result.error == ""
    assert result.settled is True
    assert [t.status for t in result.turns] == ["completed"] * TURNS

    # Every sent message accounted for exactly once: 116 turns folded + the last 4 kept = 120.
    acc = result.accounting
    assert (acc.lost_turns, acc.duplicated_turns, acc.phantom, acc.altered, acc.out_of_order) == ([], [], [], [],
                                                                                                   False)
    assert (acc.expected, acc.folded, acc.kept, acc.balance) == (2 * TURNS, 2 * (TURNS - 4), 8, 0)
    summary = result.summary()
    assert summary["turnsFolded"] == TURNS - 4
    assert summary["frameTurnsFolded"] == TURNS - 4
    assert summary["compactionsFailed"] == 0
    assert summary["compactionsApplied"] == summary["memoryFrames"]["succeeded"] >= 10
    assert summary["problems"] == []

    # Every prompt within the budget, by the app's accounting and recounted from what the model received.
    budget = settings.prompt_budget
    assert result.budget == budget == 7168
    prompts = result.prompt_series()
    assert len(prompts) == TURNS
    assert max(prompts) <= budget
    assert [t.wire_tokens for t in result.turns] == [t.prompt_tokens for t in result.turns]
    # ... while a prompt with the whole history would not have fitted.
    assert result.turns[-1].full_history_tokens > budget
    # (at most half of it, even when the worker lags and the recent turns pile up towards the hard cap: 4,583
    # of 13,282 tokens in the slowest run seen)
    assert max(prompts) < result.turns[-1].full_history_tokens / 2

    # Memory bounded: the store holds exactly the last 4 turns, a summary within its limit, few pins.
    messages_seen = result.max_messages_seen
    assert messages_seen <= domain.hard_cap_messages(settings.limits) == 32
    state = rig.store.load(result.thread_id)
    sent_ids = [t.user_id for t in result.turns[-4:]]
    assert [m.id for m in state.messages if m.role == "user"] == sent_ids
    assert [m.text for m in state.messages if m.role == "user"] == turns[-4:]
    assert 0 < len(state.summary) <= settings.limits.summary_max_chars
    assert len(state.summary) == result.summary_chars()
    assert len(state.pins) <= settings.limits.pinned_max
    assert re.search(r"[\u4e00-\u9fff]", state.summary)  # the Chinese turns were folded too
    # Which lines the bounded record keeps depends on how many turns each compaction folded (worker timing);
    # what holds whatever the timing: it covers turns 1-116, every person line is that turn's own words (cut
    # only at " … "), and the newest folded turns are in it.
    record = state.record
    assert (record.first_turn, record.last_turn) == (1, TURNS - 4)
    person = [line for line in record.lines if line.kind == "person"]
    assert person and all(piece.strip(" .") in turns[line.turn - 1]
                          for line in person for piece in line.text.split(" … ")), person
    assert max(line.turn for line in person) >= TURNS - 6


# ------------------------------------------------------------------------------------ the accounting check


def _expected(turns: int) -> list[tuple[str, str, str, int]]:
    out = []
    for n in range(1, turns + 1):
        out += [(f"u{n}", "user", f"question {n}", n), (f"a{n}", "assistant", f"answer {n}", n)]
    return out


def _messages(*turns: int) -> list[dict]:
    out = []
    for n in turns:
        out += [{"id": f"u{n}", "role": "user", "text": f"question {n}"},
                {"id": f"a{n}", "role": "assistant", "text": f"answer {n}"}]
    return out


def test_accounting_passes_when_folded_and_kept_messages_cover_every_turn_once():
    acc = account(_expected(6), _messages(3, 4, 5, 6), folded_turns=2)
    assert (acc.ok, acc.expected, acc.folded, acc.kept, acc.balance) == (True, 12, 4, 8, 0)


def test_accounting_names_a_lost_turn_a_duplicated_turn_and_an_altered_message():
    lost = account(_expected(6), _messages(3, 5, 6), folded_turns=2)
    assert (lost.ok, lost.lost_turns, lost.duplicated_turns, lost.balance) == (False, [4], [], -2)

    kept_twice = account(_expected(6), _messages(3, 4, 4, 5, 6), folded_turns=2)
    assert (kept_twice.ok, kept_twice.lost_turns, kept_twice.duplicated_turns, kept_twice.balance) == \
        (False, [], [4], 2)
    assert kept_twice.out_of_order is True

    folded_and_kept = account(_expected(6), _messages(2, 3, 4, 5, 6), folded_turns=2)
    assert (folded_and_kept.ok, folded_and_kept.duplicated_turns, folded_and_kept.balance) == (False, [2], 2)

    changed = _messages(3, 4, 5, 6)
    changed[3]["text"] = "a different answer"
    altered = account(_expected(6), changed, folded_turns=2)
    assert (altered.ok, altered.altered, altered.balance) == (False, ["a4"], 0)

    phantom = account(_expected(2), _messages(1, 2) + [{"id": "x", "role": "user", "text": "?"}], folded_turns=0)
    assert (phantom.ok, phantom.phantom) == (False, ["x"])


# ------------------------------------------------------------------------------------ the fake model


def _state(turns: list[tuple[str, str]]) -> ThreadState:
    messages = []
    for i, (user, answer) in enumerate(turns, 1):
        messages += [ThreadMessage(f"u{i}", "user", user, "2025-01-01T00:00:00Z"),
                     ThreadMessage(f"a{i}", "assistant", answer, "2025-01-01T00:00:00Z")]
    return ThreadState(messages=tuple(messages))


def test_the_fake_compaction_answer_is_valid_within_limits_and_proposes_the_decisions_it_was_given():
    limits = MemoryLimits()
    counter = counter_for(None)
    fake = ReplayFakeModel()
    for cycle in range(1, 41):
        turns = [(generated_turns(cycle + 5)[cycle + k], "Got it.") for k in range(5)]
        state = _state(turns)
        plan = domain.plan_compaction(state, limits, counter, 7168,
                                      fixed_prompt_tokens=domain.fixed_prompt_tokens(limits, counter))
        assert plan.folded_turns == 1
        body = {"messages": domain.build_compaction_prompt(plan, limits, counter, 7168),
                "response_format": {"type": "json_object"}}
        answer = domain.validate_answer(fake(body).json)  # raises when over a limit or not the right shape
        assert answer.summary.startswith("They talked about 1 things, starting with: Turn" if cycle % 2 == 0
                                         else "They talked about 1 things, starting with: 第")
        assert answer.pinnedDecisions == [_clip(turns[0][0], 200)]  # every generated turn decides something
    assert fake.counts == {"chat": 0, "compaction": 40, "compaction_retry": 0}


def test_the_fake_chat_reply_echoes_the_start_of_the_message_in_its_language():
    fake = ReplayFakeModel()
    english = fake({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "one two three"}]})
    chinese = fake({"messages": [{"role": "user", "content": "我们决定把预算调整为三千元"}]})
    assert english.text == 'Got it — you said: "one two three". Tell me more.'
    assert chinese.text == "明白了。你说的是：我们决定把预算调整为三千元。能再多讲一点吗？"
    assert fake.counts["chat"] == 2


# ------------------------------------------------------------------------------------ the datasets' shapes


def _locomo_record(sample_id: str, sessions: int, per_session: int) -> dict:
    conversation = {"speaker_a": "Ann", "speaker_b": "Bo"}
    for s in (range(sessions, 0, -1)):  # keys deliberately out of order; session 10 sorts after session 2
        conversation[f"session_{s}_date_time"] = f"1:00 pm on {s} May, 2023"
        conversation[f"session_{s}"] = [
            {"speaker": "Ann" if t % 2 == 0 else "Bo", "dia_id": f"D{s}:{t + 1}", "text": f"s{s} line {t + 1}"}
            for t in range(per_session)]
    conversation["session_99_date_time"] = "a date without a session"
    conversation["session_1"][1]["blip_caption"] = "a photo of a dog"
    return {"sample_id": sample_id, "conversation": conversation, "qa": []}


def test_locomo_turns_follow_the_sessions_in_order_with_speakers_dates_and_photos():
    record = _locomo_record("conv-1", 10, 2)
    turns = locomo_turns(record)
    assert len(turns) == 20
    assert turns[:3] == ["(1:00 pm on 1 May, 2023) Ann: s1 line 1", "Bo: s1 line 2 [shares a photo: a photo of a dog]",
                         "(1:00 pm on 2 May, 2023) Ann: s2 line 1"]
    assert turns[-1] == "Bo: s10 line 2"
    assert locomo_turns(record, "first")[:2] == ["(1:00 pm on 1 May, 2023) s1 line 1", "(1:00 pm on 2 May, 2023) s2 line 1"]


def test_kdconv_turns_alternate_speakers_and_the_loaders_select_and_cap(tmp_path):
    dialogue = {"name": "x", "messages": [{"message": "你好"}, {"message": " 你好呀 ", "attrs": []},
                                          {"message": "再见"}]}
    assert kdconv_turns(dialogue) == ["甲：你好", "乙：你好呀", "甲：再见"]
    assert kdconv_turns(dialogue, "first") == ["你好", "再见"]

    (tmp_path / "locomo10.json").write_text(json.dumps([_locomo_record("conv-a", 2, 3),
                                                         _locomo_record("conv-b", 5, 4)]))
    (tmp_path / "kdconv-sample.json").write_text(json.dumps([dialogue] * 70, ensure_ascii=False))
    [long_one] = load_locomo(tmp_path, 1, min_turns=10)
    assert (long_one.id, long_one.source_turns, len(long_one.turns)) == ("conv-b", 20, 20)
    [capped] = load_locomo(tmp_path, ["conv-a"], max_turns=4)
    assert (capped.id, capped.source_turns, len(capped.turns)) == ("conv-a", 6, 4)
    picked = load_kdconv(tmp_path, ["3", "kdconv-68"])
    assert [(c.id, c.domain, len(c.turns)) for c in picked] == [("kdconv-3", "film", 3), ("kdconv-68", "music", 3)]


# ------------------------------------------------------------------------------------ the command


@pytest.mark.slow  # runs the benchmark as a command (python -m bench.replay)
def test_the_command_replays_data_it_is_given_and_writes_a_report_and_plots(tmp_path, redis_url):
    data = tmp_path / "data"
    data.mkdir()
    (data / "locomo10.json").write_text(json.dumps([_locomo_record("conv-x", 4, 4)]))
    (data / "kdconv-sample.json").write_text(json.dumps(
        [{"name": "n", "messages": [{"message": f"第{i}句话，我们聊聊电影。"} for i in range(12)]}] * 2,
        ensure_ascii=False))
    out = tmp_path / "out"
    command = [sys.executable, "-m", "bench.replay", "--data", str(data), "--fake", "--locomo", "1",
               "--min-turns", "16", "--kdconv", "2", "--out", str(out)]
    env = {"PATH": "/usr/bin:/bin", "REDIS_URL": redis_url, "HOME": str(tmp_path)}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "replay: pass" in done.stdout
    report = (out / "report.md").read_text()
    assert "python -m bench.replay --data " in report
    assert "| conv-x | 16 / 16 | 16 |" in report
    assert "| kdconv-1 (film) | 12 / 12 | 12 |" in report
    results = json.loads((out / "results.json").read_text())
    assert [c["id"] for c in results["conversations"]] == ["conv-x", "kdconv-0", "kdconv-1"]
    assert [c["ok"] for c in results["conversations"]] == [True, True, True]
    assert [c["accounting"]["balance"] for c in results["conversations"]] == [0, 0, 0]
    assert results["totals"]["lost"] == results["totals"]["duplicated"] == results["totals"]["over"] == 0
    for name in ("prompt-tokens-locomo.png", "prompt-tokens-kdconv.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "s1 line" not in report and "第1句话" not in report  # numbers and ids only, never the data's text
