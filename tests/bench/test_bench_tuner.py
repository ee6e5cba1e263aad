"""`autotune bench tuner`: the model executor answers as the model and the runner would, the
strategies configure the real driver as documented, and the report's numbers hold together.

Everything runs the real Driver on real SQLite storages against the real model, at small sizes
(one scenario, 12 trials, 2 seeds). No wall-clock assertions.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial

from autotune.store.record import read
from autotune.bench.scores import summarize
from autotune.bench.setups import BENCH_ENV, Setup
from autotune.bench.study_trace import StudyTask, StudyTrace, _Clock, _trace, run_study, scratch_dir
from autotune.bench.tuner import BenchOptions, goals, warm_goals
from autotune.search.factory import make_sampler
from autotune.study.driver import Driver
from autotune.errors import UsageError
from autotune.bench.model_executor import ModelExecutor, model_workload
from autotune.config.objective import EarlyStopSpec, Objective
from autotune.execution.trial import TrialSpec
from autotune.sim.args import parse_server_args
from autotune.sim.model import Workload, predict
from autotune.sim.scenario import load_scenario
from autotune.bench.strategies import GRID, CrashBlindTPESampler, strategy
from autotune.store.study_view import best_view

GLM = "rtx6000-pcie-glm5"
KIMI = "rtx6000-pcie-kimi-eagle3"
QUICK = Workload(concurrency=192, num_prompts=192, input_len=64, output_len=16)  # objectives/quick.yaml
LONG = 10_000.0  # a ready timeout no start-up reaches


class _NoLeastLoad(Setup):
    """A set-up whose objective may stop a load from its first progress report."""

    @property
    def objective(self) -> Objective:
        return dataclasses.replace(super().objective, stop_after=EarlyStopSpec(min_requests=0, min_seconds=0))


def _setup(scenario: str = GLM) -> Setup:
    return Setup(scenario, "sglang_nccl", "quick", None)


def _spec(setup: Setup, number: int = 0, timeout: float | None = LONG, **values: object) -> TrialSpec:
    launch = setup.space.to_launch(setup.space.complete(dict(values)))
    return TrialSpec(number, env=launch.env, args=launch.args, ready_timeout_s=timeout)


def _predict(scenario: str, spec: TrialSpec, seed: int | None):  # type: ignore[no-untyped-def]
    _, args = parse_server_args(["--scenario", scenario, *spec.args])
    return predict(load_scenario(scenario), args, {**BENCH_ENV, **spec.env}, QUICK, seed=seed)


# -- the model executor ----------------------------------------------------------------------------
@pytest.mark.parametrize("scenario, values, outcome", [
    (GLM, {}, "ok"),
    (GLM, {"NCCL_ALGO": "Tree"}, "nccl-error"),  # the GLM-5 host's planted Tree crash
    (KIMI, {}, "oom"),  # 0.85 of memory does not fit the draft model's graphs
])
def test_results_agree_with_predict_and_cost_what_the_trial_takes(scenario: str, values: dict, outcome: str) -> None:
    setup = _setup(scenario)
    assert model_workload(setup.objective) == QUICK
    ex = setup.executor(7)
    spec = _spec(setup, 3, **values)
    p = _predict(scenario, spec, 7)
    assert p.outcome == outcome
    ex.submit(spec, ex.slots()[0], lambda phase, detail: None)
    assert ex.running() == 1
    [done] = ex.wait(1.0)
    r = done.result
    assert (done.number, ex.running()) == (3, 0)
    assert r.argv[-len(spec.args):] == spec.args and r.env == {**BENCH_ENV, **spec.env}
    if outcome == "ok":
        assert r.outcome == "ok" and r.failure is None
        assert r.metrics["output_throughput"] == p.output_throughput > 0
        assert r.metrics["completed"] == QUICK.num_prompts
        assert r.startup_s == p.startup_s
        assert r.duration_s == pytest.approx(p.startup_s + p.details["duration_s"], abs=1e-3)
    else:
        assert r.outcome == "infeasible" and r.failure is not None
        assert r.failure.kind == outcome and r.failure.message == p.message
        assert r.metrics == {} and r.startup_s is None
        assert r.duration_s == pytest.approx(p.failure_s)
    assert [c.seconds for c in ex.costs] == [r.duration_s] and ex.spent_s == r.duration_s


def test_noise_follows_the_seed_as_the_simulated_server_does() -> None:
    setup = _setup()
    spec = _spec(setup)
    measured = {seed: setup.executor(seed).result(spec).metrics["output_throughput"] for seed in (1, 2, None)}
    assert measured[1] == _predict(GLM, spec, 1).output_throughput
    assert measured[2] == _predict(GLM, spec, 2).output_throughput
    assert measured[None] == _predict(GLM, spec, None).output_throughput
    assert len(set(measured.values())) == 3


def test_a_start_up_slower_than_the_trials_timeout_costs_the_timeout() -> None:
    setup = _setup()
    spec = _spec(setup, timeout=100.0)
    assert _predict(GLM, spec, None).startup_s > 100  # the GLM-5 host takes minutes to start
    r = setup.executor(0).result(spec)
    assert r.outcome == "infeasible" and r.failure is not None and r.failure.kind == "startup-timeout"
    assert r.duration_s == 100.0 and r.startup_s is None


def test_a_stop_request_answers_interrupted_faults() -> None:
    setup = _setup()
    ex = setup.executor(0)
    ex.request_stop("signal")
    r = ex.result(_spec(setup))
    assert r.outcome == "fault" and r.failure is not None and r.failure.kind == "interrupted"


def test_a_clearly_worse_trial_stops_early_and_costs_only_its_time_until_then() -> None:
    setup = _setup()
    # A fresh executor per launch: the executor draws fresh noise for a repeat of a launch, and
    # these compare one launch measured with and without a value to beat.
    best = setup.executor(0).result(_spec(setup)).metrics["output_throughput"]
    worse = _spec(setup, 5, max_running_requests=16)  # a third of the baseline's throughput
    full = setup.executor(0).result(worse)
    ex = setup.executor(0)
    assert full.outcome == "ok" and full.metrics["output_throughput"] < best / 2 and full.early_stop is None
    spec = dataclasses.replace(worse, beat_value=best)
    ex.submit(spec, ex.slots()[0], lambda phase, detail: None)
    [done] = ex.wait(1.0)
    r = done.result
    assert r.outcome == "stopped" and r.failure is None and r.early_stop is not None
    assert r.early_stop.beat == best and r.early_stop.bound < best
    assert r.early_stop.share < 1 and r.metrics["completed"] < QUICK.num_prompts  # its load was cut short
    assert r.startup_s == full.startup_s and r.startup_s < r.duration_s < full.duration_s
    assert r.intermediate and max(r.intermediate) <= 100 * r.early_stop.share
    [cost] = ex.costs
    assert (cost.outcome, cost.seconds, cost.full_seconds) == ("stopped", r.duration_s, full.duration_s)
    # The same trial against a best it would have beaten (by 0.1%) runs to its end, as without one.
    beaten = setup.executor(0).result(dataclasses.replace(worse, beat_value=full.metrics["output_throughput"] * 0.999))
    assert beaten.outcome == "ok" and beaten.metrics == full.metrics and beaten.duration_s == full.duration_s
    # With early stopping off in the objective, nothing stops.
    off = Setup(GLM, "sglang_nccl", "quick", None, early_stop=False).executor(0)
    assert off.result(spec).outcome == "ok"


@pytest.mark.parametrize("scenario, draws", [(GLM, 40), (KIMI, 200)])  # KIMI: most configurations crash
def test_no_configuration_is_stopped_against_a_value_it_beats(scenario: str, draws: int) -> None:
    """The bound holds on the model's own timelines: random configurations of the space, each
    against a value to beat just below its own final value, all run to their end; against twice
    that value, each stops (with no least load: a one-wave load completes its requests together,
    and the objective's least load would keep it from stopping at all)."""
    setup = _NoLeastLoad(scenario, "sglang_nccl", "quick", None)
    probe = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=5))
    measured = 0
    for _ in range(draws):
        launch = setup.space.to_launch(probe.ask(setup.space.distributions()).params)  # rules repaired
        spec = TrialSpec(0, env=launch.env, args=launch.args, ready_timeout_s=LONG)
        full = setup.executor(3).result(spec)  # a fresh executor: each launch its first, same noise
        if full.outcome != "ok":
            continue
        measured += 1
        value = full.metrics["output_throughput"]
        assert setup.executor(3).result(dataclasses.replace(spec, beat_value=value * 0.9999)).outcome == "ok"
        assert setup.executor(3).result(dataclasses.replace(spec, beat_value=value * 2)).outcome == "stopped"
    assert measured >= 5


