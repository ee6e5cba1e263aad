"""Faults injected for real into running studies: signals, a second driver, a killed driver,
children that leave the process group, a full disk, a read-only artifact folder, a locked
storage. After each: every trial recorded before it is unchanged, no process of the study is
left, and the next trial runs."""

from __future__ import annotations

import os
import signal
import subprocess
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import optuna
import pytest
import yaml

from autotune.execution.hosts import LocalHost, tagged_pids
from autotune.execution.stopping import StopRequest

SCENARIO = "rtx6000-pcie-glm5"
MFS = {"type": "float", "low": 0.5, "high": 0.95, "step": 0.01, "flag": "--mem-fraction-static", "default": 0.92}
MIN_CH = {"type": "int", "low": 1, "high": 32, "env": "NCCL_MIN_NCHANNELS", "default": 8}

# The simulated server behind a launcher that starts a child in a session of its own (as engines'
# worker launchers can) and, with STUBBORN=1, ignores SIGTERM (teardown must escalate to SIGKILL).
# ``--api-key KEY`` is taken off the command line and echoed into the log with HF_TOKEN, as servers
# that print their arguments do; a reference instead of a real value is refused.
LAUNCHER = """
import os, signal, subprocess, sys
if os.environ.get("STUBBORN") == "1":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
args = sys.argv[1:]
if "--api-key" in args:
    i = args.index("--api-key")
    key = args.pop(i + 1); args.pop(i)
    token = os.environ.get("HF_TOKEN", "")
    print(f"launcher: api_key={key} HF_TOKEN={token}", flush=True)
    if key.startswith("${") or token.startswith("${"):
        sys.exit(3)
subprocess.Popen([sys.executable, "-c", "import os, time; os.setsid(); time.sleep(300)"])
sys.exit(subprocess.call([sys.executable, "-m", "autotune.sim", "serve", *args]))
"""


