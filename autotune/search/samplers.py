"""The default sampler: multivariate TPE that uses what the study knows.

:class:`CrashAwareTPESampler` keeps TPE's model (:func:`tpe_sampler`) and adds:

- **A screen and coverage probes**: once the baseline has run, the trials after it move one
  parameter of the incumbent at a time; after :data:`PROBE_AFTER` trials every proposal but each
  :data:`TPE_EVERY`-th (TPE's) does, to the part of its range explored least
  (:mod:`autotune.search.proposals`).
- **Crash regions**: a proposal inside a rule's region (:func:`~autotune.analysis.crash_rules.failure_rules`:
  its conditions, within the rule's scope, where the study's trials showed it) is kept with probability ``(1 - p) c_ok / (p c_fail + (1 - p) c_ok)``, its measurements per
  unit of GPU time next to a sure proposal: ``p`` the rule's share of failures, ``c_fail`` the
  mean duration of its failures, ``c_ok`` the median duration of a measured trial. A region where
  every trial failed is never proposed again.
- **The failure boundary**: a proposal the feasibility classifier
  (:mod:`autotune.search.feasibility`) gives :data:`RISK` or more chance of failing is redrawn;
  below that, its chance weighs its worth like a region's.
- **Failed moves and named choices**: a probe does not repeat a failed one
  (:mod:`autotune.search.moves`), and no proposal takes a choice a failure's message names.
- **Hints of a warm start** (:mod:`autotune.search.prior`): each once, on the incumbent, first.
- **Raises the engine's log calls for** (``raise_when``, :mod:`autotune.outcome.load_signals`):
  the incumbent with the full cap raised to what its log showed, ahead of any other proposal.
- **No repeats**: a proposal equal to a configuration already launched is redrawn.
- **Back-offs while nothing has run**: every :data:`BACK_OFF_EVERY`-th proposal is the baseline
  moved to the safe side of its failures along the ``monotone:`` declarations; the rest are random.

A proposal is redrawn up to :data:`~autotune.search.proposals.MAX_DRAWS` times; then the draw
most worth its cost stands, so the search is never locked out of the space.
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, FloatDistribution, IntDistribution
from optuna.trial import FrozenTrial, TrialState

from autotune.analysis.explain import analysed_views, failure_rules
from autotune.outcome.failures import MEMORY_KINDS
from autotune.outcome.load_signals import ATTR as SIGNALS_ATTR, LoadSignals, raises_called_for
from autotune.search.feasibility import MODELLED_KINDS, FeasibilityModel
from autotune.search.moves import FailedMove, failed_moves, ordered, refused
from autotune.search.prior import Prior
from autotune.search.proposals import MAX_DRAWS, back_off, baseline_of, least_explored, next_parameter, raised_to, screening
from autotune.store.record import PROPOSED_ATTR, cached_trials, failed_kind, is_feasible_measurement, is_measured, set_system_attr

TPE_STARTUP_TRIALS = 4
"""Random trials before TPE models the study (Optuna's default: 10; serial, see :func:`tpe_sampler`
for parallel). After a baseline that ran, the screen's trials count towards them."""
PROBE_AFTER = 8
"""Finished trials before the first coverage probe."""
TPE_EVERY = 4
"""Once probes have begun (an incumbent, :data:`PROBE_AFTER` trials), every this-many-th trial (by
trial number) is TPE's and the others coverage probes: on the development half of the generated
hosts a probe around the incumbent improved on it more often and failed less often than a TPE draw
after the 10th trial (docs/BENCHMARKS.md)."""
BACK_OFF_EVERY = 2
"""While nothing has run, every this-many-th trial (by trial number) is a back-off; the rest random."""
RISK = 0.3
"""A proposal whose chance of failing at the boundary (:class:`~autotune.search.feasibility.FeasibilityModel`)
is this or more is redrawn (a probe or raise: not proposed)."""


