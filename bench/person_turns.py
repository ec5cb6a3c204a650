"""Person turns for the paced benchmarks (``bench.long_conversation``, ``bench.browser_conversation``): real
English (LoCoMo) and Chinese (KdConv) turns of one side of each dialogue, mixed into one long conversation, read
from ``--data`` at run time (never committed), and the near-duplicate check of answers.

**Split.** Others tune the product on the *dev* part; the benchmarks draw from the *held-out* part by default:

- dev: LoCoMo conversations 1-3 (conv-26, conv-30, conv-41: docs/benchmarks.md's and ``bench.ablation``'s dev
  conversations) and the first half of each KdConv domain in the sample (film 0-33, music 67-100,
  travel 134-166);
- held-out: LoCoMo conversations 4-10 (conv-42 ... conv-50) and the second half of each KdConv domain
  (film 34-66, music 101-133, travel 167-199).

**Mixing.** A conversation alternates blocks: an English block is 3-8 consecutive first-speaker turns of one
LoCoMo conversation (from a random session on, continuing where the last block stopped), a Chinese block one
KdConv dialogue's first-side turns (even indices: the side that asks "你知道…吗？"), up to 10 of them.  The
choice of conversations, dialogues, block lengths and the first language follow the seed.
"""

from __future__ import annotations

import difflib
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

LOCOMO_FILE = "locomo10.json"
KDCONV_FILE = "kdconv-sample.json"
LOCOMO_DEV = range(0, 3)
KDCONV_DOMAINS = ((0, 67, "film"), (67, 134, "music"), (134, 200, "travel"))
SPLITS = ("held-out", "dev", "all")


@dataclass(frozen=True)
class PersonTurn:
    text: str
    lang: str  # "en" | "zh"
    source: str  # "conv-43 D3:5" or "kdconv-120 #4"


def default_data() -> Path:
    """``../shared/data`` beside the checkout (``/work/shared/data`` for ``/work/main``), or beside the folder
    of a worktree (``/work/wt/<name>`` -> ``/work/shared/data``)."""
    root = Path(__file__).resolve().parent.parent
    for candidate in (root.parent / "shared" / "data", root.parent.parent / "shared" / "data"):
        if (candidate / LOCOMO_FILE).exists():
            return candidate
    return root.parent / "shared" / "data"


def describe_split(split: str) -> str:
    if split == "dev":
        return "dev (LoCoMo conv-26/30/41; KdConv film 0-33, music 67-100, travel 134-166): what others tune on"
    if split == "held-out":
        return ("held-out (LoCoMo conversations 4-10; KdConv film 34-66, music 101-133, travel 167-199): "
                "not used for tuning")
    return "all (dev and held-out)"


