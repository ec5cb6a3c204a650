"""The disagreement labels (bench/data/disagreement_labels.json) name units of the public data, and ``score`` counts
each of them once (bench/disagreements.py)."""

from __future__ import annotations

import json

from bench.disagreements import LABELS, score, units
from tests.helpers.public_data import DATA, public_data


def labels() -> dict:
    return json.loads(LABELS.read_text(encoding="utf-8"))


def test_every_label_names_a_unit_of_the_data() -> None:
    public_data("locomo10.json"), public_data("kdconv-sample.json")
    found = units(DATA)
    for group, rows in labels().items():
        if group == "about":
            continue
        ids = [row["id"] for row in rows]
        assert len(ids) == len(set(ids)), group
        assert set(ids) <= set(found[group]), group
        assert all(isinstance(row["label"], bool) for row in rows), group


def test_score_counts_every_label_once() -> None:
    public_data("locomo10.json"), public_data("kdconv-sample.json")
    given = labels()
    counts = score(DATA, given)
    assert set(counts) == set(given) - {"about"}
    for group, splits in counts.items():
        assert sum(n for _right, n in splits.values()) == len(given[group])
        assert all(0 <= right <= n for right, n in splits.values())
