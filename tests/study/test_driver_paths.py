"""The driver's less travelled paths, end to end: real `autotune` processes driving real simulated
servers over real SQLite storages.

- the GP sampler: an infeasible trial told COMPLETE with every constraint key, a feasible one
  COMPLETE with its value;
- ``budget.hours``; infrastructure faults (a port held by the test), their retries and the stop
  after three in a row; SLO constraints;
- ``study explain``, ``study list`` and ``autotune dashboard`` over a study with crashes in it.

Every test knows which trials crash and which are measured, whatever the sampler would draw: a
one-trial study runs its baseline, and the studies of several trials get theirs with Optuna's own
``enqueue_trial`` on the study created before the driver opens it (as a user would, to try given
values first).
"""

from __future__ import annotations

import importlib.util
import json
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import pytest
import requests
import yaml
from optuna.trial import FrozenTrial, TrialState

from autotune.store.record import read
from autotune.util.net import free_port
from tests.helpers.cli import autotune, stop_group
from tests.helpers.sim_study import MFS, write_study
from tests.needs import require_modules

ALGO = {"type": "categorical", "choices": ["Ring", "Tree"], "env": "NCCL_ALGO", "default": "Ring"}
TREE = {"NCCL_ALGO": "Tree"}  # crashes at start-up on the GLM-5 host: nccl-error
RING = {"NCCL_ALGO": "Ring"}  # serves
SAFE_MFS = {**MFS, "low": 0.88, "high": 0.92}  # every value serves on the GLM-5 host
# One wave of 16 short requests: about 2 s of load on the GLM-5 host (test_study's SMALL_LOAD: 5 s).
LOAD = {"load": {"concurrency": 16, "num_prompts": 16, "input_len": 64, "output_len": 16, "warmup_prompts": 0}}
LOOSE_SLO = "p99_ttft_ms <= 1e9"  # the objective's spelling; its constraint key is the driver's
LOOSE_KEY = "slo:p99_ttft_ms <= 1e+09"
TIGHT_SLO = "p99_ttft_ms <= 0.001"
TIGHT_KEY = "slo:p99_ttft_ms <= 0.001"


def _storage(tmp: Path) -> str:
    return f"sqlite:///{tmp}/studies.db"


def _edit(cfg: Path, **changes: Any) -> Path:
    """Change top-level keys of a study config written by ``write_study`` (mappings are merged)."""
    data = yaml.safe_load(cfg.read_text())
    for key, value in changes.items():
        data[key] = {**data[key], **value} if isinstance(value, dict) and isinstance(data.get(key), dict) else value
    cfg.write_text(yaml.safe_dump(data))
    return cfg


def _enqueue(storage: str, name: str, *params: dict[str, Any]) -> None:
    """Create the study (maximize, as the objective says) with these trials waiting, in order."""
    study = optuna.create_study(storage=storage, study_name=name, direction="maximize")
    for p in params:
        study.enqueue_trial(p)


def _trials(storage: str, name: str) -> list[FrozenTrial]:
    return optuna.load_study(study_name=name, storage=storage).get_trials()


def _slo(overrides: dict[str, Any], *constraints: str) -> dict[str, Any]:
    return {**overrides, "constraints": list(constraints)}


@dataclass(frozen=True)
class Studies:
    """One storage holding two finished studies: ``tree`` (TPE) and ``gp`` (the GP sampler)."""

    folder: Path
    storage: str


@pytest.fixture(scope="module")
def studies(tmp_path_factory: pytest.TempPathFactory) -> Studies:
    """``tree``: Tree, Tree (crashes), Ring (measured). ``gp``: Tree, Ring, under a loose SLO."""
    folder = tmp_path_factory.mktemp("studies")
    storage = _storage(folder)
    _enqueue(storage, "tree", TREE, TREE, RING)
    autotune("study", "start", str(write_study(folder, "tree", {"NCCL_ALGO": ALGO}, trials=3, overrides=LOAD)),
             cwd=folder)
    _enqueue(storage, "gp", TREE, RING)
    cfg = write_study(folder, "gp", {"NCCL_ALGO": ALGO}, trials=2)
    # the GP sampler runs on torch (the preflight refuses it without): where torch is missing, the
    # study is run by the random sampler and only the GP test skips
    sampler = "gp" if importlib.util.find_spec("torch") is not None else "random"
    autotune("study", "start", str(_edit(cfg, sampler=sampler, objective_overrides=_slo(LOAD, LOOSE_SLO))), cwd=folder)
    return Studies(folder, storage)


