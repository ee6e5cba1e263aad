"""Host objects from their config spelling: ``local`` or ``ssh://[user@]host[:port]``.

:func:`make_host` builds one host from its spelling; :func:`make_hosts` and :func:`host_for` do so
for a target's ``hosts``, SSH hosts with its ``ssh`` section (:func:`ssh_options`).
"""

from __future__ import annotations

from autotune.config.study import TargetConfig
from autotune.execution.hosts import Host, LocalHost
from autotune.execution.ssh_options import SSHOptions
from autotune.execution.sshhost import SSHHost

__all__ = ["host_for", "make_host", "make_hosts", "ssh_options"]


def make_host(spec: str, *, child_umask: int | None = None, ssh: SSHOptions | None = None) -> Host:
    """A new host object from its config spelling: ``local``, or ``ssh://[user@]host[:port]``
    (an :class:`~autotune.execution.sshhost.SSHHost` with ``ssh``'s options; defaults if None).
    ``child_umask``: the umask of servers launched locally (None: ours).

    Raises:
        ValueError: any other spelling (the config validation rejects them before a study starts).
    """
    if spec == "local":
        return LocalHost(child_umask=child_umask)
    if spec.startswith("ssh://"):
        return SSHHost(spec, ssh)
    raise ValueError(f"unsupported host '{spec}' (expected 'local' or ssh://[user@]host[:port])")


def host_for(target: TargetConfig, spec: str, *, child_umask: int | None = None) -> Host:
    """A new host object for ``spec`` (a ``target.hosts`` entry), SSH hosts with ``target.ssh``.

    Raises:
        ValueError: an unsupported spelling (see :func:`make_host`).
    """
    return make_host(spec, child_umask=child_umask, ssh=ssh_options(target) if spec.startswith("ssh://") else None)


def make_hosts(target: TargetConfig, *, child_umask: int | None = None) -> dict[str, Host]:
    """One host object per distinct entry of ``target.hosts``, by name, in order.

    ``child_umask``: the umask of servers launched locally (None: ours).
    """
    return {spec: host_for(target, spec, child_umask=child_umask) for spec in target.hosts}


def ssh_options(target: TargetConfig) -> SSHOptions:
    """``target.ssh`` as the :class:`~autotune.execution.ssh_options.SSHOptions` an SSH host takes."""
    return SSHOptions(**target.ssh.model_dump()) if target.ssh is not None else SSHOptions()
