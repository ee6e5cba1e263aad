"""Multi-objective studies and several loads, end to end on real parts.

A multi-objective study (throughput against mean TTFT) runs through the real driver on a real
SQLite storage with the in-process model executor (:mod:`autotune.bench.model_executor`): the default
sampler, crashes included. The stored study is then read by the real command line, in process
(``autotune.cli.app.main``): ``study best/show/explain``, ``export`` (the rule, ``--choose``,
``--trial``), ``report``, and the dashboard notes the driver wrote. Several loads run on a real
simulated server process through the real runner.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml
from optuna.trial import TrialState
from rich.console import Console

from autotune.store.record import read
from autotune.config.study import StudyConfig
from autotune.study.driver import Driver
from autotune.study.identity import StudyMismatchError
from autotune.execution.executors import make_runner
from autotune.execution.hosts import LocalHost
from autotune.bench.model_executor import ModelExecutor
from autotune.study.notes import note_for
from autotune.config.objective import Objective
from autotune.config.pareto import ChoiceRule, Goal, choose, dominates
from autotune.study.progress import ConsoleReporter
from autotune.execution.trial import TrialSpec
from autotune.search.samplers import TPE_STARTUP_TRIALS, CrashAwareTPESampler
from autotune.execution.slots import Slot
from autotune.config.space import SearchSpace
from autotune.execution.stopping import StopRequest
from autotune.store.study_view import best_view, trial_views
from tests.helpers.cli import run_in_process

SCENARIO = "rtx6000-pcie-glm5"
TRIALS = 14
GOALS = [Goal("output_throughput", "maximize"), Goal("mean_ttft_ms", "minimize")]
MULTI = {"name": "tput_ttft",
         "objectives": [g.to_json() for g in GOALS],
         "choose": {"rule": "knee"},
         "load": {"concurrency": 192, "num_prompts": 192, "input_len": 64, "output_len": 16, "warmup_prompts": 4}}


def _config(tmp: Path, objective: Path, name: str = "multi", trials: int = TRIALS, sampler: str = "tpe") -> StudyConfig:
    return StudyConfig.from_mapping({
        "name": name, "target": {"engine": "sim", "scenario": SCENARIO}, "space": "sglang_nccl",
        "objective": str(objective), "storage": f"sqlite:///{tmp}/m.db", "seed": 1, "budget": {"trials": trials},
        "sampler": sampler,
    }, "test")


def _run(cfg: StudyConfig, objective: Objective, console: Console | None = None) -> optuna.Study:
    ex = ModelExecutor.for_target(cfg, objective, seed=1)
    reporter = ConsoleReporter(console, metric=objective.metric, objectives=[g.metric for g in objective.goals]) \
        if console is not None else None
    return Driver(cfg, SearchSpace.load(cfg.space), objective, ex, reporter=reporter).run().study


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, optuna.Study]:
    tmp = tmp_path_factory.mktemp("multi")
    path = tmp / "multi.yaml"
    path.write_text(yaml.safe_dump(MULTI))
    cfg = _config(tmp, path)
    console = Console(file=io.StringIO(), width=150)
    st = _run(cfg, Objective.load_file(str(path)), console)
    (tmp / "console.txt").write_text(console.file.getvalue())  # type: ignore[attr-defined]
    return tmp, f"sqlite:///{tmp}/m.db", st


_cli = run_in_process  # autotune ARGV through autotune.cli.app.main: (exit code, stdout, stderr)


def _front(trials: list[dict[str, Any]]) -> set[int]:
    measured = [(t["number"], t["values"]) for t in trials if t["values"] is not None]
    return {n for n, v in measured if not any(dominates(w, v, GOALS) for m, w in measured if m != n)}


# -- the study as the driver recorded it --------------------------------------------------------------
def test_the_driver_tells_every_objective_and_teaches_the_sampler_its_crashes(study: tuple[Path, str, optuna.Study]) -> None:
    _, _, st = study
    assert [d.name for d in st.directions] == ["MAXIMIZE", "MINIMIZE"]
    assert isinstance(st.sampler, CrashAwareTPESampler)  # the default strategy, as in a single-objective study
    stored = st.user_attrs["objective"]
    assert stored["objectives"] == [g.to_json() for g in GOALS] and stored["choose"] == {"rule": "knee"}
    assert (stored["metric"], stored["direction"]) == ("output_throughput", "maximize")
    trials = st.get_trials()
    assert len([t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]) == TRIALS
    ok = [t for t in trials if t.user_attrs["outcome"] == "ok"]
    bad = [t for t in trials if t.user_attrs["outcome"] == "infeasible"]
    assert ok and bad, "the GLM-5 host's space has crashes: the study should meet some"
    for t in ok:
        m = t.user_attrs["metrics"]
        assert t.state == TrialState.COMPLETE and read(t).constraints["failure"] < 0
        assert t.values == [pytest.approx(m["output_throughput"], abs=1e-3), pytest.approx(m["mean_ttft_ms"], abs=1e-3)]
    for t in bad:
        assert t.state == TrialState.COMPLETE and read(t).values is None and read(t).constraints["failure"] > 0
    # Optuna 5's TPE puts a trial with a positive constraint below every feasible one, in a
    # multi-objective study as in a single-objective one: the crashes teach it where not to go.
    from optuna.samplers._tpe.sampler import _split_trials

    finished = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    below, above = _split_trials(st, finished, len(ok))
    assert {t.number for t in below} == {t.number for t in ok} and {t.number for t in bad} <= {t.number for t in above}
    assert len(trials) > TPE_STARTUP_TRIALS  # the sampler modelled the study after its start-up


def test_the_gp_sampler_is_told_every_objective_and_every_constraint(tmp_path: Path) -> None:
    path = tmp_path / "multi.yaml"
    path.write_text(yaml.safe_dump(MULTI))
    st = _run(_config(tmp_path, path, name="gp", trials=8, sampler="gp"), Objective.load_file(str(path)))
    assert isinstance(st.sampler, optuna.samplers.GPSampler)
    finished = [t for t in st.get_trials() if t.state != TrialState.WAITING]
    bad = [t for t in finished if t.user_attrs["outcome"] == "infeasible"]
    assert bad, "the GLM-5 host's space has crashes: the study should meet some"
    for t in finished:  # GP learns from COMPLETE trials only: infeasible ones too, constraints set
        assert t.state == TrialState.COMPLETE and len(t.values) == 2 and set(read(t).constraints) == {"failure"}
    for t in bad:
        assert read(t).constraints["failure"] > 0
    measured = {v.number for v in trial_views(st) if v.values is not None}
    assert measured and not {t.number for t in bad} & measured  # their fill values are not measurements
    chosen = best_view(st)
    assert chosen is not None and chosen.number not in {t.number for t in bad}


def test_the_console_shows_the_front_and_the_chosen_trial(study: tuple[Path, str, optuna.Study]) -> None:
    text = (study[0] / "console.txt").read_text()
    assert "Pareto front (maximize output_throughput, minimize mean_ttft_ms)" in text
    assert "chosen: trial" in text and "knee: the trial nearest the ideal point" in text
    assert "output_throughput=" in text and "mean_ttft_ms=" in text  # each finished trial's values


def test_best_reports_the_front_and_the_rules_pick(study: tuple[Path, str, optuna.Study], capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    _, storage, _ = study
    code, out, _ = _cli(["study", "show", "multi", "--json", "--storage", storage], capsys, monkeypatch)
    assert code == 0
    shown = json.loads(out)
    assert shown["objectives"] == [g.to_json() for g in GOALS] and shown["direction"] == "maximize"
    for t in shown["trials"]:
        assert (t["values"] is None) == (t["value"] is None) and (t["values"] is None or t["values"][0] == t["value"])
    code, out, _ = _cli(["study", "best", "multi", "--json", "--storage", storage], capsys, monkeypatch)
    assert code == 0
    best = json.loads(out)
    assert {"number", "params", "value", "metrics", "values", "objectives", "choice", "pareto_front"} <= set(best)
    front = _front(shown["trials"])
    assert {t["number"] for t in best["pareto_front"]} == front == set(best["choice"]["front"])
    knee = choose([(t["number"], t["values"]) for t in shown["trials"] if t["values"]], GOALS, ChoiceRule("knee"))
    assert best["number"] == best["choice"]["trial"] == knee.number and best["choice"]["rule"] == "knee"
    assert best["values"] == next(t["values"] for t in shown["trials"] if t["number"] == best["number"])
    code, out, _ = _cli(["study", "best", "multi", "--storage", storage], capsys, monkeypatch)
    assert code == 0 and "Pareto front:" in out and "<- chosen" in out and f"chosen: trial {best['number']}" in out
    code, out, _ = _cli(["study", "show", "multi", "--storage", storage], capsys, monkeypatch)
    assert code == 0 and "mean_ttft_ms" in out and "(front)" in out
    code, out, _ = _cli(["study", "list", "--json", "--storage", storage], capsys, monkeypatch)
    assert next(r for r in json.loads(out) if r["study"] == "multi")["best"] == best["value"]
    code, out, _ = _cli(["study", "status", "multi", "--json", "--storage", storage], capsys, monkeypatch)
    status = json.loads(out)
    assert status["best"]["number"] == best["number"] and status["best"]["values"] == best["values"]
    code, out, _ = _cli(["study", "status", "multi", "--storage", storage], capsys, monkeypatch)
    assert f"chosen from the Pareto front: trial {best['number']} output_throughput=" in out


def test_export_states_the_rule_and_can_choose_another(study: tuple[Path, str, optuna.Study], tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    _, storage, st = study
    shown = json.loads(_cli(["study", "show", "multi", "--json", "--storage", storage], capsys, monkeypatch)[1])
    points = [(t["number"], t["values"]) for t in shown["trials"] if t["values"]]

    def export(*extra: str) -> dict[str, Any]:
        code, out, err = _cli(["export", "multi", "--format", "json", "--storage", storage, *extra], capsys, monkeypatch)
        assert code == 0, err
        return json.loads(out)

    prof = export()
    assert prof["choice"]["rule"] == "knee" and prof["trial"] == choose(points, GOALS, ChoiceRule("knee")).number
    # what `autotune verify` measures the profile under: the study's objective, read back whole
    assert Objective.from_mapping(prof["verify"]["objective"]) == Objective.from_mapping(MULTI)
    assert [o["metric"] for o in prof["objectives"]] == [g.metric for g in GOALS]
    first = export("--choose", "first")
    assert first["trial"] == choose(points, GOALS, ChoiceRule("first")).number
    assert first["choice"]["text"].startswith("first: the best output_throughput on the front")
    bound = export("--choose", "bound:0.5")
    assert bound["trial"] == choose(points, GOALS, ChoiceRule("bound", 0.5)).number
    off = [n for n, v in points if any(dominates(w, v, GOALS) for _, w in points)]
    assert off, "a seeded study of this host measures trials off the front"
    given = export("--trial", str(off[0]))  # exported as asked, and the profile says the front beats it
    assert given["trial"] == off[0] and "not on the Pareto front" in given["choice"]["text"]
    on = export("--trial", str(prof["choice"]["front"][-1]))
    assert "(on the Pareto front; the rule would pick trial" in on["choice"]["text"]
    out = tmp_path / "p.sh"
    code, _, err = _cli(["export", "multi", "--format", "sh", "-o", str(out), "--storage", storage], capsys, monkeypatch)
    assert code == 0 and "chosen: knee" in err
    header = [line for line in out.read_text().splitlines() if line.startswith("# ")]
    assert any(line.startswith("# chosen: knee: the trial nearest the ideal point") for line in header)
    assert any(line.startswith("# output_throughput = ") and "mean_ttft_ms = " in line for line in header)


def test_explain_report_and_notes_read_a_multi_objective_study(study: tuple[Path, str, optuna.Study], tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    _, storage, st = study
    code, out, _ = _cli(["study", "explain", "multi", "--json", "--storage", storage], capsys, monkeypatch)
    assert code == 0
    imp = json.loads(out)["importance"]
    assert [o["metric"] for o in imp["objectives"]] == [g.metric for g in GOALS]
    assert imp["objectives"][0]["trials"] == imp["objective"]["trials"] > 0
    code, out, _ = _cli(["study", "explain", "multi", "--storage", storage], capsys, monkeypatch)
    assert code == 0 and "what matters for mean_ttft_ms" in out
    page = tmp_path / "r.html"
    code, _, err = _cli(["report", "multi", "-o", str(page), "--storage", storage], capsys, monkeypatch)
    assert code == 0, err
    html = page.read_text()
    assert "<h2 id=pareto>Pareto front</h2>" in html and "could not be drawn" not in html
    assert "What moves mean_ttft_ms" in html
    t = next(t for t in st.get_trials() if t.user_attrs.get("outcome") == "ok")
    note = note_for(st, t)
    for g, v in zip(GOALS, t.values):
        assert f"`{g.metric}` = **{v:.6g}**" in note


def test_ablate_says_it_is_single_objective_only(study: tuple[Path, str, optuna.Study], capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    code, _, err = _cli(["study", "ablate", "multi", "--storage", study[1]], capsys, monkeypatch)
    assert code == 2 and err.count("\n") == 1
    assert "study 'multi' is multi-objective: an ablation attributes one objective's gain" in err


def test_a_study_resumed_with_other_objectives_is_refused(study: tuple[Path, str, optuna.Study]) -> None:
    tmp, _, _ = study
    swapped = tmp / "swapped.yaml"
    swapped.write_text(yaml.safe_dump({**MULTI, "objectives": [{"metric": "output_throughput", "direction": "maximize"},
                                                               {"metric": "mean_ttft_ms", "direction": "maximize"}]}))
    with pytest.raises(StudyMismatchError, match="direction maximize, minimize, the objective says maximize, maximize"):
        _run(_config(tmp, swapped), Objective.load_file(str(swapped)))
    renamed = tmp / "renamed.yaml"
    renamed.write_text(yaml.safe_dump({**MULTI, "objectives": [{"metric": "total_throughput", "direction": "maximize"},
                                                               {"metric": "mean_ttft_ms", "direction": "minimize"}]}))
    with pytest.raises(StudyMismatchError, match="objectives output_throughput, mean_ttft_ms, the objective says"):
        _run(_config(tmp, renamed), Objective.load_file(str(renamed)))


def test_a_single_objective_study_keeps_its_shapes(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = _config(tmp_path, Path("quick"), name="single", trials=3)
    st = _run(cfg, Objective.load_file("quick"))
    assert set(st.user_attrs["objective"]) == {"name", "metric", "direction", "constraints"}
    storage = f"sqlite:///{tmp_path}/m.db"
    shown = json.loads(_cli(["study", "show", "single", "--json", "--storage", storage], capsys, monkeypatch)[1])
    assert set(shown) == {"study", "direction", "metric", "trials"}
    assert all("values" not in t for t in shown["trials"])
    best = json.loads(_cli(["study", "best", "single", "--json", "--storage", storage], capsys, monkeypatch)[1])
    assert set(best) == {"number", "params", "value", "metrics", "env", "argv", "measurements"}
    prof = json.loads(_cli(["export", "single", "--format", "json", "--storage", storage], capsys, monkeypatch)[1])
    assert "choice" not in prof and "objectives" not in prof


def test_a_weighted_objective_is_told_as_measured_through_the_driver(tmp_path: Path) -> None:
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump({**{k: v for k, v in MULTI.items() if k not in ("objectives", "choose")},
                                    "metric": "mix", "direction": "maximize",
                                    "weighted": {"mix": [{"metric": "output_throughput", "weight": 2},
                                                         {"metric": "request_throughput", "weight": 100}]}}))
    st = _run(_config(tmp_path, path, name="w", trials=3), Objective.load_file(str(path)))
    measured = [t for t in st.get_trials() if t.state == TrialState.COMPLETE]
    assert measured
    for t in measured:
        m = t.user_attrs["metrics"]
        assert t.value == pytest.approx(2 * m["output_throughput"] + 100 * m["request_throughput"], rel=1e-6)
        assert m["mix"] == pytest.approx(t.value, abs=1e-3)


# -- several loads on one real server -------------------------------------------------------------------
def _load_runner(tmp: Path, loads: list[dict[str, Any]], constraints: list[str] = ()):  # type: ignore[no-untyped-def]
    objective = Objective.from_mapping({"metric": "output_throughput", "loads": loads, "constraints": list(constraints)})
    cfg = StudyConfig.from_mapping({
        "name": "loads", "space": "sglang_nccl", "objective": "quick", "storage": f"sqlite:///{tmp}/l.db",
        "target": {"engine": "sim", "scenario": SCENARIO, "ready_timeout_s": 60, "env": {"NCCL_IB_DISABLE": "1"},
                   "command": "{python} -m autotune.sim serve --scenario {scenario} --host {host} --port {port}"
                              " --max-running-requests 128 --time-scale 1000"}}, "test")
    return make_runner(cfg, objective, LocalHost(), Slot("local", "local"), stop=StopRequest(), log_dir=tmp), objective


SMALL = {"num_prompts": 8, "input_len": 32, "output_len": 4, "warmup_prompts": 0}


def test_several_loads_run_in_turn_on_one_server(tmp_path: Path) -> None:
    runner, objective = _load_runner(tmp_path, [{"name": "chat", "weight": 3, "concurrency": 2, **SMALL},
                                                {"name": "batch", "weight": 1, "concurrency": 8, **SMALL}],
                                     ["chat/p99_ttft_ms <= 1e9"])
    phases: list[tuple[str, str]] = []
    result = runner.run(TrialSpec(0, {}, []), on_phase=lambda p, d: phases.append((p, d)))
    assert result.outcome == "ok", result.failure
    m = result.metrics
    for load in ("chat", "batch"):
        assert m[f"{load}/completed"] == 8 and m[f"{load}/output_throughput"] > 0
    assert m["output_throughput"] == pytest.approx((3 * m["chat/output_throughput"] + m["batch/output_throughput"]) / 4)
    assert m["batch/output_throughput"] > m["chat/output_throughput"]  # 8 at once against 2: one server, both loads
    assert objective.values(m) == [m["output_throughput"]]
    assert result.violations == {"chat/p99_ttft_ms <= 1e+09": pytest.approx(m["chat/p99_ttft_ms"] - 1e9)}
    details = [d for p, d in phases if p in ("warming", "measuring")]
    assert any(d.startswith("chat: ") for d in details) and any(d.startswith("batch: ") for d in details)
    assert sum(1 for p, _ in phases if p == "launching") == 1


def test_a_load_that_fails_makes_the_trial_infeasible_and_names_it(tmp_path: Path) -> None:
    runner, _ = _load_runner(tmp_path, [{"name": "chat", "concurrency": 2, **SMALL},
                                        {"name": "long", "concurrency": 2, **SMALL, "output_len": 4000,
                                         "request_timeout_s": 0.05}])
    result = runner.run(TrialSpec(0, {}, []))
    assert result.outcome == "infeasible" and result.failure is not None
    assert result.failure.kind == "request-errors" and result.failure.message.startswith("long: ")
    assert result.metrics["chat/completed"] == 8  # the first load's metrics stay
