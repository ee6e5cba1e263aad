"""The set-up of one scenario of `autotune bench tuner`: its space, objective and scenario.

:class:`Setup` names them (loaded once per process) and makes a study's config on a ``sim``
target with the demo's NCCL env (:data:`BENCH_ENV`) and a
:class:`~autotune.bench.model_executor.ModelExecutor` in place of a host. :class:`Evaluator` gives
the noise-free value the model predicts for a configuration.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from autotune.bench.model_executor import ModelExecutor
from autotune.config.demo import DEMO_CONFIG
from autotune.config.objective import Objective
from autotune.config.space import ParamValue, SearchSpace
from autotune.config.study import StudyConfig
from autotune.errors import UsageError
from autotune.execution.trial import TrialSpec
from autotune.sim.scenario import Noise, Scenario, ScenarioError, load_scenario

BENCH_ENV = {k: v for k, v in DEMO_CONFIG["target"]["env"].items() if k.startswith("NCCL_")}
"""The target's fixed env: the demo's NCCL variables."""


@dataclass(frozen=True)
class Setup:
    """What a study on one scenario runs: the space, objective, scenario (noise applied)."""

    scenario_name: str
    space_name: str
    objective_name: str
    noise: float | None
    early_stop: bool = True
    """False: the objective's ``early_stop`` off (every load runs to its end)."""

    @property
    def space(self) -> SearchSpace:
        return _space(self.space_name)

    @property
    def objective(self) -> Objective:
        obj = _objective(self.objective_name)
        return obj if self.early_stop else dataclasses.replace(obj, early_stop=False)

    @property
    def scenario(self) -> Scenario:
        return _scenario(self.scenario_name, self.noise)

    def config(self, *, name: str, storage: str, sampler: str, seed: int | None, trials: int,
               confirm: bool = True, warm_start: list[dict[str, Any]] | None = None) -> StudyConfig:
        """The study config of one study (``confirm``: the budget's end confirms the best, as
        ``study start`` does by default; ``warm_start``: the config's key)."""
        budget: dict[str, Any] = {"trials": trials}
        if not confirm:
            budget["confirm"] = {"candidates": 0}
        return StudyConfig.from_mapping({
            "name": name, "target": {"engine": "sim", "scenario": self.scenario_name, "env": dict(BENCH_ENV)},
            "space": self.space_name, "objective": self.objective_name, "storage": storage, "sampler": sampler,
            "seed": seed, "budget": budget, "warm_start": list(warm_start or []),
        }, "bench tuner")

    def executor(self, seed: int | None, *, ready_timeout_s: float | None = None) -> ModelExecutor:
        """A model executor of this set-up with noise ``seed``."""
        cfg = self.config(name="probe", storage="sqlite:///unused.db", sampler="tpe", seed=None, trials=1)
        ex = ModelExecutor.for_target(cfg, self.objective, seed=seed, scenario=self.scenario)
        if ready_timeout_s is not None:
            ex.ready_timeout_s = ready_timeout_s
        return ex


@lru_cache(maxsize=None)
def _space(name: str) -> SearchSpace:
    return SearchSpace.load(name)


@lru_cache(maxsize=None)
def _objective(name: str) -> Objective:
    return Objective.load_file(name)


@lru_cache(maxsize=None)
def _scenario(name: str, noise: float | None) -> Scenario:
    try:
        sc = load_scenario(name)
    except ScenarioError as exc:
        raise UsageError(str(exc)) from None
    if noise is not None:
        sc = sc.model_copy(update={"noise": Noise(throughput_sd=noise)})
    return sc


class Evaluator:
    """The noise-free value of configurations (``None``: infeasible), through a noise-free
    :class:`ModelExecutor` without ready timeout: what the model says the configuration does."""

    def __init__(self, setup: Setup) -> None:
        self.space = setup.space
        self.metric = setup.objective.metric
        self.maximize = setup.objective.direction == "maximize"
        self._ex = setup.executor(None, ready_timeout_s=math.inf)
        self._memo: dict[tuple[tuple[str, Any], ...], float | None] = {}

    def value(self, params: dict[str, ParamValue]) -> float | None:
        launch = self.space.to_launch(params)
        key = tuple(sorted(launch.applied.items()))
        if key not in self._memo:
            r = self._ex.result(TrialSpec(0, env=launch.env, args=launch.args))
            self._memo[key] = r.metrics.get(self.metric) if r.outcome == "ok" else None
        return self._memo[key]

    def better(self, a: float | None, b: float | None) -> bool:
        """Whether value ``a`` is better than ``b`` (None: infeasible, worse than any value)."""
        if a is None:
            return False
        return b is None or (a > b if self.maximize else a < b)

    @property
    def evaluated(self) -> int:
        return len(self._memo)


@lru_cache(maxsize=None)
def evaluator(setup: Setup) -> Evaluator:
    """The :class:`Evaluator` of ``setup``, made once per process."""
    return Evaluator(setup)