def _autotune(*args: str, cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "autotune", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def _write_study(tmp: Path, name: str, *, trials: int = 1, env: dict[str, str] | None = None,
                 load: dict[str, Any] | None = None, storage: str | None = None,
                 extra: dict[str, Any] | None = None, flags: str = "") -> Path:
    # Run through its #! line, as the `vllm` and `sglang` console scripts are: the kernel rewrites
    # /proc/PID/cmdline to "python launcher.py ...", which is not the argv autotune launched.
    launcher = tmp / "launcher.py"
    launcher.write_text(f"#!{sys.executable}\n{LAUNCHER}")
    launcher.chmod(0o755)
    space = tmp / "space.yaml"
    space.write_text(yaml.safe_dump({"name": "rel", "parameters": {"mem_fraction_static": MFS, "NCCL_MIN_NCHANNELS": MIN_CH}}))
    cfg = tmp / f"{name}.yaml"
    cfg.write_text(yaml.safe_dump({
        "name": name,
        "target": {"engine": "custom", "api": "sglang", "ready_timeout_s": 60,
                   "command": f"{tmp}/launcher.py --scenario {SCENARIO} --host {{host}} --port {{port}}"
                              f" --max-running-requests 128{flags}",
                   "env": {"NCCL_IB_DISABLE": "1", **(env or {})}},
        "space": str(space),
        "objective": "quick",
        "objective_overrides": {"load": load or FAST, "early_stop": False},  # these trials measure to the end
        "budget": {"trials": trials},
        "storage": storage or f"sqlite:///{tmp}/studies.db",
        "seed": 1,
        **(extra or {}),
    }))
    return cfg


FAST = {"concurrency": 16, "num_prompts": 16, "input_len": 16, "output_len": 4, "warmup_prompts": 0}
LONG = {"concurrency": 8, "num_prompts": 40, "input_len": 64, "output_len": 16, "warmup_prompts": 2}
"""A trial long enough (about 10 s) for a signal or a second driver to arrive while it runs."""


@pytest.fixture(scope="module")
def done_study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding study "done" (one measured trial): its storage and artifacts, made once
    for the tests that start from a recorded study (see :func:`_copy_done`)."""
    folder = tmp_path_factory.mktemp("done")
    cfg = _write_study(folder, "done", trials=1)
    proc = _autotune("study", "start", str(cfg), cwd=folder)
    assert proc.returncode == 0, proc.stderr
    return folder


def _copy_done(done: Path, tmp: Path, db_folder: Path | None = None) -> Path:
    """Study "done" copied into ``tmp`` (its database and artifacts into ``db_folder``, default
    ``tmp``), with a config pointing there; returns the config."""
    folder = db_folder or tmp
    cfg = _write_study(tmp, "done", trials=1, storage=f"sqlite:///{folder}/studies.db")
    shutil.copy2(done / "studies.db", folder / "studies.db")
    shutil.copytree(done / "autotune-artifacts", folder / "autotune-artifacts")
    return cfg


def _trials(tmp: Path, name: str, storage: str | None = None) -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name=name, storage=storage or f"sqlite:///{tmp}/studies.db").get_trials()


def _wait_for_server(tmp: Path, name: str, driver: subprocess.Popen[bytes], timeout: float = 90) -> optuna.trial.FrozenTrial:
    """The RUNNING trial once its server is launched (its tag recorded)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert driver.poll() is None, f"driver exited with {driver.returncode}"
        try:
            running = [t for t in _trials(tmp, name) if t.state == optuna.trial.TrialState.RUNNING]
        except KeyError:
            running = []
        if running and running[0].user_attrs.get("server_tag"):
            return running[0]
        time.sleep(0.2)
    raise AssertionError("the driver never launched a server")


_STARTED: list[subprocess.Popen[bytes]] = []


def _start(cfg: Path, cwd: Path, *args: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-m", "autotune", "study", "start", str(cfg), *args], cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _STARTED.append(proc)
    return proc


@pytest.fixture(autouse=True)
def _no_driver_left_behind() -> Iterator[None]:
    """A failed test must not leave its drivers (and their servers) running: SIGTERM each driver
    still alive (its own teardown stops its server), SIGKILL it if that does not end it."""
    yield
    while _STARTED:
        proc = _STARTED.pop()
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate(timeout=10)


def _wait_for_tree(tag: str, size: int = 3) -> None:
    """Wait until the launch has its whole tree (launcher, server, the child in its own session):
    the tag is recorded as soon as the launcher starts, before it has started the others."""
    deadline = time.monotonic() + 60
    while len(tagged_pids(tag)) < size and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(tagged_pids(tag)) >= size


def _assert_gone(tag: str) -> None:
    """No process of the launch is left (a zombie reaped late does not count: it holds nothing)."""
    deadline = time.monotonic() + 10
    while tagged_pids(tag) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert tagged_pids(tag) == []


@pytest.mark.parametrize(
    ("signals", "stubborn"),
    [([signal.SIGTERM], False), ([signal.SIGHUP], False), ([signal.SIGINT], False),
     ([signal.SIGINT, signal.SIGINT], True)],
    ids=["sigterm", "sighup", "sigint", "sigint-twice-stubborn-server"],
)
def test_a_signal_tears_the_server_down_and_requeues_the_trial(tmp_path: Path, signals: list[int], stubborn: bool) -> None:
    cfg = _write_study(tmp_path, "sig", trials=2, env={"STUBBORN": "1" if stubborn else "0"}, load=LONG)
    driver = _start(cfg, tmp_path)
    trial = _wait_for_server(tmp_path, "sig", driver)
    tag = trial.user_attrs["server_tag"]
    _wait_for_tree(tag)
    time.sleep(1.0)
    for sig in signals:
        driver.send_signal(sig)
        time.sleep(0.3)
    _, err = driver.communicate(timeout=60)
    assert driver.returncode == 128 + signals[0], err.decode()
    assert b"Traceback" not in err
    _assert_gone(tag)
    trials = _trials(tmp_path, "sig")
    first = trials[0]
    assert first.state == optuna.trial.TrialState.FAIL
    assert first.user_attrs["outcome"] == "fault" and first.user_attrs["failure_kind"] == "interrupted"
    assert LocalHost().port_free(int(first.user_attrs["port"]))
    # The interrupted baseline is enqueued again, with its parameters and its baseline mark.
    waiting = [t for t in trials if t.state == optuna.trial.TrialState.WAITING]
    assert len(waiting) == 1 and waiting[0].user_attrs.get("baseline") is True
    assert waiting[0].system_attrs["fixed_params"] == first.params


def test_the_interrupted_baseline_runs_on_resume(tmp_path: Path) -> None:
    cfg = _write_study(tmp_path, "base", trials=1, load=LONG)
    driver = _start(cfg, tmp_path)
    _wait_for_server(tmp_path, "base", driver)
    driver.send_signal(signal.SIGTERM)
    driver.communicate(timeout=60)
    assert driver.returncode == 128 + signal.SIGTERM
    proc = _autotune("study", "resume", "base", "--storage", f"sqlite:///{tmp_path}/studies.db", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    trials = _trials(tmp_path, "base")
    assert [t.state.name for t in trials] == ["FAIL", "COMPLETE"]
    assert trials[1].user_attrs["baseline"] is True and trials[1].params == trials[0].params
    assert "(baseline " in proc.stdout or "(the baseline)" in proc.stdout


def test_a_second_driver_is_refused_and_the_first_goes_on(tmp_path: Path) -> None:
    cfg = _write_study(tmp_path, "two", trials=2, load=LONG)
    first = _start(cfg, tmp_path)
    running = _wait_for_server(tmp_path, "two", first)
    second = _autotune("study", "start", str(cfg), cwd=tmp_path)
    assert second.returncode == 2
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1 and "being run by another driver" in lines[0] and f"pid {first.pid}" in lines[0], second.stderr
    out, err = first.communicate(timeout=180)
    assert first.returncode == 0, err.decode()
    trials = _trials(tmp_path, "two")
    assert [t.state.name for t in trials] == ["COMPLETE", "COMPLETE"]
    assert trials[0].number == running.number and trials[0].user_attrs["owner"] == running.user_attrs["owner"]
    _assert_gone(running.user_attrs["server_tag"])


def test_two_drivers_started_at_once_on_a_new_storage(tmp_path: Path) -> None:
    cfg = _write_study(tmp_path, "race", trials=1)
    drivers = [_start(cfg, tmp_path) for _ in range(2)]
    results = [(d.wait(timeout=180), d.stderr.read().decode() if d.stderr else "") for d in drivers]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 2], results
    refused = next(err for code, err in results if code == 2)
    assert "Traceback" not in refused and "being run by another driver" in refused
    trials = _trials(tmp_path, "race")
    assert [t.state.name for t in trials] == ["COMPLETE"]


def test_a_killed_driver_s_servers_are_killed_on_resume_even_outside_its_group(tmp_path: Path) -> None:
    """The server was started through a #! script (its cmdline rewritten by the kernel) and has a
    child in a session of its own: resume finds both by their launch tag."""
    cfg = _write_study(tmp_path, "killed", trials=2, load=LONG)
    driver = _start(cfg, tmp_path)
    trial = _wait_for_server(tmp_path, "killed", driver)
    tag = trial.user_attrs["server_tag"]
    _wait_for_tree(tag)
    driver.send_signal(signal.SIGKILL)
    driver.wait(10)
    pids = tagged_pids(tag)
    assert pids  # the orphaned server and its child are still there...
    cmdlines = [Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:2] for pid in pids]
    assert [sys.executable.encode(), str(tmp_path / "launcher.py").encode()] in cmdlines  # not the argv recorded
    proc = _autotune("study", "resume", "killed", "--storage", f"sqlite:///{tmp_path}/studies.db", "--trials", "1",
                     cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    _assert_gone(tag)  # ...and resume removed them, the child in its own session too
    trials = _trials(tmp_path, "killed")
    assert trials[0].state.name == "FAIL" and trials[0].user_attrs["failure_kind"] == "interrupted"
    assert trials[1].params == trials[0].params and trials[1].state.name == "COMPLETE"


def test_a_resumed_seeded_study_does_not_replay_its_trials(tmp_path: Path) -> None:
    from autotune.search.factory import derived_seed

    assert derived_seed(0, 2) != derived_seed(0, 0) and derived_seed(0, 2) == derived_seed(0, 2)
    assert derived_seed(None, 2) is None

    def run(folder: Path) -> list[dict[str, Any]]:
        cfg = _write_study(folder, "seeded", trials=2, extra={"sampler": "random", "seed": 0})
        assert _autotune("study", "start", str(cfg), cwd=folder).returncode == 0
        assert _autotune("study", "start", str(cfg), "--trials", "3", cwd=folder).returncode == 0
        return [t.params for t in _trials(folder, "seeded")]

    first = run(tmp_path)
    assert len(first) == 3 and first[2] != first[1]  # trial 0 is the baseline; the resume did not replay trial 1
    # Reproducible: the same config over the same history gives the same trials.
    (tmp_path / "again").mkdir()
    assert run(tmp_path / "again") == first


def test_a_stop_request_before_launch_launches_nothing(tmp_path: Path) -> None:
    from autotune.engines.registry import PRESETS
    from autotune.config.objective import Objective
    from autotune.execution.runner import TrialRunner
    from autotune.execution.trial import TrialSpec

    stop = StopRequest()
    stop.request("stopped by test")
    runner = TrialRunner(LocalHost(), PRESETS["custom"], Objective.load_file("quick"), log_dir=tmp_path,
                         template=f"{sys.executable} -c 'import time; time.sleep(60)' {{port}}", stop=stop)
    result = runner.run(TrialSpec(0, {}, []))
    assert result.outcome == "fault" and result.failure is not None and result.failure.kind == "interrupted"
    assert not (tmp_path / "trial-0000.log").exists()


def _mount_tmpfs(path: Path, size: str, *options: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    opts = ",".join([f"size={size}", "mode=0755", *options])
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({proc.stderr.strip() or proc.returncode}): needs root in a "
                    "machine that allows mounts")


def _umount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], capture_output=True)


