"""A study as a service, for real: `study start --detach` runs the demo study (simulated servers)
as a daemon, `study status` reads it, `study stop` stops it and nothing is left running."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

import optuna
import pytest
from optuna.trial import FrozenTrial, TrialState

from autotune.hosts import tagged_pids
from autotune.lease import StudyLease
from autotune.storage import open_storage
from tests.test_study import autotune

NAME = "demo"  # the --demo study's name (autotune/demo.py)
T = TypeVar("T")


def _eventually(what: str, probe: Callable[[], T | None], timeout_s: float = 120) -> T:
    """Poll ``probe`` until it returns something (a guard against hangs, not a timing assertion)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = probe()
        if found is not None:
            return found
        time.sleep(0.3)
    raise AssertionError(f"gave up waiting for {what} after {timeout_s:.0f}s")


def _trials(storage: str) -> list[FrozenTrial]:
    return optuna.load_study(study_name=NAME, storage=storage).get_trials(deepcopy=False)


def _status(tmp: Path, storage: str) -> dict[str, Any]:
    return json.loads(autotune("study", "status", NAME, "--storage", storage, "--json", cwd=tmp).stdout)


def _one_error_line(proc: Any, code: int = 2) -> str:
    assert proc.returncode == code, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


def _pid_alive(pid: int) -> bool:
    """A live, non-zombie process ``pid``."""
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


@pytest.fixture
def tmp(tmp_path: Path) -> Iterator[Path]:
    """The test's folder; whatever a failed test left running (the daemon, its servers) is killed."""
    yield tmp_path
    pid_file = tmp_path / "autotune-artifacts" / "daemons" / f"{NAME}.pid"
    if pid_file.is_file():
        pid = int(pid_file.read_text())
        if _pid_alive(pid) and b"autotune" in Path(f"/proc/{pid}/cmdline").read_bytes():
            os.kill(pid, signal.SIGKILL)
    if (tmp_path / "s.db").is_file():
        for t in _trials(f"sqlite:///{tmp_path}/s.db"):
            for pid in tagged_pids(str(t.user_attrs.get("server_tag") or "-")):
                os.kill(pid, signal.SIGKILL)


def test_detach_status_stop(tmp: Path) -> None:
    storage = f"sqlite:///{tmp}/s.db"
    st = ("--storage", storage)

    # Unknown studies: one line, exit 2 (no database yet, and nothing created by looking).
    assert "no study named" in _one_error_line(autotune("study", "status", NAME, *st, cwd=tmp, check=False))
    assert not (tmp / "s.db").exists()

    # --detach returns at once (the driver holds the lease), leaving a pid file and a log.
    out = autotune("study", "start", "--demo", "--detach", "--trials", "50", *st, cwd=tmp, timeout=90).stdout
    daemons = tmp / "autotune-artifacts" / "daemons"
    pid = int((daemons / f"{NAME}.pid").read_text())
    assert (daemons / f"{NAME}.log").is_file()
    assert f"pid {pid}" in out and str(daemons / f"{NAME}.log") in out
    assert f"autotune study status {NAME}" in out and f"autotune study stop {NAME}" in out

    doc = _status(tmp, storage)
    assert doc["running"] and doc["driver"]["pid"] == pid and doc["driver"]["alive"]
    assert doc["daemon"] == {"pid": pid, "pid_file": str(daemons / f"{NAME}.pid"),
                             "log": str(daemons / f"{NAME}.log"), "running": True}

    # A second --detach of the running study is refused in the foreground, naming the driver.
    again = autotune("study", "start", "--demo", "--detach", *st, cwd=tmp, check=False)
    assert f"pid {pid}" in _one_error_line(again)
    unknown = autotune("study", "stop", "unknown", *st, cwd=tmp, check=False)
    assert "no study named 'unknown'" in _one_error_line(unknown)

    # It runs: a trial finishes, the next one runs; status shows both.
    _eventually("a finished trial", lambda: any(t.state in (TrialState.COMPLETE, TrialState.PRUNED)
                                                for t in _trials(storage)) or None)
    doc = _status(tmp, storage)
    assert doc["running"] and doc["trials"]["done"] >= 1 and doc["best"] is not None
    assert [s["health"] for s in doc["slots"]] == ["healthy"]
    text = autotune("study", "status", NAME, *st, cwd=tmp).stdout
    assert f"running: pid {pid}" in text and "best: trial" in text and "slot local on local: healthy" in text

    def early_in_a_trial() -> FrozenTrial | None:
        """A RUNNING trial whose server is up and that is far from done (so a stop interrupts it)."""
        for t in _trials(storage):
            phase, since = t.user_attrs.get("phase"), t.user_attrs.get("phase_since")
            if t.state == TrialState.RUNNING and t.user_attrs.get("server_tag") and (
                    phase == "warming" or (phase == "measuring" and time.time() - float(since) < 2)):
                return t
        return None

    running = _eventually("a trial warming up", early_in_a_trial)

    # Stop: the running trial torn down and recorded as interrupted, its server gone, the lease free.
    stopped = autotune("study", "stop", NAME, *st, "--timeout", "60", cwd=tmp, timeout=90)
    assert f"study {NAME} stopped: 1 trial(s) interrupted ({running.number})" in stopped.stdout
    assert StudyLease(open_storage(storage), NAME).current() is None
    trial = next(t for t in _trials(storage) if t.number == running.number)
    assert trial.state == TrialState.FAIL and trial.user_attrs["failure_kind"] == "interrupted"
    assert tagged_pids(running.user_attrs["server_tag"]) == []
    _eventually("the daemon to exit", lambda: None if _pid_alive(pid) else True, 30)
    assert any(t.state == TrialState.WAITING and t.user_attrs.get("retry_of") == running.number  # run again later
               for t in _trials(storage))

    # Stopping a stopped study is fine; status says it is not running.
    again = autotune("study", "stop", NAME, *st, cwd=tmp)
    assert again.stdout.strip() == f"study {NAME} is not running"
    doc = _status(tmp, storage)
    assert not doc["running"] and doc["running_trials"] == [] and doc["daemon"]["running"] is False
    assert doc["stop_requested"]["at"] > 0


def test_detach_reports_a_bad_start_in_the_foreground(tmp: Path) -> None:
    # A config that does not load fails before anything is started or written.
    proc = autotune("study", "start", str(tmp / "nope.yaml"), "--detach", cwd=tmp, check=False)
    assert "not found" in _one_error_line(proc)
    assert not (tmp / "autotune-artifacts").exists()
    # What only the driver checks (here an override) comes back from the daemon: its line, its code.
    proc = autotune("study", "start", "--demo", "--detach", "--seed", "-1", "--storage", f"sqlite:///{tmp}/s.db",
                    cwd=tmp, check=False)
    line = _one_error_line(proc)
    assert "exited with code 2 before it started" in line and "seed" in line and "demo.log" in line
    assert not (tmp / "autotune-artifacts" / "daemons" / f"{NAME}.pid").exists()
