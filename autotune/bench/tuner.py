"""`autotune bench tuner`: whole studies against the simulator's model, strategies compared in
trials and simulated GPU-hours.

Each study is the real :class:`~autotune.study.driver.Driver` and
:class:`~autotune.config.space.SearchSpace` on a SQLite storage (under ``/dev/shm`` when it has
room), with a :class:`~autotune.bench.model_executor.ModelExecutor` in place of a host: no server,
no HTTP (:mod:`autotune.bench.study_trace`). The target is a ``sim`` target on the scenario with
the demo's NCCL env (:mod:`autotune.bench.setups`) and the default ready timeout (600 s,
shortened by the driver from the start-ups it sees); the baseline is the space's defaults,
enqueued first by the driver and counted as trial 1. Study ``seed`` s (0 .. K-1) seeds the
sampler and the run-to-run noise (``AUTOTUNE_SIM_SEED=s``), the same for every strategy, so
strategies meet the same noise.

:func:`run_bench` finds each scenario's optimum (:func:`~autotune.bench.optimum.find_optimum`),
runs every study of :class:`BenchOptions` and returns :func:`report`: per scenario and strategy
the scores of :mod:`autotune.bench.scores`, and the issue's goals as measured (:func:`goals`); with
generated hosts (``generated``, :mod:`autotune.bench.family`) also the scores and goals over the
family, every run pooled.
"""

from __future__ import annotations

import functools
import os
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from autotune.bench.family import family_files, halves, summarize_family
from autotune.bench.optimum import OPTIMUM_RANDOM, Optimum, find_optimum, ratio
from autotune.bench.scores import AFTER, WARM_AFTER, summarize
from autotune.bench.setups import Setup, evaluator
from autotune.bench.strategies import STRATEGIES, strategy
from autotune.bench.study_trace import StudyTask, StudyTrace, default_scratch, run_study
from autotune.errors import UsageError
from autotune.sim.scenario import list_scenarios


# -- the benchmark -----------------------------------------------------------------------------------
SIBLING = "sibling"
"""``--warm-from``'s value for each generated host's sibling (:func:`~autotune.sim.family.generate_sibling`)."""


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
    generated: tuple[int, ...] = ()
    """Seeds of generated hosts (:mod:`autotune.sim.family`) run beside ``scenarios``."""
    warm_from: str | None = None
    """``autotune-warm``'s source scenario (:class:`~autotune.bench.study_trace.StudyTask`)."""
    force: bool = False
    """Whether ``autotune-warm`` forces its warm start (a source on another host)."""


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
    if not opts.scenarios and not opts.generated:
        raise UsageError("no scenario given")
    if not opts.strategies:
        raise UsageError("no strategy given")
    for name in opts.strategies:
        if name not in STRATEGIES:
            raise UsageError(f"unknown strategy '{name}' (strategies: {', '.join(STRATEGIES)})")
    if ("autotune-warm" in opts.strategies) != (opts.warm_from is not None):
        raise UsageError("strategy autotune-warm and --warm-from go together")
    if opts.warm_from == SIBLING and (opts.scenarios or not opts.generated):
        raise UsageError(f"--warm-from {SIBLING} is for generated hosts only (--generated without --scenario)")
    if (opts.warm_from not in (None, SIBLING) and opts.warm_from not in list_scenarios()
            and not Path(opts.warm_from).is_file()):
        raise UsageError(f"--warm-from: unknown scenario '{opts.warm_from}' (built-in: {', '.join(list_scenarios())}; "
                         f"'{SIBLING}' with --generated)")
    setups = []
    for name in (*opts.scenarios, *family_files(opts.generated)):
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
        sources = _warm_sources(opts, setups)
        for setup in setups:
            for seed in range(opts.seeds):
                for name in opts.strategies:
                    source = sources.get(setup.scenario_name) if name == "autotune-warm" else None
                    tasks.append(StudyTask(setup, name, seed, opts.trials, optima[setup.scenario_name].value,
                                           opts.scratch, warm_from=source, force=opts.force))
        traces: list[StudyTrace] = []
        note(0, len(tasks), "studies")
        for trace in _map(pool, run_study, tasks):
            traces.append(trace)
            note(len(traces), len(tasks), f"{trace.scenario} {trace.strategy} seed {trace.seed}")
    return report(opts, setups, optima, traces, wall_s=time.perf_counter() - started)


def _warm_sources(opts: BenchOptions, setups: Sequence[Setup]) -> dict[str, Setup]:
    """``autotune-warm``'s source of each set-up: ``--warm-from``'s scenario, or with
    :data:`SIBLING` each generated host's sibling (the family's set-ups come last, in seed order)."""
    if opts.warm_from is None:
        return {}
    if opts.warm_from != SIBLING:
        names = {s.scenario_name: opts.warm_from for s in setups}
    else:
        family = setups[len(setups) - len(opts.generated):]
        names = {s.scenario_name: f for s, f in zip(family, family_files(opts.generated, sibling=True))}
    return {k: Setup(v, opts.space, opts.objective, opts.noise, opts.early_stop) for k, v in names.items()}


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


