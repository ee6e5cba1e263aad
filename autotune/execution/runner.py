"""One trial on one host: launch, wait until ready (or failed), measure, tear down.

The runner knows nothing of Optuna or the storage: it takes a
:class:`~autotune.execution.trial.TrialSpec` and returns a plain
:class:`~autotune.execution.trial.TrialResult`. Readiness and failure are watched together: the health endpoint is
polled while the log is tailed, so a crash is seen within a poll interval, not at the timeout,
and the log excerpt is read before the process is killed.

A trial whose spec carries a value to beat (``TrialSpec.beat_value``) is measured under
:class:`~autotune.execution.early_stop.StopRule`: once its load cannot beat that value, the load stops, the
server is torn down as usual, and the result is ``outcome="stopped"`` with the metrics measured so
far and the reason (``early_stop``) -- measured, not infeasible.

The server is torn down on every way out, also when the caller's phase callback raises (its
storage failed): the error is raised once the server is gone. A local server's output is redacted
on its way to the log (:class:`~autotune.config.secrets.StreamRedactor`), so no secret value is
ever on disk; every log is redacted again when the trial ends (a remote host's included).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import time
from pathlib import Path
from typing import Any

import requests

from autotune.config.objective import NamedLoad, Objective
from autotune.config.secrets import Redactor, StreamRedactor
from autotune.engines import EnginePreset
from autotune.execution.early_stop import StopRule, applies
from autotune.execution.gpu_check import GPU_BUSY_WAIT_S, Holder, describe, foreign_holders, visible_gpus, wait_until_free
from autotune.execution.hosts import Host, HostFault, LocalHost, ServerLeftRunning, ServerProcess
from autotune.execution.loadgen import run_load_sync
from autotune.execution.log_watcher import LogWatcher
from autotune.execution.provenance import runner_for
from autotune.execution.stopping import StopRequest
from autotune.execution.trial import PhaseCallback, TrialResult, TrialSpec
from autotune.execution.workload import LoadProgress, workload_of
from autotune.outcome.failures import FAULT_KINDS, Failure, Phase, classify, excerpt, find_error
from autotune.outcome.results import ResultParseError, parse_result
from autotune.util.net import http_ok
from autotune.util.polling import polling, wait_until

DISK_FULL_TEXT = "No space left on device"
OOM_KINDS = frozenset({"oom", "not-enough-memory"})
"""Failures a process holding the GPUs' memory explains: re-checked after teardown (``gpu-busy``)."""


POLL_S = 0.1
TAIL_AFTER_ERROR_S = 1.0


