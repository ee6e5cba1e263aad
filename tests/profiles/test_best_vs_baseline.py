"""The report opens with the best against the baseline on every metric: read from the page that a
real headless Chromium rendered, and compared with ``autotune study best --json``.

The study is stored in a real SQLite storage as the driver records trials (every metric the load
generator reports); the report and ``study best`` are the real command line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import FloatDistribution, IntDistribution
from optuna.trial import TrialState, create_trial
from tests.helpers.browser import browse, chromium
from tests.helpers.cli import autotune

from autotune.util.stats import mean_interval
from autotune.util.versus import higher_is_better, versus_text

DISTS = {"max_running_requests": IntDistribution(16, 256), "mem_fraction_static": FloatDistribution(0.5, 0.95)}
TABLE = """JSON.stringify({
  headers: [...document.querySelectorAll('#best-vs-baseline thead th')].map(c => c.innerText),
  rows: [...document.querySelectorAll('#best-vs-baseline tbody tr')].map(r => [...r.cells].map(c => c.innerText))})"""


def _metrics(throughput: float, latency: float) -> dict[str, float]:
    """What the load generator records for one run: rates, and latencies that grow with the load."""
    out: dict[str, float] = {"completed": 64, "output_throughput": throughput, "total_throughput": 5 * throughput,
                             "request_throughput": throughput / 16, "duration_s": 64 * 16 / throughput}
    for i, what in enumerate(("ttft", "tpot", "itl", "e2e_latency")):
        scale = latency * (i + 1)
        out.update({f"mean_{what}_ms": scale, f"median_{what}_ms": 0.9 * scale, f"p99_{what}_ms": 2.1 * scale})
    return out


def _trial(n: int, params: dict[str, Any], throughput: float, latency: float, direction: str) -> optuna.trial.FrozenTrial:
    metrics = _metrics(throughput, latency)
    value = metrics["output_throughput" if direction == "maximize" else "mean_ttft_ms"]
    attrs = {"outcome": "ok", "feasible": True, "failure_kind": None, "metrics": metrics, "applied": params,
             "env": {"NCCL_IB_DISABLE": "1"}, "duration_s": 10.0, "baseline": n == 0,
             "argv": ["python", "-m", "autotune.sim", "serve", "--max-running-requests", str(params["max_running_requests"]),
                      "--port", "30000"],
             "argv_template": ["python", "-m", "autotune.sim", "serve", "--max-running-requests",
                               str(params["max_running_requests"]), "--port", "{port}"]}
    return create_trial(state=TrialState.COMPLETE, value=value, params=params, distributions=DISTS, user_attrs=attrs,
                        system_attrs={"constraints:failure": -1.0})


def latency_study(storage: str, name: str, direction: str) -> optuna.Study:
    """Trial 0 the baseline; the best configuration (256 requests) measured three times, more
    throughput at a higher latency than the baseline; the rest below it."""
    study = optuna.create_study(storage=storage, study_name=name, direction=direction)
    metric = "output_throughput" if direction == "maximize" else "mean_ttft_ms"
    study.set_user_attr("objective", {"name": "quick", "metric": metric, "direction": direction})
    study.set_user_attr("config", {"target": {"engine": "sim"}})
    runs = [(128, 0.90, 600.0, 100.0), (64, 0.90, 450.0, 80.0), (256, 0.85, 800.0, 130.0), (32, 0.80, 300.0, 60.0),
            (256, 0.85, 780.0, 128.0), (256, 0.85, 770.0, 135.0), (96, 0.88, 500.0, 90.0)]
    for n, (mrr, mfs, tput, lat) in enumerate(runs):
        study.add_trial(_trial(n, {"max_running_requests": mrr, "mem_fraction_static": mfs}, tput, lat, direction))
    return study


def _figure(x: float) -> str:
    return f"{x:.4g}"


def test_the_report_opens_with_the_best_against_the_baseline_as_study_best_has_it(tmp_path: Path) -> None:
    chromium()
    storage = f"sqlite:///{tmp_path}/studies.db"
    latency_study(storage, "tput", "maximize")
    best = json.loads(autotune("study", "best", "tput", "--storage", storage, "--json", cwd=tmp_path).stdout)
    shown = json.loads(autotune("study", "show", "tput", "--storage", storage, "--json", cwd=tmp_path).stdout)
    out = tmp_path / "report.html"
    autotune("report", "tput", "--storage", storage, "-o", str(out), cwd=tmp_path)
    page = out.read_text()
    assert page.index("What to launch") < page.index("Optimization history")  # it opens the report
    got = json.loads(browse(out.as_uri(), "document.readyState === 'complete'", evaluate=TABLE).value)

    assert got["headers"] == ["metric", "unit", f"best (trial {best['number']})", "95% interval",
                              "baseline (trial 0)", "vs baseline"]
    rows = {r[0]: r for r in got["rows"]}
    numeric = {k for k, v in best["metrics"].items() if isinstance(v, (int, float))}
    assert set(rows) == numeric  # every recorded metric, each once
    assert [r[0] for r in got["rows"]][:6] == ["output_throughput", "total_throughput", "request_throughput",
                                               "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms"]
    baseline = next(t for t in shown["trials"] if t["baseline"])["metrics"]
    runs = [t["metrics"] for t in shown["trials"] if t["number"] in best["measurements"]["trials"]]
    assert len(runs) == 2 and best["measurements"]["excluded"] is not None  # the first run left out
    for name in numeric:
        metric, unit, value, interval, base, change = rows[name]
        assert value == _figure(best["metrics"][name]), name
        assert base == _figure(baseline[name]), name
        if name == "output_throughput":  # the objective: `study best`'s own interval
            lo, hi = best["measurements"]["interval95"]
            assert unit == "tok/s"
        else:  # another metric: the t-interval of the same runs
            lo, hi = mean_interval([r[name] for r in runs])[2]  # type: ignore[misc]
        assert interval == f"{_figure(lo)} .. {_figure(hi)}", name
        assert change == versus_text(best["metrics"][name], baseline[name], higher_is_better(name) if name !=
                                     "output_throughput" else True), name
    # more throughput at a higher latency: the latencies read "worse", never as a gain
    assert rows["output_throughput"][5].endswith("better") and rows["output_throughput"][5].startswith("+")
    assert rows["p99_ttft_ms"][1] == "ms" and rows["p99_ttft_ms"][5].startswith("+")
    assert rows["p99_ttft_ms"][5].endswith("worse")


def test_a_minimize_study_reads_a_lower_latency_as_better_and_a_higher_one_as_worse(tmp_path: Path) -> None:
    from autotune.profiles.best_vs_baseline import compare
    from autotune.store.study_view import best_view, trial_views

    storage = f"sqlite:///{tmp_path}/studies.db"
    study = latency_study(storage, "ttft", "minimize")
    best = best_view(study)
    assert best is not None and best.params["max_running_requests"] == 32  # the lowest TTFT
    doc = compare(trial_views(study), best, {"mean_ttft_ms": "minimize"})
    rows = {r["metric"]: r for r in doc["rows"]}
    assert [r["metric"] for r in doc["rows"]][0] == "mean_ttft_ms"  # the objective first
    assert rows["mean_ttft_ms"]["change"] == "-40% better"  # 60 ms against the baseline's 100 ms
    assert rows["output_throughput"]["change"] == "-50% worse"  # 300 tok/s against 600
    assert doc["changed"] == {"max_running_requests": 32, "mem_fraction_static": 0.80} and doc["note"] == ""


def test_versus_text_never_reads_a_loss_as_a_gain() -> None:
    assert versus_text(105.0, 100.0, False) == "+5.0% worse"  # a higher latency
    assert versus_text(123.0, 100.0, False) == "+23% worse"
    assert versus_text(81.0, 100.0, False) == "-19% better"
    assert versus_text(123.0, 100.0, True) == "+23% better"
    assert versus_text(95.0, 100.0, True) == "-5.0% worse"
    assert versus_text(100.01, 100.0, True) == "same"
    assert versus_text(3.0, 2.0, None) == "+50%"  # no direction known: no verdict
    assert versus_text(1.0, 0.0, True) == versus_text(None, 1.0, True) == versus_text(1.0, float("nan"), True) == ""
    assert [higher_is_better(m) for m in ("output_throughput", "request_throughput", "p99_itl_ms", "duration_s",
                                          "completed")] == [True, True, False, False, None]
