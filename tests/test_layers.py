"""The import layers of docs/architecture.md, checked by import-linter (contracts in pyproject.toml).

The check runs on the repository as it is (every contract kept) and on copies of it where one
import runs back up (each such copy breaks a contract), so the check cannot pass by accident.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINT = [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command; "
        "sys.exit(lint_imports_command())"]


def lint(root: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(LINT + ["--config", str(root / "pyproject.toml"), "--no-cache"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=120)


def test_every_layer_contract_is_kept():
    result = lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 kept, 0 broken" in result.stdout


@pytest.mark.parametrize("module, line, contract", [
    ("app/runtime/tool_chat.py", "from app.chat.turn import Turn", "Layers"),
    ("app/chat/turn.py", "import workers.tasks", "app never imports workers"),
    ("app/store/thread_store.py", "from app.observability import metrics", "Layers"),
    ("app/store/provider_caps.py", "from app.llm.provider import LLMError", "Layers"),
    ("app/chat/ws.py", "from app.web.security import origin_allowed", "Layers"),
    ("app/memory/state.py", "from app.settings import Settings", "Layers"),
    ("app/memory/compaction/facts.py", "import redis", "memory is pure Python"),
    # only `if TYPE_CHECKING:` imports are left out (exclude_type_checking_imports): one that runs still counts
    ("app/runtime/capabilities.py", "from app.extensions import Services", "Layers"),
])
def test_an_import_running_back_up_breaks_a_contract(tmp_path, module, line, contract):
    copy = tmp_path / "repo"
    copy.mkdir()
    for name in ("app", "workers"):
        shutil.copytree(ROOT / name, copy / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("celery_app.py", "wsgi.py", "pyproject.toml"):
        shutil.copy(ROOT / name, copy / name)
    target = copy / module
    target.write_text(target.read_text() + "\n" + line + "  # injected by the test\n")
    result = lint(copy)
    assert result.returncode != 0
    broken = [row for row in result.stdout.splitlines() if row.endswith("BROKEN")]
    assert any(contract in row for row in broken), result.stdout


# -- tests, benchmarks and the support package ------------------------------------------------------------------

def imported_roots(source: str) -> set[str]:
    """The top-level names of every absolute import in ``source`` (lazy ones inside functions too)."""
    import ast

    roots = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def test_bench_scripts_and_support_never_import_the_tests_and_the_app_imports_none_of_them():
    """README: Layout.  The tests import chat_support (support/), never the other way round; bench/ and scripts/
    import no tests module; the app imports none of tests, bench, scripts or chat_support."""
    assert imported_roots("def f():\n    from tests.fixtures.x import y\nimport bench.replay") == {"tests", "bench"}
    found = {}
    for folder, forbidden in (("bench", {"tests"}), ("scripts", {"tests"}), ("support", {"tests", "bench"}),
                              ("app", {"tests", "bench", "scripts", "chat_support"}),
                              ("workers", {"tests", "bench", "scripts", "chat_support"})):
        files = sorted((ROOT / folder).rglob("*.py"))
        assert files, folder
        for path in files:
            bad = imported_roots(path.read_text()) & forbidden
            if bad:
                found[str(path.relative_to(ROOT))] = sorted(bad)
    assert found == {}
