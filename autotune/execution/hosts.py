"""Hosts: where a server process runs, how its log is read, and how it is torn down.

``LocalHost`` runs the server as a subprocess in its own process group with stdout and stderr in
a log file. Every launch carries a unique tag in its environment (:data:`TAG_ENV`), which each
descendant inherits, so a child that leaves the group (``setsid``, as engines' worker launchers
can) is still found. Teardown sends SIGTERM to the group and to every tagged process, waits a
grace period, then SIGKILL, and checks that the port is free again before the next trial may
start. The tag is recorded with the trial, so a driver that died is cleaned up after by the next
one (:meth:`Host.kill_tagged`), even when ``/proc/PID/cmdline`` was rewritten by a script.

With a :class:`~autotune.config.secrets.StreamRedactor` (``redact``; hosts whose
:attr:`Host.redacts_logs` is true), a local server's output reaches its log through a pipe and a
relay thread that redacts it as it is written: no secret value is ever on disk, whenever this
process dies (the server then writes to a pipe nobody reads).

``SSHHost`` (:mod:`autotune.execution.sshhost`) does the same on another machine over SSH;
:func:`~autotune.execution.host_factory.make_host` turns a config spelling (``local``,
``ssh://user@host:port``) into one host object per host.
"""

from __future__ import annotations

import abc
import errno
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import IO, Callable, Iterable, Mapping, Sequence

from autotune.config.secrets import StreamRedactor
from autotune.util.net import free_port
from autotune.util.polling import polling, wait_until
from autotune.util.folders import ensure_writable

TAG_ENV = "AUTOTUNE_TRIAL_TAG"
"""The environment variable that marks every process of one launch (inherited by children)."""

MIN_FREE_BYTES = 64 * 1024 * 1024
"""A launch needs at least this much free space where its log goes (else a ``disk-full`` fault)."""


class HostFault(Exception):
    """The host, not the configuration, failed (port stuck, command missing, host unreachable)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class ServerLeftRunning(HostFault):
    """Teardown could not reach the server's host: the server (``tag``) may still run there.

    The host object remembers it and kills it once the host answers again; a caller that keeps
    records (the driver) keeps ``tag`` so that a later process can kill it too.
    """

    def __init__(self, kind: str, message: str, tag: str) -> None:
        super().__init__(kind, message)
        self.tag = tag


class ServerProcess(abc.ABC):
    """A launched server: its exit status, its log, and its teardown."""

    log_path: Path
    tag: str
    pgid: int | None

    @abc.abstractmethod
    def poll(self) -> int | None:
        """The exit code if the server has exited, else None."""

    def niceness(self) -> int | None:
        """The CPU niceness the server runs at, where the host can tell (None: it cannot, or the
        server is gone). A server above 0 gets less of a busy host's CPU than it will serve with."""
        return None

    @abc.abstractmethod
    def stop(self, grace_s: float = 10.0, hurry: Callable[[], bool] | None = None) -> None:
        """Stop the server and everything it started; returns when all of it is gone.

        SIGTERM first, SIGKILL after ``grace_s`` or as soon as ``hurry()`` turns true.

        Raises:
            HostFault: a remote host could not be reached to finish (:class:`ServerLeftRunning`:
                the server may still run there), or what the server held was not released
                (``gpu-busy``). A local host never raises.
        """


