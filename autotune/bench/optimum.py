"""The optimum of a scenario: the best noise-free value a dense search of the model finds.

:func:`find_optimum` searches (random configurations, then coordinate search from the best) and
caches the result on disk; :func:`ratio` is a value over the optimum, the score of
`autotune bench tuner`.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna

from autotune.bench.setups import BENCH_ENV, Evaluator, Setup
from autotune.config.space import Parameter, ParamValue, SearchSpace
from autotune.errors import UsageError

OPTIMUM_RANDOM = 3000
"""Random configurations the dense search starts from."""
OPTIMUM_STARTS = 8
"""The best random configurations each refined by coordinate search."""
AXIS_VALUES = 64
"""At most this many values per parameter in the coordinate search (all of them when fewer)."""
NOT_THE_MODEL = ("cli.py", "family.py", "__main__.py")
"""The simulator's modules left out of the cache key: they change no prediction of a scenario."""
OPTIMUM_VERSION = "1"
"""Part of the optimum cache's key: bump when the search changes."""


@dataclass(frozen=True)
class Optimum:
    """The best noise-free value the dense search found, its configuration, and how."""

    value: float
    params: dict[str, ParamValue]
    evaluated: int
    method: str
    cached: bool = False


def find_optimum(setup: Setup, *, random_points: int = OPTIMUM_RANDOM, starts: int = OPTIMUM_STARTS,
                 cache_dir: Path | None = None) -> Optimum:
    """Dense search of the noise-free model over the space: ``random_points`` random
    configurations (Optuna's RandomSampler, seed 0), then coordinate search from the best
    ``starts``: each parameter in turn over up to :data:`AXIS_VALUES` values (every value of a
    smaller range, with the current one's neighbours), and each rule's two parameters set
    together, until a sweep improves nothing.

    The result is cached in ``cache_dir`` (default: ``autotune-bench`` under the system temp
    folder), keyed by the scenario, space, objective, env, search and the simulator's source
    (:data:`NOT_THE_MODEL` aside).

    Raises:
        UsageError: no random configuration is feasible.
    """
    folder = cache_dir or Path(tempfile.gettempdir()) / "autotune-bench"
    key = _optimum_key(setup, random_points, starts)
    path = folder / f"optimum-{Path(setup.scenario_name).stem}-{key[:16]}.json"  # a scenario file: its name
    try:
        doc = json.loads(path.read_text())
        return Optimum(doc["value"], doc["params"], doc["evaluated"], doc["method"], cached=True)
    except (OSError, ValueError, KeyError, TypeError):
        pass
    ev = Evaluator(setup)
    space = setup.space
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        optuna.logging.set_verbosity(optuna.logging.ERROR)
        probe = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
        dists = space.distributions()
        found: dict[tuple[tuple[str, Any], ...], float] = {}
        for _ in range(random_points):
            params = ev.space.applied(probe.ask(dists).params)
            v = ev.value(params)
            if v is not None:
                found[tuple(sorted(params.items()))] = v
    if not found:
        raise UsageError(f"scenario {setup.scenario_name}: none of {random_points} random configurations is feasible")
    ranked = sorted(found.items(), key=lambda kv: kv[1], reverse=ev.maximize)[:starts]
    best_params, best = dict(ranked[0][0]), ranked[0][1]
    for key_items, value in ranked:
        params, v = _climb(ev, space, dict(key_items), value)
        if ev.better(v, best):
            best_params, best = params, v
    method = (f"{random_points} random configurations, then coordinate search from the best {len(ranked)} "
              f"(each parameter over up to {AXIS_VALUES} values, rule pairs together), noise-free model; "
              f"{ev.evaluated} configurations evaluated")
    opt = Optimum(best, {n: best_params[n] for n in space.parameters}, ev.evaluated, method)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"value": opt.value, "params": opt.params, "evaluated": opt.evaluated,
                                   "method": opt.method}))
        tmp.replace(path)
    except OSError:
        pass  # a cache only
    return opt


