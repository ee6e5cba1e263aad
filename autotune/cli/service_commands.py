"""``autotune study status|stop`` and ``autotune dashboard``: a study seen as a running service.

Contracts:

- ``status`` reads who holds a study's lease (:mod:`autotune.study.service`) and its running
  trials; ``--json`` prints the same as one document.
- ``stop`` asks the driver that holds the lease to stop and waits up to ``--timeout`` seconds:
  exit 0 once it stopped (its interrupted trials run again on resume), 1 if it still runs.
- ``dashboard`` serves optuna-dashboard over an opened storage (tables created), with the trials'
  logs as artifacts and every trial's note written first. Before anything is created it checks
  that it can listen: a ``--host`` that is not an address of this machine is bad input (exit 2);
  a port another process holds is a fault of the machine's state, not of the input (exit 1).
"""

from __future__ import annotations

import errno
import socket
import textwrap

import typer

from autotune.cli.common import NameArg, StorageOpt, fail, print_json
from autotune.cli.common import err as _err
from autotune.cli.common import out as _out
from autotune.errors import UsageError
from autotune.store.storage import check_storage, open_storage
from autotune.util.text import counted


def study_status(name: str = NameArg, storage: str = StorageOpt, as_json: bool = typer.Option(False, "--json")) -> None:
    """Who runs a study, its running trials and their phases, its best value and slots."""
    from autotune.study import service
    from autotune.store.study_view import load_study

    doc = service.study_status(load_study(name, storage), storage)
    if as_json:
        print_json(doc)
        return
    for line in service.status_lines(doc):  # wrapped between words, never inside a name
        lead = " " * (len(line) - len(line.lstrip()))
        _out.print(textwrap.fill(line, width=max(_out.width, 40), subsequent_indent=lead + "    ",
                                 break_long_words=False, break_on_hyphens=False),
                   markup=False, highlight=False, soft_wrap=True)


def study_stop(name: str = NameArg, storage: str = StorageOpt,
               timeout: float = typer.Option(120.0, "--timeout", min=0,
                                             help="Seconds to wait for the driver to stop.")) -> None:
    """Ask a study's driver to stop (running trials torn down, run again on resume) and wait."""
    from autotune.study import service
    from autotune.store.study_view import load_study

    study = load_study(name, storage)
    rdb = open_storage(storage)
    owner = service.lease_owner(rdb, name)
    if owner is None or not service.is_alive(owner):
        _out.print(f"study {name} is not running", markup=False)
        return
    service.request_stop(study, owner)
    done = service.signal_owner(owner)
    _err.print(f"stop requested for study {name} (pid {owner.pid} on {owner.host}): {done}; "
               f"waiting up to {timeout:.0f}s for its running trials' teardown", markup=False, soft_wrap=True)

    def progress(elapsed: float) -> None:
        running = [t for t in study.get_trials(deepcopy=False) if t.state.name == "RUNNING"]
        phases = ", ".join(f"trial {t.number} {t.user_attrs.get('phase', 'starting')}" for t in running)
        _err.print(f"  still running after {elapsed:.0f}s{': ' + phases if phases else ''}", markup=False,
                   soft_wrap=True)

    if not service.wait_stopped(rdb, name, owner, timeout, progress):
        fail(f"study {name}: its driver (pid {owner.pid} on {owner.host}) still runs after {timeout:.0f}s; "
              "it stops after its running trials' teardown (run `autotune study stop` again to wait more)", 1)
    numbers = service.interrupted_trials(study, owner)
    which = f" ({', '.join(str(n) for n in numbers)})" if numbers else ""
    _out.print(f"study {name} stopped: {counted(len(numbers), 'trial')} interrupted{which}, to run again on "
               f"`autotune study resume {name}`", markup=False, soft_wrap=True)


def dashboard(storage: str = StorageOpt, host: str = typer.Option("127.0.0.1", "--host"),
              port: int = typer.Option(8080, "--port")) -> None:
    """Serve optuna-dashboard over the storage, with trial logs as artifacts."""
    from optuna.artifacts import FileSystemArtifactStore
    from optuna_dashboard import run_server

    from autotune.store.storage import artifact_dir

    if not 1 <= port <= 65535:
        raise UsageError(f"--port {port}: expected a port number between 1 and 65535")
    if not host.strip():
        raise UsageError("--host: expected an address to listen on, e.g. 127.0.0.1")
    _check_listen(host, port)
    check_storage(storage)  # before anything is created
    store_dir = artifact_dir(storage)
    store_dir.mkdir(parents=True, exist_ok=True)
    # An opened storage, not the URL: optuna-dashboard opens a URL without creating the tables,
    # which fails on a new database.
    rdb = open_storage(storage)
    from autotune.study.notes import write_all_notes

    written = write_all_notes(rdb)  # trials recorded before notes were written read like `study show` too
    _err.print(f"optuna-dashboard on http://{host}:{port}/ (storage {storage}"
               + (f"; {written} trial notes written)" if written else ")"), markup=False, soft_wrap=True)
    try:
        run_server(rdb, host=host, port=port, artifact_store=FileSystemArtifactStore(str(store_dir)))
    except OSError as exc:  # taken since _check_listen looked
        fail(f"dashboard on {host}:{port}: cannot listen: {exc.strerror or exc}", 1)


def _check_listen(host: str, port: int) -> None:
    """Bind ``host:port`` as the dashboard's server will (address reuse on) and let it go.

    Raises:
        UsageError: ``host`` is not a name or address of this machine (exit 2).
        SystemExit: 1 when the port is in use (one line by :func:`fail`).
    """
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
    except (socket.gaierror, UnicodeError) as exc:
        raise UsageError(f"--host {host}: not a name or address to listen on "
                         f"({getattr(exc, 'strerror', None) or exc})") from None
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                fail(f"--port {port}: already in use on {host} (another process listens there); "
                     "give another --port", 1)
            if exc.errno == errno.EACCES:
                fail(f"--port {port}: not allowed to listen on it ({exc.strerror}); give a port above 1023", 1)
            raise UsageError(f"--host {host}: cannot listen there: {exc.strerror or exc}") from None
