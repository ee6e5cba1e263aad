"""The Ray executor against a real multi-node Ray cluster on this machine.

Each node is a real ``ray start`` advertising one ``autotune_slot:<name>``
(:class:`autotune.testing.ray_cluster.LocalRayCluster`), with Ray 2.60's token authentication on.
The server behind every slot is the simulated host; the driver is the real ``autotune study
start`` process. No wall-clock bounds: the waits below are guards against a hang only.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterator

import optuna
import pytest

from autotune.config.study import StudyConfig
from autotune.config.demo import DEMO_CONFIG
from autotune.execution.hosts import tagged_pids
from autotune.config.objective import Objective
from autotune.execution.trial import TrialSpec
from autotune.execution.slots import Slot, SlotPool, host_slots, ray_slots
from autotune.testing.ray_cluster import LocalRayCluster
from tests.helpers.cli import autotune

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalRayCluster]:
    with LocalRayCluster(["a", "b", "c"]) as c:
        yield c


def _study(storage: str, name: str) -> optuna.Study:
    return optuna.load_study(study_name=name, storage=storage)


def _ran(t: optuna.trial.FrozenTrial) -> tuple[float, float]:
    """When a trial ran on its slot: its runner's own duration, back from when it was told (the
    trial's datetime_start is when it was asked, before it waited for a slot)."""
    end = t.datetime_complete.timestamp()  # type: ignore[union-attr]
    return end - float(t.user_attrs["duration_s"]), end


def _side_by_side(trials: list[optuna.trial.FrozenTrial]) -> list[tuple[int, int]]:
    """Pairs of trials whose runs overlapped."""
    spans = sorted((_ran(t), t.number) for t in trials if t.datetime_complete and "duration_s" in t.user_attrs)
    return [(n, m) for i, ((_, end), n) in enumerate(spans) for (start, _), m in spans[i + 1:] if start < end]


def test_a_study_runs_one_trial_per_slot_at_once(cluster: LocalRayCluster, tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path}/r.db"
    autotune("study", "start", "--demo", "--name", "par", "--storage", storage, "--trials", "6", "--seed", "3",
             "--executor", "ray", "--address", cluster.address, cwd=tmp_path, timeout=500)
    study = _study(storage, "par")
    done = [t for t in study.trials if t.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)]
    assert len(done) == 6, [(t.number, t.state, t.user_attrs.get("failure_message")) for t in study.trials]
    slots = {t.user_attrs["slot"] for t in study.trials}
    assert slots == {"a", "b", "c"}, slots
    assert {t.user_attrs["niceness"] for t in study.trials} == {0}  # not Ray's worker niceness
    overlapping = _side_by_side(study.trials)
    assert overlapping  # the slots ran trials at the same time, not one after another
    # Trials that ran side by side were asked for different points.
    for n, m in overlapping:
        assert study.trials[n].params != study.trials[m].params, (n, m)
    # Only the driver writes the storage, yet every trial's log came back to it from its node.
    logs = tmp_path / "autotune-artifacts" / "logs" / "par"
    for t in study.trials:
        assert t.user_attrs.get("log_artifact"), t.number
        assert "sim" in (logs / f"trial-{t.number:04d}.log").read_text().lower()
    health = {s["name"]: s["health"] for s in study.user_attrs["slots"]}
    assert health == {"a": "healthy", "b": "healthy", "c": "healthy"}


def _when(driver: subprocess.Popen[str], storage: str, name: str,
          pick: Callable[[list[optuna.trial.FrozenTrial]], list[optuna.trial.FrozenTrial]],
          act: Callable[[], None]) -> list[optuna.trial.FrozenTrial]:
    """Poll the study's RUNNING trials until ``pick`` chooses some, then ``act`` once; returns
    what it chose ([] if the driver ended first). The loop bound guards against a hang only."""
    for _ in range(1500):
        if driver.poll() is not None:
            return []
        try:
            study = _study(storage, name)
        except KeyError:
            time.sleep(0.2)
            continue
        chosen = pick(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)))
        if chosen:
            act()
            return chosen
        time.sleep(0.2)
    return []


def _two_launched(trials: list[optuna.trial.FrozenTrial]) -> list[optuna.trial.FrozenTrial]:
    launched = [t for t in trials if t.user_attrs.get("server_tag")]
    return launched if len(launched) >= 2 else []


