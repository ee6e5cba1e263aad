"""One study, one owner: a lease on the study, kept in the storage's own database.

A driver holds the lease of a study while it runs it: a row in the table ``autotune_leases``
beside Optuna's tables, with the owner's id, host, pid (and the pid's start time, so a recycled
pid is not mistaken for the owner) and a heartbeat that a background thread renews. Taking the
lease is a compare-and-set in the database (an INSERT that fails on the primary key, or an
UPDATE that names the dead owner it replaces), so two drivers started at once cannot both win.

An owner is alive while, on its own host, its pid still runs with the same start time; seen
from another host, while its heartbeat is younger than ``stale_after_s``. A second driver on a
live study is refused with :class:`StudyBusyError` naming the owner. Each trial a driver runs
carries the owner's id (user attr ``owner``), so one driver can own many RUNNING trials and,
once the lease is taken from a dead owner, exactly that owner's RUNNING trials are stale.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa
from optuna.storages import RDBStorage

from autotune.errors import UsageError

STALE_AFTER_S = 60.0
"""Seen from another host, an owner is dead when its heartbeat is this old (the default of
:class:`StudyLease`, and what `study status`/`study stop` use)."""

_METADATA = sa.MetaData()
LEASES = sa.Table(
    "autotune_leases",
    _METADATA,
    sa.Column("study_name", sa.String(512), primary_key=True),
    sa.Column("owner", sa.String(64), nullable=False),
    sa.Column("host", sa.String(255), nullable=False),
    sa.Column("pid", sa.Integer, nullable=False),
    sa.Column("pid_start", sa.String(32), nullable=False),
    sa.Column("acquired", sa.Float, nullable=False),
    sa.Column("heartbeat", sa.Float, nullable=False),
)


class StudyBusyError(UsageError):
    """The study is run by another live driver."""


@dataclass(frozen=True)
class Owner:
    """Who holds (or held) a study's lease."""

    id: str
    host: str
    pid: int
    pid_start: str
    acquired: float
    heartbeat: float

    def describe(self) -> str:
        age = max(0.0, time.time() - self.heartbeat)
        return f"pid {self.pid} on {self.host} (owner {self.id[:8]}, heartbeat {age:.0f}s ago)"


