"""The Ray executor: each trial a Ray task on the node that owns its slot.

Slots come from the cluster: a node that runs trials advertises ``autotune_slot:<node>`` with one
unit per trial it can run at once (:func:`autotune.execution.slots.ray_slots`), and its tasks launch the
server locally on that node. With SSH hosts in ``target.hosts`` the slots are the hosts' instead,
and a task on any node reaches its host over SSH. A task never retries by itself
(``max_retries=0``): a fault goes back to the driver, which retries the trial on another slot.

Only the driver talks to the Optuna storage. A task sends its phases (``launched`` with the
server's tag, ``measuring`` ...) through a small actor on the driver's node, the
:class:`TrialChannel`, a change of phase at once and progress batched; :meth:`RayExecutor.wait`
relays them to the driver's callbacks in the driver's thread, and returns as soon as a task ends.
The same actor carries a stop request to the tasks. When it connects, the executor runs a no-op
task per slot, so each node starts its worker and imports autotune while the driver opens the
study; later trials reuse the worker. A task returns its
:class:`~autotune.execution.trial.TrialResult` and its log files, which the executor writes under the
driver's log folder, so the logs end up with the study whichever node ran the trial.

The driver keeps its own timeouts: a trial that no node has started after
``schedule_timeout_s``, or whose slot resource no node offers any more, is cancelled and is a
``slot-unavailable`` fault; a node that dies under a trial makes it a ``node-died`` fault. Both
quarantine the slot (:class:`~autotune.execution.slots.SlotPool`).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
import ray.exceptions

try:  # Ray 2.60's token authentication (private API: pyproject pins Ray's minor version)
    from ray._private.authentication.authentication_token_setup import (
        maybe_enable_token_auth_if_token_available,
    )
except ImportError:  # pragma: no cover - another Ray: it finds the token itself, or has no tokens
    def maybe_enable_token_auth_if_token_available(warn_if_disabled: bool = True) -> bool:
        return False
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from autotune.config.study import StudyConfig
from autotune.errors import UsageError
from autotune.execution.executors import Finished, PhaseCallback, make_runner
from autotune.execution.host_factory import host_for
from autotune.outcome.failures import Failure
from autotune.execution.hosts import LocalHost
from autotune.config.objective import Objective
from autotune.execution.trial import TrialResult, TrialSpec
from autotune.execution.slots import SLOT_RESOURCE_PREFIX, Slot, host_slots, ray_slots
from autotune.execution.stopping import StopRequest

LOG_LIMIT = 8 * 1024 * 1024
"""At most this much of each log file comes back from a task (its end)."""
FLUSH_S = 0.5
"""A task sends its phases and reads the stop request this often; a change of phase goes at once."""
RELAY_S = 0.5
"""The driver reads the tasks' phases this often while it waits; a finished task wakes it at once."""
RESOURCE_CHECK_S = 2.0


@ray.remote(num_cpus=0)
class TrialChannel:
    """Phases from the tasks to the driver, and a stop request from the driver to the tasks."""

    def __init__(self) -> None:
        self.events: list[tuple[int, str, str]] = []
        self.stop: tuple[str, bool] = ("", False)

    def exchange(self, events: list[tuple[int, str, str]]) -> tuple[str, bool]:
        """A task's phases in, the stop request out: one round trip per flush."""
        self.events.extend(events)
        return self.stop

    def drain(self) -> list[tuple[int, str, str]]:
        events, self.events = self.events, []
        return events

    def request_stop(self, reason: str, hurry: bool) -> None:
        self.stop = (reason, hurry)


