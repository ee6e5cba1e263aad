"""Search strategies: named ways of configuring the same :class:`~autotune.study.driver.Driver`.

`autotune bench tuner` compares them; each is the config's ``sampler`` key plus, where the
config cannot say it, a sampler factory handed to the driver (its ``sampler`` option). The
driver's loop, its baseline (enqueued first), its records and its budget are the same for all.

- ``autotune``: what ``study start`` runs (``make_sampler("tpe", ...)``:
  :class:`~autotune.search.samplers.CrashAwareTPESampler`, multivariate TPE with coverage probes around
  the incumbent, crash regions weighed by their cost and no repeated configuration), with the
  driver's own study features: proposals an earlier failure implies skipped
  (:mod:`autotune.search.implied`) and the best confirmed at the budget's end
  (:mod:`autotune.study.confirmation`); infeasible trials told with a failure constraint.
- ``autotune-warm``: ``autotune`` warm-started (:mod:`autotune.study.warm_start`) from an
  ``autotune`` study of the same seed and budget on another scenario (``bench tuner --warm-from``),
  run first in the same storage; only the warm-started study is scored.
- ``tpe``: the same multivariate TPE alone (:func:`~autotune.search.samplers.tpe_sampler`), crashes
  told as ``autotune`` tells them, no probes, regions, skips or confirmation.
- ``random``: the config's ``sampler: random``.
- ``grid``: what vLLM's ``benchmarks/auto_tune.sh`` does: a grid over a few server flags (it
  grids ``max_num_seqs`` x ``max_num_batched_tokens`` under a memory fraction); here
  :data:`GRID`, the SGLang analogues, every other parameter at the space's default, visited in a
  seeded shuffled order (Optuna's ``GridSampler``).
- ``tpe-naive``: Ray Tune with ``OptunaSearch`` as it comes: Optuna's ``TPESampler(seed=seed)``
  with its defaults (10 random start-up trials, independent per parameter), told crashes as
  FAIL (a trial that raised is told ``TrialState.FAIL``; Optuna's TPE reads only COMPLETE and
  PRUNED trials, so a FAIL teaches it nothing). It is shown a view of the study without its
  infeasible trials (:class:`CrashBlindTPESampler`); the trials are recorded as for ``autotune``
  (counted by the budget).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Sequence

import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState

from autotune.search.factory import SamplerFactory
from autotune.search.samplers import tpe_sampler
from autotune.errors import UsageError
from autotune.store.record import Outcome, outcome_of, trials_without
from autotune.config.space import ParamValue, SearchSpace

STRATEGIES = ("autotune", "autotune-warm", "tpe", "random", "grid", "tpe-naive")
"""The built-in strategies, in the order reports show them."""

GRID: dict[str, tuple[ParamValue, ...]] = {
    "mem_fraction_static": (0.55, 0.65, 0.75, 0.85, 0.92),
    "max_running_requests": (64, 128, 256, 512),
    "cuda_graph_max_bs": (64, 256, 512),
}
"""The ``grid`` strategy's grid: 60 points (the memory fraction, the running-request cap and the
largest CUDA-graph batch: what auto_tune.sh varies, in SGLang's words)."""


@dataclass(frozen=True)
class Strategy:
    """How a strategy configures the driver: the config's ``sampler`` key and, when it needs one,
    the sampler factory handed to ``Driver(sampler=...)``."""

    name: str
    config_sampler: str
    factory: SamplerFactory | None
    study_features: bool = False
    """Whether the driver's own study features are on: implied failures skipped
    (:mod:`autotune.search.implied`) and the best configurations confirmed at the budget's end
    (:mod:`autotune.study.confirmation`). Only ``autotune`` has them: the others stand for a sampler
    alone, or another tool."""