# -- samplers, budgets, faults, SLOs ------------------------------------------------------------
def test_gp_tells_infeasible_complete_with_every_constraint_key(studies: Studies) -> None:
    require_modules(["torch"], "the GP sampler", "pip install torch")
    bad, good = _trials(studies.storage, "gp")
    keys = {"failure", LOOSE_KEY}
    # The crash: COMPLETE (not PRUNED, which the GP sampler would not learn from), with a
    # placeholder value below every measured one, infeasible by the failure constraint, every key present.
    assert bad.state == TrialState.COMPLETE and bad.params == TREE
    assert bad.user_attrs["outcome"] == "infeasible" and bad.user_attrs["failure_kind"] == "nccl-error"
    assert bad.user_attrs["feasible"] is False and bad.value < good.value and read(bad).value is None
    assert set(read(bad).constraints) == keys
    assert read(bad).constraints["failure"] > 0 and read(bad).constraints[LOOSE_KEY] <= 0  # nothing measured, nothing broken
    assert len(bad.constraints) == len(keys) and bad.system_attrs["constraints"][0] > 0  # what GP and the dashboard read
    # The measured one: COMPLETE with its throughput, feasible on every key.
    assert good.state == TrialState.COMPLETE and good.params == RING
    assert good.user_attrs["outcome"] == "ok" and good.user_attrs["feasible"] is True
    assert good.value == pytest.approx(good.user_attrs["metrics"]["output_throughput"], rel=1e-3) and good.value > 0
    assert set(read(good).constraints) == keys and all(v <= 0 for v in good.constraints.values())
    assert optuna.load_study(study_name="gp", storage=studies.storage).user_attrs["config"]["sampler"] == "gp"


def test_an_hours_budget_stops_the_study(tmp_path: Path) -> None:
    """36 ms of trials: the first trial spends it, so a 5-trial study stops after one, and stays stopped."""
    cfg = _edit(write_study(tmp_path, "hours", {"NCCL_ALGO": ALGO}, baseline=TREE, trials=5),
                budget={"trials": 5, "hours": 1e-5})
    first = autotune("study", "start", str(cfg), cwd=tmp_path)
    assert "budget reached" in first.stderr and "h of trials" in first.stderr
    (trial,) = _trials(_storage(tmp_path), "hours")
    assert trial.state == TrialState.COMPLETE and trial.user_attrs["duration_s"] >= 1e-5 * 3600
    again = autotune("study", "resume", "hours", "--storage", _storage(tmp_path), cwd=tmp_path)
    assert "budget reached" in again.stderr and "h of trials" in again.stderr
    assert len(_trials(_storage(tmp_path), "hours")) == 1


