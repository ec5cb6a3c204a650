"""Forget and provenance in a real browser: Debian's Chromium driven by Playwright against the live app.

A summary line opens the turn it came from (GET /api/chat/turns/<n>, shown as plain text) and forgets it;
"Forget this" in a message's menu forgets that turn and names the pins that quote it; "Forget everything
about…" previews by place and forgets only the checked turns; the thread downloads as JSON and as
Markdown; the panel says which turns the archive no longer keeps (docs/contract.md: HTTP).  A forget reaches
every open tab of the session (a memory frame); New chat clears every notice and the old conversation's history;
the turn and forget dialogs open at their top; the history's forget entry names its turn.
"""

from __future__ import annotations

import json

import pytest

from app.settings import MemoryLimits
from chat_support.fake_llm import Reply
from tests.fixtures.streamed_chat import OUTPUT_DIR
from tests.helpers.browser import send_and_wait, until, wait_connected

pytestmark = pytest.mark.browser

# A long answer, so that folding a turn frees enough tokens for the extractive compaction to write.
ANSWER = ("Sure. Here is a longer answer so that the turn is worth folding: the city is walkable, trains are "
          "frequent, the weather in June is mild, most venues rent rooms by the half day, and lunch is best "
          "booked a week ahead for a group. Tell me what else you need and I will keep it in mind.")


def start(make_live_app, app_settings, fake_llm, page, **limits):
    """A live app answering ANSWER to everything; the page open and connected. Returns the base URL and server."""
    overrides = {"compaction_strategy": "extractive"}
    if limits:
        overrides["limits"] = MemoryLimits(**limits)
    server = make_live_app(app_settings.with_overrides(**overrides))
    fake_llm.default = lambda body: Reply(text=ANSWER, first_token_delay=0.01, usage=None)
    page.goto(server.url + "/")
    wait_connected(page)
    return server.url, server


def compact(page, server) -> str:
    """Run one real compaction of the page's thread; returns its outcome."""
    from app.compaction.service import run_compaction

    thread_id = page.request.get(server.url + "/api/chat/thread").json()["threadId"]
    services = server.app.extensions["chat"]
    with server.app.app_context():
        return run_compaction(services, thread_id, services.store.load(thread_id).version).outcome


def turn(page, base, n) -> dict:
    """GET /api/chat/turns/<n> with the page's cookies (status and body)."""
    r = page.request.get(f"{base}/api/chat/turns/{n}")
    return {"status": r.status, **r.json()}


def confirm(page) -> None:
    """Say yes in the page's confirm dialog."""
    until(page, "() => document.getElementById('confirm-dialog').open")
    page.get_by_test_id("confirm-ok").click()
    until(page, "() => !document.getElementById('confirm-dialog').open")


def texts(page, role: str) -> list[str]:
    """The texts of the conversation's bubbles of ``role``, in order."""
    return page.locator(f'[data-testid=message][data-role={role}] .content').all_inner_texts()


