"""SSH hosts: servers launched on another machine over SSH (Fabric), with LocalHost's contract.

An :class:`SSHHost` holds one Fabric connection to its host, opened on first use and opened
again when it dropped (between trials that is invisible; during a trial it is a fault):

- **Host keys.** The host's key must be in ``known_hosts`` (the configured file, else
  ``~/.ssh/known_hosts``); an unknown key is refused (``host-key-unknown``), a changed one always
  (``host-key-mismatch``). With ``accept_unknown_host_key`` an unknown key is accepted and
  appended to that file (trust on first use, as ``ssh -o StrictHostKeyChecking=accept-new``).
  Keys for authentication: ``key_filename``, else the agent and ``~/.ssh/id_*``; ``~/.ssh/config``
  applies as for ``ssh``.
- **Remote commands.** Every command runs as ``timeout -k 5 N sh -c 'SCRIPT'`` (Fabric's own
  timeout does not end a remote command), with ``N`` = ``command_timeout_s``. Every word that
  comes from a trial (argv, env values, paths) is quoted with :func:`shlex.quote`: no trial value
  is ever read by a shell. Only the configured ``setup`` line is shell text, on purpose.
- **Launch.** In ``workdir``, after ``setup`` (run by the user's login shell, so that e.g.
  ``source /opt/venv/bin/activate`` changes the server's environment), the server starts as
  ``setsid nohup env K=V ... AUTOTUNE_TRIAL_TAG=TAG sh -c '"$@"; echo $? > EXIT' ... > LOG 2>&1
  < /dev/null &``: its own session and process group (the printed PID is the group id), the tag
  in its environment and its children's, its log in ``WORKDIR/.autotune/TAG.log``, its exit
  status in ``TAG.exit``. The shell's niceness then (``nice``), which the server inherits, is
  :meth:`ServerProcess.niceness`.
- **Log.** A thread runs ``tail -c +1 --pid=PGID -F LOG`` over a channel of the same connection
  and appends what arrives to the local ``log_path`` that the runner tails; the tail ends with the
  server, then prints the exit status on its stderr. That status is trusted only when the tail
  ended with it; where it ended without one, or the connection dropped, the host is asked again
  (a new connection) whether the server still runs and what ``TAG.exit`` holds: a status there
  is the exit; a server still running, or a host that does not answer, is ``connection-lost``
  (the environment's fault, never the configuration's). After a dropped connection the rest of
  the log is fetched at teardown when the host answers again.
- **Ports.** The server binds 127.0.0.1 on its host; :meth:`SSHHost.endpoint` is the local end of
  an SSH tunnel (a listening socket on 127.0.0.1, each connection a ``direct-tcpip`` channel).
- **Teardown.** SIGTERM to the group and to every process whose environment carries the tag
  (found in ``/proc/*/environ``), SIGKILL after the grace period, until none is left (zombies
  do not count); then the tunnel is closed, the remote log files removed, and where ``nvidia-smi``
  exists, the GPUs' used memory must be back to what it was before the launch (within
  :data:`GPU_SLACK_MIB`, waited for up to :data:`GPU_RELEASE_S`), else ``gpu-busy``.
- **Faults.** Cannot connect: ``host-unreachable``; connection dropped: ``connection-lost``; a
  command past its timeout: ``remote-timeout``; refused key or login: ``host-key-unknown``,
  ``host-key-mismatch``, ``auth-failed``. A teardown that cannot reach the host raises
  :class:`~autotune.execution.hosts.ServerLeftRunning`; the host kills that server before its next launch
  (in :meth:`SSHHost.check_launch`) or whenever :meth:`SSHHost.kill_tagged` reaches it.

The remote host needs a POSIX login shell, GNU coreutils (``timeout``, ``tail --pid``,
``nohup``), util-linux ``setsid``, ``grep -z`` and ``/proc``: any common Linux distribution.
"""

from __future__ import annotations

import logging
import random
import re
import select
import shlex
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

import invoke
import paramiko
from fabric import Connection

from autotune.execution.hosts import MIN_FREE_BYTES, TAG_ENV, Host, HostFault, ServerLeftRunning, ServerProcess, check_log_folder

__all__ = ["SSHAddress", "SSHHost", "SSHOptions", "parse_ssh_url"]

