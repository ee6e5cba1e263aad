"""What a study records about itself when it is opened, and the check that it is the same study.

:func:`write_identity` stores, once, the config (secrets redacted: :func:`stored_config`), the
objective, the space's name and distributions (:func:`space_signature`) and its monotone
declarations; :func:`check_same` refuses to continue a study of the same name with another
direction, other objectives or another space (:class:`StudyMismatchError`).
:func:`record_host_facts` adds what each host says about its GPUs, driver, NCCL and engine
package, for a profile's provenance.
"""

from __future__ import annotations

import datetime
import shlex
from typing import Any, Mapping

import optuna

from autotune.analysis.explain import MONOTONE_ATTR
from autotune.config.objective import Objective
from autotune.config.secrets import Redactor
from autotune.config.space import SearchSpace
from autotune.config.study import StudyConfig
from autotune.engines import get_preset
from autotune.errors import UsageError
from autotune.execution.hosts import Host
from autotune.execution.provenance import host_facts, runner_for

HOST_FACTS = "host_facts"
"""Study user attr: each host's facts by host name (:func:`record_host_facts`)."""


class StudyMismatchError(UsageError):
    """A study of this name exists with another direction or another search space."""


def stored_config(config: StudyConfig, space: SearchSpace) -> dict[str, Any]:
    """The config as stored with the study: secrets in ``target.env`` and ``target.command``
    replaced by ``${NAME}`` references (supplied from the environment on resume); the space's
    parameters are public."""
    data = config.model_dump(mode="json")
    target = config.target
    redactor = Redactor(target.env, (), target.secrets, public=space.applied_names())
    data["target"]["env"] = redactor.env(target.env)[0]
    if target.command:
        redacted = redactor.command(target.command)
        if shlex.split(redacted) != shlex.split(target.command):
            data["target"]["command"] = redacted
    return data


def space_signature(space: SearchSpace) -> dict[str, str]:
    """Each parameter's Optuna distribution, as JSON."""
    return {n: optuna.distributions.distribution_to_json(d) for n, d in space.distributions().items()}


def write_identity(study: optuna.Study, config: StudyConfig, space: SearchSpace, objective: Objective) -> None:
    """Store the study's config, objective and space, unless a config is stored already."""
    if "config" in study.user_attrs:
        return
    study.set_user_attr("config", stored_config(config, space))
    stored: dict[str, Any] = {"name": objective.name, "metric": objective.metric, "direction": objective.direction,
                              "constraints": [str(c) for c in objective.constraints]}
    if objective.multi:  # the first objective above; all of them, and the rule choosing from the front
        stored.update(objectives=[g.to_json() for g in objective.goals], choose=objective.choice.to_json())
    study.set_user_attr("objective", stored)
    study.set_user_attr("space", space.name)
    study.set_user_attr("space_distributions", space_signature(space))
    study.set_user_attr(MONOTONE_ATTR, space.monotone())  # what `study explain` scopes rules by
    study.set_user_attr("created", datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))


def check_same(study: optuna.Study, name: str, space: SearchSpace, objective: Objective) -> None:
    """Check that the stored study ``name`` has the objective's directions (and metrics, for a
    multi-objective one) and the space's distributions (those of its trials when recorded
    before the signature was kept).

    Raises:
        StudyMismatchError: it differs; the message names the first difference.
    """
    stored_directions = [d.name.lower() for d in study.directions]
    if stored_directions != objective.directions:
        raise StudyMismatchError(
            f"study '{name}' exists with direction {', '.join(stored_directions)}, the objective says "
            f"{', '.join(objective.directions)}: use another --name"
        )
    listed = (study.user_attrs.get("objective") or {}).get("objectives")
    if objective.multi and isinstance(listed, list):
        stored_metrics = [str((g or {}).get("metric")) for g in listed]
        metrics = [g.metric for g in objective.goals]
        if stored_metrics != metrics:
            raise StudyMismatchError(f"study '{name}' exists with objectives {', '.join(stored_metrics)}, the "
                                     f"objective says {', '.join(metrics)}: use another --name")
    stored = study.user_attrs.get("space_distributions")
    if stored is None:
        # Studies recorded before the signature was kept: compare the trials' distributions.
        stored = {}
        for t in study.get_trials(deepcopy=False):
            for n, d in t.distributions.items():
                stored.setdefault(n, optuna.distributions.distribution_to_json(d))
        if not stored:
            return
    current = space_signature(space)
    for n in sorted(set(stored) | set(current)):
        if n not in current:
            problem = f"parameter '{n}' is not in search space {space.name}"
        elif n not in stored:
            problem = f"parameter '{n}' is new"
        elif optuna.distributions.json_to_distribution(stored[n]) != optuna.distributions.json_to_distribution(current[n]):
            problem = f"parameter '{n}' changed from {stored[n]} to {current[n]}"
        else:
            continue
        raise StudyMismatchError(f"study '{name}' was run with another search space ({problem}): use another --name")


def hosts_facts(config: StudyConfig, hosts: Mapping[str, Host], known: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What each host not in ``known`` says about its GPUs, driver, NCCL and engine package, by
    host name (the package's version is read from its metadata: nothing is imported). Under Ray
    with local slots the trials run on the nodes, which the driver does not reach: nothing for them."""
    package = get_preset(config.target.engine).package
    return {name: host_facts(runner_for(host), python=host.python, package=package)
            for name, host in hosts.items()
            if name not in (known or {}) and not (config.executor == "ray" and not host.remote)}


def record_host_facts(study: optuna.Study, config: StudyConfig, hosts: Mapping[str, Host],
                      new: Mapping[str, Any] | None = None) -> None:
    """:func:`hosts_facts` in the study's :data:`HOST_FACTS`, once per host (a resume asks only
    hosts new to the study); ``new``: those facts, read already."""
    facts = dict(study.user_attrs.get(HOST_FACTS) or {})
    new = hosts_facts(config, hosts, facts) if new is None else {k: v for k, v in new.items() if k not in facts}
    if new:
        study.set_user_attr(HOST_FACTS, {**facts, **new})
