"""The default sampler: multivariate TPE that uses what the study knows.

Measured with `autotune bench tuner` (docs/BENCHMARKS.md), TPE alone has three weaknesses on a
launch-configuration space. Where most of the space fails it keeps proposing into regions that
failed every time (speculative decoding on a host without a draft model, a memory fraction above
what the weights leave): up to a third of its trials after the tenth were infeasible. It locks
in: its "good" group is the few best trials, so a parameter whose good values were only ever
tried together with a crash elsewhere (the CUDA-graph batch limit on the Kimi host) is never
tried again with the rest right, and half its runs stayed below 90% of the optimum. And late in
a study it proposes the configuration it already measured, again and again.

:class:`CrashAwareTPESampler` keeps TPE's model and adds, each chosen for these failures:

- **Coverage probes around the incumbent** (a portfolio of TPE and a pattern search, in the
  spirit of TuRBO's local search and of SCOOT's use of the best configuration so far): after
  :data:`PROBE_AFTER` trials, every :data:`PROBE_EVERY`-th proposal is the best configuration
  with one parameter changed, the parameters taken in turn (a shuffled cycle, in which the one
  probed least around the current incumbent goes first: a probe around an earlier, beaten
  incumbent says little about this one), the new value
  drawn from the part of that parameter's range the study's measured trials have explored least
  (a categorical's least-tried choice; for a number, the least-tried of :data:`PROBE_BINS` equal
  bins of its range, on its log scale if it has one). A region that was only ever tried with a
  crash elsewhere is so tried again with the rest right, and a gain one parameter alone gives is
  found without waiting for TPE to stumble on it. Local moves drawn near the incumbent's value
  were measured too and dropped: they settled lower (the far value is where a threshold lies).
- **A one-at-a-time screen of the baseline first** (screening designs, as Morris's elementary
  effects screen before modelling; and what the field report's operator did: back to the
  known-good launch, one change at a time). When the baseline ran, the trials after it (one per
  parameter and one more, for a raise: :func:`screening`) are all coverage probes, each
  parameter moved alone from the incumbent, in the shuffled cycle's order, the incumbent
  following any gain. Where one parameter is the lever (on the GLM-5 PCIe host
  ``NCCL_MIN_NCHANNELS`` alone takes the baseline with its raise from 0.78 to 0.99 of the
  optimum; no other parameter raises it) the screen tries it within those trials, where TPE's
  start-up draws it with a good rest only by luck and the probes every second trial wait their
  turn. When the baseline failed there is no known-good configuration to screen: the back-offs
  look for one and TPE and the probes alternate as below (screening the first back-off that ran,
  on the Kimi host, sent its memory probes over the boundary and left TPE fewer failures to
  learn from: more infeasible trials after the tenth, 22% from 18%).
- **Crash regions** (constrained BO's feasibility model: SCOOT learns one with a random forest;
  here it is the rule list ``study explain`` prints, :func:`autotune.analysis.explain.failure_rules`,
  cheap, exact on the trials seen and the one the user reads). A proposal inside a rule's region
  is kept with probability ``(1 - p) c_ok / (p c_fail + (1 - p) c_ok)``, the chance it measures
  per unit of GPU time relative to a proposal outside every region: ``p`` the rule's share of
  failures, ``c_fail`` the mean duration of its failures and ``c_ok`` the median duration of a
  measured trial. A region where every trial failed is never proposed again; one that fails
  late, or hangs until the ready timeout, is avoided more than one that fails in seconds.
- **The failure boundary** (:mod:`autotune.search.feasibility`: a logistic feasibility classifier, as
  constrained BO weighs its acquisition by the chance of feasibility). Out of memory is a sum of
  terms crossing a capacity (the KV pool's fraction, CUDA graphs, draft tokens, NCCL buffers),
  which the crash rules' thresholds on one or two parameters state only in part. A proposal the
  classifier gives :data:`RISK` or more chance of failing is redrawn; below that, its chance
  weighs its worth like a region's. On the Kimi host, where the boundary runs through the best
  configurations, this took the infeasible trials after the tenth from 18% to 12%.
- **Failed probes are the move's** (a probe changes one parameter of a configuration that ran, so
  its failure is that change's, as far as one launch shows: :func:`failed_moves`). A later probe
  does not repeat it (:func:`refused`): after a memory failure, no move of that parameter the
  same way (more draft tokens, fewer channels: the incumbent has no room that way); after
  another failure, not that value or beyond (a number), not that choice (a categorical, which
  no proposal takes again).
- **Choices the failure names** (the crash rules' step 0, :mod:`autotune.analysis.crash_rules`): NCCL
  says which setting it could not use (``NCCL_ALGO was set to Tree``); a choice named so in a
  failure's message, and never seen to run, is a rule from that one failure (a counted rule
  needs three) and is not proposed again (Kimi: 12% infeasible after the tenth
  to 10%).
- **Raises the engine's log calls for** (what an operator does on reading the scheduler's lines;
  :mod:`autotune.outcome.load_signals`): when the incumbent's load showed requests waiting while a cap
  the space declares ``raise_when: queued`` was full (``--max-running-requests``), or more
  requests running at once than a limit declared ``raise_when: running-above`` covers
  (``--cuda-graph-max-bs``), the next proposal is the incumbent with that parameter raised to
  what the log showed (the demand, at least the load's concurrency; the most running), ahead
  of TPE, start-up and probes alike. Each is proposed once per configuration (launched
  configurations are not proposed again), never into a crash region. The other samplers' blind
  spot: a cap below the offered load is a plateau whatever else changes, and on the Kimi and
  H200 hosts a CUDA-graph limit below the batch is one of the parameters the locked-in runs
  were one change from the optimum by.
- **No repeats**: a proposal equal to a configuration already launched is redrawn (measuring a
  configuration again is the confirmation runs' job, :mod:`autotune.study.confirmation`).
- **Back-offs while nothing has run** (the space's ``monotone:`` declarations, the structure an
  operator uses on an OOM: lower the memory knobs). Until some trial is measured, TPE has no good
  trials to model: its "good" group is a few of the failures, and on the Kimi host 3 runs in 10
  proposed 60 trials around the baseline's out-of-memory ``mem_fraction_static`` and launched
  nothing that ran. So while no trial is measured, every :data:`PROBE_EVERY`-th proposal is the
  baseline with each parameter the space declares monotone for a failure kind seen moved to the
  safe side of every failure of that kind along the way (the failed trials that kept the
  baseline's other values, the back-offs before it): for ``oom: up``, a value drawn (on the log
  scale where the parameter has one) below the lowest that ran out of memory; for
  ``not-enough-memory: down``, above the highest that left too little. Successive back-offs
  halve the interval, as a bisection does. The other proposals are drawn at random: there is no
  good trial for TPE to centre on.

A proposal is redrawn up to :data:`MAX_DRAWS` times; then the draw most worth its cost stands,
so the search is never locked out of the space. TPE's random start-up is :data:`TPE_STARTUP_TRIALS`
trials (Optuna's default is 10): with the baseline first, the model guides the search from the
sixth trial, which is what reaching 95% of the optimum within a few trials takes; after a
baseline that ran, the screen's trials count towards it, so TPE models from the screen's end.
"""

