"""`autotune bench tuner`: whole studies against the simulator's model, strategies compared in
trials and simulated GPU-hours.

Each study is the real :class:`~autotune.study.driver.Driver` and :class:`~autotune.config.space.SearchSpace`
on a SQLite storage (under ``/dev/shm`` when it exists), with a
:class:`~autotune.bench.model_executor.ModelExecutor` in place of a host: no server, no HTTP. The
target is a ``sim`` target on the scenario with the demo's NCCL env (``NCCL_IB_DISABLE=1``,
``NCCL_P2P_LEVEL=5``) and the default ready timeout (600 s, shortened by the driver from the
start-ups it sees); the baseline is the space's defaults, enqueued first by the driver and
counted as trial 1. Study ``seed`` s (0 .. K-1) seeds the sampler and the run-to-run noise
(``AUTOTUNE_SIM_SEED=s``), the same for every strategy, so strategies meet the same noise.

Scores, per study:

- *best / optimum after n trials*: the study's best trial by its **measured** value (what
  ``study best`` reports), re-predicted without noise, over the optimum (:func:`find_optimum`);
  0 while no trial was feasible;
- *trials and GPU-hours to p%*: the first trial (and the simulated GPU-hours spent up to and
  including it: each trial's :class:`~autotune.bench.model_executor.ModelExecutor` cost x the
  scenario's GPUs) after which that score is >= p; a study that never gets there within its
  budget counts as not reached (infinite);
- *infeasible share*: infeasible trials over all trials, and over the trials after the 10th;
- *stopped share* and *GPU-hours saved*: trials whose load stopped early
  (:mod:`autotune.execution.early_stop`; a stopped trial costs its simulated time until it stopped) over
  all trials, and the GPU-hours their whole loads would have cost more (``TrialCost.full_seconds``),
  in hours and as a share of what the study would have cost.

Over the seeds: median and quartiles (linear interpolation; a quartile that falls on a run that
never reached is infinite, ``null`` in JSON), and how many runs reached.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import os
import shutil
import tempfile
import time
import warnings
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import optuna
from optuna.trial import TrialState

from autotune.config.study import StudyConfig
from autotune.config.demo import DEMO_CONFIG
from autotune.study.driver import Driver, QuietReporter
from autotune.errors import UsageError
from autotune.search.implied import SKIPPED
from autotune.bench.model_executor import ModelExecutor
from autotune.config.objective import Objective
from autotune.execution.runner import TrialResult, TrialSpec
from autotune.sim.scenario import Noise, Scenario, ScenarioError, list_scenarios, load_scenario
from autotune.config.space import Parameter, ParamValue, SearchSpace
from autotune.bench.strategies import STRATEGIES, strategy
from autotune.store.study_view import best_of
from autotune.store.record import TrialRecord, read

CHECKPOINTS = (10, 20, 40)
"""Trial counts after which best / optimum is reported."""
TARGETS = (0.90, 0.95, 0.98)
"""Fractions of the optimum whose trials and GPU-hours are reported."""
AFTER = 10
"""The infeasible share is also reported over the trials after this many."""
BENCH_ENV = {k: v for k, v in DEMO_CONFIG["target"]["env"].items() if k.startswith("NCCL_")}
"""The target's fixed env: the demo's NCCL variables."""
OPTIMUM_RANDOM = 3000
"""Random configurations the dense search starts from."""
OPTIMUM_STARTS = 8
"""The best random configurations each refined by coordinate search."""
AXIS_VALUES = 64
"""At most this many values per parameter in the coordinate search (all of them when fewer)."""
OPTIMUM_VERSION = "1"
"""Part of the optimum cache's key: bump when the search changes."""
MIN_SHM_FREE = 1 << 30


