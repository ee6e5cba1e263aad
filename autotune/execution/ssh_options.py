"""How SSH hosts are reached and used: the config's ``target.ssh`` as plain values."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SSHOptions"]


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