def test_a_summary_line_opens_its_turn_as_plain_text_and_forgets_it(make_live_app, app_settings, fake_llm,
                                                                     browser_page):
    page = browser_page
    base, server = start(make_live_app, app_settings, fake_llm, page, recent_turns=2)
    planted = "My locker code is zebracorn 4471 <b>bold</b>."
    send_and_wait(page, base, planted)
    send_and_wait(page, base, "We are planning a team offsite in Lisbon for 12 people.")
    send_and_wait(page, base, "Find us a venue near the river, with a room for workshops.")
    assert compact(page, server) == "applied"
    send_and_wait(page, base, "What should we book first?")
    page.reload()
    wait_connected(page)

    # ---- the summary's line of turn 1 opens turn 1: where it lives, the person's text and the answer, inert
    until(page, "() => document.querySelector('[data-testid=record-line][data-turn=\"1\"]')")
    page.locator("#record-details > summary").click()
    line = page.locator('[data-testid=record-line][data-turn="1"]').first
    assert "zebracorn" in line.inner_text()
    line.get_by_test_id("line-source").click()
    until(page, "() => document.getElementById('turn-dialog').open")
    dialog = page.get_by_test_id("turn-dialog")
    assert page.locator("#turn-dialog-title").inner_text() == "Turn 1"
    assert dialog.get_by_test_id("turn-where").inner_text() == \
        "Folded into the summary; the turn itself is kept in the archive."
    assert dialog.get_by_test_id("turn-message").evaluate_all(
        "ms => ms.map(m => [m.dataset.role, m.querySelector('.turn-text').textContent])") == \
        [["user", planted], ["assistant", ANSWER]]
    assert dialog.locator("b").count() == 0  # stored text is shown as text, never as HTML
    page.screenshot(path=str(OUTPUT_DIR / "forget-turn-dialog.png"))
    assert turn(page, base, 1)["where"] == "archive"
    dialog.get_by_test_id("turn-dialog-close").click()
    until(page, "() => !document.getElementById('turn-dialog').open")

    # ---- the inspector's summary names the turn too: "turn 1" opens it
    page.locator("#inspector summary").click()
    until(page, "() => document.querySelector('#inspector [data-testid=turn-ref][data-turn=\"1\"]')")
    page.locator('#inspector [data-testid=turn-ref][data-turn="1"]').first.click()
    until(page, "() => document.getElementById('turn-dialog').open")
    assert page.locator("#turn-dialog-title").inner_text() == "Turn 1"
    dialog.get_by_test_id("turn-dialog-close").click()

    page.get_by_test_id("record-details").screenshot(path=str(OUTPUT_DIR / "forget-record-lines.png"))
    # ---- forget it from the line: asked first (the question quotes the turn), then gone everywhere
    line.get_by_test_id("line-forget").click()
    until(page, "() => document.getElementById('confirm-dialog').open")
    assert planted in page.locator("#confirm-quote").inner_text()
    assert page.locator("#confirm-text").inner_text().startswith("Forget turn 1?")
    confirm(page)
    until(page, "() => !document.getElementById('forget-result').hidden")
    assert page.get_by_test_id("forget-result").inner_text() == "Turn 1 was forgotten."
    gone = turn(page, base, 1)
    assert (gone["status"], gone["where"], gone["reason"], gone["messages"]) == (200, "gone", "forgotten", [])
    until(page, "() => !document.getElementById('messages').textContent.includes('zebracorn')")
    until(page, "() => !document.getElementById('memory-panel').querySelector('#record-lines')"
                ".textContent.includes('zebracorn')")
    assert "zebracorn" not in page.locator("#summary").inner_text()
    assert "zebracorn" not in json.dumps(page.request.get(base + "/api/chat/thread").json())
    assert texts(page, "user") == ["We are planning a team offsite in Lisbon for 12 people.",
                                   "Find us a venue near the river, with a room for workshops.",
                                   "What should we book first?"]
    assert page.errors == []


def test_forget_this_in_a_message_menu_names_the_pins_that_quote_it(make_live_app, app_settings, fake_llm,
                                                                     browser_page):
    page = browser_page
    base, _ = start(make_live_app, app_settings, fake_llm, page)
    send_and_wait(page, base, "First: the budget is 9000 EUR.")
    secret = "Second: my password is hunter2zebra."
    send_and_wait(page, base, secret)
    send_and_wait(page, base, "Third: we travel by train.")
    users = page.locator("[data-testid=message][data-role=user]")
    users.nth(1).get_by_test_id("pin-message").click()  # the person pins their own message: it quotes the turn
    until(page, "() => document.querySelectorAll('[data-testid=pin]').length === 1")

    # the bubbles were added by this page (no reload): the turn is found by position and checked by id
    users.nth(1).get_by_test_id("message-menu").locator("summary").click()
    page.screenshot(path=str(OUTPUT_DIR / "forget-message-menu.png"))
    users.nth(1).get_by_test_id("forget-message").click()
    until(page, "() => document.getElementById('confirm-dialog').open")
    assert page.locator("#confirm-text").inner_text().startswith("Forget turn 2?")
    assert secret in page.locator("#confirm-quote").inner_text()
    confirm(page)
    until(page, "() => !document.getElementById('forget-result').hidden")
    assert page.get_by_test_id("forget-result").inner_text() == (
        "Turn 2 was forgotten. Your pin 1 quotes what was forgotten; it stays until you unpin it.")
    until(page, "() => !document.getElementById('messages').textContent.includes('hunter2zebra')")
    assert texts(page, "user") == ["First: the budget is 9000 EUR.", "Third: we travel by train."]
    thread = page.request.get(base + "/api/chat/thread").json()
    assert [m["text"] for m in thread["messages"] if m["role"] == "user"] == \
        ["First: the budget is 9000 EUR.", "Third: we travel by train."]
    assert thread["pinnedDecisions"] == [secret]  # pins are the person's: never removed by a forget
    assert turn(page, base, 2)["reason"] == "forgotten"
    assert turn(page, base, 3)["messages"][0]["text"] == "Third: we travel by train."

    # after a reload the numbers come from memory: "Forget this" on the last answer forgets turn 3, not 2
    page.reload()
    wait_connected(page)
    until(page, "() => document.querySelectorAll('[data-testid=message][data-role=assistant]').length === 2")
    answer = page.locator("[data-testid=message][data-role=assistant]").nth(1)
    answer.get_by_test_id("message-menu").locator("summary").click()
    answer.get_by_test_id("forget-message").click()
    until(page, "() => document.getElementById('confirm-dialog').open")
    assert page.locator("#confirm-text").inner_text().startswith("Forget turn 3?")
    page.get_by_test_id("confirm-cancel").click()  # no: nothing is forgotten
    until(page, "() => !document.getElementById('confirm-dialog').open")
    assert turn(page, base, 3)["where"] == "recent"
    assert page.errors == []


