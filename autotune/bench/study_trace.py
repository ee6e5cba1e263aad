"""One study of `autotune bench tuner`, run with the real driver and traced trial by trial.

:func:`run_study` runs a :class:`StudyTask` (a set-up, a strategy, a seed, a budget) on a SQLite
storage in a scratch folder (:func:`scratch_dir`, under ``/dev/shm`` when it has room) and returns
its :class:`StudyTrace`: after each launched trial, the best so far as ``study best`` chooses it,
re-predicted without noise, over the optimum; each trial's simulated cost; the driver's own time.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import optuna
from optuna.trial import TrialState

from autotune.bench.model_executor import ModelExecutor
from autotune.bench.optimum import ratio
from autotune.bench.setups import Setup, evaluator
from autotune.bench.strategies import strategy
from autotune.execution.trial import TrialResult
from autotune.search.implied import SKIPPED
from autotune.store.record import TrialRecord, read
from autotune.store.study_view import best_of
from autotune.study import build
from autotune.study.reporting import QuietReporter

MIN_SHM_FREE = 1 << 30
"""``/dev/shm`` is the default scratch folder only with this much free."""


@dataclass(frozen=True)
class StudyTask:
    """One study to run: a scenario set-up, a strategy, a seed, a budget, the optimum."""

    setup: Setup
    strategy: str
    seed: int
    trials: int
    optimum: float
    scratch: str | None = None
    warm_from: Setup | None = None
    """``autotune-warm``: the set-up whose ``autotune`` study (same seed and budget) is run first
    and warm-started from."""
    force: bool = False
    """Whether the warm start is forced (a source on another host)."""


@dataclass
class StudyTrace:
    """What one study did, trial by trial (in the order the trials finished)."""

    scenario: str
    strategy: str
    seed: int
    ratio: list[float] = field(default_factory=list)
    """Best so far (by measured value), re-predicted without noise, over the optimum."""
    seconds: list[float] = field(default_factory=list)
    """Each trial's simulated cost."""
    infeasible: list[bool] = field(default_factory=list)
    stopped: list[bool] = field(default_factory=list)
    """Each trial: whether its load stopped early."""
    full_seconds: list[float] = field(default_factory=list)
    """Each trial's simulated cost had its load not stopped early."""
    kinds: list[str | None] = field(default_factory=list)
    driver_s: list[float] = field(default_factory=list)
    """The driver's own real time for each trial (its wall time less the model's), from the
    study's start (its storage opened and its lease taken)."""
    skipped: int = 0
    """Proposals an earlier failure implied: recorded, never launched, costing nothing."""
    confirmations: int = 0
    """Launched trials that measured a best configuration again."""
    reported_over_true: float | None = None
    """The final reported best (its figure: the mean of its runs after the first when measured
    again) over its noise-free value."""
    reported_count: int = 0
    """How many measurements the final reported best is the mean of."""


class _Clock(QuietReporter):
    """Takes the time at each finished trial, less the time the model took, for the driver's
    own time per trial."""

    def __init__(self, executor: ModelExecutor) -> None:
        self.executor = executor
        self.marks: list[float] = []
        self.start = 0.0

    def study_started(self, name: str, done: int, budget: int | None) -> None:
        self.start = time.perf_counter()

    def trial_finished(self, result: TrialResult, value: float | None, best: float | None,
                       moved: str | None = None) -> None:
        self.marks.append(time.perf_counter() - self.executor.model_s)


def default_scratch() -> str:
    """Where studies' storages go by default: ``/dev/shm`` when it has room, else the system
    temp folder."""
    shm = Path("/dev/shm")
    try:
        if shm.is_dir() and os.access(shm, os.W_OK) and shutil.disk_usage(shm).free > MIN_SHM_FREE:
            return str(shm)
    except OSError:
        pass
    return tempfile.gettempdir()


def scratch_dir(base: str | None = None) -> str:
    """A new private folder for a study's storage, in ``base`` (default: :func:`default_scratch`)."""
    return tempfile.mkdtemp(prefix="autotune-bench-", dir=base or default_scratch())


