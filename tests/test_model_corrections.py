"""Corrections win with the bundled model (docs/bundled-model.md; docs/benchmarks.md: Performance; docs/contract.md:
Model context for a turn).

The prompt a turn sends (the system prompt, the record message as ``app.memory.context`` renders it, the question)
for correction cases of ``bench/corrections.py`` whose replaced value the earlier rendering had the model answer:
a date and a place, in English and in Chinese.  Sampling is fixed (temperature 0, seed 7: greedy decoding, the
same answer on every run of the pinned model and server).  Tolerated: any wording around the value; checked: the
answer holds the corrected value (one of its spellings) and not the replaced one.  Needs the verified GGUF file.
"""

from __future__ import annotations

import pytest

from app.memory.context import format_summary
from app.settings import Settings
from bench.corrections import CASES, answered, ask, summary_of
from chat_support.servers import free_ports

CHOSEN = [next(c for c in CASES if (c.lang, c.kind) == wanted)  # the first date and place case of each language
          for wanted in (("en", "date"), ("en", "place"), ("zh", "date"), ("zh", "place"))]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_bundled_model_answers_the_corrected_value(bundled_model, tmp_path):
    assert sorted((c.lang, c.kind) for c in CHOSEN) == [("en", "date"), ("en", "place"), ("zh", "date"),
                                                        ("zh", "place")]
    (port,) = free_ports(1)
    model = bundled_model.start(port, tmp_path / "model.log")
    try:
        system = Settings().system_prompt
        answers = {(c.lang, c.kind): ask(f"http://127.0.0.1:{port}/v1", [
            {"role": "system", "content": system}, {"role": "system", "content": format_summary(summary_of(c))},
            {"role": "user", "content": c.question}]) for c in CHOSEN}
    finally:
        bundled_model.stop(model)
    wrong = {key: text for (key, text), case in zip(answers.items(), CHOSEN, strict=True) if not answered(case, text)}
    assert wrong == {}
