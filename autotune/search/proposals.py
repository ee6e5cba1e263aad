"""The default sampler's proposal policies, other than TPE's own draws.

Each is a function of the study's finished trials and a seeded ``random.Random``, so that
:class:`~autotune.search.samplers.CrashAwareTPESampler` stays reproducible:

- :func:`screening`: whether a trial is one of the baseline's one-at-a-time screen;
- :func:`next_parameter` and :func:`least_explored`: a coverage probe's parameter (a shuffled
  cycle, the one probed least around the incumbent first) and value (from the part of its range
  measured least: a categorical's least-tried choice, a number's least-tried of
  :data:`PROBE_BINS` equal bins, on its log scale if it has one);
- :func:`raised_to`: the value a raise the engine's log calls for proposes;
- :func:`back_off`: while nothing has run, the baseline with each parameter the space declares
  monotone for a failure kind seen moved to the safe side of those failures (a bisection).
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import FrozenTrial

from autotune.analysis.conditions import is_number
from autotune.store.record import failed_kind, is_measured

MAX_DRAWS = 20
"""Redraws of a proposal (or of a value inside an interval) before giving up."""
PROBE_BINS = 4
"""Bins of a numeric parameter's range that a probe chooses the least explored of."""


def snap(dist: IntDistribution | FloatDistribution, x: float) -> Any:
    """``x`` on ``dist``'s grid (an int, or a float on its step) and inside its range."""
    if isinstance(dist, IntDistribution):
        return min(dist.high, max(dist.low, dist.low + round((x - dist.low) / dist.step) * dist.step))
    if dist.step is not None:
        x = round(dist.low + round((x - dist.low) / dist.step) * dist.step, 10)
    return min(dist.high, max(dist.low, x))


def screening(trial: FrozenTrial, finished: Sequence[FrozenTrial], search_space: Mapping[str, BaseDistribution]) -> bool:
    """Whether ``trial`` is one of the baseline's one-at-a-time screen: the baseline (the trial
    marked ``baseline``) is finished and ran, and ``trial`` is among the
    ``len(search_space) + 1`` trials after it (one per parameter, and room for a raise, which
    goes first)."""
    baseline = baseline_of(finished)
    return (baseline is not None and is_measured(baseline)
            and baseline.number < trial.number <= baseline.number + len(search_space) + 1)


def baseline_of(finished: Sequence[FrozenTrial]) -> FrozenTrial | None:
    """The finished trial marked ``baseline`` (the driver enqueues it first), or None."""
    return next((t for t in finished if t.user_attrs.get("baseline")), None)


def probed_around(incumbent: FrozenTrial, finished: Sequence[FrozenTrial],
                  search_space: Mapping[str, BaseDistribution]) -> Counter[str]:
    """For each parameter, how many of ``finished`` differ from ``incumbent`` in it alone (as
    proposed, failed ones included)."""
    ref = incumbent.params
    differs = ([n for n in search_space if n in t.params and n in ref and t.params[n] != ref[n]] for t in finished)
    return Counter(d[0] for d in differs if len(d) == 1)


def raised_to(dist: BaseDistribution, target: float) -> Any:
    """The value of ``dist`` a raise to ``target`` proposes: ``target`` snapped into an int or
    float range (its end at most); of a categorical's numeric choices the smallest at least
    ``target``, else the largest (its other choices, such as ``unset``, are never raised to).
    None: no numeric value."""
    if isinstance(dist, (IntDistribution, FloatDistribution)):
        return snap(dist, min(dist.high, target))
    if isinstance(dist, CategoricalDistribution):
        numbers = sorted(c for c in dist.choices if is_number(c))
        return next((c for c in numbers if c >= target), numbers[-1] if numbers else None)
    return None


def next_parameter(cycle: list[str], rng: random.Random, search_space: Mapping[str, BaseDistribution],
                   incumbent: FrozenTrial, finished: Sequence[FrozenTrial]) -> str:
    """The parameter to probe next, taken off ``cycle`` (a shuffled cycle of the parameters,
    refilled and shuffled with ``rng`` when empty; updated in place): of those left in it, the
    one probed least around ``incumbent`` (:func:`probed_around`), ties in the cycle's order."""
    cycle[:] = [n for n in cycle if n in search_space]
    if not cycle:
        cycle[:] = sorted(search_space)
        rng.shuffle(cycle)
    around = probed_around(incumbent, finished, search_space)
    name = min(reversed(cycle), key=lambda n: around.get(n, 0))  # ties: the cycle's order
    cycle.remove(name)
    return name


