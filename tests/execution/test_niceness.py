"""A server above CPU niceness 0 is recorded and said: it measures less than it will serve with.

A server inherits the niceness of what starts it: the driver (serial trials), or a Ray worker,
which Ray runs at 15 unless told otherwise. The driver here really runs niced (``nice -n 5``),
and for Ray without the capability to lower a niceness again (``setpriv`` drops
``CAP_SYS_NICE``, which root would otherwise have): the fault a user without root meets.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

pytestmark = pytest.mark.timeout(600)

NO_SYS_NICE = ("setpriv", "--bounding-set=-sys_nice", "--inh-caps=-sys_nice")


def _niced_study(tmp_path: Path, trials: int, *, wrap: tuple[str, ...] = (),
                 extra: tuple[str, ...] = ()) -> tuple[subprocess.CompletedProcess[str], list[optuna.trial.FrozenTrial]]:
    storage = f"sqlite:///{tmp_path}/n.db"
    proc = subprocess.run(["nice", "-n", "5", *wrap, sys.executable, "-m", "autotune", "study", "start", "--demo",
                           "--name", "niced", "--storage", storage, "--trials", str(trials), *extra],
                          cwd=tmp_path, capture_output=True, text=True, timeout=500)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc, optuna.load_study(study_name="niced", storage=storage).trials


def test_a_niced_driver_runs_niced_servers_and_says_so_once(tmp_path: Path) -> None:
    proc, trials = _niced_study(tmp_path, 2)
    assert [t.user_attrs["niceness"] for t in trials] == [5, 5]
    assert "the server runs at CPU niceness 5 on local" in proc.stderr, proc.stderr
    assert proc.stderr.count("CPU niceness") == 1  # once per host and niceness, not per trial


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux) to drop CAP_SYS_NICE")
def test_a_ray_worker_that_cannot_lower_its_niceness_is_said(tmp_path: Path) -> None:
    # Ray's worker_niceness 0 (the executor's local cluster) adds nothing to the driver's 5, and
    # without CAP_SYS_NICE the trial's task cannot put itself back at 0.
    proc, (trial,) = _niced_study(tmp_path, 1, wrap=NO_SYS_NICE, extra=("--executor", "ray"))
    assert trial.user_attrs["niceness"] == 5
    assert "the server runs at CPU niceness 5 on local" in proc.stderr, proc.stderr