class _Outbox:
    """A task's side of the :class:`TrialChannel`: its phases, sent in batches by one thread that
    also mirrors the driver's stop request into ``stop``.

    A change of phase is sent at once; repeats of the phase being reported (progress while
    measuring) wait for the next flush, every ``FLUSH_S``, and only the latest of them is sent.
    :meth:`close` sends what is left and returns once the channel has it, so the driver reads
    every phase (the server's tag with ``launched``) before it sees the task's result.
    """

    def __init__(self, channel: Any, number: int, stop: StopRequest) -> None:
        self.channel, self.number, self.stop = channel, number, stop
        self._lock = threading.Lock()
        self._pending: list[tuple[int, str, str]] = []
        self._phase = ""
        self._wake = threading.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._follow, daemon=True)
        self._thread.start()

    def put(self, phase: str, detail: str) -> None:
        with self._lock:
            changed = phase != self._phase
            self._phase = phase
            if not changed and self._pending and self._pending[-1][1] == phase:
                self._pending[-1] = (self.number, phase, detail)
            else:
                self._pending.append((self.number, phase, detail))
        if changed:
            self._wake.set()

    def close(self) -> None:
        self._done.set()
        self._wake.set()
        self._thread.join(timeout=15)
        if self._pending:
            self._flush()

    def _flush(self) -> None:
        with self._lock:
            events, self._pending = self._pending, []
        try:
            reason, hurry = ray.get(self.channel.exchange.remote(events), timeout=10)
        except Exception:  # noqa: BLE001 - the driver is gone (Ray ends this task), or slow: sent again next time
            with self._lock:
                self._pending[:0] = events
            return
        self.stop.mirror(reason, hurry)

    def _follow(self) -> None:
        while not self._done.is_set():
            self._wake.wait(FLUSH_S)
            self._wake.clear()
            self._flush()


@ray.remote(num_cpus=0, max_retries=0)
def _warm_up() -> int:
    """Nothing: running it starts a worker on its node and imports this module (all that a trial's
    task needs) while the driver opens its study, so that the first trial does not wait for that."""
    return os.getpid()


def _read_logs(log_dir: Path, number: int) -> dict[str, bytes]:
    out = {}
    for path in log_dir.glob(f"trial-{number:04d}.*"):
        with open(path, "rb") as f:
            size = path.stat().st_size
            f.seek(max(0, size - LOG_LIMIT))
            out[path.name] = f.read()
    return out


def _normal_priority() -> None:
    """Put this worker (and so the server and load it starts) back at CPU niceness 0, as far as
    the OS lets it.

    Ray runs its workers at niceness 15 (``worker_niceness``) unless a node is started with
    ``RAY_worker_niceness=0``: a server started from one gets about a 28th of a normal process's
    CPU share wherever anything else is busy, and measures that instead of what it will serve
    at. Lowering a niceness needs privilege (root, ``CAP_SYS_NICE`` or ``RLIMIT_NICE``); without
    it the niceness stays: the server's is recorded with the trial (user attr ``niceness``) and
    the driver says so."""
    try:
        if os.getpriority(os.PRIO_PROCESS, 0) > 0:
            os.setpriority(os.PRIO_PROCESS, 0, 0)
    except OSError:
        pass


def run_trial(cfg: StudyConfig, objective: Objective, public: tuple[str, ...], slot: Slot, spec: TrialSpec,
              channel: Any, child_umask: int | None) -> tuple[TrialResult, dict[str, bytes]]:
    """The body of a trial's Ray task, on its slot's node: run it, return the result and logs."""
    stop = StopRequest()
    outbox = _Outbox(channel, spec.number, stop)
    outbox.put("started", json.dumps({"node": ray.get_runtime_context().get_node_id(),
                                      "ip": ray.util.get_node_ip_address()}))
    _normal_priority()
    log_dir = Path(tempfile.mkdtemp(prefix=f"autotune-{cfg.name}-"))
    host = host_for(cfg.target, slot.host, child_umask=child_umask)
    try:
        runner = make_runner(cfg, objective, host, slot, stop=stop, log_dir=log_dir, public=public,
                             child_umask=child_umask)
        result = runner.run(spec, outbox.put)
        return result, _read_logs(log_dir, spec.number)
    finally:
        outbox.close()
        host.close()
        shutil.rmtree(log_dir, ignore_errors=True)


_run_trial_task = ray.remote(num_cpus=0, max_retries=0)(run_trial)


@dataclass
class _Running:
    number: int
    slot: Slot
    on_phase: PhaseCallback
    submitted: float
    started: bool = False
    node_ip: str = ""
    tag: str = ""


def _local_addresses() -> set[str]:
    names = {"127.0.0.1", "localhost", socket.gethostname()}
    try:
        names |= {info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None)}
    except OSError:
        pass
    try:
        names.add(ray.util.get_node_ip_address())
    except Exception:  # noqa: BLE001
        pass
    return names


