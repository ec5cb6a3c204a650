"""The chat page in a real browser: Debian's Chromium driven by Playwright, against the live app and the fake model.

A person sends a message and watches it stream, reloads and finds it again, stops an answer (nothing kept), and
sends markup that must render inert.  Screenshots go to ``test-output/`` for a reviewer.
"""

from __future__ import annotations

import pytest

from chat_support.fake_llm import Reply, split_tokens
from tests.fixtures.streamed_chat import OUTPUT_DIR
from tests.helpers.browser import MESSAGES, last_bot, send, wait_connected

pytestmark = pytest.mark.browser

XSS_USER = ('Render this: <img src=x onerror="window.__xss=1"> and <script>window.__xss=2</script> '
            'and [a link](javascript:window.__xss=3)')
XSS_ANSWER = ('Here you go: <img src=x onerror="window.__xss=1"> <script>window.__xss=2</script> '
              '[click me](javascript:window.__xss=3) <a href="javascript:window.__xss=4">raw link</a> '
              '![pic](javascript:window.__xss=5) and **bold** text.')
NORMAL = "Streaming answers arrive piece by piece, and this one is kept in memory."
LONG = " ".join(f"long{i}" for i in range(400))

def reply_for(body: dict) -> Reply:
    text = body["messages"][-1]["content"]
    if text.startswith("Render this"):
        return Reply(tokens=split_tokens(XSS_ANSWER), token_delay=0.01)
    if "long" in text:
        return Reply(tokens=split_tokens(LONG), token_delay=0.03)
    return Reply(tokens=split_tokens(NORMAL), token_delay=0.08)


def bubbles(page) -> list[tuple[str, str]]:
    """The conversation as shown: ``(role, visible text)`` per message bubble."""
    return [tuple(b) for b in page.eval_on_selector_all(
        MESSAGES, "els => els.map(e => [e.dataset.role, e.querySelector('.content').innerText.trim()])")]


def wait_saved(page, n: int) -> None:
    """Wait until no turn is in flight and the page shows ``n`` messages, all re-read from server memory."""
    page.wait_for_function(
        """n => { const all = document.querySelectorAll('[data-testid="message"]');
                  return document.getElementById('stop').hidden && all.length === n
                         && [...all].every(e => e.dataset.saved === '1'); }""", arg=n)


def server_thread(page, url: str) -> dict:
    response = page.request.get(url + "/api/chat/thread")  # the page's own cookies
    assert response.ok
    return response.json()


def test_chat_page_streams_restores_stops_and_renders_inert(browser_page, live_app, fake_llm):
    page = browser_page
    fake_llm.default = reply_for
    page.goto(live_app.url + "/")
    wait_connected(page)
    assert page.get_by_test_id("memory-panel").count() == 1

    # 1. send; the answer streams in (partial text visible while the bubble is still streaming)
    send(page, "How do answers arrive?")
    page.wait_for_function(
        """() => { const b = [...document.querySelectorAll('[data-testid="message"][data-role="assistant"]')].pop();
                   return b && b.classList.contains('streaming') && b.innerText.includes('piece by')
                          && !b.innerText.includes('kept in memory'); }""")
    assert page.get_by_test_id("stop").is_visible()
    wait_saved(page, 2)
    assert bubbles(page) == [("user", "How do answers arrive?"), ("assistant", NORMAL)]
    assert page.get_by_test_id("message-input").input_value() == ""

    # 2. reload: the conversation comes back from the server
    page.reload()
    wait_connected(page)
    wait_saved(page, 2)
    assert bubbles(page) == [("user", "How do answers arrive?"), ("assistant", NORMAL)]
    stored = server_thread(page, live_app.url)["messages"]
    assert page.eval_on_selector_all(MESSAGES, "els => els.map(e => e.dataset.messageId)") == [m["id"] for m in stored]

    # 3. stop mid-answer: nothing kept
    send(page, "Tell me something long")
    page.wait_for_function(
        """() => { const b = [...document.querySelectorAll('[data-testid="message"][data-role="assistant"]')].pop();
                   return b && b.innerText.includes('long5'); }""")
    page.get_by_test_id("stop").click()
    page.wait_for_selector(f'{MESSAGES}[data-role="assistant"][data-status="cancelled"]')
    assert "long399" not in last_bot(page).inner_text()
    page.screenshot(path=str(OUTPUT_DIR / "browser_chat_stopped.png"), full_page=True)
    record = fake_llm.last_request()
    assert record.wait(3.0) and record.outcome == "aborted"
    assert [m["text"] for m in server_thread(page, live_app.url)["messages"]] == ["How do answers arrive?", NORMAL]
    page.reload()
    wait_connected(page)
    wait_saved(page, 2)
    assert bubbles(page) == [("user", "How do answers arrive?"), ("assistant", NORMAL)]

    # 4. markup in the message and in the answer renders inert
    send(page, XSS_USER)
    wait_saved(page, 4)
    check_inert(page)
    page.screenshot(path=str(OUTPUT_DIR / "browser_chat.png"), full_page=True)
    page.reload()  # the restored rendering path too
    wait_connected(page)
    wait_saved(page, 4)
    check_inert(page)
    user_text = page.locator(f'{MESSAGES}[data-role="user"]').last.inner_text()
    assert '<img src=x onerror="window.__xss=1">' in user_text  # shown as the text the person typed
    assert "<script>window.__xss=2</script>" in user_text

    # a narrow window still shows the conversation and the composer
    page.set_viewport_size({"width": 380, "height": 760})
    panel = page.get_by_test_id("memory-panel")
    panel.wait_for(state="hidden")  # a drawer on narrow screens, closed until asked for
    assert page.get_by_test_id("message-input").is_visible() and page.get_by_test_id("send").is_visible()
    page.screenshot(path=str(OUTPUT_DIR / "browser_chat_narrow.png"))
    page.get_by_test_id("memory-toggle").click()
    panel.wait_for(state="visible")
    page.keyboard.press("Escape")
    panel.wait_for(state="hidden")
    assert page.errors == []