# -- the set-up of one scenario ---------------------------------------------------------------------
@dataclass(frozen=True)
class Setup:
    """What a study on one scenario runs: the space, objective, scenario (noise applied)."""

    scenario_name: str
    space_name: str
    objective_name: str
    noise: float | None
    early_stop: bool = True
    """False: the objective's ``early_stop`` off (every load runs to its end)."""

    @property
    def space(self) -> SearchSpace:
        return _space(self.space_name)

    @property
    def objective(self) -> Objective:
        obj = _objective(self.objective_name)
        return obj if self.early_stop else dataclasses.replace(obj, early_stop=False)

    @property
    def scenario(self) -> Scenario:
        return _scenario(self.scenario_name, self.noise)

    def config(self, *, name: str, storage: str, sampler: str, seed: int | None, trials: int,
               confirm: bool = True) -> StudyConfig:
        """The study config of one study (``confirm``: the budget's end confirms the best, as
        ``study start`` does by default)."""
        budget: dict[str, Any] = {"trials": trials}
        if not confirm:
            budget["confirm"] = {"candidates": 0}
        return StudyConfig.from_mapping({
            "name": name, "target": {"engine": "sim", "scenario": self.scenario_name, "env": dict(BENCH_ENV)},
            "space": self.space_name, "objective": self.objective_name, "storage": storage, "sampler": sampler,
            "seed": seed, "budget": budget,
        }, "bench tuner")

    def executor(self, seed: int | None, *, ready_timeout_s: float | None = None) -> ModelExecutor:
        """A model executor of this set-up with noise ``seed``."""
        cfg = self.config(name="probe", storage="sqlite:///unused.db", sampler="tpe", seed=None, trials=1)
        ex = ModelExecutor.for_target(cfg, self.objective, seed=seed, scenario=self.scenario)
        if ready_timeout_s is not None:
            ex.ready_timeout_s = ready_timeout_s
        return ex


@lru_cache(maxsize=None)
def _space(name: str) -> SearchSpace:
    return SearchSpace.load(name)


@lru_cache(maxsize=None)
def _objective(name: str) -> Objective:
    return Objective.load_file(name)


@lru_cache(maxsize=None)
def _scenario(name: str, noise: float | None) -> Scenario:
    try:
        sc = load_scenario(name)
    except ScenarioError as exc:
        raise UsageError(str(exc)) from None
    if noise is not None:
        sc = sc.model_copy(update={"noise": Noise(throughput_sd=noise)})
    return sc


class Evaluator:
    """The noise-free value of configurations (``None``: infeasible), through a noise-free
    :class:`ModelExecutor` without ready timeout: what the model says the configuration does."""

    def __init__(self, setup: Setup) -> None:
        self.space = setup.space
        self.metric = setup.objective.metric
        self.maximize = setup.objective.direction == "maximize"
        self._ex = setup.executor(None, ready_timeout_s=math.inf)
        self._memo: dict[tuple[tuple[str, Any], ...], float | None] = {}

    def value(self, params: dict[str, ParamValue]) -> float | None:
        launch = self.space.to_launch(params)
        key = tuple(sorted(launch.applied.items()))
        if key not in self._memo:
            r = self._ex.result(TrialSpec(0, env=launch.env, args=launch.args))
            self._memo[key] = r.metrics.get(self.metric) if r.outcome == "ok" else None
        return self._memo[key]

    def better(self, a: float | None, b: float | None) -> bool:
        """Whether value ``a`` is better than ``b`` (None: infeasible, worse than any value)."""
        if a is None:
            return False
        return b is None or (a > b if self.maximize else a < b)

    @property
    def evaluated(self) -> int:
        return len(self._memo)


