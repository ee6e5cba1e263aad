"""One place that turns a study config into what runs it.

:func:`plan` loads the config's search space and objective and checks them together;
:func:`executor` makes the executor of its target (one runner per slot of its hosts, or Ray);
:func:`driver` the :class:`~autotune.study.driver.Driver` that runs the study; :func:`close` lets go
of what the driver holds. `autotune study start`, `autotune bench tuner` (with a model in place of
the executor) and their tests build studies with these. :func:`profile_objective` and
:func:`profile_runner` make the objective and the runner that `autotune verify` measures a
profile with: the study's runner, from what the profile recorded.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from autotune.config.objective import Objective
from autotune.config.space import SearchSpace
from autotune.config.study import StudyConfig, TargetConfig
from autotune.engines import get_preset
from autotune.engines.registry import PRESETS
from autotune.errors import UsageError
from autotune.execution.executors import Executor, SerialExecutor, make_runner, runner_fields
from autotune.execution.hosts import Host
from autotune.execution.runner import TrialRunner
from autotune.execution.slots import host_slots
from autotune.execution.stopping import StopRequest
from autotune.store.storage import artifact_dir
from autotune.search.factory import SamplerFactory
from autotune.study.driver import Driver
from autotune.study.reporting import Reporter


@dataclass(frozen=True)
class Plan:
    """A study's config with its loaded search space and objective."""

    config: StudyConfig
    space: SearchSpace
    objective: Objective


def plan(cfg: StudyConfig, *,
         baseline_from: Callable[[StudyConfig, SearchSpace], dict[str, Any]] | None = None) -> Plan:
    """Load ``cfg``'s space and objective, and check them before anything runs.

    Args:
        cfg: The study config.
        baseline_from: Gives the baseline when ``cfg.baseline_from`` names another study (from its
            best trial); it replaces ``cfg.baseline`` in the returned plan's config.

    Raises:
        ConfigError: the space or objective cannot be loaded.
        UsageError: the baseline is not in the space, or the engine runs no server and the
            objective has no ``benchmark`` command.
    """
    space = SearchSpace.load(cfg.space)
    objective = Objective.load_file(cfg.objective, cfg.objective_overrides)
    if cfg.baseline_from is not None and baseline_from is not None:
        cfg = cfg.model_copy(update={"baseline": baseline_from(cfg, space)})
    space.complete(cfg.baseline)  # validate the baseline before anything runs
    if get_preset(cfg.target.engine).serverless and objective.benchmark is None:
        raise UsageError(f"engine '{cfg.target.engine}' runs no server: the objective needs a 'benchmark' command")
    return Plan(cfg, space, objective)


def executor(p: Plan, hosts: Mapping[str, Host], *, stop: StopRequest, child_umask: int | None = None) -> Executor:
    """The executor of ``p``'s target: a Ray executor (``executor: ray``), else a serial one with
    a runner per slot of ``hosts`` (``target.hosts``' host objects, by name). Servers log under
    the storage's artifact folder; ``child_umask`` is the umask of servers launched locally."""
    cfg = p.config
    log_dir = artifact_dir(cfg.storage) / "logs" / cfg.name
    public = p.space.applied_names()
    if cfg.executor == "ray":
        from autotune.execution.ray_executor import RayExecutor

        return RayExecutor(cfg, p.objective, log_dir=log_dir, public=public, child_umask=child_umask)
    target = cfg.target
    slots = host_slots(target.hosts, host_gpus=target.host_gpus, gpus_per_trial=target.gpus_per_trial)
    runners = {s.name: make_runner(cfg, p.objective, hosts[s.host], s, stop=stop, log_dir=log_dir, public=public,
                                   child_umask=child_umask) for s in slots}
    return SerialExecutor(runners, slots)


def driver(p: Plan, ex: Executor, *, reporter: Reporter | None = None, trials: int | None = None,
           stop: StopRequest | None = None, hosts: Mapping[str, Host] | None = None,
           sampler: SamplerFactory | None = None, skip_implied: bool = True) -> Driver:
    """The driver of ``p``'s study on ``ex``; the options are :class:`~autotune.study.driver.Driver`'s
    (``sampler`` None: the config's ``sampler``)."""
    return Driver(p.config, p.space, p.objective, ex, reporter=reporter, trials=trials, stop=stop, hosts=hosts,
                  sampler=sampler, skip_implied=skip_implied)


def close(d: Driver) -> None:
    """Close the driver's executor and every host it holds."""
    d.executor.close()
    for h in d.hosts.values():
        h.close()


def profile_objective(data: Mapping[str, Any]) -> Objective:
    """The objective a profile's ``verify`` section recorded: by name (and overrides), or whole.

    Raises:
        ConfigError: the objective cannot be loaded.
    """
    o = data["verify"]["objective"]
    if "metric" not in o:  # recorded by name only
        return Objective.load_file(str(o.get("name")), o.get("overrides") or {})
    keys = ("name", "metric", "direction", "objectives", "choose", "load", "loads", "weighted", "benchmark",
            "constraints")
    return Objective.from_mapping({k: o[k] for k in keys if o.get(k) is not None}, "the profile's objective")


def profile_runner(verify: Mapping[str, Any], objective: Objective, host: Host, *, log_dir: Path, template: str,
                   python: str, env: Mapping[str, str], port: int | None,
                   timeout_s: float | None = None) -> TrialRunner:
    """The study's runner (:func:`~autotune.execution.executors.make_runner`) as a profile's
    ``verify`` section recorded it: its engine, model, scenario, ready path, API and secrets, with
    the launch ``template`` and fixed ``env`` given, interpreter ``python`` and ready timeout
    ``timeout_s`` (None: the recorded one, else 600 s). No log stall watch."""
    target = TargetConfig.model_construct(engine=verify["engine"], model=verify.get("model"),
                                          scenario=verify.get("scenario"))
    return TrialRunner(host, PRESETS[verify["engine"]], objective, log_dir=log_dir, template=template,
                       fields={**runner_fields(target), "python": python},
                       fixed_env=dict(env), ready_timeout_s=float(timeout_s or verify.get("ready_timeout_s") or 600.0),
                       log_stall_s=None, ready_path=verify.get("ready_path"), api=verify.get("api"), port=port,
                       secrets=verify.get("secrets") or [])
