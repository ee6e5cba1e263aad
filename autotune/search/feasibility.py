"""A feasibility classifier: the chance a configuration fails at a boundary, from the study.

Out-of-memory is a boundary in the space, not a region one parameter describes. SGLang's memory
at start-up is nearly a sum: the KV pool the memory fraction takes, CUDA graphs growing with the
captured batch, the draft model's graphs with the draft tokens, NCCL's buffers with channels and
buffer size (and, on the Kimi PCIe host, larger captures with fewer channels). A trial just below
the boundary runs, one just above fails, and ``study explain``'s one- and two-parameter rules
(:mod:`autotune.analysis.crash_rules`) state only the part of it a threshold covers: on the Kimi host,
``mem_fraction_static >= 0.61 -> oom``, while 0.56 with 6 draft tokens or 0.60 with a CUDA-graph
batch of 450 fail too.

So the sampler also asks a logistic regression (the feasibility classifier of constrained Bayesian
optimisation, Gelbart et al. 2014; SCOOT fits a random forest for the same job), one per failure
kind seen of :data:`MODELLED_KINDS`, fitted to the trials that ran (0) and those that failed with that kind (1).
Logistic, because a sum of memory terms crossing a capacity is a linear boundary in the
parameters' values. ``nccl-error`` is fitted too: NCCL buffers that do not fit fail at
initialisation as an NCCL error (``NCCL WARN Cuda failure 'out of memory'``), and an algorithm
that cannot run (``NCCL_ALGO=Tree`` on an all-gather) is a one-hot weight of the same model.
Memory grows with a value, not with its log, so numbers are scaled
linearly over their range, log ranges too; a categorical with numeric choices gives its position
and its value (a non-number such as ``unset``: 0); any other categorical is one-hot. A light
ridge penalty keeps the fit finite when the trials separate, which near a sharp boundary they do.

Contract of :class:`FeasibilityModel`: :meth:`FeasibilityModel.fit` uses only what it is given; a kind with
fewer than :data:`MIN_EACH` failures or :data:`MIN_EACH` runs gets no model; :meth:`chance`
gives, for a configuration, the largest predicted chance over the fitted kinds (0 with none, or
for a configuration that lacks a parameter of the space).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution

from autotune.analysis.crash_rules import is_number
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