def test_a_full_log_disk_is_a_fault_not_the_configuration(tmp_path: Path, done_study: Path) -> None:
    """The artifact folder (logs) on a 1 MiB filesystem that is full: every launch is a
    ``disk-full`` fault, the study stops after 3 in a row with exit 1, nothing is blamed on the
    configuration, and the trials recorded before are untouched."""
    cfg = _copy_done(done_study, tmp_path)
    before = [(t.number, t.state, t.value) for t in _trials(tmp_path, "done")]
    artifacts = tmp_path / "autotune-artifacts"
    kept = tmp_path / "kept-artifacts"
    artifacts.rename(kept)
    _mount_tmpfs(artifacts, "1m")
    try:
        with open(artifacts / "filler", "wb") as f:
            try:
                while True:
                    f.write(b"\0" * 65536)
            except OSError:
                pass
        proc = _autotune("study", "start", str(cfg), "--trials", "3", cwd=tmp_path)
    finally:
        _umount(artifacts)
    assert proc.returncode == 1, proc.stderr
    assert "infrastructure faults in a row" in proc.stderr and "disk-full" in proc.stderr
    trials = _trials(tmp_path, "done")
    assert [(t.number, t.state, t.value) for t in trials[: len(before)]] == before
    later = trials[len(before):]
    assert later and all(t.state.name == "FAIL" and t.user_attrs["failure_kind"] == "disk-full" for t in later)
    assert not any(t.user_attrs.get("outcome") == "infeasible" for t in trials)


