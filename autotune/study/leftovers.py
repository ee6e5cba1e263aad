"""What earlier drivers left behind: stale RUNNING trials and servers nobody tore down.

A trial still RUNNING under another owner when a driver takes the study's lease was run by a
dead driver: :meth:`Leftovers.recover` kills what it left running (on the host it recorded),
records it ``fault``/``interrupted`` and enqueues its parameters again. A server a teardown could
not reach is kept in the study's :data:`SERVERS_LEFT` attribute until a driver reaches its host
and kills it (:meth:`Leftovers.retry`, between trials). :meth:`Leftovers.tear_down` kills what
dead drivers left without writing anything (a command that refuses to run the study, e.g. a
resume missing a secret, still leaves no server behind); the caller checks that no live driver
owns the study.
"""

from __future__ import annotations

from typing import Any

import optuna
from optuna.trial import TrialState

from autotune.config.study import TargetConfig
from autotune.execution.host_factory import host_for
from autotune.execution.hosts import Host, HostFault, kill_stale_local_server
from autotune.store import record
from autotune.store.record import carried

SERVERS_LEFT = "servers_left"
"""Study user attr: ``[{"host", "tag", "trial"}]``, servers a teardown could not reach."""


class Leftovers:
    """The servers left running of one study, and how to reach their hosts.

    ``hosts``: host objects by name, shared with the caller (hosts made here for a name a stale
    trial recorded are added to it, with ``target``'s SSH options).
    """

    def __init__(self, target: TargetConfig, hosts: dict[str, Host]) -> None:
        self.target = target
        self.hosts = hosts
        self.left: list[dict[str, Any]] = []
        """Servers not yet killed (``{"host", "tag", "trial"}``), as last written to the study."""

    def recover(self, study: optuna.Study, me: str) -> None:
        """Fail and enqueue again the RUNNING trials of owners other than ``me`` after killing
        what they left running; kill the servers the study lists as left; write the list of
        those still not reached."""
        earlier = list(study.user_attrs.get(SERVERS_LEFT) or [])
        self.left = []
        for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if t.user_attrs.get("owner") == me:
                continue
            # The lease was free or taken from a dead owner: its RUNNING trials are stale.
            # Heartbeats only work inside study.optimize, so an ask/tell driver fails them itself,
            # after killing what the dead driver left running.
            self._kill_stale(t)
            record.write_stale(study, t, "its driver died while it ran")
            if t.params:
                study.enqueue_trial(dict(t.params), user_attrs={"retry_of": t.number, **carried(t.user_attrs)})
        self.left = self._kill_each(earlier) + self.left
        if earlier or self.left:
            study.set_user_attr(SERVERS_LEFT, list(self.left))

    def tear_down(self, study: optuna.Study) -> None:
        """Kill what the RUNNING trials and the :data:`SERVERS_LEFT` list of ``study`` left
        running, writing nothing: the trials stay RUNNING for the next driver to recover. Only
        for a study no live driver owns; a host that cannot be reached is skipped."""
        for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            self._kill_stale(t)
        self._kill_each(list(study.user_attrs.get(SERVERS_LEFT) or []))
        self.left = []

    def add(self, study: optuna.Study, host: str, tag: str, trial: int) -> None:
        """Keep a server the teardown of ``trial`` could not reach."""
        self.left.append({"host": host, "tag": tag, "trial": trial})
        study.set_user_attr(SERVERS_LEFT, list(self.left))

    def retry(self, study: optuna.Study) -> None:
        """Kill the servers teardowns could not reach, now that their host may answer again."""
        if not self.left:
            return
        still = self._kill_each(self.left)
        if still != self.left:
            self.left = still
            study.set_user_attr(SERVERS_LEFT, list(still))

    def _host(self, name: str) -> Host | None:
        """The host object of ``name`` (made on first use); None for a name no longer valid."""
        if name not in self.hosts:
            try:
                self.hosts[name] = host_for(self.target, name)
            except ValueError:
                return None
        return self.hosts[name]

    def _kill_stale(self, t: optuna.trial.FrozenTrial) -> None:
        """Kill what a RUNNING trial of a dead driver left running, on the host it recorded."""
        name = t.user_attrs.get("host") or "local"
        tag = t.user_attrs.get("server_tag")
        pgid = t.user_attrs.get("server_pgid")
        if name == "local" and not tag:  # recorded by versions that kept no tag
            kill_stale_local_server(int(pgid) if pgid else None, t.user_attrs.get("argv") or [], None)
            return
        if not tag:
            return
        self.left += self._kill_each([{"host": name, "tag": tag, "trial": t.number}])

    def _kill_each(self, servers: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Kill each listed server on its host; returns those whose host could not be reached."""
        still = []
        for entry in servers:
            host = self._host(str(entry.get("host")))
            try:
                if host is not None:
                    host.kill_tagged(str(entry.get("tag")))
            except HostFault:
                still.append(entry)
        return still
