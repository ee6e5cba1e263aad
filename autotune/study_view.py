"""Read-only views of a stored study: trial rows for show/best/export, in the JSON shapes of
DESIGN.md. Nothing here writes to the storage."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.errors import StudyNotFoundError
from autotune.secrets import secret_args_from_attr
from autotune.storage import has_studies, open_storage


@dataclass
class TrialView:
    """One trial as a user sees it."""

    number: int
    state: str
    outcome: str
    params: dict[str, Any]
    value: float | None
    metrics: dict[str, float]
    failure: dict[str, Any] | None
    duration_s: float | None
    baseline: bool = False
    env: dict[str, str] = field(default_factory=dict)
    argv: list[str] = field(default_factory=list)
    argv_template: list[str] = field(default_factory=list)
    port: int | None = None
    startup_s: float | None = None
    secret_env: list[str] = field(default_factory=list)
    """Env keys whose stored value is a secret's reference ``${KEY}`` (see :mod:`autotune.secrets`)."""
    secret_args: dict[int, str] = field(default_factory=dict)
    """``argv``/``argv_template`` index -> name of the secret referred to there."""
    slot: str | None = None
    """The slot the trial ran on (see :mod:`autotune.slots`); None for trials of older versions."""
    early_stop: dict[str, Any] | None = None
    """Why a ``stopped`` trial's load was stopped (:meth:`autotune.early_stop.EarlyStop.to_json`)."""

    @property
    def failure_kind(self) -> str | None:
        return None if self.failure is None else self.failure.get("kind")

    def to_json(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "state": self.state,
            "params": self.params,
            "value": self.value,
            "metrics": self.metrics,
            "outcome": self.outcome,
            "failure": self.failure,
            "duration_s": self.duration_s,
            "baseline": self.baseline,
            "startup_s": self.startup_s,
            "slot": self.slot,
            "early_stop": self.early_stop,
        }


def load_study(name: str, storage: str) -> optuna.Study:
    """Load a study by name.

    Nothing is created: a SQLite file that does not exist holds no study.

    Raises:
        StudyNotFoundError: no study of that name in the storage (the message lists the ones
            that exist).
        UsageError: the storage URL or file is invalid (see :mod:`autotune.storage`).
    """
    if not has_studies(storage):  # a missing SQLite file is not created just to look in it
        raise StudyNotFoundError(f"no study named '{name}' in {storage} (studies: none)")
    rdb = open_storage(storage)
    names = [s.study_name for s in optuna.get_all_study_summaries(storage=rdb, include_best_trial=False)]
    if name not in names:
        known = ", ".join(names) if names else "none"
        raise StudyNotFoundError(f"no study named '{name}' in {storage} (studies: {known})")
    return optuna.load_study(study_name=name, storage=rdb)


def view(t: FrozenTrial) -> TrialView:
    """The user's view of one stored trial."""
    ua = t.user_attrs
    outcome = ua.get("outcome") or {TrialState.RUNNING: "running", TrialState.WAITING: "waiting"}.get(t.state, t.state.name.lower())
    feasible = bool(ua.get("feasible"))
    kind = ua.get("failure_kind")
    failure = None
    if kind:
        failure = {"kind": kind, "message": ua.get("failure_message"), "excerpt": ua.get("failure_excerpt") or ""}
        if ua.get("failure_cause"):
            failure["cause"] = ua["failure_cause"]
    value = t.value if (t.state == TrialState.COMPLETE and feasible) else None
    return TrialView(
        number=t.number,
        state=t.state.name,
        outcome=outcome,
        params=dict(ua.get("applied") or t.params),
        value=value,
        metrics=dict(ua.get("metrics") or {}),
        failure=failure,
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
        early_stop=ua.get("early_stop") or None,
    )


def trial_views(study: optuna.Study) -> list[TrialView]:
    return [view(t) for t in study.get_trials(deepcopy=False)]


def best_view(study: optuna.Study) -> TrialView | None:
    """The best feasible trial (measured to the end: never a ``stopped`` one), or None."""
    rows = [v for v in trial_views(study) if v.value is not None]
    if not rows:
        return None
    maximize = study.direction == optuna.study.StudyDirection.MAXIMIZE
    return (max if maximize else min)(rows, key=lambda v: v.value)  # type: ignore[arg-type, return-value]


def show_json(study: optuna.Study) -> dict[str, Any]:
    """``study show --json``."""
    return {
        "study": study.study_name,
        "direction": study.direction.name.lower(),
        "metric": (study.user_attrs.get("objective") or {}).get("metric"),
        "trials": [v.to_json() for v in trial_views(study)],
    }


def best_json(v: TrialView) -> dict[str, Any]:
    """``study best --json``."""
    return {"number": v.number, "params": v.params, "value": v.value, "metrics": v.metrics,
            "env": v.env, "argv": v.argv}
