"""An answer whose save is unknown and a forget whose outcome is unknown, in a real browser (docs/contract.md: WebSocket, the done frame).

The live app's store runs behind ``LossyProxy``: the commit's reply and every reply after it are lost (the
store's read-back fails too), so ``done`` says ``"saved": "unknown"``.  The page marks the answer "checking
whether it was saved…" and reads the thread again until the store answers; then the note goes, because memory
holds the turn (never "not saved" for a turn that is stored).  A forget whose script's reply and read-back are
lost is answered 202 "outcome unknown": the panel says "Checking whether turn n was forgotten…" and reads the
turn again until the store answers, then says it was forgotten.
"""

from __future__ import annotations

import pytest

from chat_support.fake_llm import Reply
from tests.fixtures.lossy_proxy import LossyProxy, proxied_url
from tests.helpers.browser import send, send_and_wait, until, wait_connected

pytestmark = pytest.mark.browser

def test_an_answer_whose_save_is_unknown_says_checking_then_what_memory_holds(make_live_app, app_settings, fake_llm,
                                                                              browser_page, store):
    page = browser_page
    proxy = LossyProxy.before(app_settings.redis_url)
    try:
        server = make_live_app(app_settings.with_overrides(redis_url=proxied_url(app_settings.redis_url, proxy)))
        fake_llm.default = lambda body: Reply(text="Noted, locker 4471.", first_token_delay=0.01, usage=None)
        page.goto(server.url + "/")
        wait_connected(page)
        send_and_wait(page, server.url, "Warm up.")  # loads the commit script
        proxy.arm("dark")
        send(page, "My locker is 4471.")
        last = "() => [...document.querySelectorAll('[data-testid=message][data-role=assistant]')].pop()"
        until(page, f"() => ({last})().querySelector('.note')?.dataset.kind === 'checking'")
        note = page.evaluate(f"() => ({last})().querySelector('.note').textContent")
        assert note == "checking whether it was saved…"
        proxy.light()
        until(page, "() => [...document.querySelectorAll('[data-testid=message][data-role=assistant]')].pop()"
                    ".dataset.saved === '1'")
        assert page.locator("[data-testid=message][data-role=assistant] .content").all_inner_texts()[-1] == \
            "Noted, locker 4471."
        assert not page.evaluate("() => [...document.querySelectorAll('[data-testid=message]')]"
                                 ".some(b => (b.querySelector('.note') || {}).textContent === 'not saved')")
        thread_id = page.request.get(server.url + "/api/chat/thread").json()["threadId"]
        assert [m.text for m in store.load(thread_id).messages][-2:] == ["My locker is 4471.", "Noted, locker 4471."]
        assert page.errors == []
    finally:
        proxy.light()
        proxy.close()


def test_a_forget_whose_outcome_is_unknown_says_checking_then_what_memory_holds(make_live_app, app_settings,
                                                                                fake_llm, browser_page):
    page = browser_page
    proxy = LossyProxy.before(app_settings.redis_url)
    try:
        server = make_live_app(app_settings.with_overrides(redis_url=proxied_url(app_settings.redis_url, proxy)))
        fake_llm.default = lambda body: Reply(text="Noted.", first_token_delay=0.01, usage=None)
        page.goto(server.url + "/")
        wait_connected(page)
        for text in ("First: the budget is 9000 EUR.", "Second: my password is hunter2zebra."):
            send_and_wait(page, server.url, text)
        assert page.request.delete(server.url + "/api/chat/turns/1").status == 200  # loads the forget script
        until(page, "() => !document.getElementById('messages').textContent.includes('9000 EUR')")
        second = page.locator("[data-testid=message][data-role=user]").last
        second.get_by_test_id("message-menu").locator("summary").click()
        second.get_by_test_id("forget-message").click()
        until(page, "() => document.getElementById('confirm-dialog').open")
        proxy.arm("dark")
        page.get_by_test_id("confirm-ok").click()
        until(page, "() => document.getElementById('forget-result').dataset.state === 'checking'")
        assert page.get_by_test_id("forget-result").inner_text() == "Checking whether turn 2 was forgotten…"
        proxy.light()
        until(page, "() => document.getElementById('forget-result').dataset.state === 'known'")
        assert page.get_by_test_id("forget-result").inner_text() == "Turn 2 was forgotten."
        until(page, "() => !document.getElementById('messages').textContent.includes('hunter2zebra')")
        assert page.request.get(server.url + "/api/chat/turns/2").json()["reason"] == "forgotten"
        assert page.errors == []
    finally:
        proxy.light()
        proxy.close()
