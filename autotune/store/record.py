"""One record of every trial: what happened, why, and who is to blame.

A trial is written by :func:`write_result` (or :func:`write_skipped`, :func:`write_stale`), told to
Optuna by :func:`tell`, and read back as one typed :class:`TrialRecord` by :func:`read`. Every
surface (console, ``study show``/``list``/``status``/``best``/``explain``, the report, the profile,
the dashboard's notes) and the sampler read trials through it: one definition of an outcome, of
finished (:attr:`Outcome.finished`), of measured (:attr:`Outcome.measured`) and of the objective's
metric (:func:`objective_metric`).

Only failures blamed on the configuration teach the sampler: an ``infeasible`` or ``skipped``
trial is told COMPLETE with its constraint ``failure`` > 0 (every sampler ranks it below the
feasible trials; its value is the study's worst measured one, so plots keep their scale), a
``stopped`` one PRUNED, a ``fault`` FAIL. This module is the only one that touches Optuna's private
storage API (:func:`system_attrs` and the writers below); the names it relies on are checked by
``tests/store/test_record.py``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.util.text import counted
from autotune.outcome.failures import Blame, Failure, FailureKind, Phase, _Word, failure_kind
from autotune.outcome.load_signals import ATTR as SIGNALS_ATTR

__all__ = ["Blame", "FailureKind", "Outcome", "Phase", "TrialRecord", "counts", "counts_text", "finished",
           "objective_metric", "read", "read_all", "tell", "write_result", "write_skipped", "write_stale"]

FAILURE_CONSTRAINT = "failure"
"""The constraint every trial carries: 1.0 when its configuration failed, -1.0 when it did not."""
PROPOSED_ATTR = "autotune:proposed"
"""Trial system attr: why the default sampler proposed the trial's configuration (see
:func:`autotune.store.study_view.proposal_text`)."""
DASHBOARD_CONSTRAINTS = "constraints"
"""Trial system attr of the constraints' values, a list: Optuna's former form, which Optuna 5's
samplers read (as keys ``"0"``, ``"1"``, ...) and the only one optuna-dashboard reads."""
CONSTRAINT_PREFIX = "constraint_"
"""Trial user attrs ``constraint_<key>``: the trial's constraints by name."""
CARRIED_ATTRS = ("baseline", "ablation", "confirms")
"""User attrs a trial run again (after a fault or an interruption) keeps: what it was for."""


class Outcome(_Word):
    """What became of a trial."""

    OK = "ok"
    STOPPED = "stopped"
    """Measured until its load could not beat the best trials so far (early stopping)."""
    INFEASIBLE = "infeasible"
    """The configuration failed."""
    FAULT = "fault"
    """The environment or the tuner failed; run again, teaches nothing."""
    SKIPPED = "skipped"
    """Not launched: an earlier failure implies it fails the same way."""
    RUNNING = "running"
    WAITING = "waiting"

    @property
    def finished(self) -> bool:
        """Counts against the budget: it ran, and its configuration is judged."""
        return self in (Outcome.OK, Outcome.STOPPED, Outcome.INFEASIBLE)

    @property
    def measured(self) -> bool:
        """Its configuration ran under load to a figure or a bound."""
        return self in (Outcome.OK, Outcome.STOPPED)


