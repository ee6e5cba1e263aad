"""SSH hosts: servers launched on another machine over SSH (Fabric), with LocalHost's contract.

An :class:`SSHHost` (one per ``ssh://[user@]host[:port]``, with :class:`~autotune.execution.ssh_options.SSHOptions`)
holds one Fabric connection, opened on first use and again when it dropped (between trials that is
invisible; during a trial it is a fault). Host keys must be known (:mod:`autotune.execution.ssh_host_keys`);
keys for authentication: ``key_filename``, else the agent and ``~/.ssh/id_*``; ``~/.ssh/config`` applies.

- **Commands** run as ``timeout -k 5 N sh -c 'SCRIPT'`` (``N`` = ``command_timeout_s``); every word
  from a trial (argv, env values, paths) is quoted: only the configured ``setup`` line is shell text.
- **Launch**: in ``workdir``, after ``setup`` (in the user's login shell, so that it can change the
  server's environment), ``setsid nohup env K=V ... AUTOTUNE_TRIAL_TAG=TAG sh -c ...``: its own
  session and group, the tag in its environment, its log and exit status in ``WORKDIR/.autotune/``
  (:mod:`autotune.execution.ssh_scripts`). Its niceness is the shell's after ``setup``.
- **Log and ports** (:mod:`autotune.execution.ssh_channels`): the log streams into the local
  ``log_path``; an exit status is trusted only from the stream's normal end, else the host is asked
  again; a server still running, or a host that does not answer, is ``connection-lost``.
  :meth:`SSHHost.endpoint` is the local end of a tunnel to the server's 127.0.0.1 port.
- **Teardown**: SIGTERM to the group and every tagged process, SIGKILL after the grace period, until
  none is left; then the tunnel closes, the remote files go, and the GPUs' used memory (where
  ``nvidia-smi`` exists) must be back within :data:`GPU_SLACK_MIB` in :data:`GPU_RELEASE_S`, else ``gpu-busy``.
- **Faults**: ``host-unreachable``, ``connection-lost``, ``remote-timeout``, ``host-key-unknown``,
  ``host-key-mismatch``, ``auth-failed``. A teardown that cannot reach the host raises
  :class:`~autotune.execution.hosts.ServerLeftRunning`; that server is killed before the next launch
  (:meth:`SSHHost.check_launch`) or whenever :meth:`SSHHost.kill_tagged` reaches the host.

The remote host needs a POSIX login shell, GNU coreutils (``timeout``, ``tail --pid``, ``nohup``),
util-linux ``setsid``, ``grep -z`` and ``/proc``: any common Linux distribution.
"""

from __future__ import annotations

import logging
import random
import re
import shlex
import threading
import time
import uuid
from pathlib import Path
from typing import Callable, Mapping, Sequence

import invoke
import paramiko
from fabric import Connection

from autotune.config.secrets import StreamRedactor
from autotune.config.ssh_url import parse_ssh_url
from autotune.execution.hosts import MIN_FREE_BYTES, TAG_ENV, Host, HostFault, ServerLeftRunning, ServerProcess, check_log_folder
from autotune.execution.ssh_channels import Forward, LogStream, reason
from autotune.execution.ssh_host_keys import AcceptNewKey, RefuseUnknownKey, UnknownHostKey
from autotune.execution.ssh_options import SSHOptions
from autotune.execution.ssh_scripts import (GPU_QUERY, LOG_DIR, exit_code, gpu_memory, signal_script,
                                            stream_command)
from autotune.util.polling import polling
from autotune.util.text import shell_path

__all__ = ["SSHHost"]

GPU_SLACK_MIB = 512
"""GPU memory (MiB per GPU) above the pre-launch level that still counts as released."""
GPU_RELEASE_S = 30.0
"""How long teardown waits for the GPUs' memory to come back before a ``gpu-busy`` fault."""
KEEPALIVE_S = 15
REMOTE_PORTS = (20000, 32767)
"""Where :meth:`SSHHost.free_port` picks ports: below Linux's default ephemeral range."""

