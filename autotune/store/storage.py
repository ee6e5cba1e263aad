"""Opening an Optuna storage from a user's URL, with one-line errors for a bad one.

A storage URL is whatever SQLAlchemy accepts (``sqlite:///autotune.db``,
``postgresql://user@host/db``, ...). Before anything is created, :func:`check_storage` rejects:

- a URL SQLAlchemy cannot parse, a scheme it does not know, or one whose database driver is not
  installed;
- an in-memory SQLite database (``sqlite://``, ``sqlite:///:memory:``): a study there is lost
  when the command ends;
- for SQLite: options after ``?`` (``?mode=ro``: refused, never part of a file name), a folder
  that does not exist, a path that is a folder or not a regular file, a file that is not a SQLite
  database (its 16-byte header is not ``SQLite format 3\\0``), and a SQLite database of another
  program (tables, but none of Optuna's or autotune's).

Messages show the URL with any password hidden.

:func:`open_storage` then builds the :class:`optuna.storages.RDBStorage`: SQLite connections wait
up to 30 s for a lock instead of failing at once, and creating the tables is retried a few times,
since two processes creating a new database at the same moment can race on ``CREATE TABLE``.
"""

from __future__ import annotations

import shutil
import sqlite3
import time
from pathlib import Path

import optuna
import sqlalchemy.exc
from sqlalchemy.engine import URL, make_url

from autotune.errors import UsageError
from autotune.execution.hosts import MIN_FREE_BYTES
from autotune.util.files import file_kind
from autotune.util.folders import ensure_writable

__all__ = ["artifact_dir", "check_artifacts_writable", "check_storage", "has_studies", "low_disk", "open_storage",
           "sqlite_path"]

SQLITE_HEADER = b"SQLite format 3\x00"
SQLITE_TIMEOUT_S = 30
CREATE_ATTEMPTS = 5
_OPTUNA_TABLES = {"studies", "version_info", "alembic_version"}


def _parse(url: str) -> URL:
    try:
        return make_url(url)
    except (sqlalchemy.exc.ArgumentError, ValueError, TypeError):
        raise UsageError(f"storage '{url}': not a database URL (e.g. sqlite:///autotune.db)") from None


