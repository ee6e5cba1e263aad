"""``ModelExecutor``: trials answered by the simulator's model, no server and no HTTP.

An :class:`~autotune.execution.executors.Executor` beside ``SerialExecutor``: the driver submits a trial as
it would to a real host, and :meth:`ModelExecutor.wait` answers it at once with the
:class:`~autotune.execution.trial.TrialResult` the real runner would return for the outcome that
:func:`autotune.sim.model.predict` predicts for that launch (the target's command plus the trial's
flags, parsed by the simulated server's own argparse; the target's env plus the trial's). A study
of hundreds of trials then costs the driver's own time only (`autotune bench tuner`).

Each result's ``duration_s`` is the *simulated* wall time the trial would have taken, which
the executor also adds up (:attr:`ModelExecutor.spent_s`):

- ok: ``startup_s`` (launch to ready) + the benchmark's duration;
- a start-up failure: the time from launch until the failure shows (``failure_s``);
- a crash under load: ``failure_s`` (start-up plus the load until the crash);
- not ready within the trial's ready timeout (``TrialSpec.ready_timeout_s``): ``startup-timeout``,
  costing the whole timeout, as the real runner waits it out. The model has no hang of its own
  (:data:`autotune.sim.model.OUTCOMES`), so this is a start-up (or a failure) slower than the
  timeout the driver chose;
- stopped early (a spec with ``beat_value``, an objective that allows it): ``startup_s`` + the
  load until the :class:`~autotune.execution.early_stop.StopRule` stopped it. The rule is the runner's, fed
  the model's own timeline after every forward (:data:`autotune.sim.model.ProgressHook`) as a
  :class:`~autotune.execution.workload.LoadProgress`; what the whole load would have cost is kept too
  (``TrialCost.full_seconds``), for the GPU-hours early stopping saved.

Warm-up requests and teardown are not counted. Measured numbers carry the run-to-run noise of
``AUTOTUNE_SIM_SEED=seed`` (``seed=None``: none, the model's expectation); a launch measured
again in the same study (a confirmation run) draws fresh noise for each repeat, as a real server
would, while its first measurement is the one every strategy meets for that launch.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import time
from dataclasses import dataclass
from typing import Mapping, Sequence

from autotune.config.study import StudyConfig
from autotune.execution.early_stop import StopRule, applies
from autotune.engines import get_preset
from autotune.errors import UsageError
from autotune.execution.executors import Finished, PhaseCallback, runner_fields
from autotune.outcome.failures import Failure, Phase
from autotune.execution.workload import LoadProgress
from autotune.config.objective import Objective
from autotune.execution.trial import TrialResult, TrialSpec
from autotune.sim.args import ServerArgs, parse_server_args
from autotune.sim.engine import configure, startup_seconds
from autotune.sim.model import Prediction, ProgressHook, Workload, predict
from autotune.sim.scenario import Scenario, ScenarioError, load_scenario
from autotune.execution.slots import Slot

MODEL_METRICS = frozenset({"completed", "failed", "input_tokens", "output_tokens", "max_concurrency", "duration_s",
                           "request_throughput", "output_throughput", "total_throughput", "mean_ttft_ms"})
"""The load generator's metrics the model predicts (no percentiles, TPOT or ITL)."""
PORT = 30000
"""The port written into the recorded argv (nothing listens: no server runs)."""
BAD_FLAG_S = 2.0
"""Simulated seconds until a server given a flag its argparse refuses exits (as ``predict``'s
invalid-argument)."""


@dataclass(frozen=True)
class TrialCost:
    """One trial's simulated wall time and how it ended; ``full_seconds``: what it would have
    cost had it not stopped early (``seconds`` for every other trial)."""

    number: int
    outcome: str
    kind: str | None
    seconds: float
    full_seconds: float


