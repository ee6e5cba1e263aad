"""A study as a service, for real: `study start --detach` runs the demo study (simulated servers)
as a daemon, `study status` reads it, `study stop` stops it and nothing is left running."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import optuna
import pytest
from optuna.trial import FrozenTrial, TrialState

from autotune.execution.hosts import tagged_pids
from autotune.study.lease import StudyLease, process_start_time
from autotune.study.service import daemon_pid
from autotune.store.storage import open_storage
from tests.helpers.cli import autotune

NAME = "demo"  # the --demo study's name (autotune/config/demo.py)
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
    # open_storage: the detached driver may be creating the database (it retries the race)
    return optuna.load_study(study_name=NAME, storage=open_storage(storage)).get_trials(deepcopy=False)


def _status(tmp: Path, storage: str) -> dict[str, Any]:
    return json.loads(autotune("study", "status", NAME, "--storage", storage, "--json", cwd=tmp).stdout)


def _one_error_line(proc: Any, code: int = 2) -> str:
    assert proc.returncode == code, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


@pytest.fixture
def tmp(tmp_path: Path) -> Iterator[Path]:
    """The test's folder; whatever a failed test left running (the daemon, its servers) is killed."""
    yield tmp_path
    pid = daemon_pid(tmp_path / "autotune-artifacts" / "daemons" / f"{NAME}.pid")
    if pid is not None:
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
    start = ("study", "start", "--demo", "--detach", "--trials", "50", *st)
    out = autotune(*start, cwd=tmp, timeout=90).stdout
    daemons = tmp / "autotune-artifacts" / "daemons"
    pid = int((daemons / f"{NAME}.pid").read_text())
    assert (daemons / f"{NAME}.log").is_file()
    # The daemon runs the same command, every option passed on, less --detach.
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    assert argv[argv.index("start") + 1:-1] == ["--demo", f"--storage={storage}", "--trials=50"], argv
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

    def serving() -> FrozenTrial | None:
        """A RUNNING trial whose server was launched (it or a later one is running when the stop comes)."""
        return next((t for t in _trials(storage) if t.state == TrialState.RUNNING and t.user_attrs.get("server_tag")),
                    None)

    # Stop: what runs is torn down and recorded as interrupted, its servers gone, the lease free.
    # A stop that comes between two trials (a few % of the time) interrupts none: then the study is
    # started again and stopped again.
    numbers: list[int] = []
    for _ in range(3):
        _eventually("a trial with its server launched", serving)
        stopped = autotune("study", "stop", NAME, *st, "--timeout", "60", cwd=tmp, timeout=90).stdout
        m = re.search(rf"study {NAME} stopped: (\d+) trials? interrupted(?: \(([\d, ]+)\))?", stopped)
        assert m, stopped
        numbers = [int(n) for n in (m.group(2) or "").split(", ") if n]
        assert len(numbers) == int(m.group(1)), stopped
        if numbers:
            break
        _eventually("the daemon to exit", lambda gone=pid: None if process_start_time(gone) else True, 30)
        autotune(*start, cwd=tmp, timeout=90)
        pid = int((daemons / f"{NAME}.pid").read_text())
    assert numbers, "each of 3 stops came between two trials"
    assert StudyLease(open_storage(storage), NAME).current() is None
    trials = {t.number: t for t in _trials(storage)}
    for n in numbers:
        assert trials[n].state == TrialState.FAIL and trials[n].user_attrs["failure_kind"] == "interrupted"
        tag = trials[n].user_attrs.get("server_tag")  # none when stopped before its launch
        assert tag is None or tagged_pids(tag) == []
        assert any(t.state == TrialState.WAITING and t.user_attrs.get("retry_of") == n  # run again later
                   for t in trials.values())
    assert not any(t.state == TrialState.RUNNING for t in trials.values())
    assert not any(tagged_pids(t.user_attrs["server_tag"])  # no server of the study is left
                   for t in trials.values() if t.user_attrs.get("server_tag"))
    _eventually("the daemon to exit", lambda: None if process_start_time(pid) else True, 30)

    # Stopping a stopped study is fine; status says it is not running.
    again = autotune("study", "stop", NAME, *st, cwd=tmp)
    assert again.stdout.strip() == f"study {NAME} is not running"
    doc = _status(tmp, storage)
    # Its pid file is left, stale: no daemon is reported.
    assert (daemons / f"{NAME}.pid").is_file() and not doc["running"]
    assert doc["running_trials"] == [] and doc["daemon"] is None
    assert doc["stop_requested"]["at"] > 0


def test_detach_reports_a_bad_start_in_the_foreground(tmp: Path) -> None:
    # A config that does not load fails before anything is started or written.
    proc = autotune("study", "start", str(tmp / "nope.yaml"), "--detach", cwd=tmp, check=False)
    assert "not found" in _one_error_line(proc)
    assert not (tmp / "autotune-artifacts").exists()
    # So does a bad override: every option is checked as without --detach.
    st = ("--storage", f"sqlite:///{tmp}/s.db")
    proc = autotune("study", "start", "--demo", "--detach", "--seed", "-1", *st, cwd=tmp, check=False)
    line = _one_error_line(proc)
    assert "seed" in line and "exited with code" not in line
    proc = autotune("study", "start", "--demo", "--detach", "--address", "auto", *st, cwd=tmp, check=False)
    assert "--executor ray" in _one_error_line(proc)
    assert not (tmp / "autotune-artifacts").exists()
    # What only the driver checks (here the baseline's study) comes back from the daemon: its line, its code.
    proc = autotune("study", "start", "--demo", "--detach", "--baseline-from", "nope", *st, cwd=tmp, check=False)
    line = _one_error_line(proc)
    assert "exited with code 2 before it started" in line and "no study named 'nope'" in line and "demo.log" in line
    assert not (tmp / "autotune-artifacts" / "daemons" / f"{NAME}.pid").exists()