def process_start_time(pid: int) -> str:
    """The start time of ``pid`` in clock ticks since boot (field 22 of /proc/PID/stat), or ""
    when the process does not exist, has exited (a zombie not yet reaped) or /proc is not there."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    fields = stat.rsplit(")", 1)[-1].split()
    return fields[19] if len(fields) > 19 and fields[0] != "Z" else ""


def owner_alive(owner: Owner, *, stale_after_s: float, here: str | None = None) -> bool:
    """Whether ``owner`` still runs (see the module docstring)."""
    if owner.host == (here or socket.gethostname()):
        if not Path("/proc").is_dir():
            return time.time() - owner.heartbeat < stale_after_s
        try:
            os.kill(owner.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return process_start_time(owner.pid) == owner.pid_start
    return time.time() - owner.heartbeat < stale_after_s


class StudyLease:
    """The lease of one study for this process.

    Contract: :meth:`acquire` returns the dead owner it replaced (or None) or raises
    :class:`StudyBusyError`; while held, :meth:`start_heartbeat` renews it; :attr:`lost` turns
    true if another driver took it over (which happens only after this one looked dead); after
    :meth:`release` the row is gone and the next driver takes the study at once.
    """

    def __init__(self, storage: RDBStorage, study_name: str, *, stale_after_s: float = STALE_AFTER_S,
                 heartbeat_s: float = 5.0) -> None:
        self.engine: sa.engine.Engine = storage.engine
        self.study_name = study_name
        self.stale_after_s = stale_after_s
        self.heartbeat_s = heartbeat_s
        pid = os.getpid()
        now = time.time()
        self.me = Owner(uuid.uuid4().hex, socket.gethostname(), pid, process_start_time(pid), now, now)
        self.lost = False
        self._held = False
        self._table = False  # known to exist
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the table ------------------------------------------------------------------------
    def _create_table(self) -> None:
        for attempt in range(5):
            try:
                _METADATA.create_all(self.engine, tables=[LEASES], checkfirst=True)
                self._table = True
                return
            except sa.exc.SQLAlchemyError:
                # Two drivers creating it at once: one of them sees "already exists".
                if attempt == 4:
                    raise
                time.sleep(0.2 * (attempt + 1))

    def current(self) -> Owner | None:
        """The owner recorded for the study, alive or not; None when there is none. Read-only: a
        missing lease table (nothing ever acquired a lease in this storage) is not created."""
        if not self._table:
            if not sa.inspect(self.engine).has_table(LEASES.name):
                return None
            self._table = True
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(LEASES).where(LEASES.c.study_name == self.study_name)).first()
        if row is None:
            return None
        return Owner(row.owner, row.host, row.pid, row.pid_start, row.acquired, row.heartbeat)

    # -- acquire / renew / release --------------------------------------------------------
    def acquire(self) -> Owner | None:
        """Take the lease; return the dead owner it replaced, if any.

        Raises:
            StudyBusyError: a live driver holds it (the message names it).
        """
        self._create_table()
        me = self.me
        values = {"owner": me.id, "host": me.host, "pid": me.pid, "pid_start": me.pid_start,
                  "acquired": time.time(), "heartbeat": time.time()}
        for _ in range(20):
            previous = self.current()
            if previous is None:
                try:
                    with self.engine.begin() as conn:
                        conn.execute(sa.insert(LEASES).values(study_name=self.study_name, **values))
                except sa.exc.IntegrityError:
                    continue  # another driver inserted first: look again
                self._held = True
                return None
            if previous.id == me.id:
                self._held = True
                return None
            if owner_alive(previous, stale_after_s=self.stale_after_s, here=me.host):
                raise StudyBusyError(
                    f"study '{self.study_name}' is being run by another driver: {previous.describe()}; "
                    "stop it first (Ctrl-C or kill PID), or wait for it to finish"
                )
            with self.engine.begin() as conn:
                taken = conn.execute(
                    sa.update(LEASES)
                    .where(LEASES.c.study_name == self.study_name, LEASES.c.owner == previous.id)
                    .values(**values)
                ).rowcount
            if taken == 1:
                self._held = True
                return previous
        raise StudyBusyError(f"study '{self.study_name}': could not take its lease (other drivers keep taking it)")

    def renew(self) -> bool:
        """Write a heartbeat; False (and :attr:`lost`) if the lease is no longer ours."""
        with self.engine.begin() as conn:
            n = conn.execute(
                sa.update(LEASES)
                .where(LEASES.c.study_name == self.study_name, LEASES.c.owner == self.me.id)
                .values(heartbeat=time.time())
            ).rowcount
        if n == 0:
            self.lost = True
        return n == 1

    def start_heartbeat(self) -> None:
        """Renew the lease every ``heartbeat_s`` in a daemon thread until :meth:`release`."""

        def beat() -> None:
            while not self._stop.wait(self.heartbeat_s):
                try:
                    if not self.renew():
                        return
                except sa.exc.SQLAlchemyError:
                    continue  # a briefly locked database: try again at the next beat

        self._thread = threading.Thread(target=beat, name="autotune-lease", daemon=True)
        self._thread.start()

    def release(self) -> None:
        """Stop the heartbeat and give the lease up (best effort: a dead database keeps the row,
        and the next driver sees this process gone)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.heartbeat_s + 5)
        if not self._held:
            return
        try:
            with self.engine.begin() as conn:
                conn.execute(sa.delete(LEASES).where(LEASES.c.study_name == self.study_name,
                                                     LEASES.c.owner == self.me.id))
        except sa.exc.SQLAlchemyError:
            pass
        self._held = False