@dataclass
class TrialRecord:
    """One trial as every surface tells it."""

    number: int
    state: str
    """Optuna's state, by name (``COMPLETE``, ``PRUNED``, ``FAIL``, ``RUNNING``, ``WAITING``)."""
    outcome: Outcome
    params: dict[str, Any]
    """The parameters as applied (a categorical's ``unset`` left out where the space says so)."""
    value: float | None
    """The objective's value of a measured (``ok``) trial; None otherwise."""
    metrics: dict[str, float]
    failure: Failure | None
    duration_s: float | None
    baseline: bool = False
    env: dict[str, str] = field(default_factory=dict)
    argv: list[str] = field(default_factory=list)
    argv_template: list[str] = field(default_factory=list)
    port: int | None = None
    startup_s: float | None = None
    secret_env: list[str] = field(default_factory=list)
    """Env keys whose stored value is a secret's reference ``${KEY}`` (see :mod:`autotune.config.secrets`)."""
    secret_args: dict[int, str] = field(default_factory=dict)
    """``argv``/``argv_template`` index -> name of the secret referred to there."""
    slot: str | None = None
    host: str | None = None
    values: list[float] | None = None
    """Every objective's value of a measured trial (``[value]`` in a single-objective study)."""
    measured: Any = None
    """Set on the record :func:`autotune.store.study_view.best_view` returns: every measurement of its
    configuration (:class:`autotune.store.study_view.Measured`)."""
    early_stop: dict[str, Any] | None = None
    load_signals: dict[str, int] | None = None
    proposed: dict[str, Any] | None = None
    confirms: int | None = None
    """The trial whose configuration this one measures again."""
    retry_of: int | None = None
    implied_by: int | None = None
    ablation: dict[str, Any] | None = None
    log_artifact: str | None = None
    constraints: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.outcome = Outcome(str(self.outcome))
        if isinstance(self.failure, Mapping):  # as :meth:`failure_json` writes it
            f = self.failure
            self.failure = Failure(str(f["kind"]), str(f.get("message") or ""), str(f.get("excerpt") or ""),
                                   cause=f.get("cause") or None, phase=f.get("phase") or None)

    @property
    def failure_kind(self) -> FailureKind | None:
        return None if self.failure is None else self.failure.kind

    @property
    def blame(self) -> Blame | None:
        """Who the trial's failure is blamed on; None where nothing failed."""
        return None if self.failure is None else self.failure.blame

    @property
    def finished(self) -> bool:
        return self.outcome.finished

    def failure_json(self) -> dict[str, Any] | None:
        f = self.failure
        if f is None:
            return None
        out: dict[str, Any] = {"kind": str(f.kind), "message": f.message, "excerpt": f.excerpt or "",
                               "blame": str(f.blame), "phase": None if f.phase is None else str(f.phase)}
        if f.cause:
            out["cause"] = f.cause
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "state": self.state,
            "params": self.params,
            "value": self.value,
            "metrics": self.metrics,
            "outcome": str(self.outcome),
            "failure": self.failure_json(),
            "duration_s": self.duration_s,
            "baseline": self.baseline,
            "startup_s": self.startup_s,
            "slot": self.slot,
            "early_stop": self.early_stop,
            "load_signals": self.load_signals,
            "proposed": self.proposed,
            "confirms": self.confirms,
            "retry_of": self.retry_of,
            "implied_by": self.implied_by,
            "host": self.host,
        }


# -- reading -----------------------------------------------------------------------------------
def outcome_of(t: FrozenTrial) -> Outcome:
    """A stored trial's :class:`Outcome`."""
    stored = t.user_attrs.get("outcome")
    if stored:
        return Outcome(str(stored))
    return {TrialState.RUNNING: Outcome.RUNNING, TrialState.WAITING: Outcome.WAITING,
            TrialState.COMPLETE: Outcome.OK, TrialState.PRUNED: Outcome.STOPPED}.get(t.state, Outcome.FAULT)


def failure_from_attrs(ua: Mapping[str, Any]) -> Failure | None:
    """The failure a trial's user attrs (``failure_kind``, ``_message``, ``_excerpt``, ``_cause``,
    ``_phase``) record; None when they record none."""
    kind = ua.get("failure_kind")
    if not kind:
        return None
    phase = ua.get("failure_phase")
    message = str(ua.get("failure_message") or "")
    try:
        known = failure_kind(str(kind))
    except ValueError:  # written by another version: keep its word in the message
        known = FailureKind.CRASH
        message = f"{kind}: {message}"
    try:
        stage = Phase(phase) if phase else None
    except ValueError:
        stage = None
    return Failure(known, message, str(ua.get("failure_excerpt") or ""),
                   cause=ua.get("failure_cause") or None, phase=stage)


def constraints(t: FrozenTrial) -> dict[str, float]:
    """The trial's constraints by name (``failure``, ``slo:<bound>``)."""
    named = {k.removeprefix(CONSTRAINT_PREFIX): float(v) for k, v in t.user_attrs.items()
             if k.startswith(CONSTRAINT_PREFIX) and isinstance(v, (int, float))}
    if named:
        return named
    try:  # recorded with Optuna's named constraints
        return {k: v for k, v in t.constraints.items() if not k.isdigit()}
    except (AttributeError, TypeError, ValueError):
        return {}


