"""autotune: Bayesian tuning of LLM inference server launch configurations, by experiment.

The public surface: load a :class:`StudyConfig`, a :class:`SearchSpace` and an
:class:`Objective`; run trials with a :class:`TrialRunner` through a :class:`Driver`.
"""

from __future__ import annotations

from autotune.config import StudyConfig
from autotune.errors import ConfigError, UsageError
from autotune.objective import Objective
from autotune.space import SearchSpace

__version__ = "0.1.0"

__all__ = ["ConfigError", "Objective", "SearchSpace", "StudyConfig", "UsageError", "__version__"]
