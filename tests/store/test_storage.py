"""``autotune.store.storage``: validating a storage URL without creating anything, and opening it."""

from __future__ import annotations

import multiprocessing
import sqlite3
from pathlib import Path

import optuna
import pytest

from autotune.errors import UsageError
from autotune.store.storage import SQLITE_TIMEOUT_S, check_storage, has_studies, open_storage


def test_sqlite_storage_waits_for_locks(tmp_path: Path) -> None:
    storage = open_storage(f"sqlite:///{tmp_path}/a.db")
    assert storage.engine_kwargs == {"connect_args": {"timeout": SQLITE_TIMEOUT_S}}
    optuna.create_study(study_name="s", storage=storage)
    assert has_studies(f"sqlite:///{tmp_path}/a.db")


def test_checks_create_nothing(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/new.db"
    check_storage(url)
    assert not has_studies(url)
    (tmp_path / "empty.db").touch()
    assert not has_studies(f"sqlite:///{tmp_path}/empty.db")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.db"]
    assert (tmp_path / "empty.db").stat().st_size == 0


def test_another_programs_database_is_refused_but_autotune_tables_are_not(tmp_path: Path) -> None:
    with sqlite3.connect(tmp_path / "other.db") as conn:
        conn.execute("CREATE TABLE invoices (id INTEGER)")
    conn.close()
    before = (tmp_path / "other.db").read_bytes()
    with pytest.raises(UsageError, match="another program"):
        open_storage(f"sqlite:///{tmp_path}/other.db")
    assert (tmp_path / "other.db").read_bytes() == before
    with sqlite3.connect(tmp_path / "ours.db") as conn:
        conn.execute("CREATE TABLE autotune_leases (study TEXT)")
    conn.close()
    open_storage(f"sqlite:///{tmp_path}/ours.db")


def test_a_password_is_never_shown(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as err:
        check_storage("mssql+pymssql://user:hunter2@db.example/tuning")
    assert "hunter2" not in str(err.value) and "***" in str(err.value)


def _open(url: str, barrier: multiprocessing.synchronize.Barrier) -> None:
    barrier.wait()
    optuna.create_study(study_name="s", storage=open_storage(url), load_if_exists=True)


def test_processes_creating_one_new_database_at_once_all_succeed(tmp_path: Path) -> None:
    """Creating the tables races on ``CREATE TABLE`` (``table ... already exists``): retried."""
    url = f"sqlite:///{tmp_path}/race.db"
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(6)
    procs = [ctx.Process(target=_open, args=(url, barrier)) for _ in range(6)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0] * 6
    assert [s.study_name for s in optuna.get_all_study_summaries(url)] == ["s"]