class TrialRunner:
    """Runs trials of one target on one host.

    Contract: :meth:`run` always tears the server down (process group killed, port verified free)
    before it returns, whatever happened; a configuration failure is returned as
    ``outcome="infeasible"`` with a failure kind and excerpt, an infrastructure failure as
    ``outcome="fault"``. A teardown that could not reach a remote host is the one exception: the
    result says so (``left_running``) and the host kills the server when it answers again.

    The server runs on ``host`` (``{python}`` and ``{host}`` in its command are that host's); the
    load, and an objective's benchmark command, run here and reach it at ``host.base_url(port)``
    (``bench_host``: where a benchmark command runs; default ``host`` when it is local, else this
    machine). An ``engine: none`` trial is its benchmark command, run on ``bench_host``.
    """

    def __init__(
        self,
        host: Host,
        preset: EnginePreset,
        objective: Objective,
        *,
        log_dir: Path,
        template: str | None = None,
        fields: dict[str, str] | None = None,
        fixed_env: dict[str, str] | None = None,
        ready_timeout_s: float = 600.0,
        log_stall_s: float | None = None,
        ready_path: str | None = None,
        api: str | None = None,
        port: int | None = None,
        teardown_grace_s: float = 10.0,
        stop: StopRequest | None = None,
        secrets: tuple[str, ...] | list[str] = (),
        public: tuple[str, ...] | list[str] = (),
        bench_host: Host | None = None,
        gpu_busy_wait_s: float = GPU_BUSY_WAIT_S,
    ) -> None:
        self.host = host
        self.bench_host = bench_host or (LocalHost() if host.remote else host)
        self.preset = preset
        self.objective = objective
        self.log_dir = log_dir
        self.template = template
        self.fields = fields or {}
        self.fixed_env = fixed_env or {}
        self.ready_timeout_s = ready_timeout_s
        self.log_stall_s = log_stall_s
        self.ready_path = ready_path or preset.ready_path
        self.api = api or objective.load.api or preset.api
        self.port = port
        self.teardown_grace_s = teardown_grace_s
        self.stop = stop or StopRequest()
        self.secrets = tuple(secrets)
        self.public = tuple(public)
        self.gpu_busy_wait_s = gpu_busy_wait_s

    def command(self, spec: TrialSpec, port: int | str) -> tuple[list[str], dict[str, str]]:
        """The argv and env (fixed env + the trial's) that launch this trial's server.

        ``port`` may be the text ``"{port}"`` to get a template for launch profiles.
        """
        fields = {"python": self.host.python, "host": self.host.bind_address, **self.fields}
        argv = self.preset.argv(port=port, template=self.template, fields=fields) + list(spec.args)
        return argv, {**self.fixed_env, **spec.env}

    def run(self, spec: TrialSpec, on_phase: PhaseCallback | None = None) -> TrialResult:
        """Launch, wait for ready, measure, tear down. Never raises for a server's failure.

        A stop request (a signal) ends the trial as ``fault``/``interrupted`` after teardown. A
        host that cannot take a launch now (log folder unwritable, disk full) is a ``fault`` and
        nothing is launched; a server that died while its log's disk was full is a ``disk-full``
        fault, not the configuration's failure. GPUs that processes autotune did not start hold
        memory on are waited for (``gpu_busy_wait_s``), then a ``gpu-busy`` fault, nothing launched;
        an out-of-memory failure with such processes there after teardown is a ``gpu-busy`` fault.
        """
        phase_cb = on_phase or (lambda phase, detail: None)
        started = time.monotonic()
        log_path = self.log_dir / f"trial-{spec.number:04d}.log"
        try:
            port = self.port or self.host.free_port()
        except HostFault as fault:  # a remote host that cannot be reached: nothing launched
            argv, env = self.command(spec, "{port}")
            early = TrialResult(spec.number, "fault", argv=argv, argv_template=list(argv), env=env, host=self.host.name,
                                log_path=str(log_path), failure=Failure(fault.kind, str(fault), "", phase=Phase.LAUNCH))
            _redact(early, Redactor(env, argv, self.secrets, public=self.public, environ=os.environ), [])
            early.duration_s = time.monotonic() - started
            return early
        argv, env = self.command(spec, port)
        redactor = Redactor(env, argv, self.secrets, public=self.public, environ=os.environ)
        result = TrialResult(spec.number, "ok", argv=argv, env=env, host=self.host.name, port=port, log_path=str(log_path))
        result.argv_template = self.command(spec, "{port}")[0]  # type: ignore[arg-type]
        shown = redactor.argv(argv)[0]
        proc: ServerProcess | None = None
        watcher = LogWatcher(log_path, self.preset.patterns)
        try:
            if self.stop.requested:
                return self._interrupted(result, watcher)
            self.host.check_launch(log_path)
            self._check_gpus(env, phase_cb)
            if self.stop.requested:
                return self._interrupted(result, watcher)
            if self.preset.serverless:
                result.argv, result.argv_template, result.port = [], [], 0
                self._benchmark(spec, None, None, 0, result, phase_cb)
                self._check_slo(result)
                return result
            self.host.wait_port_free(port, timeout_s=5.0)
            if log_path.exists():
                log_path.unlink()
            phase_cb("launching", f"port {port}" + (f" on {self.host.name}" if self.host.remote else ""))
            proc = self.host.launch(argv, env, log_path, port=port, **_redacting(self.host, redactor))
            result.server_tag = proc.tag
            phase_cb("launched", json.dumps({"pgid": proc.pgid, "tag": proc.tag, "argv": shown, "port": port,
                                             "host": self.host.name, "niceness": proc.niceness()}))
            failure = self._wait_ready(proc, watcher, port, phase_cb, spec)
            if failure is not None:
                result.outcome = "fault" if failure.kind in FAULT_KINDS else "infeasible"
                result.failure = failure
                return result
            result.startup_s = time.monotonic() - started
            result.server_info = self._server_info(port)
            if self.objective.benchmark is not None:
                self._benchmark(spec, proc, watcher, port, result, phase_cb)
            else:
                self._measure(proc, watcher, port, result, phase_cb, spec)
            self._check_slo(result)
            return result
        except HostFault as fault:
            result.outcome = "fault"
            result.failure = Failure(fault.kind, str(fault), excerpt(watcher.text),
                                     phase=Phase.LAUNCH if proc is None else None)
            return result
        finally:
            recording_failed: Exception | None = None
            if proc is not None:
                try:
                    phase_cb("teardown", "")
                except Exception as exc:  # noqa: BLE001 - the caller's record failed (its storage gone): raised after teardown
                    recording_failed = exc
                try:
                    proc.stop(self.teardown_grace_s, hurry=lambda: self.stop.hurry)
                    self.host.wait_port_free(port)
                except HostFault as fault:
                    # The trial's result stands (a measured trial was measured); the next trial's
                    # launch reports the busy port or the host that does not answer.
                    result.left_running = isinstance(fault, ServerLeftRunning)
                    result.failure = result.failure or Failure(fault.kind, str(fault), "")
                watcher.read()
            if result.outcome in ("ok", "stopped") and watcher.signals.lines:
                result.signals = watcher.signals
            if result.outcome == "infeasible":
                self._blame_the_disk(result, watcher, log_path)
            if result.outcome == "infeasible":
                self._blame_the_gpus(result, watcher, env)
            _redact(result, redactor, [log_path, self.log_dir / f"trial-{spec.number:04d}.bench.log",
                                       self.log_dir / f"trial-{spec.number:04d}.result"])
            result.duration_s = time.monotonic() - started
            if recording_failed is not None:
                raise recording_failed

    def _interrupted(self, result: TrialResult, watcher: LogWatcher) -> TrialResult:
        """Mark ``result`` as stopped by a stop request: a fault, to be run again."""
        result.outcome = "fault"
        result.failure = Failure("interrupted", self.stop.reason or "stopped", excerpt(watcher.text))
        return result

    def _blame_the_disk(self, result: TrialResult, watcher: LogWatcher, log_path: Path) -> None:
        """An infeasible trial whose log says the disk was full, or whose log folder is full now,
        failed because of the host: turn it into a ``disk-full`` fault."""
        reason = ""
        if DISK_FULL_TEXT in watcher.text:
            reason = f"the server's log reports '{DISK_FULL_TEXT}'"
        else:
            try:
                self.host.check_launch(log_path)
            except HostFault as fault:
                if fault.kind == "disk-full":
                    reason = str(fault)
        if reason:
            cause = result.failure.kind if result.failure else None
            result.outcome = "fault"
            result.failure = Failure("disk-full", f"disk full: {reason}", excerpt(watcher.text), cause=cause)

    def _gpu_host(self) -> Host:
        """Where the trial's GPU work runs: the server's host, or the benchmark's (``engine: none``)."""
        return self.bench_host if self.preset.serverless else self.host

    def _foreign(self, env: dict[str, str], wait_s: float | None) -> list[Holder]:
        """Processes autotune did not start that hold memory on the GPUs ``env`` gives the trial
        (``CUDA_VISIBLE_DEVICES``; on a local host, ours when ``env`` does not set it); with
        ``wait_s``, waited for that long (or until a stop request) while any are there."""
        host = self._gpu_host()
        gpus = visible_gpus(env if host.remote or "CUDA_VISIBLE_DEVICES" in env else os.environ)
        run = runner_for(host, timeout_s=30.0)
        if wait_s is None:
            return foreign_holders(run, gpus)
        return wait_until_free(run, gpus, wait_s=wait_s, stopped=lambda: self.stop.requested)

    def _check_gpus(self, env: dict[str, str], phase_cb: PhaseCallback) -> None:
        """Before a launch: return once no foreign process holds the trial's GPUs (phase
        ``waiting-for-gpus`` while any do), or on a stop request. Raises HostFault(gpu-busy) naming
        them if they still do after ``gpu_busy_wait_s``."""
        holders = self._foreign(env, None)
        if holders:
            phase_cb("waiting-for-gpus", f"up to {self.gpu_busy_wait_s:g} s: {describe(holders)}")
            holders = self._foreign(env, self.gpu_busy_wait_s)
        if holders and not self.stop.requested:
            raise HostFault("gpu-busy", f"{describe(holders)}; waited {self.gpu_busy_wait_s:g} s")

    def _blame_the_gpus(self, result: TrialResult, watcher: LogWatcher, env: dict[str, str]) -> None:
        """An out-of-memory trial whose GPUs, after teardown, hold memory of processes autotune
        did not start failed because of them: turn it into a ``gpu-busy`` fault (``cause``: the
        out-of-memory kind)."""
        f = result.failure
        if f is None or f.kind not in OOM_KINDS:
            return
        holders = self._foreign(env, None)
        if holders:
            result.outcome = "fault"
            result.failure = Failure("gpu-busy", f"{f.kind} while {describe(holders)}", excerpt(watcher.text),
                                     cause=str(f.kind), phase=f.phase)

    # -- phases ---------------------------------------------------------------------------
    def _wait_ready(self, proc: ServerProcess, watcher: LogWatcher, port: int, phase_cb: PhaseCallback,
                    spec: TrialSpec) -> Failure | None:
        """Poll readiness while tailing the log. Not ready within the trial's ready timeout, or
        with a log that has not grown for ``log_stall_s``: ``startup-timeout`` with the reason."""
        url = f"{self.host.base_url(port)}{self.ready_path}"
        timeout = spec.ready_timeout_s or self.ready_timeout_s
        why = spec.ready_timeout_reason if spec.ready_timeout_s else "the target's ready_timeout_s"
        started = time.monotonic()
        deadline = started + timeout
        grew = started
        while True:
            if watcher.read():
                grew = time.monotonic()
            if self.stop.requested:
                return Failure("interrupted", self.stop.reason or "stopped", excerpt(watcher.text))
            code = proc.poll()
            if code is not None:
                watcher.read()
                return classify(watcher.text, phase="launching", exit_code=code, patterns=self.preset.patterns)
            if watcher.error is not None:
                return self._failure_while_alive(proc, watcher, "launching")
            if http_ok(url):
                if not self.preset.ready_probe:
                    return None
                status = self._probe_completion(port, deadline)
                if status == 200:
                    return None
                watcher.read()
                if watcher.error is not None or proc.poll() is not None:
                    return self._failure_while_alive(proc, watcher, "launching")
            now = time.monotonic()
            if now > deadline:
                watcher.read()
                return Failure(
                    "startup-timeout",
                    f"not ready after {timeout:.4g}s ({why}; {url} never answered 200)",
                    excerpt(watcher.text),
                )
            if self.log_stall_s is not None and now - grew > self.log_stall_s:
                return Failure(
                    "startup-timeout",
                    f"not ready and its log has not grown for {self.log_stall_s:g}s (log_stall_s; "
                    f"{now - started:.0f}s after launch)",
                    excerpt(watcher.text),
                )
            time.sleep(POLL_S)

    def _probe_completion(self, port: int, deadline: float) -> int:
        """POST one 1-token completion; the HTTP status, or 0 if there was no answer."""
        body: dict[str, Any] = {"prompt": "hello", "max_tokens": 1, "temperature": 0.0}
        if self.fields.get("served_model_name"):
            body["model"] = self.fields["served_model_name"]
        timeout = max(1.0, min(120.0, deadline - time.monotonic()))
        try:
            return requests.post(f"{self.host.base_url(port)}/v1/completions", json=body, timeout=timeout).status_code
        except requests.RequestException:
            return 0

    def _failure_while_alive(self, proc: ServerProcess, watcher: LogWatcher, phase: str) -> Failure:
        """An error line appeared: give the process a moment to print the rest, then classify."""
        wait_until(lambda: proc.poll() is not None, TAIL_AFTER_ERROR_S, POLL_S)
        watcher.read()
        return classify(watcher.text, phase=phase, exit_code=proc.poll(), patterns=self.preset.patterns)

    def _measure(self, proc: ServerProcess, watcher: LogWatcher, port: int, result: TrialResult, phase_cb: PhaseCallback,
                 spec: TrialSpec) -> None:
        """Run the objective's load, or each of its ``loads`` in turn on the same server (their
        metrics prefixed ``LOAD/``); the first load that fails ends the trial."""
        for named in self.objective.loads or (None,):
            self._measure_load(proc, watcher, port, result, phase_cb, spec, named)
            if result.outcome != "ok":
                return

    def _measure_load(self, proc: ServerProcess, watcher: LogWatcher, port: int, result: TrialResult,
                      phase_cb: PhaseCallback, spec: TrialSpec, named: NamedLoad | None = None) -> None:
        """Drive one load. Where the objective allows early stopping
        (:func:`~autotune.execution.early_stop.applies`: one load, a throughput metric) the load's progress
        goes through a :class:`~autotune.execution.early_stop.StopRule` (intermediate values), which stops
        it once it cannot beat ``spec.beat_value``."""
        load = self.objective.load if named is None else named.spec
        prefix, which = ("", "") if named is None else (named.prefix, f"{named.name}: ")
        workload = workload_of(load, api=self.api, model=self.fields.get("served_model_name") or None,  # type: ignore[arg-type]
                               tokenizer_hint=self.fields.get("model") or None)
        phase_cb("warming", f"{which}{load.warmup_prompts} requests")
        last_check = 0.0
        server_down = False
        rule = StopRule.for_objective(self.objective, spec.beat_value, spec.beat_reason) if applies(self.objective) else None

        def should_stop() -> bool:
            nonlocal last_check, server_down
            if self.stop.requested or (rule is not None and rule.stop is not None):
                return True
            now = time.monotonic()
            if server_down or now - last_check < POLL_S:
                return server_down
            last_check = now
            watcher.read()
            server_down = proc.poll() is not None or watcher.error is not None
            return server_down

        def on_progress(p: LoadProgress) -> None:
            if rule is not None:
                rule.observe(p)
            phase_cb("measuring", f"{which}{p.done}/{p.total} requests")

        base_url = self.host.base_url(port)
        load_result = run_load_sync(base_url, workload, on_progress=on_progress, should_stop=should_stop)
        watcher.read()
        if self.stop.requested:
            self._interrupted(result, watcher)
            return
        if server_down or proc.poll() is not None or watcher.error is not None:
            result.outcome = "infeasible"
            result.failure = self._failure_while_alive(proc, watcher, "measuring")
            result.metrics.update({prefix + k: v for k, v in load_result.metrics.items()})
            return
        result.metrics.update({prefix + k: v for k, v in load_result.metrics.items()})
        if rule is not None:
            result.intermediate = dict(rule.intermediate)
        stopped = rule is not None and rule.stop is not None
        # Requests the early stop cancelled are no failures; a stopped load may have completed none.
        failed = load_result.failed - load_result.cancelled
        total = load_result.completed + failed
        if (total == 0 and not stopped) or (total and failed / total > load.max_failed_fraction):
            result.outcome = "infeasible"
            errors = "; ".join(load_result.errors[:3]) or "no request completed"
            result.failure = Failure(
                "request-errors",
                f"{which}{failed} of {total} requests failed: {errors}",
                excerpt(watcher.text),
            )
            return
        if stopped:
            result.outcome = "stopped"
            result.early_stop = rule.stop  # type: ignore[union-attr]
            result.metrics.update(failed=float(failed), cancelled=float(load_result.cancelled))

    def _check_slo(self, result: TrialResult) -> None:
        """Add the metrics the objective defines (:meth:`Objective.derive`), then evaluate its
        constraints on a measured trial; broken -> slo-violated."""
        result.metrics = self.objective.derive(result.metrics)
        if result.outcome != "ok":
            return
        for c in self.objective.constraints:
            result.violations[str(c)] = c.violation(result.metrics)
        broken = [name for name, v in result.violations.items() if v > 0]
        if broken:
            result.outcome = "infeasible"
            shown = ", ".join(f"{name} (got {result.metrics.get(name.split()[0], float('nan')):.4g})" for name in broken)
            result.failure = Failure("slo-violated", f"SLO broken: {shown}", "")

    def _benchmark(
        self,
        spec: TrialSpec,
        server: ServerProcess | None,
        server_log: LogWatcher | None,
        port: int,
        result: TrialResult,
        phase_cb: PhaseCallback,
    ) -> None:
        """Run the objective's benchmark command and parse its result into ``result.metrics``.

        With no server (``engine: none``) the command *is* the trial: the trial's env applies,
        its flags are appended, and a failure is classified like a server's (infeasible). With a
        server, a server death during the benchmark is ``crash-under-load``.
        """
        bench = self.objective.benchmark
        assert bench is not None
        result_file = self.log_dir / f"trial-{spec.number:04d}.result"
        bench_log = self.log_dir / (f"trial-{spec.number:04d}.log" if server is None else f"trial-{spec.number:04d}.bench.log")
        for stale in (result_file, bench_log):
            if stale.exists():
                stale.unlink()
        # The benchmark runs here (bench_host) and reaches the server where this machine sees it.
        address, local_port = self.host.endpoint(port) if server is not None else (self.bench_host.address, port)
        values = {**self.fields, "python": self.bench_host.python, "host": address, "port": str(local_port),
                  "base_url": f"http://{address}:{local_port}", "result_file": str(result_file)}
        argv = [w.format(**values) for w in shlex.split(bench.command)]
        env = dict(self.fixed_env)
        if server is None:
            argv += list(spec.args)
            env.update(spec.env)
            result.argv, result.env = argv, env
        phase_cb("measuring", f"benchmark {Path(argv[0]).name}")
        bench_redactor = Redactor(env, argv, self.secrets, public=self.public, environ=os.environ)
        proc = self.bench_host.launch(argv, env, bench_log, **_redacting(self.bench_host, bench_redactor))
        watcher = LogWatcher(bench_log, self.preset.patterns)
        try:
            for _ in polling(bench.timeout_s, POLL_S):
                if proc.poll() is not None:
                    break
                watcher.read()
                if self.stop.requested:
                    self._interrupted(result, watcher)
                    return
                if server is not None and server_log is not None:
                    server_log.read()
                    if server.poll() is not None or server_log.error is not None:
                        result.outcome = "infeasible"
                        result.failure = self._failure_while_alive(server, server_log, "measuring")
                        return
            else:
                result.outcome = "infeasible" if server is None else "fault"
                result.failure = Failure("timeout" if server is None else "benchmark-timeout",
                                         f"benchmark still running after {bench.timeout_s:g}s", excerpt(watcher.text))
                return
        finally:
            proc.stop(5.0, hurry=lambda: self.stop.hurry)
        watcher.read()
        code = proc.poll()
        if code != 0:
            found = find_error(watcher.text, self.preset.patterns)
            if server is None or found is not None:
                f = classify(watcher.text, phase="launching", exit_code=code, patterns=self.preset.patterns)
                result.outcome = "fault" if f.kind in FAULT_KINDS else "infeasible"
                result.failure = f
            else:
                result.outcome = "fault"
                result.failure = Failure("benchmark-failed", f"benchmark exited with code {code}", excerpt(watcher.text))
            return
        text = result_file.read_text() if "{result_file}" in bench.command and result_file.exists() else watcher.text
        try:
            result.metrics = parse_result(bench.parse, text, json_path=bench.json_path)
        except ResultParseError as exc:
            result.outcome = "fault"
            result.failure = Failure("result-unparsed", str(exc), excerpt(watcher.text))

    def _server_info(self, port: int) -> dict[str, Any] | None:
        info: dict[str, Any] = {}
        for path in self.preset.info_paths:
            url = f"{self.host.base_url(port)}{path}"
            try:
                resp = requests.get(url, timeout=5)
            except requests.RequestException:
                continue
            if resp.status_code != 200:
                continue
            try:
                info[path] = resp.json()
            except ValueError:
                info[path] = _prometheus_subset(resp.text)
        return info or None


