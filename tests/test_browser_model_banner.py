"""The page says when the model is down (docs/memory.md: Identity and degradation): a banner from ``GET /healthz``.

Debian's Chromium through Playwright against the live app and the fake model server, which is stopped
(a real server closing its port) and started again on the same port.  A screenshot goes to ``test-output/``.
"""

from __future__ import annotations

import pytest

from chat_support.fake_llm import Reply
from tests.fixtures.streamed_chat import OUTPUT_DIR
from tests.helpers.browser import last_bot, send, wait_connected

pytestmark = pytest.mark.browser

BANNER = '[data-testid="model-banner"]'


def test_model_banner_shows_while_the_model_is_down_and_goes_away_when_it_is_back(browser_page, live_app,
                                                                                  fake_llm):
    page = browser_page
    fake_llm.default = Reply(text="The model answers.")
    page.goto(live_app.url + "/")
    wait_connected(page)
    page.wait_for_selector(BANNER, state="hidden")

    fake_llm.stop()
    send(page, "is anyone there?")
    page.get_by_test_id("chat-error").wait_for()
    page.wait_for_selector(BANNER, state="visible", timeout=25_000)  # the app caches its probe for 5 s
    assert page.locator(BANNER).inner_text() == ("The model is not answering right now, so messages will fail. "
                                                 "This page checks again every few seconds.")
    OUTPUT_DIR.mkdir(exist_ok=True)
    page.screenshot(path=str(OUTPUT_DIR / "model-banner.png"))

    fake_llm.start()  # the same port
    page.wait_for_selector(BANNER, state="hidden", timeout=25_000)
    send(page, "and now?")
    # The streamed bubble is "completed" only until the page re-renders the thread from the server, which may
    # come before a poll sees it: wait for the answer as memory holds it (the failed turn was never saved).
    page.locator('[data-testid="message"][data-role="assistant"][data-saved="1"]').last.wait_for(timeout=30_000)
    assert last_bot(page).locator(".content").inner_text().strip() == "The model answers."
    assert page.errors == []