def read(t: FrozenTrial) -> TrialRecord:
    """The record of one stored trial."""
    from autotune.config.secrets import secret_args_from_attr

    ua = t.user_attrs
    outcome = outcome_of(t)
    values = list(t.values) if (outcome is Outcome.OK and t.state == TrialState.COMPLETE and t.values) else None
    ablation = ua.get("ablation")
    return TrialRecord(
        number=t.number,
        state=t.state.name,
        outcome=outcome,
        params=dict(ua.get("applied") or t.params),
        value=values[0] if values else None,
        metrics=dict(ua.get("metrics") or {}),
        failure=failure_from_attrs(ua),
        duration_s=ua.get("duration_s"),
        baseline=bool(ua.get("baseline")),
        env=dict(ua.get("env") or {}),
        argv=list(ua.get("argv") or []),
        argv_template=list(ua.get("argv_template") or []),
        port=ua.get("port"),
        startup_s=ua.get("startup_s"),
        secret_env=[str(k) for k in ua.get("secret_env") or []],
        secret_args=secret_args_from_attr(ua.get("secret_args")),
        slot=ua.get("slot"),
        host=ua.get("host"),
        values=values,
        early_stop=ua.get("early_stop") or None,
        load_signals=ua.get(SIGNALS_ATTR) or None,
        proposed=t.system_attrs.get(PROPOSED_ATTR) or None,
        confirms=ua.get("confirms"),
        retry_of=ua.get("retry_of"),
        implied_by=ua.get("implied_by"),
        ablation=ablation if isinstance(ablation, dict) else None,
        log_artifact=ua.get("log_artifact"),
        constraints=constraints(t),
    )


def read_all(study: optuna.Study) -> list[TrialRecord]:
    """The records of every trial of ``study``, in number order."""
    return [read(t) for t in study.get_trials(deepcopy=False)]


def finished(study: optuna.Study) -> list[FrozenTrial]:
    """The trials that count against the budget (:attr:`Outcome.finished`)."""
    return [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
            if outcome_of(t).finished]


def is_measured(t: FrozenTrial) -> bool:
    """Whether a stored trial's configuration ran under load (:attr:`Outcome.measured`), or was
    measured and broke an SLO (something for a sampler to model)."""
    if t.state not in (TrialState.COMPLETE, TrialState.PRUNED):
        return False
    return outcome_of(t).measured or t.user_attrs.get("failure_kind") == "slo-violated"


def failed_kind(t: FrozenTrial) -> str | None:
    """The failure kind of a stored trial whose configuration failed before it was measured
    (None for one that ran, and for a fault)."""
    if is_measured(t) or outcome_of(t) not in (Outcome.INFEASIBLE, Outcome.SKIPPED):
        return None
    return t.user_attrs.get("failure_kind")


def is_feasible_measurement(t: FrozenTrial) -> bool:
    """An ``ok`` trial with a value: a measurement of its configuration's figure."""
    return t.state == TrialState.COMPLETE and bool(t.values) and outcome_of(t) is Outcome.OK


def counts(records: Iterable[TrialRecord]) -> Counter[Outcome]:
    return Counter(r.outcome for r in records)


def counts_text(records: Sequence[TrialRecord]) -> str:
    """``20 trials: 13 ok, 5 stopped, 2 infeasible (nccl-error 2), 1 fault (gpu-busy 1)``: the
    counts every surface says, each failed outcome with its kinds."""
    by = counts(records)
    parts = []
    for o in Outcome:
        if not by[o]:
            continue
        kinds = Counter(str(r.failure_kind) for r in records if r.outcome is o and r.failure_kind)
        shown = f" ({', '.join(f'{k} {n}' for k, n in kinds.most_common())})" if kinds and o in _KINDS_SHOWN else ""
        parts.append(f"{by[o]} {o}{shown}")
    return f"{counted(len(records), 'trial')}: {', '.join(parts)}" if parts else counted(len(records), "trial")


_KINDS_SHOWN = (Outcome.INFEASIBLE, Outcome.FAULT)


def objective_metric(study: optuna.Study) -> str | None:
    """The metric the study's (first) objective reads, as the driver stored it."""
    stored = study.user_attrs.get("objective") or {}
    metric = stored.get("metric")
    return str(metric) if metric else None


# -- Optuna's private storage API -------------------------------------------------------------
def system_attrs(study: optuna.Study, trial: int | FrozenTrial | optuna.Trial) -> dict[str, Any]:
    """A trial's system attrs (by number, stored or live trial)."""
    return dict(study._storage.get_trial_system_attrs(_trial_id(study, trial)))  # noqa: SLF001


def set_system_attr(study: optuna.Study, trial: int | FrozenTrial | optuna.Trial, key: str, value: Any) -> None:
    study._storage.set_trial_system_attr(_trial_id(study, trial), key, value)  # noqa: SLF001


def cached_trials(study: optuna.Study, states: tuple[TrialState, ...] | None = None) -> list[FrozenTrial]:
    """The study's trials from the storage's cache (what a sampler reads while it samples)."""
    return study._get_trials(deepcopy=False, states=states, use_cache=True)  # noqa: SLF001


