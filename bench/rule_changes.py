"""What one rule group changes on the public data: texts whose kept statements change, facts the guard no longer
reads, texts read differently as decisions or corrections (docs/ablation.md: Decisions).

The ablation's measures say what a group *earns*; this says what it *does*, on every LoCoMo turn and KdConv
message (10,221 texts), so a group no measure can see is not mistaken for one that does nothing.  Each group is
switched off in a subprocess (``MEMORY_RULES_OFF``, app/memory/lexicon.py) and compared with the baseline.

Usage: ``python -m bench.rule_changes --data ../shared/data --groups forms.question,decision [--json PATH]``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def read_all(data: Path) -> dict[str, dict]:
    """Per text: kept statements, facts, and the decision / correction readings (this process's
    rules)."""
    from app.memory.compaction import forms
    from app.memory.compaction.facts import extract_facts, states_decision
    from app.memory.compaction.record import sentences, statement_sentences

    locomo = json.loads((data / "locomo10.json").read_text(encoding="utf-8"))
    kdconv = json.loads((data / "kdconv-sample.json").read_text(encoding="utf-8"))
    texts = [t["text"] for conv in locomo for key, session in conv["conversation"].items()
             if re.fullmatch(r"session_\d+", key) for t in session]
    texts += [m["message"] for conv in kdconv for m in conv["messages"]]
    out = {}
    for text in texts:
        parts = sentences(text)
        out[text] = {"kept": statement_sentences(text), "facts": extract_facts(text),
                     "decision": states_decision(text),
                     "correct": sum(map(forms.corrects, parts))}
    return out


def compare(base: dict[str, dict], other: dict[str, dict]) -> dict[str, int]:
    """Counts of texts (or facts) whose reading differs between two runs of ``read_all``."""
    return {
        "texts": len(base),
        "kept_changed": sum(base[t]["kept"] != other[t]["kept"] for t in base),
        "kept_lost": sum(len(set(base[t]["kept"]) - set(other[t]["kept"])) for t in base),
        "facts_lost": sum(len(set(base[t]["facts"]) - set(other[t]["facts"])) for t in base),
        "decision_changed": sum(base[t]["decision"] != other[t]["decision"] for t in base),
        "correct_changed": sum(base[t]["correct"] != other[t]["correct"] for t in base),
    }


def rules_env(group: str | None) -> dict[str, str]:
    """This process's environment with ``MEMORY_RULES_OFF`` set to ``group`` (removed when None)."""
    env = {k: v for k, v in os.environ.items() if k != "MEMORY_RULES_OFF"}
    if group:
        env["MEMORY_RULES_OFF"] = group
    return env


def read_with(group: str | None, module: str, flag: str, path: Path, *args: str) -> Any:
    """Run ``python -m module flag path *args`` with ``group`` switched off (``rules_env``) and return the JSON it
    wrote to ``path``.

    Raises:
        subprocess.CalledProcessError: the subprocess failed.
    """
    subprocess.run([sys.executable, "-m", module, flag, str(path), *args], cwd=ROOT, env=rules_env(group), check=True)
    return json.loads(path.read_text(encoding="utf-8"))


def _run(group: str | None, data: Path, path: Path) -> dict[str, dict]:
    return read_with(group, "bench.rule_changes", "--read", path, "--data", str(data))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--groups", default="", help="comma-separated rule groups")
    parser.add_argument("--json", type=Path, help="write the counts here too")
    parser.add_argument("--read", type=Path, help=argparse.SUPPRESS)  # one reading, in a subprocess
    args = parser.parse_args(argv)
    if args.read:
        args.read.write_text(json.dumps(read_all(args.data), ensure_ascii=False), encoding="utf-8")
        return 0
    groups = [g for g in args.groups.split(",") if g]
    results = {}
    with tempfile.TemporaryDirectory() as folder:
        base = _run(None, args.data, Path(folder) / "baseline.json")
        for group in groups:
            results[group] = compare(base, _run(group, args.data, Path(folder) / f"{group}.json"))
            print(group, results[group], flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
