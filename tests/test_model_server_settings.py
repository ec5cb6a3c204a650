"""The bundled model servers' CPU settings (README: The bundled model): the chat server reads prompts with every
CPU, the compaction server with half and at a lower priority, so a chat turn's prompt is read first."""

from __future__ import annotations

import os

from scripts import model_server


def test_chat_reads_prompts_with_every_cpu_and_decodes_with_half():
    cpus = os.cpu_count() or 2
    chat = model_server.server_settings("chat", environ={})
    assert chat["threads"] == max(1, cpus // 2)
    assert chat["batch_threads"] == cpus
    assert chat["nice"] == 0


def test_compaction_reads_with_half_the_cpus_at_niceness_ten():
    compaction = model_server.server_settings("compaction", environ={})
    assert compaction["batch_threads"] == compaction["threads"] == max(1, (os.cpu_count() or 2) // 2)
    assert compaction["nice"] == 10
    assert compaction["n_cache_reuse"] == 0


def test_the_environment_overrides_threads_and_niceness():
    env = {"LOCAL_MODEL_THREADS": "3", "LOCAL_MODEL_BATCH_THREADS": "1", "LOCAL_COMPACTION_NICE": "0"}
    assert model_server.server_settings("chat", environ=env)["batch_threads"] == 1
    compaction = model_server.server_settings("compaction", environ=env)
    assert (compaction["threads"], compaction["batch_threads"], compaction["nice"]) == (3, 1, 0)
