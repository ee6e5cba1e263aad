"""The ask/tell loop: baseline first, budget, resume, faults.

Only the driver talks to the Optuna storage, and only through :mod:`autotune.store.record`. Each trial
is asked, its parameters turned into a launch by the search space, run by the executor (which
returns a plain ``TrialResult``), recorded and told (:func:`autotune.store.record.tell`): ``ok`` and
``infeasible`` COMPLETE (an infeasible one with constraint ``failure`` > 0), ``stopped`` PRUNED,
``fault`` FAIL and its parameters enqueued again (up to ``max_fault_retries`` times; a slot is
quarantined after repeated faults, and the study stops when none is left). A failure no
configuration can avoid (the engine or the model missing) stops the study with a
:class:`~autotune.errors.UsageError`.

One study, one owner: the driver takes the study's lease (:mod:`autotune.study.lease`) before it writes
anything. A study started again continues: RUNNING trials of a dead owner are failed
(``fault``/``interrupted``), whatever they left running is killed, and their parameters enqueued
again. A server a teardown could not reach is kept in the study's ``servers_left`` attribute until
a driver reaches its host and kills it. A signal stops the study after the running trial is torn
down (:mod:`autotune.execution.stopping`); that trial is recorded as ``fault``/``interrupted`` and enqueued
again. A seeded study's sampler is seeded from the seed and the number of trials so far
(:func:`derived_seed`).
"""

from __future__ import annotations

import datetime
import json
import shlex
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol

import optuna
from optuna.artifacts import FileSystemArtifactStore, upload_artifact
from optuna.trial import TrialState

from autotune.study import confirmation
from autotune.analysis.explain import MONOTONE_ATTR
from autotune.config.study import StudyConfig
from autotune.engines import get_preset
from autotune.execution.early_stop import applies as early_stop_applies, value_to_beat
from autotune.errors import UsageError
from autotune.execution.executors import Executor, host_for
from autotune.search.implied import MAX_SKIPS_IN_A_ROW, Implication, implied_failure
from autotune.execution.hosts import (
    MIN_FREE_BYTES,
    Host,
    HostFault,
    kill_stale_local_server,
)
from autotune.study.lease import StudyLease
from autotune.outcome.load_signals import ATTR as SIGNALS_ATTR
from autotune.study.notes import write_notes, write_trial_note
from autotune.config.objective import Objective
from autotune.execution.provenance import host_facts, runner_for
from autotune.execution.runner import TrialResult, TrialSpec
from autotune.search.samplers import CrashAwareTPESampler
from autotune.config.secrets import Redactor
from autotune.execution.slots import Slot, SlotPool
from autotune.config.space import SearchSpace
from autotune.execution.stopping import StopRequest, handle_signals
from autotune.store.storage import artifact_dir, check_storage, open_storage
from autotune.store import record
from autotune.outcome.failures import Failure
from autotune.store.record import FAILURE_CONSTRAINT, PROPOSED_ATTR, Outcome, carried
from autotune.store.record import read
from autotune.store.study_view import best_moved, best_view, measured_configs, proposal_text, trial_views

WAIT_S = 1.0
"""How long the driver waits for a trial to finish before it looks at the study again."""
SLOTS_ATTR = "slots"
"""Study user attr: each slot with its health (``SlotPool.report``), for `study status`."""
STOP_ATTR = "stop_requested"
"""Study user attr ``{"by", "owner", "at"}`` written by `autotune study stop`: the driver whose
lease owner id is ``owner`` stops as on a signal (running trials torn down and recorded as
interrupted); any other driver (a later one) ignores it."""
SERVERS_LEFT = "servers_left"
"""Study user attr: ``[{"host", "tag", "trial"}]``, servers a teardown could not reach."""


class Reporter(Protocol):
    """Receives progress events (a live display, or plain lines when not on a terminal)."""

    def study_started(self, name: str, done: int, budget: int | None) -> None: ...
    def trial_started(self, number: int, params: dict[str, Any], baseline: bool, slot: str = "",
                      why: str | None = None) -> None: ...
    def phase(self, number: int, phase: str, detail: str) -> None: ...
    def trial_finished(self, result: TrialResult, value: float | None, best: float | None,
                       moved: str | None = None) -> None: ...
    def trial_skipped(self, number: int, params: dict[str, Any], reason: str) -> None: ...
    def slot_quarantined(self, slot: str, reason: str) -> None: ...
    def note(self, text: str) -> None: ...
    def study_finished(self, study: optuna.Study, reason: str) -> None: ...


