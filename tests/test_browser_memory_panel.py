"""The memory panel in a real browser: Debian's Chromium driven by Playwright against the live app.

The context meter and the token chart update after each turn, pin and unpin work in
the memory panel, a thumbs-down is stored (read back from Redis), the inspector shows
what the model saw, and the panel is photographed into ``test-output/memory-panel-only.png``
(the docs' pictures come from ``tests/test_browser_memory_truth.py``).
"""

from __future__ import annotations

import re

import pytest

from app.observability.feedback import load_feedback
from app.settings import MemoryLimits
from chat_support.fake_llm import Reply
from tests.fixtures.streamed_chat import OUTPUT_DIR, wait_for
from tests.helpers.browser import OFFSITE_ANSWERS, send_and_wait, stats, until

pytestmark = pytest.mark.browser


def test_memory_panel_meter_chart_pins_feedback_and_screenshot(make_live_app, app_settings, fake_llm,
                                                                browser_page, redis_client):
    from app.compaction.service import run_compaction

    server = make_live_app(app_settings.with_overrides(compaction_strategy="extractive",
                                                       limits=MemoryLimits(recent_turns=2)))
    fake_llm.default = lambda body: Reply(text=OFFSITE_ANSWERS.get(body["messages"][-1]["content"], "Sure."),
                                          first_token_delay=0.05, usage=None)
    page = browser_page
    base = server.url
    page.goto(base + "/")
    page.wait_for_selector('[data-testid="connection"][data-state="connected"]')
    meter, chart = page.get_by_test_id("context-meter"), page.get_by_test_id("token-chart")
    # (the budget shows once the page's first stats request has answered)
    until(page, "() => document.querySelector('[data-testid=context-meter]').innerText.includes('budget')")
    assert meter.inner_text().strip() == "No turns yet · budget 7,168 tokens"
    assert chart.inner_text().strip() == "No turns yet."

    # ---- a turn: the meter shows its prompt tokens against the budget, the chart one bar
    texts = list(OFFSITE_ANSWERS)
    send_and_wait(page, base, texts[0])
    first = stats(page, base)["turns"][-1]
    until(page, "t => document.querySelector('#context-meter strong')?.textContent === t",
                           arg=f"{first['promptTokens']} / 7,168")
    assert page.locator("#token-chart svg g.bar").count() == 1
    assert page.locator("#context-meter .meter-bar .seg").evaluate_all("s => s.map(e => e.dataset.section)") == \
        ["system", "input"]

    # ---- a second turn: both update
    send_and_wait(page, base, texts[1])
    second = stats(page, base)["turns"][-1]
    assert second["promptTokens"] > first["promptTokens"]
    until(page, "t => document.querySelector('#context-meter strong')?.textContent === t",
                           arg=f"{second['promptTokens']} / 7,168")
    until(page, "() => document.querySelectorAll('#token-chart svg g.bar').length === 2")
    assert page.locator("#context-meter .meter-bar .seg").evaluate_all("s => s.map(e => e.dataset.section)") == \
        ["system", "recent", "input"]
    legend = page.locator("#context-meter .legend").inner_text()
    assert re.search(rf"Recent turns\s+{second['sections']['recent']}", legend)

    # ---- pin typed text, pin an answer, unpin
    pins = page.get_by_test_id("pin")
    page.get_by_test_id("pin-input").fill("Budget is 9000 EUR for 12 people")
    page.get_by_test_id("pin-add").click()
    until(page, "() => document.querySelectorAll('[data-testid=pin]').length === 1")
    assert pins.nth(0).inner_text().startswith("Budget is 9000 EUR for 12 people")
    answers = page.locator('[data-testid=message][data-role=assistant]')
    answers.nth(1).get_by_test_id("pin-message").click()
    until(page, "() => document.querySelectorAll('[data-testid=pin]').length === 2")
    thread = page.request.get(base + "/api/chat/thread").json()
    assert thread["pinnedDecisions"] == ["Budget is 9000 EUR for 12 people",
                                         "Noted: 3–5 June, 9000 EUR in total, so about 750 EUR per person."]
    pins.nth(0).get_by_test_id("unpin").click()
    until(page, "() => document.querySelectorAll('[data-testid=pin]').length === 1")
    assert page.request.get(base + "/api/chat/thread").json()["pinnedDecisions"] == [
        "Noted: 3–5 June, 9000 EUR in total, so about 750 EUR per person."]
    page.get_by_test_id("pin-input").fill("Venue must be near the river")
    page.get_by_test_id("pin-add").click()
    until(page, "() => document.querySelectorAll('[data-testid=pin]').length === 2")

    # ---- thumbs down with a reason: stored in Redis with the turn's accounting
    thread_id = thread["threadId"]
    first_answer = answers.nth(0)
    first_answer_id = first_answer.get_attribute("data-message-id")
    first_answer.get_by_test_id("thumb-down").click()
    wait_for(lambda: load_feedback(redis_client, thread_id), 5, message="the thumbs-down to be stored")
    until(page, "id => document.querySelector(`[data-message-id='${id}'] [data-testid=thumb-down]`)"
                ".getAttribute('aria-pressed') === 'true'", first_answer_id)
    first_answer.get_by_test_id("feedback-reason").filter(has_text="forgot something I said").click()
    wait_for(lambda: load_feedback(redis_client, thread_id)[0].get("reason"), 5, message="the reason")
    [entry] = load_feedback(redis_client, thread_id)
    assert entry["messageId"] == first_answer_id and entry["rating"] == "down"
    assert entry["reason"] == "forgot something I said"
    assert entry["turn"]["promptTokens"] == first["promptTokens"]
    assert entry["turn"]["sections"] == first["sections"]

    # ---- a third turn and a real compaction (folds the oldest turn): history and summary appear
    send_and_wait(page, base, texts[2])
    services = server.app.extensions["chat"]
    with server.app.app_context():
        outcome = run_compaction(services, thread_id, services.store.load(thread_id).version)
    assert outcome.outcome == "applied"
    until(page, "() => document.querySelectorAll('#compactions li.compaction').length === 1")
    assert "applied" in page.locator("#compactions li.compaction").inner_text()
    until(page, "() => !document.getElementById('summary').classList.contains('muted')")
    send_and_wait(page, base, "Which of the two is cheaper?")
    until(page, "() => document.querySelectorAll('#token-chart svg g.bar').length === 4")
    last = stats(page, base)["turns"][-1]
    assert last["sections"]["summary"] > 0 and last["sections"]["pins"] > 0
    until(page, "t => document.querySelector('#context-meter strong')?.textContent === t",
                           arg=f"{last['promptTokens']} / 7,168")

    # ---- the inspector: what the model saw for the last turn
    page.locator("#inspector summary").click()
    until(page, "() => document.querySelectorAll('#inspector .inspector-item').length > 0")
    origins = page.locator("#inspector .inspector-item").evaluate_all("s => s.map(e => e.dataset.origin)")
    assert origins[:3] == ["system", "summary", "pins"] and origins[-1] == "input"
    assert page.locator("#inspector .inspector-item").last.locator("pre").inner_text() == \
        "Which of the two is cheaper?"

    assert page.errors == []
    # the picture: the whole panel at the top of its scroll, without the transient toast
    page.set_viewport_size({"width": 1280, "height": 1500})
    page.get_by_test_id("memory-panel").evaluate("p => { p.scrollTop = 0; }")
    until(page, "() => document.getElementById('toast').hidden")
    OUTPUT_DIR.mkdir(exist_ok=True)
    shot = OUTPUT_DIR / "memory-panel-page.png"
    page.screenshot(path=str(shot), full_page=False)
    panel = OUTPUT_DIR / "memory-panel-only.png"
    page.get_by_test_id("memory-panel").screenshot(path=str(panel))
    assert shot.stat().st_size > 10_000 and panel.stat().st_size > 5_000