def study_system_attrs(study: optuna.Study) -> dict[str, Any]:
    return dict(study._storage.get_study_system_attrs(study._study_id))  # noqa: SLF001


def set_study_system_attr(study: optuna.Study, key: str, value: Any) -> None:
    study._storage.set_study_system_attr(study._study_id, key, value)  # noqa: SLF001


def storage(study: optuna.Study) -> optuna.storages.BaseStorage:
    return study._storage  # noqa: SLF001


def study_id(study: optuna.Study) -> int:
    return study._study_id  # noqa: SLF001


def trial_id(trial: FrozenTrial | optuna.Trial) -> int:
    return trial._trial_id  # noqa: SLF001


def frozen(study: optuna.Study, trial: int | FrozenTrial | optuna.Trial) -> FrozenTrial:
    """The stored trial (by number, or from a live trial)."""
    if isinstance(trial, FrozenTrial):
        return trial
    return study._storage.get_trial(_trial_id(study, trial))  # noqa: SLF001


def _trial_id(study: optuna.Study, trial: int | FrozenTrial | optuna.Trial) -> int:
    if isinstance(trial, (FrozenTrial, optuna.Trial)):
        return trial._trial_id  # noqa: SLF001
    return study._storage.get_trial_id_from_study_id_trial_number(study._study_id, int(trial))  # noqa: SLF001


class _TrialsWithout:
    """A read view of a study whose trial lists leave out the trials ``drop`` accepts (everything
    else is the study's own); Optuna's samplers read trials through ``Study._get_trials``."""

    def __init__(self, study: optuna.Study, drop: Callable[[FrozenTrial], bool]) -> None:
        self._study = study
        self._drop = drop

    def __getattr__(self, name: str) -> Any:
        return getattr(self._study, name)

    def _get_trials(self, deepcopy: bool = True, states: Any = None, use_cache: bool = False) -> list[FrozenTrial]:
        trials = self._study._get_trials(deepcopy=deepcopy, states=states, use_cache=use_cache)  # noqa: SLF001
        return [t for t in trials if not self._drop(t)]

    def get_trials(self, deepcopy: bool = True, states: Any = None) -> list[FrozenTrial]:
        return [t for t in self._study.get_trials(deepcopy=deepcopy, states=states) if not self._drop(t)]

    @property
    def trials(self) -> list[FrozenTrial]:
        return self.get_trials()


def trials_without(study: optuna.Study, drop: Callable[[FrozenTrial], bool]) -> optuna.Study:
    """``study`` as a sampler reads it, less the trials ``drop`` accepts (a read view, for a
    sampler's ``sample_*`` calls only)."""
    return _TrialsWithout(study, drop)  # type: ignore[return-value]


@dataclass
class _NoteTarget:
    """What ``optuna_dashboard.save_note``/``get_note`` read of a trial (a stored trial has no
    live ``optuna.Trial``; building one would run the sampler)."""

    storage: optuna.storages.BaseStorage
    study: optuna.Study
    _trial_id: int


def dashboard_note(system_attrs: Mapping[str, Any], trial: FrozenTrial | None) -> str:
    """The body of the dashboard's note of ``trial`` (None: the study's) in ``system_attrs`` (the
    study's, already read).

    Raises:
        ImportError, KeyError, TypeError, ValueError: optuna-dashboard keeps notes otherwise.
    """
    from optuna_dashboard._note import get_note_from_system_attrs

    return str(get_note_from_system_attrs(dict(system_attrs), None if trial is None else trial_id(trial))["body"])


def read_trial_note(study: optuna.Study, t: FrozenTrial) -> str:
    """The body of the dashboard's note of the stored trial ``t``, read from the storage."""
    from optuna_dashboard import get_note

    return str(get_note(_NoteTarget(storage(study), study, trial_id(t))))  # type: ignore[arg-type]


def save_trial_note(study: optuna.Study, t: FrozenTrial, body: str) -> None:
    """Save ``body`` as the dashboard's note of the stored trial ``t``."""
    from optuna_dashboard import save_note

    save_note(_NoteTarget(storage(study), study, trial_id(t)), body)  # type: ignore[arg-type]


# -- writing -----------------------------------------------------------------------------------
def _failure_attrs(failure: Failure | None) -> dict[str, Any]:
    f = failure
    return {"failure_kind": None if f is None else str(f.kind),
            "failure_message": None if f is None else f.message,
            "failure_excerpt": None if f is None else f.excerpt,
            "failure_cause": None if f is None else f.cause,
            "failure_phase": None if f is None or f.phase is None else str(f.phase),
            "blame": None if f is None else str(f.blame)}