def run_study(task: StudyTask) -> StudyTrace:
    """Run one whole study with the real driver on a SQLite storage in a scratch folder (removed
    afterwards) and trace it."""
    trials, ex, clock = _run(task)
    return _trace(task, trials, ex, clock)


def run_trials(task: StudyTask) -> list[optuna.trial.FrozenTrial]:
    """Run one whole study as :func:`run_study` does; its finished trials (COMPLETE or PRUNED),
    in trial order."""
    return _run(task)[0]


def _run(task: StudyTask) -> tuple[list[optuna.trial.FrozenTrial], ModelExecutor, _Clock]:
    """The study's finished trials in trial order, its executor and its clock."""
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    setup = task.setup
    strat = strategy(task.strategy, setup.space)
    folder = scratch_dir(task.scratch)
    try:
        storage = f"sqlite:///{folder}/study.db"
        warm = []
        if task.warm_from is not None:
            source = task.warm_from
            src = source.config(name=f"source-{task.seed}", storage=storage, sampler="tpe", seed=task.seed,
                                trials=task.trials)
            src_ex = ModelExecutor.for_target(src, source.objective, seed=task.seed, scenario=source.scenario)
            build.driver(build.Plan(src, source.space, source.objective), src_ex, trials=task.trials).run()
            warm = [{"study": src.name, "force": task.force}]
        cfg = setup.config(name=f"bench-{task.strategy}-{task.seed}", storage=storage,
                           sampler=strat.config_sampler, seed=task.seed, trials=task.trials,
                           confirm=strat.study_features, warm_start=warm)
        ex = ModelExecutor.for_target(cfg, setup.objective, seed=task.seed, scenario=setup.scenario)
        clock = _Clock(ex)
        run = build.driver(build.Plan(cfg, setup.space, setup.objective), ex, reporter=clock, trials=task.trials,
                           sampler=strat.factory, skip_implied=strat.study_features).run()
        trials = sorted((t for t in run.study.get_trials(deepcopy=False)
                         if t.state in (TrialState.COMPLETE, TrialState.PRUNED)), key=lambda t: t.number)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return trials, ex, clock


def _trace(task: StudyTask, trials: Sequence[optuna.trial.FrozenTrial], ex: ModelExecutor, clock: _Clock) -> StudyTrace:
    """What the study did, launched trial by launched trial (skipped ones launched nothing): the
    best as ``study best`` chooses it (:func:`~autotune.store.study_view.best_of`: the best figure of a
    configuration, see :class:`~autotune.store.study_view.Measured`) after each, re-predicted without noise."""
    ev = evaluator(task.setup)
    trace = StudyTrace(task.setup.scenario_name, task.strategy, task.seed)
    costs = {c.number: c for c in ex.costs}
    seen: list[TrialRecord] = []
    best_true = 0.0
    best = None
    for t in trials:
        if t.user_attrs.get("outcome") == SKIPPED:
            trace.skipped += 1
            continue
        cost = costs[t.number]
        trace.seconds.append(cost.seconds)
        trace.full_seconds.append(cost.full_seconds)
        trace.infeasible.append(t.user_attrs.get("outcome") == "infeasible")
        trace.stopped.append(t.user_attrs.get("outcome") == "stopped")
        trace.kinds.append(cost.kind)
        trace.confirmations += int("confirms" in t.user_attrs)
        if t.user_attrs.get("outcome") == "ok" and t.value is not None:
            seen.append(read(t))
            best = best_of(seen, ev.maximize)
            assert best is not None
            best_true = ratio(ev.value(best.params), task.optimum, ev.maximize)
        trace.ratio.append(best_true)
    if best is not None and best.value:
        true = ev.value(best.params)
        trace.reported_over_true = None if not true else best.value / true
        trace.reported_count = len(best.measured.backing) if best.measured else 1
    previous = clock.start
    for mark in clock.marks:
        trace.driver_s.append(mark - previous)
        previous = mark
    return trace
