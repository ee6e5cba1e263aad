"""A trial as plain data: what to launch (:class:`TrialSpec`) and what it produced (:class:`TrialResult`).

The runner (:mod:`autotune.execution.runner`) takes a spec and returns a result; executors carry
them between processes and the driver records them. Neither holds an Optuna object or a secret.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal

from autotune.execution.early_stop import EarlyStop
from autotune.outcome.failures import Failure
from autotune.outcome.load_signals import LoadSignals

__all__ = ["Outcome", "PhaseCallback", "TrialResult", "TrialSpec"]

Outcome = Literal["ok", "stopped", "infeasible", "fault"]
"""ok: measured; stopped: measured until it could not beat the best trials so far (early stopping);
infeasible: the configuration failed; fault: the infrastructure failed."""
PhaseCallback = Callable[[str, str], None]
"""Called as ``on_phase(phase, detail)`` with phase waiting-for-gpus | launching | launched | warming |
measuring | teardown (waiting-for-gpus: processes autotune did not start hold the trial's GPUs; the
detail names them); for ``launched`` the detail is JSON ``{"pgid", "tag", "argv", "port", "host", "niceness"}`` so the
driver can record the server before anything else happens (and kill it on resume if the driver
died); ``niceness`` is the server's CPU niceness where the host can tell, else null."""


@dataclass(frozen=True)
class TrialSpec:
    """What to launch for one trial: the flags and env of the search space on top of the target.

    ``ready_timeout_s``, when set, replaces the runner's ready timeout for this trial (the driver
    shortens it from the start-ups it has seen); ``ready_timeout_reason`` says how it was chosen.
    ``beat_value``: the value of the objective's metric the trial must be able to beat, else its
    load is stopped early (the driver's :func:`~autotune.execution.early_stop.value_to_beat`; None: never
    stopped); ``beat_reason`` says which value it is.
    """

    number: int
    env: dict[str, str]
    args: list[str]
    ready_timeout_s: float | None = None
    ready_timeout_reason: str = ""
    beat_value: float | None = None
    beat_reason: str = ""


@dataclass
class TrialResult:
    """Everything a trial produced, as plain data (no Optuna objects)."""

    number: int
    outcome: Outcome
    metrics: dict[str, float] = field(default_factory=dict)
    failure: Failure | None = None
    argv: list[str] = field(default_factory=list)
    argv_template: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    host: str = "local"
    port: int = 0
    log_path: str = ""
    startup_s: float | None = None
    duration_s: float = 0.0
    server_info: dict[str, Any] | None = None
    violations: dict[str, float] = field(default_factory=dict)
    secret_env: list[str] = field(default_factory=list)
    secret_args: dict[int, str] = field(default_factory=dict)
    """Which env keys and argv positions hold a ``${NAME}`` reference instead of a secret value
    (a result never carries a secret: see :mod:`autotune.config.secrets`)."""
    server_tag: str = ""
    left_running: bool = False
    """Teardown could not reach the host: the server tagged ``server_tag`` may still run there."""
    early_stop: EarlyStop | None = None
    """Why the load stopped early (``outcome="stopped"``)."""
    intermediate: dict[int, float] = field(default_factory=dict)
    """Projected values of the objective's metric by percent of the load done
    (:class:`~autotune.execution.early_stop.StopRule`), for ``trial.report``."""
    signals: LoadSignals | None = None
    """What the engine's scheduler log showed of the load (:mod:`autotune.outcome.load_signals`); None
    where it logged no scheduler line."""