GPU_SLACK_MIB = 512
"""GPU memory (MiB per GPU) above the pre-launch level that still counts as released."""
GPU_RELEASE_S = 30.0
"""How long teardown waits for the GPUs' memory to come back before a ``gpu-busy`` fault."""
KEEPALIVE_S = 15
LOG_DIR = ".autotune"
"""The folder, under the remote working directory, of the servers' logs and exit-status files."""
REMOTE_PORTS = (20000, 32767)
"""Where :meth:`SSHHost.free_port` picks ports: below Linux's default ephemeral range."""

# A tunnel's connection to a port where nothing listens yet (health polls during start-up) is
# refused, and paramiko logs each refusal as an error: without a handler of their own, Python would
# print them on stderr. They still reach the root logger where an application configured one.
logging.getLogger("paramiko.transport").addHandler(logging.NullHandler())

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SSH_URL = re.compile(
    r"ssh://(?:(?P<user>[A-Za-z0-9_][A-Za-z0-9_.-]*)@)?"
    r"(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?)"
    r"(?::(?P<port>[0-9]{1,5}))?/?"
)


@dataclass(frozen=True)
class SSHAddress:
    """A parsed ``ssh://[user@]host[:port]``; None: from ``~/.ssh/config`` or the defaults."""

    host: str
    user: str | None = None
    port: int | None = None


def parse_ssh_url(spec: str) -> SSHAddress:
    """Parse ``ssh://[user@]host[:port]`` (an IPv6 address in brackets).

    Raises:
        ValueError: a one-line reason naming the spec.
    """
    m = _SSH_URL.fullmatch(spec)
    if m is None:
        raise ValueError(f"host '{spec}' is not ssh://[user@]host[:port] (e.g. ssh://root@gpu1:22)")
    port = int(m["port"]) if m["port"] else None
    if port is not None and not 1 <= port <= 65535:
        raise ValueError(f"host '{spec}': port {port} is not between 1 and 65535")
    return SSHAddress(m["host"].strip("[]"), m["user"], port)


@dataclass(frozen=True)
class SSHOptions:
    """How to reach and use SSH hosts (the config's ``target.ssh``, as plain values).

    ``key_filename``/``known_hosts``: None for the usual places (agent, ``~/.ssh``).
    ``workdir``: the remote folder servers start in (``~`` and ``~/...`` are the remote home).
    ``setup``: a shell line run before each server in the same shell (e.g. activating a venv).
    ``python``: the remote interpreter that fills ``{python}``.
    """

    key_filename: str | None = None
    known_hosts: str | None = None
    accept_unknown_host_key: bool = False
    workdir: str = "~"
    setup: str = ""
    python: str = "python3"
    connect_timeout_s: float = 10.0
    command_timeout_s: float = 60.0


class _UnknownHostKey(paramiko.SSHException):
    pass


class _RefuseUnknownKey(paramiko.MissingHostKeyPolicy):
    def __init__(self, known_hosts: str) -> None:
        self.known_hosts = known_hosts

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        raise _UnknownHostKey(
            f"host key of {hostname} ({key.get_name()} {key.fingerprint}) is not in {self.known_hosts}: refused "
            f"(add it, e.g. with ssh-keyscan, or accept unknown host keys in the config)")


class _AcceptNewKey(paramiko.MissingHostKeyPolicy):
    """Accept an unknown key and append it to ``known_hosts`` (later connections check it)."""

    def __init__(self, known_hosts: str) -> None:
        self.known_hosts = known_hosts

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        client.get_host_keys().add(hostname, key.get_name(), key)
        path = Path(self.known_hosts).expanduser()
        line = paramiko.hostkeys.HostKeyEntry([hostname], key).to_line()
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            with open(path, "a") as f:
                f.write(line)
        except OSError:
            pass  # accepted for this connection; the next one accepts it again


_GPU_QUERY = ("command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits "
              "2>/dev/null | sed 's/^/gpu-mib /'")
"""Prints ``gpu-mib N`` for each GPU (used MiB), nothing where there is no ``nvidia-smi``."""


def _gpu_memory(stdout: str) -> list[int] | None:
    """The GPUs' used MiB from :data:`_GPU_QUERY`'s output; None where there was none."""
    found = [int(float(v)) for v in re.findall(r"^gpu-mib ([0-9.]+)\s*$", stdout, re.M)]
    return found or None


