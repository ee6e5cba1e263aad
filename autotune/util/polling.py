"""Deadline polling: run a check now and then every ``interval_s`` until it holds or time is up.

:func:`polling` is the loop itself, for bodies that do more than answer yes or no; :func:`wait_until`
is the common case of a predicate. Each turn checks first, then stops if the deadline has passed,
else sleeps ``interval_s``: the last check is the first one to end at or after the deadline.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

__all__ = ["polling", "wait_until"]


def polling(timeout_s: float, interval_s: float) -> Iterator[float]:
    """Yield at once, then again ``interval_s`` after each turn of the caller's loop body, until a
    turn ends at or after ``timeout_s`` from the first yield; each value is the time left (>= 0).

    A ``for`` loop over it runs its body at least once; its ``else`` runs when the time is up.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        yield max(0.0, deadline - time.monotonic())
        if time.monotonic() >= deadline:
            return
        time.sleep(interval_s)


def wait_until(predicate: Callable[[], bool], timeout_s: float, interval_s: float) -> bool:
    """Call ``predicate`` now and every ``interval_s`` until it returns true (True) or a call
    after ``timeout_s`` returned false (False)."""
    return any(predicate() for _ in polling(timeout_s, interval_s))