def _read(path: Path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as exc:
        raise SystemExit(f"bench: cannot read {path}: {exc.strerror} (pass --data DIR)") from None


def _kdconv_indices(split: str, total: int) -> list[int]:
    out = []
    for start, end, _name in KDCONV_DOMAINS:
        half = start + (end - start) // 2
        if split in ("dev", "all"):
            out += list(range(start, half))
        if split in ("held-out", "all"):
            out += list(range(half, end))
    return [i for i in out if i < total]


def _locomo_sessions(record: dict) -> list[list[PersonTurn]]:
    conv = record["conversation"]
    speaker = conv["speaker_a"]
    numbers = sorted(int(k.split("_")[1]) for k in conv if k.startswith("session_") and k.count("_") == 1)
    sessions = []
    for n in numbers:
        turns = []
        for u in conv[f"session_{n}"]:
            if u.get("speaker") != speaker:
                continue
            text = " ".join(str(u.get("text") or "").split())
            caption = " ".join(str(u.get("blip_caption") or "").split())
            if caption:
                text = f"{text} [shares a photo: {caption}]".strip()
            if text:
                turns.append(PersonTurn(text, "en", f"{record.get('sample_id')} {u.get('dia_id')}"))
        if turns:
            sessions.append(turns)
    return sessions


def _kdconv_turns(record: dict, index: int) -> list[PersonTurn]:
    out = []
    for i, m in enumerate(record.get("messages") or []):
        text = " ".join(str(m.get("message") or "").split())
        if i % 2 == 0 and text:
            out.append(PersonTurn(text, "zh", f"kdconv-{index} #{i}"))
    return out


class TurnSource:
    """Mixed English and Chinese person turns of ``split``, drawn with ``rng``; every text is used at most once
    per source (``conversation`` calls share the pool, so conversations of one run never repeat a text)."""

    def __init__(self, data_dir: Path, split: str, rng: random.Random):
        if split not in SPLITS:
            raise SystemExit(f"bench: --split must be one of {', '.join(SPLITS)}")
        locomo = _read(data_dir / LOCOMO_FILE)
        kdconv = _read(data_dir / KDCONV_FILE)
        dev = [r for i, r in enumerate(locomo) if i in LOCOMO_DEV]
        held = [r for i, r in enumerate(locomo) if i not in LOCOMO_DEV]
        records = dev if split == "dev" else held if split == "held-out" else locomo
        self.rng = rng
        self.english = [s for r in records for s in [_locomo_sessions(r)] if s]
        rng.shuffle(self.english)
        self.chinese = [(i, kdconv[i]) for i in _kdconv_indices(split, len(kdconv))]
        rng.shuffle(self.chinese)
        self._en_pos: list[tuple[int, int]] = []  # per English record: (session, turn) to continue from
        for sessions in self.english:
            self._en_pos.append((rng.randrange(max(len(sessions) // 2, 1)), 0))
        self._en_next = 0

    def _english_block(self, n: int) -> list[PersonTurn]:
        for _ in range(len(self.english)):
            k = self._en_next % len(self.english)
            sessions = self.english[k]
            s, t = self._en_pos[k]
            out: list[PersonTurn] = []
            while len(out) < n and s < len(sessions):
                out.append(sessions[s][t])
                t += 1
                if t >= len(sessions[s]):
                    s, t = s + 1, 0
            self._en_pos[k] = (s, t)
            if out:
                return out
            self._en_next += 1
        raise SystemExit("bench: the English turns of this split are used up")

    def _chinese_block(self, n: int) -> list[PersonTurn]:
        while self.chinese:
            index, record = self.chinese.pop()
            out = _kdconv_turns(record, index)[:n]
            if out:
                return out
        raise SystemExit("bench: the Chinese dialogues of this split are used up")

    def conversation(self, turns: int, languages: str = "mixed") -> list[PersonTurn]:
        """``turns`` person turns: ``mixed`` blocks of English and Chinese, or ``en`` / ``zh`` only."""
        out: list[PersonTurn] = []
        english = languages == "en" or (languages == "mixed" and self.rng.random() < 0.5)
        self._en_next = self.rng.randrange(len(self.english))
        while len(out) < turns:
            if english:
                out += self._english_block(self.rng.randint(3, 8))
            else:
                out += self._chinese_block(10)
            if languages == "mixed":
                english = not english
        return out[:turns]


def similarity(a: str, b: str) -> float:
    """difflib's ratio of two answers after folding whitespace and case (1.0: the same text)."""
    a, b = " ".join(a.split()).lower(), " ".join(b.split()).lower()
    if not a or not b:
        return 0.0
    m = difflib.SequenceMatcher(None, a, b, autojunk=False)
    for bound in (m.real_quick_ratio, m.quick_ratio):  # upper bounds: cheap ways out for different texts
        if (upper := bound()) < 0.5:
            return upper
    return m.ratio()


def repeats(answers: list[str], threshold: float) -> list[tuple[int, float] | None]:
    """For each answer, the earlier answer (index) it nearly repeats (similarity >= ``threshold``) and the ratio."""
    out: list[tuple[int, float] | None] = []
    for i, text in enumerate(answers):
        best: tuple[int, float] | None = None
        for j in range(i):
            r = similarity(text, answers[j])
            if r >= threshold and (best is None or r > best[1]):
                best = (j, r)
        out.append(best)
    return out


def pct(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) by nearest rank; 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]