def _reason(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return " ".join(text.split())


def _shell_path(path: str) -> str:
    """``path`` as one shell word; a leading ``~`` is the remote user's home."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


class SSHHost(Host):
    """A host reached over SSH (see the module docstring for the whole contract).

    One object per host, no shared state: each holds its own connection, tunnels and the tags of
    servers it could not tear down. Methods that touch the host raise
    :class:`~autotune.execution.hosts.HostFault` when it cannot be reached.
    """

    remote = True

    def __init__(self, spec: str, options: SSHOptions | None = None) -> None:
        self.name = spec
        self.target = parse_ssh_url(spec)
        self.options = options or SSHOptions()
        self.address = "127.0.0.1"  # tunnels' local ends
        self.bind_address = "127.0.0.1"
        self.python = self.options.python
        self._lock = threading.RLock()
        self._conn: Connection | None = None
        self._forwards: dict[int, _Forward] = {}
        self._left: dict[str, int | None] = {}  # tag -> pgid of servers a teardown could not reach
        self._rng = random.Random()

    def __repr__(self) -> str:
        return f"SSHHost({self.name!r})"

    # -- the connection ---------------------------------------------------------------------------
    def _known_hosts(self) -> str:
        return self.options.known_hosts or "~/.ssh/known_hosts"

    def connection(self) -> Connection:
        """The open connection, opened now if there is none or it dropped.

        Raises:
            HostFault: ``host-unreachable`` (``connection-lost`` when an open connection dropped
                and cannot be opened again), ``host-key-unknown``, ``host-key-mismatch`` or
                ``auth-failed``.
        """
        with self._lock:
            if self._conn is not None and self._conn.is_connected:
                return self._conn
            dropped = self._conn is not None
            self._drop()
            timeout = max(1, int(round(self.options.connect_timeout_s)))
            kwargs: dict[str, object] = {"banner_timeout": timeout, "auth_timeout": timeout}
            if self.options.key_filename:
                kwargs["key_filename"] = str(Path(self.options.key_filename).expanduser())
            conn = Connection(self.target.host, user=self.target.user, port=self.target.port,
                              connect_timeout=timeout, connect_kwargs=kwargs)
            client = conn.client
            known = self._known_hosts()
            if self.options.known_hosts:
                try:
                    client.get_host_keys().load(str(Path(known).expanduser()))
                except FileNotFoundError:
                    pass  # every key is unknown
            else:
                client.load_system_host_keys()
            client.set_missing_host_key_policy(
                _AcceptNewKey(known) if self.options.accept_unknown_host_key else _RefuseUnknownKey(known))
            try:
                conn.open()
            except _UnknownHostKey as exc:
                conn.close()
                raise HostFault("host-key-unknown", f"{self.name}: {exc}") from None
            except paramiko.BadHostKeyException as exc:
                conn.close()
                raise HostFault("host-key-mismatch", f"{self.name}: host key does not match {known} "
                                                     f"({exc.key.get_name()} {exc.key.fingerprint}): refused") from None
            except paramiko.AuthenticationException as exc:
                conn.close()
                raise HostFault("auth-failed", f"{self.name} refused the login of user {conn.user}: {_reason(exc)}") from None
            except (OSError, EOFError, paramiko.SSHException, ValueError) as exc:
                conn.close()
                if dropped:
                    raise HostFault("connection-lost", f"lost the connection to {self.name} and cannot connect "
                                                       f"again: {_reason(exc)}") from None
                raise HostFault("host-unreachable", f"cannot connect to {self.name}: {_reason(exc)}") from None
            assert conn.transport is not None
            conn.transport.set_keepalive(KEEPALIVE_S)
            self._conn = conn
            return conn

    def _drop(self) -> None:
        """Close the connection and every tunnel of it (after it dropped, or to release it)."""
        with self._lock:
            for fwd in self._forwards.values():
                fwd.close()
            self._forwards.clear()
            if self._conn is not None:
                try:
                    self._conn.close()
                except Exception:  # noqa: BLE001 - a dead connection may fail to close; it is gone either way
                    pass
                self._conn = None

    def close(self) -> None:
        self._drop()

    def run(self, script: str, *, timeout_s: float | None = None, shell: str = "sh") -> invoke.Result:
        """Run ``script`` (POSIX shell text) on the host under ``timeout``; returns Fabric's
        result (``exited``, ``stdout``, ``stderr``) whatever the exit status.

        ``shell``: the remote shell word that runs it (``sh``, or the login shell for ``setup``).

        Raises:
            HostFault: ``host-unreachable`` (cannot connect), ``connection-lost`` (it dropped),
                ``remote-timeout`` (the command ran past its timeout).
        """
        limit = timeout_s or self.options.command_timeout_s
        command = f"timeout -k 5 {limit:g} {shell} -c {shlex.quote(script)}"
        conn = self.connection()
        try:
            result = conn.run(command, hide=True, warn=True, in_stream=False, timeout=limit + 15)
        except invoke.exceptions.CommandTimedOut:
            if not conn.is_connected:
                self._drop()
                raise HostFault("connection-lost", f"lost the connection to {self.name}") from None
            raise HostFault("remote-timeout", f"a command on {self.name} did not answer within {limit + 15:g}s") from None
        except (OSError, EOFError, paramiko.SSHException, invoke.exceptions.ThreadException) as exc:
            self._drop()
            raise HostFault("connection-lost", f"lost the connection to {self.name}: {_reason(exc)}") from None
        if not conn.is_connected:  # the channel closed with the connection: no exit status
            self._drop()
            raise HostFault("connection-lost", f"lost the connection to {self.name}")
        if result.exited == 124:
            raise HostFault("remote-timeout", f"a command on {self.name} ran past its {limit:g}s timeout")
        return result

    # -- Host -------------------------------------------------------------------------------------
    def endpoint(self, port: int) -> tuple[str, int]:
        """The local end of a tunnel to 127.0.0.1:``port`` on the host (made on first use)."""
        with self._lock:
            conn = self.connection()
            fwd = self._forwards.get(port)
            if fwd is None or fwd.closed or fwd.transport is not conn.transport:
                if fwd is not None:
                    fwd.close()
                assert conn.transport is not None
                fwd = self._forwards[port] = _Forward(conn.transport, port)
            return "127.0.0.1", fwd.port

    def _close_forward(self, port: int | None) -> None:
        with self._lock:
            fwd = self._forwards.pop(port, None) if port is not None else None
        if fwd is not None:
            fwd.close()

    def _listening_ports(self) -> set[int]:
        result = self.run("cat /proc/net/tcp /proc/net/tcp6 2>/dev/null")
        ports = set()
        for line in result.stdout.splitlines():
            fields = line.split()
            if len(fields) > 3 and fields[3] == "0A" and ":" in fields[1]:  # 0A: LISTEN
                try:
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
                except ValueError:
                    continue
        return ports

    def port_free(self, port: int) -> bool:
        return port not in self._listening_ports()

    def free_port(self) -> int:
        busy = self._listening_ports()
        while True:
            port = self._rng.randint(*REMOTE_PORTS)
            if port not in busy:
                return port

    def check_launch(self, log_path: Path) -> None:
        """The local log folder as LocalHost checks it; on the host, the working directory must
        exist and be writable (``log-unwritable``) with room (``disk-full``). Servers left by a
        teardown that could not reach the host are killed first."""
        check_log_folder(log_path)
        self._kill_left()
        workdir = self.options.workdir
        script = (f"cd {_shell_path(workdir)} 2>/dev/null || exit 90\n"
                  f"mkdir -p {LOG_DIR} 2>/dev/null\n"
                  "df -Pk . | awk 'NR==2 {print \"free \" $4}'\n"
                  f"probe={LOG_DIR}/.write-probe-$$\n"
                  'touch "$probe" 2>/dev/null && rm -f "$probe" || exit 91\n')
        result = self.run(script)
        if result.exited == 90:
            raise HostFault("log-unwritable", f"working directory {workdir} does not exist on {self.name}")
        m = re.search(r"^free (\d+)$", result.stdout, re.M)
        free = int(m.group(1)) * 1024 if m else None
        if free is not None and free < MIN_FREE_BYTES:
            raise HostFault("disk-full", f"only {free // 1024} KiB free under {workdir} on {self.name} (a trial "
                                         f"needs {MIN_FREE_BYTES // 2**20} MiB)")
        if result.exited != 0:
            raise HostFault("log-unwritable", f"working directory {workdir} on {self.name} is not writable")

    def launch(self, argv: Sequence[str], env: Mapping[str, str], log_path: Path, *, cwd: Path | None = None,
               port: int | None = None) -> ServerProcess:
        """Start ``argv`` on the host (in ``cwd`` if given, else the working directory, after the
        setup line) in a session of its own; its log streams into ``log_path``.

        Raises:
            HostFault: ``launch-failed`` (no working directory, no such command), ``setup-failed``,
                ``log-unwritable``, or the connection faults.
        """
        for key in env:
            if not _ENV_NAME.fullmatch(key):
                raise HostFault("launch-failed", f"'{key}' is not an environment variable name")
        if not argv:
            raise HostFault("launch-failed", "empty command")
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab"):  # there from the launch on, as a local server's
            pass
        tag = uuid.uuid4().hex
        assignments = " ".join(shlex.quote(f"{k}={v}") for k, v in
                               {**env, "PYTHONUNBUFFERED": "1", TAG_ENV: tag}.items())
        words = " ".join(shlex.quote(a) for a in argv)
        folder = shlex.quote(str(cwd)) if cwd is not None else _shell_path(self.options.workdir)
        lines = [f"cd {folder} || exit 90"]
        if self.options.setup.strip():
            lines.append(f"{{ {self.options.setup}\n}} >&2 || exit 91")
        lines += [
            _GPU_QUERY,
            f"mkdir -p {LOG_DIR} || exit 92",
            f"command -v {shlex.quote(argv[0])} >/dev/null 2>&1 || exit 93",
            # One background job, alone on its line: `cd X && setsid ... &` would keep the channel.
            f"setsid nohup env {assignments} sh -c '\"$@\"; echo $? > \"$0\"' {LOG_DIR}/{tag}.exit {words} "
            f"> {LOG_DIR}/{tag}.log 2>&1 < /dev/null &",
            'echo "autotune-pgid $!"',
            # what the server inherited: the login shell's niceness after the setup line
            'echo "autotune-nice $(nice 2>/dev/null)"',
        ]
        result = self.run("\n".join(lines), shell='"${SHELL:-/bin/sh}"')
        where = f"{cwd or self.options.workdir} on {self.name}"
        problems = {90: ("launch-failed", f"working directory {where} does not exist"),
                    91: ("setup-failed", f"the setup line failed in {where}"),
                    92: ("log-unwritable", f"cannot make {LOG_DIR}/ in {where}"),
                    93: ("launch-failed", f"command not found on {self.name}: {argv[0]}")}
        if result.exited in problems:
            kind, message = problems[result.exited]
            detail = " ".join(result.stderr.split())[-300:]
            raise HostFault(kind, f"{message}{': ' + detail if detail else ''}")
        m = re.search(r"^autotune-pgid (\d+)$", result.stdout, re.M)
        if result.exited != 0 or m is None:
            raise HostFault("launch-failed", f"launch on {self.name} failed (exit {result.exited}): "
                                             f"{' '.join(result.stderr.split())[-300:]}")
        pgid = int(m.group(1))
        nice = re.search(r"^autotune-nice (-?\d+)$", result.stdout, re.M)
        gpu_before = _gpu_memory(result.stdout)
        conn = self.connection()
        assert conn.transport is not None
        stream = _LogStream(conn.transport, self._stream_command(tag, pgid, folder), log_path)
        stream.start()
        return _SSHProcess(self, conn.transport, stream, log_path, tag, pgid, folder, port, gpu_before,
                           int(nice.group(1)) if nice else None)

    def _stream_command(self, tag: str, pgid: int, folder: str) -> str:
        log, status = f"{LOG_DIR}/{tag}.log", f"{LOG_DIR}/{tag}.exit"
        # Bounded by the server's life (--pid), not by a timeout: it ends at teardown.
        script = (f"cd {folder} || exit 90; tail -c +1 -s 0.2 --pid={pgid} -F {log} 2>/dev/null; "
                  f"if [ -f {status} ]; then cat {status} 1>&2; fi; exit 0")
        return f"sh -c {shlex.quote(script)}"

    def kill_tagged(self, tag: str) -> bool:
        """SIGKILL every process on the host carrying ``tag``; True if there was one."""
        if not re.fullmatch(r"[0-9a-f]+", tag):
            return False  # not a tag this tool made
        self._kill_left()
        found = self._signal(tag, None, "0") > 0
        if found:
            self._kill(tag, None)
        return found

    # -- teardown pieces --------------------------------------------------------------------------
    def _signal(self, tag: str, pgid: int | None, sig: str, wait_s: float = 0.0) -> int:
        """Send ``sig`` (TERM, KILL, or 0 to send nothing) to group ``pgid`` and to every process
        carrying ``tag``, then wait up to ``wait_s`` for all of them to be gone; returns how many
        are alive (zombies do not count). One remote command."""
        return self._signal_output(tag, pgid, sig, wait_s)[0]

    def _signal_output(self, tag: str, pgid: int | None, sig: str, wait_s: float = 0.0,
                       then: str = "") -> tuple[int, str]:
        """:meth:`_signal`'s count, and the stdout of its command with ``then`` (shell text) run
        after it."""
        assert sig in ("TERM", "KILL", "0") and re.fullmatch(r"[0-9a-f]+", tag)
        group = str(pgid) if pgid else ""
        rounds = max(0, int(wait_s / 0.1))
        script = f"""T={tag}; G={group}
tagged() {{ grep -l -s -z -x -F "{TAG_ENV}=$T" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3 | tr '\n' ' '; }}
alive() {{
  t=" $(tagged) "; n=0
  for d in /proc/[0-9]*; do
    {{ read -r s < $d/stat; }} 2>/dev/null || continue
    set -- ${{s##*) }}
    [ "$1" = Z ] && continue
    if [ "$3" = "$G" ]; then n=$((n+1)); else case "$t" in *" ${{d#/proc/}} "*) n=$((n+1));; esac; fi
  done
  echo $n
}}
if [ {sig} != 0 ]; then
  [ -n "$G" ] && kill -{sig} -$G 2>/dev/null
  for p in $(tagged); do kill -{sig} $p 2>/dev/null; done
fi
i=0; n=$(alive)
while [ "$n" -gt 0 ] && [ $i -lt {rounds} ]; do sleep 0.1; i=$((i+1)); n=$(alive); done
echo "alive $n"
{then}"""
        result = self.run(script)
        m = re.search(r"^alive (\d+)$", result.stdout, re.M)
        if m is None:
            raise HostFault("launch-failed", f"cannot list processes on {self.name}: {' '.join(result.stderr.split())[-200:]}")
        return int(m.group(1)), result.stdout

    def _server_state(self, tag: str, pgid: int | None, folder: str) -> tuple[int, int | None]:
        """How many processes of the server (group ``pgid``, or carrying ``tag``) are alive, and
        the exit status in its ``TAG.exit`` file (None: no such file), read after counting them
        (a server that exited meanwhile has written its status). One remote command."""
        status = f"{LOG_DIR}/{tag}.exit"
        alive, stdout = self._signal_output(
            tag, pgid, "0", then=f"cd {folder} 2>/dev/null && [ -f {status} ] && echo \"status $(cat {status})\"\n")
        m = re.search(r"^status (-?\d+)\s*$", stdout, re.M)
        return alive, int(m.group(1)) if m else None

    def _kill(self, tag: str, pgid: int | None, grace_s: float = 0.0, hurry: Callable[[], bool] | None = None) -> None:
        """SIGTERM, up to ``grace_s`` (or until ``hurry()``), then SIGKILL until nothing is left
        (at most 10 s more). Waits on the host in rounds of at most 2 s (``hurry`` is checked
        between rounds)."""
        deadline = time.monotonic() + grace_s
        alive = self._signal(tag, pgid, "TERM", min(2.0, grace_s)) if grace_s > 0 else 1
        while alive and time.monotonic() < deadline and not (hurry is not None and hurry()):
            alive = self._signal(tag, pgid, "0", min(2.0, max(0.1, deadline - time.monotonic())))
        deadline = time.monotonic() + 10
        while alive and time.monotonic() < deadline:
            alive = self._signal(tag, pgid, "KILL", 2.0)

    def _kill_left(self) -> None:
        """Kill the servers a teardown left running when the host could not be reached."""
        for tag, pgid in list(self._left.items()):
            self._kill(tag, pgid)
            self._left.pop(tag, None)

    def _clean_up(self, tag: str, folder: str, gpu_before: list[int] | None) -> None:
        """Remove a stopped server's remote files; where its launch saw the GPUs' memory, wait
        until it is back to that level (``gpu-busy`` after :data:`GPU_RELEASE_S`)."""
        deadline = time.monotonic() + GPU_RELEASE_S
        script = f"cd {folder} && rm -f {LOG_DIR}/{tag}.log {LOG_DIR}/{tag}.exit\n{_GPU_QUERY}"
        while True:
            now = _gpu_memory(self.run(script).stdout)
            if gpu_before is None or now is None or len(now) != len(gpu_before):
                return
            held = [(i, n, b) for i, (n, b) in enumerate(zip(now, gpu_before)) if n > b + GPU_SLACK_MIB]
            if not held:
                return
            if time.monotonic() > deadline:
                shown = ", ".join(f"GPU{i} {n} MiB (was {b} MiB)" for i, n, b in held)
                raise HostFault("gpu-busy", f"GPU memory on {self.name} not released {GPU_RELEASE_S:g}s after "
                                            f"teardown: {shown}")
            time.sleep(1.0)

    def _fetch_log_rest(self, tag: str, folder: str, log_path: Path, limit: int = 8 * 1024 * 1024) -> None:
        """Append to ``log_path`` what the remote log holds beyond it (after a lost stream)."""
        try:
            offset = log_path.stat().st_size
        except OSError:
            offset = 0
        result = self.run(f"cd {folder} && tail -c +{offset + 1} {LOG_DIR}/{tag}.log 2>/dev/null | head -c {limit}")
        if result.stdout:
            with open(log_path, "ab") as f:
                f.write(result.stdout.encode("utf-8", errors="replace"))


def _exit_code(status: int) -> int:
    """A server's exit code from its wrapper shell's ``$?`` (a signal's as its negative number)."""
    return -(status - 128) if 128 < status < 128 + 65 else status  # sh reports a signal as 128+N


class _SSHProcess(ServerProcess):
    def __init__(self, host: SSHHost, transport: paramiko.Transport, stream: _LogStream, log_path: Path, tag: str,
                 pgid: int, folder: str, port: int | None, gpu_before: list[int] | None,
                 niceness: int | None = None) -> None:
        self._host = host
        self._transport = transport
        self._stream = stream
        self.log_path = log_path
        self.tag = tag
        self.pgid = pgid
        self._folder = folder
        self._port = port
        self._gpu_before = gpu_before
        self._niceness = niceness
        self._code: int | None = None
        self._fault: HostFault | None = None
        self._stopped = False

    def poll(self) -> int | None:
        """The exit code once the server has exited (a signal's as its negative number; -1 if it
        is gone without a status), else None.

        An exit code is trusted only when known: the log stream's, at its normal end. Where the
        stream ended without one, or the connection dropped, the host is asked again (over a
        new connection if need be) whether the server still runs and what its ``TAG.exit``
        holds: a status there is the exit code; a server still running, or a host that does
        not answer, is the fault below (raised again by later calls).

        Raises:
            HostFault: ``connection-lost`` (the connection dropped while the server ran: not the
                server's failure), ``log-unwritable`` (the local log).
        """
        if self._code is not None:
            return self._code
        if self._fault is not None:
            raise self._fault
        stream = self._stream
        if not stream.done.is_set() and stream.channel_closed():
            stream.join(5.0)  # its channel closed (its connection may have dropped): it ends now
        if stream.done.is_set():
            if stream.error and not stream.lost:
                raise HostFault("log-unwritable", f"cannot write the trial log {self.log_path}: {stream.error}")
            if stream.exit_code is not None and not stream.lost:
                self._code = _exit_code(stream.exit_code)
                return self._code
        elif self._transport.is_active():
            return None
        try:
            self._code = self._ask_host(stream.lost or not self._transport.is_active())
        except HostFault as fault:
            self._fault = fault
            raise
        return self._code

    def _ask_host(self, lost: bool) -> int:
        """The exit code from the host itself (the log stream brought none; ``lost``: its
        connection dropped). Two tries: the first may still meet the dropped connection."""
        host, name = self._host, self._host.name
        for attempt in (1, 2):
            try:
                alive, status = host._server_state(self.tag, self.pgid, self._folder)
                break
            except HostFault as fault:
                if fault.kind in ("host-key-unknown", "host-key-mismatch", "auth-failed"):
                    raise
                if attempt == 2:
                    raise HostFault("connection-lost", f"lost the connection to {name} while the server ran, "
                                                       f"and cannot ask it again: {fault}") from None
        if status is not None:
            return _exit_code(status)
        if alive:
            raise HostFault("connection-lost", f"lost the connection to {name} while the server ran "
                                               f"(it still runs there)")
        if lost:
            raise HostFault("connection-lost", f"lost the connection to {name} while the server ran, and the "
                                               f"server is gone from it without an exit status")
        return -1

    def niceness(self) -> int | None:
        """The niceness the server started at: the remote shell's after the setup line, which the
        server inherits (read with ``nice`` at launch; None where the host's ``nice`` printed none)."""
        return self._niceness

    def stop(self, grace_s: float = 10.0, hurry: Callable[[], bool] | None = None) -> None:
        if self._stopped:
            return
        self._stopped = True
        host = self._host
        try:
            for attempt in (1, 2):  # a connection that dropped is opened again, once
                try:
                    host._kill(self.tag, self.pgid, grace_s, hurry)
                    break
                except HostFault as fault:
                    if attempt == 1 and fault.kind == "connection-lost":
                        continue
                    host._left[self.tag] = self.pgid
                    raise ServerLeftRunning(
                        fault.kind, f"{fault}; the server (tag {self.tag}) may still run on {host.name}: it is "
                                    f"killed when the host answers again", self.tag) from None
            self._stream.join(5.0)
            self._stream.close()
            if self._stream.lost:
                host._fetch_log_rest(self.tag, self._folder, self.log_path)
            host._clean_up(self.tag, self._folder, self._gpu_before)
        finally:
            host._close_forward(self._port)


class _LogStream(threading.Thread):
    """Runs ``command`` (a tail of the remote log) on a channel and appends its stdout to
    ``log_path``; its stderr, at the end, is the server's exit status (``exit_code``; None where
    it printed none). ``lost``: the connection dropped before the command ended (the channel
    closed without an exit status of its own)."""

    def __init__(self, transport: paramiko.Transport, command: str, log_path: Path) -> None:
        super().__init__(name=f"ssh-log-{log_path.name}", daemon=True)
        self.transport = transport
        self.command = command
        self.log_path = log_path
        self.done = threading.Event()
        self.lost = False
        self.error = ""
        self.exit_code: int | None = None
        self._chan: paramiko.Channel | None = None

    def run(self) -> None:
        try:
            self._run()
        except (OSError, EOFError, paramiko.SSHException) as exc:
            if not self.transport.is_active() or not isinstance(exc, OSError):
                self.lost = True
            else:
                self.error = _reason(exc)
        finally:
            self.done.set()

    def _recv(self, read: Callable[[int], bytes]) -> bytes | None:
        """The next bytes (b"" at the end); None when the connection dropped."""
        while True:
            try:
                return read(65536)
            except socket.timeout:
                if not self.transport.is_active():
                    return None

    def _run(self) -> None:
        chan = self._chan = self.transport.open_session(timeout=15)
        chan.settimeout(0.5)
        chan.exec_command(self.command)
        with open(self.log_path, "ab") as log:
            while True:
                data = self._recv(chan.recv)
                if data is None:
                    self.lost = True
                    return
                if not data:
                    break
                log.write(data)
                log.flush()
        err = b""
        while True:
            part = self._recv(chan.recv_stderr)
            if part is None:
                self.lost = True
                return
            if not part:
                break
            err += part
        if not chan.status_event.wait(5.0) or chan.exit_status == -1:
            # No exit status: the channel closed with its connection (paramiko closes the
            # channels before it marks the transport inactive), not at the command's end.
            self.lost = True
            return
        text = err.decode(errors="replace").strip()
        if text.lstrip("-").isdigit():
            self.exit_code = int(text)

    def channel_closed(self) -> bool:
        """Whether the channel has closed: at the command's end, or with its connection (paramiko
        closes the channels before it marks the transport inactive)."""
        return self._chan is not None and self._chan.closed

    def close(self) -> None:
        if self._chan is not None:
            self._chan.close()


class _Forward:
    """A local TCP listener on 127.0.0.1 whose connections are tunnelled to 127.0.0.1:``remote_port``
    on the far side of ``transport`` (one ``direct-tcpip`` channel each)."""

    def __init__(self, transport: paramiko.Transport, remote_port: int) -> None:
        self.transport = transport
        self.remote_port = remote_port
        self.closed = False
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(128)
        self._sock.settimeout(0.2)
        self.port: int = self._sock.getsockname()[1]
        threading.Thread(target=self._accept, name=f"ssh-forward-{remote_port}", daemon=True).start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, peer = self._sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            threading.Thread(target=self._pipe, args=(client, peer), daemon=True).start()

    def _pipe(self, client: socket.socket, peer: tuple[str, int]) -> None:
        try:
            chan = self.transport.open_channel("direct-tcpip", ("127.0.0.1", self.remote_port), peer, timeout=10)
        except (OSError, EOFError, paramiko.SSHException):
            client.close()  # nothing listens there (yet), or the connection dropped
            return
        try:
            while not self.closed:
                ready, _, _ = select.select([client, chan], [], [], 0.5)
                if client in ready:
                    data = client.recv(65536)
                    if not data:
                        break
                    chan.sendall(data)
                if chan in ready:
                    data = chan.recv(65536)
                    if not data:
                        break
                    client.sendall(data)
                if not self.transport.is_active():
                    break
        except (OSError, EOFError, paramiko.SSHException):
            pass
        finally:
            chan.close()
            client.close()

    def close(self) -> None:
        self.closed = True
        try:
            self._sock.close()
        except OSError:
            pass