class QuietReporter(Reporter):
    """A reporter that shows nothing: the protocol's methods, each doing nothing."""


class HostBrokenError(RuntimeError):
    """No healthy slot is left (each quarantined after faults): the study stops rather than burn
    its budget."""


@dataclass
class _InFlight:
    """A trial submitted to the executor and not yet told."""

    trial: optuna.Trial
    slot: Slot
    applied: dict[str, Any]


class StudyMismatchError(UsageError):
    """A study of this name exists with another direction or another search space."""


@dataclass
class StudyRun:
    """What one invocation of the driver did."""

    study: optuna.Study
    trials_run: int = 0
    reason: str = ""
    results: list[TrialResult] = field(default_factory=list)


def derived_seed(seed: int | None, trials_so_far: int) -> int | None:
    """The sampler seed of an invocation that starts after ``trials_so_far`` trials.

    A resumed seeded study must not replay the sequence it already ran, and must stay
    reproducible: the seed depends on the configured seed and the history's length only.
    """
    if seed is None:
        return None
    return (seed * 1_000_003 + trials_so_far * 7_919) % 2**32


SamplerFactory = Callable[[int | None], optuna.samplers.BaseSampler]
"""Makes a study's sampler from its seed (:func:`derived_seed`): a :class:`Driver` option."""

def make_sampler(kind: str, seed: int | None, *, slots: int = 1,
                 launched_as: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
                 monotone: Mapping[str, Mapping[str, str]] | None = None,
                 raise_when: Mapping[str, str] | None = None) -> optuna.samplers.BaseSampler:
    """The sampler for a config's ``sampler`` key, for a study run on ``slots`` slots at once.

    ``tpe`` (the default) is :class:`~autotune.search.samplers.CrashAwareTPESampler`: multivariate TPE
    (constant liar and a shorter start-up with several slots: :func:`~autotune.search.samplers.tpe_sampler`)
    that redraws proposals falling into a region where every trial crashed, as `autotune bench
    tuner` compares in docs/BENCHMARKS.md; ``monotone`` (the space's declarations) is what it
    backs off along while no trial has run, ``raise_when`` the parameters it raises when the best
    trial's scheduler log calls for it (:mod:`autotune.outcome.load_signals`). Each of them runs
    multi-objective studies too: Optuna 5's TPE splits such a history by non-domination rank and ranks every trial with a positive
    constraint (PRUNED included) below the feasible ones, the crash regions depend on outcomes
    only, and the GP sampler has a constrained multi-objective acquisition.
    """
    if kind == "gp":
        return optuna.samplers.GPSampler(seed=seed)
    if kind == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return CrashAwareTPESampler(seed, slots=slots, launched_as=launched_as, monotone=monotone, raise_when=raise_when)


def startup_timeout(startups: list[float], *, cap_s: float, factor: float, floor_s: float) -> tuple[float, str]:
    """The ready timeout of the next trial, and how it was chosen.

    A hang on an unseen host should cost minutes, not the whole ``cap_s``: once some trial
    started, the next one gets ``factor`` times the slowest successful start-up, at least
    ``floor_s``, at most ``cap_s``. With no start-up seen yet, ``cap_s``.
    """
    if not startups:
        return cap_s, "the target's ready_timeout_s"
    slowest = max(startups)
    timeout = min(cap_s, max(floor_s, factor * slowest))
    if timeout == cap_s:
        return cap_s, "the target's ready_timeout_s"
    if timeout == floor_s:
        return timeout, "startup_timeout_floor_s"
    return timeout, f"{factor:g} x the slowest successful start-up, {slowest:.1f}s"


finished_trials = record.finished
"""Trials that count against the budget (:attr:`autotune.store.record.Outcome.finished`)."""