def tpe_sampler(seed: int | None, *, slots: int = 1) -> optuna.samplers.TPESampler:
    """Multivariate TPE for a study run on ``slots`` slots at once.

    With several slots, TPE runs with ``constant_liar``: a running trial counts as a bad result
    while it runs, so N free slots get N different points, not N copies of the most promising
    one. TPE's start-up counts finished trials only; with N in flight, the trial asked when the
    serial study would ask its first modelled one has N - 1 fewer finished beside it, so the
    start-up is shortened by N - 1 (at least 2 random trials): the first modelled ask comes at
    the same trial number as in a serial study.
    """
    startup = TPE_STARTUP_TRIALS if slots <= 1 else max(2, TPE_STARTUP_TRIALS - (slots - 1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup, multivariate=True,
                                          constant_liar=slots > 1)


class CrashAwareTPESampler(optuna.samplers.BaseSampler):
    """TPE (:func:`tpe_sampler`) with probes, raises and back-offs, crash regions weighed by their
    cost, and no repeated configuration (the module docstring).

    TPE's random start-up stands unless a raise is called for or the baseline ran (the screen).
    A seeded study stays reproducible: every random choice comes from a generator seeded with
    ``seed``. A multi-objective study has no incumbent: it gets no probes and no raises.

    Args:
        seed: Seed for TPE, the random draws while nothing has run (``seed + 1``) and the probes.
        slots: Trials run at once (:func:`tpe_sampler`).
        avoid_crashes: Redraw proposals out of crash regions and across the failure boundary.
        probes: Screen, probe, raise and back off. With ``avoid_crashes`` also False: TPE alone.
        launched_as: Raw parameters -> the values launched (the space's rules repaired), so two
            proposals that launch the same configuration count as a repeat; None: as proposed.
        monotone: The space's ``monotone:`` declarations (parameter -> {failure kind: "up" |
            "down"}), for the back-offs and the crash rules; None: none.
        raise_when: The space's ``raise_when`` declarations (parameter -> signal) the raises
            follow; None: no raises.
        prior: What earlier studies found (a warm start, :mod:`autotune.search.prior`): read
            beside the study's own trials in the crash regions and the failure boundary.
    """

    def __init__(self, seed: int | None = None, *, slots: int = 1, avoid_crashes: bool = True,
                 probes: bool = True, launched_as: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
                 monotone: Mapping[str, Mapping[str, str]] | None = None,
                 raise_when: Mapping[str, str] | None = None, prior: Prior | None = None) -> None:
        self.tpe = tpe_sampler(seed, slots=slots)
        self._random = optuna.samplers.RandomSampler(seed=None if seed is None else seed + 1)
        self.launched_as = launched_as
        """Raw parameters -> the values launched (the search space's rules repaired), so two
        proposals that launch the same configuration count as a repeat; None: as proposed."""
        self.monotone = {n: dict(d) for n, d in (monotone or {}).items()}
        """The space's declarations (parameter -> {failure kind: "up" | "down"}) the back-offs
        follow; empty: no back-offs."""
        self.raise_when = dict(raise_when or {})
        """The space's ``raise_when`` declarations (parameter -> signal) the raises follow; empty:
        no raises."""
        self.avoid_crashes = avoid_crashes
        self.probes = probes
        self.prior = prior or Prior()
        """Other studies' failures and runs (a warm start); empty: none."""
        self._rng = random.Random(seed)
        self._rules: list[tuple[tuple[Any, ...], float, float]] = []
        self._rules_at = -1
        self._cycle: list[str] = []
        self._moves: list[FailedMove] = []
        self._named: set[tuple[str, Any]] = set()
        self._boundary = FeasibilityModel({})
        self._boundary_cost: dict[str, float] = {}
        self._learnt_at: tuple[int, tuple[str, ...]] | None = None
        self._bounds: dict[str, tuple[float, float]] = {}

    # -- the sampler protocol --------------------------------------------------------------------
    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return self.tpe.infer_relative_search_space(study, trial)

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        if not search_space:
            return {}
        finished = cached_trials(study, (TrialState.COMPLETE, TrialState.PRUNED))
        incumbent = self._incumbent(study, finished) if self.probes else None
        launched = {self._launch_key(t.params) for t in finished}
        self._learn(study, finished, search_space)
        if self.probes and finished and not any(_measured(t) for t in finished):
            backed = back_off(self._rng, self.monotone, finished, search_space) if trial.number % BACK_OFF_EVERY == 1 else None
            for _ in range(MAX_DRAWS):
                params = backed or {n: self._random.sample_independent(study, trial, n, d)
                                    for n, d in search_space.items()}
                if self._launch_key(params) not in launched:
                    if backed:
                        _record(study, trial, {"by": "back-off"})
                    return params
                backed = back_off(self._rng, self.monotone, finished, search_space) if backed else None
            return params
        if incumbent is not None and self.prior.hints:
            hinted = self._hinted(study, incumbent, finished, search_space, launched)
            if hinted is not None:
                _record(study, trial, hinted[1])
                return hinted[0]
        if incumbent is not None and self.raise_when:
            raised = self._raised(study, incumbent, search_space, launched)
            if raised is not None:
                params, why = raised
                _record(study, trial, why)
                return params
        screen = incumbent is not None and screening(trial, finished, search_space)
        if screen or (incumbent is not None and len(finished) >= PROBE_AFTER and trial.number % TPE_EVERY != 0):
            assert incumbent is not None  # a screen needs one too
            name = next_parameter(self._cycle, self._rng, search_space, incumbent, finished)
            base = baseline_of(finished)
            baseline = base.params if base is not None else {}
            values = [baseline[name]] if name in baseline and baseline[name] != incumbent.params[name] else []
            for rank in range(MAX_DRAWS):
                probe = {n: incumbent.params[n] for n in search_space}
                probe[name] = (values[rank] if rank < len(values)
                               else least_explored(self._rng, finished, name, search_space[name], probe[name], rank - len(values)))
                if (self._launch_key(probe) not in launched and (name, probe[name]) not in self._named
                        and not refused(self._moves, search_space, name, probe[name], incumbent.params[name], probe)
                        and (not self.avoid_crashes or self.safe(study, probe))):
                    _record(study, trial, {"by": "probe", "param": name, "around": incumbent.number,
                                           **({"screen": True} if screen else {})})
                    return probe
            # every probe of this parameter is launched already or in a crash region: TPE's turn
        params = self.tpe.sample_relative(study, trial, search_space)
        if not params or not self.avoid_crashes:
            return params
        best, best_worth = params, -1.0
        for _ in range(MAX_DRAWS):
            worth, chance = (0.0, 0.0) if self._launch_key(params) in launched else self._assess(study, params)
            if (worth >= 1.0 or self._rng.random() < worth) and chance < RISK:
                return params
            if worth > best_worth:
                best, best_worth = params, worth
            params = self.tpe.sample_relative(study, trial, search_space)
        return best

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
        self._rng = random.Random()

    # -- what the study knows --------------------------------------------------------------------
    def worth(self, study: optuna.Study, params: dict[str, Any]) -> float:
        """How much a proposal is worth next to one sure to run: the least over the crash regions
        holding it, and the boundary's chance (:mod:`autotune.search.feasibility`), of ``(1 - p) c_ok /
        (p c_fail + (1 - p) c_ok)`` (module docstring); 0 where every trial failed, and for a
        choice a failure named (a rule the engine's error states) or a failed probe moved to alone
        (:func:`failed_moves`). The boundary and those choices are as of the last
        :meth:`sample_relative`."""
        return self._assess(study, params)[0]

    def safe(self, study: optuna.Study, params: dict[str, Any]) -> bool:
        """Whether a probe or raise may go to ``params``: outside every crash region, and less
        than :data:`RISK` likely to fail at the boundary (:mod:`autotune.search.feasibility`)."""
        return self._regions_worth(study, params) >= 1.0 and self._boundary.chance(params) < RISK

    def _assess(self, study: optuna.Study, params: dict[str, Any]) -> tuple[float, float]:
        """:meth:`worth` of ``params`` and the boundary's chance that it fails."""
        chance = self._boundary.chance(params)
        if any(m.kind not in MEMORY_KINDS and not ordered(m.distribution) and params.get(m.param) == m.after
               and m.speaks_for(params) for m in self._moves) or any((n, v) in self._named for n, v in params.items()):
            return 0.0, chance  # a choice that failed when it alone moved from a configuration that ran, or its failure named
        worth = self._regions_worth(study, params)
        if chance > 0.0:
            worth = min(worth, _worth(chance, max(self._boundary_cost.get(k, 1.0) for k in self._boundary.kinds)))
        return worth, chance

    def _regions_worth(self, study: optuna.Study, params: dict[str, Any]) -> float:
        """The least worth of ``params`` over the crash regions holding it (1 outside them all)."""
        worth = 1.0
        for conditions, p, cost_ratio in self.regions(study):
            if all(c.holds(params) for c in conditions):
                worth = min(worth, _worth(p, cost_ratio))
        return worth

    def _learn(self, study: optuna.Study, finished: list[FrozenTrial], search_space: dict[str, BaseDistribution]) -> None:
        """Read the failed moves, the named choices (:meth:`regions`) and the boundary from
        ``finished``; kept until a trial finishes or the search space changes (parallel slots ask
        several times between)."""
        self._bounds = {n: (float(d.low), float(d.high)) for n, d in search_space.items()
                        if isinstance(d, (IntDistribution, FloatDistribution))}
        self.regions(study)
        key = (len(finished), tuple(search_space))
        if key == self._learnt_at:
            return
        self._moves = failed_moves(finished, search_space, self.monotone) + self.prior.failed_moves(
            search_space, [t.params for t in finished if _measured(t)])
        if self.avoid_crashes:  # the boundary is read only to avoid crashes
            failed = [(k, t.params) for t in finished if (k := _kind(t))]
            carried = self.prior.boundary_kinds([k for k, _ in failed])
            self._boundary = FeasibilityModel(search_space, self.monotone).fit(
                [t.params for t in finished if _measured(t)] + [v.params for v in self.prior.runs],
                failed + [(v.failure.kind, v.params) for v in self.prior.failures if v.failure and v.failure.kind in carried])
        self._learnt_at = key

    def regions(self, study: optuna.Study) -> list[tuple[tuple[Any, ...], float, float]]:
        """The study's crash regions: each rule's conditions (:func:`autotune.analysis.explain.failure_rules`)
        with its share of failures and its failures' mean duration over a measured trial's
        median; and, from the same rules, the choices a failure's message names (the rules of
        step 0). Recomputed when a trial has finished (whatever its outcome: a run stopped early
        counts for the rules as a run). With a :attr:`prior`, its records join the study's own
        (:meth:`~autotune.search.prior.Prior.weighs_region` says where the study's own trials alone
        weigh a region)."""
        finished = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)))
        if self._rules_at != finished:
            own = analysed_views(study)
            views = [*own, *self.prior.views]
            durations = {v.number: float(v.duration_s or 0.0) for v in views}
            ok = sorted(durations[v.number] for v in views if v.outcome == "ok")
            typical = ok[len(ok) // 2] if ok else 0.0
            out = []
            rules = failure_rules(views, self.monotone, self._bounds).rules  # as `study explain` states them
            self._named = {(c.param, c.value) for rule in rules if rule.named for c in rule.conditions}
            for rule in rules:
                region = tuple(rule.conditions) + tuple(rule.scope)
                share, shown_by = rule.failed / rule.covered, rule.trials
                inside = [v for v in own if all(c.holds(v.params) for c in region)] if self.prior else []
                if self.prior and not self.prior.weighs_region(inside):
                    shown_by = [v.number for v in inside if v.failure and v.failure.kind == rule.kind]
                    measured = sum(1 for v in inside if v.outcome.measured)
                    share = len(shown_by) / (len(shown_by) + measured)
                failed = [durations.get(n, 0.0) for n in shown_by] or [typical]
                ratio = (sum(failed) / len(failed)) / typical if typical > 0 else 1.0
                # a region holds where the rule was shown (its scope), not where no trial of it went
                out.append((region, share, max(ratio, 1e-3)))
            self._rules, self._rules_at = out, finished
            self._boundary_cost = {}
            for kind in MODELLED_KINDS:
                failed = [durations[v.number] for v in views if v.outcome == "infeasible" and v.failure_kind == kind]
                if failed and typical > 0:
                    self._boundary_cost[kind] = max(1e-3, sum(failed) / len(failed) / typical)
        return self._rules

    def sure_rules(self, study: optuna.Study) -> list[tuple[Any, ...]]:
        """The conditions of the crash regions where every trial failed: never proposed again."""
        return [conditions for conditions, p, _ in self.regions(study) if p >= 1.0]

    def _launch_key(self, params: dict[str, Any]) -> tuple[tuple[str, str], ...]:
        """The identity of the configuration ``params`` launches."""
        if self.launched_as is not None:
            try:
                params = self.launched_as(params)
            except (KeyError, ValueError, TypeError):
                pass  # parameters outside the space: compared as proposed
        return _key(params)

    def _raised(self, study: optuna.Study, incumbent: FrozenTrial, search_space: dict[str, BaseDistribution],
                launched: set[tuple[tuple[str, str], ...]]) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """The incumbent with one declared parameter raised to what its load's scheduler log
        called for (:func:`~autotune.outcome.load_signals.raises_called_for`), the parameters in name
        order, and why (:data:`~autotune.store.record.PROPOSED_ATTR`); None when its log called
        for none, or each such configuration is launched already (or running) or inside a crash
        region."""
        declared = {n: w for n, w in self.raise_when.items() if n in search_space}
        metrics = incumbent.user_attrs.get("metrics") or {}
        signals = LoadSignals.from_attr(incumbent.user_attrs.get(SIGNALS_ATTR))
        targets = raises_called_for(signals, declared, incumbent.params, metrics.get("max_concurrency"))
        if not targets:
            return None
        in_flight = cached_trials(study, (TrialState.RUNNING,))
        running = {self._launch_key(t.params) for t in in_flight if t.params}
        for name in sorted(targets):
            value = raised_to(search_space[name], targets[name])
            if value is None or value <= incumbent.params[name]:
                continue
            probe = {n: incumbent.params[n] for n in search_space}
            probe[name] = value
            key = self._launch_key(probe)
            if key in launched or key in running:
                continue
            if not self.avoid_crashes or self.safe(study, probe):
                assert signals is not None  # raises_called_for gave a target
                return probe, {"by": "raise", "param": name, "from": incumbent.params[name], "to": value,
                               "after": incumbent.number, "signal": declared[name],
                               "in_flight": signals.in_flight_max, "waiting": signals.queued_at_max}
        return None

    def _hinted(self, study: optuna.Study, incumbent: FrozenTrial, finished: list[FrozenTrial],
                search_space: dict[str, BaseDistribution],
                launched: set[tuple[tuple[str, str], ...]]) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """The first hint of the prior not proposed yet, on the incumbent
        (:meth:`~autotune.search.prior.Hint.on`), and why; None when each is proposed, launched
        already or inside a crash region."""
        asked = cached_trials(study, (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING))
        proposed = {why.get("hint") for t in asked
                    if isinstance(why := t.system_attrs.get(PROPOSED_ATTR), dict) and why.get("by") == "warm-start"}
        kinds = [k for t in finished if (k := _kind(t))]
        for i, hint in enumerate(self.prior.hints):
            if i in proposed:
                continue
            params = hint.on({n: incumbent.params[n] for n in search_space}, self.monotone, kinds)
            if self._launch_key(params) in launched or (self.avoid_crashes and not self.safe(study, params)):
                continue
            return params, {**hint.why, "hint": i, "around": incumbent.number}
        return None

    @staticmethod
    def _incumbent(study: optuna.Study, finished: list[FrozenTrial]) -> FrozenTrial | None:
        if len(study.directions) > 1:
            return None
        measured = [t for t in finished if is_feasible_measurement(t)]
        if not measured:
            return None
        sign = 1.0 if study.direction == optuna.study.StudyDirection.MAXIMIZE else -1.0
        return max(measured, key=lambda t: sign * float(t.value))  # type: ignore[arg-type]


def _worth(p: float, cost_ratio: float) -> float:
    """A proposal's measurements per unit of GPU time next to a sure one: it fails with chance
    ``p`` after ``cost_ratio`` of a measured trial's time."""
    return (1 - p) / (p * cost_ratio + (1 - p)) if p < 1.0 else 0.0


_measured = is_measured
_kind = failed_kind


def _record(study: optuna.Study, trial: FrozenTrial, why: dict[str, Any]) -> None:
    """Store why the sampler proposed ``trial``'s parameters (:data:`~autotune.store.record.PROPOSED_ATTR`)."""
    set_system_attr(study, trial, PROPOSED_ATTR, why)


def _key(params: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, repr(v)) for k, v in params.items()))


__all__ = ["BACK_OFF_EVERY", "CrashAwareTPESampler", "PROBE_AFTER", "RISK", "TPE_EVERY", "TPE_STARTUP_TRIALS", "tpe_sampler"]