class RayExecutor:
    """Runs trials as Ray tasks (see the module docstring).

    The cluster is ``cfg.ray.address`` (``auto``, ``HOST:PORT``), or, when None, a local one whose
    single node offers the slots of ``target.hosts`` (``autotune_slot:local``). ``objective``: as
    the driver loaded it (its file need not exist on the nodes).

    Raises:
        UsageError: the cluster cannot be reached, it offers no slot, or a node offers several
            slots while the target does not say which GPUs each gets (``gpus_per_trial``).
    """

    def __init__(self, cfg: StudyConfig, objective: Objective, *, log_dir: Path,
                 public: tuple[str, ...] | list[str] = (), child_umask: int | None = None) -> None:
        self.cfg = cfg
        self.objective = objective
        self.log_dir = log_dir
        self.public = tuple(public)
        self.child_umask = child_umask
        self.schedule_timeout_s = cfg.ray.schedule_timeout_s
        address = cfg.ray.address
        target = cfg.target
        remote_hosts = any(h != "local" for h in target.hosts)
        os.environ.setdefault("RAY_DEDUP_LOGS", "0")
        try:
            if address:
                # A cluster started where ~/.ray/auth_token exists requires the token (Ray 2.60
                # turns token auth on then), but ray.init(address=...) sends it only in token mode.
                maybe_enable_token_auth_if_token_available(warn_if_disabled=False)
                ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False,
                         configure_logging=True)
            else:
                local_slots = host_slots(["local"], host_gpus=target.host_gpus, gpus_per_trial=target.gpus_per_trial)
                # Workers at niceness 0, not Ray's 15: the servers they start are measured (run_trial).
                ray.init(resources={f"{SLOT_RESOURCE_PREFIX}local": len(local_slots)},
                         include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False,
                         _system_config={"worker_niceness": 0})
        except (ConnectionError, RuntimeError, ValueError) as exc:
            where = f"at {address}" if address else "here"
            raise UsageError(f"cannot start or reach the Ray cluster {where}: {str(exc).splitlines()[0]}") from None
        if remote_hosts:
            self._slots = host_slots(target.hosts, host_gpus=target.host_gpus, gpus_per_trial=target.gpus_per_trial)
        else:
            self._slots = ray_slots(ray.cluster_resources(), gpus_per_trial=target.gpus_per_trial)
        shared = sorted({s.resource for s in self._slots if s.gpus is None and s.resource
                         and sum(t.resource == s.resource for t in self._slots) > 1})
        if shared and target.gpus_per_trial is None:
            ray.shutdown()
            raise UsageError(f"{', '.join(shared)}: a node offers several slots, but target.gpus_per_trial is not "
                             "set: its trials would share every GPU (set gpus_per_trial, or give the node 1 slot)")
        if not self._slots:
            ray.shutdown()
            raise UsageError(f"no node of the Ray cluster at {address} offers a slot: start each node that runs "
                             f"trials with --resources='{{\"{SLOT_RESOURCE_PREFIX}NAME\": 1}}' (see ray_cluster.yaml)")
        here = ray.get_runtime_context().get_node_id()
        self.channel = TrialChannel.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=here, soft=False)).remote()
        self._warm = [_warm_up.options(num_cpus=0, max_retries=0, resources={s.resource: 1}).remote()
                      for s in self._slots if s.resource]
        self._running: dict[Any, _Running] = {}
        self._stop_sent: tuple[str, bool] = ("", False)
        self._resources_checked = 0.0
        self._here = _local_addresses()

    def slots(self) -> list[Slot]:
        return list(self._slots)

    def capacity(self) -> int:
        return len(self._slots)

    def submit(self, spec: TrialSpec, slot: Slot, on_phase: PhaseCallback) -> None:
        options: dict[str, Any] = {"num_cpus": 0, "max_retries": 0}
        if slot.resource:
            options["resources"] = {slot.resource: 1}
        ref = _run_trial_task.options(**options).remote(self.cfg, self.objective, self.public, slot, spec,
                                                        self.channel, self.child_umask)
        self._running[ref] = _Running(spec.number, slot, on_phase, time.monotonic())

    def running(self) -> int:
        return len(self._running)

    def wait(self, timeout_s: float) -> list[Finished]:
        deadline = time.monotonic() + timeout_s
        while True:
            self._relay()
            if not self._running:
                return []
            refs = list(self._running)
            ready, _ = ray.wait(refs, num_returns=1, timeout=max(0.0, min(RELAY_S, deadline - time.monotonic())))
            if ready:
                ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)  # every one done by now
                self._relay()  # the phases a task sent before it returned (its server's tag)
            finished = [self._collect(ref) for ref in ready] + self._overdue()
            if finished or time.monotonic() >= deadline:
                return finished

    def request_stop(self, reason: str, hurry: bool = False) -> None:
        if (reason, hurry) != self._stop_sent:
            self._stop_sent = (reason, hurry)
            self.channel.request_stop.remote(reason, hurry)

    def close(self) -> None:
        for ref in [*self._running, *self._warm]:
            try:
                ray.cancel(ref, force=True)
            except Exception:  # noqa: BLE001 - done already, or its node is gone
                pass
        self._running.clear()
        try:
            ray.kill(self.channel)
        except Exception:  # noqa: BLE001 - already gone with its node
            pass
        ray.shutdown()

    # -- internals ------------------------------------------------------------------------
    def _relay(self) -> None:
        try:
            events = ray.get(self.channel.drain.remote(), timeout=30)
        except ray.exceptions.RayError:
            return
        by_number = {r.number: r for r in self._running.values()}
        for number, phase, detail in events:
            run = by_number.get(number)
            if run is None:
                continue
            if phase == "started":
                run.started = True
                run.node_ip = json.loads(detail).get("ip", "")
            if phase == "launched":
                run.tag = json.loads(detail).get("tag") or ""
            run.on_phase(phase, detail)

    def _collect(self, ref: Any) -> Finished:
        run = self._running.pop(ref)
        try:
            result, logs = ray.get(ref)
        except ray.exceptions.RayError as exc:
            return Finished(run.number, run.slot, self._fault(run, exc))
        for name, data in logs.items():
            self.log_dir.mkdir(parents=True, exist_ok=True)
            (self.log_dir / name).write_bytes(data)
        result.log_path = str(self.log_dir / f"trial-{run.number:04d}.log")
        return Finished(run.number, run.slot, result)

    def _fault(self, run: _Running, exc: BaseException) -> TrialResult:
        """The result of a task that did not return: its node died, its worker crashed, or the
        task itself raised (autotune missing on the node, a bug). A server that outlived its task
        is killed here if it ran on this machine; on an SSH host it is left to the driver's
        ``servers_left`` (``left_running``), which kills it when the host answers."""
        if isinstance(exc, (ray.exceptions.NodeDiedError, ray.exceptions.ObjectLostError)):
            kind = "node-died"
        elif isinstance(exc, ray.exceptions.WorkerCrashedError):
            kind = "worker-crashed"
        else:
            kind = "executor-error"
        cause = exc.cause if isinstance(exc, ray.exceptions.RayTaskError) and exc.cause is not None else exc
        text = str(cause).strip().splitlines()
        message = f"{type(cause).__name__}: {text[-1] if text else ''}".strip(": ")
        where = f" on node {run.node_ip}" if run.node_ip else ""
        result = TrialResult(run.number, "fault", host=run.slot.host,
                             failure=Failure(kind, f"Ray task{where} ({run.slot.name}): {message}"[:500], ""))
        result.server_tag = run.tag
        result.left_running = bool(run.tag) and run.slot.host != "local"
        if run.tag and run.slot.host == "local":
            # The server outlives its task's worker: kill it if it ran on this machine, else say so.
            if run.node_ip in self._here:
                LocalHost().kill_tagged(run.tag)
            else:
                result.failure = Failure(kind, f"{result.failure.message if result.failure else ''}; its server "
                                               f"(tag {run.tag}) may still run on {run.node_ip}", "")
        return result

    def _overdue(self) -> list[Finished]:
        """Trials no node started in time, or whose slot resource no node offers any more."""
        now = time.monotonic()
        waiting = [(ref, r) for ref, r in self._running.items() if not r.started]
        if not waiting:
            return []
        offered: dict[str, float] | None = None
        if now - self._resources_checked >= RESOURCE_CHECK_S:
            self._resources_checked = now
            offered = ray.cluster_resources()
        out = []
        for ref, run in waiting:
            gone = offered is not None and run.slot.resource is not None and offered.get(run.slot.resource, 0) < 1
            if not gone and now - run.submitted < self.schedule_timeout_s:
                continue
            ray.cancel(ref, force=True)
            del self._running[ref]
            why = (f"no Ray node offers {run.slot.resource} any more" if gone else
                   f"no Ray node started it within {self.schedule_timeout_s:g}s (ray.schedule_timeout_s)")
            out.append(Finished(run.number, run.slot, TrialResult(
                run.number, "fault", host=run.slot.host,
                failure=Failure("slot-unavailable", f"trial not run on {run.slot.name}: {why}", ""))))
        return out
