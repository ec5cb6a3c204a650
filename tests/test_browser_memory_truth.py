"""The page tells the truth about memory: Debian's Chromium driven by Playwright against the live app and the fake model.

- Turns a compaction folds stay on the page, marked as summarized, before a divider; after a reload the summary
  is the conversation's first item ("Earlier in this conversation") with the pinned decisions, and the folded
  turns are shown again from the thread's archive, dimmed.
- The person's pinned decisions and the model's notes are shown apart; a note is promoted to a pinned decision.
- A stale compaction's history entry says it was discarded, without figures.
- A turn waiting for its first token says so, with the seconds elapsed; answers and code blocks copy exactly;
  the model's full name is shown; a turn whose thread was cleared meanwhile is shown as not saved.

Screenshots go to ``test-output/``; with ``UPDATE_DOCS_SCREENSHOT=1`` the docs' pictures (README.md, docs/memory.md)
(``docs/memory-panel.png``, ``docs/chat-narrow.png``) are refreshed from here.
"""

from __future__ import annotations

import os
import shutil
import time

import pytest

from app.memory.state import Pin
from app.settings import MemoryLimits
from chat_support.fake_llm import Reply, split_tokens
from tests.fixtures.streamed_chat import OUTPUT_DIR, ROOT
from tests.helpers.browser import OFFSITE_ANSWERS, send_and_wait, until

pytestmark = pytest.mark.browser

MESSAGES = '[data-testid="message"]'
NOTE = "The team offsite stays in Lisbon on 3 to 5 June."
PIN = "Budget is 9000 EUR for 12 people"


def shown(page) -> list[tuple[str, str, str]]:
    """The conversation on the page: ``(role, text as stored, summarized mark)`` per message bubble."""
    return [tuple(m) for m in page.eval_on_selector_all(
        MESSAGES, "els => els.map(e => [e.dataset.role, e._text, e.dataset.summarized || ''])")]


def connected(page) -> None:
    page.wait_for_selector('[data-testid="connection"][data-state="connected"]')


