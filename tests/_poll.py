"""Waiting in tests for a condition instead of for a guessed time.

A fixed ``time.sleep`` before an assertion is too short on a loaded 2-core machine and too long everywhere else;
:func:`wait_for` polls the condition itself, returns as soon as it holds and fails with what it waited for. The
timeout is a hang guard, not a claim about speed (CONTRIBUTING.md: no timed assertions).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["wait_for"]

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], timeout: float = 30.0, interval: float = 0.05, what: str = "") -> T:
    """Call ``predicate`` until it returns something true, and return that.

    Parameters
    ----------
    predicate
        Checked at once, then every ``interval`` seconds.
    timeout
        Seconds after which the test fails (an ``AssertionError`` naming ``what``).
    what
        The condition in words, for the failure message (default: the predicate's name).

    >>> wait_for(lambda: 42)
    42
    """
    deadline = time.monotonic() + timeout
    while True:
        got = predicate()
        if got:
            return got
        if time.monotonic() > deadline:
            name = what or getattr(predicate, "__name__", repr(predicate))
            raise AssertionError(f"timed out after {timeout:g} s waiting for {name}")
        time.sleep(interval)
