"""A study as a local service: ``study start --detach``, ``study status``, ``study stop``.

``--detach`` runs ``python -m autotune study start ARGS`` (the same arguments, less ``--detach``)
as a daemon of this machine: a new session (no terminal, so no SIGHUP when it closes), stdin
``/dev/null``, stdout and stderr appended to ``<artifacts>/daemons/<name>.log`` and its pid in
``<artifacts>/daemons/<name>.pid`` (``<artifacts>``: :func:`autotune.store.storage.artifact_dir`). The
foreground waits until the daemon holds the study's lease (it runs the study) or has exited
(its one-line error becomes ours, with its exit code), at most :data:`START_WAIT_S`. The pid file
is removed when the daemon exits before that; a pid file left by a daemon that ended later is
stale, and `study status` reports a daemon only while the process it names is the daemon
(:func:`daemon_pid`).

Status and stop read who runs a study from its lease (:mod:`autotune.study.lease`) and what it does from
the study's attributes the driver writes (:data:`autotune.study.driver.SLOTS_ATTR`, each trial's
``slot``/``phase``/``phase_since``). A stop is written to the study
(:data:`autotune.study.driver.STOP_ATTR`, which a driver on any host polls between waits) and, for a
driver on this host, also sent as SIGTERM; either way the driver tears its running trials down,
records them ``fault``/``interrupted``, enqueues them again and releases the lease. The trials it
interrupted are those of its owner id (user attr ``owner``) recorded ``interrupted``: no host's
clock is compared with another's.

Nothing here creates a database or the lease table (:meth:`StudyLease.current` only reads).
"""

from __future__ import annotations

import datetime
import getpass
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy as sa
from optuna.storages import RDBStorage
from optuna.trial import TrialState

from autotune.study.driver import SLOTS_ATTR, STOP_ATTR
from autotune.errors import ERROR_PREFIX, UsageError
from autotune.study.lease import (
    STALE_AFTER_S,
    Owner,
    StudyBusyError,
    StudyLease,
    owner_alive,
    process_start_time,
)
from autotune.store.storage import artifact_dir, has_studies, open_storage
from autotune.store.record import Outcome, counts, counts_text, read, read_all
from autotune.store.study_view import best_view, is_multi_objective, objectives
from autotune.util.polling import polling

START_WAIT_S = 60.0
"""How long ``--detach`` waits for the daemon to take the study's lease."""
POLL_S = 0.25
LOG_TAIL_LINES = 3


class DaemonExitedError(UsageError):
    """The detached driver exited with an error before it took the study's lease.

    ``code`` is its exit status (1 when it was killed by a signal); the message is one line with
    the log's last lines and the log's path.
    """

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class DaemonInfo:
    """A detached driver.

    ``running``: it took the study's lease within the wait. ``exit_code``: it exited within the
    wait with this status (0: the study had nothing left to run). Neither: still starting.
    """

    pid: int
    log: Path
    pid_file: Path
    running: bool
    exit_code: int | None = None


# -- paths and the lease ----------------------------------------------------------------------
def daemon_files(storage: str, name: str) -> tuple[Path, Path]:
    """The pid file and the log of study ``name``'s daemon (absolute; nothing is created)."""
    folder = (artifact_dir(storage) / "daemons").absolute()
    return folder / f"{name}.pid", folder / f"{name}.log"


def lease_owner(rdb: RDBStorage, name: str) -> Owner | None:
    """The recorded owner of study ``name``'s lease, alive or not; None when there is none (or no
    lease table, which is not created)."""
    return StudyLease(rdb, name).current()


def is_alive(owner: Owner) -> bool:
    """Whether ``owner`` still runs: its pid (and start time) on this host, else its heartbeat."""
    return owner_alive(owner, stale_after_s=STALE_AFTER_S)


def live_owner(storage: str, name: str) -> Owner | None:
    """The live driver of study ``name``, or None; a missing SQLite file is not created."""
    if not has_studies(storage):
        return None
    owner = lease_owner(open_storage(storage), name)
    return owner if owner is not None and is_alive(owner) else None