def write_result(trial: optuna.Trial, outcome: Outcome, failure: Failure | None, attrs: Mapping[str, Any]) -> None:
    """Record a finished trial's outcome, failure (kind, message, excerpt, cause, phase, blame) and
    the other facts ``attrs`` holds (metrics, applied parameters, env, argv, ...) on the live
    ``trial``, before it is told."""
    for key, val in {"outcome": str(outcome), "feasible": outcome is Outcome.OK, **_failure_attrs(failure),
                     **attrs}.items():
        trial.set_user_attr(key, val)


def write_skipped(trial: optuna.Trial, failure: Failure, attrs: Mapping[str, Any]) -> None:
    """Record a proposal an earlier failure implies, not launched: ``skipped``, blamed on the
    configuration."""
    write_result(trial, Outcome.SKIPPED, failure, {"metrics": {}, "duration_s": 0.0, **attrs})


def write_stale(study: optuna.Study, t: FrozenTrial, message: str) -> None:
    """Fail a RUNNING trial whose driver died: ``fault``/``interrupted`` (the tuner's), FAIL."""
    failure = Failure("interrupted", message, "")
    for key, val in {"outcome": str(Outcome.FAULT), "feasible": False, **_failure_attrs(failure)}.items():
        study._storage.set_trial_user_attr(t._trial_id, key, val)  # noqa: SLF001
    study.tell(t.number, state=TrialState.FAIL)


def carried(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """What a trial run again keeps of ``attrs`` (:data:`CARRIED_ATTRS`)."""
    return {k: attrs[k] for k in CARRIED_ATTRS if attrs.get(k)}


def placeholder(study: optuna.Study, goals: Sequence[tuple[str, str]]) -> list[float]:
    """The values an unmeasured trial is told with: per objective (metric, direction), just worse
    than the worst value measured so far (0 to maximise, 1e12 to minimise before any). A later
    trial may measure worse; feasibility, not the value, keeps it from being any surface's best."""
    measured = [t.values for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                if t.values and is_feasible_measurement(t)]
    out = []
    for i, (_, direction) in enumerate(goals):
        seen = [float(v[i]) for v in measured if i < len(v) and math.isfinite(v[i])]
        if direction == "maximize":
            worst = min(seen) if seen else 0.0
            out.append(worst - max(abs(worst), 1.0) * 1e-9)
        else:
            worst = max(seen) if seen else 1e12
            out.append(worst + max(abs(worst), 1.0) * 1e-9)
    return out


def set_constraints(trial: optuna.Trial, values: Mapping[str, float]) -> None:
    """Set the trial's constraints (``values``, named, in a fixed order: ``failure`` first) in the
    one form both Optuna's samplers and optuna-dashboard read (the system attr
    :data:`DASHBOARD_CONSTRAINTS`, a list), with their names in user attrs ``constraint_<key>``."""
    trial.storage.set_trial_system_attr(trial._trial_id, DASHBOARD_CONSTRAINTS, [float(v) for v in values.values()])  # noqa: SLF001
    for key, value in values.items():
        trial.set_user_attr(f"{CONSTRAINT_PREFIX}{key}", float(value))


def tell(study: optuna.Study, trial: optuna.Trial, outcome: Outcome, *, values: Sequence[float] | None = None,
         intermediate: Mapping[int, float] | None = None, fill: Sequence[float] | None = None) -> None:
    """Tell Optuna a recorded trial the way every sampler learns from it.

    ``ok``: COMPLETE with ``values``. ``infeasible``/``skipped``: COMPLETE with ``fill`` (its
    constraints already set > 0). ``stopped``: its projected ``intermediate`` values reported,
    PRUNED. ``fault``: FAIL.
    """
    multi = len(study.directions) > 1
    if outcome is Outcome.FAULT:
        study.tell(trial, state=TrialState.FAIL)
        return
    if outcome in (Outcome.OK, Outcome.STOPPED) and not multi:
        for step, projected in sorted((intermediate or {}).items()):
            trial.report(projected, step)
    if outcome is Outcome.STOPPED:
        study.tell(trial, state=TrialState.PRUNED)
        return
    told = values if outcome is Outcome.OK else fill
    assert told is not None, "an ok trial has values; an infeasible one a fill"
    study.tell(trial, list(told) if multi else float(told[0]))
