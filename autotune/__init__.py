"""autotune: Bayesian tuning of LLM inference server launch configurations, by experiment.

The library's public surface, by what a user does with it:

- Describe a study: :class:`StudyConfig` (its search space, :class:`SearchSpace`, and objective,
  :class:`Objective`, each loaded by name or from a file; :class:`Goal` and :class:`ChoiceRule`
  for a multi-objective one).
- Run it: :func:`plan` loads and checks the three together; :class:`Driver` runs the study's
  trials to its budget and returns a :class:`StudyRun`; a :class:`TrialRunner` launches one
  trial (:class:`TrialSpec`) and measures it (:class:`TrialResult`).
- Read it: :func:`load_study` opens a stored study; :class:`TrialRecord` is one trial as autotune
  recorded it (:func:`trial_views` gives them all); :func:`explain` says what mattered and what
  crashes; :func:`build_report` writes the HTML report.
- Errors: :class:`UsageError` (bad input: one line for a person), :class:`ConfigError` and
  :class:`StudyNotFoundError` (both UsageErrors).

These names are imported on first use (PEP 562), so that a process that needs only a part of
the package, such as the simulated server ``python -m autotune.sim serve`` that every simulated
trial launches, does not pay for Optuna and the tuner at start-up.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from autotune.analysis.explain import explain
    from autotune.config.objective import Objective
    from autotune.config.pareto import ChoiceRule, Goal
    from autotune.config.space import SearchSpace
    from autotune.config.study import StudyConfig
    from autotune.errors import ConfigError, StudyNotFoundError, UsageError
    from autotune.execution.runner import TrialRunner
    from autotune.execution.trial import TrialResult, TrialSpec
    from autotune.profiles.report import build_report
    from autotune.store.record import TrialRecord
    from autotune.store.study_view import load_study, trial_views
    from autotune.study.build import plan
    from autotune.study.driver import Driver, StudyRun

__version__ = "0.1.0"

_HOMES = {
    "StudyConfig": "autotune.config.study",
    "SearchSpace": "autotune.config.space",
    "Objective": "autotune.config.objective",
    "Goal": "autotune.config.pareto",
    "ChoiceRule": "autotune.config.pareto",
    "plan": "autotune.study.build",
    "Driver": "autotune.study.driver",
    "StudyRun": "autotune.study.driver",
    "TrialRunner": "autotune.execution.runner",
    "TrialSpec": "autotune.execution.trial",
    "TrialResult": "autotune.execution.trial",
    "load_study": "autotune.store.study_view",
    "trial_views": "autotune.store.study_view",
    "TrialRecord": "autotune.store.record",
    "explain": "autotune.analysis.explain",
    "build_report": "autotune.profiles.report",
    "UsageError": "autotune.errors",
    "ConfigError": "autotune.errors",
    "StudyNotFoundError": "autotune.errors",
}
"""Each public name and the module it lives in."""

__all__ = [
    "ChoiceRule", "ConfigError", "Driver", "Goal", "Objective", "SearchSpace", "StudyConfig", "StudyNotFoundError",
    "StudyRun", "TrialRecord", "TrialResult", "TrialRunner", "TrialSpec", "UsageError", "build_report", "explain",
    "load_study", "plan", "trial_views", "__version__",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'autotune' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOMES))
