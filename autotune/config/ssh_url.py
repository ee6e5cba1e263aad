"""The config's spelling of an SSH host, ``ssh://[user@]host[:port]``, parsed.

:func:`parse_ssh_url` validates a ``target.hosts`` entry (the config) and gives the address an
SSH host connects to (:mod:`autotune.execution.sshhost`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["SSHAddress", "parse_ssh_url"]

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