def model_workload(objective: Objective) -> Workload:
    """The objective's load as the model's closed-loop :class:`Workload`.

    Raises:
        UsageError: the objective is not one the model can measure: an external benchmark, an
            open-loop ``request_rate``, SLO constraints, or a metric the model does not predict.
    """
    load = objective.load
    if objective.benchmark is not None:
        raise UsageError(f"objective {objective.name}: the model runs no benchmark command")
    if load.request_rate is not None:
        raise UsageError(f"objective {objective.name}: the model drives a closed loop only (no request_rate)")
    if objective.constraints:
        raise UsageError(f"objective {objective.name}: the model executor evaluates no SLO constraints")
    if objective.loads:
        raise UsageError(f"objective {objective.name}: the model drives one load (not several loads)")
    weighted = {w.name: w for w in objective.weighted}
    for goal in objective.goals:
        needs = [m for m, _ in weighted[goal.metric].terms] if goal.metric in weighted else [goal.metric]
        for metric in needs:
            if metric not in MODEL_METRICS:
                raise UsageError(f"objective {objective.name}: the model does not predict '{metric}' "
                                 f"(it predicts: {', '.join(sorted(MODEL_METRICS))})")
    return Workload(concurrency=load.concurrency, num_prompts=load.num_prompts, input_len=load.input_len,
                    output_len=load.output_len)


