"""Count the memory domain's regular-expression sites and hand-written word lists (README: Memory rules).

A regular-expression site is a call of ``re``/``regex``'s ``compile``, ``search``, ``match``, ``fullmatch``,
``sub``, ``subn``, ``split``, ``findall`` or ``finditer`` in a module of ``app/memory``.  A hand-written word
list is a literal collection of five or more strings, or a string literal split into words
(a literal string's ``.split()``); its entries are counted.  The data files (``app/memory/data``) are not code and
are not counted.

Usage: ``python scripts/rule_budget.py [--max-regex 30] [--max-words 200]``; exits 1 over either budget.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REGEX_CALLS = {"compile", "search", "match", "fullmatch", "sub", "subn", "split", "findall", "finditer"}
MIN_LIST = 5


def regex_sites(tree: ast.AST) -> list[int]:
    """Line numbers of the regular-expression sites of one module."""
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name) and node.func.value.id in ("re", "regex")
            and node.func.attr in REGEX_CALLS]


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


def count(root: Path = ROOT) -> tuple[dict[str, list[int]], dict[str, list[tuple[int, int]]]]:
    """Regex sites and word lists per module of ``root`` (paths relative to the repository)."""
    sites, lists = {}, {}
    for path in sorted((root / "app" / "memory").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        name = str(path.relative_to(root))
        if found := regex_sites(tree):
            sites[name] = found
        if found_lists := word_lists(tree):
            lists[name] = found_lists
    return sites, lists


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-regex", type=int, default=30)
    parser.add_argument("--max-words", type=int, default=200)
    parser.add_argument("--root", type=Path, default=ROOT, help="the repository to count (default: this one)")
    args = parser.parse_args(argv)
    sites, lists = count(args.root)
    total_sites = sum(len(v) for v in sites.values())
    total_words = sum(n for v in lists.values() for _, n in v)
    for name, lines in sites.items():
        print(f"regex  {len(lines):3d}  {name}  (lines {', '.join(map(str, lines))})")
    for name, found in lists.items():
        print(f"words  {sum(n for _, n in found):3d}  {name}  (lines {', '.join(str(line) for line, _ in found)})")
    print(f"regular-expression sites: {total_sites} (budget {args.max_regex}); "
          f"hand-written word-list entries: {total_words} (budget {args.max_words})")
    return 0 if total_sites <= args.max_regex and total_words <= args.max_words else 1


if __name__ == "__main__":
    sys.exit(main())