# -- the optimum ------------------------------------------------------------------------------------
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
    folder), keyed by the scenario, space, objective, env, search and the simulator's source.

    Raises:
        UsageError: no random configuration is feasible.
    """
    folder = cache_dir or Path(tempfile.gettempdir()) / "autotune-bench"
    key = _optimum_key(setup, random_points, starts)
    path = folder / f"optimum-{setup.scenario_name}-{key[:16]}.json"
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
        h.update(f.read_bytes())
    space = setup.space
    doc = {"v": OPTIMUM_VERSION, "scenario": setup.scenario.model_dump(mode="json"),
           "space": {n: optuna.distributions.distribution_to_json(d) for n, d in space.distributions().items()},
           "applied": {n: p.model_dump(mode="json") for n, p in space.parameters.items()},
           "rules": [str(r) for r in space.rules], "objective": setup.objective.metric,
           "direction": setup.objective.direction, "load": setup.objective.load.model_dump(mode="json"),
           "env": BENCH_ENV, "random": random_points, "starts": starts, "axis": AXIS_VALUES, "sim": h.hexdigest()}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


# -- one study ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StudyTask:
    """One study to run: a scenario set-up, a strategy, a seed, a budget, the optimum."""

    setup: Setup
    strategy: str
    seed: int
    trials: int
    optimum: float
    scratch: str | None = None


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
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    setup = task.setup
    strat = strategy(task.strategy, setup.space)
    folder = scratch_dir(task.scratch)
    try:
        cfg = setup.config(name=f"bench-{task.strategy}-{task.seed}", storage=f"sqlite:///{folder}/study.db",
                           sampler=strat.config_sampler, seed=task.seed, trials=task.trials,
                           confirm=strat.study_features)
        ex = ModelExecutor.for_target(cfg, setup.objective, seed=task.seed, scenario=setup.scenario)
        clock = _Clock(ex)
        driver = Driver(cfg, setup.space, setup.objective, ex, reporter=clock, trials=task.trials, sampler=strat.factory,
                        skip_implied=strat.study_features)
        run = driver.run()
        trials = sorted((t for t in run.study.get_trials(deepcopy=False)
                         if t.state in (TrialState.COMPLETE, TrialState.PRUNED)), key=lambda t: t.number)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return _trace(task, trials, ex, clock)


def _trace(task: StudyTask, trials: Sequence[optuna.trial.FrozenTrial], ex: ModelExecutor, clock: _Clock) -> StudyTrace:
    """What the study did, launched trial by launched trial (skipped ones launched nothing): the
    best as ``study best`` chooses it (:func:`~autotune.store.study_view.best_of`: the best figure of a
    configuration, see :class:`~autotune.store.study_view.Measured`) after each, re-predicted without noise."""
    ev = _evaluator(task.setup)
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
            best_true = _ratio(ev.value(best.params), task.optimum, ev.maximize)
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


@lru_cache(maxsize=None)
def _evaluator(setup: Setup) -> Evaluator:
    return Evaluator(setup)


def _ratio(value: float | None, optimum: float, maximize: bool) -> float:
    if value is None or value <= 0 or optimum <= 0:
        return 0.0
    return value / optimum if maximize else optimum / value


# -- the benchmark -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class BenchOptions:
    """What `autotune bench tuner` runs."""

    scenarios: tuple[str, ...]
    strategies: tuple[str, ...] = STRATEGIES
    space: str = "sglang_nccl"
    objective: str = "quick"
    trials: int = 60
    seeds: int = 20
    jobs: int = 1
    noise: float | None = None
    scratch: str | None = None
    """Where the studies' SQLite files go (default: /dev/shm when it has room, else the temp folder)."""
    optimum_points: int = OPTIMUM_RANDOM
    """Random configurations the optimum's dense search starts from (:func:`find_optimum`)."""
    early_stop: bool = True
    """False: the objective's ``early_stop`` off, every trial's load runs to its end."""


def check_options(opts: BenchOptions) -> list[Setup]:
    """Validate everything before any study runs; the set-up of each scenario.

    Raises:
        UsageError: an unknown scenario or strategy, trials or seeds < 1, jobs < 1, noise outside
            [0, 0.5), a space or objective that cannot be loaded or that the model cannot run, a
            multi-objective objective.
    """
    if opts.trials < 1:
        raise UsageError(f"--trials must be at least 1, got {opts.trials}")
    if opts.seeds < 1:
        raise UsageError(f"--seeds must be at least 1, got {opts.seeds}")
    if opts.optimum_points < 1:
        raise UsageError(f"--optimum-points must be at least 1, got {opts.optimum_points}")
    if opts.jobs < 1:
        raise UsageError(f"--jobs must be at least 1, got {opts.jobs}")
    if opts.noise is not None and not (0 <= opts.noise < 0.5):
        raise UsageError(f"--noise must be in [0, 0.5), got {opts.noise:g}")
    if opts.scratch is not None and not (Path(opts.scratch).is_dir() and os.access(opts.scratch, os.W_OK)):
        raise UsageError(f"--scratch {opts.scratch}: not a writable folder")
    if not opts.scenarios:
        raise UsageError("no scenario given")
    if not opts.strategies:
        raise UsageError("no strategy given")
    for name in opts.strategies:
        if name not in STRATEGIES:
            raise UsageError(f"unknown strategy '{name}' (strategies: {', '.join(STRATEGIES)})")
    setups = []
    for name in opts.scenarios:
        if name not in list_scenarios() and not Path(name).is_file():
            raise UsageError(f"unknown scenario '{name}' (built-in: {', '.join(list_scenarios())})")
        setup = Setup(name, opts.space, opts.objective, opts.noise, opts.early_stop)
        if setup.objective.multi:
            raise UsageError(f"objective {setup.objective.name} has {len(setup.objective.goals)} objectives: the tuner "
                             "benchmark compares strategies on one objective (give an objective with one metric)")
        setup.executor(0)  # loads the scenario and objective; the objective is one the model can run
        for s in opts.strategies:
            strategy(s, setup.space)
        setups.append(setup)
    return setups


