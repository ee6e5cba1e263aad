"""End to end: real `autotune` processes driving real simulated servers, crashing them for real."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import optuna
import pytest
import requests
import yaml

from autotune.store.record import read
from autotune.util.net import free_port, wait_http_ok
from autotune.config.study import StudyConfig
from autotune.bench.model_executor import ModelExecutor
from autotune.config.objective import Objective
from autotune.execution.trial import TrialSpec
from autotune.store.storage import open_storage
from tests.helpers.cli import autotune, show
from tests.helpers.sim_study import MFS, MIN_CH, SMALL_LOAD, write_study


def test_a_feasible_trial_is_measured_and_recorded(tmp_path: Path) -> None:
    cfg = write_study(tmp_path, "ok", {"mem_fraction_static": MFS, "NCCL_MIN_NCHANNELS": MIN_CH})
    autotune("study", "start", str(cfg), cwd=tmp_path)
    doc = show(tmp_path, "ok")
    assert doc["direction"] == "maximize"
    (trial,) = doc["trials"]
    assert trial["outcome"] == "ok" and trial["state"] == "COMPLETE" and trial["failure"] is None
    assert trial["params"] == {"mem_fraction_static": 0.92, "NCCL_MIN_NCHANNELS": 8}
    m = trial["metrics"]
    assert trial["value"] == pytest.approx(m["output_throughput"], rel=1e-3)
    assert m["output_throughput"] > 100 and m["completed"] == 64 and m["failed"] == 0
    assert m["p99_ttft_ms"] >= m["median_ttft_ms"] > 0
    # The log is an artifact and the trial's env/argv are recorded exactly.
    study = optuna.load_study(study_name="ok", storage=f"sqlite:///{tmp_path}/studies.db")
    attrs = study.trials[0].user_attrs
    assert attrs["env"]["NCCL_MIN_NCHANNELS"] == "8" and attrs["env"]["NCCL_IB_DISABLE"] == "1"
    assert "--mem-fraction-static" in attrs["argv"] and attrs["log_artifact"]
    assert list((tmp_path / "autotune-artifacts").glob(attrs["log_artifact"]))


@pytest.mark.parametrize(
    ("params", "kind", "text"),
    [
        ({"NCCL_ALGO": {"type": "categorical", "choices": ["Tree"], "env": "NCCL_ALGO", "default": "Tree"}},
         "nccl-error", "NCCL_ALGO was set to Tree"),
        ({"mem_fraction_static": {**MFS, "default": 0.95}, "cuda_graph_max_bs":
          {"type": "int", "low": 8, "high": 1024, "flag": "--cuda-graph-max-bs", "default": 1024}},
         "oom", "CUDA out of memory"),
        ({"mem_fraction_static": {**MFS, "default": 0.5}}, "not-enough-memory", "Not enough memory"),
    ],
    ids=["nccl-tree", "oom", "not-enough-memory"],
)
def test_server_crash_is_recorded_infeasible_with_its_log(tmp_path: Path, params: dict[str, Any], kind: str, text: str) -> None:
    cfg = write_study(tmp_path, "bad", params)
    autotune("study", "start", str(cfg), cwd=tmp_path)
    (trial,) = show(tmp_path, "bad")["trials"]
    assert trial["outcome"] == "infeasible" and trial["state"] == "COMPLETE" and trial["value"] is None
    assert trial["failure"]["blame"] == "configuration" and trial["failure"]["phase"] in ("start-up", "graph-capture")
    assert trial["failure"]["kind"] == kind
    assert text in trial["failure"]["excerpt"]
    study = optuna.load_study(study_name="bad", storage=f"sqlite:///{tmp_path}/studies.db")
    assert read(study.trials[0]).constraints["failure"] > 0  # the sampler sees it as infeasible


def test_resume_continues_and_runs_the_baseline_once(tmp_path: Path) -> None:
    cfg = write_study(tmp_path, "res", {"mem_fraction_static": MFS, "NCCL_MIN_NCHANNELS": MIN_CH},
                      baseline={"mem_fraction_static": 0.9}, trials=2)
    autotune("study", "start", str(cfg), cwd=tmp_path)
    autotune("study", "start", str(cfg), "--trials", "3", cwd=tmp_path)
    trials = show(tmp_path, "res")["trials"]
    assert len(trials) == 3
    assert [t["baseline"] for t in trials] == [True, False, False]
    assert trials[0]["params"]["mem_fraction_static"] == 0.9
    out = autotune("study", "resume", "res", "--storage", f"sqlite:///{tmp_path}/studies.db", cwd=tmp_path)
    assert "budget reached" in out.stderr
    assert len(show(tmp_path, "res")["trials"]) == 3


def test_killed_driver_leaves_nothing_behind_after_resume(tmp_path: Path) -> None:
    cfg = write_study(tmp_path, "kill", {"mem_fraction_static": MFS}, trials=2,
                      overrides={"load": {**SMALL_LOAD["load"], "num_prompts": 150, "concurrency": 8}})
    storage = f"sqlite:///{tmp_path}/studies.db"
    driver = subprocess.Popen([sys.executable, "-m", "autotune", "study", "start", str(cfg)], cwd=tmp_path,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pgid = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and pgid is None:
        time.sleep(0.5)
        try:
            # open_storage: the driver may be creating the database right now (a race on CREATE
            # TABLE that Optuna's own constructor does not retry)
            study = optuna.load_study(study_name="kill", storage=open_storage(storage))
        except KeyError:
            continue
        running = [t for t in study.trials if t.state == optuna.trial.TrialState.RUNNING]
        if running and running[0].user_attrs.get("server_pgid"):
            pgid = running[0].user_attrs["server_pgid"]
    assert pgid is not None, "the driver never launched a server"
    time.sleep(1.0)
    driver.send_signal(signal.SIGKILL)
    driver.wait(10)
    os.killpg(pgid, 0)  # the orphaned server is still there...
    autotune("study", "resume", "kill", "--storage", storage, "--trials", "1", cwd=tmp_path)
    with pytest.raises(ProcessLookupError):  # ...and resume removed it
        os.killpg(pgid, 0)
    trials = show(tmp_path, "kill")["trials"]
    assert trials[0]["state"] == "FAIL" and trials[0]["failure"]["kind"] == "interrupted"
    assert trials[1]["params"] == trials[0]["params"] and trials[1]["state"] != "FAIL"


def test_exported_sh_profile_starts_the_best_server(tmp_path: Path) -> None:
    cfg = write_study(tmp_path, "exp", {"mem_fraction_static": MFS, "NCCL_MIN_NCHANNELS": MIN_CH}, trials=1)
    autotune("study", "start", str(cfg), cwd=tmp_path)
    storage = f"sqlite:///{tmp_path}/studies.db"
    autotune("export", "exp", "--format", "sh", "-o", "p.sh", "--storage", storage, cwd=tmp_path)
    script = (tmp_path / "p.sh").read_text()
    assert "export NCCL_MIN_NCHANNELS=8" in script and "--mem-fraction-static 0.92" in script
    port = free_port()
    server = subprocess.Popen(["bash", "p.sh"], cwd=tmp_path, env={**os.environ, "PORT": str(port), "PYTHON": sys.executable},
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        assert wait_http_ok(f"http://127.0.0.1:{port}/health", 60, alive=lambda: server.poll() is None)
        info = requests.get(f"http://127.0.0.1:{port}/get_server_info", timeout=5).json()
        assert "0.92" in json.dumps(info)
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(10)
    for fmt in ("json", "yaml", "env"):
        out = autotune("export", "exp", "--format", fmt, "--storage", storage, cwd=tmp_path).stdout
        assert "NCCL_MIN_NCHANNELS" in out
    prof = json.loads(autotune("export", "exp", "--format", "json", "--storage", storage, cwd=tmp_path).stdout)
    assert prof["trial"] == 0 and prof["env"]["NCCL_MIN_NCHANNELS"] == "8" and "--mem-fraction-static" in prof["command"]
    best = json.loads(autotune("study", "best", "exp", "--json", "--storage", storage, cwd=tmp_path).stdout)
    assert set(best) >= {"number", "params", "value", "metrics"} and best["value"] > 0


BENCH_CLIENT = '''
import json, sys
from autotune.execution.loadgen import run_load_sync
from autotune.execution.workload import Workload
r = run_load_sync(sys.argv[1], Workload(api="sglang", concurrency=16, num_prompts=32, input_len=32, output_len=8, warmup_prompts=0))
json.dump({"tool": "test-bench", "result": {"tok_per_s": r.metrics["output_throughput"]}, "completed": r.completed}, open(sys.argv[2], "w"))
'''


def test_external_benchmark_command_against_the_server(tmp_path: Path) -> None:
    """An objective may run any benchmark command against the trial's server and parse its JSON."""
    (tmp_path / "bench_client.py").write_text(BENCH_CLIENT)
    (tmp_path / "ext.yaml").write_text(yaml.safe_dump({
        "name": "ext", "metric": "tok_per_s", "direction": "maximize",
        "benchmark": {"command": f"{{python}} {tmp_path}/bench_client.py {{base_url}} {{result_file}}",
                      "parse": "json", "json_path": "result.tok_per_s", "timeout_s": 60},
    }))
    cfg = write_study(tmp_path, "extb", {"mem_fraction_static": MFS, "NCCL_MIN_NCHANNELS": MIN_CH})
    data = yaml.safe_load(cfg.read_text())
    data["objective"] = str(tmp_path / "ext.yaml")
    data.pop("objective_overrides")
    cfg.write_text(yaml.safe_dump(data))
    autotune("study", "start", str(cfg), cwd=tmp_path)
    (trial,) = show(tmp_path, "extb")["trials"]
    assert trial["outcome"] == "ok", trial["failure"]
    assert trial["value"] > 0 and trial["metrics"]["completed"] == 32
    assert trial["value"] == pytest.approx(trial["metrics"]["tok_per_s"], rel=1e-3)


