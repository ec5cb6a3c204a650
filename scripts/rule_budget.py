"""Count the memory rules: every compiled pattern, every data-file entry, every hand-written word list
(docs/memory.md: The rules; docs/ablation.md).

Patterns, wherever they are built in ``app/memory``:

- a call of ``re``/``regex``'s ``compile``, ``search``, ``match``, ``fullmatch``, ``sub``, ``subn``, ``split``,
  ``findall`` or ``finditer`` (one pattern per call site), except the one inside ``lexicon.build``, the helper
  every data pattern is compiled through (those are counted where they are built, below);
- a pattern helper of ``app/memory/lexicon.py`` (a function that calls ``build``): one without parameters
  (``thanks_pattern``, ``zh_preference`` ...) builds one pattern, counted at its definition; one with parameters
  (``cue``, ``build``) builds one per call site in another module; ``fact_patterns`` builds one per entry of
  ``data/facts.toml`` that has a ``pattern``.

Data entries: every entry of the lists of ``app/memory/data/*.toml`` (a list written as one string counts each
of its words, or each character for a string without spaces, as ``lexicon.words`` reads it); the patterns of
``facts.toml`` are counted as patterns.

Hand-written word lists in code: a literal collection of five or more strings, or a literal string's ``.split()``,
in a module of ``app/memory``; its entries are counted (a module's ``__all__`` is not a word list).

Usage: ``python -m scripts.rule_budget [--max-patterns N] [--max-entries N] [--max-words N] [--root DIR]``;
prints each count per file and exits 1 when any is over its budget.  The budgets are today's figures: adding a
pattern, a data entry or a word list anywhere fails ``tests/test_lexicon.py`` until the budget is raised on
purpose (with the measurement that earns it, docs/ablation.md).
"""

from __future__ import annotations

import argparse
import ast
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REGEX_CALLS = {"compile", "search", "match", "fullmatch", "sub", "subn", "split", "findall", "finditer"}
MIN_LIST = 5
LEXICON = Path("app/memory/lexicon.py")
COMPILER = "build"
"""The lexicon's helper every data pattern is compiled through."""
TABLE_BUILDERS = {"fact_patterns": "facts"}
"""Lexicon helpers that build one pattern per entry of a data file (``data/<name>.toml``)."""
DATA_KEYS_SKIPPED = {"group", "source", "ascii", "uses"}
"""Keys of a data-file section that describe it rather than list entries."""

MAX_PATTERNS = 71
MAX_ENTRIES = 1564
MAX_WORDS = 63


@dataclass
class Counts:
    """What ``count`` found, per file (paths relative to the counted root).

    Attributes:
        patterns: ``{file: [line, ...]}``, one line per pattern built (a data file's patterns: its section names).
        entries: ``{file: {section: entries}}`` of the data files.
        words: ``{file: [(line, entries), ...]}`` of the hand-written word lists in code.
    """

    patterns: dict[str, list[int | str]] = field(default_factory=dict)
    entries: dict[str, dict[str, int]] = field(default_factory=dict)
    words: dict[str, list[tuple[int, int]]] = field(default_factory=dict)

    @property
    def total_patterns(self) -> int:
        return sum(len(v) for v in self.patterns.values())

    @property
    def total_entries(self) -> int:
        return sum(n for v in self.entries.values() for n in v.values())

    @property
    def total_words(self) -> int:
        return sum(n for v in self.words.values() for _, n in v)


def _functions(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    return {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}


def _calls(node: ast.AST, name: str) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == name for n in ast.walk(node))


def pattern_helpers(lexicon_tree: ast.Module) -> dict[str, bool]:
    """``{name: takes_parameters}`` of the lexicon's pattern helpers: ``build`` and every function calling it."""
    helpers = {}
    for name, node in _functions(lexicon_tree).items():
        if name == COMPILER or _calls(node, COMPILER):
            args = node.args
            helpers[name] = bool(args.posonlyargs or args.args or args.kwonlyargs or args.vararg or args.kwarg)
    return helpers


def regex_sites(tree: ast.AST, skip: ast.AST | None = None) -> list[int]:
    """Line numbers of the ``re``/``regex`` calls of one module (none inside ``skip``)."""
    skipped = {id(n) for n in ast.walk(skip)} if skip is not None else set()
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Call) and id(node) not in skipped and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name) and node.func.value.id in ("re", "regex")
            and node.func.attr in REGEX_CALLS]


def helper_sites(tree: ast.AST, helpers: dict[str, bool]) -> list[int]:
    """Line numbers of the calls, in another module, of the lexicon's helpers that take parameters (one pattern
    each; the table builders are counted by their data file)."""
    wanted = {name for name, parameters in helpers.items() if parameters and name not in TABLE_BUILDERS}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) \
            and func.value.id == "lexicon" else func.id if isinstance(func, ast.Name) else None
        if name in wanted:
            found.append(node.lineno)
    return found


