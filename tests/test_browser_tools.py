"""The page with a tool call: its card shows while the answer streams; after a reload only the final answer is there.

Debian's Chromium driven by Playwright (never a downloaded browser); screenshots go to ``test-output/``.
"""

from __future__ import annotations

import pytest

from chat_support.fake_llm import Reply, split_tokens
from tests.fixtures.streamed_chat import OUTPUT_DIR
from tests.helpers.tool_scripts import has_tool_results, script_tasklist

pytestmark = pytest.mark.browser

ANSWER = "Twelve times twelve is 144, as the calculator confirms."


def test_tool_card_shows_while_streaming_and_only_the_answer_survives_a_reload(browser_page, live_app, fake_llm):
    page = browser_page
    fake_llm.add_rule(Reply(tool_calls=[{"id": "call_b1", "name": "calculator", "arguments": {"expression": "12*12"}}]),
                      when=lambda b: not has_tool_results(b), times=1)
    fake_llm.add_rule(Reply(tokens=split_tokens(ANSWER), first_token_delay=0.3, token_delay=0.25),
                      when=has_tool_results, times=1)

    page.goto(live_app.url + "/")
    page.wait_for_selector('[data-testid="connection"][data-state="connected"]')
    assert page.locator('[data-testid="tools-off"]').count() == 0
    page.fill('[data-testid="message-input"]', "What is 12 times 12?")
    page.press('[data-testid="message-input"]', "Enter")

    card = page.locator('[data-testid="tool-card"]')
    card.wait_for(state="visible")
    page.wait_for_selector('[data-testid="tool-card"][data-status="finished"]')
    bot = page.locator('[data-testid="message"][data-role="assistant"]').last
    # the answer is still streaming while the card is shown
    page.wait_for_function("""() => {
        const bot = [...document.querySelectorAll('[data-testid="message"][data-role="assistant"]')].pop();
        return bot && bot.classList.contains('streaming') && bot.querySelector('.content').textContent.includes('Twelve');
    }""")
    assert "streaming" in bot.get_attribute("class")
    assert card.count() == 1
    assert card.locator(".tool-name").inner_text() == "calculator"
    assert card.locator(".tool-status").inner_text() == "done"
    card.locator("summary").click()
    body = card.locator(".tool-body").inner_text()
    assert '"expression": "12*12"' in body and "144" in body
    OUTPUT_DIR.mkdir(exist_ok=True)
    page.screenshot(path=str(OUTPUT_DIR / "tool-card-streaming.png"), full_page=True)

    page.wait_for_function("""(answer) => {
        const bot = [...document.querySelectorAll('[data-testid="message"][data-role="assistant"]')].pop();
        return bot && !bot.classList.contains('streaming') && bot.textContent.includes(answer);
    }""", arg=ANSWER)

    page.reload()
    page.wait_for_selector('[data-testid="connection"][data-state="connected"]')
    page.wait_for_function("document.querySelectorAll('[data-testid=\"message\"]').length === 2")
    messages = page.locator('[data-testid="message"]')
    assert [messages.nth(i).get_attribute("data-role") for i in range(2)] == ["user", "assistant"]
    assert messages.nth(0).locator(".content").inner_text() == "What is 12 times 12?"
    assert messages.nth(1).locator(".content").inner_text() == ANSWER
    assert page.locator('[data-testid="tool-card"]').count() == 0
    assert "12*12" not in page.locator('[data-testid="messages"]').inner_text()
    page.screenshot(path=str(OUTPUT_DIR / "tool-card-after-reload.png"), full_page=True)
    assert page.errors == []


def test_paused_task_list_is_marked_unsaved_and_after_a_reload_only_goal_and_summary_remain(
        browser_page, live_app, fake_llm):
    page = browser_page
    script_tasklist(fake_llm, confirm=(1,), summary="The picnic plan is ready.")
    page.goto(live_app.url + "/")
    page.wait_for_selector('[data-testid="connection"][data-state="connected"]')
    page.fill('[data-testid="message-input"]', "/tasklist Plan a picnic for Saturday")
    page.press('[data-testid="message-input"]', "Enter")
    page.wait_for_selector('[data-testid="message"][data-role="assistant"][data-status="paused"]')
    bot = page.locator('[data-testid="message"][data-role="assistant"]').last
    assert bot.locator(".note").inner_text() == "waiting for your confirmation — not saved yet"
    assert "Task 2 needs your confirmation" in bot.locator(".content").inner_text()
    assert bot.locator('[data-testid="progress"] li').all_inner_texts() == ["plan", "task 1/2", "waiting"]
    page.screenshot(path=str(OUTPUT_DIR / "tasklist-paused.png"), full_page=True)

    page.fill('[data-testid="message-input"]', "yes")
    page.press('[data-testid="message-input"]', "Enter")
    # completed: the bubble says so until the page re-renders it from memory a moment later (then it is saved)
    page.wait_for_function("""(answer) => {
        const bot = [...document.querySelectorAll('[data-testid="message"][data-role="assistant"]')].pop();
        return bot && bot.textContent.includes(answer)
            && (bot.dataset.status === "completed" || bot.dataset.saved === "1");
    }""", arg="The picnic plan is ready.")
    page.reload()
    page.wait_for_selector('[data-testid="connection"][data-state="connected"]')
    page.wait_for_function("document.querySelectorAll('[data-testid=\"message\"]').length === 2")
    assert page.locator('[data-testid="message"] .content').all_inner_texts() == [
        "Plan a picnic for Saturday", "The picnic plan is ready."]
    assert page.locator('[data-testid="progress"]').count() == 0
    page.screenshot(path=str(OUTPUT_DIR / "tasklist-after-reload.png"), full_page=True)
    assert page.errors == []
