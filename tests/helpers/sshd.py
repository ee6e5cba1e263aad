"""A real sshd (Debian's openssh-server) on 127.0.0.1 with generated host and user keys.

The "remote" host is this machine. Without ``/usr/sbin/sshd`` a test that needs one skips, except
under CI (env var ``CI``), where that is a failure: .ci/run installs openssh-server.
"""

from __future__ import annotations

import getpass
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.util.net import free_port
from tests.needs import unavailable

SSHD = Path("/usr/sbin/sshd")
# The remote side runs this machine's interpreter: put its folder first on PATH (the setup line),
# and `{python}` is its name there, as on a real host with a virtual environment.
SETUP = f"export PATH={shlex.quote(str(Path(sys.executable).parent))}:\"$PATH\""
PYTHON = Path(sys.executable).name


def require_sshd() -> None:
    if not SSHD.is_file():
        unavailable(f"{SSHD} is missing (apt-get install openssh-server)")


def keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "autotune-test", "-f", str(path)],
                   check=True, capture_output=True)


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children first listed, then theirs)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        children.setdefault(int(stat[1]), []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


@dataclass
class Sshd:
    """A real sshd on 127.0.0.1:``port`` that accepts ``user_key`` for the current user."""

    folder: Path
    port: int
    user: str = field(default_factory=getpass.getuser)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def user_key(self) -> Path:
        return self.folder / "user_key"

    @property
    def url(self) -> str:
        return f"ssh://{self.user}@127.0.0.1:{self.port}"

    def known_hosts_line(self) -> str:
        kind, key = (self.folder / "host_key.pub").read_text().split()[:2]
        return f"[127.0.0.1]:{self.port} {kind} {key}\n"

    def write_known_hosts(self, path: Path, line: str | None = None) -> Path:
        path.write_text(self.known_hosts_line() if line is None else line)
        return path

    def start(self) -> None:
        if not (self.folder / "host_key").exists():
            keygen(self.folder / "host_key")
            keygen(self.user_key)
            (self.folder / "authorized_keys").write_text((self.folder / "user_key.pub").read_text())
            (self.folder / "home").mkdir()
        # Sessions get a home of their own, as on a fresh host: this machine's ~/.bashrc is
        # not run (a developer's `pyenv init` there takes a lock that a session killed by a
        # test would leave behind, stalling every later login).
        (self.folder / "sshd_config").write_text(
            f"Port {self.port}\nListenAddress 127.0.0.1\nHostKey {self.folder}/host_key\n"
            f"AuthorizedKeysFile {self.folder}/authorized_keys\nPidFile {self.folder}/sshd.pid\n"
            "UsePAM no\nStrictModes no\nPermitRootLogin prohibit-password\nPasswordAuthentication no\n"
            f"KbdInteractiveAuthentication no\nAllowTcpForwarding yes\nSetEnv HOME={self.folder}/home\n")
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # privilege separation needs it
        log = open(self.folder / "sshd.log", "ab")
        self.proc = subprocess.Popen([str(SSHD), "-D", "-e", "-f", str(self.folder / "sshd_config")],
                                     stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, (self.folder / "sshd.log").read_text()
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                    if s.recv(64).startswith(b"SSH-"):
                        return
            except OSError:
                time.sleep(0.05)
        raise AssertionError(f"sshd did not accept connections: {(self.folder / 'sshd.log').read_text()}")

    def drop_connections(self) -> None:
        """SIGKILL the per-connection sshd processes (and what they run): the clients' connections
        drop, the listener stays."""
        assert self.proc is not None
        for pid in descendants(self.proc.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def stop(self) -> None:
        """The whole sshd gone: connections dropped, nothing listening."""
        if self.proc is None:
            return
        self.drop_connections()
        self.proc.kill()
        self.proc.wait(10)
        self.proc = None


def new_sshd(folder: Path) -> Sshd:
    """A started sshd with its files in ``folder``, on a free port (another one if a process
    beside this one, e.g. another pytest-xdist worker, took the port before sshd bound it)."""
    require_sshd()
    log = folder / "sshd.log"
    for attempt in range(3):
        sshd = Sshd(folder, free_port())
        seen = log.stat().st_size if log.exists() else 0
        try:
            sshd.start()
            return sshd
        except AssertionError:
            if attempt == 2 or "Address already in use" not in log.read_text()[seen:]:
                raise
    raise AssertionError("unreachable")


def ssh_section(sshd: Sshd, tmp: Path, **changes: Any) -> dict[str, Any]:
    """The ``ssh`` section of a study config that logs in to ``sshd`` (files in ``tmp``), with ``changes``."""
    workdir = tmp / "remote work"  # a space in the remote path: it is quoted, not split
    workdir.mkdir(exist_ok=True)
    return {"key_filename": str(sshd.user_key), "known_hosts": str(sshd.write_known_hosts(tmp / "known_hosts")),
            "workdir": str(workdir), "setup": SETUP, "python": PYTHON, **changes}
