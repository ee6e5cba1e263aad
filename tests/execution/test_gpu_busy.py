"""A GPU held by a process autotune did not start is the environment's fault (``gpu-busy``), never
the configuration's. Real processes: a stand-in ``nvidia-smi`` first on PATH answers the two
queries of :mod:`autotune.execution.gpu_check` from a JSON file the test rewrites, and real `autotune`
studies drive simulated servers under it."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml

from autotune.engines.registry import PRESETS
from autotune.execution.gpu_check import (ComputeApp, Gpu, Holder, describe, foreign_holders, parse_compute_apps, parse_gpus,
                                visible_gpus, wait_until_free)
from autotune.execution.hosts import LocalHost
from autotune.config.objective import Objective
from autotune.execution.provenance import local_runner
from autotune.execution.runner import TrialRunner
from autotune.execution.trial import TrialSpec
from autotune.execution.stopping import StopRequest
from tests.helpers.cli import autotune, show
from tests.helpers.gpus import BUSY, FREE, TOTAL, UUID0, UUID1, StandIn
from tests.helpers.sim_study import MFS, write_study


@pytest.fixture
def smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> StandIn:
    """The stand-in, first on PATH here and in every process started from here (the driver)."""
    stand_in = StandIn(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{stand_in.folder}{os.pathsep}{os.environ.get('PATH', '')}")
    return stand_in


def gpu_study(tmp: Path, name: str, params: dict[str, Any], *, target: dict[str, Any], study: dict[str, Any],
              baseline: dict[str, Any] | None = None, trials: int = 1) -> Path:
    """A simulated study (:func:`tests.helpers.sim_study.write_study`) with extra ``target`` and study keys."""
    cfg = write_study(tmp, name, params, baseline=baseline, trials=trials)
    doc = yaml.safe_load(cfg.read_text())
    doc["target"].update(target)
    doc.update(study)
    cfg.write_text(yaml.safe_dump(doc))
    return cfg


def when(condition: Any, then: Any) -> threading.Thread:
    """A thread that calls ``then()`` once ``condition()`` holds (polled); started."""

    def watch() -> None:
        while not condition():
            threading.Event().wait(0.05)
        then()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


# -- (a) parsing ------------------------------------------------------------------------------
def test_the_gpu_and_process_queries_are_parsed_into_typed_holders() -> None:
    gpus = parse_gpus(f"0, {UUID0}, 143771, 139800\n1, {UUID1}, 143771, [N/A]\n2, {UUID1}, inf, 0\n"
                      "No devices were found\n\n")
    assert gpus == [Gpu(0, UUID0, 143771, 139800)]
    apps = parse_compute_apps(f"2921, python3, 139790, {UUID0}\n"
                              f"77, /opt/my, odd name, 2048, {UUID1}\n"
                              f"[N/A], [Not Found], [N/A], {UUID0}\n")
    assert apps == [ComputeApp(2921, "python3", 139790, UUID0), ComputeApp(77, "/opt/my, odd name", 2048, UUID1)]
    assert parse_gpus("") == [] and parse_compute_apps("No running processes found\n") == []


def test_cuda_visible_devices_names_the_slots_gpus() -> None:
    assert visible_gpus({}) is None
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "2,3"}) == (2, 3)
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": f"{UUID1[:12]},0"}) == (UUID1[:12], 0)
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "1,-1,0"}) == (1,)  # CUDA stops at the first bad entry
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == ()


def test_the_message_names_the_gpus_pids_names_and_gib() -> None:
    holders = [Holder(0, 139790, 2921, "python3"), Holder(1, 4096)]
    assert describe(holders) == ("GPU 0 holds 136.5 GiB in processes autotune did not start: pid 2921 (python3) "
                                 "136.5 GiB; GPU 1 holds 4.0 GiB in processes autotune did not start: 4.0 GiB no "
                                 "process is listed for (another container's?)")


def test_only_the_slots_gpus_and_holders_over_the_threshold_count(smi: StandIn) -> None:
    smi.set({"gpus": [[0, UUID0, TOTAL, 600], [1, UUID1, TOTAL, 9000]],
             "apps": [[10, "monitor", 500, UUID0], [2921, "python3", 6000, UUID1], [11, "small", 800, UUID1]]})
    run = local_runner()
    assert foreign_holders(run, (0,)) == []  # 500 MiB: a driver's or a monitor's context
    assert smi.calls("--query-compute-apps") == 0  # no GPU of the slot was over the threshold
    expected = [Holder(1, 6000, 2921, "python3"), Holder(1, 2200)]  # 9000 - 6000 - 800 MiB listed for no one
    assert foreign_holders(run, (1,)) == expected
    assert foreign_holders(run, (UUID1[:12],)) == expected
    assert foreign_holders(run, None) == expected
    assert foreign_holders(run, ()) == []


def test_without_nvidia_smi_nothing_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no nvidia-smi
    assert foreign_holders(local_runner(), None) == []
    assert wait_until_free(local_runner(), None, wait_s=3600) == []


def test_a_stop_request_ends_the_wait_and_nothing_is_launched(smi: StandIn, tmp_path: Path) -> None:
    smi.set(BUSY)
    stop = StopRequest()
    runner = TrialRunner(LocalHost(), PRESETS["custom"], Objective.load_file("quick"), log_dir=tmp_path / "logs",
                         template=f"{sys.executable} -c pass {{port}}", stop=stop, gpu_busy_wait_s=3600)
    when(lambda: smi.calls() >= 2, lambda: stop.request("stopped by the test"))
    result = runner.run(TrialSpec(0, {}, []))
    assert result.outcome == "fault" and result.failure is not None
    assert result.failure.kind == "interrupted"
    assert not (tmp_path / "logs" / "trial-0000.log").exists()  # never launched


# -- (b) a held GPU: every trial a gpu-busy fault, the slot quarantined -------------------------
def test_a_held_gpu_faults_every_trial_and_quarantines_the_slot(smi: StandIn, tmp_path: Path) -> None:
    smi.set(BUSY)
    cfg = gpu_study(tmp_path, "held", {"mem_fraction_static": MFS}, baseline={"mem_fraction_static": 0.9},
                    trials=5, target={"gpu_busy_wait_s": 0.3}, study={"quarantine_after": 3, "max_fault_retries": 2})
    proc = autotune("study", "start", str(cfg), cwd=tmp_path, check=False)
    assert proc.returncode == 1, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert "infrastructure faults in a row (gpu-busy: GPU 0 holds 136.5 GiB" in last, proc.stderr
    assert "pid 2921 (python3) 136.5 GiB" in last
    trials = show(tmp_path, "held")["trials"]
    assert len(trials) == 3 and trials[0]["baseline"]
    for t in trials:
        assert t["outcome"] == "fault" and t["failure"]["kind"] == "gpu-busy", t
        assert "pid 2921 (python3) 136.5 GiB; waited 0.3 s" in t["failure"]["message"]
    assert not list((tmp_path / "autotune-artifacts" / "logs" / "held").glob("trial-*.log"))  # nothing launched
    study = optuna.load_study(study_name="held", storage=f"sqlite:///{tmp_path}/studies.db")
    (slot,) = study.user_attrs["slots"]
    assert slot["health"] == "quarantined" and "gpu-busy" in slot["reason"] and "pid 2921" in slot["reason"]


# -- (c) the holder leaves during the wait: the trial runs ---------------------------------------
def test_a_holder_that_leaves_during_the_wait_lets_the_trial_run(smi: StandIn, tmp_path: Path) -> None:
    smi.set(BUSY)
    cfg = gpu_study(tmp_path, "leaves", {"mem_fraction_static": MFS}, target={"gpu_busy_wait_s": 240}, study={})
    when(lambda: smi.calls() >= 2, lambda: smi.set(FREE))  # the launch is waiting: the holder exits
    autotune("study", "start", str(cfg), cwd=tmp_path)
    (trial,) = show(tmp_path, "leaves")["trials"]
    assert trial["outcome"] == "ok" and trial["failure"] is None
    assert trial["metrics"]["output_throughput"] > 0
    assert smi.calls() >= 3  # asked while held, and once more when free


# -- (d) an out-of-memory with a holder found after teardown ------------------------------------
def test_an_oom_with_a_foreign_holder_after_teardown_is_a_gpu_busy_fault(smi: StandIn, tmp_path: Path) -> None:
    # Free at launch; held once the server has started (its log exists): the OOM is the holder's.
    log = tmp_path / "autotune-artifacts" / "logs" / "oomb" / "trial-0000.log"
    smi.set({"if_exists": str(log), "then": BUSY, "else": FREE})
    params = {"mem_fraction_static": {**MFS, "default": 0.95},
              "cuda_graph_max_bs": {"type": "int", "low": 8, "high": 1024, "flag": "--cuda-graph-max-bs", "default": 1024}}
    cfg = gpu_study(tmp_path, "oomb", params, target={"gpu_busy_wait_s": 0}, study={"max_fault_retries": 0})
    autotune("study", "start", str(cfg), cwd=tmp_path, check=False)
    trial = show(tmp_path, "oomb")["trials"][0]
    assert trial["outcome"] == "fault", trial
    f = trial["failure"]
    assert f["kind"] == "gpu-busy" and f["cause"] == "oom"
    assert f["message"].startswith("oom while GPU 0 holds 136.5 GiB in processes autotune did not start: "
                                   "pid 2921 (python3) 136.5 GiB")
    assert "CUDA out of memory" in f["excerpt"]


def test_an_oom_with_the_gpus_free_after_teardown_stays_the_configurations(smi: StandIn, tmp_path: Path) -> None:
    params = {"mem_fraction_static": {**MFS, "default": 0.95},
              "cuda_graph_max_bs": {"type": "int", "low": 8, "high": 1024, "flag": "--cuda-graph-max-bs", "default": 1024}}
    cfg = gpu_study(tmp_path, "oomf", params, target={}, study={})
    autotune("study", "start", str(cfg), cwd=tmp_path)
    (trial,) = show(tmp_path, "oomf")["trials"]
    assert trial["outcome"] == "infeasible" and trial["failure"]["kind"] == "oom"
    assert smi.calls() >= 2  # asked before the launch and after the teardown
