"""What a study would launch first, without launching it: ``autotune study start --dry-run``.

:func:`baseline_launch` builds the baseline trial's server command and env exactly as its runner
would (:meth:`~autotune.execution.runner.TrialRunner.command`, on the first slot), with secrets
shown as ``${NAME}`` references and the port as ``{port}`` where the study picks a free one.
:func:`describe` says in a few lines what the study runs: the space, the load and the budget.
Nothing is launched, recorded or created.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from autotune.config.secrets import Redactor
from autotune.execution.executors import make_runner
from autotune.execution.hosts import Host
from autotune.execution.slots import host_slots
from autotune.execution.stopping import StopRequest
from autotune.execution.trial import TrialSpec
from autotune.study.build import Plan
from autotune.util.text import counted

__all__ = ["BaselineLaunch", "baseline_launch", "describe"]


@dataclass(frozen=True)
class BaselineLaunch:
    """The baseline trial's server launch: ``argv`` and the ``env`` set on top of the host's
    (secrets as references), the host and slot it runs on, and its baseline ``params``."""

    argv: list[str]
    env: dict[str, str]
    host: str
    slot: str
    params: dict[str, object]


def baseline_launch(plan: Plan, hosts: Mapping[str, Host]) -> BaselineLaunch | None:
    """The launch of ``plan``'s baseline on the first slot of ``hosts``; None where the engine
    runs no server (``engine: none``: the objective's benchmark command is the trial)."""
    cfg = plan.config
    target = cfg.target
    slot = host_slots(target.hosts, host_gpus=target.host_gpus, gpus_per_trial=target.gpus_per_trial)[0]
    runner = make_runner(cfg, plan.objective, hosts[slot.host], slot, stop=StopRequest(), log_dir=Path(os.devnull),
                         public=plan.space.applied_names())
    if runner.preset.serverless:
        return None
    params = plan.space.complete(cfg.baseline)
    launch = plan.space.to_launch(params)
    argv, env = runner.command(TrialSpec(0, env=launch.env, args=launch.args), runner.port or "{port}")
    redactor = Redactor(env, argv, target.secrets, public=plan.space.applied_names())
    shown = redactor.launch(env, argv)
    return BaselineLaunch(shown.argv, shown.env, slot.host, slot.name, dict(params))


def describe(plan: Plan, trials: int | None = None) -> list[str]:
    """A few lines on what ``plan``'s study runs: space, objective and load, budget, storage."""
    cfg, space, objective = plan.config, plan.space, plan.objective
    lines = [f"space {space.name}: {counted(len(space.parameters), 'parameter')} ({', '.join(space.parameters)})"]
    direction = "higher" if objective.direction == "maximize" else "lower"
    lines.append(f"objective {objective.name}: {objective.metric}, {direction} is better")
    loads = [x.spec for x in objective.loads] or ([objective.load] if objective.benchmark is None else [])
    for load in loads:
        lines.append(f"  load: {counted(load.num_prompts, 'request')} of {load.input_len} tokens in, "
                     f"{load.output_len} out, {load.concurrency} in flight")
    if objective.benchmark is not None:
        lines.append(f"  benchmark command: {objective.benchmark.command}")
    budget = trials or cfg.budget.trials
    parts = [counted(budget, "trial")] if budget else []
    if cfg.budget.hours:
        parts.append(f"{cfg.budget.hours:g} h")
    lines.append(f"budget: {' or '.join(parts) or 'none'}; storage {cfg.storage}")
    return lines
