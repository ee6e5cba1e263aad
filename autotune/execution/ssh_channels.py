"""The channels of an SSH host's connection: a server's log streamed here, a port tunnelled here.

:class:`LogStream` runs ``tail -c +1 --pid=PGID -F LOG`` on the host over a channel and appends
what arrives to the local log that the runner tails; the tail ends with the server, then prints
the exit status on its stderr (``exit_code``). It is ``lost`` when the connection dropped before
the command ended. :class:`Forward` is the local end of an SSH tunnel: a listening socket on
127.0.0.1 whose every connection is a ``direct-tcpip`` channel to 127.0.0.1:PORT on the host.
"""

from __future__ import annotations

import select
import socket
import threading
from pathlib import Path
from typing import Callable

import paramiko

from autotune.config.secrets import StreamRedactor

__all__ = ["Forward", "LogStream", "reason"]


def reason(exc: BaseException) -> str:
    """``exc`` as one line of text (its type's name where it has no message)."""
    text = str(exc).strip() or type(exc).__name__
    return " ".join(text.split())


class LogStream(threading.Thread):
    """Runs ``command`` (a tail of the remote log) on a channel and appends its stdout to
    ``log_path`` (through ``redact`` where given); its stderr, at the end, is the server's exit status (``exit_code``; None where
    it printed none). ``lost``: the connection dropped before the command ended (the channel
    closed without an exit status of its own)."""

    def __init__(self, transport: paramiko.Transport, command: str, log_path: Path,
                 redact: StreamRedactor | None = None) -> None:
        super().__init__(name=f"ssh-log-{log_path.name}", daemon=True)
        self.transport = transport
        self.command = command
        self.log_path = log_path
        self.redact = redact
        """Where given, every chunk passes through it before it is written: no secret reaches the file."""
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
                self.error = reason(exc)
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
                    if self.redact is not None:
                        log.write(self.redact.end())
                    break
                log.write(self.redact.feed(data) if self.redact is not None else data)
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


class Forward:
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