def strategy(name: str, space: SearchSpace) -> Strategy:
    """The strategy ``name`` (one of :data:`STRATEGIES`) on ``space``.

    Raises:
        UsageError: an unknown name, or ``grid`` on a space without :data:`GRID`'s parameters.
    """
    if name in ("autotune", "autotune-warm"):
        return Strategy(name, "tpe", None, study_features=True)
    if name == "random":
        return Strategy(name, "random", None)
    if name == "tpe":
        return Strategy(name, "tpe", tpe_sampler)
    if name == "tpe-naive":
        return Strategy(name, "tpe", CrashBlindTPESampler)
    if name == "grid":
        grid, defaults = grid_of(space)
        return Strategy(name, "tpe", lambda seed: DefaultsGridSampler(grid, defaults, seed=seed))
    raise UsageError(f"unknown strategy '{name}' (strategies: {', '.join(STRATEGIES)})")


def grid_of(space: SearchSpace) -> tuple[dict[str, list[ParamValue]], dict[str, ParamValue]]:
    """:data:`GRID`'s values that ``space`` allows, and the space's default of every parameter.

    Raises:
        UsageError: a grid parameter the space lacks, or a space parameter without a default.
    """
    missing = [n for n in GRID if n not in space.parameters]
    if missing:
        raise UsageError(f"strategy grid: search space {space.name} has no {', '.join(missing)}")
    grid = {n: [space.parameters[n].normalise(v) for v in values if space.parameters[n].out_of_range(v) is None]
            for n, values in GRID.items()}
    empty = [n for n, values in grid.items() if not values]
    if empty:
        raise UsageError(f"strategy grid: no grid value of {', '.join(empty)} is in search space {space.name}")
    try:
        defaults = space.complete({}, what="strategy grid")
    except UsageError as exc:
        raise UsageError(str(exc)) from None
    return grid, defaults


def grid_points(grid: dict[str, Sequence[ParamValue]]) -> list[dict[str, ParamValue]]:
    """Every point of ``grid`` (the product of its values)."""
    names = list(grid)
    return [dict(zip(names, values)) for values in itertools.product(*(grid[n] for n in names))]


class DefaultsGridSampler(optuna.samplers.GridSampler):
    """Optuna's ``GridSampler`` over ``grid``; every parameter outside it at ``defaults``.

    Optuna's grid sampler calls ``study.stop()`` once the grid is used up, which only works
    inside ``study.optimize``; here the driver's budget ends the study, and a grid used up is
    visited again in the sampler's order (Optuna warns and re-samples a visited point).
    """

    def __init__(self, grid: dict[str, list[ParamValue]], defaults: dict[str, ParamValue], seed: int | None = None) -> None:
        super().__init__(grid, seed=seed)  # type: ignore[arg-type]
        self._defaults = dict(defaults)

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        if param_name not in self._search_space:
            return self._defaults[param_name]
        return super().sample_independent(study, trial, param_name, param_distribution)

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state: TrialState,
                    values: Sequence[float] | None) -> None:
        pass  # no study.stop(): see the class docstring


def _crashed(t: FrozenTrial) -> bool:
    """A trial whose configuration failed (infeasible, or skipped as implied to fail)."""
    return outcome_of(t) in (Outcome.INFEASIBLE, Outcome.SKIPPED)


class CrashBlindTPESampler(optuna.samplers.BaseSampler):
    """Optuna's TPE with its defaults (``TPESampler(seed=seed)``, what Ray Tune's ``OptunaSearch``
    makes when given no sampler) as if infeasible trials were told FAIL: it samples from a view
    of the study without them, so it neither avoids crashing regions nor counts crashes towards its random
    start-up, as a FAIL trial would not count."""

    def __init__(self, seed: int | None = None) -> None:
        self._tpe = optuna.samplers.TPESampler(seed=seed)

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return self._tpe.infer_relative_search_space(trials_without(study, _crashed), trial)  # type: ignore[arg-type]

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        return self._tpe.sample_relative(trials_without(study, _crashed), trial, search_space)  # type: ignore[arg-type]

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        return self._tpe.sample_independent(trials_without(study, _crashed), trial, param_name,  # type: ignore[arg-type]
                                             param_distribution)

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self._tpe.before_trial(study, trial)

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state: TrialState,
                    values: Sequence[float] | None) -> None:
        self._tpe.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self._tpe.reseed_rng()