def test_forget_everything_about_a_phrase_previews_by_place_and_forgets_the_checked_turns(
        make_live_app, app_settings, fake_llm, browser_page):
    page = browser_page
    base, _ = start(make_live_app, app_settings, fake_llm, page)
    send_and_wait(page, base, "The secret word is marmalade.")
    send_and_wait(page, base, "Tell me about trains.")
    send_and_wait(page, base, "Again, MARMALADE please.")

    page.get_by_test_id("forget-find").click()  # blank: said, nothing asked of the server
    assert page.get_by_test_id("forget-error").inner_text() == "Type what to forget."

    page.get_by_test_id("forget-phrase").fill("Marmalade")
    page.get_by_test_id("forget-find").click()
    until(page, "() => document.querySelectorAll('[data-testid=forget-item]').length > 0")
    recent = page.locator('[data-testid=forget-group][data-place=recent]')
    assert recent.locator("h4").inner_text() == "Recent turns"
    assert recent.get_by_test_id("forget-item").evaluate_all("xs => xs.map(x => x.dataset.turn)") == ["1", "3"]
    turns = page.locator("[data-testid=forget-turn]").evaluate_all("xs => [...new Set(xs.map(x => x.dataset.turn))]")
    assert sorted(turns) == ["1", "3"]
    page.get_by_test_id("forget-preview").scroll_into_view_if_needed()
    page.get_by_test_id("memory-panel").screenshot(path=str(OUTPUT_DIR / "forget-preview.png"))
    page.locator('[data-testid=forget-turn][data-turn="3"]').first.uncheck()
    assert page.locator('[data-testid=forget-turn][data-turn="3"]').evaluate_all("xs => xs.map(x => x.checked)") == \
        [False] * page.locator('[data-testid=forget-turn][data-turn="3"]').count()
    page.get_by_test_id("forget-confirm").click()
    until(page, "() => document.getElementById('confirm-dialog').open")
    assert page.locator("#confirm-text").inner_text().startswith("Forget turn 1?")
    confirm(page)
    until(page, "() => !document.getElementById('forget-result').hidden")
    assert page.get_by_test_id("forget-result").inner_text() == "Turn 1 was forgotten."
    assert page.get_by_test_id("forget-preview").is_hidden()
    assert turn(page, base, 1)["reason"] == "forgotten"
    assert turn(page, base, 3)["where"] == "recent"
    until(page, "() => document.querySelectorAll('[data-testid=message][data-role=user]').length === 2")
    assert texts(page, "user") == ["Tell me about trains.", "Again, MARMALADE please."]
    assert page.errors == []