def test_faults_are_retried_then_three_in_a_row_stop_the_study(tmp_path: Path) -> None:
    """A port the test keeps listening on: every launch is a ``port-busy`` fault (the host's, not
    the configuration's). Each is FAIL and its parameters run again up to ``max_fault_retries``
    times; the third fault in a row stops the study (HostBrokenError: exit code 1 on the command
    line); what was recorded stays, and once the port is free the study resumes with the retry
    that was waiting. The driver is run as the command line builds it, less the preflight, which
    refuses a fixed port already in use before the first trial (tests/cli/test_init.py): here
    the port is taken while the study runs, as another program may take it."""
    from autotune.config.study import StudyConfig
    from autotune.execution.host_factory import make_hosts
    from autotune.execution.stopping import StopRequest
    from autotune.study import build
    from autotune.study.driver import HostBrokenError

    storage = _storage(tmp_path)
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        cfg = _edit(write_study(tmp_path, "faults", {"mem_fraction_static": SAFE_MFS}, trials=3, overrides=LOAD),
                    target={"port": port}, max_fault_retries=1)
        plan = build.plan(StudyConfig.load(cfg))
        hosts, stop = make_hosts(plan.config.target), StopRequest()
        driver = build.driver(plan, build.executor(plan, hosts, stop=stop), stop=stop, hosts=hosts)
        try:
            with pytest.raises(HostBrokenError) as broken:
                driver.run()
        finally:
            build.close(driver)
        message = str(broken.value)
        assert "3 infrastructure faults in a row" in message and "port-busy" in message, message
        assert f"port {port}" in message
    finally:
        holder.close()
    t0, t1, t2, waiting = _trials(storage, "faults")
    for t in (t0, t1, t2):
        assert t.state == TrialState.FAIL and t.value is None
        assert t.user_attrs["outcome"] == "fault" and t.user_attrs["failure_kind"] == "port-busy"
        assert t.user_attrs["port"] == port and t.user_attrs["feasible"] is False
    assert t0.params == {"mem_fraction_static": 0.92} and t0.user_attrs["baseline"] is True
    # Trial 0's parameters ran once more (max_fault_retries: 1), then no more: trial 2 is sampled.
    assert t1.params == t0.params and t1.user_attrs["retry_of"] == 0 and t1.user_attrs["fault_retries"] == 1
    assert "retry_of" not in t2.user_attrs
    assert waiting.state == TrialState.WAITING and waiting.user_attrs["retry_of"] == 2
    # The port is free now: the waiting retry runs and is measured; FAILs do not count as trials.
    autotune("study", "resume", "faults", "--storage", storage, "--trials", "1", cwd=tmp_path)
    trials = _trials(storage, "faults")
    assert [t.state for t in trials] == [TrialState.FAIL] * 3 + [TrialState.COMPLETE]
    assert trials[3].params == t2.params and trials[3].user_attrs["outcome"] == "ok"
    assert [(t.params, t.user_attrs) for t in trials[:3]] == [(t.params, t.user_attrs) for t in (t0, t1, t2)]


@pytest.mark.parametrize(
    ("constraint", "key", "outcome", "state"),
    [(TIGHT_SLO, TIGHT_KEY, "infeasible", TrialState.COMPLETE), (LOOSE_SLO, LOOSE_KEY, "ok", TrialState.COMPLETE)],
    ids=["tight", "loose"],
)
def test_slo_constraints(tmp_path: Path, constraint: str, key: str, outcome: str, state: TrialState) -> None:
    """A measured trial that breaks an SLO is infeasible ``slo-violated`` by its SLO constraint,
    not by the failure constraint (it did not crash); one that keeps it is ok."""
    cfg = write_study(tmp_path, "slo", {"NCCL_ALGO": ALGO}, baseline=RING, overrides=_slo(LOAD, constraint))
    autotune("study", "start", str(cfg), cwd=tmp_path)
    (trial,) = _trials(_storage(tmp_path), "slo")
    assert trial.state == state and trial.user_attrs["outcome"] == outcome
    assert set(read(trial).constraints) == {"failure", key} and read(trial).constraints["failure"] <= 0
    metrics = trial.user_attrs["metrics"]
    assert metrics["completed"] == LOAD["load"]["num_prompts"] and metrics["p99_ttft_ms"] > 0.001
    if outcome == "infeasible":
        assert trial.user_attrs["failure_kind"] == "slo-violated" and read(trial).constraints[key] > 0
        assert "p99_ttft_ms" in trial.user_attrs["failure_message"] and read(trial).value is None
    else:
        assert trial.user_attrs["failure_kind"] is None and read(trial).constraints[key] <= 0
        assert trial.value == pytest.approx(metrics["output_throughput"], rel=1e-3)