def _climb(ev: Evaluator, space: SearchSpace, params: dict[str, ParamValue], value: float) -> tuple[dict[str, ParamValue], float]:
    """Coordinate search from ``params`` until a whole sweep improves nothing."""
    axes = {n: _axis(p) for n, p in space.parameters.items()}
    improved = True
    while improved:
        improved = False
        moves: list[dict[str, ParamValue]] = []
        for n, p in space.parameters.items():
            moves += [{n: v} for v in _with_neighbours(p, axes[n], params[n])]
        for rule in space.rules:
            moves += [{rule.lower: v, rule.upper: v} for v in axes[rule.lower]
                      if space.parameters[rule.upper].out_of_range(v) is None]
        for move in moves:
            candidate = ev.space.applied({**params, **move})
            v = ev.value(candidate)
            if ev.better(v, value):
                params, value, improved = candidate, v, True  # type: ignore[assignment]
    return params, value


def _axis(p: Parameter) -> list[ParamValue]:
    """Up to :data:`AXIS_VALUES` values of ``p`` spread over its range (log-spaced on a log scale)."""
    dist = p.distribution()
    if isinstance(dist, optuna.distributions.CategoricalDistribution):
        return list(dist.choices)  # type: ignore[arg-type]
    assert p.low is not None and p.high is not None
    step = p.step if p.step is not None and not p.log else (1 if p.type == "int" else None)
    if step is not None and (p.high - p.low) / step + 1 <= AXIS_VALUES:
        count = int(round((p.high - p.low) / step)) + 1
        return [p.normalise(p.low + i * step) for i in range(count)]
    out: list[ParamValue] = []
    for i in range(AXIS_VALUES):
        f = i / (AXIS_VALUES - 1)
        x = p.low * (p.high / p.low) ** f if p.log else p.low + f * (p.high - p.low)
        if step is not None:
            x = p.low + round((x - p.low) / step) * step
        v = p.normalise(min(p.high, max(p.low, x)))
        if v not in out:
            out.append(v)
    return out


def _with_neighbours(p: Parameter, axis: list[ParamValue], current: ParamValue) -> list[ParamValue]:
    """``axis`` plus the values next to ``current`` (a step either side, for int and stepped
    parameters)."""
    out = list(axis)
    if p.type in ("int", "float") and isinstance(current, (int, float)):
        step = p.step if p.step is not None and not p.log else (1 if p.type == "int" else None)
        if step is not None:
            for k in (-2, -1, 1, 2):
                v = current + k * step
                if p.out_of_range(v) is None and p.normalise(v) not in out:
                    out.append(p.normalise(v))
    return [v for v in out if v != current]


def _optimum_key(setup: Setup, random_points: int, starts: int) -> str:
    sim = Path(__file__).resolve().parents[1] / "sim"
    h = hashlib.sha256()
    for f in sorted(sim.glob("*.py")):
        if f.name not in NOT_THE_MODEL:
            h.update(f.read_bytes())
    space = setup.space
    doc = {"v": OPTIMUM_VERSION, "scenario": setup.scenario.model_dump(mode="json"),
           "space": {n: optuna.distributions.distribution_to_json(d) for n, d in space.distributions().items()},
           "applied": {n: p.model_dump(mode="json") for n, p in space.parameters.items()},
           "rules": [str(r) for r in space.rules], "objective": setup.objective.metric,
           "direction": setup.objective.direction, "load": setup.objective.load.model_dump(mode="json"),
           "env": BENCH_ENV, "random": random_points, "starts": starts, "axis": AXIS_VALUES, "sim": h.hexdigest()}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


def ratio(value: float | None, optimum: float, maximize: bool) -> float:
    """``value`` over ``optimum`` (``optimum`` over ``value`` when minimising); 0 for no value."""
    if value is None or value <= 0 or optimum <= 0:
        return 0.0
    return value / optimum if maximize else optimum / value
