"""Hosts: where a server process runs, how its log is read, and how it is torn down.

``LocalHost`` runs the server as a subprocess in its own process group with stdout and stderr in
a log file. Teardown sends SIGTERM to the whole group, waits a grace period, then SIGKILL, and
checks that the port is free again before the next trial may start.
"""

from __future__ import annotations

import abc
import errno
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Mapping, Sequence


class HostFault(Exception):
    """The host, not the configuration, failed (port stuck, command missing, host unreachable)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class ServerProcess(abc.ABC):
    """A launched server: its exit status, its log, and its teardown."""

    log_path: Path

    @abc.abstractmethod
    def poll(self) -> int | None:
        """The exit code if the server has exited, else None."""

    @abc.abstractmethod
    def stop(self, grace_s: float = 10.0) -> None:
        """Stop the server and everything it started; returns when all of it is gone."""


class Host(abc.ABC):
    """A machine that runs servers. ``address`` is what clients connect to."""

    name: str
    address: str

    @abc.abstractmethod
    def launch(self, argv: Sequence[str], env: Mapping[str, str], log_path: Path, *, cwd: Path | None = None) -> ServerProcess:
        """Start ``argv`` with ``env`` added to the host's environment; output goes to ``log_path``."""

    @abc.abstractmethod
    def port_free(self, port: int) -> bool:
        """True if nothing listens on ``port``."""

    @abc.abstractmethod
    def free_port(self) -> int:
        """A port that is free now."""

    def wait_port_free(self, port: int, timeout_s: float = 15.0) -> None:
        """Return once ``port`` is free; raise HostFault(port-busy) after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while not self.port_free(port):
            if time.monotonic() > deadline:
                raise HostFault("port-busy", f"port {port} on {self.name} still in use {timeout_s:.0f}s after teardown")
            time.sleep(0.1)


class _LocalProcess(ServerProcess):
    def __init__(self, popen: subprocess.Popen[bytes], log_path: Path) -> None:
        self._popen = popen
        self.log_path = log_path
        self.pgid = popen.pid  # start_new_session=True: the child leads its own group

    def poll(self) -> int | None:
        return self._popen.poll()

    def _signal_group(self, sig: int) -> bool:
        try:
            os.killpg(self.pgid, sig)
            return True
        except ProcessLookupError:
            return False

    def _group_alive(self) -> bool:
        try:
            os.killpg(self.pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def stop(self, grace_s: float = 10.0) -> None:
        self._signal_group(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            self._popen.poll()
            if not self._group_alive():
                break
            time.sleep(0.05)
        else:
            self._signal_group(signal.SIGKILL)
            kill_deadline = time.monotonic() + 5
            while self._group_alive() and time.monotonic() < kill_deadline:
                self._popen.poll()
                time.sleep(0.05)
        try:
            self._popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


class LocalHost(Host):
    """This machine; servers listen on 127.0.0.1 unless the command says otherwise."""

    def __init__(self, address: str = "127.0.0.1") -> None:
        self.name = "local"
        self.address = address

    def launch(self, argv: Sequence[str], env: Mapping[str, str], log_path: Path, *, cwd: Path | None = None) -> ServerProcess:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        full_env = {**os.environ, **env, "PYTHONUNBUFFERED": "1"}
        with open(log_path, "ab") as log:
            try:
                popen = subprocess.Popen(
                    list(argv),
                    env=full_env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                    cwd=cwd,
                )
            except FileNotFoundError:
                raise HostFault("launch-failed", f"command not found on {self.name}: {argv[0]}") from None
            except PermissionError:
                raise HostFault("launch-failed", f"command not executable on {self.name}: {argv[0]}") from None
        return _LocalProcess(popen, log_path)

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
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])


def kill_stale_local_server(pgid: int, argv: Sequence[str]) -> bool:
    """Kill the process group ``pgid`` left by a driver that died, if it is still that server.

    The group leader's command line must equal ``argv`` (so a recycled pid is never touched).
    Returns True if a group was killed.
    """
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


def make_host(spec: str) -> Host:
    """A host from its config spelling. Only ``local`` exists in this version (the config
    validation rejects other spellings before a study starts)."""
    if spec != "local":
        raise ValueError(f"unsupported host '{spec}'")
    return LocalHost()