def test_sigterm_stops_every_running_trial_on_the_cluster(cluster: LocalRayCluster, tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path}/t.db"
    driver = subprocess.Popen(
        [sys.executable, "-m", "autotune", "study", "start", "--demo", "--name", "term", "--storage", storage,
         "--trials", "30", "--executor", "ray", "--address", cluster.address],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        running = _when(driver, storage, "term", _two_launched, lambda: driver.send_signal(signal.SIGTERM))
        _, err = driver.communicate(timeout=300)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert len(running) >= 2, err
    assert driver.returncode == 128 + signal.SIGTERM, err
    study = _study(storage, "term")
    assert not study.get_trials(states=(optuna.trial.TrialState.RUNNING,))
    for t in running:
        after = study.trials[t.number]
        assert after.state == optuna.trial.TrialState.FAIL and after.user_attrs["failure_kind"] == "interrupted"
        assert tagged_pids(t.user_attrs["server_tag"]) == []
        # ... and its parameters wait in the study for the next start.
        assert any(w.user_attrs.get("retry_of") == t.number for w in study.get_trials(
            states=(optuna.trial.TrialState.WAITING,)))


def test_ssh_hosts_are_the_slots_under_ray_and_an_unreachable_one_stops_the_study(cluster: LocalRayCluster,
                                                                                  tmp_path: Path) -> None:
    cfg = tmp_path / "s.yaml"
    cfg.write_text(json.dumps({**DEMO_CONFIG, "name": "noslot", "storage": f"sqlite:///{tmp_path}/n.db",
                               "executor": "ray", "ray": {"address": cluster.address},
                               "target": {**DEMO_CONFIG["target"], "hosts": ["ssh://nobody@127.0.0.1:1"]}}))
    proc = autotune("study", "start", str(cfg), "--trials", "1", cwd=tmp_path, check=False, timeout=300)
    # The SSH host is the slot (its task runs on any node): the unreachable host is a fault per
    # trial until its slot is quarantined, and with no healthy slot left the study stops.
    assert proc.returncode == 1, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert "infrastructure faults in a row (host-unreachable" in last, proc.stderr
    study = _study(f"sqlite:///{tmp_path}/n.db", "noslot")
    assert [t.user_attrs["failure_kind"] for t in study.trials] == ["host-unreachable"] * 3
    assert study.user_attrs["slots"][0]["health"] == "quarantined"


def test_a_slot_no_node_offers_is_a_fault_not_a_hang(cluster: LocalRayCluster, tmp_path: Path) -> None:
    """A trial submitted to a slot whose node is gone comes back as slot-unavailable. Kills node
    c of the module's cluster (the tests above need all three)."""
    from autotune.execution.ray_executor import RayExecutor

    cfg = StudyConfig.from_mapping({**DEMO_CONFIG, "storage": f"sqlite:///{tmp_path}/g.db",
                                    "ray": {"address": cluster.address, "schedule_timeout_s": 3600}})
    objective = Objective.load_file(cfg.objective, cfg.objective_overrides)
    executor = RayExecutor(cfg, objective, log_dir=tmp_path / "logs")
    try:
        assert [s.name for s in executor.slots()] == ["a", "b", "c"]
        cluster.kill_node("c")
        slot_c = next(s for s in executor.slots() if s.name == "c")
        phases: list[str] = []
        executor.submit(TrialSpec(0, env={}, args=[]), slot_c, lambda p, d: phases.append(p))
        finished = []
        for _ in range(600):  # guard only: the resource check runs every 2 s
            finished = executor.wait(1.0)
            if finished:
                break
        assert len(finished) == 1
        result = finished[0].result
        assert result.outcome == "fault" and result.failure is not None
        assert result.failure.kind == "slot-unavailable", result.failure
        assert "autotune_slot:c" in result.failure.message
        assert phases == []  # it never started
    finally:
        executor.close()


def test_a_killed_node_quarantines_its_slot_and_the_trial_runs_elsewhere(cluster: LocalRayCluster,
                                                                         tmp_path: Path) -> None:
    """Kills node b (after the test above killed c, if it ran): the module's last use of it."""
    storage = f"sqlite:///{tmp_path}/k.db"
    driver = subprocess.Popen(
        [sys.executable, "-m", "autotune", "study", "start", "--demo", "--name", "kill", "--storage", storage,
         "--trials", "3", "--seed", "4", "--executor", "ray", "--address", cluster.address],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        chosen = _when(driver, storage, "kill",
                       lambda ts: [t for t in ts if t.user_attrs.get("slot") == "b" and t.user_attrs.get("server_tag")
                                   and t.user_attrs.get("phase") in ("warming", "measuring", "launching")],
                       lambda: cluster.kill_node("b"))
        victim = chosen[0] if chosen else None
        out, err = driver.communicate(timeout=500)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert victim is not None, "no trial ran on slot b"
    assert driver.returncode == 0, err
    study = _study(storage, "kill")
    killed = study.trials[victim.number]
    assert killed.state == optuna.trial.TrialState.FAIL
    assert killed.user_attrs["failure_kind"] == "node-died", killed.user_attrs
    retry = [t for t in study.trials if t.user_attrs.get("retry_of") == victim.number]
    assert retry and retry[0].user_attrs["slot"] != "b" and retry[0].params == killed.params
    slots = {s["name"]: s for s in study.user_attrs["slots"]}
    assert slots["b"]["health"] == "quarantined" and "node-died" in slots["b"]["reason"]
    assert "b" not in {t.user_attrs.get("slot") for t in study.trials if t.number > retry[0].number}
    finished = [t for t in study.trials if t.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)]
    assert len(finished) == 3
    # The dead node's server did not outlive it.
    assert tagged_pids(killed.user_attrs["server_tag"]) == []


@pytest.mark.parametrize(("args", "message"), [
    (["--address", "127.0.0.1:1"], "--address is for the Ray executor"),
    (["--executor", "dask"], "executor"),
])
def test_bad_executor_options_are_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    proc = autotune("study", "start", "--demo", "--storage", f"sqlite:///{tmp_path}/b.db", *args,
                    cwd=tmp_path, check=False)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


# -- slots, without a cluster ---------------------------------------------------------------
def test_gpu_slots_split_a_host_into_disjoint_groups() -> None:
    slots = host_slots(["ssh://root@gpu1", "ssh://root@gpu2"], host_gpus=8, gpus_per_trial=4)
    assert [(s.host, s.gpus) for s in slots] == [
        ("ssh://root@gpu1", (0, 1, 2, 3)), ("ssh://root@gpu1", (4, 5, 6, 7)),
        ("ssh://root@gpu2", (0, 1, 2, 3)), ("ssh://root@gpu2", (4, 5, 6, 7))]
    assert len({s.name for s in slots}) == 4
    assert slots[1].env() == {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}
    assert host_slots(["local"]) == [Slot("local", "local")] and Slot("local", "local").env() == {}
    cluster = ray_slots({"autotune_slot:n1": 2.0, "autotune_slot:n2": 1.0, "CPU": 8.0}, gpus_per_trial=2)
    assert [(s.resource, s.gpus) for s in cluster] == [
        ("autotune_slot:n1", (0, 1)), ("autotune_slot:n1", (2, 3)), ("autotune_slot:n2", (0, 1))]


def test_a_slot_is_quarantined_after_faults_in_a_row_or_at_once_when_gone() -> None:
    a, b = Slot("a", "local"), Slot("b", "local")
    pool = SlotPool([a, b], quarantine_after=2)
    assert pool.record(a, "fault", "port-busy") == ""
    assert pool.record(a, "ok", None) == ""  # a success resets the count
    assert pool.record(a, "fault", "port-busy") == ""
    assert "2 infrastructure faults in a row (port-busy" in pool.record(a, "fault", "port-busy")
    assert pool.free() == [b] and pool.choose(avoid="b") == b
    assert pool.record(b, "fault", "node-died", "gone").startswith("node-died")
    assert pool.healthy() == []


def test_a_refusing_host_quarantines_all_its_slots_at_once() -> None:
    g0, g1, other = Slot("h[gpu 0]", "ssh://h", (0,)), Slot("h[gpu 1]", "ssh://h", (1,)), Slot("o", "ssh://o")
    pool = SlotPool([g0, g1, other])
    assert pool.record(g0, "fault", "auth-failed", "denied").startswith("auth-failed")
    assert pool.healthy() == [other]  # the host's other GPU slot too: no retry can mend a refusal


def test_parallel_tpe_lies_about_running_trials_and_starts_modelling_on_time() -> None:
    """With N trials in flight TPE counts the running ones as bad (constant liar) and its random
    start-up is N - 1 shorter, so its first modelled ask comes at the serial trial number."""
    from autotune.search.factory import make_sampler
    from autotune.search.samplers import TPE_STARTUP_TRIALS

    serial, parallel = make_sampler("tpe", 0).tpe, make_sampler("tpe", 0, slots=3).tpe
    assert not serial._constant_liar and serial._n_startup_trials == TPE_STARTUP_TRIALS
    assert parallel._constant_liar and parallel._n_startup_trials == TPE_STARTUP_TRIALS - 2
    assert make_sampler("tpe", 0, slots=20).tpe._n_startup_trials == 2


def test_gpu_slots_reach_the_server_as_cuda_visible_devices(tmp_path: Path) -> None:
    """Serial executor over a host declared with 2 GPUs and 1 GPU per trial: two slots, one trial
    at a time on the first, and a trial's server runs with its slot's CUDA_VISIBLE_DEVICES."""
    cfg = tmp_path / "g.yaml"
    cfg.write_text(json.dumps({**DEMO_CONFIG, "name": "gpus", "storage": f"sqlite:///{tmp_path}/g.db",
                               "target": {**DEMO_CONFIG["target"], "host_gpus": 2, "gpus_per_trial": 1}}))
    autotune("study", "start", str(cfg), "--trials", "2", cwd=tmp_path, timeout=300)
    study = _study(f"sqlite:///{tmp_path}/g.db", "gpus")
    assert len(study.trials) == 2
    for t in study.trials:
        assert t.user_attrs["slot"] == "local[gpu 0]" and t.user_attrs["gpus"] == [0]
        assert t.user_attrs["env"]["CUDA_VISIBLE_DEVICES"] == "0"
    assert [s["name"] for s in study.user_attrs["slots"]] == ["local[gpu 0]", "local[gpu 1]"]