MRR = {"type": "int", "low": 2, "high": 64, "flag": "--max-running-requests", "default": 32}


def test_a_clearly_worse_trial_stops_early_recorded_stopped_not_infeasible(tmp_path: Path) -> None:
    """A real load against a real simulated server is stopped once it cannot beat the best so far;
    the model executor stops the same trial."""
    cfg = write_study(tmp_path, "stop", {"max_running_requests": MRR})
    autotune("study", "start", str(cfg), cwd=tmp_path)
    storage = f"sqlite:///{tmp_path}/studies.db"
    # A fourth of the baseline's running requests: about a third of its throughput.
    optuna.load_study(study_name="stop", storage=storage).enqueue_trial({"max_running_requests": 8})
    autotune("study", "start", str(cfg), "--trials", "2", cwd=tmp_path)
    base, worse = show(tmp_path, "stop")["trials"]
    assert base["outcome"] == "ok" and base["value"] > 0
    assert worse["outcome"] == "stopped" and worse["state"] == "PRUNED", worse
    assert worse["value"] is None and worse["failure"] is None
    stop = worse["early_stop"]
    assert stop["bound"] < stop["beat"] == pytest.approx(base["value"], rel=1e-3)  # the best so far
    assert stop["share"] < 1 and worse["metrics"]["completed"] < 64  # its load was cut short
    study = optuna.load_study(study_name="stop", storage=storage)
    t = study.trials[1]
    assert read(t).constraints["failure"] < 0 and t.intermediate_values  # not infeasible; ranked by what it showed
    best = json.loads(autotune("study", "best", "stop", "--json", "--storage", storage, cwd=tmp_path).stdout)
    assert best["number"] == 0
    # The in-process benchmark's executor, on the same target and objective, stops it too.
    config = StudyConfig.load(cfg)
    ex = ModelExecutor.for_target(config, Objective.load_file(config.objective, config.objective_overrides), seed=None)
    # (the model's start-up is the host's uncompressed minutes, longer than the test's ready timeout)
    spec = TrialSpec(1, env={}, args=["--max-running-requests", "8"], ready_timeout_s=3600.0, beat_value=base["value"])
    assert ex.result(spec).outcome == "stopped"
    assert ex.result(dataclasses.replace(spec, beat_value=None)).outcome == "ok"