def test_a_read_only_artifact_folder_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path}/db/studies.db"
    (tmp_path / "db").mkdir()
    cfg = _write_study(tmp_path, "ro", trials=1, storage=storage)
    _mount_tmpfs(tmp_path / "db" / "autotune-artifacts", "1m", "ro")
    try:
        proc = _autotune("study", "start", str(cfg), cwd=tmp_path)
    finally:
        _umount(tmp_path / "db" / "autotune-artifacts")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "not writable" in lines[0] and "autotune-artifacts" in lines[0]
    assert not (tmp_path / "db" / "studies.db").exists()


def test_a_briefly_locked_storage_is_waited_for(tmp_path: Path, done_study: Path) -> None:
    """Another process holds an exclusive lock on the SQLite file for a few seconds while a
    study starts: the study waits and runs; nothing is lost."""
    cfg = _copy_done(done_study, tmp_path)
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sqlite3, sys, time\n"
        f"c = sqlite3.connect({str(tmp_path / 'studies.db')!r}, isolation_level=None)\n"
        "c.execute('BEGIN EXCLUSIVE'); print('locked', flush=True); time.sleep(4); c.execute('COMMIT')\n")],
        stdout=subprocess.PIPE)
    assert holder.stdout is not None and holder.stdout.readline().strip() == b"locked"
    proc = _autotune("study", "start", str(cfg), "--trials", "2", cwd=tmp_path)
    holder.wait(30)
    assert proc.returncode == 0, proc.stderr
    trials = _trials(tmp_path, "done")
    assert len(trials) == 2 and all(t.user_attrs["outcome"] in ("ok", "infeasible") for t in trials)


