"""Confirmation (autotune.study.confirmation) and the best chosen on means (study_view.best_view): the
plan alone, then whole studies with the real Driver on SQLite and the model executor, whose
repeats draw fresh noise as a real server's would."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from optuna.distributions import FloatDistribution
from optuna.trial import create_trial

from autotune.bench.setups import Setup
from autotune.study.confirmation import next_run, reserve
from autotune.study.driver import Driver
from autotune.bench.model_executor import ModelExecutor
from autotune.util.stats import t95
from autotune.store.study_view import Measured, best_json, best_view, measured_configs, trial_views
from autotune.store.record import TrialRecord


def _m(x: float, *values: float) -> Measured:
    return Measured({"x": x}, tuple(values), tuple(range(len(values))))


def test_reserve_is_a_fifth_of_a_budget_of_ten_or_more() -> None:
    assert [reserve(n) for n in (None, 9, 10, 40, 60)] == [0, 0, 2, 8, 12]


def test_confirmation_waits_for_the_end_then_measures_the_best_short_candidate() -> None:
    configs = [_m(1, 100.0), _m(2, 98.0), _m(3, 97.0, 96.0, 98.0), _m(4, 50.0)]
    kw = dict(spent=0, reserve_runs=8, candidates=3, measurements=3, maximize=True)
    assert next_run(configs, left=6, **kw) is None  # 2 + 2 runs needed, 6 trials left: search on
    assert next_run(configs, left=4, **kw) == configs[0]
    # a run of the best already in flight counts: the next short one is the second
    assert next_run(configs, left=2, pending=[{"x": 1}, {"x": 1}], **kw) == configs[1]
    assert next_run(configs, left=4, **{**kw, "spent": 8}) is None  # the reserve is spent
    assert next_run(configs, left=4, **{**kw, "candidates": 0}) is None
    assert next_run(configs, left=1, **{**kw, "maximize": False}) == configs[3]  # minimize: the lowest


def test_the_best_is_chosen_on_the_runs_that_confirmed_it() -> None:
    """A configuration measured again is figured by the mean of its runs after the first: the
    first is the run that made it a candidate, and the top of many single runs reads high."""
    study = optuna.create_study(direction="maximize")
    dist = {"x": FloatDistribution(0, 1)}

    def add(x: float, value: float) -> None:
        study.add_trial(create_trial(params={"x": x}, distributions=dist, value=value,
                                     user_attrs={"outcome": "ok", "feasible": True, "applied": {"x": x}}))

    add(0.1, 1000.0)
    add(0.2, 990.0)
    best = best_view(study)
    assert best is not None and best.number == 0 and best.measured is not None and best.measured.count == 1
    assert best.value == 1000.0 and not best.measured.first_excluded and best_json(best)["measurements"]["excluded"] is None
    add(0.1, 960.0)  # measured again: the first was lucky
    add(0.2, 994.0)
    add(0.2, 986.0)
    best = best_view(study)
    # 0.2: (994 + 986) / 2 = 990 beats 0.1's 960; the mean of all three (990) would give the same
    # number here, but 0.1's mean of all would be 980, not 960
    assert best is not None and best.number == 1 and best.value == pytest.approx(990.0)
    doc = best_json(best)
    m = doc["measurements"]
    assert m["count"] == 2 and m["trials"] == [3, 4] and m["values"] == [994.0, 986.0]
    assert m["excluded"] == {"trial": 1, "value": 990.0}
    lo, hi = m["interval95"]
    assert lo < 990.0 < hi
    assert [m.count for m in measured_configs(trial_views(study))] == [2, 3]
    assert [m.mean for m in measured_configs(trial_views(study))] == [960.0, 990.0]


def test_a_single_run_within_the_noise_does_not_displace_a_confirmed_configuration() -> None:
    """The winner's curse again, across configurations: 0.1 was confirmed at 645 (runs 700, then
    640 and 650: 4.9% run-to-run noise pooled); 0.2, measured once at 680, is 5.4% above it,
    within two standard deviations of the noise, so the confirmed 0.1 stays the best. At 760
    (17.8% above) the single run is more than luck can give, and it is the best."""
    def study_with(single: float) -> optuna.Study:
        study = optuna.create_study(direction="maximize")
        dist = {"x": FloatDistribution(0, 1)}
        for x, value in ((0.1, 700.0), (0.2, single), (0.1, 640.0), (0.1, 650.0)):
            study.add_trial(create_trial(params={"x": x}, distributions=dist, value=value,
                                         user_attrs={"outcome": "ok", "feasible": True, "applied": {"x": x}}))
        return study

    within = best_view(study_with(680.0))
    assert within is not None and within.number == 0 and within.value == pytest.approx(645.0)
    assert within.measured is not None and within.measured.noise is not None
    assert within.measured.noise.sd == pytest.approx(0.0485, abs=5e-4)
    beyond = best_view(study_with(760.0))
    assert beyond is not None and beyond.number == 1 and beyond.value == 760.0
    # minimising (latency): the same rule the other way
    low = optuna.create_study(direction="minimize")
    dist = {"x": FloatDistribution(0, 1)}
    for x, value in ((0.1, 100.0), (0.2, 99.5), (0.1, 104.0), (0.1, 102.0)):  # 3.4% below: within 2 x 2%
        low.add_trial(create_trial(params={"x": x}, distributions=dist, value=value,
                                   user_attrs={"outcome": "ok", "feasible": True, "applied": {"x": x}}))
    lowest = best_view(low)
    assert lowest is not None and lowest.number == 0 and lowest.value == pytest.approx(103.0)


def test_the_first_run_is_left_out_however_it_read() -> None:
    """Leaving the first run out is a rule, not a guess at which run was lucky: a first run that
    read low is left out too (the figure is then higher than the mean of all)."""
    low = Measured({"x": 1}, (900.0, 1000.0, 1010.0), (3, 8, 9))
    assert low.mean == pytest.approx(1005.0) and low.backing == (1000.0, 1010.0) and low.backing_trials == (8, 9)
    assert low.to_json()["count"] == 2 == len(low.to_json()["values"]) and low.to_json()["excluded"]["trial"] == 3
    once = Measured({"x": 1}, (900.0,), (3,))
    assert once.mean == 900.0 and once.interval95 is None and once.to_json()["count"] == 1


def _study(tmp_path: Path, trials: int, seed: int = 2, **confirm: int) -> optuna.Study:
    setup = Setup("rtx6000-pcie-glm5", "sglang_nccl", "quick", None)
    cfg = setup.config(name="confirm", storage=f"sqlite:///{tmp_path}/c.db", sampler="tpe", seed=seed, trials=trials)
    if confirm:
        cfg = cfg.model_copy(update={"budget": cfg.budget.model_copy(update={
            "confirm": cfg.budget.confirm.model_copy(update=confirm)})})
    ex = ModelExecutor.for_target(cfg, setup.objective, seed=seed)
    return Driver(cfg, setup.space, setup.objective, ex, trials=trials).run().study


def test_a_study_ends_by_measuring_its_best_configurations_again(tmp_path: Path) -> None:
    study = _study(tmp_path, 15)  # a reserve of 3 runs
    trials = sorted(study.get_trials(), key=lambda t: t.number)
    assert len(trials) == 15
    again = [t for t in trials if "confirms" in t.user_attrs]
    assert [t.number for t in again] == [12, 13, 14]  # the budget's last trials
    for t in again:
        first = study.trials[t.user_attrs["confirms"]]
        assert t.user_attrs["applied"] == first.user_attrs["applied"]
    values = [t.value for t in trials if t.user_attrs["applied"] == again[0].user_attrs["applied"] and t.value]
    assert len(set(values)) == len(values) >= 2  # each repeat measured with fresh noise
    best = best_view(study)
    assert best is not None and best.measured is not None and best.measured.count >= 2
    later = best.measured.values[1:]
    assert best.value == pytest.approx(sum(later) / len(later))


def test_study_best_reports_how_many_measurements_back_the_figure(tmp_path: Path) -> None:
    _study(tmp_path, 10)
    run = [sys.executable, "-m", "autotune", "study", "best", "confirm", "--storage", f"sqlite:///{tmp_path}/c.db"]
    doc = json.loads(subprocess.run([*run, "--json"], capture_output=True, text=True, check=True).stdout)
    m = doc["measurements"]
    assert m["count"] >= 1 and len(m["trials"]) == m["count"] == len(m["values"]) and doc["value"] == pytest.approx(m["mean"])
    assert m["excluded"]["trial"] == doc["number"] and doc["number"] not in m["trials"]
    assert doc["metrics"]["output_throughput"] == pytest.approx(doc["value"], rel=1e-6)  # the same runs' metrics
    text = subprocess.run(run, capture_output=True, text=True, check=True).stdout
    first = f"its first run (trial {m['excluded']['trial']}: "
    if m["count"] >= 2:
        assert f"mean of {m['count']} measurements after the first" in text and "95% interval" in text and first in text
    else:
        assert "1 measurement after the first" in text and first in text


def test_confirmation_can_be_turned_off(tmp_path: Path) -> None:
    study = _study(tmp_path, 10, candidates=0)
    assert not [t for t in study.get_trials() if "confirms" in t.user_attrs]


def test_the_interval_pools_the_noise_of_every_configuration_measured_again() -> None:
    """Two runs after the first give a t-interval with one degree of freedom (12.7 times their
    spread); the study's other confirmed configurations tell the noise too: the relative
    deviations of every run of each configuration measured again, its first included, are pooled,
    and the interval uses the pool's degrees of freedom. The figure is still the mean of the runs
    after the first."""
    views = []
    rows = [({"x": 1}, 1000.0), ({"x": 2}, 990.0), ({"x": 1}, 960.0), ({"x": 1}, 980.0), ({"x": 2}, 1010.0),
            ({"x": 2}, 970.0), ({"x": 3}, 900.0), ({"x": 3}, 905.0)]
    for number, (params, value) in enumerate(rows):
        views.append(TrialRecord(number, "COMPLETE", "ok", params, value, {}, None, None))
    one, two, three = measured_configs(views)
    assert one.noise is not None and one.noise == two.noise == three.noise
    assert (one.mean, two.mean, three.mean) == (970.0, 990.0, 905.0)  # the runs after the first
    # x=1: 1000, 960, 980 around 980; x=2: 990, 1010, 970 around 990; x=3: 900, 905 around 902.5
    squares = ((20 / 980) ** 2 + (20 / 980) ** 2 + 0.0) + ((20 / 990) ** 2 * 2 + 0.0) + (2.5 / 902.5) ** 2 * 2
    assert (one.noise.df, one.noise.configs) == (5, 3) and one.noise.sd == pytest.approx(math.sqrt(squares / 5))
    lo, hi = two.interval95  # type: ignore[misc]
    assert (hi - lo) / 2 == pytest.approx(t95(5) * one.noise.sd * 990 / math.sqrt(2))
    assert (hi - lo) / 2 < t95(1) * 20  # narrower than its own runs' t-interval (sd 28.3 over sqrt 2)
    # one run after the first: an interval from the pool, not none
    lo3, hi3 = three.interval95  # type: ignore[misc]
    assert lo3 < 905.0 < hi3 and three.to_json()["noise"] == {"relative_sd": one.noise.sd, "df": 5, "configs": 3}
    # one configuration measured again: its three runs are the pool (2 degrees of freedom, where
    # its two runs after the first alone have 1)
    alone = measured_configs(views[:4])
    sd = math.sqrt(2 * (20 / 980) ** 2 / 2)
    assert alone[0].noise is not None and (alone[0].noise.df, alone[0].noise.sd) == (2, pytest.approx(sd))
    assert alone[0].interval95 == pytest.approx((970 - t95(2) * sd * 970 / math.sqrt(2),
                                                 970 + t95(2) * sd * 970 / math.sqrt(2)))
    assert alone[1].interval95 is None  # measured once: no interval


def test_export_and_study_best_choose_the_same_configuration(tmp_path: Path) -> None:
    """The profile is the configuration `study best` reports, not the trial with the luckiest run:
    a configuration whose first run read 700 and whose two confirmation runs read 640 and 650
    loses to one measured once at 760, further above its 645 than the noise (4.9% pooled) can
    make a single run read."""
    storage = f"sqlite:///{tmp_path}/b.db"
    study = optuna.create_study(study_name="b", storage=storage, direction="maximize")
    study.set_user_attr("objective", {"metric": "output_throughput", "direction": "maximize"})
    study.set_user_attr("config", {"name": "b", "target": {"engine": "sim"}})
    dist = {"x": FloatDistribution(0, 1)}
    for x, value in ((0.1, 700.0), (0.2, 760.0), (0.1, 640.0), (0.1, 650.0)):
        tmpl = [sys.executable, "-m", "autotune.sim", "serve", "--port", "{port}", "--x", str(x)]
        study.add_trial(create_trial(params={"x": x}, distributions=dist, value=value, user_attrs={
            "outcome": "ok", "feasible": True, "applied": {"x": x}, "argv_template": tmpl, "host": "local",
            "metrics": {"output_throughput": value}}))
    run = [sys.executable, "-m", "autotune"]
    best = json.loads(subprocess.run([*run, "study", "best", "b", "--storage", storage, "--json"],
                                     capture_output=True, text=True, check=True).stdout)
    assert best["number"] == 1 and best["value"] == 760.0
    prof = json.loads(subprocess.run([*run, "export", "b", "--storage", storage, "--format", "json"],
                                     capture_output=True, text=True, check=True).stdout)
    assert prof["trial"] == 1 and prof["value"] == 760.0 and prof["params"] == {"x": 0.2}
