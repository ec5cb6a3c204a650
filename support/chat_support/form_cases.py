"""Hand-labelled sentence forms: the forms the public data has few of (requests, reply instructions).

``(sentence, form)`` pairs, the form one of ``app.memory.compaction.forms.FORMS``.  Read by
tests/test_compaction_forms.py and by bench/ablation.py (its ``forms.labelled`` measure), so both check the
same cases.
"""

from __future__ import annotations

LABELLED: tuple[tuple[str, str], ...] = (
    ("Thanks!", "thanks"), ("Thank you so much, Gina.", "thanks"), ("谢谢你！", "thanks"),
    ("Got it.", "acknowledgement"), ("That's really cool.", "acknowledgement"), ("好的。", "acknowledgement"),
    ("嗯嗯", "acknowledgement"), ("你好！", "greeting"),
    ("Explain how this works.", "request"), ("Can you write it again", "request"),
    ("请介绍一下这个地方。", "request"), ("Just acknowledge.", "instruction"),
    ("One sentence please.", "instruction"), ("用一句话回答。", "instruction"),
    ("No, the meeting is on Tuesday.", "statement"), ("I prefer short answers.", "statement"),
    ("It was a great experience.", "statement"), ("我对花生过敏。", "statement"),
)
