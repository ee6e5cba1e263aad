"""Host-key policies of an SSH host's connection (paramiko's missing-host-key hook).

The host's key must be in ``known_hosts``: :class:`RefuseUnknownKey` raises :class:`UnknownHostKey`
for one that is not there; :class:`AcceptNewKey` accepts it and appends it to that file (trust on
first use, as ``ssh -o StrictHostKeyChecking=accept-new``). A changed key is refused by paramiko
itself (``BadHostKeyException``) under either policy.
"""

from __future__ import annotations

from pathlib import Path

import paramiko

__all__ = ["AcceptNewKey", "RefuseUnknownKey", "UnknownHostKey"]


class UnknownHostKey(paramiko.SSHException):
    """The host's key is not in ``known_hosts`` and unknown keys are refused."""


class RefuseUnknownKey(paramiko.MissingHostKeyPolicy):
    """Refuse a key that is not in ``known_hosts`` (:class:`UnknownHostKey`, naming the file)."""

    def __init__(self, known_hosts: str) -> None:
        self.known_hosts = known_hosts

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        raise UnknownHostKey(
            f"host key of {hostname} ({key.get_name()} {key.fingerprint}) is not in {self.known_hosts}: refused "
            f"(add it, e.g. with ssh-keyscan, or accept unknown host keys in the config)")


class AcceptNewKey(paramiko.MissingHostKeyPolicy):
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
