"""Corrections with the bundled model: is the current value answered, not the replaced one? (docs/benchmarks.md: Performance)

Sixteen correction cases, 8 in English and 8 in Chinese (dates, amounts, places, names).  Each is a record as a
compaction writes it (``app.memory.compaction.record``): a few statements of the person's, one of them replaced by
a later correction (``[replaced by turn N]``), the correction itself, and the turn range.  The prompt is what a turn
sends (``app.memory.context``: the system prompt, the record message, the question); the question asks for the
corrected value.  Each case is asked twice in the same run, with the same server and sampling (temperature 0,
seed 7, at most 48 tokens):

- **before**: the record message as it was rendered before (the stored summary as it is: the replaced line in
  place, marked ``[replaced by turn N]``, among the current ones; ``legacy_record_message``);
- **after**: ``app.memory.context.format_summary`` (the current lines only: the replaced line left out);
- **heading**: the replaced line after the current ones under a heading "Earlier values, replaced by a later turn
  (not current; ...)" (the other layout docs/benchmarks.md considers; ``heading_record_message``).

A case is *answered* when the answer holds the corrected value (any of its spellings) and not the replaced one.
Prints one line per case and the totals per language.  Not a test: the model's answers are data.

Usage::

    python -m bench.corrections                 # starts the bundled chat server on a free port
    python -m bench.corrections --url http://127.0.0.1:8089/v1
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from app.memory.context import RECORD_FOOTER, RECORD_HEADER, format_summary
from app.memory.record import FOOTER, HEADER, Record, RecordLine
from app.settings import Settings
from scripts import local_model

ROOT = Path(__file__).resolve().parent.parent

SEED = 7
MAX_TOKENS = 48


@dataclass(frozen=True)
class Case:
    """One correction: ``before`` (turn 2) replaced by ``after`` (turn 5); ``question`` asks for the value;
    ``new`` are the corrected value's spellings, ``old`` the replaced value's."""

    lang: str
    kind: str
    before: str
    after: str
    question: str
    new: tuple[str, ...]
    old: tuple[str, ...]


FILLER = {
    "en": ("Hi, I am Lin Wei and I organise things for our team.", "We are 12 people in the team.",
           "Please keep answers short."),
    "zh": ("你好，我是林伟，负责团队的安排。", "我们团队一共12个人。", "回答请简短一些。"),
}

CASES = [
    Case("en", "date", "The team dinner is on Friday 12 December.",
         "Actually, the team dinner moved to Tuesday 16 December.", "When is the team dinner?",
         ("16",), ("Friday", "12 December", "December 12")),
    Case("en", "amount", "The budget for the offsite is 900 EUR.",
         "Correction: the budget for the offsite is now 1200 EUR.", "What is the budget for the offsite?",
         ("1200", "1,200"), ("900",)),
    Case("en", "place", "The workshop venue is Hall 7 in Lyon.",
         "Actually, the workshop venue changed to the Grand Hotel in Geneva.", "Where is the workshop?",
         ("Geneva",), ("Lyon",)),
    Case("en", "name", "My manager is called Peter Novak.", "Sorry, my manager is actually called Petra Nowak.",
         "What is my manager's name?", ("Petra",), ("Peter", "Novak")),
    Case("en", "date", "My flight to Tokyo leaves on 3 March.", "Actually, my flight to Tokyo moved to 9 March.",
         "When does my flight to Tokyo leave?", ("9 March", "March 9"), ("3 March", "March 3")),
    Case("en", "amount", "The rent for the flat is 1500 dollars a month.",
         "Update: the rent for the flat went up to 1650 dollars a month.", "How much is the rent for the flat?",
         ("1650", "1,650"), ("1500", "1,500")),
    Case("en", "place", "We meet at the Blue Door cafe.", "Actually, we meet at the Red Lantern cafe instead.",
         "Where do we meet?", ("Red Lantern",), ("Blue Door",)),
    Case("en", "name", "The project is named Lumen.", "Actually, we renamed the project to Aurora.",
         "What is the project called?", ("Aurora",), ("Lumen",)),
    Case("zh", "date", "团队聚餐定在12月12日星期五。", "更正：团队聚餐改到12月16日星期二。", "团队聚餐是哪天？",
         ("16日", "16号"), ("12月12", "12日", "星期五")),
    Case("zh", "amount", "这次团建的预算是900欧元。", "更正：这次团建的预算改为1200欧元。", "团建的预算是多少？",
         ("1200",), ("900",)),
    Case("zh", "place", "研讨会的地点在里昂7号厅。", "更正：研讨会的地点改到日内瓦大酒店。", "研讨会在哪里？",
         ("日内瓦",), ("里昂",)),
    Case("zh", "name", "我的经理叫王建国。", "更正：我的经理其实叫李建华。", "我的经理叫什么名字？",
         ("李建华",), ("王建国",)),
    Case("zh", "date", "我去东京的航班是3月3日。", "更正：我去东京的航班改到3月9日了。", "我去东京的航班是哪天？",
         ("3月9", "9日", "9号"), ("3月3", "3日", "3号")),
    Case("zh", "amount", "房租每月1500元。", "更正：房租涨到每月1650元。", "房租每月多少钱？",
         ("1650",), ("1500",)),
    Case("zh", "place", "我们在蓝门咖啡馆见面。", "更正：我们改在红灯笼咖啡馆见面。", "我们在哪里见面？",
         ("红灯笼",), ("蓝门",)),
    Case("zh", "name", "项目名称叫流明。", "更正：项目改名为极光。", "项目叫什么名字？", ("极光",), ("流明",)),
]


def summary_of(case: Case) -> Record:
    """The record a compaction writes for the case's five turns (the replaced line marked)."""
    first, second, third = FILLER[case.lang]
    lines = (RecordLine("person", first, 1), RecordLine("person", case.before, 2, replaced_by=5),
             RecordLine("person", second, 3), RecordLine("person", third, 4), RecordLine("person", case.after, 5))
    return Record(1, 5, lines)


