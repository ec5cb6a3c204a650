"""Waiting for something to happen, without sleeping as an assertion."""

from __future__ import annotations

import time
from typing import Callable, TypeVar

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], timeout: float = 10.0, message: str = "condition",
               interval: float = 0.02) -> T:
    """Poll ``predicate`` every ``interval`` seconds until it returns a truthy value, which is returned.

    Raises:
        TimeoutError: ``timeout`` seconds passed first (the message names ``message``).
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout} s waiting for {message}")
        time.sleep(interval)