def _shown(url: str) -> str:
    """The URL with any password hidden, for messages."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - an unparseable URL holds no parseable password
        return url


def sqlite_path(url: str) -> Path | None:
    """The database file of a ``sqlite:///`` URL, or None for another kind of storage.

    Raises:
        UsageError: the URL cannot be parsed.
    """
    parsed = _parse(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database or parsed.database == ":memory:":
        return None
    return Path(parsed.database)


def check_storage(url: str) -> None:
    """Validate a storage URL without creating or writing anything.

    Raises:
        UsageError: one line naming the storage and what is wrong with it (see the module
            docstring); a missing SQLite *file* in an existing folder is fine (it is created).
    """
    shown = _shown(url)
    parsed = _parse(url)
    try:
        dialect = parsed.get_dialect()
    except sqlalchemy.exc.NoSuchModuleError:
        raise UsageError(f"storage {shown}: unknown scheme '{parsed.drivername}' "
                         "(expected e.g. sqlite:///autotune.db or postgresql://user@host/db)") from None
    try:
        dialect.import_dbapi()
    except ImportError as exc:
        raise UsageError(f"storage {shown}: the database driver for '{parsed.drivername}' is not installed "
                         f"({exc.name or exc})") from None
    if parsed.get_backend_name() != "sqlite":
        return
    if parsed.query:  # SQLAlchemy would pass some to SQLite and drop others: none is taken
        options = "&".join(f"{k}={v}" for k, v in parsed.query.items())
        raise UsageError(f"storage {shown}: SQLite URL options (?{options}) are not taken; give the database "
                         "file alone (e.g. sqlite:///autotune.db)")
    if not parsed.database or parsed.database == ":memory:":
        raise UsageError(f"storage {shown}: an in-memory SQLite database keeps nothing; give a file "
                         "(e.g. sqlite:///autotune.db)")
    path = sqlite_path(url)
    if path is None:
        return
    if path.is_dir():
        raise UsageError(f"storage {shown}: {path} is a folder, not a database file")
    if not path.parent.is_dir():
        raise UsageError(f"storage {shown}: folder {path.parent} does not exist")
    if not path.exists():
        return
    if not path.is_file():  # a FIFO would hang the read below, a device never end
        raise UsageError(f"storage {shown}: {path} is {file_kind(path.stat().st_mode)}, not a database file")
    try:
        with open(path, "rb") as f:
            header = f.read(len(SQLITE_HEADER))
    except OSError as exc:
        raise UsageError(f"storage {shown}: cannot read {path}: {exc.strerror}") from None
    if not header:
        return  # an empty file is an empty SQLite database
    if header != SQLITE_HEADER:
        raise UsageError(f"storage {shown}: {path} is not a SQLite database")
    tables = _sqlite_tables(path)
    if tables and not tables & _OPTUNA_TABLES and not any(t.startswith("autotune_") for t in tables):
        raise UsageError(f"storage {shown}: {path} is a SQLite database of another program "
                         f"(tables {', '.join(sorted(tables)[:3])}), not an Optuna storage")


def _sqlite_tables(path: Path) -> set[str]:
    """The table names of a SQLite file, read without writing (empty when it cannot be read)."""
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=SQLITE_TIMEOUT_S)
    except sqlite3.Error:
        return set()
    try:
        return {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.Error:
        return set()
    finally:
        conn.close()


def has_studies(url: str) -> bool:
    """Whether the storage may hold studies, decided without creating anything.

    False for a SQLite file that does not exist or is empty (opening it would create it, or
    Optuna's tables in it); True otherwise.

    Raises:
        UsageError: the URL is invalid (see :func:`check_storage`).
    """
    check_storage(url)
    path = sqlite_path(url)
    return path is None or (path.is_file() and path.stat().st_size > 0)


def open_storage(url: str) -> optuna.storages.RDBStorage:
    """Validate ``url`` and open it as an Optuna storage, creating its tables if needed.

    SQLite connections wait up to :data:`SQLITE_TIMEOUT_S` seconds for a lock. Creation is tried
    :data:`CREATE_ATTEMPTS` times on ``OperationalError``/``IntegrityError`` (two processes
    creating the same new database race on ``CREATE TABLE``).

    Raises:
        UsageError: the URL is invalid (see :func:`check_storage`), or the database cannot be
            opened (unreachable server, incompatible schema, ...); one line.
    """
    check_storage(url)
    shown = _shown(url)
    engine_kwargs = {"connect_args": {"timeout": SQLITE_TIMEOUT_S}} if _parse(url).get_backend_name() == "sqlite" else {}
    for attempt in range(CREATE_ATTEMPTS):
        try:
            return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs)
        except (sqlalchemy.exc.OperationalError, sqlalchemy.exc.IntegrityError) as exc:
            if attempt == CREATE_ATTEMPTS - 1:
                raise UsageError(f"storage {shown}: cannot open: {_first_line(exc)}") from None
            time.sleep(0.05 * 2**attempt)
        except (sqlalchemy.exc.SQLAlchemyError, RuntimeError, ImportError, ValueError) as exc:
            raise UsageError(f"storage {shown}: cannot open: {_first_line(exc)}") from None
    raise AssertionError("unreachable")  # pragma: no cover


def _first_line(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None)  # sqlalchemy wraps the driver's error: its text is shorter
    text = str(orig if orig is not None else exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def artifact_dir(storage: str) -> Path:
    """Where trial logs and artifacts live: beside a SQLite file, else in the working directory."""
    if storage.startswith("sqlite:///"):
        db = Path(storage.removeprefix("sqlite:///"))
        return db.parent / "autotune-artifacts"
    return Path("autotune-artifacts")


def check_artifacts_writable(folder: Path) -> None:
    """Make the artifact ``folder`` (:func:`artifact_dir`) if missing and check it can be written.

    Raises:
        UsageError: it cannot be made or written.
    """
    try:
        ensure_writable(folder)
    except OSError as exc:
        raise UsageError(f"artifact folder {folder} is not writable: {exc.strerror}") from None


def low_disk(url: str) -> str:
    """Why a study on the SQLite storage ``url`` must stop for want of disk space (less than
    :data:`~autotune.execution.hosts.MIN_FREE_BYTES` free under its folder), else ""; "" for
    another kind of storage or a folder that cannot be looked at."""
    if not url.startswith("sqlite:///"):
        return ""
    folder = Path(url.removeprefix("sqlite:///")).parent
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return ""
    if free < MIN_FREE_BYTES:
        return f"stopped: only {free // 1024} KiB free under the storage's folder {folder}; free some space and resume"
    return ""