def test_the_thread_downloads_as_json_and_as_markdown(make_live_app, app_settings, fake_llm, browser_page):
    page = browser_page
    base, _ = start(make_live_app, app_settings, fake_llm, page)
    send_and_wait(page, base, "We are planning a team offsite in Lisbon for 12 people.")
    page.get_by_test_id("pin-input").fill("Budget is 9000 EUR")
    page.get_by_test_id("pin-add").click()
    until(page, "() => document.querySelectorAll('[data-testid=pin]').length === 1")
    thread = page.request.get(base + "/api/chat/thread").json()

    with page.expect_download() as got:
        page.get_by_test_id("export-json").click()
    download = got.value
    assert download.suggested_filename == "chat-export.json"
    data = json.loads(open(download.path(), encoding="utf-8").read())
    assert data["threadId"] == thread["threadId"]
    assert [m["text"] for m in data["messages"]] == ["We are planning a team offsite in Lisbon for 12 people.", ANSWER]

    with page.expect_download() as got:
        page.get_by_test_id("export-markdown").click()
    download = got.value
    assert download.suggested_filename == "chat-export.md"
    md = open(download.path(), encoding="utf-8").read()
    assert md.startswith("# Chat export\n")
    assert "## Your pinned decisions\n\n1. Budget is 9000 EUR\n" in md
    assert "## Recent conversation\n\n**You** · " in md
    assert "We are planning a team offsite in Lisbon for 12 people.\n" in md and ANSWER in md
    assert page.errors == []


def test_the_panel_says_which_turns_the_archive_no_longer_keeps(make_live_app, app_settings, fake_llm,
                                                                browser_page):
    page = browser_page
    base, server = start(make_live_app, app_settings, fake_llm, page, recent_turns=1, archive_max_turns=1)
    send_and_wait(page, base, "We are planning a team offsite in Lisbon for 12 people.")
    send_and_wait(page, base, "Dates are 3 to 5 June, and the budget is 9000 EUR.")
    send_and_wait(page, base, "Find us a venue near the river, with a room for workshops.")
    for _ in range(3):  # fold until turns 1 and 2 are folded (the archive keeps only turn 2)
        if (page.request.get(base + "/api/chat/thread").json().get("record") or {}).get("lastTurn", 0) >= 2:
            break
        assert compact(page, server) == "applied"
    page.reload()
    wait_connected(page)
    until(page, "() => !document.getElementById('earliest-kept').hidden")
    assert page.get_by_test_id("earliest-kept").inner_text() == \
        "The archive keeps turns from turn 2 on; turn 1 is no longer kept."
    until(page, "() => document.getElementById('compactions').textContent.includes('no longer kept')")
    gone = turn(page, base, 1)
    assert (gone["where"], gone["reason"]) == ("gone", "archive_limit")
    # a summary line of turn 1 still opens it: gone, and why
    page.locator("#record-details > summary").click()
    page.locator('[data-testid=record-line][data-turn="1"]').first.get_by_test_id("line-source").click()
    until(page, "() => document.getElementById('turn-dialog').open")
    assert page.get_by_test_id("turn-where").inner_text() == \
        "Gone: the archive keeps only the newest turns, and this one was dropped."
    assert page.get_by_test_id("turn-dialog-forget").is_visible()  # its summary lines can still be forgotten
    assert page.errors == []


# -- the page after a forget and after New chat (docs/contract.md: WebSocket, the forget frame) -----------------

def test_a_forget_reaches_every_open_tab_of_the_session(make_live_app, app_settings, fake_llm, browser_page):
    page = browser_page
    base, _ = start(make_live_app, app_settings, fake_llm, page)
    send_and_wait(page, base, "My locker code is zebracorn 4471.")
    send_and_wait(page, base, "We travel by train.")
    other = page.context.new_page()  # a second tab of the same session, open before the forget
    other.errors = []
    other.on("pageerror", lambda exc: other.errors.append(str(exc)))
    other.goto(base + "/")
    wait_connected(other)
    until(other, "() => document.getElementById('messages').textContent.includes('zebracorn')")
    page.locator("[data-testid=message][data-role=user]").nth(0).get_by_test_id("message-menu").locator("summary").click()
    page.locator("[data-testid=message][data-role=user]").nth(0).get_by_test_id("forget-message").click()
    confirm(page)
    until(page, "() => !document.getElementById('forget-result').hidden")
    # the other tab takes the turn off its page without a reload, and says so
    until(other, "() => !document.getElementById('messages').textContent.includes('zebracorn')")
    assert texts(other, "user") == ["We travel by train."]
    until(other, "() => document.querySelector('[data-testid=memory-hint]').textContent === 'Turn 1 was forgotten.'")
    assert other.get_by_test_id("memory-hint").is_visible()
    assert page.errors == [] and other.errors == []
    other.close()