def least_explored(rng: random.Random, finished: Sequence[FrozenTrial], name: str, dist: BaseDistribution,
                   current: Any, rank: int = 0) -> Any:
    """A value of ``name`` from the part of its range the measured trials explored least
    (other than the current value's), ties broken at random; ``rank`` 1, 2, ... take the
    next least explored part (cycling), for a redraw."""
    seen = [t.params[name] for t in finished if name in t.params and is_measured(t)]
    if isinstance(dist, CategoricalDistribution):
        counts = {i: 0 for i in range(len(dist.choices))}
        for v in seen:
            counts[dist.choices.index(v)] += 1
        here = dist.choices.index(current) if current in dist.choices else -1
        order = sorted((c, rng.random(), i) for i, c in counts.items() if i != here)
        return dist.choices[order[rank % len(order)][2]] if order else current
    assert isinstance(dist, (IntDistribution, FloatDistribution))
    scale = math.log if dist.log else float
    lo, hi = scale(dist.low), scale(dist.high)
    if hi <= lo:
        return current

    def bin_of(x: float) -> int:
        return min(PROBE_BINS - 1, int((scale(x) - lo) / (hi - lo) * PROBE_BINS))

    counts = [0] * PROBE_BINS
    for v in seen:
        counts[bin_of(v)] += 1
    order = sorted((c, rng.random(), i) for i, c in enumerate(counts) if i != bin_of(current))
    i = order[rank % len(order)][2]
    y = rng.uniform(lo + (hi - lo) * i / PROBE_BINS, lo + (hi - lo) * (i + 1) / PROBE_BINS)
    return snap(dist, math.exp(y) if dist.log else y)


def back_off(rng: random.Random, monotone: Mapping[str, Mapping[str, str]], finished: Sequence[FrozenTrial],
             search_space: Mapping[str, BaseDistribution]) -> dict[str, Any] | None:
    """The baseline (else the first trial) with each parameter declared monotone for a failure
    kind of its line moved to the safe side of those failures, a value drawn with :func:`between`
    (successive back-offs halve the interval); its line: it and the failed trials with its values
    on every other parameter. None: it did not fail with a declared kind, or no parameter has
    room to move."""
    ref = baseline_of(finished) or finished[0]
    if any(n not in ref.params for n in search_space):
        return None
    # a value such as unset stands apart from a declaration (no speculation is not "fewer
    # draft tokens" on its scale): such a parameter is kept as the reference has it
    moving = {n for n in search_space
              if is_number(ref.params[n]) and any(k in monotone.get(n, {}) for k in _kinds([ref]))}
    line = [t for t in finished if failed_kind(t) and all(
        t.params.get(n) == ref.params[n] for n in search_space if n not in moving)]
    proposal, moved = dict(ref.params), False
    for name in sorted(moving):
        dist, declared = search_space[name], monotone[name]
        above = [t.params[name] for t in line if declared.get(failed_kind(t)) == "down" and is_number(t.params[name])]
        below = [t.params[name] for t in line if declared.get(failed_kind(t)) == "up" and is_number(t.params[name])]
        if not above and not below:  # no failure of its line is of a kind declared for it
            continue
        value = between(rng, dist, max(above) if above else None, min(below) if below else None)
        if value is not None:
            proposal[name], moved = value, True
    return {n: proposal[n] for n in search_space} if moved else None


def between(rng: random.Random, dist: BaseDistribution, lo: Any, hi: Any) -> Any:
    """A value of ``dist`` strictly between ``lo`` and ``hi`` (None: the range's end), drawn
    uniformly (on the log scale where it has one; a categorical: among its numeric choices in
    order); None where there is none."""
    if isinstance(dist, CategoricalDistribution):
        inside = [c for c in dist.choices if is_number(c) and (lo is None or c > lo) and (hi is None or c < hi)]
        return rng.choice(inside) if inside else None
    assert isinstance(dist, (IntDistribution, FloatDistribution))
    low = dist.low if lo is None else lo
    high = dist.high if hi is None else hi
    step = dist.step  # an IntDistribution's is at least 1
    if step is not None:  # the grid's points strictly inside
        first = dist.low + math.floor((low - dist.low) / step + 1e-9) * step + (step if lo is not None else 0)
        last = dist.low + math.ceil((high - dist.low) / step - 1e-9) * step - (step if hi is not None else 0)
        if first > last + 1e-9:
            return None
    scale, unscale = (math.log, math.exp) if dist.log else (float, float)
    for _ in range(MAX_DRAWS):
        x = unscale(rng.uniform(scale(low), scale(high)))
        if step is not None:
            x = snap(dist, min(last, max(first, x)))
        if (lo is None or x > lo) and (hi is None or x < hi):
            return x
    return None


def _kinds(trials: Sequence[FrozenTrial]) -> set[str]:
    return {k for k in map(failed_kind, trials) if k}


__all__ = ["MAX_DRAWS", "PROBE_BINS", "back_off", "baseline_of", "between", "least_explored", "next_parameter",
           "probed_around", "raised_to", "screening", "snap"]
