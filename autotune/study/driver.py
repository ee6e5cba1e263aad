"""The ask/tell loop of a study: baseline first, budget, resume, faults.

:class:`Driver` runs a study to its budget. Each trial is asked (:func:`autotune.study.skips.ask`),
its parameters turned into a launch by the search space, run by the executor (which returns a
plain ``TrialResult``), recorded and told through :mod:`autotune.store.record`: ``ok`` and
``infeasible`` COMPLETE (an infeasible one with constraint ``failure`` > 0), ``stopped`` PRUNED,
``fault`` FAIL and its parameters enqueued again (up to ``max_fault_retries`` times; a slot is
quarantined after repeated faults, and the study stops with :class:`HostBrokenError` when none is
left). A failure no configuration can avoid (the engine or the model missing) stops the study
with a :class:`~autotune.errors.UsageError`.

One study, one owner: the driver takes the study's lease (:mod:`autotune.study.lease`) before it
writes anything, checks it is the same study (:mod:`autotune.study.identity`) and recovers what a
dead driver left (:mod:`autotune.study.leftovers`). A signal or `study stop` stops the study after
the running trials are torn down (:mod:`autotune.execution.stopping`); they are recorded as
``fault``/``interrupted`` and enqueued again. The sampler is the caller's (a
:data:`~autotune.search.factory.SamplerFactory`; by default the config's ``sampler``), seeded from
the seed and the number of trials so far (:func:`~autotune.search.factory.derived_seed`).
"""

from __future__ import annotations

import functools
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import optuna
from optuna.artifacts import FileSystemArtifactStore, upload_artifact

from autotune.config.objective import Objective
from autotune.config.space import SearchSpace
from autotune.config.study import StudyConfig
from autotune.errors import UsageError
from autotune.execution.early_stop import applies as early_stop_applies, value_to_beat
from autotune.execution.executors import Executor
from autotune.execution.hosts import Host
from autotune.execution.trial import TrialResult, TrialSpec
from autotune.execution.slots import Slot, SlotPool
from autotune.execution.stopping import StopRequest, handle_signals
from autotune.outcome.failures import Failure
from autotune.search.factory import SamplerFactory, derived_seed, for_space
from autotune.search.implied import Implication
from autotune.store import record
from autotune.store.record import FAILURE_CONSTRAINT, Outcome, carried
from autotune.store.storage import artifact_dir, check_artifacts_writable, check_storage, low_disk, open_storage
from autotune.store.study_view import best_moved, best_view, measured_configs, pooled_noise, trial_views
from autotune.store.trial_result import result_attrs
from autotune.study import confirmation, identity, skips, texts, warm_start
from autotune.study.leftovers import Leftovers
from autotune.study.lease import StudyLease
from autotune.study.notes import write_notes, write_trial_note
from autotune.study.reporting import QuietReporter, Reporter
from autotune.util.text import counted

WAIT_S = 1.0
"""How long the driver waits for a trial to finish before it looks at the study again."""
SLOTS_ATTR = "slots"
"""Study user attr: each slot with its health (``SlotPool.report``), for `study status`."""
STOP_ATTR = "stop_requested"
"""Study user attr ``{"by", "owner", "at"}`` written by `autotune study stop`: the driver whose
lease owner id is ``owner`` stops as on a signal (running trials torn down and recorded as
interrupted); any other driver (a later one) ignores it."""


class HostBrokenError(RuntimeError):
    """No healthy slot is left (each quarantined after faults), or no disk space: the study stops
    rather than burn its budget."""


@dataclass
class _InFlight:
    """A trial submitted to the executor and not yet told."""

    trial: optuna.Trial
    slot: Slot
    applied: dict[str, Any]


@dataclass
class StudyRun:
    """What one invocation of the driver did."""

    study: optuna.Study
    trials_run: int = 0
    reason: str = ""
    results: list[TrialResult] = field(default_factory=list)


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