def test_new_chat_clears_every_notice_and_the_old_conversations_history(make_live_app, app_settings, fake_llm,
                                                                        browser_page):
    import time

    page = browser_page
    base, server = start(make_live_app, app_settings, fake_llm, page)
    send_and_wait(page, base, "My locker code is zebracorn 4471.")
    send_and_wait(page, base, "We travel by train.")
    users = page.locator("[data-testid=message][data-role=user]")
    users.nth(0).get_by_test_id("message-menu").locator("summary").click()
    users.nth(0).get_by_test_id("forget-message").click()
    confirm(page)
    until(page, "() => document.getElementById('forget-result').textContent === 'Turn 1 was forgotten.'")
    # the history's entry names its turn
    until(page, "() => document.querySelector('[data-testid=compaction] .compaction-detail')")
    entry = page.get_by_test_id("compaction").first
    assert entry.locator(".badge").inner_text() == "applied · forgotten"
    assert entry.locator(".compaction-detail").inner_text() == "turn 1 forgotten"
    page.get_by_test_id("pin-input").fill("\u200b")
    page.get_by_test_id("pin-add").click()
    until(page, "() => !document.getElementById('pin-error').hidden")

    page.once("dialog", lambda d: d.accept())
    page.locator("#new-chat").click()
    until(page, "() => !document.querySelector('[data-testid=message]')")
    for notice in ("forget-result", "forget-error", "pin-error", "memory-hint"):
        assert not page.get_by_test_id(notice).is_visible(), notice
    assert page.locator("[data-testid=compaction]").count() == 0
    # a refinement of the old conversation that ends after the clear is recorded there as discarded:
    # it began before the new chat, so this conversation's history does not list it
    thread_id = page.request.get(base + "/api/chat/thread").json()["threadId"]
    store = server.app.extensions["chat"].store
    now = int(time.time() * 1000)
    send_and_wait(page, base, "A new question.")
    assert store.history.record_compaction(thread_id, {"at": now + 1, "outcome": "stale", "reason": "generation",
                                               "step": "refine", "durationMs": 30_000}, 50)
    send_and_wait(page, base, "Another question.")
    stats = page.request.get(base + "/api/chat/stats").json()
    assert [c["reason"] for c in stats["compactions"]] == ["generation"]  # the store holds it ...
    assert page.locator("[data-testid=compaction]").count() == 0  # ... the page does not show it
    assert page.errors == []


LONG_ANSWER = "\n\n".join(f"Paragraph {i}: " + "the venue list goes on and on. " * 6 for i in range(40))


def test_the_turn_and_forget_dialogs_open_at_their_top(make_live_app, app_settings, fake_llm, browser_page):
    page = browser_page
    base, _ = start(make_live_app, app_settings, fake_llm, page)
    fake_llm.default = lambda body: Reply(text=LONG_ANSWER, first_token_delay=0.01, usage=None)
    planted = "My locker code is zebracorn 4471."
    send_and_wait(page, base, planted)
    top = """id => { const d = document.getElementById(id); const first = d.querySelector('.turn-msg');
                     return [d.open, d.scrollHeight > d.clientHeight + 100, d.scrollTop,
                             first.getBoundingClientRect().top < d.getBoundingClientRect().bottom]; }"""
    users = page.locator("[data-testid=message][data-role=user]")
    users.nth(0).get_by_test_id("message-menu").locator("summary").click()
    users.nth(0).get_by_test_id("forget-message").click()
    until(page, "() => document.getElementById('confirm-dialog').open")
    assert page.evaluate(top, "confirm-dialog") == [True, True, 0, True]
    assert page.locator("#confirm-quote .turn-msg").first.is_visible()
    assert planted in page.locator("#confirm-quote .turn-msg").first.inner_text()
    page.get_by_test_id("confirm-cancel").click()
    until(page, "() => !document.getElementById('confirm-dialog').open")
    page.evaluate("() => window.scrollTo(0, 0)")
    # "Why does it know this?" (a summary line or the inspector) opens the turn: the page's own module, called
    page.evaluate("n => import(new URL('forget.js', document.querySelector('script[type=module]').src).href)"
                  ".then(m => m.openTurn(n))", 1)
    until(page, "() => document.getElementById('turn-dialog').open")
    assert page.evaluate(top, "turn-dialog") == [True, True, 0, True]
    assert page.errors == []