# -- study start --detach ---------------------------------------------------------------------
def detach(argv: list[str], name: str, storage: str, *, umask: int | None = None,
           wait_s: float = START_WAIT_S) -> DaemonInfo:
    """Run ``python -m autotune study start *argv`` as a daemon of study ``name`` in ``storage``.

    ``argv`` must not hold ``--detach``; ``umask`` is the one the daemon runs with (the user's, so
    that servers get it). Returns once the daemon holds the study's lease, has exited with 0, or
    ``wait_s`` passed (then it is left running, still starting).

    Raises:
        StudyBusyError: a live driver runs the study already (nothing is started).
        DaemonExitedError: the daemon exited with an error before it took the lease.
        UsageError: the daemon folder cannot be written.
    """
    owner = live_owner(storage, name)
    if owner is not None:
        raise StudyBusyError(f"study '{name}' is already running: pid {owner.pid} on {owner.host}; "
                             f"`autotune study stop {name}` stops it")
    pid_file, log = daemon_files(storage, name)
    try:
        log.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    except OSError as exc:
        raise UsageError(f"cannot write the daemon log {log}: {exc.strerror}") from None
    with os.fdopen(fd, "ab") as out:
        stamp = datetime.datetime.now().isoformat(timespec="seconds")
        out.write(f"=== {stamp} autotune study start, study {name}\n".encode())  # argv may hold a password
        out.flush()
        offset = out.tell()
        proc = subprocess.Popen([sys.executable, "-m", "autotune", "study", "start", *argv],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, umask=-1 if umask is None else umask)
    _write_pid(pid_file, proc.pid)
    return _await_lease(proc, name, storage, log, pid_file, offset, wait_s)


def _write_pid(path: Path, pid: int) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(f"{pid}\n")
    tmp.replace(path)


def _await_lease(proc: subprocess.Popen[bytes], name: str, storage: str, log: Path, pid_file: Path,
                 offset: int, wait_s: float) -> DaemonInfo:
    """Poll until ``proc`` holds study ``name``'s lease or exits, at most ``wait_s``."""
    rdb: RDBStorage | None = None
    for _ in polling(wait_s, POLL_S):
        code = proc.poll()
        if code is not None:
            pid_file.unlink(missing_ok=True)  # it has ended: its log stays
            if code == 0:
                return DaemonInfo(proc.pid, log, pid_file, running=False, exit_code=0)
            tail = " | ".join(log_tail(log, offset)) or "no output"
            raise DaemonExitedError(f"the detached study '{name}' exited with code {code} before it started: "
                                    f"{tail} (log: {log})", code if 0 < code < 256 else 1)
        try:
            if rdb is None and has_studies(storage):
                rdb = open_storage(storage)  # the daemon may be creating it: tried again below
            owner = None if rdb is None else lease_owner(rdb, name)
        except (UsageError, sa.exc.SQLAlchemyError):
            owner = None
        if owner is not None and owner.pid == proc.pid:
            return DaemonInfo(proc.pid, log, pid_file, running=True)
    return DaemonInfo(proc.pid, log, pid_file, running=False)