def _exists(storage: optuna.storages.BaseStorage, name: str) -> bool:
    """Whether ``storage`` holds a study ``name``."""
    try:
        storage.get_study_id_from_name(name)
    except KeyError:
        return False
    return True


class Driver:
    """Runs a study to its budget.

    Contract: the baseline (if any) is enqueued first and only once per study; the budget counts
    finished trials across invocations (``trials``) and the summed duration of trials
    (``hours``); nothing recorded is ever deleted.

    Args:
        config: The study's config.
        space: Its search space.
        objective: Its objective.
        executor: Runs the trials on the config's slots.
        reporter: Shown the study's progress (None: nothing shown).
        trials: The trial budget (None: the config's).
        stop: Set to stop the study (None: a new one; signals set it while :meth:`run` runs).
        hosts: Host objects by name (those the executor uses); others are made when a stale
            trial recorded one (with the config's SSH options).
        sampler: Makes the study's sampler from the derived seed (None: the config's
            ``sampler``, :func:`autotune.search.factory.for_space`).
        skip_implied: Whether proposals an earlier failure implies are skipped
            (:mod:`autotune.study.skips`).
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
        self.sampler_factory = sampler
        self.hosts: dict[str, Host] = dict(hosts or {})
        self.leftovers = Leftovers(config.target, self.hosts)
        self.space = space
        self.objective = objective
        self.executor = executor
        self.reporter: Reporter = reporter or QuietReporter()
        self.budget_trials = trials if trials is not None else config.budget.trials
        self.artifacts = artifact_dir(config.storage)
        self.store = FileSystemArtifactStore(str(self.artifacts))
        self.stop = stop or StopRequest()
        self.lease: StudyLease | None = None
        self.pool = SlotPool(executor.slots(), quarantine_after=config.quarantine_after)
        self._niced: set[tuple[str, int]] = set()
        """(host, niceness) pairs already told to the reporter."""
        self.warm = warm_start.WarmStart()
        """What the study started from (:mod:`autotune.study.warm_start`), once :meth:`open_study` ran."""

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
        check_artifacts_writable(self.artifacts)
        storage = open_storage(self.config.storage)
        self.lease = StudyLease(storage, self.config.name)
        self.lease.acquire()
        directions: dict[str, Any] = ({"directions": self.objective.directions} if self.objective.multi
                                      else {"direction": self.objective.direction})
        baseline = self.space.complete(self.config.baseline)
        facts, planned = None, None
        if self.config.warm_start and not _exists(storage, self.config.name):  # refused before anything is written
            facts = identity.hosts_facts(self.config, self.hosts)
            planned = warm_start.prepare_new(self.config, self.space, baseline, facts)
        study = optuna.create_study(storage=storage, study_name=self.config.name, load_if_exists=True, **directions)
        identity.check_same(study, self.config.name, self.space, self.objective)
        identity.write_identity(study, self.config, self.space, self.objective)
        identity.record_host_facts(study, self.config, self.hosts, facts)
        fresh = warm_start.ATTR not in study.user_attrs
        self.warm = warm_start.prepare(study, self.config, self.space, baseline, planned)
        factory = self.sampler_factory or for_space(self.config.sampler, self.space, slots=self.executor.capacity(),
                                                    prior=self.warm.prior)
        study.sampler = factory(derived_seed(self.config.seed, len(study.trials)))
        self.leftovers.recover(study, self.lease.me.id)
        if self.config.baseline or not study.trials:
            study.enqueue_trial(baseline, user_attrs={"baseline": True}, skip_if_exists=True)
        if fresh:  # said once, when it is planned
            for line in self.warm.lines:
                self.reporter.note(line)
        return study

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
                self.leftovers.retry(study)
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
        trial, params, launch = skips.ask(study, self.space, skip_implied=self.skip_implied,
                                          skip=functools.partial(self._skip, study))
        assert self.lease is not None
        trial.set_user_attr("owner", self.lease.me.id)
        slot = self.pool.choose(avoid=trial.user_attrs.get("avoid_slot"))
        assert slot is not None, "_submit is called only with a free slot"
        self.pool.take(slot)
        trial.set_user_attr("slot", slot.name)
        if slot.gpus is not None:
            trial.set_user_attr("gpus", list(slot.gpus))
        is_baseline = bool(trial.user_attrs.get("baseline"))
        self.reporter.trial_started(trial.number, launch.applied, is_baseline, slot.name, why=texts.why_text(study, trial))
        target = self.config.target
        timeout, why = startup_timeout(
            [float(t.user_attrs["startup_s"]) for t in study.get_trials(deepcopy=False)
             if t.user_attrs.get("startup_s") is not None],
            cap_s=target.ready_timeout_s, factor=target.startup_timeout_factor, floor_s=target.startup_timeout_floor_s)
        beat, beat_why = None, ""
        if (early_stop_applies(self.objective) and not is_baseline and not trial.user_attrs.get("ablation")
                and "confirms" not in trial.user_attrs):
            # (the reference runs and the confirmation runs are measured to the end)
            views = trial_views(study)
            noise = pooled_noise(measured_configs(views))  # run-to-run, where the study measured it
            beat, beat_why = value_to_beat([v.value for v in views if v.value is not None], self.budget_trials,
                                           maximize=self.objective.direction == "maximize",
                                           noise_sd=noise.sd if noise is not None else None)
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

    def _note_niceness(self, number: int, niceness: Any, host: str) -> None:
        """Say once per host and niceness when a server runs above niceness 0: on a busy host it
        gets less CPU than it will serve with, and measures that."""
        if not isinstance(niceness, int) or niceness <= 0 or (host, niceness) in self._niced:
            return
        self._niced.add((host, niceness))
        self.reporter.note(texts.niceness_note(number, niceness, host))

    def _skip(self, study: optuna.Study, trial: optuna.Trial, applied: dict[str, Any], why: Implication) -> None:
        """Record a proposal an earlier failure implies, without launching it (:func:`skips.record_skip`)."""
        assert self.lease is not None
        message = skips.record_skip(study, trial, applied, why, owner=self.lease.me.id,
                                    constraints=self.objective.constraints, fill=lambda: self._fill(study))
        self.reporter.trial_skipped(trial.number, applied, message)

    def _enqueue_confirmation(self, study: optuna.Study, pending: list[dict[str, Any]]) -> None:
        """Queue a measurement of a best configuration again when the budget's end has come
        (:func:`autotune.study.confirmation.enqueue`); never in a multi-objective study (its front
        is reported as measured)."""
        if self.objective.multi:
            return
        confirm = self.config.budget.confirm
        confirmation.enqueue(study, budget_trials=self.budget_trials, candidates=confirm.candidates,
                             measurements=confirm.measurements, maximize=self.objective.direction == "maximize",
                             pending=pending)

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
            raise UsageError(texts.fatal_text(trial.number, result.failure))
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
        return texts.quarantine_text(slot.name, quarantined, only_slot=len(self.pool.slots) == 1)

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
            return texts.interrupted_text(self.stop.reason, self.config.name)
        if self.lease is not None and self.lease.lost:
            return "stopped: another driver took over this study's lease"
        full = low_disk(self.config.storage)
        if full:
            raise HostBrokenError(full)
        return ""

    def _budget_spent(self, study: optuna.Study) -> str:
        done = finished_trials(study)
        if self.budget_trials is not None and len(done) >= self.budget_trials:
            return f"budget reached: {counted(len(done), 'trial')}"
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
        record.write_result(trial, outcome, result.failure, result_attrs(result, applied))
        if result.left_running and result.server_tag:
            self.leftovers.add(study, result.host, result.server_tag, trial.number)
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