def test_files_the_tool_creates_are_private(tmp_path: Path) -> None:
    cfg = _write_study(tmp_path, "perm", trials=1)
    assert _autotune("study", "start", str(cfg), cwd=tmp_path).returncode == 0
    db = tmp_path / "studies.db"
    assert db.stat().st_mode & 0o777 == 0o600
    artifacts = tmp_path / "autotune-artifacts"
    for path in [artifacts, *artifacts.rglob("*")]:
        want = 0o700 if path.is_dir() else 0o600
        assert path.stat().st_mode & 0o777 == want, path


HF_TOKEN = "hf_SeCrEtVaLuE0123456789"
API_KEY = "sk-AnOtHeRsEcReT987654321"


def test_secrets_are_stored_shown_and_exported_only_as_references(tmp_path: Path) -> None:
    cfg = _write_study(tmp_path, "sec", trials=1, env={"HF_TOKEN": HF_TOKEN}, flags=f" --api-key {API_KEY}")
    storage = f"sqlite:///{tmp_path}/studies.db"
    started = _autotune("study", "start", str(cfg), cwd=tmp_path)
    assert started.returncode == 0, started.stderr
    (trial,) = _trials(tmp_path, "sec")
    assert trial.user_attrs["outcome"] == "ok"  # the server got the real values (else the launcher exits 3)
    outputs = [started.stdout, started.stderr]
    for args in (("study", "show", "sec", "--json"), ("study", "best", "sec", "--json"),
                 ("export", "sec", "--format", "sh"), ("export", "sec", "--format", "env"),
                 ("export", "sec", "--format", "json"), ("export", "sec", "--format", "yaml")):
        proc = _autotune(*args, "--storage", storage, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        outputs += [proc.stdout, proc.stderr]
    written = [(tmp_path / "studies.db").read_bytes()] + [p.read_bytes() for p in (tmp_path / "autotune-artifacts").rglob("*")
                                                          if p.is_file()]
    for secret in (HF_TOKEN, API_KEY):
        assert not any(secret in text for text in outputs)
        assert not any(secret.encode() in data for data in written)
    assert trial.user_attrs["env"]["HF_TOKEN"] == "${HF_TOKEN}" and "${API_KEY}" in trial.user_attrs["argv"]
    log = next((tmp_path / "autotune-artifacts" / "logs" / "sec").glob("trial-*.log")).read_text()
    assert "launcher: api_key=${API_KEY} HF_TOKEN=${HF_TOKEN}" in log
    profile = _autotune("export", "sec", "--format", "sh", "--storage", storage, cwd=tmp_path).stdout
    assert "${HF_TOKEN" in profile and "${API_KEY" in profile
    # Resuming needs the secrets from the environment: refused (one line, naming it) without them...
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "API_KEY")}
    refused = subprocess.run([sys.executable, "-m", "autotune", "study", "resume", "sec", "--storage", storage,
                              "--trials", "2"], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=120)
    assert refused.returncode == 2 and "HF_TOKEN" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
    assert len(_trials(tmp_path, "sec")) == 1
    # ...and runs with them, the server again getting the real values.
    resumed = subprocess.run([sys.executable, "-m", "autotune", "study", "resume", "sec", "--storage", storage,
                              "--trials", "2"], cwd=tmp_path, capture_output=True, text=True, timeout=240,
                             env={**env, "HF_TOKEN": HF_TOKEN, "API_KEY": API_KEY})
    assert resumed.returncode == 0, resumed.stderr
    trials = _trials(tmp_path, "sec")
    assert len(trials) == 2 and trials[1].user_attrs["outcome"] in ("ok", "infeasible")
    assert trials[1].user_attrs.get("failure_kind") != "crash"
    assert HF_TOKEN.encode() not in (tmp_path / "studies.db").read_bytes()


def test_a_storage_disk_without_room_stops_the_study_before_the_next_trial(tmp_path: Path, done_study: Path) -> None:
    """The study's database moved onto a small filesystem (8 MiB, less than a trial needs free):
    the driver stops before launching anything, in one line with exit 1, and the trials
    recorded before are unchanged."""
    (tmp_path / "small").mkdir()
    cfg = _copy_done(done_study, tmp_path, tmp_path / "small")
    before = [(t.number, t.state, t.value, t.params) for t in _trials(tmp_path, "done", f"sqlite:///{tmp_path}/small/studies.db")]
    kept = tmp_path / "kept"
    (tmp_path / "small").rename(kept)
    _mount_tmpfs(tmp_path / "small", "8m")
    try:
        subprocess.run(["cp", "-a", f"{kept}/.", str(tmp_path / "small")], check=True)
        proc = _autotune("study", "start", str(cfg), "--trials", "3", cwd=tmp_path)
        after = [(t.number, t.state, t.value, t.params)
                 for t in _trials(tmp_path, "done", f"sqlite:///{tmp_path}/small/studies.db")]
    finally:
        _umount(tmp_path / "small")
    assert proc.returncode == 1, proc.stderr
    assert "free under the storage's folder" in proc.stderr and "Traceback" not in proc.stderr
    assert after == before


