"""The LoCoMo QA bench's pure parts (bench/locomo_qa.py) on a small synthetic conversation, and one real run.

The synthetic record has LoCoMo's shape (``conversation.session_<N>`` lists of ``speaker``/``dia_id``/``text``,
``qa`` with ``evidence``), not its text: the dataset itself is read only by the last test, at run time.
"""

from __future__ import annotations

import json

import pytest

from bench import locomo_qa as L
from tests.helpers.public_data import public_data

RECORD = {
    "sample_id": "synthetic-1",
    "conversation": {
        "speaker_a": "Ana", "speaker_b": "Bo",
        "session_1_date_time": "9:00 am on 1 May, 2023",
        "session_1": [
            {"speaker": "Bo", "dia_id": "D1:1", "text": "Morning Ana!"},
            {"speaker": "Ana", "dia_id": "D1:2", "text": "Hi Bo, I adopted a cat named Pixel."},
            {"speaker": "Bo", "dia_id": "D1:3", "text": "Lovely. My sister moved to Oslo."},
            {"speaker": "Ana", "dia_id": "D1:4", "text": "Here is my garden.", "blip_caption": "a photo of tulips"},
        ],
        "session_2_date_time": "5:00 pm on 9 May, 2023",
        "session_3_date_time": "a date without a session",
        "session_2": [
            {"speaker": "Bo", "dia_id": "D2:1", "text": "How is Pixel?"},
            {"speaker": "Bo", "dia_id": "D2:2", "text": "Still chasing lasers?"},
            {"speaker": "Ana", "dia_id": "D2:3", "text": "Pixel is fine. I start a pottery class on Monday."},
        ],
    },
    "qa": [
        {"question": "What is the cat's name?", "answer": "Pixel", "evidence": ["D1:2"], "category": 4},
        {"question": "Where did Bo's sister move?", "answer": "Oslo", "evidence": ["D1:3; D2:3"], "category": 1},
        {"question": "Broken ids", "answer": "x", "evidence": ["D", "D:11:26", "D9:9"], "category": 2},
        {"question": "Unanswerable", "adversarial_answer": "y", "evidence": ["D1:2"], "category": 5},
    ],
}


def test_turns_pair_each_person_line_with_the_following_answers():
    turns, dia_turn, dia_text = L.build_turns(RECORD)
    assert [t.number for t in turns] == [1, 2, 3]
    # B's line before the first A line joins the first answer; the session date starts the session's first A line.
    assert turns[0].person == "(9:00 am on 1 May, 2023) Hi Bo, I adopted a cat named Pixel."
    assert turns[0].answer == "Morning Ana!\nLovely. My sister moved to Oslo."
    # a session that opens with B: B's lines answer the previous person line; a photo is described.
    assert turns[1].person == "Here is my garden. [shares a photo: a photo of tulips]"
    assert turns[1].answer == "How is Pixel?\nStill chasing lasers?"
    assert turns[2].person.startswith("(5:00 pm on 9 May, 2023) Pixel is fine.")
    assert turns[2].answer == L.NO_REPLY
    assert dia_turn == {"D1:1": 1, "D1:2": 1, "D1:3": 1, "D1:4": 2, "D2:1": 2, "D2:2": 2, "D2:3": 3}
    assert dia_text["D1:4"] == "Here is my garden. [shares a photo: a photo of tulips]"


def test_evidence_ids_are_parsed_and_bad_ones_dropped():
    _, _, dia_text = L.build_turns(RECORD)
    assert L.parse_evidence(["D1:3; D2:3", "D1:3"], dia_text) == (("D1:3", "D2:3"), 0)
    assert L.parse_evidence(["D", "D:11:26", "D9:9"], dia_text) == ((), 3)
    questions, without = L.load_questions(RECORD, dia_text)
    assert [(q.index, q.category, q.evidence) for q in questions] == [(0, 4, ("D1:2",)), (1, 1, ("D1:3", "D2:3"))]
    assert without == 1  # the item with only broken ids; category 5 is not measured


def test_position_thirds():
    assert [L.position(n, 9) for n in (1, 3, 4, 6, 7, 9)] == ["early", "early", "middle", "middle", "late", "late"]
    assert L.position(1, 1) == "early"


def _prompt(*memory: str) -> L.PromptText:
    return L.PromptText.of([{"role": "system", "content": m} for m in memory] +
                           [{"role": "user", "content": "the question, never counted: (turn 1)"}])


def test_evidence_reaches_verbatim_tagged_or_as_a_record_line():
    _, dia_turn, dia_text = L.build_turns(RECORD)

    def how(prompt, dia_id, strict=False):
        return L.evidence_reaches(prompt, dia_id, dia_turn, dia_text, strict=strict)

    verbatim = _prompt("system", "HI BO,   i adopted a cat named Pixel.")
    assert how(verbatim, "D1:2") == "verbatim"
    assert how(verbatim, "D2:3") is None
    # a line tagged with the turn that holds the utterance (turn 3 holds D2:3); the question's own text never counts
    tagged = _prompt("<record>\n- Person (turn 3): I start a pottery class on Monday.\n- Told (turn 2): nothing\n</record>")
    assert how(tagged, "D2:3") == "tagged"
    assert how(tagged, "D2:3", strict=True) == "tagged"
    assert how(tagged, "D1:2") is None
    assert how(tagged, "D2:1") == "tagged"  # turn 2 holds B's D2:1
    assert how(tagged, "D2:1", strict=True) is None  # ... but its text is not there
    excerpt = _prompt("Excerpts recalled from earlier in this conversation:\n(turn 1) person: Hi Bo ...")
    assert how(excerpt, "D1:3") == "tagged"
    # an untagged record line holding one sentence of the utterance (20+ characters), label and date stripped
    line = _prompt("<record>\n- Person: (5:00 pm on 9 May, 2023) I start a pottery class on Monday.\n- Person: Pixel is fine.\n</record>")
    assert how(line, "D2:3") == "line"
    assert how(line, "D2:3", strict=True) == "line"
    short = _prompt("<record>\n- Person: Pixel is fine.\n</record>")
    assert how(short, "D2:3") is None  # under 20 characters: too generic to name one utterance


