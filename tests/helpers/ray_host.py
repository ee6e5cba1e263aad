"""A host for Ray's cluster launcher on this machine: a real sshd in namespaces of its own.

``ray up`` against this machine's own processes would collide with every other Ray a test runs:
the head's ``ray stop`` stops every Ray process it can see, and its ports (6379, 8265, 10001, ...)
and ``/tmp/ray`` are fixed. So the sshd of :class:`RayHost`, and all that its sessions start, run
in a PID namespace (``ray stop`` sees only them), a network namespace (loopback only: the head's
ports collide with nothing) and a mount namespace whose ``/tmp/ray`` is a folder of the test's.
The launcher reaches the sshd through :meth:`RayHost.proxy_command` (Ray's ``ssh_proxy_command``),
which enters the network namespace. :meth:`RayHost.stop` kills the namespace's first process, and
with it the kernel kills every process left there: nothing a test started outlives it.

Needs root (``unshare``, ``nsenter``, ``mount``) and ``/usr/sbin/sshd``; a test that cannot have
them is skipped, or fails under CI (:func:`tests.needs.unavailable`).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

from tests.helpers.sshd import SSHD, Sshd, descendants, keygen
from tests.needs import unavailable

# The namespace's first process: loopback up, /tmp/ray bound to the host's own folder, sshd -D
# started, every orphan reaped (Ray's daemons end up here), exit when sshd does.
INIT = r"""
import fcntl, os, socket, struct, subprocess, sys, time
folder, sshd = sys.argv[1], sys.argv[2]
with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
    flags = struct.unpack("16sh22x", fcntl.ioctl(s, 0x8913, struct.pack("16sh22x", b"lo", 0)))[1]
    fcntl.ioctl(s, 0x8914, struct.pack("16sh22x", b"lo", flags | 1))
os.makedirs("/tmp/ray", exist_ok=True)
subprocess.run(["mount", "--bind", os.path.join(folder, "ray-tmp"), "/tmp/ray"], check=True)
log = open(os.path.join(folder, "sshd.log"), "ab")
server = subprocess.Popen([sshd, "-D", "-e", "-f", os.path.join(folder, "sshd_config")], stdout=log, stderr=log,
                          stdin=subprocess.DEVNULL)
for _ in range(600):
    try:
        with socket.create_connection(("127.0.0.1", 22), timeout=1) as c:
            if c.recv(64).startswith(b"SSH-"):
                open(os.path.join(folder, "ready"), "w").close()
                break
    except OSError:
        time.sleep(0.05)
while True:
    pid, status = os.wait()
    if pid == server.pid:
        sys.exit(1)
"""

# Ray's ssh_proxy_command: a byte pipe between ssh's stdin/stdout and the namespace's sshd.
RELAY = r"""
import os, selectors, socket, sys
conn = socket.create_connection(("127.0.0.1", 22))
sel = selectors.DefaultSelector()
sel.register(0, selectors.EVENT_READ)
sel.register(conn, selectors.EVENT_READ)
while True:
    for key, _ in sel.select():
        if key.fileobj == 0:
            data = os.read(0, 65536)
            if not data:
                sel.unregister(0)
                conn.shutdown(socket.SHUT_WR)
            else:
                conn.sendall(data)
        else:
            data = conn.recv(65536)
            if not data:
                sys.exit(0)
            view = memoryview(data)
            while view:
                view = view[os.write(1, view):]
