"""Write docs/settings.md and .env.example from the settings class, so the two never drift from it.

Every variable ``Settings.from_env`` reads (``app/settings.py``: its fields' variables and ``LIMIT_VARIABLES``),
grouped by ``DOCUMENTED`` (web, store, model, compaction, budgets), with its default, unit, bounds (from the
fields' constraints) and one-line meaning; then the Procfile's own variables (their defaults read from the
``${NAME:-default}`` in ``Procfile``) and the local stack's, which only scripts/ reads (``LOCAL_STACK`` below, the
defaults taken from the scripts' constants).  docs/contract.md: Configuration has each variable's whole text.

Usage::

    python -m scripts.settings_doc          # write docs/settings.md and .env.example
    python -m scripts.settings_doc --check  # exit 1, naming the file, when either differs from what it would write

tests/test_settings_doc.py fails when a committed file differs, or when a variable has no group.
"""

from __future__ import annotations

import argparse
import re
import sys
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from annotated_types import Ge, Gt, Le, Lt

from app.settings import DOCUMENTED, GROUPS, LIMIT_VARIABLES, MemoryLimits, Settings

if __package__:  # imported as scripts.settings_doc (the tests)
    from scripts import devstore, local_model, model_server, slot_cache, wait_ready
else:  # run as `python scripts/settings_doc.py`: its own folder is sys.path[0]
    import devstore  # type: ignore[no-redef]  # the same file as scripts.devstore
    import local_model  # type: ignore[no-redef]
    import model_server  # type: ignore[no-redef]
    import slot_cache  # type: ignore[no-redef]
    import wait_ready  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parent.parent
MARKDOWN = ROOT / "docs" / "settings.md"
ENV_EXAMPLE = ROOT / ".env.example"
LOCAL_GROUP = "local stack"


@dataclass(frozen=True)
class Row:
    """One variable as the two files show it: ``default`` and ``bounds`` are text (empty: none)."""

    group: str
    name: str
    default: str
    unit: str
    bounds: str
    meaning: str
    literal_default: bool = True  # False: ``default`` is words (a rule), not a value to write after ``NAME=``


PROCFILE_VARIABLES = {  # variable -> (group, unit, bounds, meaning); defaults: the Procfile's ${NAME:-default}
    "WEB_CONCURRENCY": ("web", "processes", ">= 1", "web (gunicorn) worker processes"),
    "WEB_WORKER_CLASS": ("web", "", "gevent or gthread", "gunicorn's worker class"),
    "WORKER_CONCURRENCY": ("compaction", "tasks", ">= 1", "folds one worker process runs at once"),
}

LOCAL_STACK = {  # variable -> (default, unit, bounds, meaning): read by scripts/ (make run), never by the app
    "LOCAL_MODEL": (local_model.DEFAULT_MODEL, "", " or ".join(local_model.MODELS), "which bundled model is "
                    "fetched and served"),
    "LOCAL_MODEL_PORT": (str(local_model.DEFAULT_PORT), "port", "", "the bundled chat model server's port"),
    "LOCAL_COMPACTION_MODEL_PORT": (str(local_model.DEFAULT_COMPACTION_PORT), "port", "",
                                    "the bundled compaction model server's port"),
    "LOCAL_MODEL_BATCH": (str(model_server.BATCH_TOKENS), "tokens", ">= 1", "llama.cpp's n_batch = n_ubatch: a "
                          "cancelled request stops within one batch"),
    "LOCAL_MODEL_YIELD": ("on", "", "on or off", "the compaction server is stopped while a chat turn runs"),
    "LOCAL_MODEL_THREADS": ("", "threads", ">= 1", "decoding threads of each server (unset: every CPU for a "
                            "yielding chat server, else half)"),
    "LOCAL_MODEL_BATCH_THREADS": ("", "threads", ">= 1", "prompt-reading threads (unset: every CPU for chat, half "
                                  "for compaction)"),
    "LOCAL_COMPACTION_NICE": (str(model_server.COMPACTION_NICE), "niceness", "", "the compaction server's "
                              "niceness (a chat turn's threads come first)"),
    "LOCAL_MODEL_CACHE_REUSE": (str(model_server.CACHE_REUSE_TOKENS), "tokens", ">= 0", "chat server: smallest run "
                                "of equal tokens reused by shifting (n_cache_reuse)"),
    "LOCAL_MODEL_SLOT_FILES": (str(slot_cache.MAX_FILES), "files", ">= 0", "slot files the chat server's proxy "
                               "keeps, one a thread (0: no proxy)"),
    "LOCAL_MODEL_SLOT_MIB": (str(slot_cache.MAX_MIB), "MiB", ">= 1", "the slot files' total size"),
    "LOCAL_MODEL_SLOT_DIR": ("", "path", "", "where slot files are kept (unset: the system's temporary directory)"),
    "DEV_STORE_PORT": (str(devstore.DEFAULT_PORT), "port", "", "the embedded store's port (make run)"),
    "DEV_STORE_DIR": (".local/store", "path", "", "the embedded store's data folder"),
    "FLOWER_PORT": ("5555", "port", "", "Flower's port (make run)"),
    "DEV_RUN_DIR": ("", "path", "", "pid, lease and ready files of the model servers (make run sets it)"),
    "DEV_WAIT_FOR": ("", "", "", "space-separated addresses scripts/wait_ready.py waits for (make run sets it)"),
    "DEV_WAIT_TIMEOUT": (f"{wait_ready.DEFAULT_TIMEOUT:g}", "s", "", "the longest scripts/wait_ready.py waits"),
}


