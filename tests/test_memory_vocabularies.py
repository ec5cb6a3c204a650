"""The memory domain's closed vocabularies are ``StrEnum``s whose members are the very strings stored and sent:
record line kinds (docs/contract.md: ThreadState), sentence forms and the fitting policy's steps (the rule
groups ``policy.<step>`` of docs/ablation.md)."""

from __future__ import annotations

import json

from app.memory import lexicon
from app.memory.compaction.forms import FORMS, Form, sentence_form
from app.memory.compaction.record import FitStep
from app.memory.record import KINDS, LineKind, Record, RecordLine


def test_line_kinds_keep_their_stored_strings():
    assert [str(kind) for kind in KINDS] == ["about", "asked", "person", "assistant", "told", "text"]
    assert list(KINDS) == list(LineKind)
    record = Record(1, 2, (RecordLine(LineKind.PERSON, "I am Marta.", 1), RecordLine(LineKind.ABOUT, "Hello.")))
    plain = Record(1, 2, (RecordLine("person", "I am Marta.", 1), RecordLine("about", "Hello.")))
    assert record.to_stored() == plain.to_stored()
    assert '"kind":"person"' in record.to_stored()
    read = Record.from_dict(json.loads(record.to_stored()))
    assert read == record and type(read.lines[0].kind) is LineKind


def test_sentence_forms_are_their_plain_strings():
    assert [str(form) for form in FORMS] == ["statement", "question", "request", "greeting", "thanks",
                                             "acknowledgement", "instruction"]
    form = sentence_form("Where do you live?")
    assert form == "question" and form is Form.QUESTION and json.dumps(form) == '"question"'


def test_the_fitting_steps_are_the_policy_rule_groups_in_order():
    assert [f"policy.{step}" for step in FitStep] == list(lexicon.POLICY_STEPS)