def test_sliding_window_keeps_the_newest_whole_turns_within_the_budget():
    from app.memory.tokens import counter_for

    counter = counter_for(None)
    transcript = L.Transcript(counter, "sys")
    for i in range(6):
        transcript.add(f"person line {i}", f"answer line {i}")
    full = transcript.full("q?")
    assert len(full) == 14 and full[-1] == {"role": "user", "content": "q?"}
    budget = counter.prompt(full) - transcript.costs[0]  # exactly every turn but the oldest
    window = transcript.sliding("q?", budget)
    assert [m["content"] for m in window[1:3]] == ["person line 1", "answer line 1"]
    assert len(window) == 12 and counter.prompt(window) == budget
    shorter = transcript.sliding("q?", budget - 1)  # one token less: the next whole turn goes too
    assert [m["content"] for m in shorter[1:3]] == ["person line 2", "answer line 2"] and len(shorter) == 10
    assert transcript.sliding("q?", 0) == [transcript.system, {"role": "user", "content": "q?"}]


@pytest.mark.parametrize("prediction, gold, expected", [
    ("Pixel", "Pixel", 1.0),
    ("The cat is called Pixel.", "Pixel", 2 * (1 / 4) * 1 / (1 / 4 + 1)),   # the/punctuation gone: cat is called pixel
    ("running, Dogs", "run and dog", 1.0),                                    # stems; 'and' and commas removed
    ("Oslo", "Bergen", 0.0),
    ("", "Pixel", 0.0),
    (2022, "2022", 1.0),
])
def test_token_f1_as_locomo_scores_it(prediction, gold, expected):
    assert L.token_f1(prediction, gold) == pytest.approx(expected)


def test_answer_f1_by_category():
    # multi-hop: the mean over gold parts of the best-matching predicted part
    assert L.answer_f1(1, "Oslo, Paris", "Paris, Rome") == pytest.approx(0.5)
    assert L.answer_f1(1, "Paris and Rome", "Paris, Rome") == pytest.approx((2 / 3 + 2 / 3) / 2)
    # open-domain: only the gold answer's part before ';'
    assert L.answer_f1(3, "likely yes", "Likely yes; she said so") == pytest.approx(1.0)
    assert L.answer_f1(4, "likely yes", "Likely yes; she said so") < 1.0
    assert L.normalize_answer("The Lean, Startup!") == "lean startup"


def test_session_recall_looks_for_a_gold_session_among_the_top_turns_sessions():
    turns, _, _ = L.build_turns(RECORD)
    sessions = {t.number: {L.session_of(d) for d in t.dia_ids} - {None} for t in turns}
    assert sessions == {1: {1}, 2: {1, 2}, 3: {2}}  # turn 2: A's D1:4 and B's D2:1, D2:2 that answer it
    assert L.session_of("D12:3") == 12 and L.session_of("12:3") is None
    assert L.session_recall([3, 1], sessions, ("D1:2",), ks=(1, 2)) == {1: False, 2: True}
    assert L.session_recall([2], sessions, ("D2:3",), ks=(1,)) == {1: True}  # turn 2 holds session 2 too
    assert L.session_recall([], sessions, ("D1:2",)) == {5: False, 10: False}  # nothing recalled
    assert L.session_recall([1, 2, 3], sessions, ("D9:1", "D2:3"), ks=(1, 5)) == {1: False, 5: True}


@pytest.mark.slow  # replays a whole LoCoMo conversation from the public data (../shared/data)
def test_bench_runs_on_one_conversation(tmp_path):
    data = public_data(L.LOCOMO_FILE).parent
    code = L.main(["--fake", "--conversations", "1", "--out", str(tmp_path), "--data", str(data)])
    assert code == 0
    results = json.loads((tmp_path / "locomo.json").read_text())
    summary = results["summary"]
    assert summary["questions"] == 150  # conv-26: 152 items of categories 1-4, 2 without a usable evidence id
    assert summary["full"]["reached"] == 1.0  # the detector finds every evidence turn in the whole transcript
    assert results["checks"]["turn_prompts_over"] == 0 and results["checks"]["question_prompts_over"] == 0
    assert results["checks"]["compaction_requests"] > 0 and results["checks"]["compaction_requests_over"] == 0
    assert summary["sliding"]["tokens_max"] <= summary["product"]["tokens_max"]
    recall = summary["session_recall"]
    assert 0 < recall["at5"] <= recall["at10"] <= 1 and results["conversations"][0]["session_recall"] == recall
    assert (tmp_path / "locomo.png").stat().st_size > 0
    assert "| **all questions** |" in (tmp_path / "locomo.md").read_text()
    # no dataset text in the numbers file
    assert "Caroline" not in (tmp_path / "locomo.json").read_text()
