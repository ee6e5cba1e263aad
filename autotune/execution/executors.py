"""Executors: where the driver's trials run.

An executor offers slots (:mod:`autotune.execution.slots`) and runs one trial per slot at a time. The
driver :meth:`~Executor.submit`\\ s a trial to a free slot and collects results with
:meth:`~Executor.wait`; phases of running trials reach the driver's ``on_phase`` callbacks from
within ``wait``, in the driver's thread, so only the driver writes the storage.

``SerialExecutor`` runs the trial here, in ``wait``, on the first healthy slot the driver gives
it (one at a time). ``RayExecutor`` (:mod:`autotune.execution.ray_executor`) runs each trial as a Ray task on
the node that owns its slot.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Protocol

from autotune.config.study import StudyConfig, TargetConfig
from autotune.engines import get_preset
from autotune.execution.hosts import Host, LocalHost
from autotune.config.objective import Objective
from autotune.execution.runner import TrialRunner
from autotune.execution.trial import TrialResult, TrialSpec
from autotune.execution.slots import Slot
from autotune.execution.stopping import StopRequest

PhaseCallback = Callable[[str, str], None]


@dataclass
class Finished:
    """A trial that came back: its number, the slot it ran on, and its result."""

    number: int
    slot: Slot
    result: TrialResult


class Executor(Protocol):
    """Runs trials on slots and returns their plain results."""

    def slots(self) -> list[Slot]:
        """The slots trials may run on, in order of preference."""
        ...

    def capacity(self) -> int:
        """How many trials it runs at once (at most one per slot)."""
        ...

    def submit(self, spec: TrialSpec, slot: Slot, on_phase: PhaseCallback) -> None:
        """Start ``spec`` on ``slot`` (free: the driver runs one trial per slot, and at most
        :meth:`capacity` at once)."""
        ...

    def wait(self, timeout_s: float) -> list[Finished]:
        """The trials that finished within ``timeout_s`` (maybe none); relays phases meanwhile."""
        ...

    def running(self) -> int:
        """How many submitted trials have not come back from :meth:`wait` yet."""
        ...

    def request_stop(self, reason: str, hurry: bool = False) -> None:
        """Ask every running trial to stop (torn down, ``fault``/``interrupted``); ``hurry``: skip
        the teardown grace period. Calling it again with the same arguments does nothing more."""
        ...

    def close(self) -> None:
        """Release what the executor holds (connections, a cluster it started)."""
        ...


def runner_fields(target: TargetConfig) -> dict[str, str]:
    """The fields a target's runner fills into its command and benchmark templates (besides
    ``{python}``, ``{host}`` and ``{port}``, which the host and the launch give)."""
    return {"scenario": target.scenario or "", "model": target.model or "",
            # transformers serve pins its model: requests must name it as the command does.
            "served_model_name": (target.model or "") if target.engine == "transformers" else ""}


def make_runner(cfg: StudyConfig, objective: Objective, host: Host, slot: Slot, *, stop: StopRequest,
                log_dir: Path, public: tuple[str, ...] | list[str] = (), child_umask: int | None = None) -> TrialRunner:
    """The runner of ``cfg``'s target and ``objective`` (as loaded by the driver: a task on a Ray
    node must not look for the objective's file there) on ``host``, with ``slot``'s environment."""
    target = cfg.target
    preset = get_preset(target.engine)
    return TrialRunner(
        host,
        preset,
        objective,
        log_dir=log_dir,
        template=target.command,
        fields=runner_fields(target),
        fixed_env={**preset.env, **target.env, **slot.env()},
        ready_timeout_s=target.ready_timeout_s,
        log_stall_s=target.log_stall_s,
        gpu_busy_wait_s=target.gpu_busy_wait_s,
        ready_path=target.ready_path,
        api=target.api,
        port=target.port,
        stop=stop,
        secrets=target.secrets,
        public=public,
        bench_host=LocalHost(child_umask=child_umask) if host.remote else None,
    )


class SerialExecutor:
    """Runs one trial at a time, in this process, with the runner of its slot.

    ``runners``: a runner per slot name; ``slot_list``: the slots, in order (the driver gives the
    first healthy one). ``submit`` only records the trial; ``wait`` runs it to the end.
    """

    def __init__(self, runners: Mapping[str, TrialRunner], slot_list: list[Slot]) -> None:
        self.runners = dict(runners)
        self.slot_list = list(slot_list)
        self._pending: tuple[TrialSpec, Slot, PhaseCallback] | None = None

    def slots(self) -> list[Slot]:
        return list(self.slot_list)

    def capacity(self) -> int:
        return 1

    def submit(self, spec: TrialSpec, slot: Slot, on_phase: PhaseCallback) -> None:
        assert self._pending is None, "the serial executor runs one trial at a time"
        self._pending = (spec, slot, on_phase)

    def wait(self, timeout_s: float) -> list[Finished]:
        if self._pending is None:
            return []
        spec, slot, on_phase = self._pending
        self._pending = None
        return [Finished(spec.number, slot, self.runners[slot.name].run(spec, on_phase))]

    def running(self) -> int:
        return int(self._pending is not None)

    def request_stop(self, reason: str, hurry: bool = False) -> None:
        for runner in self.runners.values():
            runner.stop.mirror(reason, hurry)

    def close(self) -> None:
        pass
