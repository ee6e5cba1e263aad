"""``autotune report``: one self-contained HTML page, checked in a real headless Chromium.

A real study (the demo on the simulated host) is reported through the CLI; a study with
everything in it (crashes, importances with intervals, an ablation, hostile text) is reported
through :func:`autotune.profiles.report.build_report`. Both pages are rendered by Debian's ``chromium``:
every figure must be drawn (plotly's ``main-svg`` inside each figure's div) and the browser must
log no console error.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

import optuna
from markupsafe import escape
from optuna.distributions import (
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.trial import TrialState, create_trial
from tests.helpers.browser import Loaded, browse, chromium
from tests.helpers.cli import autotune
from tests.helpers.sim_study import RECORDED

FIGURES_DRAWN = """document.readyState === 'complete' &&
  [...document.querySelectorAll('.plotly-graph-div')].every(d => d.querySelector('svg.main-svg'))"""
FIGURE_SVGS = """JSON.stringify(Object.fromEntries([...document.querySelectorAll('.plotly-graph-div')].map(
  d => [d.id, d.querySelectorAll('svg.main-svg').length])))"""


def assert_self_contained(page: str) -> None:
    assert not re.search(r"<script[^>]*\bsrc=", page, re.IGNORECASE), "a script is loaded from elsewhere"
    assert not re.search(r"<link[^>]*\bhref=[\"']?https?:", page, re.IGNORECASE)
    assert page.count("* plotly.js v") == 1, "plotly.js must be embedded exactly once"


def check_in_browser(path: Path) -> Loaded:
    """Open a report: no console error, and plotly drew an SVG in each of its figures."""
    ids = re.findall(r'<div id="(fig-[a-z-]+)" class="plotly-graph-div', path.read_text())
    assert ids, "the page has no figure"
    got = browse(path.as_uri(), FIGURES_DRAWN, evaluate=FIGURE_SVGS)
    assert got.errors == [], "\n".join(got.errors)
    svgs = json.loads(got.value)
    assert list(svgs) == ids and all(n >= 1 for n in svgs.values()), svgs
    assert got.dom.count('class="main-svg"') >= len(ids)
    return got


# -- a real study through the CLI -------------------------------------------------------------


def test_report_of_a_real_study_renders_in_chromium(recorded_study: Path, tmp_path: Path) -> None:
    chromium()
    storage = f"sqlite:///{recorded_study}/studies.db"
    out = tmp_path / "report.html"
    proc = autotune("report", RECORDED, "--storage", storage, "-o", str(out), cwd=tmp_path)
    assert f"wrote {out}" in proc.stderr and out.stat().st_mode & 0o777 == 0o600
    page = out.read_text()
    assert_self_contained(page)
    for section in ("Optimization history", "Parameter importances", "Feasibility map", "Parallel coordinates",
                    "Crash rules", "Ablation", "Best profile"):
        assert f">{section}</h2>" in page, section
    assert f"autotune study ablate {RECORDED}" in page  # no ablation yet
    assert "#!/usr/bin/env bash" in page and "exec " in page  # the best profile, as `export --format sh`
    # ... exactly `autotune export`'s (memory back-off and provenance included), but for the times.
    exported = autotune("export", RECORDED, "--storage", storage, "--format", "sh", cwd=tmp_path).stdout
    shown = html.unescape(re.search(r"<pre class=profile>(.*?)</pre>", page, re.S).group(1))
    stamp = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d"
    assert exported.splitlines()[-1].startswith("# autotune-profile: {")  # the record verify reads: not shown
    assert re.sub(stamp, "T", shown) == re.sub(stamp, "T", "".join(exported.splitlines(keepends=True)[:-1]))
    assert "# memory: mem_fraction_static" in shown and "# engine: sim" in shown
    assert "infeasible: nccl-error" in page and "infeasible: oom" in page  # the feasibility map's traces
    ids = re.findall(r'<div id="(fig-[a-z-]+)" class="plotly-graph-div', page)
    assert ids == ["fig-history", "fig-feasibility", "fig-parallel"], ids  # 3 trials: too few for importances
    got = check_in_browser(out)
    assert f"autotune report: {RECORDED}" in got.text and "not enough trials" in got.text


def test_report_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path}/s.db"
    optuna.create_study(storage=storage, study_name="empty")
    cases = [
        (["report", "nope", "--storage", storage, "-o", str(tmp_path / "r.html")], "no study named 'nope'"),
        (["report", "empty", "--storage", storage, "-o", str(tmp_path / "no" / "r.html")], "does not exist"),
        (["report", "empty", "--storage", storage, "-o", str(tmp_path / "r.html")], "no trials"),
    ]
    for args, expected in cases:
        proc = autotune(*args, cwd=tmp_path, check=False)
        assert proc.returncode == 2, (args, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1 and expected in proc.stderr, proc.stderr
    assert not (tmp_path / "r.html").exists()


# -- a study with everything in it ------------------------------------------------------------
HOSTILE = "<script>alert('x')</script> & \"quotes\""
DISTS = {"mem_fraction_static": FloatDistribution(0.5, 0.95), "NCCL_MIN_NCHANNELS": IntDistribution(1, 32),
         "NCCL_ALGO": CategoricalDistribution(["Ring", "Tree"])}


def _trial(n: int, params: dict[str, Any], value: float | None, kind: str | None = None) -> optuna.trial.FrozenTrial:
    """A trial as the driver records it (TPE: an infeasible trial is PRUNED)."""
    ok = value is not None
    attrs = {"outcome": "ok" if ok else "infeasible", "feasible": ok, "failure_kind": kind,
             "failure_message": None if ok else f"{kind}: {HOSTILE}", "failure_excerpt": None if ok else f"line\n{HOSTILE}",
             "metrics": {"output_throughput": value} if ok else {}, "applied": params,
             "env": {"NCCL_MIN_NCHANNELS": str(params["NCCL_MIN_NCHANNELS"]), "NCCL_ALGO": params["NCCL_ALGO"]},
             "argv": ["python", "-m", "autotune.sim", "serve", "--mem-fraction-static", str(params["mem_fraction_static"]),
                      "--port", "30000"],
             "argv_template": ["python", "-m", "autotune.sim", "serve", "--mem-fraction-static",
                               str(params["mem_fraction_static"]), "--port", "{port}"],
             "duration_s": 10.0 + n, "baseline": n == 0}
    return create_trial(state=TrialState.COMPLETE if ok else TrialState.PRUNED, value=value, params=params,
                        distributions=DISTS, user_attrs=attrs, system_attrs={"constraints:failure": -1.0 if ok else 1.0})


def rich_study(storage: str, name: str = "rich") -> optuna.Study:
    """36 trials on a grid: NCCL_ALGO=Tree crashes (nccl-error), mem_fraction_static >= 0.94
    crashes (oom), and the throughput of the rest grows with NCCL_MIN_NCHANNELS; an ablation."""
    study = optuna.create_study(storage=storage, study_name=name, direction="maximize")
    study.set_user_attr("objective", {"name": "quick", "metric": "output_throughput"})
    study.set_user_attr("config", {"target": {"engine": "sim"}})
    for n in range(36):
        mfs = [0.70, 0.75, 0.80, 0.85, 0.88, 0.90, 0.92, 0.94, 0.95][n % 9]
        ch = [4, 8, 12, 16, 24, 32][n % 6]
        algo = "Tree" if n % 5 == 2 else "Ring"
        kind = "nccl-error" if algo == "Tree" else "oom" if mfs >= 0.94 else None
        value = None if kind else 1000.0 + 20.0 * ch + 3.0 * (n % 5)
        study.add_trial(_trial(n, {"mem_fraction_static": mfs, "NCCL_MIN_NCHANNELS": ch, "NCCL_ALGO": algo}, value, kind))
    study.set_user_attr("ablation", {
        "run": "abc123", "date": "2026-12-01T00:00:00+00:00", "best_trial": 5, "baseline_trial": 0,
        "best_mean": 1640.0, "best_n": 2, "baseline_mean": 1080.0, "baseline_n": 2, "gain": 560.0, "interval": 0.9,
        "parameters": [
            {"parameter": "NCCL_MIN_NCHANNELS", "best": 32, "baseline": 4, "trials": [36, 37], "measured": 2, "failed": [],
             "mean": 1100.0, "share": 0.8, "share_low": 0.6, "share_high": 0.95},
            {"parameter": "mem_fraction_static", "best": 0.90, "baseline": 0.70, "trials": [38, 39], "measured": 2,
             "failed": [], "mean": 1400.0, "share": 0.2, "share_low": 0.05, "share_high": 0.4}]})
    return study


def test_report_has_every_section_escaped_and_renders(tmp_path: Path) -> None:
    """The real analysis (`study explain`'s document) over a study with everything in it."""
    from autotune.analysis.explain import explain
    from autotune.profiles.report import build_report

    storage = f"sqlite:///{tmp_path}/rich.db"
    study = rich_study(storage)
    doc = explain(study)
    page = build_report(study, storage, analysis=doc)
    assert_self_contained(page)
    ids = re.findall(r'<div id="(fig-[a-z-]+)" class="plotly-graph-div', page)
    assert ids == ["fig-history", "fig-importance", "fig-importance-feasibility", "fig-feasibility", "fig-parallel",
                   "fig-ablation"], ids
    # User text is escaped in the page and inside the figures' JSON.
    assert "<script>alert" not in page and str(escape("<script>alert('x')</script>")) in page
    # The crash rules with their support, as the analysis found them.
    assert doc["failure_rules"], doc
    for rule in doc["failure_rules"]:
        assert f"<td>{escape(rule['condition'])}</td>" in page, rule
    assert "<th>failed of covered</th>" in page
    # The importances with their intervals: a table row per parameter, and the chart.
    params = {k: v for k, v in doc["importance"]["objective"]["params"].items() if "median" in v}
    assert params, doc
    for name, row in params.items():
        assert f"<td>{name}</td><td>{row['median']:.4g}</td><td>{row['low']:.4g}</td>" in page, name
    # The ablation's shares and intervals.
    assert "0.6 .. 0.95" in page and "interval (90%)" in page
    # The feasibility map is drawn over the parameters of the crash rules, each said why.
    ruled = list(dict.fromkeys(c["param"] for r in doc["failure_rules"] for c in r["conditions"]))[:2]
    assert f"Feasibility: {ruled[0]} x {ruled[1]}" in page, ruled
    assert f"{ruled[0]} (named by a crash rule)" in page
    out = tmp_path / "rich.html"
    out.write_text(page)
    got = check_in_browser(out)
    assert "infeasible: oom" in got.dom and "infeasible: nccl-error" in got.dom  # the map's legend, drawn by plotly
    assert "<script>alert" in got.text  # shown as text, never run


def test_importances_and_the_map_parameters_from_the_analysis() -> None:
    from autotune.profiles.report import importance_sets, top_parameters
    from autotune.store.record import TrialRecord

    def row(name: str, imp: float | None, lo: float | None = None, hi: float | None = None,
            verdict: str | None = None) -> dict[str, Any]:
        return {"parameter": name, "importance": imp, "low": lo, "high": hi, "verdict": verdict}

    # `study explain`'s document: objective and feasibility, medians with intervals and verdicts.
    doc = {"importance": {"method": "m", "objective": {"verdict": "not enough trials (4, need 20)", "params": {}},
                          "feasibility": {"verdict": "ok", "params": {
                              "b": {"median": 0.6, "low": 0.4, "high": 0.8, "verdict": "effect"},
                              "c": {"verdict": "not varied"}}}}}
    sets = importance_sets(doc)
    assert [(st["target"], st["verdict"]) for st in sets] == [("objective", "not enough trials (4, need 20)"),
                                                             ("feasibility", None)]
    assert sets[1]["rows"] == [row("b", 0.6, 0.4, 0.8, "effect"), row("c", None, verdict="not varied")]
    # The map's parameters: by importance, then those the rules name, then the rest.
    views = [TrialRecord(0, "COMPLETE", "ok", {"a": 1, "b": 2, "c": 3, "d": 4}, 1.0, {}, None, 1.0)]
    assert top_parameters(sets[1]["rows"], [], views) == ["b", "a"]
    assert top_parameters([], [{"conditions": [{"param": "d", "op": "=", "value": 4}]}], views) == ["d", "a"]
    # the parameters that explain the failures come before the most important ones
    assert top_parameters(sets[1]["rows"], [{"conditions": [{"param": "d", "op": "=", "value": 4}]}], views) == ["d", "b"]
    # with nothing rated, an axis the trials varied before one they held (one value maps nothing)
    views.append(TrialRecord(1, "COMPLETE", "ok", {"a": 1, "b": 2, "c": 5, "d": 6}, 1.0, {}, None, 1.0))
    assert top_parameters([], [], views) == ["c", "d"]


def test_a_study_without_feasible_trials_still_reports(tmp_path: Path) -> None:
    from autotune.profiles.report import build_report

    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/bad.db", study_name="bad", direction="maximize")
    study.add_trial(_trial(0, {"mem_fraction_static": 0.95, "NCCL_MIN_NCHANNELS": 8, "NCCL_ALGO": "Ring"}, None, "oom"))
    page = build_report(study, f"sqlite:///{tmp_path}/bad.db")
    assert "No feasible trial yet: no profile to export." in page
    assert "not enough trials (0, need" in page  # the analysis' verdict, no chart
    assert 'id="fig-feasibility"' in page and 'id="fig-parallel"' not in page


def test_the_feasibility_map_hides_no_trial_under_another() -> None:
    """Eleven good trials and a crash at one point: one circle sized by its count, the cross beside
    it; the axes' text values are labelled at their positions."""
    from autotune.profiles.report_figures import feasibility
    from autotune.store.record import TrialRecord

    def view(n: int, value: float | None, algo: str = "Ring") -> TrialRecord:
        failure = None if value is not None else {"kind": "nccl-error", "message": "boom"}
        return TrialRecord(n, "COMPLETE", "ok" if value is not None else "infeasible",
                           {"ch": 8, "algo": algo}, value, {}, failure, 1.0)

    views = [view(n, 100.0 + n) for n in range(11)] + [view(11, None), view(12, 90.0, "Tree")]
    fig = feasibility(views, ["ch", "algo"], "output_throughput")
    ok, crash = (next(t for t in fig.data if t.name == name) for name in ("feasible", "infeasible: nccl-error"))
    assert len(ok.x) == 2 and ok.marker.size[0] > ok.marker.size[1] == 10  # 11 trials: one larger marker
    assert "11 trials here" in ok.text[0]
    assert (crash.x[0], crash.y[0]) != (ok.x[0], ok.y[0]) and crash.y[0] == ok.y[0]  # set beside, not under
    assert list(fig.layout.yaxis.ticktext) == ["Ring", "Tree"]
