"""The context meter and the inspector agree with what was sent, read from the page in a real browser
(Debian's Chromium driven by Playwright against the live app).

A thread whose oldest turns a real compaction folded, with folds shown two at a time
(``MEMORY_PROMPT_FOLD_STEP``) and recall for every text: the next prompt sends the record, a folded turn
word for word from the archive, the recent turn, a recalled excerpt and the question.  The meter's header is
the sum of its legend and equals the turn's prompt tokens, recall included; its summary figure covers the
record and the folded turn (the panel lists the record's lines).  The inspector shows every message the
model saw, before and after that turn's own fold.
"""

from __future__ import annotations

import pytest

from app.settings import MemoryLimits
from chat_support.fake_llm import Reply
from tests.helpers.browser import send_and_wait, stats, until

pytestmark = pytest.mark.browser

TURNS = ("My sister Ada lives in Porto and keeps bees.", "The venue is Hall 7.", "Bring the slides on Friday.",
         "Lunch is at noon.")
QUESTION = "Where does Ada live?"


def number(text: str) -> int:
    return int(text.replace(",", "").replace("\u202f", "").replace("\xa0", "").strip())


def meter_numbers(page) -> tuple[int, dict[str, int]]:
    """The meter's header figure and its legend, ``{label: tokens}``, as the page shows them."""
    head = page.locator("#context-meter strong").inner_text()
    legend = page.locator("#context-meter .legend li").evaluate_all(
        "items => items.map(li => [li.childNodes[1].textContent.trim(), li.querySelector('.legend-num').textContent])")
    return number(head.split("/")[0]), {label: number(value) for label, value in legend}


def inspector_items(page) -> list[tuple[str, bool, str]]:
    """``(origin, shows a text, text)`` of each inspector item."""
    return page.locator("#inspector .inspector-item").evaluate_all(
        "items => items.map(li => [li.dataset.origin, !li.querySelector('pre').classList.contains('muted'),"
        " li.querySelector('pre').textContent])")


def test_meter_header_is_the_sum_of_its_sections_and_the_inspector_survives_the_fold(make_live_app, app_settings,
                                                                                      fake_llm, browser_page):
    from app.compaction.service import run_compaction

    server = make_live_app(app_settings.with_overrides(
        compaction_strategy="extractive", limits=MemoryLimits(recent_turns=1), prompt_fold_step=2,
        recall_when="always"))
    fake_llm.default = lambda body: Reply(text=f"Answer about {body['messages'][-1]['content']} Good to know.",
                                          usage=None)
    page, base = browser_page, server.url
    page.goto(base + "/")
    page.wait_for_selector('[data-testid="connection"][data-state="connected"]')
    for text in TURNS:
        send_and_wait(page, base, text)
    services = server.app.extensions["chat"]
    thread_id = page.request.get(base + "/api/chat/thread").json()["threadId"]

    def fold():
        with server.app.app_context():
            outcome = run_compaction(services, thread_id, services.store.load(thread_id).version)
        assert outcome.outcome == "applied"

    fold()  # turns 1-3: the prompt shows the record up to turn 2 and turn 3 word for word
    until(page, "() => document.querySelectorAll('[data-testid=record-line]').length > 0")
    send_and_wait(page, base, QUESTION)
    turn = stats(page, base)["turns"][-1]
    sections = turn["sections"]
    assert sections["recall"] > 0 and sections["summary"] > 0
    until(page, "t => document.querySelector('#context-meter strong')?.textContent.startsWith(t)",
          arg=f"{turn['promptTokens']:,} / ")
    header, legend = meter_numbers(page)
    assert header == sum(legend.values()) == turn["promptTokens"] == sum(sections.values())
    assert legend == {"System": sections["system"], "Summary": sections["summary"], "Pins": 0,
                      "Recent turns": sections["recent"], "Recalled": sections["recall"],
                      "New input": sections["input"]}
    assert page.locator("#context-meter .meter-bar .seg").evaluate_all("s => s.map(e => e.dataset.section)") == \
        ["system", "summary", "recent", "recall", "input"]
    lines = page.locator("[data-testid=record-line]").evaluate_all("s => s.map(e => Number(e.dataset.turn))")
    assert lines and max(lines) == 3  # the lines listed: turns 1-3, all counted in the summary figure

    sent = [m["content"] for m in fake_llm.last_request().messages]
    page.locator("#inspector summary").click()
    until(page, "n => document.querySelectorAll('#inspector .inspector-item').length === n", len(sent))
    items = inspector_items(page)
    assert [origin for origin, _, _ in items] == ["system", "summary", "folded", "folded", "recent", "recent",
                                                  "recall", "input"]
    assert [(shown, text) for _, shown, text in items] == [(True, t) for t in sent]

    fold()  # the question's own fold (turn 4): the inspector still shows what the model saw
    until(page, "() => document.querySelector('[data-testid=meter-compacted]') !== null")
    until(page, "() => [...document.querySelectorAll('[data-testid=record-line]')].some(e => e.dataset.turn === '4')")
    until(page, "n => document.querySelectorAll('#inspector .inspector-item').length === n", len(sent))
    assert [(shown, text) for _, shown, text in inspector_items(page)] == [(True, t) for t in sent]
    assert page.errors == []