def _redacting(host: Host, redactor: Redactor) -> dict[str, Any]:
    """The ``redact`` argument of ``host.launch`` where the host takes one and there is a secret:
    its output is then redacted as it reaches the log, not only when the trial ends."""
    return {"redact": StreamRedactor(redactor)} if host.redacts_logs and redactor else {}


def _redact(result: TrialResult, redactor: Redactor, logs: list[Path]) -> None:
    """Replace every secret in ``result`` (env, argv, template, failure texts, server info) and in
    the log files by its ``${NAME}`` reference, recording where (see :mod:`autotune.config.secrets`)."""
    launch = redactor.launch(result.env, result.argv)
    result.env, result.argv = launch.env, launch.argv
    result.secret_env, result.secret_args = launch.secret_env, launch.secret_args
    result.argv_template = redactor.argv(result.argv_template)[0]
    if not redactor:
        return
    if result.failure is not None:
        f = result.failure
        result.failure = dataclasses.replace(f, message=redactor.text(f.message), excerpt=redactor.text(f.excerpt))
    if result.server_info:
        result.server_info = json.loads(redactor.text(json.dumps(result.server_info)))
    for log in logs:
        redactor.file(log)


def _prometheus_subset(text: str, limit: int = 200) -> dict[str, float]:
    """Numeric samples of a Prometheus text page (the first ``limit``), e.g. vLLM's /metrics."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        try:
            out[name] = float(value)
        except ValueError:
            continue
        if len(out) >= limit:
            break
    return out
