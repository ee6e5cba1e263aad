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
trials left are no more than the runs still needed (:func:`next_run`), queued by :func:`enqueue`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import optuna
from optuna.trial import TrialState

from autotune.store.record import finished, read
from autotune.store.study_view import Measured, config_key, measured_configs

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


def enqueue(study: optuna.Study, *, budget_trials: int | None, candidates: int, measurements: int, maximize: bool,
            pending: Sequence[dict[str, Any]] = ()) -> None:
    """Queue the next confirmation run of ``study`` (:func:`next_run`), if one is due now: the
    parameters of the first trial of the configuration, user attr ``confirms`` its number.
    Nothing while another trial waits in the queue. ``pending``: the applied parameters of the
    trials running now."""
    runs = reserve(budget_trials)
    if not runs or candidates < 1 or study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        return
    trials = study.get_trials(deepcopy=False)
    done = finished(study)
    again = next_run(
        measured_configs([read(t) for t in done]), left=int(budget_trials or 0) - len(done) - len(pending),
        spent=sum(1 for t in trials if "confirms" in t.user_attrs and t.state != TrialState.WAITING),
        reserve_runs=runs, candidates=candidates, measurements=measurements, maximize=maximize, pending=pending)
    if again is None:
        return
    first = next(t for t in done if t.number == again.trials[0])
    study.enqueue_trial(dict(first.params), user_attrs={"confirms": first.number})


__all__ = ["MIN_BUDGET", "SHARE", "enqueue", "next_run", "reserve", "shortfall"]