def legacy_record_message(record: Record) -> str:
    """The record message as rendered before: the whole record as text, between the record's delimiters."""
    return RECORD_HEADER + record.render() + RECORD_FOOTER


def heading_record_message(record: Record) -> str:
    """The current lines, then the replaced ones under their own heading, then the turn range."""
    current = [HEADER, *(line.render() for line in record.lines if not line.replaced_by)]
    replaced = [line.render() for line in record.lines if line.replaced_by]
    body = current + ["Earlier values, replaced by a later turn (not current; the line that replaced each is "
                      "above):"] + replaced + [FOOTER.format(first=record.first_turn, last=record.last_turn)]
    return RECORD_HEADER + "\n".join(body) + RECORD_FOOTER


def answered(case: Case, answer: str) -> bool:
    low = answer.lower()
    return any(v.lower() in low for v in case.new) and not any(v.lower() in low for v in case.old)


def ask(url: str, messages: list[dict]) -> str:
    body = json.dumps({"model": local_model.MODEL_NAME, "messages": messages, "temperature": 0, "seed": SEED,
                       "max_tokens": MAX_TOKENS}).encode()
    request = urllib.request.Request(url + "/chat/completions", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as resp:
        return json.loads(resp.read())["choices"][0]["message"]["content"] or ""


def start_server() -> tuple[subprocess.Popen, str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "scripts/model_server.py", "--role", "chat", "--port", str(port)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None  # stdout=PIPE
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            raise SystemExit("the bundled chat server did not start")
        if "ready at" in line:
            break
    return proc, f"http://127.0.0.1:{port}/v1"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="an OpenAI-compatible base URL serving the bundled model (default: start one)")
    parser.add_argument("--json", type=Path, metavar="PATH",
                        help="also write the totals as JSON: {cases: {lang: n}, answered: {layout: {lang: n}}}")
    args = parser.parse_args(argv)
    proc = None
    url = args.url
    if not url:
        proc, url = start_server()
    system = Settings().system_prompt
    totals: dict[tuple[str, str], int] = {}
    try:
        print(f"model {local_model.MODEL_NAME}, temperature 0, seed {SEED}, {os.cpu_count()} CPUs")
        print(f"{'lang':4} {'kind':6} {'before':>6} {'after':>6} {'heading':>7}  answers (before | after)")
        for case in CASES:
            summary = summary_of(case)
            results = {}
            for label, record in (("before", legacy_record_message(summary)), ("after", format_summary(summary)),
                                  ("heading", heading_record_message(summary))):
                answer = ask(url, [{"role": "system", "content": system}, {"role": "system", "content": record},
                                   {"role": "user", "content": case.question}])
                results[label] = (answered(case, answer), answer.replace("\n", " ")[:70])
                totals[(case.lang, label)] = totals.get((case.lang, label), 0) + results[label][0]
            print(f"{case.lang:4} {case.kind:6} {'yes' if results['before'][0] else 'no':>6} "
                  f"{'yes' if results['after'][0] else 'no':>6} {'yes' if results['heading'][0] else 'no':>7}  "
                  f"{results['before'][1]!r} | {results['after'][1]!r}")
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
    print()
    for lang in ("en", "zh"):
        n = sum(1 for c in CASES if c.lang == lang)
        print(f"{lang}: answered with the corrected value: before {totals[(lang, 'before')]}/{n}, "
              f"after {totals[(lang, 'after')]}/{n}, heading {totals[(lang, 'heading')]}/{n}")
    n = len(CASES)
    print("all: " + ", ".join(f"{label} {sum(v for (_, lab), v in totals.items() if lab == label)}/{n}"
                              for label in ("before", "after", "heading")))
    if args.json:
        cases = {lang: sum(1 for c in CASES if c.lang == lang) for lang in ("en", "zh")}
        answered_by = {label: {lang: totals.get((lang, label), 0) for lang in ("en", "zh")}
                       for label in ("before", "after", "heading")}
        args.json.write_text(json.dumps({"model": local_model.MODEL_NAME, "seed": SEED, "cases": cases,
                                         "answered": answered_by}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