def _tpe_study(folder: Path, setup: Setup, trials: int, seed: int) -> tuple[optuna.Study, ModelExecutor]:
    """A study of Optuna's own multivariate TPE (as Optuna ships it: the property below is TPE's)."""
    cfg = setup.config(name=f"stops-{setup.early_stop}", storage=f"sqlite:///{folder}/stops-{setup.early_stop}.db",
                       sampler="tpe", seed=seed, trials=trials)
    ex = ModelExecutor.for_target(cfg, setup.objective, seed=seed)
    tpe = lambda seed: optuna.samplers.TPESampler(seed=seed, multivariate=True, n_startup_trials=8)  # noqa: E731
    return Driver(cfg, setup.space, setup.objective, ex, trials=trials, sampler=tpe).run().study, ex


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A folder where the bench puts its SQLite files (/dev/shm when it has room): fast to write."""
    folder = Path(scratch_dir())
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_stopped_trials_are_measured_not_infeasible_and_tpe_runs_the_same_search(scratch: Path) -> None:
    """A trial stopped below the value to beat would have been one of TPE's poor trials measured
    to its end too: with the same seed and noise, TPE proposes the same trials, for less time."""
    full, full_ex = _tpe_study(scratch, Setup(GLM, "sglang_nccl", "quick", None, early_stop=False), 14, seed=5)
    setup = _setup()
    study, ex = _tpe_study(scratch, setup, 14, seed=5)  # TPE has 2 good trials of 14: the value to beat is the 2nd best
    trials = study.get_trials()
    stopped = [t for t in trials if t.user_attrs.get("outcome") == "stopped"]
    assert len(stopped) >= 2 and len(trials) == 14  # stopped trials count against the budget
    assert [t.params for t in trials] == [t.params for t in full.get_trials()]
    best = best_view(study)
    assert best is not None and best.number == best_view(full).number  # type: ignore[union-attr]
    assert study.trials[best.number].user_attrs["outcome"] == "ok"
    assert [c.full_seconds for c in ex.costs] == [c.seconds for c in full_ex.costs]
    assert ex.spent_s < full_ex.spent_s
    costs = {c.number: c for c in ex.costs}
    for t in stopped:
        assert t.state == TrialState.PRUNED and read(t).constraints["failure"] < 0  # TPE: below complete, not infeasible
        assert t.intermediate_values and not t.user_attrs["feasible"]
        assert t.user_attrs["early_stop"]["bound"] < t.user_attrs["early_stop"]["beat"] <= best.value
        assert costs[t.number].seconds < costs[t.number].full_seconds
    # The bench's trace counts them as stopped (not infeasible) and what they saved.
    trace = _trace(StudyTask(setup, "autotune", 5, 14, 1.0), sorted(trials, key=lambda t: t.number), ex, _Clock(ex))
    assert sum(trace.stopped) == len(stopped) and not any(a and b for a, b in zip(trace.stopped, trace.infeasible))
    s = summarize([trace], trials=14, gpus=8)
    assert s["stopped_share"]["median"] == len(stopped) / 14
    assert s["gpu_hours_saved"]["median"] == pytest.approx((full_ex.spent_s - ex.spent_s) * 8 / 3600)


def test_objectives_the_model_cannot_measure_are_refused() -> None:
    with pytest.raises(UsageError, match="SLO"):
        model_workload(Objective.load_file("throughput_slo"))
    with pytest.raises(UsageError, match="p99_ttft_ms"):
        model_workload(Objective.load_file("quick", {"metric": "p99_ttft_ms"}))


# -- strategies on the real driver ----------------------------------------------------------------------
def _study(tmp_path: Path, name: str, seed: int, trials: int = 12) -> optuna.Study:
    setup = _setup()
    strat = strategy(name, setup.space)
    cfg = setup.config(name=f"{name}-{seed}", storage=f"sqlite:///{tmp_path}/{name}-{seed}.db",
                       sampler=strat.config_sampler, seed=seed, trials=trials, confirm=strat.study_features)
    ex = ModelExecutor.for_target(cfg, setup.objective, seed=seed)
    run = Driver(cfg, setup.space, setup.objective, ex, trials=trials, sampler=strat.factory,
                 skip_implied=strat.study_features).run()
    assert len(ex.costs) == trials
    return run.study


def test_grid_visits_grid_points_with_every_other_parameter_at_its_default(tmp_path: Path) -> None:
    setup = _setup()
    defaults = setup.space.complete({})
    orders = []
    for seed in (0, 1):
        trials = sorted(_study(tmp_path, "grid", seed).get_trials(), key=lambda t: t.number)
        assert trials[0].params == defaults and trials[0].user_attrs["baseline"]  # the driver's baseline first
        points = []
        for t in trials[1:]:
            assert {n: v for n, v in t.params.items() if n not in GRID} == {n: v for n, v in defaults.items() if n not in GRID}
            point = tuple(t.params[n] for n in GRID)
            assert all(v in GRID[n] for n, v in zip(GRID, point))
            points.append(point)
        assert len(set(points)) == len(points) == 11  # no point twice while the grid lasts
        orders.append(points)
    assert orders[0] != orders[1]  # the order is the seed's


def test_tpe_naive_records_crashes_like_autotune_but_its_tpe_does_not_see_them(tmp_path: Path) -> None:
    study = _study(tmp_path, "tpe-naive", 3)
    infeasible = [t for t in study.get_trials() if t.user_attrs.get("outcome") == "infeasible"]
    assert infeasible and all(t.state == TrialState.COMPLETE and read(t).constraints["failure"] > 0
                              for t in infeasible)  # as the driver records them
    # What TPE is shown: 5 measured and 5 crashed trials. The driver's TPE counts all 10 towards
    # its 8 random start-up trials and models the study; the crash-blind one sees 5 and stays random.
    probe = optuna.create_study(direction="maximize")
    dist = {"x": FloatDistribution(0.0, 1.0)}
    for i in range(10):
        probe.add_trial(create_trial(params={"x": i / 10}, distributions=dist, state=TrialState.COMPLETE,
                                     value=float(i) if i % 2 else -1.0,
                                     system_attrs={"constraints": [-1.0 if i % 2 else 1.0]},
                                     user_attrs={"outcome": "ok" if i % 2 else "infeasible"}))
    for sampler, modelled in ((make_sampler("tpe", 0), True), (CrashBlindTPESampler(0), False)):
        probe.sampler = sampler
        trial = probe.ask()
        frozen = probe.get_trials(deepcopy=False)[-1]  # the trial just asked
        space = sampler.infer_relative_search_space(probe, frozen)
        assert space == dist
        assert bool(sampler.sample_relative(probe, frozen, space)) is modelled
        probe.tell(trial, state=TrialState.FAIL)


# -- the report --------------------------------------------------------------------------------------------
def test_runs_that_never_reach_count_as_infinite() -> None:
    traces = [StudyTrace(GLM, "s", i, ratio=r, seconds=[3600.0] * 4, infeasible=inf, driver_s=[0.01] * 4)
              for i, (r, inf) in enumerate([([0.5, 0.96, 0.96, 0.99], [True, False, False, False]),
                                            ([0.5, 0.5, 0.5, 0.95], [False] * 4),
                                            ([0.0, 0.0, 0.5, 0.5], [True, True, False, False])])]
    s = summarize(traces, trials=4, gpus=2)
    # at least: the run that never got there counted at its 4 trials + 1, its 8 GPU-hours
    assert s["trials_to"]["95"] == {"q1": 3.0, "median": 4.0, "q3": None, "reached": 2, "at_least": 4.0}
    assert s["gpu_hours_to"]["95"]["median"] == 8.0  # 4 trials of an hour on 2 GPUs
    assert s["trials_to"]["98"]["at_least"] == 5.0 and s["gpu_hours_to"]["98"]["at_least"] == 8.0
    assert s["trials_to"]["98"]["reached"] == 1 and s["trials_to"]["98"]["median"] is None
    assert s["never_90"] == {"within": 4, "runs": 1}
    assert s["infeasible_share"]["median"] == 0.25
    assert "10" not in s["best_over_optimum_after"]  # a checkpoint past the budget is not reported


def test_a_goal_against_a_strategy_that_never_got_there_is_met_only_below_what_it_spent() -> None:
    def runs(ratio: list[float]) -> dict:
        return summarize([StudyTrace(GLM, "s", i, ratio=ratio, seconds=[3600.0] * len(ratio),
                                     infeasible=[False] * len(ratio), driver_s=[0.01] * len(ratio)) for i in range(3)],
                         trials=len(ratio), gpus=2)

    mine = runs([0.5, 0.5, 0.5, 0.96] + [0.96] * 8)  # 95% at trial 4: 8 GPU-hours
    opts = BenchOptions(scenarios=(GLM,), trials=12)
    long, short = runs([0.5] * 12), runs([0.5] * 6)  # never 95%: more than 12 (24 GPU-h) or 6 (12 GPU-h)
    met = goals({"autotune": mine, "random": long, "tpe-naive": long}, opts)
    assert met["trials_to_95_vs_random"]["met"] is True, met  # 4 <= 13 / 3
    assert met["gpu_hours_to_95_vs_tpe_naive"]["met"] is True, met  # 8 <= 24 / 2
    undecided = goals({"autotune": mine, "random": short, "tpe-naive": short}, opts)
    assert undecided["trials_to_95_vs_random"]["met"] is None  # 4 > 7 / 3: a longer run would decide
    assert undecided["gpu_hours_to_95_vs_tpe_naive"]["met"] is None  # 8 > 12 / 2
    assert "more than 7" in undecided["trials_to_95_vs_random"]["detail"]


def test_warm_goals_compare_the_warm_start_with_the_cold_one() -> None:
    def runs(ratio: list[float], infeasible: int = 0) -> dict:
        flags = [i < infeasible for i in range(len(ratio))][::-1]  # the failures come last
        return summarize([StudyTrace(GLM, "s", i, ratio=ratio, seconds=[3600.0] * len(ratio), infeasible=flags,
                                     driver_s=[0.01] * len(ratio)) for i in range(3)], trials=len(ratio), gpus=2)

    cold = runs([0.5] * 7 + [0.96] * 5, infeasible=4)  # 95% at trial 8, 4 of 7 failed after the 5th
    fast, slow = runs([0.5, 0.96] + [0.96] * 10, infeasible=1), runs([0.5] * 9 + [0.96] * 3, infeasible=4)
    met = warm_goals(cold, fast, forced=False)
    assert [met[k]["met"] for k in met] == [True] * 3, met
    missed = warm_goals(cold, slow, forced=False)
    assert [missed[k]["met"] for k in missed] == [False] * 3, missed
    assert warm_goals(cold, cold, forced=True)["warm_trials_to_95"]["met"] is True  # no worse: met
    never = runs([0.5] * 12)
    assert warm_goals(never, never, forced=True)["warm_trials_to_95"]["met"] is None  # neither reached: undecided


def test_a_warm_started_study_measures_its_source_s_best_second(scratch: Path) -> None:
    # autotune-warm from the same scenario: its source is the cold study of the same seed, whose
    # best configuration the warm study measures right after its baseline
    setup = Setup(GLM, "sglang_nccl", "quick", None, True)
    cold = run_study(StudyTask(setup, "autotune", 0, 8, 1.0, str(scratch)))
    warm = run_study(StudyTask(setup, "autotune-warm", 0, 8, 1.0, str(scratch), warm_from=setup))
    assert cold.ratio[-1] > cold.ratio[1], cold.ratio  # the cold study found better than its second trial
    assert warm.ratio[1] == pytest.approx(cold.ratio[-1]), (cold.ratio, warm.ratio)


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "autotune", "bench", "tuner", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300)


def test_json_report_has_the_documented_keys_and_consistent_numbers(tmp_path: Path) -> None:
    proc = _cli("--scenario", GLM, "--trials", "12", "--seeds", "2", "--strategies", "autotune,random", "--jobs", "1",
                "--optimum-points", "300", "--scratch", str(tmp_path), "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["options"]["trials"] == 12 and doc["options"]["seeds"] == 2
    sc = doc["scenarios"][GLM]
    assert sc["gpus"] == 8 and sc["optimum"]["value"] > 0 and sc["optimum"]["metric"] == "output_throughput"
    assert set(sc["optimum"]["params"]) == set(_setup().space.parameters)
    assert 0 < sc["baseline_over_optimum"] <= 1.0
    assert set(sc["strategies"]) == {"autotune", "random"}
    for s in sc["strategies"].values():
        assert s["runs"] == 2
        assert set(s["best_over_optimum_after"]) == {"10"}
        for q in (*s["best_over_optimum_after"].values(), s["best_over_optimum_final"]):
            assert 0 < q["q1"] <= q["median"] <= q["q3"] <= 1.05
        assert s["best_over_optimum_after"]["10"]["median"] <= s["best_over_optimum_final"]["median"]
        assert s["best_over_optimum_final"]["q3"] <= s["best_over_optimum_max"] <= 1.05
        for key in ("trials_to", "gpu_hours_to"):
            assert set(s[key]) == {"90", "95", "98"}
            reached = [s[key][k]["reached"] for k in ("90", "95", "98")]
            assert reached == sorted(reached, reverse=True) and 0 <= reached[0] <= 2
        for k in ("90", "95", "98"):
            t = s["trials_to"][k]["median"]
            assert t is None or 1 <= t <= 12
        assert 0 <= s["infeasible_share"]["median"] <= 1 and 0 <= s["infeasible_share_after_10"]["median"] <= 1
        assert s["never_90"]["within"] == 12 and s["never_90"]["runs"] == 2 - s["trials_to"]["90"]["reached"]
        assert s["gpu_hours_total"]["median"] > 0 and s["driver_ms_per_trial"]["median"] > 0
    assert set(sc["goals"]) >= {"trials_to_95_vs_random", "gpu_hours_to_95_vs_tpe_naive", "never_90_within_40",
                                "infeasible_after_10", "tuner_time_at_200"}
    assert sc["goals"]["gpu_hours_to_95_vs_tpe_naive"]["met"] is None  # tpe-naive was not run
    assert list(tmp_path.iterdir()) == []  # the studies' storages are removed


@pytest.mark.parametrize("args, fragment", [
    (["--trials", "0"], "--trials must be at least 1"),
    (["--seeds", "0"], "--seeds must be at least 1"),
    (["--strategies", "autotune,bayes"], "unknown strategy 'bayes'"),
    (["--scenario", "no-such-host"], "unknown scenario 'no-such-host'"),
    (["--noise", "0.7"], "--noise must be in [0, 0.5)"),
    (["--objective", "throughput_slo"], "SLO"),
    (["--space", "nccl_only", "--strategies", "grid"], "strategy grid"),
    (["--strategies", "autotune-warm"], "autotune-warm and --warm-from go together"),
    (["--strategies", "autotune,autotune-warm", "--warm-from", "nowhere"], "--warm-from: unknown scenario 'nowhere'"),
    (["--strategies", "autotune,autotune-warm", "--warm-from", "sibling"], "--warm-from sibling is for generated hosts"),
])
def test_bad_input_exits_2_with_one_line(tmp_path: Path, args: list[str], fragment: str) -> None:
    proc = _cli("--scenario", GLM, *args, cwd=tmp_path) if "--scenario" not in args else _cli(*args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("autotune: error:") and fragment in lines[0], proc.stderr
    assert proc.stdout == ""


def test_quantiles_of_a_single_run_are_that_run() -> None:
    trace = StudyTrace(GLM, "s", 0, ratio=[0.2, 0.91], seconds=[10.0, 20.0], infeasible=[False, False], driver_s=[0.1, 0.1])
    s = summarize([trace], trials=2, gpus=8)
    assert s["trials_to"]["90"] == {"q1": 2.0, "median": 2.0, "q3": 2.0, "reached": 1, "at_least": 2.0}
    assert s["gpu_hours_to"]["90"]["median"] == pytest.approx(30.0 * 8 / 3600)
    assert math.isclose(s["best_over_optimum_final"]["median"], 0.91)
