"""A feasibility classifier: the chance a configuration fails at a boundary, from the study.

Out of memory is a boundary in the space (a sum of the KV pool, CUDA graphs, draft tokens and
NCCL buffers crossing a capacity), which the crash rules' thresholds
(:mod:`autotune.analysis.crash_rules`) state only in part. :class:`FeasibilityModel` is the
feasibility classifier of constrained Bayesian optimisation (Gelbart et al. 2014): one
ridge-penalised logistic regression per failure kind of :data:`MODELLED_KINDS` seen, fitted to the
trials that ran (0) and those that failed with that kind (1). ``nccl-error`` is modelled too: NCCL
buffers that do not fit fail as an NCCL error, and a choice that cannot run is a one-hot weight.

Features: a number scaled linearly over its range (a log range too: memory grows with a value);
a categorical with numeric choices gives its position and its value (a non-number: 0), and
whether it is a non-number (``unset`` is a step of its own: no speculation is not "0 draft
tokens", the data says what setting it costs); any other categorical is one-hot.

Contract: :meth:`FeasibilityModel.fit` uses only what it is given; a kind with fewer than
:data:`MIN_EACH` failures or :data:`MIN_EACH` runs gets no model; :meth:`FeasibilityModel.chance`
gives the largest predicted chance over the fitted kinds (0 with none, or for a configuration
that lacks a parameter of the space).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution

from autotune.analysis.conditions import is_number
from autotune.outcome.failures import MEMORY_KINDS

MODELLED_KINDS = (*MEMORY_KINDS, "nccl-error")
"""The failure kinds a model is fitted for (module docstring)."""
MIN_EACH = 3
"""Failures of a kind, and runs, before that kind gets a model."""
RIDGE = 0.01
"""The L2 penalty on the weights (features in [0, 1]); the intercept is not penalised."""
ITERATIONS = 25
"""Newton steps of the fit (it converges in a few; a separable set stops at the penalty)."""

__all__ = ["MIN_EACH", "MODELLED_KINDS", "FeasibilityModel"]


class FeasibilityModel:
    """One logistic regression per failure kind of :data:`MODELLED_KINDS` over ``search_space``
    (module docstring)."""

    def __init__(self, search_space: Mapping[str, BaseDistribution]) -> None:
        self.search_space = dict(search_space)
        self._weights: dict[str, np.ndarray] = {}

    def fit(self, ran: Sequence[Mapping[str, Any]], failed: Sequence[tuple[str, Mapping[str, Any]]]) -> FeasibilityModel:
        """Fit to the parameters of trials that ran and ``(failure kind, parameters)`` of those
        that failed; configurations missing a parameter of the space are left out."""
        self._weights = {}
        ok = [self._features(p) for p in ran if self._complete(p)]
        for kind in MODELLED_KINDS:
            bad = [self._features(p) for k, p in failed if k == kind and self._complete(p)]
            if len(bad) < MIN_EACH or len(ok) < MIN_EACH:
                continue
            x = np.array(ok + bad)
            y = np.array([0.0] * len(ok) + [1.0] * len(bad))
            self._weights[kind] = _logistic(x, y)
        return self

    @property
    def kinds(self) -> tuple[str, ...]:
        """The failure kinds with a model."""
        return tuple(self._weights)

    def chance(self, params: Mapping[str, Any]) -> float:
        """The largest predicted chance of a failure of ``params`` over the fitted kinds."""
        if not self._weights or not self._complete(params):
            return 0.0
        x = np.array(self._features(params))
        return max(float(_sigmoid(w[0] + x @ w[1:])) for w in self._weights.values())

    def _complete(self, params: Mapping[str, Any]) -> bool:
        return all(n in params for n in self.search_space)

    def _features(self, params: Mapping[str, Any]) -> list[float]:
        out: list[float] = []
        for name, dist in self.search_space.items():
            value = params[name]
            if isinstance(dist, CategoricalDistribution):
                choices = list(dist.choices)
                at = choices.index(value) if value in choices else -1
                numbers = [float(c) for c in choices if is_number(c)]
                if numbers:  # its position, and its value (a non-number, such as unset: 0)
                    out.append(at / max(1, len(choices) - 1))
                    out.append((float(value) if is_number(value) else 0.0) / max(max(numbers), 1e-12))
                    if len(numbers) < len(choices):  # a non-number is a step of its own, not "0" on the scale
                        out.append(0.0 if is_number(value) else 1.0)
                else:
                    out.extend(1.0 if i == at else 0.0 for i in range(1, len(choices)))
            elif isinstance(dist, (IntDistribution, FloatDistribution)):
                span = float(dist.high) - float(dist.low)
                out.append((float(value) - float(dist.low)) / span if span > 0 else 0.0)
        return out


def _sigmoid(z: Any) -> Any:
    return 1.0 / (1.0 + np.exp(-np.clip(z, -30.0, 30.0)))


def _logistic(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Ridge-penalised logistic regression by Newton's method: ``[intercept, weights...]``."""
    design = np.hstack([np.ones((len(x), 1)), x])
    w = np.zeros(design.shape[1])
    penalty = np.full(design.shape[1], RIDGE)
    penalty[0] = 0.0
    for _ in range(ITERATIONS):
        p = _sigmoid(design @ w)
        grad = design.T @ (p - y) + penalty * w
        hess = (design * (p * (1 - p))[:, None]).T @ design + np.diag(penalty + 1e-9)
        step = np.linalg.solve(hess, grad)
        w -= step
        if float(np.max(np.abs(step))) < 1e-6:
            break
    return w