@pytest.mark.parametrize("change", ["direction", "parameter-type", "parameter-added", "range"])
def test_reusing_a_study_name_for_another_study_is_refused(tmp_path: Path, done_study: Path, change: str) -> None:
    cfg = _copy_done(done_study, tmp_path)
    before = [(t.number, t.state, t.value, t.params) for t in _trials(tmp_path, "done")]
    data = yaml.safe_load(cfg.read_text())
    space = yaml.safe_load((tmp_path / "space.yaml").read_text())
    if change == "direction":
        (tmp_path / "min.yaml").write_text(yaml.safe_dump({"name": "min", "metric": "median_ttft_ms", "direction": "minimize"}))
        data["objective"] = str(tmp_path / "min.yaml")
        data.pop("objective_overrides")
    elif change == "parameter-type":
        space["parameters"]["NCCL_MIN_NCHANNELS"] = {"type": "categorical", "choices": [1, 8], "env": "NCCL_MIN_NCHANNELS", "default": 8}
    elif change == "parameter-added":
        space["parameters"]["NCCL_MAX_NCHANNELS"] = {**MIN_CH, "env": "NCCL_MAX_NCHANNELS", "default": 16}
    else:
        space["parameters"]["mem_fraction_static"] = {**MFS, "low": 0.6}
    (tmp_path / "space2.yaml").write_text(yaml.safe_dump(space))
    data["space"] = str(tmp_path / "space2.yaml")
    cfg.write_text(yaml.safe_dump(data))
    proc = _autotune("study", "start", str(cfg), "--trials", "2", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "study 'done'" in lines[0] and "another --name" in lines[0], proc.stderr
    assert [(t.number, t.state, t.value, t.params) for t in _trials(tmp_path, "done")] == before


def _raw_secrets(folders: list[Path], secrets: tuple[str, ...]) -> list[str]:
    """Each file under ``folders`` (and each file given) that holds a raw secret value."""
    files = [f for d in folders for f in ([d] if d.is_file() else d.rglob("*")) if f.is_file()]
    return [f"{f}: {s[:6]}..." for f in files for s in secrets if s.encode() in f.read_bytes()]


def test_a_driver_killed_mid_trial_leaves_no_raw_secret_and_a_refused_resume_tears_its_server_down(tmp_path: Path) -> None:
    """Secrets in target.env (HF_TOKEN) and the command (--api-key), echoed by the server into its
    log: the log is redacted as it is written, so a SIGKILL of the driver while the trial runs
    leaves no raw value in the storage or the artifacts; a resume refused for the missing secret
    kills the server the dead driver left, and a resume with it set leaves nothing raw either."""
    cfg = _write_study(tmp_path, "ksec", trials=2, load=LONG, env={"HF_TOKEN": HF_TOKEN}, flags=f" --api-key {API_KEY}")
    storage = f"sqlite:///{tmp_path}/studies.db"
    driver = _start(cfg, tmp_path)
    trial = _wait_for_server(tmp_path, "ksec", driver)
    tag = trial.user_attrs["server_tag"]
    _wait_for_tree(tag)
    log = tmp_path / "autotune-artifacts" / "logs" / "ksec" / f"trial-{trial.number:04d}.log"
    deadline = time.monotonic() + 60
    while "launcher: api_key=" not in (log.read_text() if log.exists() else "") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "launcher: api_key=${API_KEY} HF_TOKEN=${HF_TOKEN}" in log.read_text()  # redacted while it runs
    driver.send_signal(signal.SIGKILL)
    driver.wait(10)
    study_files = [tmp_path / "studies.db", tmp_path / "autotune-artifacts"]
    assert _raw_secrets(study_files, (HF_TOKEN, API_KEY)) == []
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "API_KEY")}
    refused = subprocess.run([sys.executable, "-m", "autotune", "study", "resume", "ksec", "--storage", storage],
                             cwd=tmp_path, capture_output=True, text=True, env=env, timeout=120)
    assert refused.returncode == 2 and "HF_TOKEN" in refused.stderr, refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    _assert_gone(tag)  # the dead driver's server, killed by the refused resume
    resumed = subprocess.run([sys.executable, "-m", "autotune", "study", "resume", "ksec", "--storage", storage],
                             cwd=tmp_path, capture_output=True, text=True, timeout=300,
                             env={**env, "HF_TOKEN": HF_TOKEN, "API_KEY": API_KEY})
    assert resumed.returncode == 0, resumed.stderr
    trials = _trials(tmp_path, "ksec")
    assert trials[0].user_attrs["failure_kind"] == "interrupted" and trials[-1].state.name == "COMPLETE"
    assert _raw_secrets(study_files, (HF_TOKEN, API_KEY)) == []


