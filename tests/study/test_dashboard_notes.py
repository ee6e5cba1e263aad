"""The dashboard shows what the CLI shows: each finished trial's Note reads like ``study show``.

A real study on the simulated host (a trial that serves, one whose NCCL_ALGO=Tree crashes with
an NCCL error, one whose memory fraction crashes with an OOM), recorded without notes as a study
of an older version would be. Its notes are then written as ``autotune dashboard`` writes them
before serving, and read back through optuna-dashboard's own WSGI app; once, the dashboard is
served by ``autotune dashboard`` and looked at in a real headless Chromium, with a screenshot.
"""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import pytest
import requests
from optuna.trial import TrialState

from autotune.util.net import free_port, wait_http_ok
from autotune.study.notes import NOTE_HASH_PREFIX
from tests.helpers.browser import browse, chromium
from tests.helpers.cli import stop_group
from tests.helpers.dashboard import api_trials, wsgi_call
from tests.helpers.sim_study import RECORDED


@dataclass(frozen=True)
class Recorded:
    """A finished real study's storage (SQLite file and artifact folder), kept pristine."""

    folder: Path
    name: str = RECORDED

    def copy(self, into: Path, *, notes: bool = True) -> str:
        """A copy of the storage in ``into`` (its artifacts beside it); returns its URL. Without
        ``notes``, as a version that wrote none recorded it (the notes' study attrs removed)."""
        shutil.copy(self.folder / "studies.db", into / "studies.db")
        if (self.folder / "autotune-artifacts").is_dir():
            shutil.copytree(self.folder / "autotune-artifacts", into / "autotune-artifacts")
        if not notes:
            with sqlite3.connect(into / "studies.db") as db:
                db.execute("DELETE FROM study_system_attributes WHERE key LIKE 'dashboard:%' OR key LIKE ?",
                           (f"{NOTE_HASH_PREFIX}%",))
        return f"sqlite:///{into}/studies.db"


@pytest.fixture(scope="module")
def recorded(recorded_study: Path) -> Recorded:
    """The real study of tests/conftest.py's ``recorded_study`` (NCCL crash, OOM crash, measured):
    the driver wrote each trial's note as the trial ended."""
    folder = recorded_study
    study = optuna.load_study(study_name=RECORDED, storage=f"sqlite:///{folder}/studies.db")
    notes = [k for k in study._storage.get_study_system_attrs(study._study_id) if k.startswith("dashboard:")]
    assert len(notes) >= len(study.trials) == 3, notes
    return Recorded(folder)


def _show(storage: str, name: str) -> dict[int, dict[str, Any]]:
    from autotune.store.study_view import load_study, show_json

    return {t["number"]: t for t in show_json(load_study(name, storage))["trials"]}


def test_notes_read_like_study_show_through_the_wsgi_app(recorded: Recorded, tmp_path: Path) -> None:
    from optuna_dashboard import wsgi

    from autotune.study.notes import write_all_notes, write_notes
    from autotune.store.storage import open_storage

    storage = recorded.copy(tmp_path, notes=False)  # a study recorded before notes were written
    rdb = open_storage(storage)
    assert write_all_notes(rdb) == 3
    assert write_all_notes(rdb) == 0  # up to date now: nothing is rewritten
    shown = _show(storage, RECORDED)
    app = wsgi(rdb)
    sid, trials = api_trials(app, RECORDED)
    assert [(t["state"], shown[n]["outcome"], shown[n]["failure"] and shown[n]["failure"]["kind"])
            for n, t in sorted(trials.items())] == [
        ("Complete", "infeasible", "nccl-error"), ("Complete", "infeasible", "oom"), ("Complete", "ok", None)]
    for n, t in trials.items():  # the dashboard tells a crash from a measurement by its constraint
        assert (t["constraints"][0] > 0) == (shown[n]["outcome"] == "infeasible"), t["constraints"]
    for n, t in trials.items():
        note = t["note"]["body"]
        row = shown[n]
        assert note.startswith(f"### Trial {n}: {row['outcome']}"), note
        for k, v in row["params"].items():  # the parameters as applied
            assert k.replace("_", "\\_") in note and str(v) in note, (k, note)
        assert "| failure | `" in note  # the constraint the dashboard does not show
        if row["failure"]:
            kind, message = row["failure"]["kind"], row["failure"]["message"]
            plain = re.sub(r"\\([\\`*_\[\]<>|~&])", r"\1", note)  # Markdown's escapes undone
            assert f"**Failure:** `{kind}`: " in note and f"`{kind}`: {message[:60]}" in plain
            assert "Optuna records an infeasible trial as *Complete*" in note
            assert "Key lines of the server log:\n\n```text\n" in note
            assert message[:60] in note.split("```text\n")[1], "the failure's own line is a key line"
            assert "violated" in note
        else:
            assert f"= **{row['value']:.6g}**" in note and "output\\_throughput" in note and "met" in note
        for artifact in t["artifacts"]:  # the server log
            assert f"artifact `{artifact['artifact_id']}`" in note
    nccl, oom = trials[0]["note"]["body"], trials[1]["note"]["body"]
    assert "NCCL" in nccl.split("```text")[1] and "Tree" in nccl
    assert "memory" in oom.split("```text")[1].lower()
    # A note a person edits in the dashboard is theirs: not overwritten, unless asked.
    tid = trials[0]["trial_id"]
    status, _ = wsgi_call(app, "PUT", f"/api/studies/{sid}/{tid}/note",
                           {"version": trials[0]["note"]["version"] + 1, "body": "my own note"})
    assert status.startswith(("200", "204")), status
    study = optuna.load_study(study_name=RECORDED, storage=rdb)
    assert write_notes(study) == 0
    assert api_trials(app, RECORDED)[1][0]["note"]["body"] == "my own note"
    assert write_notes(study, overwrite=True) == 1
    assert api_trials(app, RECORDED)[1][0]["note"]["body"] == nccl