class Host(abc.ABC):
    """A machine that runs servers.

    ``name`` is the host's config spelling (``local``, ``ssh://user@host:port``), recorded with
    each trial. ``python`` fills ``{python}`` and ``bind_address`` fills ``{host}`` in a server's
    command: what they are *on that host*. Clients (the load generator, health polls) reach a
    server's ``port`` at :meth:`endpoint`, which for a remote host is the local end of a tunnel.
    ``remote`` says whether the host is another machine.
    """

    name: str
    address: str
    python: str = sys.executable
    bind_address: str = "127.0.0.1"
    remote: bool = False
    redacts_logs: bool = False
    """Whether :meth:`launch` takes ``redact`` (a stream redactor the output passes through)."""

    @abc.abstractmethod
    def launch(self, argv: Sequence[str], env: Mapping[str, str], log_path: Path, *, cwd: Path | None = None,
               port: int | None = None) -> ServerProcess:
        """Start ``argv`` with ``env`` added to the host's environment; output goes to ``log_path``
        (a local file, growing while the server runs). ``port``: the port the server will listen
        on, if it is a server (a remote host releases its tunnel to it at teardown). A host whose
        :attr:`redacts_logs` is true also takes ``redact``, a
        :class:`~autotune.config.secrets.StreamRedactor` the output passes through."""

    def endpoint(self, port: int) -> tuple[str, int]:
        """Where a client here connects to reach the server listening on ``port`` of this host."""
        return self.address, port

    def base_url(self, port: int) -> str:
        """``http://HOST:PORT`` of the server listening on ``port`` of this host, seen from here."""
        address, local_port = self.endpoint(port)
        return f"http://{address}:{local_port}"

    @abc.abstractmethod
    def kill_tagged(self, tag: str) -> bool:
        """SIGKILL every process on this host whose environment carries ``TAG_ENV=tag`` (what a
        dead driver left of a launch); returns True if anything was killed.

        Raises:
            HostFault: the host cannot be reached.
        """

    def close(self) -> None:
        """Release what the host object holds (connections, tunnels); it may be used again after."""

    @abc.abstractmethod
    def port_free(self, port: int) -> bool:
        """True if nothing listens on ``port``."""

    @abc.abstractmethod
    def free_port(self) -> int:
        """A port that is free now."""

    @abc.abstractmethod
    def check_launch(self, log_path: Path) -> None:
        """Raise :class:`HostFault` if a launch writing to ``log_path`` cannot work now (the log
        folder is not writable: ``log-unwritable``; its disk is full: ``disk-full``)."""

    def wait_port_free(self, port: int, timeout_s: float = 15.0) -> None:
        """Return once ``port`` is free; raise HostFault(port-busy) after ``timeout_s``."""
        if not wait_until(lambda: self.port_free(port), timeout_s, 0.1):
            raise HostFault("port-busy", f"port {port} on {self.name} still in use {timeout_s:.0f}s after teardown")


RELAY_DRAIN_S = 2.0
"""How long a dead server's relay may take to write what is left of its output to the log."""


class _LogRelay(threading.Thread):
    """Copies a server's output from a pipe to its log, redacted on the way (the file is 0600
    as every file the tool writes, under its umask)."""

    def __init__(self, pipe: IO[bytes], log_path: Path, redact: StreamRedactor) -> None:
        super().__init__(name=f"log-relay-{log_path.name}", daemon=True)
        self.pipe, self.log_path, self.redact = pipe, log_path, redact

    def run(self) -> None:
        log: IO[bytes] | None = None
        with self.pipe:
            try:
                log = open(self.log_path, "ab", buffering=0)
            except OSError:
                pass
            while True:
                try:
                    chunk = os.read(self.pipe.fileno(), 65536)
                except OSError:
                    break
                clean = self.redact.feed(chunk) if chunk else self.redact.end()
                try:
                    if log is not None:
                        log.write(clean)
                except OSError:  # the log's disk is full or gone: the output is dropped, never raw,
                    log.close()  # and the pipe still drained, so the server never blocks on it
                    log = None
                if not chunk:
                    break
        if log is not None:
            log.close()


class _LocalProcess(ServerProcess):
    def __init__(self, popen: subprocess.Popen[bytes], log_path: Path, tag: str,
                 relay: _LogRelay | None = None) -> None:
        self._popen = popen
        self.log_path = log_path
        self.tag = tag
        self.pgid = popen.pid  # start_new_session=True: the child leads its own group
        self._relay = relay

    def poll(self) -> int | None:
        code = self._popen.poll()
        if code is not None and self._relay is not None:
            self._relay.join(RELAY_DRAIN_S)  # its last words in the log before anyone reads them
            self._relay = None
        return code

    def niceness(self) -> int | None:
        try:
            return os.getpriority(os.PRIO_PROCESS, self._popen.pid)
        except OSError:
            return None

    def _alive(self) -> bool:
        self._popen.poll()  # reap the leader so that a dead group reads as gone
        return _group_alive(self.pgid) or bool(tagged_pids(self.tag))

    def _signal_all(self, sig: int) -> None:
        _signal_group(self.pgid, sig)
        for pid in tagged_pids(self.tag):
            _signal_pid(pid, sig)

    def stop(self, grace_s: float = 10.0, hurry: Callable[[], bool] | None = None) -> None:
        self._signal_all(signal.SIGTERM)
        wait_until(lambda: not self._alive() or (hurry is not None and hurry()), grace_s, 0.05)
        for _ in polling(10, 0.05):
            if not self._alive():
                break
            self._signal_all(signal.SIGKILL)
        try:
            self._popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        self.poll()


