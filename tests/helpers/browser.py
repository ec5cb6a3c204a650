"""Steps on the chat page in a real browser (Playwright ``page`` objects; Debian's Chromium).

- ``wait_connected(page)``: the page's socket is connected; ``send(page, text)``: type a message and press Enter.
- ``last_bot(page)``: the last assistant bubble.
- ``send_and_wait(page, base, text)``: click Send and wait until the answer is complete (read through
  ``GET /api/chat/stats``, which ``stats(page, base)`` returns); ``until(page, expression)``: wait for a JS condition.
- ``OFFSITE_ANSWERS``: the fake model's answers for a conversation planning a team offsite in Lisbon.
"""

from __future__ import annotations

from tests.fixtures.streamed_chat import wait_for

MESSAGES = '[data-testid="message"]'

OFFSITE_ANSWERS = {
    "We are planning a team offsite in Lisbon for 12 people.":
        "Great: **Lisbon**, 12 people. Do you have dates and a budget in mind? Spring and early summer are "
        "pleasant there, the city is walkable, and a group of that size fits most workshop venues, so the "
        "main choices are the dates, the budget per person and whether you want to stay near the river.",
    "Dates are 3 to 5 June, and the budget is 9000 EUR.":
        "Noted: 3–5 June, 9000 EUR in total, so about 750 EUR per person.",
    "Find us a venue near the river, with a room for workshops.":
        "Look at venues in **Belém** or Cais do Sodré: both are by the river and rent workshop rooms.",
}


def wait_connected(page) -> None:
    """Wait until the page shows its socket as connected."""
    page.wait_for_selector('[data-testid="connection"][data-state="connected"]')


def send(page, text: str) -> None:
    """Type ``text`` into the message box and press Enter."""
    box = page.get_by_test_id("message-input")
    box.fill(text)
    box.press("Enter")  # Enter sends


def last_bot(page):
    """The last assistant message bubble (a Playwright locator)."""
    return page.locator(f'{MESSAGES}[data-role="assistant"]').last


def until(page, expression: str, arg=None) -> None:
    """Wait until the JS ``expression`` (a function of ``arg``) is truthy, polling every 50 ms."""
    page.wait_for_function(expression, arg=arg, polling=50)


def stats(page, base: str) -> dict:
    """``GET /api/chat/stats`` with the page's own cookies."""
    return page.request.get(base + "/api/chat/stats").json()


def send_and_wait(page, base: str, text: str) -> str:
    """Type and send a message; wait until its answer is complete in the page; returns the answer's id."""
    before = len(stats(page, base)["turns"])
    page.get_by_test_id("message-input").fill(text)
    page.get_by_test_id("send").click()
    turns = wait_for(lambda: (t := stats(page, base)["turns"]) and len(t) > before and t, 10,
                     message="the turn to finish")
    answer_id = turns[-1]["messageId"]
    until(page, "id => document.querySelector(`[data-message-id='${id}'] [data-testid=thumb-down]`)", answer_id)
    return answer_id
