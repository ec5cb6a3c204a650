"""The README is the front door (README: Tests): every path, ``make`` target and ``python -m`` module it names
exists, every link it has resolves (a ``#anchor`` to a heading of the linked page too), the docs pages it links
to have no broken link either, and it stays at most 250 lines.

``problems(text, root, page)`` is the checker; the tests below run it on the README and, to show it can fail,
on synthetic texts in a temporary checkout.
"""

from __future__ import annotations

import importlib.util
import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MAX_LINES = 250

NOT_IN_CHECKOUT = (".venv/", ".local/", "test-output/", "node_modules/", "bench/out/", "../", "~")
"""Paths the README names that a checkout does not hold: made by ``make``, by a run, or beside the checkout."""
EXTENSIONS = {"py", "md", "txt", "toml", "ini", "json", "lua", "png", "js", "html", "css", "cfg", "yml", "yaml",
              "example", "sh", "lock"}
EXTENSIONLESS = re.compile(r"^(Procfile|Makefile)(\.[A-Za-z]+)?$")

FENCE = re.compile(r"^```.*?^```[^\n]*$", re.S | re.M)
INLINE_CODE = re.compile(r"`([^`\n]+)`")
INDENTED = re.compile(r"^(?: {4}|\t)(.*)$", re.M)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
IMG_SRC = re.compile(r"<img\b[^>]*\bsrc=\"([^\"]+)\"")
MAKE = re.compile(r"\bmake ([A-Za-z0-9_][\w.-]*)")
PYTHON_M = re.compile(r"\bpython3? -m ([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)(?![\w.<])")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$", re.M)
TARGET = re.compile(r"^([A-Za-z0-9_][\w.-]*)\s*:(?!=)", re.M)


# ------------------------------------------------------------------------------------------ the checker


def code_spans(text: str) -> list[str]:
    """Every piece of code in ``text``: fenced blocks, indented lines and inline code."""
    fenced = FENCE.findall(text)
    prose = FENCE.sub("", text)
    return fenced + INDENTED.findall(prose) + INLINE_CODE.findall(prose)


def is_path(token: str) -> bool:
    """True for a token that names a file or folder of the checkout (``app/memory/``, ``wsgi.py``, ``.ci/run``)."""
    if not token or any(c in token for c in "<>{}…$\"'|=,;()") or "://" in token or token.startswith("/"):
        return False
    if EXTENSIONLESS.match(token):
        return True
    if "/" in token:
        return bool(re.match(r"^[\w.*-]+(/[\w.*-]*)*$", token))
    suffix = token.rsplit(".", 1)[-1] if "." in token else ""
    return suffix in EXTENSIONS and bool(re.match(r"^[\w.*-]+$", token))


def named_paths(text: str) -> list[str]:
    """The checkout's paths ``text`` names in inline code (outside fenced blocks), one token at a time."""
    found = []
    for span in INLINE_CODE.findall(FENCE.sub("", text)):
        for token in span.split():
            token = token.rstrip(".:,;")
            if is_path(token) and not token.startswith(NOT_IN_CHECKOUT):
                found.append(token)
    return found


def make_targets(root: Path) -> set[str]:
    """The targets the Makefile at ``root`` defines."""
    makefile = root / "Makefile"
    return set(TARGET.findall(makefile.read_text(encoding="utf-8"))) if makefile.exists() else set()


