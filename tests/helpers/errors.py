"""Answers that must not show exception text: no error names, no connection details, no traceback."""

from __future__ import annotations

LEAKY = ("Error", "error 111", "refused", "Connection", "Timeout", "redis", "Redis", "127.0.0.1", "Traceback")


def assert_no_exception_text(raw: str):
    """``raw`` (a response body, frames as JSON) holds none of ``LEAKY``."""
    for fragment in LEAKY:
        assert fragment not in raw, fragment