def word_lists(tree: ast.AST) -> list[tuple[int, int]]:
    """``(line, entries)`` of each hand-written word list of one module."""
    found = []
    exports = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Assign)
               and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)}
    for node in ast.walk(tree):
        if id(node) in exports:  # the module's exports are names, not words
            continue
        if isinstance(node, (ast.Set, ast.List, ast.Tuple)):
            strings = [e for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
            if len(strings) >= MIN_LIST:
                found.append((node.lineno, len(strings)))
        elif isinstance(node, ast.Dict):
            strings = [k for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)]
            if len(strings) >= MIN_LIST:
                found.append((node.lineno, len(strings)))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "split"
              and isinstance(node.func.value, ast.Constant) and isinstance(node.func.value.value, str)
              and not node.args):
            found.append((node.lineno, len(node.func.value.value.split())))
    return found


def _entries(value) -> int:
    """Entries of one data-file value, as ``lexicon.words`` reads it (a string: its words, or its characters)."""
    if isinstance(value, str):
        return len(value.split()) if any(ch.isspace() for ch in value.strip()) else len(value.strip())
    if isinstance(value, list):
        return len(value)
    return 0


def data_entries(table: dict) -> tuple[dict[str, int], list[str]]:
    """``({section: list entries}, [section of each pattern])`` of one parsed data file (sections nest:
    ``[latin.iso_date]`` is ``latin.iso_date``)."""
    entries: dict[str, int] = {}
    patterns: list[str] = []

    def walk(prefix: str, section: dict) -> None:
        for key, value in section.items():
            name = f"{prefix}.{key}" if prefix else key
            if key in DATA_KEYS_SKIPPED:
                continue
            if isinstance(value, dict):
                walk(name, value)
            elif key == "pattern":
                patterns.append(prefix)
            elif n := _entries(value):
                entries[name] = n

    walk("", table)
    return entries, patterns


def count(root: Path = ROOT) -> Counts:
    """The patterns, data entries and hand-written word lists of ``root``'s ``app/memory`` (see the module
    docstring).

    Raises:
        FileNotFoundError: ``root`` has no ``app/memory/lexicon.py``.
        SyntaxError, tomllib.TOMLDecodeError: a module or a data file does not parse.
    """
    counts = Counts()
    lexicon_tree = ast.parse((root / LEXICON).read_text(encoding="utf-8"))
    helpers = pattern_helpers(lexicon_tree)
    compiler = _functions(lexicon_tree).get(COMPILER)
    for path in sorted((root / "app" / "memory").rglob("*.py")):
        name = str(path.relative_to(root))
        is_lexicon = path.relative_to(root) == LEXICON
        tree = lexicon_tree if is_lexicon else ast.parse(path.read_text(encoding="utf-8"))
        if is_lexicon:
            sites = regex_sites(tree, skip=compiler) + [
                node.lineno for n, node in _functions(tree).items() if n in helpers and not helpers[n]]
        else:
            sites = regex_sites(tree) + helper_sites(tree, helpers)
        if sites:
            counts.patterns[name] = sorted(sites)
        if found := word_lists(tree):
            counts.words[name] = found
    for path in sorted((root / "app" / "memory" / "data").glob("*.toml")):
        name = str(path.relative_to(root))
        with path.open("rb") as handle:
            entries, patterns = data_entries(tomllib.load(handle))
        if path.stem in TABLE_BUILDERS.values() and patterns:
            counts.patterns[name] = list(patterns)
        if entries:
            counts.entries[name] = entries
    return counts


def main(argv: list[str] | None = None) -> int:
    """Print the counts; 0 when every one is within its budget, else 1."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--max-patterns", type=int, default=MAX_PATTERNS)
    parser.add_argument("--max-entries", type=int, default=MAX_ENTRIES)
    parser.add_argument("--max-words", type=int, default=MAX_WORDS)
    parser.add_argument("--root", type=Path, default=ROOT, help="the repository to count (default: this one)")
    args = parser.parse_args(argv)
    counts = count(args.root)
    for name, sites in counts.patterns.items():
        print(f"patterns {len(sites):4d}  {name}  ({', '.join(map(str, sites))})")
    for name, sections in counts.entries.items():
        print(f"entries  {sum(sections.values()):4d}  {name}  "
              f"({', '.join(f'{s} {n}' for s, n in sections.items())})")
    for name, found in counts.words.items():
        print(f"words    {sum(n for _, n in found):4d}  {name}  (lines {', '.join(str(line) for line, _ in found)})")
    print(f"patterns: {counts.total_patterns} (budget {args.max_patterns}); "
          f"data entries: {counts.total_entries} (budget {args.max_entries}); "
          f"hand-written word-list entries: {counts.total_words} (budget {args.max_words})")
    within = (counts.total_patterns <= args.max_patterns and counts.total_entries <= args.max_entries
              and counts.total_words <= args.max_words)
    return 0 if within else 1


if __name__ == "__main__":
    sys.exit(main())