class LocalHost(Host):
    """This machine; servers listen on 127.0.0.1 unless the command says otherwise."""

    redacts_logs = True

    def __init__(self, address: str = "127.0.0.1", *, child_umask: int | None = None) -> None:
        self.name = "local"
        self.address = address
        self.bind_address = address
        self.python = sys.executable
        self.child_umask = -1 if child_umask is None else child_umask

    def launch(self, argv: Sequence[str], env: Mapping[str, str], log_path: Path, *, cwd: Path | None = None,
               port: int | None = None, redact: StreamRedactor | None = None) -> ServerProcess:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        tag = uuid.uuid4().hex
        full_env = {**os.environ, **env, "PYTHONUNBUFFERED": "1", TAG_ENV: tag}
        with open(log_path, "ab") as log:
            try:
                popen = subprocess.Popen(
                    list(argv),
                    env=full_env,
                    stdout=log if redact is None else subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                    cwd=cwd,
                    umask=self.child_umask,
                )
            except FileNotFoundError:
                raise HostFault("launch-failed", f"command not found on {self.name}: {argv[0]}") from None
            except PermissionError:
                raise HostFault("launch-failed", f"command not executable on {self.name}: {argv[0]}") from None
        relay = None
        if redact is not None:
            assert popen.stdout is not None
            relay = _LogRelay(popen.stdout, log_path, redact)
            relay.start()
        return _LocalProcess(popen, log_path, tag, relay)

    def port_free(self, port: int) -> bool:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    return False
                raise
        return True

    def free_port(self) -> int:
        return free_port(self.address)

    def check_launch(self, log_path: Path) -> None:
        check_log_folder(log_path)

    def kill_tagged(self, tag: str) -> bool:
        return kill_stale_local_server(None, (), tag)


def check_log_folder(log_path: Path) -> None:
    """Raise :class:`HostFault` unless ``log_path``'s folder (made if missing) is writable here
    (``log-unwritable``) and has :data:`MIN_FREE_BYTES` free (``disk-full``)."""
    folder = log_path.parent
    try:
        ensure_writable(folder)
    except OSError as exc:
        kind = "disk-full" if exc.errno == errno.ENOSPC else "log-unwritable"
        raise HostFault(kind, f"cannot write the trial log in {folder}: {exc.strerror}") from None
    free = shutil.disk_usage(folder).free
    if free < MIN_FREE_BYTES:
        raise HostFault("disk-full", f"only {free // 1024} KiB free under {folder} (a trial needs "
                                     f"{MIN_FREE_BYTES // 2**20} MiB for its log)")


def _signal_group(pgid: int | None, sig: int) -> None:
    if pgid:
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _signal_pid(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _group_alive(pgid: int | None) -> bool:
    if not pgid:
        return False
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _proc_pids() -> Iterable[int]:
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    return (int(n) for n in names if n.isdigit())


def tagged_pids(tag: str) -> list[int]:
    """Live processes (not zombies) whose environment carries ``TAG_ENV=tag``: one launch's tree,
    wherever its members moved (other sessions, other groups). Empty where /proc is missing."""
    marker = f"{TAG_ENV}={tag}".encode()
    found = []
    me = os.getpid()
    for pid in _proc_pids():
        if pid == me:
            continue
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
            if marker not in environ.split(b"\0"):
                continue
            state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != b"Z":
            found.append(pid)
    return found


def kill_stale_local_server(pgid: int | None, argv: Sequence[str], tag: str | None = None) -> bool:
    """Kill what a driver that died left of a launch; returns True if anything was killed.

    With the launch's ``tag``, every process carrying it is killed (a recycled pid never carries
    it, and a script's rewritten command line does not matter). Without one (trials recorded by
    older versions), the group ``pgid`` is killed only if its leader's command line equals ``argv``.
    """
    if tag:
        pids = tagged_pids(tag)
        for pid in pids:
            _signal_pid(pid, signal.SIGKILL)
        return bool(pids)
    if not pgid:
        return False
    try:
        cmdline = Path(f"/proc/{pgid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    if [c.decode(errors="replace") for c in cmdline if c] != list(argv):
        return False
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return False
    return True