def settings_variables() -> dict[str, tuple[Any, Any]]:
    """Every variable ``Settings.from_env`` reads -> ``(default, annotation with its constraints)``."""
    found: dict[str, tuple[Any, Any]] = {}
    hints = typing.get_type_hints(MemoryLimits, include_extras=True)
    for info in Settings.model_fields.values():
        alias = info.validation_alias
        names = [alias] if isinstance(alias, str) else list(getattr(alias, "choices", []))
        for variable in names:
            found[variable] = (info.default, typing.Annotated[info.annotation, *info.metadata]
                               if info.metadata else info.annotation)
    defaults = MemoryLimits()
    for field, variable in LIMIT_VARIABLES.items():
        found[variable] = (getattr(defaults, field), hints[field])
    return found


def _value(value: Any) -> str:
    if value is None or value == "" or value == ():
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _bounds(annotation: Any) -> str:
    """``>= 1, <= 16``, ``a, b or c`` (a Literal), ``true or false``, or empty."""
    metadata: list[Any] = []
    if typing.get_origin(annotation) is typing.Annotated:
        annotation, *metadata = typing.get_args(annotation)
    parts = []
    for item in metadata:
        for kind, attribute, sign in ((Ge, "ge", ">="), (Gt, "gt", ">"), (Le, "le", "<="), (Lt, "lt", "<")):
            if isinstance(item, kind):
                parts.append(f"{sign} {_value(getattr(item, attribute))}")
    choices = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) is typing.Literal:
        parts.append(", ".join(choices[:-1]) + " or " + choices[-1])
    elif annotation is bool:
        parts.append("true or false")
    return ", ".join(parts)


def procfile_defaults(text: str) -> dict[str, str]:
    """``${NAME:-default}`` of the Procfile's commands -> ``{NAME: default}``."""
    return dict(re.findall(r"\$\{(\w+):-([^}]*)\}", text))


def rows() -> list[Row]:
    """Every variable, in the files' order: ``GROUPS`` then the local stack; by name within a group.

    Raises:
        KeyError: a variable of ``Settings`` without its line in ``DOCUMENTED``.
    """
    found = []
    for name, (default, annotation) in settings_variables().items():
        doc = DOCUMENTED[name]
        found.append(Row(doc.group, name, doc.default if doc.default is not None else _value(default), doc.unit,
                         _bounds(annotation), doc.meaning, literal_default=doc.default is None))
    procfile = procfile_defaults((ROOT / "Procfile").read_text())
    for name, (group, unit, bounds, meaning) in PROCFILE_VARIABLES.items():
        found.append(Row(group, name, procfile[name], unit, bounds, meaning))
    for name, (default, unit, bounds, meaning) in LOCAL_STACK.items():
        found.append(Row(LOCAL_GROUP, name, default, unit, bounds, meaning))
    order = {group: n for n, group in enumerate((*GROUPS, LOCAL_GROUP))}
    return sorted(found, key=lambda row: (order[row.group], row.name))


def _cell(text: str) -> str:
    return text.replace("|", "\\|") or "–"


def markdown(all_rows: list[Row]) -> str:
    """docs/settings.md: one table per group (variable, default, unit, bounds, meaning)."""
    lines = ["# Settings", "",
             "Every environment variable, grouped by what it configures; `.env.example` lists the same with their",
             "defaults. Written by `python -m scripts.settings_doc` from `app/settings.py` (`DOCUMENTED`), the",
             "Procfile and the local stack's scripts: do not edit by hand (`tests/test_settings_doc.py` fails when",
             "this file differs). An empty value means unset. docs/contract.md (Configuration) has each variable's",
             "whole text.", ""]
    for group in (*GROUPS, LOCAL_GROUP):
        lines += [f"## {group}", ""]
        if group == LOCAL_GROUP:
            lines += ["Read by `scripts/` only (`make run`: the embedded store and the bundled model's servers).", ""]
        lines += ["| variable | default | unit | bounds | meaning |", "| --- | --- | --- | --- | --- |"]
        for row in (r for r in all_rows if r.group == group):
            default = f"`{row.default}`" if row.literal_default and row.default else _cell(row.default or "unset")
            lines.append(f"| `{row.name}` | {default} | {_cell(row.unit)} | {_cell(row.bounds)} | "
                         f"{_cell(row.meaning)} |")
        lines.append("")
    return "\n".join(lines)


def env_example(all_rows: list[Row]) -> str:
    """.env.example: every variable commented out at its default (a default in words is left empty)."""
    lines = ["# Every environment variable at its default, grouped as in docs/settings.md; uncomment a line to set it.",
             "# Copy to .env for local runs (honcho reads it); on Heroku set them with `heroku config:set`.",
             "# Written by `python scripts/settings_doc.py` from app/settings.py: do not edit by hand."]
    for group in (*GROUPS, LOCAL_GROUP):
        lines += ["", f"# ---- {group} " + "-" * (110 - len(group))]
        for row in (r for r in all_rows if r.group == group):
            notes = [part for part in (row.unit, row.bounds) if part]
            if not row.literal_default:
                notes.append(f"default: {row.default}")
            lines.append(f"# {row.meaning}" + (f" ({'; '.join(notes)})" if notes else ""))
            lines.append(f"# {row.name}={row.default if row.literal_default else ''}")
    return "\n".join(lines) + "\n"


def outputs() -> dict[Path, str]:
    """``{path: the text it should hold}`` for docs/settings.md and .env.example."""
    all_rows = rows()
    return {MARKDOWN: markdown(all_rows), ENV_EXAMPLE: env_example(all_rows)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when a file differs")
    args = parser.parse_args(argv)
    stale = []
    for path, text in outputs().items():
        if path.exists() and path.read_text() == text:
            continue
        if args.check:
            stale.append(path.relative_to(ROOT).as_posix())
        else:
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
    if stale:
        print(f"out of date: {', '.join(stale)} (run python scripts/settings_doc.py)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