def _fill(folder: Path) -> None:
    """Fill the filesystem of ``folder`` to the last byte with one file, ``filler``."""
    fd = os.open(folder / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (1 << 20, 65536, 4096, 512, 1):
            try:
                while os.write(fd, b"\0" * size):
                    pass
            except OSError:
                pass
    finally:
        os.close(fd)


@pytest.mark.parametrize("failure", ["deleted", "read-only", "full"])
def test_a_storage_that_fails_mid_trial_tears_the_server_down_in_one_line(tmp_path: Path, failure: str) -> None:
    """The database (on a tmpfs of its own, with the logs) deleted, remounted read-only or filled
    while a trial runs: the driver tears the server down and exits 1 with one line; the trial
    stays RUNNING in a database that is still there, and a resume, once it can write, recovers it
    and runs its parameters again."""
    store = tmp_path / "store"
    _mount_tmpfs(store, "100m")
    try:
        cfg = _write_study(tmp_path, "sf", trials=2, load=LONG, storage=f"sqlite:///{store}/studies.db")
        driver = _start(cfg, tmp_path)
        trial = _wait_for_running(store, driver)
        tag = trial.user_attrs["server_tag"]
        _wait_for_tree(tag)
        if failure == "deleted":
            (store / "studies.db").unlink()
        elif failure == "read-only":
            # A read-only mount over the folder: new files (SQLite's journal) cannot be made; the
            # files open already stay as they were (a remount of the tmpfs itself is refused as busy).
            subprocess.run(["mount", "--bind", str(store), str(store)], check=True)
            subprocess.run(["mount", "-o", "remount,bind,ro", str(store)], check=True)
        else:
            _fill(store)
        _, err = driver.communicate(timeout=300)
        lines = [line for line in err.decode().splitlines() if line.startswith("autotune: error:")]
        assert driver.returncode == 1, err.decode()
        assert "Traceback" not in err.decode() and len(lines) == 1, err.decode()
        assert lines[0].startswith("autotune: error: storage error, study stopped (its running trials torn down): ")
        _assert_gone(tag)
        if failure == "deleted":
            return  # nothing is left to recover: the server is gone, which is what matters
        if failure == "read-only":
            _umount(store)  # the read-only mount over it
        else:
            (store / "filler").unlink()
        assert _trials(store, "sf")[trial.number].state.name == "RUNNING"  # recorded as it was
        resumed = _autotune("study", "resume", "sf", "--storage", f"sqlite:///{store}/studies.db", cwd=tmp_path)
        assert resumed.returncode == 0, resumed.stderr
        trials = _trials(store, "sf")
        assert trials[trial.number].user_attrs["failure_kind"] == "interrupted"
        assert any(t.params == trials[trial.number].params and t.state.name == "COMPLETE" for t in trials)
    finally:
        _umount(store)


def _wait_for_running(store: Path, driver: subprocess.Popen[bytes]) -> optuna.trial.FrozenTrial:
    """The RUNNING trial (its server launched) of study "sf" stored under ``store``."""
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        assert driver.poll() is None, f"driver exited with {driver.returncode}"
        try:
            running = [t for t in _trials(store, "sf") if t.state == optuna.trial.TrialState.RUNNING]
        except KeyError:
            running = []
        if running and running[0].user_attrs.get("server_tag"):
            return running[0]
        time.sleep(0.2)
    raise AssertionError("the driver never launched a server")
