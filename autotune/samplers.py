"""The default sampler: multivariate TPE that does not propose what the study knows will crash.

TPE ranks an infeasible (PRUNED) trial below every feasible one, but that alone teaches it
little where most of the space fails: its "bad" group is then mostly failures of every kind, and
it keeps proposing into a region that failed every time (speculative decoding on a host without
a draft model, a memory fraction above what the weights leave). `autotune bench tuner` measured
up to 34% of the trials after the 10th infeasible with TPE alone (docs/BENCHMARKS.md).

:class:`CrashAwareTPESampler` keeps TPE's proposals but redraws one that falls into a *sure*
crash region: the conditions of a crash rule (:func:`autotune.analysis.failure_rules`, the
minimal explanation `study explain` prints) that every trial it covers failed, with at least
:data:`autotune.analysis.MIN_SUPPORT` trials. Such a region is a constraint learned from the
study itself, as constrained BO learns a feasibility model (SCOOT learns one with a random forest;
Optuna's own ``constraints_func`` only ranks trials): here the model is the rule list, which is
cheap, exact on the trials seen and the same one the user reads. A region with a single
success is not avoided, and after :data:`MAX_DRAWS` redraws TPE's proposal stands, so the
search is never locked out of the space.

Also measured and not kept: local moves around the incumbent (TuRBO-style; half the modelled
trials the best trial with one or two parameters changed) made runs settle lower on two of the
three built-in hosts (docs/BENCHMARKS.md).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState

TPE_STARTUP_TRIALS = 8
"""Random trials before TPE models the study (serial; see :func:`tpe_sampler` for parallel)."""
MAX_DRAWS = 20
"""Redraws of a proposal that falls into a sure crash region before it stands."""


def tpe_sampler(seed: int | None, *, slots: int = 1) -> optuna.samplers.TPESampler:
    """Multivariate TPE for a study run on ``slots`` slots at once.

    With several slots, TPE runs with ``constant_liar``: a running trial counts as a bad result
    while it runs, so N free slots get N different points, not N copies of the most promising
    one. TPE's start-up counts finished trials only; with N in flight, the trial asked when the
    serial study would ask its first modelled one has N - 1 fewer finished beside it, so the
    start-up is shortened by N - 1 (at least 4 random trials): the first modelled ask comes at
    the same trial number as in a serial study.
    """
    startup = TPE_STARTUP_TRIALS if slots <= 1 else max(4, TPE_STARTUP_TRIALS - (slots - 1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup, multivariate=True,
                                          constant_liar=slots > 1)


class CrashAwareTPESampler(optuna.samplers.BaseSampler):
    """TPE (:func:`tpe_sampler`) whose proposals avoid the study's sure crash regions (module
    docstring).

    Contract: TPE's random start-up and its modelled proposals as they are, but a relative
    proposal inside a sure crash region (:meth:`sure_rules`) is redrawn, up to :data:`MAX_DRAWS`
    times; ``avoid_crashes=False`` is TPE alone. A seeded study stays reproducible: the redraws
    come from TPE's own seeded generator.
    """

    def __init__(self, seed: int | None = None, *, slots: int = 1, avoid_crashes: bool = True) -> None:
        self.tpe = tpe_sampler(seed, slots=slots)
        self.avoid_crashes = avoid_crashes
        self._rules: list[tuple[Any, ...]] = []
        self._rules_at = -1

    # -- the sampler protocol --------------------------------------------------------------------
    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return self.tpe.infer_relative_search_space(study, trial)

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        params = self.tpe.sample_relative(study, trial, search_space)
        if not self.avoid_crashes or not params:
            return params
        rules = self.sure_rules(study)
        for _ in range(MAX_DRAWS):
            if not any(all(c.holds(params) for c in rule) for rule in rules):
                break
            params = self.tpe.sample_relative(study, trial, search_space)
        return params

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        return self.tpe.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self.tpe.before_trial(study, trial)

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state: TrialState,
                    values: Sequence[float] | None) -> None:
        self.tpe.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self.tpe.reseed_rng()

    # -- what the study knows --------------------------------------------------------------------
    def sure_rules(self, study: optuna.Study) -> list[tuple[Any, ...]]:
        """The conditions of the study's crash rules (:func:`autotune.analysis.failure_rules`)
        that every trial they cover failed, with :data:`autotune.analysis.MIN_SUPPORT` trials at
        least: regions a proposal is redrawn out of. Recomputed when a trial has finished."""
        from autotune.analysis import MIN_SUPPORT, analysed_views, failure_rules

        finished = sum(1 for t in study._get_trials(deepcopy=False, use_cache=True)  # noqa: SLF001
                       if t.state in (TrialState.COMPLETE, TrialState.PRUNED))
        if self._rules_at != finished:
            report = failure_rules(analysed_views(study))
            self._rules = [r.conditions for r in report.rules if r.failed == r.covered and r.covered >= MIN_SUPPORT]
            self._rules_at = finished
        return self._rules


__all__ = ["CrashAwareTPESampler", "MAX_DRAWS", "TPE_STARTUP_TRIALS", "tpe_sampler"]