class ModelExecutor:
    """Answers each trial from the simulator's model, one at a time (capacity 1), on one slot.

    ``argv``: the target's launch command without the trial's flags (recorded on each result);
    ``server_args``: its part the simulated server parses (``--scenario S ...``); ``env``: the
    target's fixed env; ``seed``: the noise seed (``AUTOTUNE_SIM_SEED``), None for none;
    ``ready_timeout_s``: used when a spec carries no timeout of its own; ``objective``: adds the
    metrics it defines (:meth:`~autotune.config.objective.Objective.derive`) to each measured result;
    ``stop_metric``: the objective's metric when its trials may stop early
    (:func:`~autotune.execution.early_stop.applies`), else None.
    """

    def __init__(self, scenario: Scenario, workload: Workload, *, argv: Sequence[str], server_args: Sequence[str],
                 env: Mapping[str, str], seed: int | None, ready_timeout_s: float = 600.0, host: str = "local",
                 objective: Objective | None = None, stop_metric: str | None = None) -> None:
        self.scenario = scenario
        self.stop_metric = stop_metric
        self.workload = workload
        self.objective = objective
        self.argv = list(argv)
        self.server_args = list(server_args)
        self.env = dict(env)
        self.seed = seed
        self.ready_timeout_s = ready_timeout_s
        self.slot = Slot(host, host)
        self.costs: list[TrialCost] = []
        """Every trial answered, in order."""
        self.model_s = 0.0
        """Real seconds spent in the model (the rest of a study's time is the driver's)."""
        self._pending: tuple[TrialSpec, Slot] | None = None
        self._stop = ""
        self._launched: dict[tuple[tuple[str, ...], tuple[tuple[str, str], ...]], int] = {}

    @classmethod
    def for_target(cls, cfg: StudyConfig, objective: Objective, *, seed: int | None,
                   scenario: Scenario | None = None) -> ModelExecutor:
        """The executor of a ``sim`` target: its command (the preset's or ``target.command``) and
        env, the objective's load; ``scenario`` replaces the one the command names (e.g. with
        other noise).

        Raises:
            UsageError: not a ``sim`` target, a command that is not ``... serve ...``, an unknown
                scenario, or an objective the model cannot measure (:func:`model_workload`).
        """
        target = cfg.target
        if target.engine != "sim":
            raise UsageError(f"the model executor needs a sim target, not '{target.engine}'")
        argv = get_preset("sim").argv(port=PORT, template=target.command, fields=runner_fields(target))
        if "serve" not in argv:
            raise UsageError(f"target command {' '.join(argv)!r}: expected '... serve --scenario S ...'")
        server_args = argv[argv.index("serve") + 1:]
        if scenario is None:
            try:
                scenario = load_scenario(_parse(server_args)[0].scenario)
            except ScenarioError as exc:
                raise UsageError(str(exc)) from None
        return cls(scenario, model_workload(objective), argv=argv, server_args=server_args, env=target.env,
                   seed=seed, ready_timeout_s=target.ready_timeout_s, objective=objective,
                   stop_metric=objective.metric if applies(objective) else None)

    # -- the Executor protocol -----------------------------------------------------------------
    def slots(self) -> list[Slot]:
        return [self.slot]

    def capacity(self) -> int:
        return 1

    def submit(self, spec: TrialSpec, slot: Slot, on_phase: PhaseCallback) -> None:
        """Record the trial (no phases are reported: nothing launches)."""
        assert self._pending is None, "the model executor runs one trial at a time"
        self._pending = (spec, slot)

    def wait(self, timeout_s: float) -> list[Finished]:
        """The submitted trial, answered now."""
        if self._pending is None:
            return []
        spec, slot = self._pending
        self._pending = None
        started = time.perf_counter()
        result = self.result(spec)
        full = self.full_seconds(spec) if result.outcome == "stopped" else result.duration_s
        self.model_s += time.perf_counter() - started
        kind = result.failure.kind if result.failure else None
        self.costs.append(TrialCost(spec.number, result.outcome, kind, result.duration_s, full))
        return [Finished(spec.number, slot, result)]

    def running(self) -> int:
        return int(self._pending is not None)

    def request_stop(self, reason: str, hurry: bool = False) -> None:
        """A trial answered after this is ``fault``/``interrupted`` (costing nothing)."""
        self._stop = self._stop or reason or "stopped"

    def close(self) -> None:
        pass

    # -- answers -----------------------------------------------------------------------------------
    @property
    def spent_s(self) -> float:
        """Simulated seconds of every trial answered so far."""
        return sum(c.seconds for c in self.costs)

    def _noise_seed(self, spec: TrialSpec, *, again: bool = False) -> int | None:
        """The noise seed of this measurement: the executor's for a launch's first, a fresh one
        for each repeat of the same launch; ``again``: the seed of the last measurement of this
        launch (the same run looked at again, not a new one)."""
        if self.seed is None:
            return None
        key = (tuple(spec.args), tuple(sorted(spec.env.items())))
        repeat = self._launched.get(key, 0)
        if again:
            return _repeat_seed(self.seed, max(0, repeat - 1))
        self._launched[key] = repeat + 1
        return _repeat_seed(self.seed, repeat)

    def launch(self, spec: TrialSpec) -> tuple[list[str], dict[str, str]]:
        """The argv and env the trial's server would be launched with."""
        return [*self.argv, *spec.args], {**self.env, **spec.env}

    def full_seconds(self, spec: TrialSpec) -> float:
        """What the trial of ``spec`` costs when its load is never stopped early."""
        return self.result(dataclasses.replace(spec, beat_value=None), again=True).duration_s

    def result(self, spec: TrialSpec, *, again: bool = False) -> TrialResult:
        """The result the real runner would return for ``spec`` on the simulated host
        (``again``: the last run of this launch, not a new one)."""
        argv, env = self.launch(spec)
        result = TrialResult(spec.number, "ok", argv=argv, argv_template=[*argv], env=env, host=self.slot.host,
                             port=PORT)
        if self._stop:
            result.outcome, result.failure = "fault", Failure("interrupted", self._stop, "")
            return result
        timeout = spec.ready_timeout_s or self.ready_timeout_s
        try:
            _, args = _parse([*self.server_args, *spec.args])
        except ValueError as exc:
            return _failed(result, "invalid-argument", str(exc), BAD_FLAG_S, timeout)
        least = self.objective.stop_after if self.objective is not None else None  # the objective's least load
        rule = (StopRule(self.stop_metric, spec.beat_value, spec.beat_reason,
                         *((least.min_requests, least.min_seconds) if least is not None else ()))
                if self.stop_metric and spec.beat_value is not None else None)
        p = predict(self.scenario, args, env, self.workload, seed=self._noise_seed(spec, again=again),
                    on_progress=None if rule is None else self._watch(rule))
        if p.outcome == "crash-under-load":
            ready = startup_seconds(configure(self.scenario, args, env))["ready"]
            if ready > timeout:
                return _failed(result, "startup-timeout", _late(timeout), timeout, timeout)
            result.startup_s = round(ready, 3)
            return _failed(result, p.outcome, p.message, float(p.failure_s or ready), timeout)
        if p.outcome != "ok":
            return _failed(result, p.outcome, p.message, float(p.failure_s or 0.0), timeout)
        if p.startup_s > timeout:
            return _failed(result, "startup-timeout", _late(timeout), timeout, timeout)
        result.startup_s = p.startup_s
        result.server_info = {"/get_server_info": {k: v for k, v in p.details.items() if not isinstance(v, dict)}}
        completed = int(p.details.get("completed") or 0)
        if completed == 0 and p.stopped_s is None:  # every request rejected: the load generator's request-errors
            result.duration_s = p.startup_s
            w = self.workload
            result.metrics = {"completed": 0.0, "failed": float(w.num_prompts)}
            result.outcome = "infeasible"
            result.failure = Failure("request-errors", f"{w.num_prompts} of {w.num_prompts} requests failed: "
                                     f"{p.message or 'no request completed'}", p.message)
            return result
        result.metrics = _metrics(p, self.workload, completed)
        if self.objective is not None:
            result.metrics = self.objective.derive(result.metrics)
        result.duration_s = round(p.startup_s + float(p.details["duration_s"]), 3)
        result.signals = p.signals if p.signals.lines else None  # what the server's log would show
        if rule is not None:
            result.intermediate = dict(rule.intermediate)
            if p.stopped_s is not None:
                result.outcome, result.early_stop = "stopped", rule.stop
        return result

    def _watch(self, rule: StopRule) -> ProgressHook:
        """The model's progress hook that feeds ``rule`` as the load generator would."""
        w = self.workload
        out_total, in_total = float(w.num_prompts * w.output_len), float(w.num_prompts * w.input_len)

        def hook(elapsed_s: float, output_tokens: int, input_tokens: int, completed: int) -> bool:
            progress = LoadProgress(elapsed_s, completed, 0, w.num_prompts, float(output_tokens), float(input_tokens),
                                    out_total, in_total)
            return rule.observe(progress) is not None

        return hook