"""


def require_namespaces() -> None:
    """Return if this process may make the namespaces (root, util-linux), else unavailable."""
    if not SSHD.is_file():
        unavailable(f"{SSHD} is missing (apt-get install openssh-server)")
    if os.geteuid() != 0 or not (shutil.which("unshare") and shutil.which("nsenter")):
        unavailable("a Ray host in namespaces of its own needs root, unshare and nsenter (util-linux)")
    probe = subprocess.run(["unshare", "--pid", "--net", "--mount", "--fork", "--mount-proc", "true"],
                           capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        unavailable(f"this machine refuses new namespaces (a container without CAP_SYS_ADMIN?): {probe.stderr.strip()}")


@dataclass
class RayHost(Sshd):
    """sshd on 127.0.0.1:22 of its own namespaces, accepting ``user_key`` for the current user;
    sessions get ``home`` as $HOME."""

    port: int = 22

    @property
    def home(self) -> Path:
        return self.folder / "home"

    def proxy_command(self) -> str:
        """Reaches the sshd from this machine's network (no quotes: Ray passes it through rsync's -e)."""
        assert self.proc is not None
        return f"nsenter --net=/proc/{self.proc.pid}/ns/net {sys.executable} {self.folder / 'relay.py'}"

    def start(self) -> None:
        require_namespaces()
        for key in ("host_key", "user_key"):
            keygen(self.folder / key)
        (self.folder / "authorized_keys").write_text((self.folder / "user_key.pub").read_text())
        self.home.mkdir()
        (self.folder / "ray-tmp").mkdir()
        (self.folder / "init.py").write_text(INIT)
        (self.folder / "relay.py").write_text(RELAY)
        (self.folder / "sshd_config").write_text(
            f"Port 22\nListenAddress 127.0.0.1\nHostKey {self.folder}/host_key\n"
            f"AuthorizedKeysFile {self.folder}/authorized_keys\nPidFile {self.folder}/sshd.pid\n"
            "UsePAM no\nStrictModes no\nPermitRootLogin prohibit-password\nPasswordAuthentication no\n"
            f"KbdInteractiveAuthentication no\nSetEnv HOME={self.home}\n")
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            ["unshare", "--pid", "--net", "--mount", "--fork", "--mount-proc",
             sys.executable, str(self.folder / "init.py"), str(self.folder), str(SSHD)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=open(self.folder / "init.log", "ab"))
        deadline = time.monotonic() + 60  # a guard against a hang
        while not (self.folder / "ready").exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                log = self.folder / "sshd.log"
                raise AssertionError(f"the Ray host's sshd did not start: {(self.folder / 'init.log').read_text()}"
                                     f"{log.read_text() if log.exists() else ''}")
            time.sleep(0.05)

    def provide_python(self, leave_out: tuple[str, ...] = ("autotune", "pip")) -> None:
        """Give the host this interpreter's base installation as ``python3`` (on PATH from
        ~/.bashrc) and this environment's packages installed for the user, less those whose names
        start with ``leave_out`` (and editable installs): a .pth in the user site-packages names a
        folder of links to them. pip's index is off (~/.config/pip/pip.conf), so an install finds
        its requirements there or fails at once."""
        bin_dir = self.home / "bin"
        bin_dir.mkdir()
        (bin_dir / "python3").symlink_to(os.path.realpath(sys._base_executable))  # type: ignore[attr-defined]
        with open(self.home / ".bashrc", "a") as rc:
            rc.write('export PATH="$HOME/bin:$PATH"\n')
        links = self.folder / "packages"
        links.mkdir()
        for site in dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib")):
            for entry in Path(site).iterdir():
                name = entry.name.lower().lstrip("_")
                if entry.suffix == ".pth" or name.startswith((*leave_out, "editable")):
                    continue
                if not (links / entry.name).exists():
                    (links / entry.name).symlink_to(entry)
        user_site = self.home / ".local" / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
        user_site.mkdir(parents=True)
        (user_site / "test-host-packages.pth").write_text(f"{links}\n")
        (self.home / ".config" / "pip").mkdir(parents=True)
        (self.home / ".config" / "pip" / "pip.conf").write_text("[global]\nno-index = true\n")

    def pids(self) -> list[int]:
        """The processes in the host's PID namespace, as this machine numbers them."""
        if self.proc is None:
            return []
        try:
            ns = os.readlink(f"/proc/{self.proc.pid}/ns/pid_for_children")
        except OSError:
            return []
        out = []
        for pid in descendants(self.proc.pid):
            try:
                if os.readlink(f"/proc/{pid}/ns/pid") == ns:
                    out.append(pid)
            except OSError:
                pass
        return out

    def commands(self) -> list[str]:
        """The command lines of the host's processes."""
        out = []
        for pid in self.pids():
            try:
                out.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
            except OSError:
                pass
        return out

    def stop(self) -> None:
        """SIGKILL the namespace's first process: the kernel kills the rest of the namespace."""
        if self.proc is None:
            return
        for pid in descendants(self.proc.pid)[:1]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None