def report(opts: BenchOptions, setups: Sequence[Setup], optima: dict[str, Optimum], traces: Sequence[StudyTrace],
           *, wall_s: float) -> dict[str, Any]:
    """The JSON document of a benchmark: options, per scenario the optimum and each strategy's
    scores, and the issue's goals as measured."""
    scenarios: dict[str, Any] = {}
    family: dict[str, int] = {}
    for setup in setups:
        name = setup.scenario_name
        key = setup.scenario.name if Path(name).is_file() and setup.scenario.name not in scenarios else name
        if opts.generated and setup.scenario.name.startswith("generated-") and Path(name).is_file():
            family[name] = setup.scenario.gpu.count
        opt = optima[name]
        gpus = setup.scenario.gpu.count
        baseline = evaluator(setup).value(setup.space.complete({}))
        per = {s: summarize([t for t in traces if t.scenario == name and t.strategy == s], opts.trials, gpus)
               for s in opts.strategies}
        scenarios[key] = {
            "gpus": gpus, "description": setup.scenario.description,
            "optimum": {"value": opt.value, "metric": setup.objective.metric, "params": opt.params,
                        "method": opt.method, "evaluated": opt.evaluated},
            "baseline_over_optimum": ratio(baseline, opt.value, evaluator(setup).maximize),
            "strategies": per,
            "goals": goals(per, opts),
        }
    doc: dict[str, Any] = {
        "benchmark": "tuner",
        "options": {"scenarios": list(opts.scenarios), "strategies": list(opts.strategies), "space": opts.space,
                    "objective": opts.objective, "trials": opts.trials, "seeds": opts.seeds, "jobs": opts.jobs,
                    "noise": opts.noise, "scratch": opts.scratch or default_scratch(),
                    "optimum_points": opts.optimum_points, "early_stop": opts.early_stop,
                    "generated": list(opts.generated)},
        "scenarios": scenarios,
    }
    if family:
        per = summarize_family(traces, opts.strategies, opts.trials, family)
        doc["family"] = {"seeds": list(opts.generated), "halves": halves(opts.generated), "hosts": len(family),
                         "strategies": per, "goals": goals(per, opts)}
    doc["wall_s"] = round(wall_s, 1)
    return doc


def goals(per: dict[str, Any], opts: BenchOptions) -> dict[str, Any]:
    """The issue's goals for ``autotune`` on one scenario, as measured: each ``{"met": true |
    false | null, "detail": ...}`` (null: not measurable from this run)."""
    out: dict[str, Any] = {}
    mine = per.get("autotune")
    if mine is None:
        return out
    out["trials_to_95_vs_random"] = _vs("trials_to", ("autotune", mine), ("random", per.get("random")), 1 / 3)
    out["gpu_hours_to_95_vs_tpe_naive"] = _vs("gpu_hours_to", ("autotune", mine), ("tpe-naive", per.get("tpe-naive")),
                                             1 / 2)
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
    if "autotune-warm" in per:
        out.update(warm_goals(mine, per["autotune-warm"], forced=opts.force))
    own = mine["driver_ms_per_trial_last_tenth"]["median"]
    real = mine["trial_s"]["median"]
    if opts.trials < 200 or own is None or real is None:
        out["tuner_time_at_200"] = {"met": None, "detail": "needs --trials 200 or more"}
    else:
        out["tuner_time_at_200"] = {"met": own / 1000 < 0.01 * real,
                                    "detail": f"{own:.0f} ms per trial over the last tenth vs 1% of a median "
                                              f"trial's {real:.0f} s"}
    return out


def warm_goals(cold: dict[str, Any], warm: dict[str, Any], *, forced: bool) -> dict[str, Any]:
    """The warm start's goals: trials and GPU-hours to 95% and the infeasible share after the
    :data:`~autotune.bench.scores.WARM_AFTER`-th trial at most half a cold start's (a source on
    the same host), or no worse (``forced``: a source on another host)."""
    factor, goal = (1.0, "no worse") if forced else (0.5, "at most half")
    out = {f"warm_{key}_95": _vs(key, ("autotune-warm", warm), ("autotune", cold), factor)
           for key in ("trials_to", "gpu_hours_to")}
    key = f"infeasible_share_after_{WARM_AFTER}"
    a, b = warm[key]["median"], cold[key]["median"]
    out[f"warm_infeasible_after_{WARM_AFTER}"] = {
        "met": None if a is None or b is None else a <= b * factor,
        "detail": "no trial after the 5th" if a is None or b is None else
        f"median {a:.1%} warm vs {b:.1%} cold (goal: {goal})"}
    return out


def _vs(key: str, mine: tuple[str, dict[str, Any]], other: tuple[str, dict[str, Any] | None],
        factor: float) -> dict[str, Any]:
    """Whether the median ``key`` (trials or GPU-hours) to 95% of ``mine`` (name, summary) is at
    most ``factor`` times ``other``'s (None: not run)."""
    (name, summary), (other_name, theirs) = mine, other
    if theirs is None:
        return {"met": None, "detail": f"{other_name} not run"}
    a, b = summary[key]["95"]["median"], theirs[key]["95"]["median"]
    if a is None and b is None:
        return {"met": None, "detail": f"neither {name}'s nor {other_name}'s median run reached 95%"}
    if a is None:
        return {"met": False, "detail": f"{name}'s median run never reached 95% (vs {other_name}: {_num(b)})"}
    if b is None:
        # a run that never reached needed more than it spent: the median is at least the
        # median with those runs counted at what they spent
        bound = theirs[key]["95"].get("at_least")
        said = f"{_num(a)} vs {other_name} never reaching 95% in its median run (so more than {_num(bound)})"
        if bound is not None and a <= bound * factor:
            return {"met": True, "detail": f"{said}, ratio under {a / bound:.2f}, goal <= {factor:.2f}"}
        return {"met": None, "detail": f"{said}: a longer {other_name} run would decide"}
    return {"met": a <= b * factor,
            "detail": f"{_num(a)} vs {other_name} {_num(b)} (ratio {a / b:.2f}, goal <= {factor:.2f})"}


def _num(x: float | None) -> str:
    return "never" if x is None else f"{x:.3g}"