def _repeat_seed(seed: int, repeat: int) -> int:
    """The noise seed of the ``repeat``-th measurement of one launch (0: ``seed`` itself)."""
    return seed if repeat == 0 else (seed * 1_000_003 + repeat * 7_919 + 1) % 2**32


def _parse(server_args: Sequence[str]) -> tuple[argparse.Namespace, ServerArgs]:
    """``parse_server_args``, with argparse's exit turned into a ValueError carrying its message."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return parse_server_args(server_args)
    except SystemExit:
        raise ValueError(err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else "bad flags") from None


def _late(timeout: float) -> str:
    return f"not ready after {timeout:.4g}s (the trial's ready timeout)"


def _failed(result: TrialResult, kind: str, message: str, at_s: float, timeout: float) -> TrialResult:
    """``result`` as an infeasible trial of ``kind`` seen ``at_s`` after launch; a start-up failure
    later than the ready timeout is a ``startup-timeout`` at the timeout, as the runner sees it."""
    if result.startup_s is None and at_s > timeout:
        kind, message, at_s = "startup-timeout", _late(timeout), timeout
    result.outcome = "infeasible"
    if kind == "crash-under-load":  # the model's memory crash under load: the server logs an OOM
        result.failure = Failure("oom", message, message, phase=Phase.LOAD)
    else:
        result.failure = Failure(kind, message, message, phase=Phase.STARTUP)
    result.duration_s = round(at_s, 3)
    return result


def _metrics(p: Prediction, w: Workload, completed: int) -> dict[str, float]:
    """The load generator's metrics of a measured prediction."""
    metrics = {
        "completed": float(completed), "failed": 0.0,
        "input_tokens": float(completed * w.input_len), "output_tokens": float(completed * w.output_len),
        "max_concurrency": float(w.concurrency), "duration_s": float(p.details["duration_s"]),
        "request_throughput": p.request_throughput, "output_throughput": p.output_throughput,
        "total_throughput": p.total_throughput,
    }
    if p.details.get("mean_ttft_ms") is not None:
        metrics["mean_ttft_ms"] = float(p.details["mean_ttft_ms"])
    return metrics


__all__ = ["MODEL_METRICS", "ModelExecutor", "TrialCost", "model_workload"]