def run_bench(opts: BenchOptions, *, progress: Callable[[int, int, str], None] | None = None) -> dict[str, Any]:
    """Run every study of ``opts`` (``jobs`` worker processes) and return the report
    (:func:`report`). ``progress(done, total, what)`` is called as studies finish."""
    setups = check_options(opts)
    note = progress or (lambda done, total, what: None)
    optima: dict[str, Optimum] = {}
    started = time.perf_counter()
    tasks: list[StudyTask] = []
    with _pool(opts.jobs) as pool:
        note(0, len(setups), "optimum")
        search = functools.partial(find_optimum, random_points=opts.optimum_points)
        for setup, opt in zip(setups, _map(pool, search, setups, ordered=True)):
            optima[setup.scenario_name] = opt
        note(len(setups), len(setups), "optimum")
        for setup in setups:
            for seed in range(opts.seeds):
                for name in opts.strategies:
                    tasks.append(StudyTask(setup, name, seed, opts.trials, optima[setup.scenario_name].value,
                                           opts.scratch))
        traces: list[StudyTrace] = []
        note(0, len(tasks), "studies")
        for trace in _map(pool, run_study, tasks):
            traces.append(trace)
            note(len(traces), len(tasks), f"{trace.scenario} {trace.strategy} seed {trace.seed}")
    return report(opts, setups, optima, traces, wall_s=time.perf_counter() - started)


class _Inline:
    """A stand-in for a process pool that runs each call here (``--jobs 1``)."""

    def __enter__(self) -> _Inline:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def _pool(jobs: int) -> Any:
    return _Inline() if jobs <= 1 else ProcessPoolExecutor(max_workers=jobs)


def _map(pool: Any, fn: Callable[[Any], Any], items: Sequence[Any], *, ordered: bool = False) -> Iterable[Any]:
    """``fn`` of each item: in the order of ``items`` when ``ordered``, else as they finish."""
    if isinstance(pool, _Inline):
        for item in items:
            yield fn(item)
        return
    futures = {pool.submit(fn, item): i for i, item in enumerate(items)}
    if ordered:
        results = {futures[f]: f.result() for f in as_completed(futures)}
        yield from (results[i] for i in range(len(items)))
        return
    for f in as_completed(futures):
        yield f.result()


# -- the report ---------------------------------------------------------------------------------------
def quartiles(values: Sequence[float]) -> dict[str, float | None]:
    """Median and quartiles (linear interpolation between order statistics); an infinite value
    (a run that never reached) makes a quantile that touches it ``None``."""
    xs = sorted(values)

    def q(p: float) -> float | None:
        if not xs:
            return None
        pos = p * (len(xs) - 1)
        lo, hi = math.floor(pos), math.ceil(pos)
        frac = pos - lo
        a, b = xs[lo], xs[hi]
        if math.isinf(a) or (frac > 0 and math.isinf(b)):
            return None
        return a + (b - a) * frac

    return {"q1": q(0.25), "median": q(0.5), "q3": q(0.75)}


def _first(values: Sequence[float], target: float) -> int | None:
    """The 1-based index of the first value >= ``target``, or None."""
    for i, v in enumerate(values):
        if v >= target - 1e-12:
            return i + 1
    return None


