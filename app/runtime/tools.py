"""The built-in tools offered to the chat model (OpenAI tools API).

* ``calculator``: arithmetic parsed with ``ast``; only numbers, ``+ - * / // % **``, unary
  ``+``/``-`` and parentheses are evaluated, with limits on length, size and powers (no ``eval``).
* ``current_time``: the current time in an IANA time zone (``zoneinfo``).
* ``read_resource``: one of the local documents served as MCP-style resources.

A tool never raises into the turn: bad arguments give an ``error: ...`` result the
model can read.  Arguments and results are runtime data, shown to the person as
display-only ``tool`` frames and never written to memory.
"""

from __future__ import annotations

import ast
import json
import math
import operator
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any, Callable, cast
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from app.runtime.resources import ResourceError, list_resources, read_resource

MAX_EXPRESSION_CHARS = 200
MAX_NODES = 64
MAX_INT_DIGITS = 300       # an intermediate integer may have at most this many digits
MAX_POW_RESULT_BITS = 1000  # ``a ** b`` is refused when the result would need more bits
MAX_ARGUMENT_CHARS = 2000  # longest raw arguments string accepted from the model

TOOL_SOURCE = "tool"
RESOURCE_SOURCE = "mcp-resource"


class CalculatorError(ValueError):
    """The expression is not plain arithmetic, or is too big; the message is for the model."""


_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}
_UNARY: dict[type, Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def _check_size(value: int | float) -> int | float:
    if isinstance(value, int) and value and math.log10(abs(value)) >= MAX_INT_DIGITS:
        raise CalculatorError("the result is too large")
    if isinstance(value, float) and not math.isfinite(value):
        raise CalculatorError("the result is not a finite number")
    return value


def _power(base: int | float, exponent: int | float) -> int | float:
    if isinstance(base, int) and isinstance(exponent, int) and exponent > 0 and abs(base) > 1:
        if exponent * math.log2(abs(base)) > MAX_POW_RESULT_BITS:
            raise CalculatorError("the power is too large")
    if isinstance(exponent, (int, float)) and abs(exponent) > 10_000:
        raise CalculatorError("the exponent is too large")
    try:
        result = operator.pow(base, exponent)
    except OverflowError:
        raise CalculatorError("the result is too large") from None
    except ZeroDivisionError:
        raise CalculatorError("division by zero") from None
    if isinstance(result, complex):
        raise CalculatorError("the result is not a real number")
    return result


def _evaluate(node: ast.AST) -> int | float:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _check_size(cast("int | float", node.value))  # the type check above (mypy cannot narrow by it)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _check_size(_UNARY[type(node.op)](_evaluate(node.operand)))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow):
            return _check_size(_power(left, right))
        try:
            return _check_size(_BINARY[type(node.op)](left, right))
        except ZeroDivisionError:
            raise CalculatorError("division by zero") from None
        except OverflowError:
            raise CalculatorError("the result is too large") from None
    raise CalculatorError("only numbers, + - * / // % ** and parentheses are allowed")


def calculate(expression: object) -> str:
    """Evaluate plain arithmetic and return the result as text.

    ``^`` means power, ``×``/``÷`` are accepted, and a trailing ``=`` or ``=?`` is ignored
    (``"1+1=?"`` gives ``"2"``).  Floats are shown with 12 significant digits.

    Raises:
        CalculatorError: anything but arithmetic on numbers, or a result that is too big.
    """
    if not isinstance(expression, str) or not expression.strip():
        raise CalculatorError("give an arithmetic expression, e.g. 2*(3+4)")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"the expression is longer than {MAX_EXPRESSION_CHARS} characters")
    text = expression.strip().rstrip("?").strip().rstrip("=").strip()
    text = text.replace("^", "**").replace("×", "*").replace("÷", "/")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError):
        raise CalculatorError("that is not an arithmetic expression") from None
    if sum(1 for _ in ast.walk(tree)) > MAX_NODES:
        raise CalculatorError("the expression is too long")
    value = _evaluate(tree)
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        return format(value, ".12g")
    return str(value)


