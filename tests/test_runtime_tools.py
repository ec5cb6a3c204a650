"""The built-in tools and the MCP-style resources, without a server."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from app.memory.tokens import TokenCounter
from app.runtime.budget import TRUNCATED, Room
from app.runtime.resources import RESOURCE_DIR, ResourceError, list_resources, read_resource
from app.runtime.tools import CalculatorError, calculate, current_time, parse_arguments, run_tool, tool_specs


@pytest.mark.parametrize("expression, expected", [
    ("1+1", "2"), ("1+1=?", "2"), ("1+1 =", "2"), ("2*(3+4)", "14"), ("7//2", "3"), ("-7//2", "-4"),
    ("7 % 3", "1"), ("-3 % 5", "2"), ("10/4", "2.5"), ("1/3", "0.333333333333"), ("2**10", "1024"),
    ("2^10", "1024"), ("6×7", "42"), ("84÷2", "42"), ("+-+3", "-3"), ("2**-1", "0.5"), ("0.1+0.2", "0.3"),
    ("1e3*2", "2000"), ("(((1)))", "1"), ("3.0*2", "6"), ("10**299", "1" + "0" * 299),
])
def test_calculator_evaluates_arithmetic(expression, expected):
    assert calculate(expression) == expected


@pytest.mark.parametrize("expression, message", [
    ("__import__('os').system('ls')", "only numbers, + - * / // % ** and parentheses are allowed"),
    ("abs(-1)", "only numbers, + - * / // % ** and parentheses are allowed"),
    ("x + 1", "only numbers, + - * / // % ** and parentheses are allowed"),
    ("[1, 2]", "only numbers, + - * / // % ** and parentheses are allowed"),
    ("True + 1", "only numbers, + - * / // % ** and parentheses are allowed"),
    ("1j * 2", "only numbers, + - * / // % ** and parentheses are allowed"),
    ("'a' * 3", "only numbers, + - * / // % ** and parentheses are allowed"),
    ("1 < 2", "only numbers, + - * / // % ** and parentheses are allowed"),
    ("1 / 0", "division by zero"), ("5 // 0", "division by zero"), ("5 % 0", "division by zero"),
    ("0 ** -1", "division by zero"),
    ("9**9**9", "the power is too large"), ("2**100000", "the power is too large"),
    ("10**300", "the result is too large"), ("10**200 * 10**200", "the result is too large"),
    ("1e308 * 10", "the result is not a finite number"), ("(-8) ** 0.5", "the result is not a real number"),
    ("1 +", "that is not an arithmetic expression"), ("", "give an arithmetic expression, e.g. 2*(3+4)"),
    ("1+" * 150 + "1", "the expression is longer than 200 characters"),
    ("+".join(["1"] * 40), "the expression is too long"),
])
def test_calculator_refuses_everything_else(expression, message):
    with pytest.raises(CalculatorError) as caught:
        calculate(expression)
    assert str(caught.value) == message


def test_current_time_in_a_zone():
    fixed = lambda zone: datetime(2026, 7, 1, 10, 30, tzinfo=timezone.utc).astimezone(zone)  # noqa: E731
    assert current_time("Europe/Paris", now=fixed) == "2026-07-01T12:30:00+02:00 (Wednesday, Europe/Paris)"
    assert current_time("America/New_York", now=fixed) == "2026-07-01T06:30:00-04:00 (Wednesday, America/New_York)"
    assert current_time("", now=fixed) == "2026-07-01T10:30:00+00:00 (Wednesday, UTC)"
    for bad in ("Mars/Olympus", "../../etc/passwd", "/etc/localtime"):
        with pytest.raises(ValueError):
            current_time(bad)


def test_resources_list_the_local_documents():
    listed = [r.describe() for r in list_resources()]
    assert listed == [
        {"uri": "resource://docs/commands", "name": "commands", "title": "Chat commands", "mimeType": "text/markdown"},
        {"uri": "resource://docs/deployment", "name": "deployment", "title": "Running the service",
         "mimeType": "text/markdown"},
        {"uri": "resource://docs/memory", "name": "memory", "title": "How this chat remembers",
         "mimeType": "text/markdown"},
        {"uri": "resource://docs/tools", "name": "tools", "title": "Built-in tools", "mimeType": "text/markdown"},
    ]
    assert read_resource("resource://docs/memory") == (RESOURCE_DIR / "memory.md").read_text()
    assert read_resource("resource://docs/memory.md") == (RESOURCE_DIR / "memory.md").read_text()


@pytest.mark.parametrize("uri", ["resource://docs/../../app/settings", "resource://docs/", "file:///etc/passwd",
                                 "resource://docs/secret_key", "docs/memory.md", None, 42])
def test_resources_outside_the_list_are_refused(uri):
    with pytest.raises(ResourceError):
        read_resource(uri)


def test_long_resources_are_cut(tmp_path):
    (tmp_path / "big.md").write_text("# Big\n" + "x" * 9000)
    text = read_resource("resource://docs/big", directory=tmp_path)
    assert len(text) == 8000 + len("\n[truncated]") and text.endswith("\n[truncated]")


def test_tool_specs_name_the_resources():
    specs = tool_specs()
    assert [s["function"]["name"] for s in specs] == ["calculator", "current_time", "read_resource"]
    description = specs[2]["function"]["description"]
    assert "resource://docs/memory (How this chat remembers)" in description
    assert all(s["function"]["parameters"]["additionalProperties"] is False for s in specs)


def test_run_tool_never_raises():
    assert run_tool("calculator", '{"expression": "6*7"}') == run_tool("calculator", {"expression": "6*7"})
    ok = run_tool("calculator", '{"expression": "6*7"}')
    assert (ok.result, ok.ok, ok.source, ok.arguments) == ("42", True, "tool", {"expression": "6*7"})
    bad_json = run_tool("calculator", "{not json")
    assert (bad_json.result, bad_json.ok, bad_json.arguments) == (
        "error: the arguments must be a JSON object", False, "{not json")
    resource = run_tool("read_resource", '{"uri": "resource://docs/nope"}')
    assert resource.ok is False and resource.source == "mcp-resource"
    assert resource.result.startswith("error: unknown resource 'resource://docs/nope'; available: resource://docs/")
    assert run_tool("rm", "{}").result == "error: there is no tool named 'rm'"
    assert run_tool("current_time", "").result.endswith(", UTC)")
    assert parse_arguments("x" * 3000)[0] == "x" * 2000 + "…"


def test_room_clips_to_the_tokens_left():
    counter = TokenCounter()
    room = Room(counter, budget=100, used=40)
    assert room.left == 60
    room.take(70)
    assert room.left == 0
    long_text = "word " * 500
    clipped = room.clip(long_text, 50)
    assert counter.count(clipped) <= 50 and clipped.endswith(TRUNCATED) and long_text.startswith(clipped[:100])
    assert room.clip("short text", 50) == "short text"
    assert room.clip(long_text, 0) == ""