def check_inert(page) -> None:
    """No script from a message ran, and nothing executable is left in the rendered messages."""
    assert page.evaluate("typeof window.__xss") == "undefined"
    found = page.evaluate(
        """() => {
             const bad = [];
             const contents = document.querySelectorAll('[data-testid="message"] .content');
             if (contents.length === 0) bad.push('no message contents');
             contents.forEach(root => {
               root.querySelectorAll('script, img, iframe, object, embed, svg').forEach(e => bad.push(e.tagName));
             });
             document.querySelectorAll('[data-testid="messages"] *').forEach(e => {
               for (const a of e.attributes) {
                 if (/^on/i.test(a.name)) bad.push(e.tagName + '@' + a.name);
                 if (/^\\s*javascript:/i.test(a.value)) bad.push(e.tagName + '@' + a.name + '=' + a.value);
               }
             });
             return bad;
           }""")
    assert found == []
    # clicking the answer's links (their javascript: targets were stripped) runs nothing either
    links = page.locator(f'{MESSAGES}[data-role="assistant"] .content a:not([href])').all()
    for link in links:
        link.click()
    assert page.evaluate("typeof window.__xss") == "undefined"


def test_page_keyboard_and_reconnect(browser_page, live_app, fake_llm):
    """Shift+Enter is a newline and Enter sends; when the socket drops the page says so and reconnects by itself."""
    page = browser_page
    routes = []

    def through(ws):  # pass every socket through to the app, keeping a handle to drop it later
        ws.connect_to_server()
        routes.append(ws)

    page.route_web_socket("**/ws/chat", through)
    fake_llm.default = Reply(text="First line and second line, received.")
    page.goto(live_app.url + "/")
    wait_connected(page)

    box = page.get_by_test_id("message-input")
    box.fill("first line")
    box.press("Shift+Enter")
    box.press_sequentially("second line")
    assert box.input_value() == "first line\nsecond line"
    assert fake_llm.chat_requests() == []
    box.press("Enter")
    wait_saved(page, 2)
    assert fake_llm.last_request().messages[-1]["content"] == "first line\nsecond line"

    routes[0].close()  # the connection drops
    page.wait_for_selector('[data-testid="connection"][data-state="reconnecting"]')
    assert "Reconnecting" in page.get_by_test_id("connection").inner_text()
    assert "Reconnecting" in page.get_by_test_id("banner").inner_text()
    wait_connected(page)  # back by itself (first retry after about 1 s)
    assert len(routes) == 2
    send(page, "after the reconnect")
    wait_saved(page, 4)
    assert page.errors == []


CAPTURE_AT_DONE = """
window.__atDone = [];
new MutationObserver(records => {
  for (const r of records) {
    const b = r.target;
    if (r.attributeName === 'data-status' && b.dataset && b.dataset.role === 'assistant' && b.dataset.status) {
      window.__atDone.push({status: b.dataset.status, text: b._text,
                            shown: b.querySelector('.content').innerText.trim()});
    }
  }
}).observe(document, {subtree: true, attributes: true, attributeFilter: ['data-status']});
"""


def test_page_renders_coalesced_deltas_as_the_model_wrote_them(browser_page, live_app, fake_llm):
    """Deltas arrive several tokens per frame, cut anywhere (inside markdown marks, words, CJK): what the page
    built from them when ``done`` came is the model's text exactly, and it renders as the stored answer does."""
    page = browser_page
    answer = ("**Plan** for `day 1`: 先坐火车去里斯本 🚆, then the ferry.\n\n"
              "- museum *MAAT* — 10:00\n- lunch: bacalhau\n\n1. Sintra\n2. Cascais\n\n"
              + " ".join(f"note{i}" for i in range(120)))
    pieces = [answer[i:i + 3] for i in range(0, len(answer), 3)]  # cuts through marks, words and CJK runs
    fake_llm.default = Reply(tokens=pieces, token_delay=0.002)
    delta_frames = []
    page.on("websocket", lambda ws: ws.on(
        "framereceived", lambda payload: delta_frames.append(payload) if '"type":"delta"' in str(payload) else None))
    page.add_init_script(CAPTURE_AT_DONE)
    page.goto(live_app.url + "/")
    wait_connected(page)

    send(page, "Plan my Lisbon trip")
    page.wait_for_function("() => window.__atDone.length === 1")
    at_done = page.evaluate("window.__atDone[0]")
    assert at_done["status"] == "completed"
    assert at_done["text"] == answer  # the deltas, joined by the page, are the model's text
    assert 1 < len(delta_frames) < len(pieces) / 2  # streamed, several pieces per frame

    wait_saved(page, 2)  # re-rendered from server memory
    assert bubbles(page) == [("user", "Plan my Lisbon trip"), ("assistant", at_done["shown"])]
    assert [m["text"] for m in server_thread(page, live_app.url)["messages"]] == ["Plan my Lisbon trip", answer]
    page.screenshot(path=str(OUTPUT_DIR / "browser_chat_coalesced.png"), full_page=True)
    assert page.errors == []