def test_folded_turns_stay_and_a_reload_opens_on_the_summary(make_live_app, app_settings, fake_llm, browser_page):
    from app.compaction.service import run_compaction

    server = make_live_app(app_settings.with_overrides(compaction_strategy="extractive",
                                                       limits=MemoryLimits(recent_turns=2)))
    fake_llm.default = lambda body: Reply(
        text=OFFSITE_ANSWERS.get(body["messages"][-1]["content"], "Belém is cheaper."), first_token_delay=0.05,
        usage=None)
    page, base = browser_page, server.url
    page.goto(base + "/")
    connected(page)
    texts = list(OFFSITE_ANSWERS)
    for text in texts:
        send_and_wait(page, base, text)
    thread_id = page.request.get(base + "/api/chat/thread").json()["threadId"]

    # ---- a compaction applies mid-conversation: nothing the person saw disappears
    services = server.app.extensions["chat"]
    with server.app.app_context():
        outcome = run_compaction(services, thread_id, services.store.load(thread_id).version)
    assert outcome.outcome == "applied"
    folded = 2 * outcome.entry["turnsFolded"]
    until(page, "n => document.querySelectorAll('[data-summarized=true]').length === n", folded)
    # the person pins a decision, a compaction left a note, and a later compaction was discarded as stale
    state = services.store.load(thread_id)
    assert services.store.set_pins_and_notes(thread_id, expected_gen=state.gen, pins=[Pin(PIN)], notes=[NOTE])
    assert services.store.history.record_compaction(thread_id, {"at": int(time.time() * 1000), "outcome": "stale",
                                                        "reason": "generation", "attempt": 0, "durationMs": 840}, 50)
    send_and_wait(page, base, "Which of the two is cheaper?")
    sent = [(role, text) for q in texts for role, text in (("user", q), ("assistant", OFFSITE_ANSWERS[q]))]
    sent += [("user", "Which of the two is cheaper?"), ("assistant", "Belém is cheaper.")]
    assert shown(page) == [(r, t, "true" if i < folded else "") for i, (r, t) in enumerate(sent)]
    stored = page.request.get(base + "/api/chat/thread").json()["messages"]
    assert [(m["role"], m["text"]) for m in stored] == sent[folded:]  # memory holds only the recent turns
    divider = page.get_by_test_id("fold-divider")
    assert divider.inner_text() == "Earlier turns are now kept as a summary"
    assert page.evaluate("n => document.querySelectorAll('#messages > *')[n].dataset.testid", folded + 1) == \
        "fold-divider"  # right after the folded turns (the first child is the empty-state line)

    # ---- the person's pin and the model's note, shown apart
    until(page, "() => document.querySelectorAll('[data-testid=note]').length === 1")
    assert page.locator("[data-testid=pin]").evaluate_all(
        "ps => ps.map(p => [p.dataset.by, p.querySelector('.pin-text').textContent])") == [["person", PIN]]
    note = page.get_by_test_id("note")
    assert note.get_attribute("data-by") == "model" and note.inner_text().startswith(NOTE)

    # ---- a stale compaction's history entry: discarded, no figures
    until(page, "() => document.querySelector('[data-testid=compaction][data-outcome=stale]')")
    stale = page.locator("[data-testid=compaction][data-outcome=stale]")
    assert stale.locator(".badge").inner_text() == "discarded"
    assert stale.locator(".compaction-detail").inner_text() == "discarded: the thread changed meanwhile · 840\u00a0ms"
    # an applied one says how, in words, and its facts as checked, kept and why not
    applied = page.locator("[data-testid=compaction][data-outcome=applied]")
    assert applied.locator(".badge").inner_text() == "applied · without the model"
    entry = page.request.get(base + "/api/chat/stats").json()["compactions"][0]
    facts = f"{entry['factsChecked']} fact{'s' if entry['factsChecked'] != 1 else ''} checked: " \
            f"{entry['factsChecked'] - entry['factsDropped'] - entry['factsSkipped']} kept"
    assert facts in applied.locator(".compaction-detail").inner_text()
    page.set_viewport_size({"width": 1280, "height": 1000})
    page.get_by_test_id("fold-divider").scroll_into_view_if_needed()
    OUTPUT_DIR.mkdir(exist_ok=True)
    desktop = OUTPUT_DIR / "memory-panel.png"
    page.screenshot(path=str(desktop))

    # ---- after a reload the summary is the conversation's first item, with the pinned decisions
    page.reload()
    connected(page)
    until(page, "() => document.querySelector('[data-testid=earlier]')")
    first = page.evaluate("() => document.querySelector('#messages').firstElementChild.dataset.testid")
    assert first == "earlier"
    earlier = page.get_by_test_id("earlier")
    assert earlier.locator("summary").inner_text().startswith("Earlier in this conversation")
    earlier.locator("summary").click()
    summary = services.store.load(thread_id).summary
    assert earlier.get_by_test_id("earlier-summary").inner_text() == summary.strip()
    assert earlier.locator("li[data-by=person]").all_inner_texts() == [PIN]
    # the folded turns are back from the thread's archive, dimmed as before the reload
    assert shown(page) == [(r, t, "true" if i < folded else "") for i, (r, t) in enumerate(sent)]
    assert page.locator(MESSAGES + '[data-archived="true"]').count() == folded
    earlier.locator("summary").click()  # collapsed again

    # ---- promote the model's note: it becomes the person's pinned decision, in the store
    page.get_by_test_id("promote-note").click()
    until(page, "() => document.querySelectorAll('[data-testid=pin]').length === 2")
    assert page.get_by_test_id("note").count() == 0
    after = services.store.load(thread_id)
    assert (after.pins, after.notes) == ((Pin(PIN, "person"), Pin(NOTE, "person")), ())

    # ---- a phone-sized window
    page.set_viewport_size({"width": 390, "height": 844})
    page.get_by_test_id("memory-panel").wait_for(state="hidden")
    page.evaluate("() => { const m = document.getElementById('messages'); m.scrollTop = 0; }")
    narrow = OUTPUT_DIR / "chat-narrow.png"
    page.screenshot(path=str(narrow))
    assert page.errors == []
    # refresh the docs' pictures (README.md, docs/memory.md) on purpose only
    if os.environ.get("UPDATE_DOCS_SCREENSHOT") == "1":
        shutil.copyfile(desktop, ROOT / "docs" / "memory-panel.png")
        shutil.copyfile(narrow, ROOT / "docs" / "chat-narrow.png")


CODE = 'def greet(name):\n    return f"Hello, {name}!"  # <b>not markup</b>\n\n\nprint(greet("Lin"))'
ANSWER = f"Here is the function:\n\n```python\n{CODE}\n```\n\nCall it with **any** name."
LONG_MODEL = "Qwen2.5-Coder-0.5B-Instruct-GGUF-q4_k_m-with-a-rather-long-name"


