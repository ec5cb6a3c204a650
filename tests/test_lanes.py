"""The fast lane is chosen by the fixtures a test uses (``tests/fixtures/lanes.py``): a test that reaches a
process-starting fixture, directly or through other fixtures, is ``slow`` (or ``browser``) by construction."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.fixtures.lanes import starts_processes

TESTS = Path(__file__).resolve().parent

CONFTEST = '''
import pytest

from tests.fixtures.lanes import starts_processes

pytest_plugins = ["tests.fixtures.lanes"]


@pytest.fixture(scope="session")
@starts_processes()
def web_process():
    return "started"


@pytest.fixture(scope="session")
@starts_processes("browser")
def browser():
    return "page"


@pytest.fixture
def through_web(web_process):
    return web_process


@pytest.fixture
def plain():
    return 1
'''

TESTS_MODULE = '''
import pytest


def test_direct(web_process):
    pass


def test_through_another_fixture(through_web):
    pass


def test_browser(browser):
    pass


def test_plain(plain):
    pass


def test_nothing():
    pass


class TestOverride:
    @pytest.fixture
    def web_process(self):  # overrides the process fixture without using it: starts nothing
        return "stand-in"

    def test_overridden(self, web_process):
        pass
'''


def test_a_test_is_slow_when_it_uses_a_process_fixture_directly_or_through_another_fixture(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_sample=TESTS_MODULE)
    passed, skipped, failed = pytester.inline_run("-p", "no:randomly").listoutcomes()
    assert (len(passed), skipped, failed) == (6, [], [])
    lanes = {report.nodeid.rsplit("::", 1)[1]: sorted({"slow", "browser"} & set(report.keywords))
             for report in passed}
    assert lanes == {"test_direct": ["slow"], "test_through_another_fixture": ["slow"], "test_browser": ["browser"],
                     "test_plain": [], "test_nothing": [], "test_overridden": []}


def test_only_the_two_lanes_can_be_declared():
    with pytest.raises(ValueError):
        starts_processes("fast")


def test_the_suites_process_fixtures_mark_their_tests(request):
    """In this suite: the fixtures that start the Procfile's processes, the bundled model, a cluster and a
    browser are declared (their definitions carry the lane)."""
    manager = request.session._fixturemanager
    lanes = {}
    for name in ("procfile", "bundled_model", "redis_cluster", "amqp_url", "chromium"):
        (definition,) = manager.getfixturedefs(name, request.node)
        lanes[name] = getattr(definition.func, "_starts_processes_lane", None)
    assert lanes == {"procfile": "slow", "bundled_model": "slow", "redis_cluster": "slow", "amqp_url": "slow",
                     "chromium": "browser"}


HELPERS = {
    "chat_support.processes": {"start"},
    "tests.fixtures.deployed_web": {"deployed_web", "start_web"},
    "tests.helpers.model_server": {"start_model_server", "stop_model_server"},
}
"""Process-starting helpers a test module reaches only through the ``procfile`` and ``bundled_model`` fixtures."""


def test_no_test_module_imports_a_process_starting_helper():
    found = []
    for path in sorted(TESTS.glob("test_*.py")):
        source = path.read_text()
        if not any(module in source for module in HELPERS):
            continue
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ImportFrom) and node.module in HELPERS:
                found += [f"{path.name}: {alias.name}" for alias in node.names if alias.name in HELPERS[node.module]]
    assert found == [], "use the procfile / bundled_model fixtures (tests/fixtures/processes.py)"
