"""The page and a turn's clock: Debian's Chromium driven by Playwright against the live app and the fake model.

- Each of the person's messages that memory holds shows its memory turn number (the one ``done`` gave); a turn
  that failed after text was shown says so plainly and its message is marked "not saved — not a turn of memory",
  so the numbers shown count exactly the messages memory kept (docs/contract.md: the done frame, "Turn numbers").
- A turn whose first token waits behind another visitor's says why, with the seconds elapsed.
- An answer that ends at its token limit is kept, with a quiet note.
"""

from __future__ import annotations

import pytest

from chat_support.fake_llm import Reply, split_tokens, wait_events, words
from tests.fixtures.streamed_chat import OUTPUT_DIR
from tests.helpers.browser import until

pytestmark = pytest.mark.browser

MESSAGES = '[data-testid="message"]'
USER = f'{MESSAGES}[data-role=user]'


def send(page, text: str) -> None:
    page.get_by_test_id("message-input").fill(text)
    page.get_by_test_id("send").click()


def settled(page, count: int) -> None:
    """Wait until the page holds ``count`` answers and none is streaming."""
    until(page, "n => document.querySelectorAll('[data-role=assistant]').length === n && "
                "!document.querySelector('.streaming')", count)


def person_notes(page) -> list[tuple[str, str]]:
    """``(turn number shown, note)`` under each of the person's messages, in order."""
    return [tuple(x) for x in page.eval_on_selector_all(USER, """els => els.map(e => [
        e.querySelector('[data-testid=turn-number]')?.textContent || '',
        e.querySelector('.msg-foot .note')?.textContent || ''])""")]


def test_turn_numbers_agree_with_what_the_person_sent(make_live_app, app_settings, fake_llm, browser_page):
    server = make_live_app(app_settings.with_overrides(llm_first_token_timeout=4.0, llm_token_gap_timeout=1.0))
    page, base = browser_page, server.url
    page.goto(base + "/")
    page.wait_for_selector('[data-testid="connection"][data-state="connected"]')

    fake_llm.default = Reply(text="First answer.")
    send(page, "one")
    settled(page, 1)
    until(page, "() => document.querySelector('[data-role=user] [data-testid=turn-number]')")

    # ---- text, then silence past the gap limit: the turn fails plainly, the part shown stays, marked
    fake_llm.default = Reply(tokens=words(8), token_delay=0.05, stall_after=3, stall_max=30)
    send(page, "two")
    until(page, "() => [...document.querySelectorAll('[data-role=assistant]')].pop().dataset.status === 'failed'")
    bot = page.locator(f'{MESSAGES}[data-role=assistant]').last
    assert bot.locator(".content").inner_text().strip() == "".join(words(3)).strip()
    assert bot.locator(".msg-foot .note").inner_text() == "failed — not saved"
    assert page.get_by_test_id("chat-error").last.inner_text() == \
        "The model stopped answering: no text for 1 s. The part shown was not saved."

    # ---- the next first token waits behind another visitor's turn: the page says so, counting seconds
    fake_llm.default = Reply(tokens=split_tokens("Second kept answer."), first_token_delay=2.5,
                             before_first=wait_events(2.5, 0.5))
    send(page, "three")
    until(page, "() => /^waiting for the model… [0-9] s — it is answering another visitor first$/"
                ".test(document.querySelector('[data-testid=waiting]')?.textContent || '')")
    settled(page, 3)

    # ---- an answer that reaches its token limit is kept, with a quiet note
    fake_llm.default = Reply(tokens=words(6), finish_reason="length")
    send(page, "four")
    settled(page, 4)
    until(page, "() => document.querySelectorAll('[data-role=assistant][data-saved=\"1\"]').length === 3")
    until(page, "() => document.querySelectorAll('[data-role=user] [data-testid=turn-number]').length === 3")
    assert person_notes(page) == [("turn 1", ""), ("", "not saved — not a turn of memory"), ("turn 2", ""),
                                  ("turn 3", "")]
    last = page.locator(f'{MESSAGES}[data-role=assistant]').last
    assert last.locator(".msg-foot .note").inner_text() == "reached the length limit"
    stored = page.request.get(base + "/api/chat/thread").json()["messages"]
    assert [m["text"] for m in stored if m["role"] == "user"] == ["one", "three", "four"]
    OUTPUT_DIR.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(OUTPUT_DIR / "turn-numbers.png"))
    assert page.errors == []