def current_time(timezone: str = "UTC", *, now: Callable[[ZoneInfo], datetime] | None = None) -> str:
    """The current date and time in the IANA time zone ``timezone``, e.g.
    ``"2026-11-30T13:00:00+01:00 (Monday, Europe/Paris)"``.

    Raises:
        ValueError: ``timezone`` is not a known IANA zone.
    """
    name = (timezone or "UTC").strip() if isinstance(timezone, str) else ""
    if not name or len(name) > 64 or ".." in name or name.startswith("/"):
        raise ValueError("give an IANA time zone such as Europe/Paris")
    try:
        zone = ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown time zone {name!r}; use an IANA name such as Europe/Paris") from None
    moment = now(zone) if now else datetime.now(zone)
    return f"{moment.isoformat(timespec='seconds')} ({moment.strftime('%A')}, {name})"


@lru_cache(maxsize=1)
def tool_specs() -> list[dict]:
    """The ``tools`` parameter for chat completions (JSON Schema per function).

    Built once per process (the resource documents ship with the code); treat it as read-only.
    """
    resources = list_resources()
    listing = "; ".join(f"{r.uri} ({r.title})" for r in resources) or "none"
    return [
        {"type": "function", "function": {
            "name": "calculator",
            "description": "Exact arithmetic. Numbers with + - * / // % ** and parentheses only.",
            "parameters": {"type": "object", "properties": {
                "expression": {"type": "string", "description": "e.g. (12.5 * 4) / 3"}},
                "required": ["expression"], "additionalProperties": False}}},
        {"type": "function", "function": {
            "name": "current_time",
            "description": "The current date and time in an IANA time zone.",
            "parameters": {"type": "object", "properties": {
                "timezone": {"type": "string", "description": "IANA zone, e.g. Europe/Paris; default UTC"}},
                "required": [], "additionalProperties": False}}},
        {"type": "function", "function": {
            "name": "read_resource",
            "description": "Read one of this project's documents (MCP-style resources). Available: " + listing,
            "parameters": {"type": "object", "properties": {
                "uri": {"type": "string", "description": "resource://docs/<name>"}},
                "required": ["uri"], "additionalProperties": False}}},
    ]


@dataclass(frozen=True)
class ToolOutcome:
    """One executed tool call.

    Attributes:
        name: the tool's name as the model gave it.
        arguments: the parsed arguments (a dict), or the raw string when it was not JSON.
        result: the text returned to the model (``error: ...`` on failure).
        ok: False when the call failed.
        source: ``tool``, or ``mcp-resource`` for a resource read.
    """

    name: str
    arguments: Any
    result: str
    ok: bool
    source: str = TOOL_SOURCE


def parse_arguments(raw: Any) -> tuple[Any, dict | None]:
    """``(shown, parsed)``: what to display and the argument dict (None when not a JSON object)."""
    if isinstance(raw, dict):
        return raw, raw
    text = raw if isinstance(raw, str) else ""
    if len(text) > MAX_ARGUMENT_CHARS:
        return text[:MAX_ARGUMENT_CHARS] + "…", None
    try:
        parsed = json.loads(text) if text.strip() else {}
    except ValueError:
        return text, None
    return (parsed, parsed) if isinstance(parsed, dict) else (text, None)


def run_tool(name: str, raw_arguments: Any) -> ToolOutcome:
    """Execute the built-in tool ``name``; never raises."""
    shown, args = parse_arguments(raw_arguments)
    source = RESOURCE_SOURCE if name == "read_resource" else TOOL_SOURCE
    if args is None:
        return ToolOutcome(name, shown, "error: the arguments must be a JSON object", False, source)
    try:
        if name == "calculator":
            result = calculate(args.get("expression"))
        elif name == "current_time":
            result = current_time(args.get("timezone") or "UTC")
        elif name == "read_resource":
            result = read_resource(args.get("uri"))
        else:
            return ToolOutcome(name, shown, f"error: there is no tool named {name!r}", False, TOOL_SOURCE)
    except (CalculatorError, ResourceError, ValueError) as exc:
        return ToolOutcome(name, shown, f"error: {exc}", False, source)
    return ToolOutcome(name, shown, result, True, source)
