"""A feasibility classifier: the chance a configuration fails at a boundary, from the study.

Out of memory is a boundary in the space (a sum of the KV pool, CUDA graphs, draft tokens and
NCCL buffers crossing a capacity), which the crash rules' thresholds
(:mod:`autotune.analysis.crash_rules`) state only in part. :class:`FeasibilityModel` is the
feasibility classifier of constrained Bayesian optimisation (Gelbart et al. 2014): one
ridge-penalised logistic regression per failure kind of :data:`MODELLED_KINDS` seen, fitted to the
trials that ran (0) and those that failed with that kind (1). ``nccl-error`` is modelled too: NCCL
buffers that do not fit fail as an NCCL error, and a choice that cannot run is a one-hot weight;
and ``invalid-argument``: what an engine refuses is a region too (speculation on a model without a
draft is every draft length, the ``unset`` step's weight; a size over a limit is a threshold).

Features: a number scaled linearly over its range (a log range too: memory grows with a value);
a categorical with numeric choices gives its position and its value (a non-number: 0), and
whether it is a non-number (``unset`` is a step of its own: no speculation is not "0 draft
tokens", the data says what setting it costs); any other categorical is one-hot.

A parameter the space declares ``monotone:`` for a kind (more of it fails "up", less "down") has
the weights of its number features held to that sign for that kind: the declaration is what the
user knows of the boundary, so a few failures place it without the fit turning it around (one
OOM at a large fraction says nothing against a larger one).

Contract: :meth:`FeasibilityModel.fit` uses only what it is given; a kind with fewer than
:data:`MIN_FAILED` failures or :data:`MIN_RAN` runs gets no model; :meth:`FeasibilityModel.chance`
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

MODELLED_KINDS = (*MEMORY_KINDS, "nccl-error", "invalid-argument")
"""The failure kinds a model is fitted for (module docstring)."""
MIN_FAILED = 1
"""Failures of a kind before that kind gets a model (the penalty keeps one failure's pull local)."""
MIN_RAN = 3
"""Trials that ran before any kind gets a model."""
RIDGE = 0.01
"""The L2 penalty on the weights (features in [0, 1]); the intercept is not penalised."""
ITERATIONS = 50
"""Newton steps of the fit (it converges in a few; a separable set stops at the penalty)."""

__all__ = ["MIN_FAILED", "MIN_RAN", "MODELLED_KINDS", "FeasibilityModel"]


class FeasibilityModel:
    """One logistic regression per failure kind of :data:`MODELLED_KINDS` over ``search_space``,
    its weights signed as ``monotone`` declares (parameter -> {failure kind: "up" | "down"};
    module docstring)."""

    def __init__(self, search_space: Mapping[str, BaseDistribution],
                 monotone: Mapping[str, Mapping[str, str]] | None = None) -> None:
        self.search_space = dict(search_space)
        self.monotone = {n: dict(d) for n, d in (monotone or {}).items()}
        self._weights: dict[str, np.ndarray] = {}

    def fit(self, ran: Sequence[Mapping[str, Any]], failed: Sequence[tuple[str, Mapping[str, Any]]]) -> FeasibilityModel:
        """Fit to the parameters of trials that ran and ``(failure kind, parameters)`` of those
        that failed; configurations missing a parameter of the space are left out."""
        self._weights = {}
        ok = [self._features(p) for p in ran if self._complete(p)]
        for kind in MODELLED_KINDS:
            bad = [self._features(p) for k, p in failed if k == kind and self._complete(p)]
            if len(bad) < MIN_FAILED or len(ok) < MIN_RAN:
                continue
            x = np.array(ok + bad)
            y = np.array([0.0] * len(ok) + [1.0] * len(bad))
            self._weights[kind] = _logistic(x, y, self._signs(kind))
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
        return [x for name in self.search_space for x, _ in self._columns(name, params[name])]

    def _signs(self, kind: str) -> np.ndarray:
        """Per feature, the sign its weight is held to for ``kind``: 1 (at least 0), -1 (at most
        0) for a number feature of a parameter declared monotone for it, else 0 (free)."""
        way = {"up": 1.0, "down": -1.0}
        out = []
        for name, dist in self.search_space.items():
            sign = way.get(self.monotone.get(name, {}).get(kind, ""), 0.0)
            probe = dist.choices[0] if isinstance(dist, CategoricalDistribution) else getattr(dist, "low", 0)
            out.extend(sign if ordered else 0.0 for _, ordered in self._columns(name, probe))
        return np.array(out)

    def _columns(self, name: str, value: Any) -> list[tuple[float, bool]]:
        """The features of ``name`` = ``value``, each with whether it is a number on the
        parameter's scale (the features a ``monotone:`` declaration signs)."""
        dist = self.search_space[name]
        if isinstance(dist, CategoricalDistribution):
            choices = list(dist.choices)
            at = choices.index(value) if value in choices else -1
            numbers = [float(c) for c in choices if is_number(c)]
            if not numbers:
                return [(1.0 if i == at else 0.0, False) for i in range(1, len(choices))]
            out = [(at / max(1, len(choices) - 1), True),  # its position, and its value (a non-number, such as unset: 0)
                   ((float(value) if is_number(value) else 0.0) / max(max(numbers), 1e-12), True)]
            if len(numbers) < len(choices):  # a non-number is a step of its own, not "0" on the scale
                out.append((0.0 if is_number(value) else 1.0, False))
            return out
        if isinstance(dist, (IntDistribution, FloatDistribution)):
            span = float(dist.high) - float(dist.low)
            return [((float(value) - float(dist.low)) / span if span > 0 else 0.0, True)]
        return []


def _sigmoid(z: Any) -> Any:
    return 1.0 / (1.0 + np.exp(-np.clip(z, -30.0, 30.0)))


def _logistic(x: np.ndarray, y: np.ndarray, signs: np.ndarray) -> np.ndarray:
    """Ridge-penalised logistic regression by projected Newton steps: ``[intercept, weights...]``,
    each weight with a sign in ``signs`` (1: at least 0, -1: at most 0) held at 0 while the fit
    would cross it (released once its gradient points back inside)."""
    design = np.hstack([np.ones((len(x), 1)), x])
    sign = np.concatenate([[0.0], signs])
    w = np.zeros(design.shape[1])
    penalty = np.full(design.shape[1], RIDGE)
    penalty[0] = 0.0
    held = np.zeros(len(w), dtype=bool)
    for _ in range(ITERATIONS):
        p = _sigmoid(design @ w)
        grad = design.T @ (p - y) + penalty * w
        hess = (design * (p * (1 - p))[:, None]).T @ design + np.diag(penalty + 1e-9)
        held &= sign * grad >= 0  # a held weight whose descent points inside its sign is free again
        free = ~held
        step = np.zeros_like(w)
        step[free] = np.linalg.solve(hess[np.ix_(free, free)], grad[free])
        new = w - step
        crossed = sign * new < 0
        new[crossed] = 0.0
        held |= crossed
        moved = float(np.max(np.abs(new - w)))
        w = new
        if moved < 1e-6:
            break
    return w
