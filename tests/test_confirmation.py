"""Confirmation (autotune.confirmation) and the best chosen on means (study_view.best_view): the
plan alone, then whole studies with the real Driver on SQLite and the model executor, whose
repeats draw fresh noise as a real server's would."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from optuna.distributions import FloatDistribution
from optuna.trial import create_trial

from autotune.bench_tuner import Setup
from autotune.confirmation import next_run, reserve
from autotune.driver import Driver
from autotune.model_executor import ModelExecutor
from autotune.study_view import Measured, best_json, best_view, measured_configs, trial_views


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


def test_the_best_is_chosen_on_the_mean_of_its_measurements() -> None:
    study = optuna.create_study(direction="maximize")
    dist = {"x": FloatDistribution(0, 1)}

    def add(x: float, value: float) -> None:
        study.add_trial(create_trial(params={"x": x}, distributions=dist, value=value,
                                     user_attrs={"outcome": "ok", "feasible": True, "applied": {"x": x}}))

    add(0.1, 1000.0)
    add(0.2, 990.0)
    best = best_view(study)
    assert best is not None and best.number == 0 and best.measured is not None and best.measured.count == 1
    add(0.1, 960.0)  # measured again: the first was lucky
    add(0.2, 994.0)
    best = best_view(study)
    assert best is not None and best.number == 1 and best.value == pytest.approx(992.0)
    doc = best_json(best)
    assert doc["measurements"]["count"] == 2 and doc["measurements"]["trials"] == [1, 3]
    lo, hi = doc["measurements"]["interval95"]
    assert lo < 992.0 < hi
    assert [m.count for m in measured_configs(trial_views(study))] == [2, 2]


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
    assert best.value == pytest.approx(sum(best.measured.values) / best.measured.count)


def test_study_best_reports_how_many_measurements_back_the_figure(tmp_path: Path) -> None:
    _study(tmp_path, 10)
    run = [sys.executable, "-m", "autotune", "study", "best", "confirm", "--storage", f"sqlite:///{tmp_path}/c.db"]
    doc = json.loads(subprocess.run([*run, "--json"], capture_output=True, text=True, check=True).stdout)
    m = doc["measurements"]
    assert m["count"] >= 2 and len(m["trials"]) == m["count"] and doc["value"] == pytest.approx(m["mean"])
    text = subprocess.run(run, capture_output=True, text=True, check=True).stdout
    assert f"mean of {m['count']} measurements" in text and "95% interval" in text


def test_confirmation_can_be_turned_off(tmp_path: Path) -> None:
    study = _study(tmp_path, 10, candidates=0)
    assert not [t for t in study.get_trials() if "confirms" in t.user_attrs]
