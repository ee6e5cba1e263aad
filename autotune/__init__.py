"""autotune: Bayesian tuning of LLM inference server launch configurations, by experiment.

The public surface: load a :class:`StudyConfig`, a :class:`SearchSpace` and an
:class:`Objective`; run trials with a :class:`TrialRunner` through a :class:`Driver`.

These names are imported on first use (PEP 562), so that a process that needs only a part of
the package, such as the simulated server ``python -m autotune.sim serve`` that every simulated
trial launches, does not pay for Optuna and pydantic at start-up.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from autotune.config.study import StudyConfig
    from autotune.errors import ConfigError, UsageError
    from autotune.config.objective import Objective
    from autotune.config.space import SearchSpace

__version__ = "0.1.0"

__all__ = ["ConfigError", "Objective", "SearchSpace", "StudyConfig", "UsageError", "__version__"]

_HOMES = {"StudyConfig": "autotune.config.study", "ConfigError": "autotune.errors", "UsageError": "autotune.errors",
          "Objective": "autotune.config.objective", "SearchSpace": "autotune.config.space"}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'autotune' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value