class Driver:
    """Runs a study to its budget.

    Contract: the baseline (if any) is enqueued first and only once per study; the budget counts
    finished trials across invocations (``trials``) and the summed duration of trials
    (``hours``); nothing recorded is ever deleted.
    """

    def __init__(
        self,
        config: StudyConfig,
        space: SearchSpace,
        objective: Objective,
        executor: Executor,
        *,
        reporter: Reporter | None = None,
        trials: int | None = None,
        stop: StopRequest | None = None,
        hosts: Mapping[str, Host] | None = None,
        sampler: SamplerFactory | None = None,
        skip_implied: bool = True,
    ) -> None:
        self.config = config
        self.skip_implied = skip_implied
        """Whether proposals an earlier failure implies are skipped (:mod:`autotune.search.implied`);
        `autotune bench tuner` turns it off for the strategies that stand for other tools."""
        self.sampler_factory = sampler
        """Makes the study's sampler from the derived seed instead of the config's ``sampler``
        (None: :func:`make_sampler`); `autotune bench tuner` compares strategies this way."""
        self.hosts: dict[str, Host] = dict(hosts or {})
        """Host objects by name (those the executor uses); others are made when a stale trial
        recorded one (with the config's SSH options)."""
        self._left: list[dict[str, Any]] = []  # servers_left, as last written
        self.space = space
        self.objective = objective
        self.executor = executor
        self.reporter: Reporter = reporter or QuietReporter()
        self.budget_trials = trials if trials is not None else config.budget.trials
        self.artifacts = artifact_dir(config.storage)
        self.store = FileSystemArtifactStore(str(self.artifacts))
        self.constraint_keys = [FAILURE_CONSTRAINT] + [f"slo:{c}" for c in objective.constraints]
        self.stop = stop or StopRequest()
        self.lease: StudyLease | None = None
        self.pool = SlotPool(executor.slots(), quarantine_after=config.quarantine_after)
        self._niced: set[tuple[str, int]] = set()
        """(host, niceness) pairs already told to the reporter."""

    # -- setup ------------------------------------------------------------------------------
    def open_study(self) -> optuna.Study:
        """Take the study's lease, create the study or load the one of the same name, check that
        it is the same study (direction, search space), and fail the trials a dead owner left
        RUNNING (killing what they left running) before anything else is written.

        Raises:
            StudyBusyError: another live driver runs the study.
            StudyMismatchError: a study of this name exists with another direction or space.
            UsageError: the storage cannot be opened, or the artifact folder cannot be written.
        """
        check_storage(self.config.storage)  # before the artifact folder is made
        self._check_artifacts_writable()
        storage = open_storage(self.config.storage)
        self.lease = StudyLease(storage, self.config.name)
        self.lease.acquire()
        directions: dict[str, Any] = ({"directions": self.objective.directions} if self.objective.multi
                                      else {"direction": self.objective.direction})
        study = optuna.create_study(storage=storage, study_name=self.config.name, load_if_exists=True, **directions)
        self._check_same_study(study)
        seed = derived_seed(self.config.seed, len(study.trials))
        study.sampler = (self.sampler_factory(seed) if self.sampler_factory is not None
                         else make_sampler(self.config.sampler, seed, slots=self.executor.capacity(),
                                           launched_as=self.space.applied, monotone=self.space.monotone(),
                                           raise_when=self.space.raise_when()))
        if "config" not in study.user_attrs:
            study.set_user_attr("config", self._stored_config())
            stored: dict[str, Any] = {"name": self.objective.name, "metric": self.objective.metric,
                                      "direction": self.objective.direction,
                                      "constraints": [str(c) for c in self.objective.constraints]}
            if self.objective.multi:  # the first objective above; all of them, and the rule choosing from the front
                stored.update(objectives=[g.to_json() for g in self.objective.goals],
                              choose=self.objective.choice.to_json())
            study.set_user_attr("objective", stored)
            study.set_user_attr("space", self.space.name)
            study.set_user_attr("space_distributions", self._space_signature())
            study.set_user_attr(MONOTONE_ATTR, self.space.monotone())  # what `study explain` scopes rules by
            study.set_user_attr("created", datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
        self._record_host_facts(study)
        me = self.lease.me.id
        earlier_left = list(study.user_attrs.get(SERVERS_LEFT) or [])
        self._left = []
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
        self._left = self._kill_each(earlier_left) + self._left
        if earlier_left or self._left:
            study.set_user_attr(SERVERS_LEFT, list(self._left))
        if self.config.baseline or not study.trials:
            baseline = self.space.complete(self.config.baseline)
            study.enqueue_trial(baseline, user_attrs={"baseline": True}, skip_if_exists=True)
        return study

    def _record_host_facts(self, study: optuna.Study) -> None:
        """What each host says about its GPUs, driver, NCCL and engine package (for the profile's
        provenance), in the study's ``host_facts``, once per host (a resume asks only hosts new to
        the study; the package's version is read from its metadata: nothing is imported).
        Under Ray with local slots the trials run on the nodes, which the driver does not reach:
        nothing is recorded for them."""
        facts = dict(study.user_attrs.get("host_facts") or {})
        package = get_preset(self.config.target.engine).package
        new = {name: host_facts(runner_for(host), python=host.python, package=package)
               for name, host in self.hosts.items()
               if name not in facts and not (self.config.executor == "ray" and not host.remote)}
        if new:
            study.set_user_attr("host_facts", {**facts, **new})

    def _host(self, name: str) -> Host | None:
        """The host object of ``name`` (made on first use); None for a name no longer valid."""
        if name not in self.hosts:
            try:
                self.hosts[name] = host_for(self.config.target, name)
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
        self._left += self._kill_each([{"host": name, "tag": tag, "trial": t.number}])

    def _kill_each(self, servers: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Kill each listed server (``{"host", "tag", "trial"}``) on its host; returns those whose
        host could not be reached."""
        still = []
        for entry in servers:
            host = self._host(str(entry.get("host")))
            try:
                if host is not None:
                    host.kill_tagged(str(entry.get("tag")))
            except HostFault:
                still.append(entry)
        return still

    def _retry_servers_left(self, study: optuna.Study) -> None:
        """Kill the servers teardowns could not reach, now that their host may answer again."""
        still = self._kill_each(self._left)
        if still != self._left:
            self._left = still
            study.set_user_attr(SERVERS_LEFT, list(still))

    def _stored_config(self) -> dict[str, Any]:
        """The config as stored with the study: secrets in ``target.env`` and ``target.command``
        replaced by ``${NAME}`` references (supplied from the environment on resume)."""
        data = self.config.model_dump(mode="json")
        target = self.config.target
        redactor = Redactor(target.env, (), target.secrets, public=self.space.applied_names())
        data["target"]["env"] = redactor.env(target.env)[0]
        if target.command:
            redacted = redactor.command(target.command)
            if shlex.split(redacted) != shlex.split(target.command):
                data["target"]["command"] = redacted
        return data

    def _space_signature(self) -> dict[str, str]:
        return {n: optuna.distributions.distribution_to_json(d) for n, d in self.space.distributions().items()}

    def _check_same_study(self, study: optuna.Study) -> None:
        name = self.config.name
        stored_directions = [d.name.lower() for d in study.directions]
        if stored_directions != self.objective.directions:
            raise StudyMismatchError(
                f"study '{name}' exists with direction {', '.join(stored_directions)}, the objective says "
                f"{', '.join(self.objective.directions)}: use another --name"
            )
        listed = (study.user_attrs.get("objective") or {}).get("objectives")
        if self.objective.multi and isinstance(listed, list):
            stored_metrics = [str((g or {}).get("metric")) for g in listed]
            metrics = [g.metric for g in self.objective.goals]
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
        current = self._space_signature()
        for n in sorted(set(stored) | set(current)):
            if n not in current:
                problem = f"parameter '{n}' is not in search space {self.space.name}"
            elif n not in stored:
                problem = f"parameter '{n}' is new"
            elif optuna.distributions.json_to_distribution(stored[n]) != optuna.distributions.json_to_distribution(current[n]):
                problem = f"parameter '{n}' changed from {stored[n]} to {current[n]}"
            else:
                continue
            raise StudyMismatchError(
                f"study '{name}' was run with another search space ({problem}): use another --name"
            )

    def _check_artifacts_writable(self) -> None:
        try:
            self.artifacts.mkdir(parents=True, exist_ok=True)
            probe = self.artifacts / f".write-probe-{id(self)}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise UsageError(f"artifact folder {self.artifacts} is not writable: {exc.strerror}") from None

    # -- the loop ---------------------------------------------------------------------------
    def run(self) -> StudyRun:
        """Ask, run, tell until the budget is spent or a stop is requested (a signal).

        Returns what this invocation did; ``reason`` says why it ended. The lease is released on
        every way out.
        """
        with handle_signals(self.stop):
            try:
                study = self.open_study()
                assert self.lease is not None
                self.lease.start_heartbeat()
                return self._loop(study)
            finally:
                if self.lease is not None:
                    self.lease.release()

    def _loop(self, study: optuna.Study) -> StudyRun:
        run = StudyRun(study)
        self.reporter.study_started(study.study_name, len(finished_trials(study)), self.budget_trials)
        running: dict[int, _InFlight] = {}
        self._write_slots(study)
        broken = ""  # why no healthy slot is left: the study stops with HostBrokenError
        try:
            while True:
                if self._left:
                    self._retry_servers_left(study)
                run.reason = run.reason or self._must_stop(study) or (self._budget_spent(study) if not running else "")
                if run.reason and running:
                    # A signal, `study stop`, a lost lease, no healthy slot: stop what runs now.
                    self.executor.request_stop(self.stop.reason or run.reason, self.stop.hurry)
                while (not run.reason and len(running) < self.executor.capacity() and self.pool.free()
                       and self._room(study, len(running))):
                    flight = self._submit(study, [f.applied for f in running.values()])
                    running[flight.trial.number] = flight
                if not running:
                    break  # a reason is set, or nothing may start
                for done in self.executor.wait(WAIT_S):
                    flight = running.pop(done.number)
                    self.pool.release(done.slot)
                    if self.lease is not None and self.lease.lost:
                        continue  # the driver that took over failed this trial already
                    broken = broken or self._finish(study, flight, done.result, run)
                    self._write_slots(study)
                run.reason = run.reason or broken
        except BaseException:
            self._abandon(study, running, run)
            raise
        try:  # the notes whose word the last trials changed (the trial the dashboard's best card showed)
            write_notes(study)
        except Exception:  # noqa: BLE001 - a note is a courtesy: it never stops a study
            pass
        if broken and run.reason == broken:
            self.reporter.study_finished(study, broken)
            raise HostBrokenError(broken)
        self.reporter.study_finished(study, run.reason)
        return run

    def _abandon(self, study: optuna.Study, running: dict[int, _InFlight], run: StudyRun) -> None:
        """On an error in the loop: tear down what still runs (hurried) and record it if the
        storage lets us, so no server outlives the driver and no trial stays RUNNING."""
        if not running:
            return
        self.executor.request_stop("the driver stopped on an error", hurry=True)
        while running and self.executor.running():
            for done in self.executor.wait(WAIT_S):
                flight = running.pop(done.number, None)
                if flight is None:
                    continue
                try:
                    self._finish(study, flight, done.result, run)
                except Exception:  # noqa: BLE001 - the error being raised is the one to report
                    pass

    def _room(self, study: optuna.Study, in_flight: int) -> bool:
        """Whether the budget leaves room for one more trial beside ``in_flight`` running ones."""
        if self.budget_trials is not None and len(finished_trials(study)) + in_flight >= self.budget_trials:
            return False
        return not (in_flight and self._budget_spent(study))

    def _submit(self, study: optuna.Study, pending: list[dict[str, Any]]) -> _InFlight:
        """Ask a trial (a confirmation run when the budget's end has come, see
        :mod:`autotune.study.confirmation`; proposals that an earlier failure implies are recorded as
        skipped and asked again, see :mod:`autotune.search.implied`), choose its slot (a free one; a
        retry avoids the slot that faulted), and submit it. ``pending``: the applied parameters
        of the trials running now."""
        self._enqueue_confirmation(study, pending)
        trial, params, launch = self._ask(study)
        assert self.lease is not None
        trial.set_user_attr("owner", self.lease.me.id)
        slot = self.pool.choose(avoid=trial.user_attrs.get("avoid_slot"))
        assert slot is not None, "_submit is called only with a free slot"
        self.pool.take(slot)
        trial.set_user_attr("slot", slot.name)
        if slot.gpus is not None:
            trial.set_user_attr("gpus", list(slot.gpus))
        is_baseline = bool(trial.user_attrs.get("baseline"))
        self.reporter.trial_started(trial.number, launch.applied, is_baseline, slot.name, why=self._why(study, trial))
        target = self.config.target
        timeout, why = startup_timeout(
            [float(t.user_attrs["startup_s"]) for t in study.get_trials(deepcopy=False)
             if t.user_attrs.get("startup_s") is not None],
            cap_s=target.ready_timeout_s, factor=target.startup_timeout_factor, floor_s=target.startup_timeout_floor_s)
        beat, beat_why = None, ""
        if (early_stop_applies(self.objective) and not is_baseline and not trial.user_attrs.get("ablation")
                and "confirms" not in trial.user_attrs):
            # (the reference runs and the confirmation runs are measured to the end)
            measured = [v.value for v in trial_views(study) if v.value is not None]
            beat, beat_why = value_to_beat(measured, self.budget_trials,
                                           maximize=self.objective.direction == "maximize")
        spec = TrialSpec(trial.number, env=launch.env, args=launch.args, ready_timeout_s=timeout,
                         ready_timeout_reason=why, beat_value=beat, beat_reason=beat_why)
        last = {"phase": ""}

        def on_phase(phase: str, detail: str, trial: optuna.Trial = trial) -> None:
            if phase == "launched":
                info = json.loads(detail)
                trial.set_user_attr("server_pgid", info.get("pgid"))
                trial.set_user_attr("server_tag", info.get("tag"))
                trial.set_user_attr("argv", info.get("argv"))
                trial.set_user_attr("host", info.get("host", "local"))
                trial.set_user_attr("niceness", info.get("niceness"))
                self._note_niceness(trial.number, info.get("niceness"), info.get("host", "local"))
                return
            if phase == "started":
                trial.set_user_attr("node", json.loads(detail).get("ip"))
                return
            if phase != last["phase"]:
                last["phase"] = phase
                trial.set_user_attr("phase", phase)
                trial.set_user_attr("phase_since", time.time())
            self.reporter.phase(trial.number, phase, detail)

        self.executor.submit(spec, slot, on_phase)
        return _InFlight(trial, slot, launch.applied)

    @staticmethod
    def _why(study: optuna.Study, trial: optuna.Trial) -> str | None:
        """Why this trial runs, in words: it measures another's configuration again, runs a trial
        again after a fault, or what the sampler proposed it for."""
        ua = trial.user_attrs
        if "confirms" in ua:
            return (f"measures trial {ua['confirms']}'s configuration again: a candidate for the best, whose figure "
                    "is the mean of its runs after the first")
        if ua.get("retry_of") is not None:
            return f"runs trial {ua['retry_of']} again: it did not finish through no fault of its configuration"
        return proposal_text(record.system_attrs(study, trial).get(PROPOSED_ATTR))

    def _note_niceness(self, number: int, niceness: Any, host: str) -> None:
        """Say once per host and niceness when a server runs above niceness 0: on a busy host it
        gets less CPU than it will serve with, and measures that (docs/distributed.md)."""
        if not isinstance(niceness, int) or niceness <= 0 or (host, niceness) in self._niced:
            return
        self._niced.add((host, niceness))
        self.reporter.note(f"trial {number}: the server runs at CPU niceness {niceness} on {host}: where anything "
                           "else is busy it gets less CPU than it will serve with, and measures that. A server inherits "
                           "the niceness of what starts it: run autotune, an SSH host's login shell and Ray's nodes "
                           "(RAY_worker_niceness=0) at niceness 0 (docs/distributed.md)")

    def _ask(self, study: optuna.Study) -> tuple[optuna.Trial, dict[str, Any], Any]:
        """The next trial to launch, its raw parameters and its launch. A proposal that an
        earlier failure implies (the space's ``monotone`` parameters) is recorded as skipped and
        the sampler asked again, up to :data:`~autotune.search.implied.MAX_SKIPS_IN_A_ROW` times."""
        monotone = self.space.monotone() if self.skip_implied else {}
        for _ in range(MAX_SKIPS_IN_A_ROW):
            trial = study.ask()
            params = self.space.suggest(trial)
            launch = self.space.to_launch(params)
            why = None
            if monotone and "confirms" not in trial.user_attrs and not trial.user_attrs.get("baseline"):
                why = implied_failure(launch.applied, self._failures(study), monotone)
            if why is None:
                return trial, params, launch
            self._skip(study, trial, launch.applied, why)
        trial = study.ask()
        params = self.space.suggest(trial)
        return trial, params, self.space.to_launch(params)

    @staticmethod
    def _failures(study: optuna.Study) -> list[tuple[int, str, dict[str, Any]]]:
        """(number, failure kind, applied parameters) of the study's launched infeasible trials."""
        return [(r.number, str(r.failure_kind), r.params) for r in record.read_all(study)
                if r.outcome is Outcome.INFEASIBLE and r.failure_kind]

    def _skip(self, study: optuna.Study, trial: optuna.Trial, applied: dict[str, Any], why: Implication) -> None:
        """Record a proposal an earlier failure implies, without launching it, and tell the
        sampler it is infeasible."""
        message = why.message()
        assert self.lease is not None
        trial.set_user_attr("owner", self.lease.me.id)
        record.write_skipped(trial, Failure(why.kind, message, ""), {"applied": applied, "implied_by": why.trial})
        record.set_constraints(trial, {FAILURE_CONSTRAINT: 1.0, **{f"slo:{c}": 0.0 for c in self.objective.constraints}})
        record.tell(study, trial, Outcome.SKIPPED, fill=self._fill(study))
        try:
            write_trial_note(study, trial)
        except Exception:  # noqa: BLE001 - a note is a courtesy: it never stops a study
            pass
        self.reporter.trial_skipped(trial.number, applied, message)

    def _enqueue_confirmation(self, study: optuna.Study, pending: list[dict[str, Any]]) -> None:
        """Queue a measurement of a best configuration again when the budget's end has come
        (:func:`autotune.study.confirmation.next_run`); nothing while another trial waits in the queue,
        nor in a multi-objective study (its front is reported as measured)."""
        confirm = self.config.budget.confirm
        reserve = confirmation.reserve(self.budget_trials)
        if (not reserve or confirm.candidates < 1 or self.objective.multi
                or study.get_trials(deepcopy=False, states=(TrialState.WAITING,))):
            return
        trials = study.get_trials(deepcopy=False)
        done = finished_trials(study)
        views = [read(t) for t in done]
        again = confirmation.next_run(
            measured_configs(views), left=int(self.budget_trials or 0) - len(done) - len(pending),
            spent=sum(1 for t in trials if "confirms" in t.user_attrs and t.state != TrialState.WAITING),
            reserve_runs=reserve, candidates=confirm.candidates, measurements=confirm.measurements,
            maximize=self.objective.direction == "maximize", pending=pending)
        if again is None:
            return
        first = next(t for t in done if t.number == again.trials[0])
        study.enqueue_trial(dict(first.params), user_attrs={"confirms": first.number})

    def _finish(self, study: optuna.Study, flight: _InFlight, result: TrialResult, run: StudyRun) -> str:
        """Tell a finished trial, retry a fault elsewhere, keep the slot's health; returns why the
        study must stop (no healthy slot left), else ""."""
        trial, slot = flight.trial, flight.slot
        before = best_view(study)
        value = self._tell(study, trial, flight.applied, result)
        try:
            write_trial_note(study, trial)  # the dashboard's Note reads like `study show`
        except Exception:  # noqa: BLE001 - a note is a courtesy: it never stops a study
            pass
        run.trials_run += 1
        run.results.append(result)
        best = best_view(study)
        moved = best_moved(before, best, self.objective.metric) if not self.objective.multi else None
        self.reporter.trial_finished(result, value, None if best is None else best.value, moved)
        kind = result.failure.kind if result.failure else None
        msg = result.failure.message if result.failure else ""
        base = carried(trial.user_attrs)
        if result.failure is not None and result.failure.kind.fatal:
            # No configuration can start while this holds (the engine is not installed, the model
            # is not there): stop in one line, nothing retried, nothing blamed on the configuration.
            raise UsageError(f"trial {trial.number}: {result.failure.kind}: {result.failure.message} "
                             f"(the {result.failure.blame}'s fault, not the configuration's; fix it and resume)")
        if kind == "interrupted":
            # Not the trial's fault and not the host's: run the same parameters again later.
            study.enqueue_trial(dict(trial.params), user_attrs={"retry_of": trial.number, **base})
        elif result.outcome == "fault":
            retries = int(trial.user_attrs.get("fault_retries", 0))
            if retries < self.config.max_fault_retries:
                study.enqueue_trial(dict(trial.params), user_attrs={"fault_retries": retries + 1, "retry_of": trial.number,
                                                                     "avoid_slot": slot.name, **base})
        quarantined = self.pool.record(slot, result.outcome, kind, msg)
        if not quarantined:
            return ""
        self.reporter.slot_quarantined(slot.name, quarantined)
        if self.pool.healthy():
            return ""
        if len(self.pool.slots) == 1:
            return f"stopped: {quarantined}"
        return f"stopped: no healthy slot left (last quarantined: {slot.name}: {quarantined})"

    def _write_slots(self, study: optuna.Study) -> None:
        """The slots and their health, for `study status`."""
        study.set_user_attr(SLOTS_ATTR, self.pool.report())

    def _must_stop(self, study: optuna.Study) -> str:
        """Why the study must stop before the next trial: a signal or `study stop`, a lost lease,
        a full disk."""
        if not self.stop.requested:
            asked = study.user_attrs.get(STOP_ATTR)
            if isinstance(asked, dict) and self.lease is not None and asked.get("owner") == self.lease.me.id:
                self.stop.request(f"stopped by `autotune study stop` ({asked.get('by', '')})")
        if self.stop.requested:
            return f"interrupted: {self.stop.reason}; `autotune study resume {self.config.name}` continues"
        if self.lease is not None and self.lease.lost:
            return "stopped: another driver took over this study's lease"
        if self.config.storage.startswith("sqlite:///"):
            folder = Path(self.config.storage.removeprefix("sqlite:///")).parent
            try:
                free = shutil.disk_usage(folder).free
            except OSError:
                return ""
            if free < MIN_FREE_BYTES:
                raise HostBrokenError(f"stopped: only {free // 1024} KiB free under the storage's folder {folder}; "
                                      "free some space and resume")
        return ""

    def _budget_spent(self, study: optuna.Study) -> str:
        done = finished_trials(study)
        if self.budget_trials is not None and len(done) >= self.budget_trials:
            return f"budget reached: {len(done)} trials"
        if self.config.budget.hours is not None:
            spent = sum(float(t.user_attrs.get("duration_s", 0.0)) for t in study.get_trials(deepcopy=False))
            if spent >= self.config.budget.hours * 3600:
                return f"budget reached: {spent / 3600:.2f} h of trials"
        return ""

    def _tell(self, study: optuna.Study, trial: optuna.Trial, applied: dict[str, Any], result: TrialResult) -> float | None:
        """Record a result on the trial (:mod:`autotune.store.record`) and tell Optuna; returns the
        objective value (if any)."""
        values = self.objective.values(result.metrics) if result.outcome == "ok" else None
        if result.outcome == "ok" and values is None:
            # Measured, but the metric is missing: the objective is misconfigured for this engine.
            result.outcome = "infeasible"
            result.failure = Failure("metric-missing", self.objective.missing(result.metrics), "")
        outcome = Outcome(result.outcome)
        record.write_result(trial, outcome, result.failure, {
            "metrics": {k: round(v, 4) for k, v in result.metrics.items()},
            "applied": applied,
            "env": result.env,
            "argv": result.argv,
            "argv_template": result.argv_template,
            "port": result.port,
            "host": result.host,
            "startup_s": None if result.startup_s is None else round(result.startup_s, 3),
            "duration_s": round(result.duration_s, 3),
            "server_info": _compact_info(result.server_info),
            "secret_env": list(result.secret_env),
            "secret_args": {str(i): n for i, n in sorted(result.secret_args.items())},
            "early_stop": result.early_stop.to_json() if result.early_stop is not None else None,
            SIGNALS_ATTR: result.signals.to_attr() if result.signals is not None else None,
        })
        if result.left_running and result.server_tag:
            self._left.append({"host": result.host, "tag": result.server_tag, "trial": trial.number})
            study.set_user_attr(SERVERS_LEFT, list(self._left))
        if Path(result.log_path).is_file():
            try:
                artifact_id = upload_artifact(artifact_store=self.store, file_path=result.log_path, study_or_trial=trial)
                trial.set_user_attr("log_artifact", artifact_id)
            except OSError:
                pass
        if outcome is Outcome.FAULT:
            record.tell(study, trial, outcome)
            return None
        failed = outcome is Outcome.INFEASIBLE and (result.failure is None or result.failure.kind != "slo-violated")
        bounds: dict[str, float] = {FAILURE_CONSTRAINT: 1.0 if failed else -1.0}
        for c in self.objective.constraints:
            v = result.violations.get(str(c), 0.0)
            scale = abs(c.bound) or 1.0
            bounds[f"slo:{c}"] = max(-1e6, min(1e6, v / scale)) if v != float("inf") else 1e6
        record.set_constraints(trial, bounds)  # optuna-dashboard reads them in their old form
        record.tell(study, trial, outcome, values=values, intermediate=result.intermediate, fill=self._fill(study))
        return values[0] if outcome is Outcome.OK and values is not None else None

    def _fill(self, study: optuna.Study) -> list[float]:
        """What an unmeasured trial is told (:func:`autotune.store.record.placeholder`)."""
        return record.placeholder(study, [(g.metric, g.direction) for g in self.objective.goals])


def _compact_info(info: dict[str, Any] | None, limit: int = 4000) -> dict[str, Any] | None:
    """Server info small enough for a user attr: scalars only, at most ``limit`` characters, and
    every ``version`` whatever the limit (SGLang puts it after its 500-odd server args; the
    profile's provenance needs it)."""
    if not info:
        return None
    out: dict[str, Any] = {}
    size = 0
    for path, body in info.items():
        if not isinstance(body, dict):
            continue
        for k, v in body.items():
            if isinstance(v, (int, float, str, bool)) or v is None:
                text = f"{k}{v}"
                if size + len(text) > limit and k != "version":
                    continue
                out[f"{path.strip('/')}.{k}"] = v
                size += len(text)
    return out