def log_tail(log: Path, offset: int = 0, lines: int = LOG_TAIL_LINES) -> list[str]:
    """What ``log`` says after byte ``offset``: its last ``autotune: error:`` line (without the
    prefix) when it has one, else its last ``lines`` non-empty lines; [] when it cannot be read."""
    try:
        with open(log, "rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
    except OSError:
        return []
    found = [ln.strip() for ln in text.splitlines() if ln.strip()]
    errors = [ln.removeprefix(ERROR_PREFIX).strip() for ln in found if ln.startswith(ERROR_PREFIX)]
    return errors[-1:] or found[-lines:]


# -- study status -----------------------------------------------------------------------------
def study_status(study: optuna.Study, storage: str, *, now: float | None = None) -> dict[str, Any]:
    """``study status --json``: who runs the study, its trials, its best value, slots and daemon.

    Keys: ``study``, ``storage``, ``running`` (a live driver holds the lease), ``driver``
    (``{"pid", "host", "owner", "alive", "heartbeat_age_s"}`` or None), ``trials`` (counts
    ``done``: the trials the budget counts, then one count per outcome: ``ok``, ``stopped``,
    ``infeasible``, ``fault``, ``skipped``, ``running``, ``waiting``; ``text``: the counts as every
    surface says them), ``running_trials`` (``[{"number", "slot", "phase", "phase_s", "baseline"}]``),
    ``metric``, ``best`` (``{"number", "value", "params"}`` or None; a multi-objective study: the
    trial its rule picks from the Pareto front, with ``values``, and ``objectives``), ``slots`` (as the driver
    last wrote them, which is at its start, on a quarantine and at its end, plus
    ``running_trial``: the number of the RUNNING trial on the slot, or None),
    ``stop_requested`` and ``daemon`` (``{"pid", "pid_file", "log", "running"}`` while the process
    its pid file names runs (:func:`daemon_pid`), else None; ``running``: it holds the lease).
    """
    now = time.time() if now is None else now
    name = study.study_name
    owner = lease_owner(open_storage(storage), name)
    alive = owner is not None and is_alive(owner)
    trials = study.get_trials(deepcopy=False)

    records = read_all(study)
    by = counts(records)

    running = [{"number": t.number, "slot": t.user_attrs.get("slot"), "phase": t.user_attrs.get("phase"),
                "phase_s": None if t.user_attrs.get("phase_since") is None
                else round(max(0.0, now - float(t.user_attrs["phase_since"])), 1),
                "baseline": bool(t.user_attrs.get("baseline"))}
               for t in trials if t.state == TrialState.RUNNING]
    best = best_view(study)
    attrs = study.user_attrs
    pid_file, log = daemon_files(storage, name)
    daemon = None
    pid = daemon_pid(pid_file)
    if pid is not None:
        daemon = {"pid": pid, "pid_file": str(pid_file), "log": str(log),
                  "running": alive and owner is not None and owner.pid == pid and owner.host == socket.gethostname()}
    return {
        "study": name,
        "storage": storage,
        "running": alive,
        "driver": None if owner is None else {"pid": owner.pid, "host": owner.host, "owner": owner.id, "alive": alive,
                                               "heartbeat_age_s": round(max(0.0, now - owner.heartbeat), 1)},
        "trials": {"done": sum(r.finished for r in records), **{str(o): by[o] for o in Outcome},
                   "text": counts_text([r for r in records if r.outcome not in (Outcome.RUNNING, Outcome.WAITING)])},
        "running_trials": running,
        "metric": (attrs.get("objective") or {}).get("metric", "value"),
        "best": None if best is None else {"number": best.number, "value": best.value, "params": best.params,
                                           **({"values": best.values} if is_multi_objective(study) else {})},
        "slots": [{**s, "running_trial": next((t["number"] for t in running if t["slot"] == s.get("name")), None)}
                  for s in attrs.get(SLOTS_ATTR) or [] if isinstance(s, dict)],
        "stop_requested": attrs.get(STOP_ATTR),
        **({"objectives": [g.to_json() for g in objectives(study)]} if is_multi_objective(study) else {}),
        "daemon": daemon,
    }


def daemon_pid(pid_file: Path) -> int | None:
    """The pid in ``pid_file`` while that process runs, else None: the file is stale (the daemon
    exited or was killed, or its pid now names a process that started after the file was written)."""
    try:
        pid = int(pid_file.read_text().split()[0])
        written = pid_file.stat().st_mtime
    except (OSError, ValueError, IndexError):
        return None
    if not Path("/proc").is_dir():  # no start times to compare: the pid's existence
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return pid
    ticks = process_start_time(pid)  # "" when gone (or a zombie)
    if not ticks:
        return None
    boot = _boot_time()
    # The daemon started before its pid file was written (1 s: the boot time's rounding).
    return pid if boot is None or boot + int(ticks) / os.sysconf("SC_CLK_TCK") <= written + 1.0 else None


def _boot_time() -> float | None:
    """The unix time this machine booted (``btime`` of /proc/stat), or None."""
    try:
        for line in Path("/proc/stat").read_text().splitlines():
            if line.startswith("btime "):
                return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def status_lines(doc: dict[str, Any]) -> list[str]:
    """``study status`` as lines of plain text (one fact a line), from :func:`study_status`."""
    name, driver = doc["study"], doc["driver"]
    if doc["running"]:
        who = f"running: pid {driver['pid']} on {driver['host']} (heartbeat {driver['heartbeat_age_s']:.0f}s ago)"
    elif driver is not None:
        who = f"not running (its last driver, pid {driver['pid']} on {driver['host']}, is gone)"
    else:
        who = "not running"
    n = doc["trials"]
    lines = [f"study {name}: {who}",
             f"{n['text']}; {n['running']} running, {n['waiting']} waiting"]
    stale = "" if doc["running"] else " (left by a driver that is gone: the next start or resume runs it again)"
    for t in doc["running_trials"]:
        since = "" if t["phase_s"] is None else f" for {t['phase_s']:.0f}s"
        lines.append(f"  trial {t['number']}{' (baseline)' if t['baseline'] else ''} on slot {t['slot'] or '?'}: "
                     f"{t['phase'] or 'starting'}{since}{stale}")
    best = doc["best"]
    if best is not None and doc.get("objectives") and best.get("values"):
        shown = " ".join(f"{g['metric']}={v:.4g}" for g, v in zip(doc["objectives"], best["values"]))
        lines.append(f"chosen from the Pareto front: trial {best['number']} {shown} "
                     + " ".join(f"{k}={v}" for k, v in best["params"].items()))
    else:
        lines.append("best: none yet" if best is None else
                     f"best: trial {best['number']} {doc['metric']}={best['value']:.4g} "
                     + " ".join(f"{k}={v}" for k, v in best["params"].items()))
    for s in doc["slots"]:
        health = f"quarantined: {s.get('reason')}" if s.get("health") == "quarantined" else "healthy"
        busy = "" if s["running_trial"] is None else f", running trial {s['running_trial']}"
        lines.append(f"slot {s.get('name')} on {s.get('host')}: {health}{busy}")
    asked = doc["stop_requested"]
    if isinstance(asked, dict):
        at = datetime.datetime.fromtimestamp(float(asked.get("at", 0))).isoformat(timespec="seconds")
        lines.append(f"last stop request: {at} by {asked.get('by')}")
    daemon = doc["daemon"]
    if daemon is not None:
        lines.append(f"daemon: pid {daemon['pid']} ({'running' if daemon['running'] else 'not running'}), "
                     f"log {daemon['log']}")
    return lines


# -- study stop -------------------------------------------------------------------------------
def request_stop(study: optuna.Study, owner: Owner, *, now: float | None = None) -> dict[str, Any]:
    """Write the stop request (:data:`STOP_ATTR`) addressed to the driver holding the lease
    (``owner``: only that driver obeys it, whatever the hosts' clocks); returns it."""
    asked = {"by": f"{_user()}@{socket.gethostname()} pid {os.getpid()}", "owner": owner.id,
             "at": time.time() if now is None else now}
    study.set_user_attr(STOP_ATTR, asked)
    return asked


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())


