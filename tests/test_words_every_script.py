"""Words of every script (docs/memory.md: "Forget and provenance", "Recall"): one planted word per script is a token of
the memory domain's one tokenizer (``app.memory.words``), recall finds the archived turn that holds it, and a
forget of that turn takes a model's gist line quoting it out of every later prompt and out of the export.

Real Redis, the app served on loopback, the fake LLM recording every request (as tests/test_forget_api.py).  The
words differ from test_forget_api's, whose proof scans every process cache for its word."""

from __future__ import annotations

import json

import pytest

from app.memory.forget import Quoting
from app.memory.recall import ArchivedTurn, ArchiveIndex, recall
from app.memory.state import ThreadMessage
from app.memory.tokens import counter_for
from app.memory.words import tokens
from chat_support.live_app import ChatClient
from tests.fixtures.celery_worker import commit_turn
from tests.test_forget_api import everything_in_redis, fold_all, served  # noqa: F401 (a fixture)

# script: (the planted word, a person's message holding it, a model's gist line quoting it)
PLANTED = {
    "latin": ("quokkafern", "My locker code is quokkafern, keep it safe.", "Locker code: quokkafern."),
    "cyrillic": ("зебра", "Мой код от шкафчика — Зебра, сохрани его.", "Код шкафчика: зебра."),
    "greek": ("ζέβρα", "Ο κωδικός του ντουλαπιού μου είναι ζέβρα.", "Κωδικός ντουλαπιού: ζέβρα."),
    "arabic": ("زرافة", "رمز خزانتي هو زرافة، احفظه.", "رمز الخزانة: زَرافة."),
    "hebrew": ("זברה", "הקוד של הארונית שלי הוא זברה, שמור אותו.", "קוד הארונית: זברה."),
    "devanagari": ("ज़ेबरा", "मेरे लॉकर का कोड ज़ेबरा है, इसे याद रखना।", "लॉकर कोड: ज़ेबरा।"),
    "thai": ("ทุเรียน", "รหัสตู้ของฉันคือทุเรียนนะ", "รหัสตู้คือทุเรียน"),
    "hangul": ("얼룩말", "내 사물함 비밀번호는 얼룩말 이에요.", "사물함 비밀번호: 얼룩말."),
    "kana": ("ラーメン", "ロッカーのあんごうはラーメンです。", "あんごうはラーメン。"),
    "han": ("斑马", "我的储物柜密码是斑马，请记住。", "储物柜密码是斑马。"),
}
OTHER = ["tell me about the number 4 please", "What about the weather tomorrow?", "Noted."]
COUNTER = counter_for(None, "cl100k_base")


def _msg(mid: str, role: str, text: str) -> ThreadMessage:
    return ThreadMessage(mid, role, text, "2026-01-01T00:00:00.000Z")


@pytest.mark.parametrize("script", sorted(PLANTED))
def test_the_planted_word_is_a_token_of_its_message_and_of_the_gist_line(script):
    word, message, gist = PLANTED[script]
    own = set(tokens(word))
    assert own, f"{script}: the word gives no token"
    assert own <= set(tokens(message)) and own <= set(tokens(gist))
    quoting = Quoting.of([message, "Noted."], OTHER)
    assert quoting.quotes(gist)
    assert not quoting.quotes("The person asked about the weather tomorrow.")


@pytest.mark.parametrize("script", sorted(PLANTED))
def test_recall_finds_the_turn_holding_the_planted_word(script):
    word, message, _gist = PLANTED[script]
    index = ArchiveIndex()
    index.add([ArchivedTurn(n, (_msg(f"u{n}", "user", message if n == 3 else f"{OTHER[n % 2]} ({n})"),
                                _msg(f"a{n}", "assistant", "Noted.")))
               for n in range(1, 9)])
    excerpts = recall(index, f"{word}?", held=[], max_tokens=400, counter=COUNTER)
    assert [e.turn for e in excerpts][:1] == [3]


@pytest.mark.parametrize("script", ["cyrillic", "greek", "arabic", "hebrew", "devanagari", "thai", "hangul",
                                    "kana", "han", "latin"])
def test_forgetting_a_turn_takes_a_gist_line_quoting_its_word_out_of_prompts_and_the_export(
        served, fake_llm, script):  # noqa: F811 (the fixture)
    rig, server = served
    word, message, gist = PLANTED[script]
    chat = ChatClient(server).connect()
    try:
        tid = chat.thread()["threadId"]
        for n in range(1, 8):
            commit_turn(rig.store, tid, n, user=message if n == 3 else None)
        fold_all(rig, tid)  # turn 3 archived
        state = rig.store.load(tid)
        assert rig.store.set_pins_and_notes(tid, expected_gen=state.gen, pins=[],
                                            notes=[gist, "The person likes numbers."])
        export = chat.http.get(server.url + "/api/chat/export", timeout=10).text
        assert word in json.loads(export)["notes"][0].replace("\u064e", "")  # planted before the forget

        response = chat.http.delete(server.url + "/api/chat/turns/3", timeout=10)
        assert response.status_code == 200 and response.json()["forgotten"]["notes"] == 1
        fake_llm.clear_requests()
        chat.turn(f"What was my locker code? {OTHER[1]}")
        assert fake_llm.requests, "the model was asked"
        prompts = json.dumps([r.body for r in fake_llm.requests], ensure_ascii=False)
        assert "The person likes numbers." in prompts and word not in prompts
        export = chat.http.get(server.url + "/api/chat/export", timeout=10)
        assert export.status_code == 200 and word not in export.text and word not in json.loads(export.text).__repr__()
        assert word not in everything_in_redis(rig.client, tid)
    finally:
        chat.close()
