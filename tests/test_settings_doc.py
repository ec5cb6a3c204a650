"""docs/settings.md and .env.example are what ``scripts/settings_doc.py`` writes from the settings class, and every
variable the settings read has its group (app/settings.py: ``DOCUMENTED``)."""

from __future__ import annotations

import pytest

from app.settings import DOCUMENTED, GROUPS
from scripts import settings_doc


@pytest.mark.parametrize("name", ["docs/settings.md", ".env.example"])
def test_the_committed_file_is_what_the_generator_writes(name):
    path = settings_doc.ROOT / name
    expected = settings_doc.outputs()[path]
    assert path.read_text() == expected, f"{name} is out of date: run python scripts/settings_doc.py"


def test_every_variable_the_settings_read_has_a_group_and_a_meaning():
    variables = set(settings_doc.settings_variables())
    assert set(DOCUMENTED) == variables  # a new field needs its line in DOCUMENTED; a removed one loses it
    assert {doc.group for doc in DOCUMENTED.values()} == set(GROUPS)
    assert all(doc.meaning and "\n" not in doc.meaning for doc in DOCUMENTED.values())


def test_each_variable_is_listed_once_in_a_known_group():
    rows = settings_doc.rows()
    names = [row.name for row in rows]
    assert len(names) == len(set(names))
    assert {row.group for row in rows} == {*GROUPS, settings_doc.LOCAL_GROUP}


def test_bounds_come_from_the_fields():
    bounds = {row.name: row.bounds for row in settings_doc.rows()}
    assert bounds["CLIENT_IPV6_PREFIX"] == ">= 16, <= 128"
    assert bounds["MEMORY_RECALL_SHARE"] == ">= 0, <= 0.5"
    assert bounds["COMPACTION_STRATEGY"] == "llm or extractive"
    assert bounds["LLM_FIRST_TOKEN_TIMEOUT_SECONDS"] == "> 0, <= 3600"