def test_waiting_copy_full_model_name_and_a_turn_cleared_meanwhile(make_live_app, app_settings, fake_llm,
                                                                    browser_page):
    server = make_live_app(app_settings.with_overrides(chat_model=LONG_MODEL, llm_read_timeout=8.0,
                                                       llm_first_token_timeout=20.0))
    page, base = browser_page, server.url
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=base)
    page.goto(base + "/")
    connected(page)

    # the model's full name, not cut off
    label = page.get_by_test_id("model-name")
    assert label.inner_text() == LONG_MODEL
    assert page.evaluate("() => { const m = document.querySelector('.model'); return m.scrollWidth <= m.clientWidth; }")

    # ---- the first token is 3 s away: the page says what it waits for, with the seconds, updating
    fake_llm.default = Reply(tokens=split_tokens(ANSWER), first_token_delay=3.0)
    page.get_by_test_id("message-input").fill("Write a greeting function")
    page.get_by_test_id("send").click()
    waiting = page.get_by_test_id("waiting")
    until(page, "() => /^waiting for the model… [1-9] s$/.test(document.querySelector('[data-testid=waiting]')"
                "?.textContent || '')")
    first = waiting.inner_text()
    until(page, "t => { const w = document.querySelector('[data-testid=waiting]'); return !w || w.textContent !== t; }",
          first)  # it counts on (or the answer came)
    page.wait_for_selector(f'{MESSAGES}[data-role=assistant][data-saved="1"]')  # re-read from memory
    assert waiting.count() == 0

    # ---- copy: the code block's exact code, the answer's exact markdown
    answer = page.locator(f'{MESSAGES}[data-role=assistant]').last
    answer.get_by_test_id("copy-code").click()
    until(page, "() => document.querySelector('[data-testid=copy-code]').dataset.copied === 'true'")
    assert page.evaluate("() => navigator.clipboard.readText()") == CODE
    answer.get_by_test_id("copy-answer").click()
    until(page, "() => document.querySelector('[data-testid=copy-answer]').dataset.copied === 'true'")
    assert page.evaluate("() => navigator.clipboard.readText()") == ANSWER

    # ---- another tab starts a new chat while an answer streams: the answer is shown, marked not saved
    fake_llm.default = Reply(tokens=split_tokens("This answer arrives slowly, piece by piece, to the end."),
                             token_delay=0.15)
    page.get_by_test_id("message-input").fill("Are you still there?")
    page.get_by_test_id("send").click()
    until(page, "() => [...document.querySelectorAll('[data-role=assistant]')].pop().innerText.includes('slowly')")
    assert page.request.delete(base + "/api/chat/thread").status == 204
    bot = page.locator(f'{MESSAGES}[data-role=assistant][data-status=completed]').last
    page.wait_for_function("() => [...document.querySelectorAll('[data-role=assistant]')].pop().dataset.kept === 'false'")
    assert bot.locator(".content").inner_text() == "This answer arrives slowly, piece by piece, to the end."
    assert bot.locator(".msg-foot .note").inner_text() == "not saved (new chat started)"
    assert page.request.get(base + "/api/chat/thread").json()["messages"] == []
    assert page.errors == []


def test_a_turn_behind_a_busy_bundled_model_says_what_it_waits_for(make_live_app, app_settings, fake_llm,
                                                                   browser_page):
    from chat_support.live_app import ChatClient

    server = make_live_app(app_settings.with_overrides(bundled_model=True))
    page, base = browser_page, server.url
    page.goto(base + "/")
    connected(page)
    other = ChatClient(server).connect()  # another conversation holds the one-request-at-a-time model
    try:
        fake_llm.default = Reply(tokens=split_tokens("A long answer for someone else, sent slowly."), token_delay=0.3)
        other.send({"type": "message", "text": "take your time"})
        other.recv_until(lambda f: f["type"] == "delta")
        fake_llm.default = Reply(text="Here you are.", first_token_delay=1.0)  # (the fake itself never queues)
        page.get_by_test_id("message-input").fill("Am I next?")
        page.get_by_test_id("send").click()
        # said at once, before the 1.5 s after which any wait is told
        until(page, "() => { const w = document.querySelector('[data-testid=waiting]');"
                    " return w && w.dataset.reason === 'model_busy' &&"
                    " /^waiting for the model… 0 s — it is answering another message first$/.test(w.textContent); }")
        page.wait_for_selector(f'{MESSAGES}[data-role=assistant][data-saved="1"]')
        assert page.get_by_test_id("waiting").count() == 0
        assert page.locator(f'{MESSAGES}[data-role=assistant] .content').last.inner_text() == "Here you are."
        assert other.recv_until(lambda f: f["type"] == "done", timeout=30)[-1]["status"] == "completed"
    finally:
        other.close()
    assert page.errors == []
