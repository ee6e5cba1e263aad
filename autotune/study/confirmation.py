"""Confirmation: the last trials of a budget measure the best configurations again.

A measurement carries run-to-run noise (2% and more on a real server), and the best of 40 single
measurements is the luckiest of them: it reads high, and it may not be the best configuration.
So the study ends by measuring its top candidates again: the ``candidates`` best configurations
by the mean of their measurements, until each has ``measurements`` of them. The best is then
chosen on those means (:func:`autotune.store.study_view.best_view`) and reported with its count and
interval (``study best``, the exported profile). A configuration that was lucky drops when
measured again, and the next one becomes a candidate in its turn while the reserve lasts.

The runs come out of the trial budget, at most :data:`SHARE` of it (none below
:data:`MIN_BUDGET` trials, and none for a budget in hours only): the driver starts them when the
trials left are no more than the runs still needed (:func:`next_run`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from autotune.store.study_view import Measured, config_key

SHARE = 0.2
"""The largest share of the trial budget that confirmation runs take."""
MIN_BUDGET = 10
"""A trial budget below this has no confirmation runs."""


def reserve(budget_trials: int | None) -> int:
    """How many of ``budget_trials`` confirmation may take (see the module docstring)."""
    if budget_trials is None or budget_trials < MIN_BUDGET:
        return 0
    return int(budget_trials * SHARE)


def shortfall(configs: Sequence[Measured], *, candidates: int, measurements: int, maximize: bool,
              pending: Sequence[dict[str, Any]] = ()) -> list[tuple[Measured, int]]:
    """The top ``candidates`` configurations by mean that have fewer than ``measurements``
    measurements, best first, each with how many more it needs; ``pending``: the applied
    parameters of trials running now, counted as measurements to come."""
    running: dict[str, int] = {}
    for params in pending:
        key = config_key(params)
        running[key] = running.get(key, 0) + 1
    top = sorted(configs, key=lambda m: m.mean, reverse=maximize)[:candidates]
    out = []
    for m in top:
        need = measurements - m.count - running.get(config_key(m.params), 0)
        if need > 0:
            out.append((m, need))
    return out


def next_run(configs: Sequence[Measured], *, left: int, spent: int, reserve_runs: int, candidates: int,
             measurements: int, maximize: bool, pending: Sequence[dict[str, Any]] = ()) -> Measured | None:
    """The configuration to measure again now, or None to search on.

    ``left``: trials the budget has left, this one included; ``spent``: confirmation runs made
    so far; ``reserve_runs``: :func:`reserve` of the budget. Confirmation starts once ``left``
    is no more than the runs still needed (within what the reserve has left) and goes to the
    best candidate short of measurements.
    """
    if candidates < 1 or reserve_runs - spent < 1:
        return None
    short = shortfall(configs, candidates=candidates, measurements=measurements, maximize=maximize, pending=pending)
    needed = min(sum(n for _, n in short), reserve_runs - spent)
    if not short or left > needed:
        return None
    return short[0][0]


__all__ = ["MIN_BUDGET", "SHARE", "next_run", "reserve", "shortfall"]