# A tunnel's connection to a port where nothing listens yet (health polls during start-up) is
# refused, and paramiko logs each refusal as an error: without a handler of their own, Python would
# print them on stderr. They still reach the root logger where an application configured one.
logging.getLogger("paramiko.transport").addHandler(logging.NullHandler())

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class SSHHost(Host):
    """A host reached over SSH (see the module docstring for the whole contract).

    One object per host, no shared state: each holds its own connection, tunnels and the tags of
    servers it could not tear down. Methods that touch the host raise
    :class:`~autotune.execution.hosts.HostFault` when it cannot be reached.
    """

    remote = True
    redacts_logs = True

    def __init__(self, spec: str, options: SSHOptions | None = None) -> None:
        self.name = spec
        self.target = parse_ssh_url(spec)
        self.options = options or SSHOptions()
        self.address = "127.0.0.1"  # tunnels' local ends
        self.bind_address = "127.0.0.1"
        self.python = self.options.python
        self._lock = threading.RLock()
        self._conn: Connection | None = None
        self._forwards: dict[int, Forward] = {}
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
                AcceptNewKey(known) if self.options.accept_unknown_host_key else RefuseUnknownKey(known))
            try:
                conn.open()
            except UnknownHostKey as exc:
                conn.close()
                raise HostFault("host-key-unknown", f"{self.name}: {exc}") from None
            except paramiko.BadHostKeyException as exc:
                conn.close()
                raise HostFault("host-key-mismatch", f"{self.name}: host key does not match {known} "
                                                     f"({exc.key.get_name()} {exc.key.fingerprint}): refused") from None
            except paramiko.AuthenticationException as exc:
                conn.close()
                raise HostFault("auth-failed", f"{self.name} refused the login of user {conn.user}: {reason(exc)}") from None
            except (OSError, EOFError, paramiko.SSHException, ValueError) as exc:
                conn.close()
                if dropped:
                    raise HostFault("connection-lost", f"lost the connection to {self.name} and cannot connect "
                                                       f"again: {reason(exc)}") from None
                raise HostFault("host-unreachable", f"cannot connect to {self.name}: {reason(exc)}") from None
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
            raise HostFault("connection-lost", f"lost the connection to {self.name}: {reason(exc)}") from None
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
                fwd = self._forwards[port] = Forward(conn.transport, port)
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
        script = (f"cd {shell_path(workdir)} 2>/dev/null || exit 90\n"
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
               port: int | None = None, redact: StreamRedactor | None = None) -> ServerProcess:
        """Start ``argv`` on the host (in ``cwd`` if given, else the working directory, after the
        setup line) in a session of its own; its log streams into ``log_path``, through ``redact``
        where given (the remote copy under the working directory stays the server's own).

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
        folder = shlex.quote(str(cwd)) if cwd is not None else shell_path(self.options.workdir)
        lines = [f"cd {folder} || exit 90"]
        if self.options.setup.strip():
            lines.append(f"{{ {self.options.setup}\n}} >&2 || exit 91")
        lines += [
            GPU_QUERY,
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
        gpu_before = gpu_memory(result.stdout)
        conn = self.connection()
        assert conn.transport is not None
        stream = LogStream(conn.transport, stream_command(tag, pgid, folder), log_path, redact)
        stream.start()
        return _SSHProcess(self, conn.transport, stream, log_path, tag, pgid, folder, port, gpu_before,
                           int(nice.group(1)) if nice else None)

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
        script = signal_script(tag, pgid, sig, wait_s, then)
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
        script = f"cd {folder} && rm -f {LOG_DIR}/{tag}.log {LOG_DIR}/{tag}.exit\n{GPU_QUERY}"
        held: list[tuple[int, int, int]] = []
        for _ in polling(GPU_RELEASE_S, 1.0):
            now = gpu_memory(self.run(script).stdout)
            if gpu_before is None or now is None or len(now) != len(gpu_before):
                return
            held = [(i, n, b) for i, (n, b) in enumerate(zip(now, gpu_before)) if n > b + GPU_SLACK_MIB]
            if not held:
                return
        shown = ", ".join(f"GPU{i} {n} MiB (was {b} MiB)" for i, n, b in held)
        raise HostFault("gpu-busy", f"GPU memory on {self.name} not released {GPU_RELEASE_S:g}s after teardown: {shown}")

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


class _SSHProcess(ServerProcess):
    def __init__(self, host: SSHHost, transport: paramiko.Transport, stream: LogStream, log_path: Path, tag: str,
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
                self._code = exit_code(stream.exit_code)
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
            return exit_code(status)
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
