"""The command-line options the paced benchmarks share (``bench.long_conversation``, ``bench.browser_conversation``):
the person turns they send (``bench.person_turns``), the bound on one turn, and the local stack they start
(``bench.stack``).  Each benchmark adds its own options to the parser this returns.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.person_turns import SPLITS, default_data


def paced_parser(doc: str, *, turns: int, pause: tuple[float, float],
                 floor_sample_help: str) -> argparse.ArgumentParser:
    """A parser described by the first paragraph of ``doc`` with the shared options:

    - the person turns: ``--data`` (folder of the public data), ``--split``, ``--seed`` (default: a fresh one),
      ``--turns`` (default ``turns``), ``--pause LOW HIGH`` (seconds between turns, default ``pause``),
      ``--languages``, ``--floor-sample`` (``floor_sample_help`` says what 0 means), ``--dup-ratio`` (the
      similarity at which two answers count as near-duplicates);
    - the run: ``--timeout`` (seconds: the benchmark's bound on one turn, not the product's);
    - the stack: ``--skip`` (Procfile.dev processes not to start), ``--env KEY=VALUE`` (repeatable),
      ``--keep-logs`` (folder to copy the processes' logs to).
    """
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=default_data())
    parser.add_argument("--split", choices=SPLITS, default="held-out")
    parser.add_argument("--seed", type=int, default=None, help="default: a fresh one, printed")
    parser.add_argument("--turns", type=int, default=turns)
    parser.add_argument("--pause", type=float, nargs=2, default=pause, metavar=("LOW", "HIGH"))
    parser.add_argument("--languages", choices=("mixed", "en", "zh"), default="mixed")
    parser.add_argument("--floor-sample", type=int, default=0, help=floor_sample_help)
    parser.add_argument("--dup-ratio", type=float, default=0.85)
    parser.add_argument("--timeout", type=float, default=600.0, help="bench bound on one turn (not the product's)")
    parser.add_argument("--skip", default="", help="Procfile.dev processes not to start, e.g. flower")
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                        help="a setting the product does not ship (not for the real case)")
    parser.add_argument("--keep-logs", type=Path, default=None, help="copy the processes' logs to this folder")
    return parser
