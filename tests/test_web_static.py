"""The chat page's scripts as a browser fetches them: ES modules, served as JavaScript, under a strict CSP.

The live app (served for real on loopback) answers the page; its module script and every module that
script imports, followed through the ``import`` statements, answer 200 with a JavaScript content type
(browsers refuse a module script of any other type).  The page carries no inline script, and its
Content-Security-Policy allows scripts from its own origin only.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser
from urllib.parse import urljoin

import requests

JS_TYPES = {"text/javascript", "application/javascript"}
IMPORT = re.compile(r"""^\s*(?:import|export)\b[^'"]*?\bfrom\s*["']([^"']+)["']|^\s*import\s*["']([^"']+)["']""", re.M)


class Scripts(HTMLParser):
    """The page's <script> tags: their attributes and whether any has inline text."""

    def __init__(self):
        super().__init__()
        self.tags: list[dict[str, str | None]] = []
        self.inline: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag, attrs):
        if tag == "script":
            self.tags.append(dict(attrs))
            self._in_script = True

    def handle_endtag(self, tag):
        if tag == "script":
            self._in_script = False

    def handle_data(self, data):
        if self._in_script and data.strip():
            self.inline.append(data)


def imports_of(source: str) -> list[str]:
    """The module specifiers of ``import ... from "x"``, ``export ... from "x"`` and ``import "x"``."""
    return [a or b for a, b in IMPORT.findall(source)]


def test_imports_of_reads_each_form_of_import():
    source = ('// @ts-check\nimport { a, b } from "./one.js";\nimport {\n  c,\n} from \'./two.js\';\n'
              'import "./three.js";\nexport { d } from "./four.js";\nconst x = "import y from \'./no.js\'";\n')
    assert imports_of(source) == ["./one.js", "./two.js", "./three.js", "./four.js"]


def test_every_module_of_the_page_is_served_as_javascript(live_app):
    page = requests.get(live_app.url + "/", timeout=10)
    assert page.status_code == 200
    parser = Scripts()
    parser.feed(page.text)
    modules = [t["src"] for t in parser.tags if t.get("type") == "module"]
    assert len(modules) == 1 and modules[0].endswith("/static/js/main.js"), parser.tags

    seen: dict[str, str] = {}
    pending = [urljoin(page.url, modules[0])]
    while pending:
        url = pending.pop()
        if url in seen:
            continue
        response = requests.get(url, timeout=10)
        assert response.status_code == 200, url
        assert response.headers["Content-Type"].split(";")[0].strip() in JS_TYPES, (url, response.headers["Content-Type"])
        seen[url] = response.text
        for spec in imports_of(response.text):
            assert spec.startswith("./"), f"{url} imports {spec!r}: only relative modules, no bare names or other origins"
            pending.append(urljoin(url, spec))

    names = {u.rsplit("/", 1)[1] for u in seen}
    assert {"main.js", "config.js", "api.js", "socket.js", "turn.js", "status.js", "format.js", "markdown.js",
            "messages.js", "panel.js"} <= names, names
    assert all(text.startswith("// @ts-check") for text in seen.values())
    # the vendored libraries stay classic deferred scripts exposing globals (js/markdown.js reads them)
    classic = [t["src"] for t in parser.tags if t.get("type") != "module"]
    assert [c.rsplit("/", 1)[1] for c in classic] == ["marked.umd.js", "purify.min.js"]
    assert all("defer" in t for t in parser.tags if t.get("type") != "module")


def test_the_page_allows_no_inline_script(live_app):
    page = requests.get(live_app.url + "/", timeout=10)
    parser = Scripts()
    parser.feed(page.text)
    assert parser.inline == []
    assert all(t.get("src") for t in parser.tags)
    directives = {d.strip().split(" ", 1)[0]: d.strip() for d in page.headers["Content-Security-Policy"].split(";") if d.strip()}
    assert directives["script-src"] == "script-src 'self'"
    assert "unsafe-inline" not in page.headers["Content-Security-Policy"]
    assert directives["object-src"] == "object-src 'none'"
    assert page.headers["X-Content-Type-Options"] == "nosniff"