def test_constraints_are_stored_where_sampler_and_dashboard_read_them() -> None:
    from optuna_dashboard import get_note

    from autotune.store import record
    from autotune.study.notes import write_trial_note

    study = optuna.create_study(direction="maximize")
    trial = study.ask()
    trial.suggest_float("x", 0, 1)
    trial.set_user_attr("outcome", "infeasible")
    trial.set_user_attr("failure_kind", "oom")
    record.set_constraints(trial, {"failure": 1.0, "slo:p99_ttft_ms <= 500": -0.5})
    record.tell(study, trial, record.Outcome.INFEASIBLE, fill=record.placeholder(study, [("m", "maximize")]))
    (t,) = study.trials
    assert t.state == TrialState.COMPLETE and t.system_attrs["constraints"] == [1.0, -0.5]
    assert t.user_attrs["constraint_failure"] == 1.0 and t.user_attrs["constraint_slo:p99_ttft_ms <= 500"] == -0.5
    body = write_trial_note(study, trial.number)
    assert "| failure | `1` | violated |" in body and "| slo:p99\\_ttft\\_ms \\<= 500 | `-0.5` | met |" in body
    assert get_note(trial) == body


def test_the_dashboard_in_a_real_browser(recorded: Recorded, tmp_path: Path) -> None:
    """``autotune dashboard`` writes the notes of a study recorded without them before serving;
    Chromium shows the crash's note."""
    chromium()
    storage = recorded.copy(tmp_path, notes=False)
    port = free_port()
    log = tmp_path / "dashboard.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "autotune", "dashboard", "--port", str(port), "--storage", storage],
                                cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        assert wait_http_ok(f"http://127.0.0.1:{port}/api/studies", 60, alive=lambda: proc.poll() is None), log.read_text()
        assert "3 trial notes written" in log.read_text()
        sid = requests.get(f"http://127.0.0.1:{port}/api/studies", timeout=30).json()["study_summaries"][0]["study_id"]
        # The trial list with the NCCL crash (trial 0) selected, as a person opens it.
        url = f"http://127.0.0.1:{port}/dashboard/studies/{sid}/trials?numbers=0"
        got = browse(url, "document.body && document.body.innerText.includes('Key lines of the server log')",
                     screenshot=True)
        assert got.errors == [], got.errors
        shot = tmp_path / "dash.png"
        shot.write_bytes(got.screenshot or b"")
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000, shot.stat().st_size
        # The note of the NCCL crash, rendered from Markdown by the dashboard.
        assert "Trial 0: infeasible (nccl-error)" in got.text
        assert "Optuna records an infeasible trial as Complete" in got.text
        assert "NCCL" in got.text.split("Key lines of the server log")[1] and "violated" in got.text
        if os.environ.get("AUTOTUNE_KEEP_SCREENSHOT"):
            shutil.copy(shot, os.environ["AUTOTUNE_KEEP_SCREENSHOT"])
    finally:
        stop_group(proc)


def test_a_stopped_trials_note_does_not_show_its_partial_metrics_as_its_figure() -> None:
    """A load stopped at 31 % cancelled every request: its metrics read output_throughput 0. The
    note says what it measured (the bound), and heads the metrics as the requests done before
    the stop, none of them in bold as the objective."""
    from autotune.study.notes import trial_note
    from autotune.store.record import TrialRecord

    stopped = TrialRecord(13, "PRUNED", "stopped", {"x": 1}, None,
                        {"output_throughput": 0.0, "completed": 0.0, "cancelled": 192.0}, None, 7.9,
                        early_stop={"message": "at 31% of the load: output_throughput could reach at most 587.9, "
                                               "below 669.8"})
    note = trial_note(stopped, metric="output_throughput")
    assert "**Stopped early** at 31% of the load" in note and "at most 587.9" in note
    assert "| metric (requests done before the stop) | value |" in note
    assert "**output\\_throughput**" not in note and "| output\\_throughput | `0` |" in note
    ok = trial_note(TrialRecord(1, "COMPLETE", "ok", {"x": 1}, 675.4, {"output_throughput": 675.4}, None, 7.7),
                    metric="output_throughput")
    assert "| metric | value |" in ok and "| **output\\_throughput** | `675.4` |" in ok