# -- explain, list, dashboard -------------------------------------------------------------------
def test_explain_names_the_value_that_crashes(studies: Studies) -> None:
    """Two crashes are too few for a counted rule (it needs 3 failures it explains), but the
    simulated engine's NCCL error names the setting (``NCCL_ALGO was set to Tree``): that is the
    rule's evidence, and explain says so, through the driver's own records."""
    explain = ("study", "explain", "tree", "--storage", studies.storage)
    doc = json.loads(autotune(*explain, "--json", cwd=studies.folder).stdout)
    assert doc["study"] == "tree" and doc["trials"] == 3
    assert doc["outcomes"] == {"infeasible": 2, "ok": 1} and doc["failure_kinds"] == {"nccl-error": 2}
    (rule,) = doc["failure_rules"]
    assert rule["rule"] == "NCCL_ALGO=Tree -> nccl-error (2 of 2; the error names it)" and rule["named_by_error"]
    assert doc["unexplained_failures"]["count"] == 0
    text = autotune(*explain, cwd=studies.folder).stdout
    assert "tree: 3 trials" in text and "NCCL_ALGO=Tree -> nccl-error (2 of 2; the error names it)" in text


def test_list_counts_every_study(studies: Studies) -> None:
    rows = json.loads(autotune("study", "list", "--json", "--storage", studies.storage, cwd=studies.folder).stdout)
    by_name = {r["study"]: r for r in rows}
    assert set(by_name) == {"tree", "gp"}
    for name, (trials, feasible, infeasible) in {"tree": (3, 1, 2), "gp": (2, 1, 1)}.items():
        row = by_name[name]
        assert (row["trials"], row["feasible"], row["infeasible"]) == (trials, feasible, infeasible), row
        measured = [t for t in _trials(studies.storage, name) if t.user_attrs["outcome"] == "ok"]
        assert row["best"] == pytest.approx(measured[0].value) and row["created"]
    text = autotune("study", "list", "--storage", studies.storage, cwd=studies.folder).stdout
    lines = {line.split("│")[0].strip(): line for line in text.splitlines() if line.count("│") > 2}  # no frame
    assert {"tree", "gp"} <= set(lines)
    assert [c.strip() for c in lines["tree"].split("│")[1:4]] == ["3", "1", "2"]
    assert [c.strip() for c in lines["gp"].split("│")[1:4]] == ["2", "1", "1"]


def test_dashboard_serves_the_studies(studies: Studies) -> None:
    """``autotune dashboard`` answers optuna-dashboard's API over the storage, outcomes included."""
    port = free_port()
    log = studies.folder / f"dashboard-{port}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "autotune", "dashboard", "--port", str(port), "--storage",
                                 studies.storage], cwd=studies.folder, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        body = None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                resp = requests.get(f"http://127.0.0.1:{port}/api/studies", timeout=5)
                if resp.status_code == 200:
                    body = resp.json()
                    break
            except requests.RequestException:
                pass
            time.sleep(0.2)
        assert body is not None, f"the dashboard never answered (exit code {proc.poll()}):\n{log.read_text()}"
        names = {s["study_name"]: s for s in body["study_summaries"]}
        assert set(names) == {"tree", "gp"}
        tree = names["tree"]
        assert tree["directions"] == ["maximize"] and {"config", "objective"} <= {a["key"] for a in tree["user_attrs"]}
        detail = requests.get(f"http://127.0.0.1:{port}/api/studies/{tree['study_id']}", timeout=30).json()
        outcomes = [{a["key"]: a["value"] for a in t["user_attrs"]}["outcome"] for t in detail["trials"]]
        assert outcomes == ["infeasible", "infeasible", "ok"]  # what the dashboard cannot show as constraints
    finally:
        stop_group(proc)


def test_server_info_keeps_the_engine_version_past_its_size_limit() -> None:
    """SGLang's /get_server_info lists its ~550 server args, then ``version``: the stored info is
    cut at 4000 characters, but never without the version (the profile's provenance reads it)."""
    from autotune.store.trial_result import compact_info

    body = {f"arg_{i}": f"value-{i}" for i in range(550)} | {"version": "0.5.23"}
    info = compact_info({"/get_server_info": body})
    assert info is not None and info["get_server_info.version"] == "0.5.23"
    assert len(info) < len(body)  # the rest is still cut