from __future__ import annotations

import math
import random
import warnings
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import FrozenTrial, TrialState

from autotune.analysis.explain import analysed_views, failure_rules
from autotune.analysis.crash_rules import is_number
from autotune.outcome.failures import MEMORY_KINDS
from autotune.search.feasibility import MODELLED_KINDS, FeasibilityModel
from autotune.outcome.load_signals import ATTR as SIGNALS_ATTR, LoadSignals, raises_called_for
from autotune.store.record import PROPOSED_ATTR, cached_trials, failed_kind, is_feasible_measurement, is_measured, set_system_attr

TPE_STARTUP_TRIALS = 4
"""Random trials before TPE models the study (serial; see :func:`tpe_sampler` for parallel)."""
MAX_DRAWS = 20
"""Redraws of a proposal before the best of them stands."""
PROBE_AFTER = 8
"""Finished trials before the first coverage probe."""
PROBE_EVERY = 2
"""Every this many trials (by trial number) is a coverage probe, once there is an incumbent."""
PROBE_BINS = 4
"""Bins of a numeric parameter's range that a probe chooses the least explored of."""
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
    """TPE (:func:`tpe_sampler`) with coverage probes, crash regions weighed by their cost, and
    no repeated configuration (module docstring).

    Contract: TPE's random start-up as it is, unless a raise is called for (``raise_when``, with
    ``probes``) or the baseline ran (the screen, with ``probes``); then each relative proposal is
    a raise, a coverage probe (``probes``) or TPE's, redrawn out of crash regions and repeats as
    described. With
    ``avoid_crashes=False`` and ``probes=False`` it is TPE alone. A seeded study stays
    reproducible: every random choice comes from a generator seeded with the study's seed. A
    multi-objective study has no incumbent: it gets no probes.
    """

    def __init__(self, seed: int | None = None, *, slots: int = 1, avoid_crashes: bool = True,
                 probes: bool = True, launched_as: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
                 monotone: Mapping[str, Mapping[str, str]] | None = None,
                 raise_when: Mapping[str, str] | None = None) -> None:
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
        self._rng = random.Random(seed)
        self._rules: list[tuple[tuple[Any, ...], float, float]] = []
        self._rules_at = -1
        self._cycle: list[str] = []
        self._moves: list[FailedMove] = []
        self._named: set[tuple[str, Any]] = set()
        self._boundary = FeasibilityModel({})
        self._boundary_cost: dict[str, float] = {}
        self._learnt_at: tuple[int, tuple[str, ...]] | None = None

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
            back_off = self._back_off(finished, search_space) if trial.number % PROBE_EVERY == 1 else None
            for _ in range(MAX_DRAWS):
                params = back_off or {n: self._random.sample_independent(study, trial, n, d)
                                      for n, d in search_space.items()}
                if self._launch_key(params) not in launched:
                    if back_off:
                        _record(study, trial, {"by": "back-off"})
                    return params
                back_off = self._back_off(finished, search_space) if back_off else None
            return params
        if incumbent is not None and self.raise_when:
            raised = self._raised(study, incumbent, search_space, launched)
            if raised is not None:
                params, why = raised
                _record(study, trial, why)
                return params
        screen = incumbent is not None and screening(trial, finished, search_space)
        if screen or (incumbent is not None and len(finished) >= PROBE_AFTER and trial.number % PROBE_EVERY == 0):
            assert incumbent is not None  # a screen needs one too
            name = self._next_parameter(search_space, incumbent, finished)
            base = _baseline(finished)
            baseline = base.params if base is not None else {}
            values = [baseline[name]] if name in baseline and baseline[name] != incumbent.params[name] else []
            for rank in range(MAX_DRAWS):
                probe = {n: incumbent.params[n] for n in search_space}
                probe[name] = (values[rank] if rank < len(values)
                               else self._least_explored(finished, name, search_space[name], probe[name], rank - len(values)))
                if (self._launch_key(probe) not in launched and (name, probe[name]) not in self._named
                        and not refused(self._moves, search_space, name, probe[name], incumbent.params[name])
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
        if any(m.kind not in MEMORY_KINDS and not _ordered(m.distribution) and params.get(m.param) == m.after
               for m in self._moves) or any((n, v) in self._named for n, v in params.items()):
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
        self.regions(study)
        key = (len(finished), tuple(search_space))
        if key == self._learnt_at:
            return
        self._moves = failed_moves(finished, search_space)
        if self.avoid_crashes:  # the boundary is read only to avoid crashes
            self._boundary = FeasibilityModel(search_space).fit([t.params for t in finished if _measured(t)],
                                                                [(k, t.params) for t in finished if (k := _kind(t))])
        self._learnt_at = key

    def regions(self, study: optuna.Study) -> list[tuple[tuple[Any, ...], float, float]]:
        """The study's crash regions: each rule's conditions (:func:`autotune.analysis.explain.failure_rules`)
        with its share of failures and its failures' mean duration over a measured trial's
        median; and, from the same rules, the choices a failure's message names (the rules of
        step 0). Recomputed when a trial has finished (whatever its outcome: a run stopped early
        counts for the rules as a run)."""
        finished = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)))
        if self._rules_at != finished:
            views = analysed_views(study)
            durations = {v.number: float(v.duration_s or 0.0) for v in views}
            ok = sorted(durations[v.number] for v in views if v.outcome == "ok")
            typical = ok[len(ok) // 2] if ok else 0.0
            out = []
            rules = failure_rules(views, self.monotone).rules  # as `study explain` states them
            self._named = {(c.param, c.value) for rule in rules if rule.named for c in rule.conditions}
            for rule in rules:
                failed = [durations.get(n, 0.0) for n in rule.trials] or [typical]
                ratio = (sum(failed) / len(failed)) / typical if typical > 0 else 1.0
                out.append((rule.conditions, rule.failed / rule.covered, max(ratio, 1e-3)))
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

    def _back_off(self, finished: list[FrozenTrial], search_space: dict[str, BaseDistribution]) -> dict[str, Any] | None:
        """The baseline (else the first trial) with each parameter declared monotone for a failure
        kind of its line moved to the safe side of those failures (module docstring); its line:
        it and the failed trials with its values on every other parameter. None: it did not fail
        with a declared kind, or no parameter has room to move."""
        ref = _baseline(finished) or finished[0]
        if any(n not in ref.params for n in search_space):
            return None
        # a value such as unset stands apart from a declaration (no speculation is not "fewer
        # draft tokens" on its scale): such a parameter is kept as the reference has it
        moving = {n for n in search_space
                  if is_number(ref.params[n]) and any(k in self.monotone.get(n, {}) for k in _kinds([ref]))}
        line = [t for t in finished if _kind(t) and all(
            t.params.get(n) == ref.params[n] for n in search_space if n not in moving)]
        proposal, moved = dict(ref.params), False
        for name in sorted(moving):
            dist, declared = search_space[name], self.monotone[name]
            above = [t.params[name] for t in line if declared.get(_kind(t)) == "down" and is_number(t.params[name])]
            below = [t.params[name] for t in line if declared.get(_kind(t)) == "up" and is_number(t.params[name])]
            if not above and not below:  # no failure of its line is of a kind declared for it
                continue
            value = self._between(dist, max(above) if above else None, min(below) if below else None)
            if value is not None:
                proposal[name], moved = value, True
        return {n: proposal[n] for n in search_space} if moved else None

    def _between(self, dist: BaseDistribution, lo: Any, hi: Any) -> Any:
        """A value of ``dist`` strictly between ``lo`` and ``hi`` (None: the range's end), drawn
        uniformly (on the log scale where it has one; a categorical: among its numeric choices in
        order); None where there is none."""
        if isinstance(dist, CategoricalDistribution):
            inside = [c for c in dist.choices if is_number(c) and (lo is None or c > lo) and (hi is None or c < hi)]
            return self._rng.choice(inside) if inside else None
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
            x = unscale(self._rng.uniform(scale(low), scale(high)))
            if step is not None:
                x = _snap(dist, min(last, max(first, x)))
            if (lo is None or x > lo) and (hi is None or x < hi):
                return x
        return None

    def _raised(self, study: optuna.Study, incumbent: FrozenTrial, search_space: dict[str, BaseDistribution],
                launched: set[tuple[tuple[str, str], ...]]) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """The incumbent with one declared parameter raised to what its load's scheduler log
        called for (:func:`~autotune.outcome.load_signals.raises_called_for`), the parameters in name
        order, and why (:data:`~autotune.store.study_view.PROPOSED_ATTR`); None when its log called
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
            value = _raised_to(search_space[name], targets[name])
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

    @staticmethod
    def _incumbent(study: optuna.Study, finished: list[FrozenTrial]) -> FrozenTrial | None:
        if len(study.directions) > 1:
            return None
        measured = [t for t in finished if is_feasible_measurement(t)]
        if not measured:
            return None
        sign = 1.0 if study.direction == optuna.study.StudyDirection.MAXIMIZE else -1.0
        return max(measured, key=lambda t: sign * float(t.value))  # type: ignore[arg-type]

    def _next_parameter(self, search_space: dict[str, BaseDistribution], incumbent: FrozenTrial,
                        finished: list[FrozenTrial]) -> str:
        """The parameters in turn, a shuffled cycle of them; within the cycle, first the one
        probed least around the incumbent (finished trials that differ from it in that parameter
        alone). A probe of a parameter around an earlier, since beaten incumbent says little
        about it around this one: the Kimi host's CUDA-graph limit, probed at the 8th trial
        around a poor incumbent, was not probed again around the good one before the cycle
        came round, and the run stayed below 90% of the optimum."""
        self._cycle = [n for n in self._cycle if n in search_space]
        if not self._cycle:
            self._cycle = sorted(search_space)
            self._rng.shuffle(self._cycle)
        around = _probed_around(incumbent, finished, search_space)
        name = min(reversed(self._cycle), key=lambda n: around.get(n, 0))  # ties: the cycle's order
        self._cycle.remove(name)
        return name

    def _least_explored(self, finished: list[FrozenTrial], name: str, dist: BaseDistribution, current: Any,
                        rank: int = 0) -> Any:
        """A value of ``name`` from the part of its range the measured trials explored least
        (other than the current value's), ties broken at random; ``rank`` 1, 2, ... take the
        next least explored part (cycling), for a redraw."""
        seen = [t.params[name] for t in finished if name in t.params and _measured(t)]
        if isinstance(dist, CategoricalDistribution):
            counts = {i: 0 for i in range(len(dist.choices))}
            for v in seen:
                counts[dist.choices.index(v)] += 1
            here = dist.choices.index(current) if current in dist.choices else -1
            order = sorted((c, self._rng.random(), i) for i, c in counts.items() if i != here)
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
        order = sorted((c, self._rng.random(), i) for i, c in enumerate(counts) if i != bin_of(current))
        i = order[rank % len(order)][2]
        y = self._rng.uniform(lo + (hi - lo) * i / PROBE_BINS, lo + (hi - lo) * (i + 1) / PROBE_BINS)
        return _snap(dist, math.exp(y) if dist.log else y)


def _snap(dist: IntDistribution | FloatDistribution, x: float) -> Any:
    """``x`` on ``dist``'s grid (an int, or a float on its step) and inside its range."""
    if isinstance(dist, IntDistribution):
        return min(dist.high, max(dist.low, dist.low + round((x - dist.low) / dist.step) * dist.step))
    if dist.step is not None:
        x = round(dist.low + round((x - dist.low) / dist.step) * dist.step, 10)
    return min(dist.high, max(dist.low, x))


def screening(trial: FrozenTrial, finished: Sequence[FrozenTrial], search_space: Mapping[str, BaseDistribution]) -> bool:
    """Whether ``trial`` is one of the baseline's one-at-a-time screen (module docstring): the
    baseline (the trial marked ``baseline``) is finished and ran, and ``trial`` is among the
    ``len(search_space) + 1`` trials after it (one per parameter, and room for a raise, which
    goes first)."""
    baseline = _baseline(finished)
    return (baseline is not None and _measured(baseline)
            and baseline.number < trial.number <= baseline.number + len(search_space) + 1)


def _baseline(finished: Sequence[FrozenTrial]) -> FrozenTrial | None:
    """The finished trial marked ``baseline`` (the driver enqueues it first), or None."""
    return next((t for t in finished if t.user_attrs.get("baseline")), None)


def _probed_around(incumbent: FrozenTrial, finished: Sequence[FrozenTrial],
                   search_space: Mapping[str, BaseDistribution]) -> Counter[str]:
    """For each parameter, how many of ``finished`` differ from ``incumbent`` in it alone (as
    proposed, failed ones included)."""
    ref = incumbent.params
    differs = ([n for n in search_space if n in t.params and n in ref and t.params[n] != ref[n]] for t in finished)
    return Counter(d[0] for d in differs if len(d) == 1)


@dataclass(frozen=True)
class FailedMove:
    """A probe or raise that failed: ``param`` moved alone from ``before`` (the value in the
    configuration it moved from, which ran) to ``after``, and the launch failed with ``kind``."""

    param: str
    distribution: BaseDistribution
    before: Any
    after: Any
    kind: str


def failed_moves(finished: Sequence[FrozenTrial], search_space: Mapping[str, BaseDistribution]) -> list[FailedMove]:
    """The study's failed probes and raises (:class:`FailedMove`), in trial order.

    One parameter moved from a configuration that ran and the launch failed: the move caused the
    failure, as far as one launch can show. Trials skipped as implied failures count (their
    failure is known without a launch)."""
    by_number = {t.number: t for t in finished}
    out = []
    for t in finished:
        why = t.system_attrs.get(PROPOSED_ATTR)
        kind = _kind(t)
        if not kind or not isinstance(why, dict) or why.get("by") not in ("probe", "raise"):
            continue
        ref = by_number.get(why.get("around", why.get("after")))  # type: ignore[arg-type]
        name = why.get("param")
        if ref is None or name not in search_space or name not in t.params or name not in ref.params:
            continue
        out.append(FailedMove(name, search_space[name], ref.params[name], t.params[name], kind))
    return out


def refused(moves: Sequence[FailedMove], search_space: Mapping[str, BaseDistribution], name: str, value: Any,
            current: Any) -> bool:
    """Whether a probe moving ``name`` from ``current`` to ``value`` repeats a failed move.

    - A memory failure (:data:`MEMORY_KINDS`) of an ordered parameter (a number, or a categorical
      with numeric choices, in their order): any move the same way. Memory is monotone in most
      launch parameters, declared or not (on the Kimi host fewer NCCL channels capture larger
      CUDA graphs, more draft tokens take more memory): the probe that ran out of it one way
      says the incumbent has no room that way.
    - Another failure of a number: a move the same way to its value or beyond (a threshold: more
      channels than the buffers allow).
    - Another failure of an unordered choice (``NCCL_ALGO=Tree``), or a memory failure of one:
      that choice.
    """
    dist = search_space[name]
    for m in moves:
        if m.param != name:
            continue
        if not _ordered(dist):
            if value == m.after:
                return True
            continue
        way = _sign(_position(dist, m.after) - _position(dist, m.before))
        if way == 0 or _sign(_position(dist, value) - _position(dist, current)) != way:
            continue
        if m.kind in MEMORY_KINDS or way * (_position(dist, value) - _position(dist, m.after)) >= 0:
            return True
    return False


def _ordered(dist: BaseDistribution) -> bool:
    """A number, or a categorical with numeric choices (ordered as listed)."""
    return not isinstance(dist, CategoricalDistribution) or any(is_number(c) for c in dist.choices)


def _position(dist: BaseDistribution, value: Any) -> float:
    """Where ``value`` lies in an ordered parameter's range (:func:`_ordered`)."""
    if isinstance(dist, CategoricalDistribution):
        return float(dist.choices.index(value)) if value in dist.choices else -1.0
    return float(value)


def _sign(x: float) -> int:
    return (x > 0) - (x < 0)


def _worth(p: float, cost_ratio: float) -> float:
    """A proposal's measurements per unit of GPU time next to a sure one: it fails with chance
    ``p`` after ``cost_ratio`` of a measured trial's time."""
    return (1 - p) / (p * cost_ratio + (1 - p)) if p < 1.0 else 0.0


_measured = is_measured
_kind = failed_kind


def _kinds(trials: Sequence[FrozenTrial]) -> set[str]:
    return {k for k in map(_kind, trials) if k}


def _raised_to(dist: BaseDistribution, target: float) -> Any:
    """The value of ``dist`` a raise to ``target`` proposes: ``target`` snapped into an int or
    float range (its end at most); of a categorical's numeric choices the smallest at least
    ``target``, else the largest (its other choices, such as ``unset``, are never raised to).
    None: no numeric value."""
    if isinstance(dist, (IntDistribution, FloatDistribution)):
        return _snap(dist, min(dist.high, target))
    if isinstance(dist, CategoricalDistribution):
        numbers = sorted(c for c in dist.choices if is_number(c))
        return next((c for c in numbers if c >= target), numbers[-1] if numbers else None)
    return None


def _record(study: optuna.Study, trial: FrozenTrial, why: dict[str, Any]) -> None:
    """Store why the sampler proposed ``trial``'s parameters (:data:`~autotune.store.study_view.PROPOSED_ATTR`)."""
    set_system_attr(study, trial, PROPOSED_ATTR, why)


def _key(params: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, repr(v)) for k, v in params.items()))


__all__ = ["CrashAwareTPESampler", "FailedMove", "MAX_DRAWS", "PROBE_AFTER", "PROBE_BINS", "PROBE_EVERY", "RISK",
           "TPE_STARTUP_TRIALS", "failed_moves", "refused", "screening", "tpe_sampler"]