def module_exists(name: str, root: Path) -> bool:
    """True when ``python -m name`` would find ``name``: a module of the checkout (``bench/`` runs from it, not
    installed) or one the virtualenv can import (``importlib.util.find_spec``)."""
    parts = name.split(".")
    if (root.joinpath(*parts).with_suffix(".py")).is_file() or (root.joinpath(*parts) / "__init__.py").is_file():
        return True
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: markup out, lower case, punctuation out, spaces to hyphens."""
    text = re.sub(r"`|\*\*|__|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading)
    text = unicodedata.normalize("NFC", text).strip().lower()
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    """Every heading anchor of a Markdown page (a repeated heading gets ``-1``, ``-2``…, as on GitHub)."""
    seen: dict[str, int] = {}
    found = set()
    for _, title in HEADING.findall(FENCE.sub("", markdown)):
        base = slug(title)
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def links(text: str) -> list[str]:
    """The relative link targets of a page (Markdown links and images, ``<img src>``), outside code."""
    prose = FENCE.sub("", text)
    prose = INLINE_CODE.sub("", prose)
    targets = LINK.findall(prose) + IMG_SRC.findall(prose)
    return [t for t in targets if not re.match(r"^[a-z][a-z0-9+.-]*:", t)]


def link_problems(text: str, page: Path, root: Path) -> list[str]:
    """The links of ``page`` (whose text is ``text``) that lead nowhere in the checkout at ``root``."""
    found = []
    for target in links(text):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page.resolve()
        if not dest.exists():
            found.append(f"link {target!r}: no {dest.relative_to(root.resolve()) if dest.is_relative_to(root.resolve()) else dest}")
            continue
        if not dest.is_relative_to(root.resolve()):
            found.append(f"link {target!r}: outside the checkout")
            continue
        if anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text(encoding="utf-8")):
            found.append(f"link {target!r}: no heading #{anchor} in {dest.relative_to(root.resolve())}")
    return found


def problems(text: str, root: Path, page: Path | None = None) -> list[str]:
    """Everything ``text`` (the README at ``page``, by default ``root/README.md``) names that does not work."""
    page = page or root / "README.md"
    found = []
    for path in named_paths(text):
        if not (any(root.glob(path)) if "*" in path else (root / path).exists()):
            found.append(f"path `{path}` does not exist")
    spans = "\n".join(code_spans(text))
    targets = make_targets(root)
    for target in sorted(set(MAKE.findall(spans))):
        if target not in targets:
            found.append(f"`make {target}`: no such target in the Makefile")
    for module in sorted(set(PYTHON_M.findall(spans))):
        if not module_exists(module, root):
            found.append(f"`python -m {module}`: no such module")
    found += link_problems(text, page, root)
    return found


def linked_docs(text: str, page: Path) -> list[Path]:
    """The Markdown pages of the checkout that ``page`` links to."""
    pages = []
    for target in links(text):
        path = target.partition("#")[0]
        dest = (page.parent / path).resolve()
        if path.endswith(".md") and dest.is_file() and dest not in pages:
            pages.append(dest)
    return pages


# ------------------------------------------------------------------------------------------ the README


def test_the_readme_stays_a_front_door():
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= MAX_LINES, f"README.md has {lines} lines; move detail to docs/ (at most {MAX_LINES})"


def test_everything_the_readme_names_exists():
    assert problems(README.read_text(encoding="utf-8"), ROOT) == []


def test_the_readme_names_its_two_commands():
    text = README.read_text(encoding="utf-8")
    assert "make run" in text and "make test" in text  # .ci/run runs the README's test command
    assert {"run", "test"} <= make_targets(ROOT)


def test_the_docs_the_readme_links_to_have_no_broken_link():
    readme = README.read_text(encoding="utf-8")
    pages = linked_docs(readme, README)
    assert pages, "the README links to no docs page"
    broken = {p.relative_to(ROOT).as_posix(): link_problems(p.read_text(encoding="utf-8"), p, ROOT) for p in pages}
    assert {page: found for page, found in broken.items() if found} == {}


# ------------------------------------------------------------------------------------------ the checker can fail


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A small checkout: a package, a docs page with headings, a Makefile and a Procfile."""
    (tmp_path / "frontdoor_demo").mkdir()
    (tmp_path / "frontdoor_demo" / "__init__.py").write_text("")
    (tmp_path / "frontdoor_demo" / "recall.py").write_text("")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "memory.md").write_text("# How memory works\n\n## Recall: the archive of folded turns\n"
                                                  "\n## What `make` installs\n")
    (tmp_path / "Makefile").write_text(".PHONY: run test\nPYTHON ?= python3\nrun: model\n\ttrue\ntest:\n\ttrue\n")
    (tmp_path / "Procfile").write_text("web: true\n")
    return tmp_path


GOOD = """# A front door

    make run     # everything
    make test    # the whole suite

Recall is in `frontdoor_demo/recall.py` (see `frontdoor_demo/`, the `Procfile`), run `python -m frontdoor_demo.recall`
or `.venv/bin/python -m pytest`; `make test` again. [Recall](docs/memory.md#recall-the-archive-of-folded-turns),
[installs](docs/memory.md#what-make-installs), [the page](docs/memory.md), [a site](https://example.org/x).
Not paths: `/ws/chat`, `redis://127.0.0.1:6380/0`, `.local/store/`, `../shared/data`, `python -m bench.<name>`.
"""


def test_the_checker_passes_a_text_whose_names_exist(checkout):
    assert problems(GOOD, checkout) == []


def test_the_checker_fails_when_a_named_path_is_removed(checkout):
    (checkout / "frontdoor_demo" / "recall.py").unlink()
    found = problems(GOOD, checkout)
    assert "path `frontdoor_demo/recall.py` does not exist" in found
    assert "`python -m frontdoor_demo.recall`: no such module" in found


def test_the_checker_fails_when_a_linked_page_or_heading_is_gone(checkout):
    (checkout / "docs" / "memory.md").write_text("# How memory works\n\n## Recall\n")
    found = problems(GOOD, checkout)
    assert any("no heading #recall-the-archive-of-folded-turns" in p for p in found), found
    (checkout / "docs" / "memory.md").unlink()
    assert any(p.startswith("link 'docs/memory.md'") for p in problems(GOOD, checkout))


@pytest.mark.parametrize("text, expected", [
    ("Run `make deploy`.", "`make deploy`: no such target in the Makefile"),
    ("    make install\n", "`make install`: no such target in the Makefile"),
    ("Run `python -m no_such_module_of_this_checkout`.", "`python -m no_such_module_of_this_checkout`: no such module"),
    ("See `docs/settings.md`.", "path `docs/settings.md` does not exist"),
    ("See `tests/test_*.py`.", "path `tests/test_*.py` does not exist"),
    ("See `Procfile.dev`.", "path `Procfile.dev` does not exist"),
    ("See [the map](docs/architecture.md).", "link 'docs/architecture.md': no docs/architecture.md"),
    ("See [recall](#recall).", "link '#recall': no heading #recall in README.md"),
])
def test_the_checker_names_what_is_missing(checkout, text, expected):
    (checkout / "README.md").write_text(text)
    assert expected in problems(text, checkout)


def test_a_heading_anchor_is_githubs():
    assert slug("Deployment (Heroku-style)") == "deployment-heroku-style"
    assert slug("The rules: data, measured one by one") == "the-rules-data-measured-one-by-one"
    assert slug("What `make` installs") == "what-make-installs"
    assert anchors("# A\n## Notes\n## Notes\n```\n# not a heading\n```\n") == {"a", "notes", "notes-1"}