def signal_owner(owner: Owner) -> str:
    """Send SIGTERM to ``owner`` when it is a live process of this host; returns what was done,
    as a phrase."""
    if owner.host != socket.gethostname():
        return f"the driver on {owner.host} stops at its next look at the study"
    if not is_alive(owner):
        return f"pid {owner.pid} is gone"
    try:
        os.kill(owner.pid, signal.SIGTERM)
    except ProcessLookupError:
        return f"pid {owner.pid} is gone"
    except PermissionError:
        return f"pid {owner.pid} is another user's: it stops at its next look at the study"
    return f"sent SIGTERM to pid {owner.pid}"


def wait_stopped(rdb: RDBStorage, name: str, owner: Owner, timeout_s: float,
                 progress: Callable[[float], None] | None = None, every_s: float = 5.0) -> bool:
    """Wait until ``owner`` no longer holds study ``name``'s lease (released, taken over, or the
    owner dead), at most ``timeout_s``; ``progress(elapsed_s)`` is called every ``every_s``.
    Returns whether it stopped."""
    start = shown = time.monotonic()
    while True:
        try:
            current = lease_owner(rdb, name)
        except sa.exc.SQLAlchemyError:
            current = owner  # a briefly locked database: look again
        if current is None or current.id != owner.id or not is_alive(current):
            return True
        now = time.monotonic()
        if now - start >= timeout_s:
            return False
        if progress is not None and now - shown >= every_s:
            shown = now
            progress(now - start)
        time.sleep(min(2 * POLL_S, timeout_s - (now - start)))


def interrupted_trials(study: optuna.Study, owner: Owner) -> list[int]:
    """Numbers of the trials that the driver ``owner`` ran and recorded ``interrupted`` (user attrs
    ``owner`` and ``failure_kind``): what stopping it interrupted, whatever the hosts' clocks."""
    return [t.number for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,))
            if t.user_attrs.get("owner") == owner.id and read(t).failure_kind == "interrupted"]