def summarize(traces: Sequence[StudyTrace], trials: int, gpus: int) -> dict[str, Any]:
    """The scores of one strategy on one scenario over its runs (see the module docstring)."""
    out: dict[str, Any] = {"runs": len(traces)}
    out["best_over_optimum_after"] = {str(c): quartiles([t.ratio[min(c, len(t.ratio)) - 1] for t in traces])
                                      for c in CHECKPOINTS if c <= trials}
    out["best_over_optimum_final"] = quartiles([t.ratio[-1] for t in traces])
    out["best_over_optimum_max"] = max(t.ratio[-1] for t in traces)
    to_trials: dict[str, Any] = {}
    to_hours: dict[str, Any] = {}
    for target in TARGETS:
        key = f"{round(target * 100)}"
        firsts = [_first(t.ratio, target) for t in traces]
        reached = sum(f is not None for f in firsts)
        # "at_least": the median with a run that never got there counted at what it spent without
        # getting there (its trials + 1, its GPU-hours): a lower bound on what it needed
        trials_spent = [len(t.ratio) + 1 if f is None else f for t, f in zip(traces, firsts)]
        hours_spent = [sum(t.seconds[:f]) * gpus / 3600 for t, f in zip(traces, firsts)]  # [:None]: all
        to_trials[key] = {**quartiles([math.inf if f is None else n for f, n in zip(firsts, trials_spent)]),
                          "reached": reached, "at_least": quartiles(trials_spent)["median"]}
        to_hours[key] = {**quartiles([math.inf if f is None else h for f, h in zip(firsts, hours_spent)]),
                         "reached": reached, "at_least": quartiles(hours_spent)["median"]}
    out["trials_to"] = to_trials
    out["gpu_hours_to"] = to_hours
    out["infeasible_share"] = quartiles([sum(t.infeasible) / len(t.infeasible) for t in traces])
    after = [t.infeasible[AFTER:] for t in traces if len(t.infeasible) > AFTER]
    out[f"infeasible_share_after_{AFTER}"] = quartiles([sum(a) / len(a) for a in after])
    within = min(40, trials)
    out["never_90"] = {"within": within, "runs": sum(_first(t.ratio[:within], 0.90) is None for t in traces)}
    out["gpu_hours_total"] = quartiles([sum(t.seconds) * gpus / 3600 for t in traces])
    out["stopped_share"] = quartiles([sum(t.stopped) / len(t.seconds) for t in traces])
    saved = [(sum(t.full_seconds or t.seconds) - sum(t.seconds)) * gpus / 3600 for t in traces]
    out["gpu_hours_saved"] = quartiles(saved)
    out["gpu_hours_saved_share"] = quartiles([s / (s + sum(t.seconds) * gpus / 3600) if s > 0 else 0.0
                                              for s, t in zip(saved, traces)])
    out["driver_ms_per_trial"] = quartiles([1000 * sum(t.driver_s) / len(t.driver_s) for t in traces if t.driver_s])
    tail = [t.driver_s[-max(1, len(t.driver_s) // 10):] for t in traces if t.driver_s]
    out["driver_ms_per_trial_last_tenth"] = quartiles([1000 * sum(x) / len(x) for x in tail])
    out["trial_s"] = quartiles([s for t in traces for s in t.seconds])
    errors = [abs(t.reported_over_true - 1) for t in traces if t.reported_over_true is not None]
    out["reported_best_error"] = {**quartiles(errors), "within_2pct": sum(e <= 0.02 for e in errors),
                                  "of": len(errors)}
    out["reported_best_measurements"] = quartiles([float(t.reported_count) for t in traces if t.reported_count])
    out["skipped"] = quartiles([float(t.skipped) for t in traces])
    out["confirmation_runs"] = quartiles([float(t.confirmations) for t in traces])
    return out


def report(opts: BenchOptions, setups: Sequence[Setup], optima: dict[str, Optimum], traces: Sequence[StudyTrace],
           *, wall_s: float) -> dict[str, Any]:
    """The JSON document of a benchmark: options, per scenario the optimum and each strategy's
    scores, and the issue's goals as measured."""
    scenarios: dict[str, Any] = {}
    for setup in setups:
        name = setup.scenario_name
        opt = optima[name]
        gpus = setup.scenario.gpu.count
        baseline = _evaluator(setup).value(setup.space.complete({}))
        per = {s: summarize([t for t in traces if t.scenario == name and t.strategy == s], opts.trials, gpus)
               for s in opts.strategies}
        scenarios[name] = {
            "gpus": gpus,
            "optimum": {"value": opt.value, "metric": setup.objective.metric, "params": opt.params,
                        "method": opt.method, "evaluated": opt.evaluated},
            "baseline_over_optimum": _ratio(baseline, opt.value, _evaluator(setup).maximize),
            "strategies": per,
            "goals": goals(per, opts),
        }
    return {
        "benchmark": "tuner",
        "options": {"scenarios": list(opts.scenarios), "strategies": list(opts.strategies), "space": opts.space,
                    "objective": opts.objective, "trials": opts.trials, "seeds": opts.seeds, "jobs": opts.jobs,
                    "noise": opts.noise, "scratch": opts.scratch or default_scratch(),
                    "optimum_points": opts.optimum_points, "early_stop": opts.early_stop},
        "scenarios": scenarios,
        "wall_s": round(wall_s, 1),
    }


def goals(per: dict[str, Any], opts: BenchOptions) -> dict[str, Any]:
    """The issue's goals for ``autotune`` on one scenario, as measured: each ``{"met": true |
    false | null, "detail": ...}`` (null: not measurable from this run)."""
    out: dict[str, Any] = {}
    mine = per.get("autotune")
    if mine is None:
        return out

    def vs(key: str, other: str, factor: float) -> dict[str, Any]:
        theirs = per.get(other)
        a = mine[key]["95"]["median"]
        if theirs is None:
            return {"met": None, "detail": f"{other} not run"}
        b = theirs[key]["95"]["median"]
        if a is None:
            return {"met": False, "detail": f"autotune's median run never reached 95% (vs {other}: {_num(b)})"}
        if b is None:
            # a run that never reached needed more than it spent: the median is at least the
            # median with those runs counted at what they spent
            bound = theirs[key]["95"].get("at_least")
            said = f"{_num(a)} vs {other} never reaching 95% in its median run (so more than {_num(bound)})"
            if bound is not None and a <= bound * factor:
                return {"met": True, "detail": f"{said}, ratio under {a / bound:.2f}, goal <= {factor:.2f}"}
            return {"met": None, "detail": f"{said}: a longer {other} run would decide"}
        return {"met": a <= b * factor, "detail": f"{_num(a)} vs {other} {_num(b)} (ratio {a / b:.2f}, goal <= {factor:.2f})"}

    out["trials_to_95_vs_random"] = vs("trials_to", "random", 1 / 3)
    out["gpu_hours_to_95_vs_tpe_naive"] = vs("gpu_hours_to", "tpe-naive", 1 / 2)
    never = mine["never_90"]
    out["never_90_within_40"] = {"met": never["runs"] <= mine["runs"] / 20 if never["within"] >= 40 else None,
                                 "detail": f"{never['runs']} of {mine['runs']} runs within {never['within']} trials"}
    share = mine.get(f"infeasible_share_after_{AFTER}", {}).get("median")
    out["infeasible_after_10"] = {"met": None if share is None else share <= 0.10,
                                  "detail": "no trial after the 10th" if share is None else f"median {share:.1%}"}
    err = mine["reported_best_error"]
    out["reported_best_within_2pct"] = {
        "met": None if err["median"] is None else err["median"] <= 0.02,
        "detail": "no feasible best" if err["median"] is None else
        f"median error {err['median']:.1%}, {err['within_2pct']} of {err['of']} runs within 2% "
        f"(median {_num(mine['reported_best_measurements']['median'])} measurements)"}
    own = mine["driver_ms_per_trial_last_tenth"]["median"]
    real = mine["trial_s"]["median"]
    if opts.trials < 200 or own is None or real is None:
        out["tuner_time_at_200"] = {"met": None, "detail": "needs --trials 200 or more"}
    else:
        out["tuner_time_at_200"] = {"met": own / 1000 < 0.01 * real,
                                    "detail": f"{own:.0f} ms per trial over the last tenth vs 1% of a median "
                                              f"trial's {real:.0f} s"}
    return out


def _num(x: float | None) -> str:
    return "never" if x is None else f"{x:.3g}"
