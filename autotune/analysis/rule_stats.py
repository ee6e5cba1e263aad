"""The statistics the crash rules are judged by: hypergeometric tails and a Wilson lower bound.

SciPy is imported on first use: ``autotune``'s command line starts without it.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np


def wilson_low(k: Any, n: Any, z: float = 1.28) -> Any:
    """Lower end of the Wilson interval (90 % two-sided) of a proportion ``k`` of ``n``
    (arrays element-wise; ``n`` of 0 reads as a tiny positive number)."""
    k, n = np.asarray(k, dtype=float), np.maximum(np.asarray(n, dtype=float), 1e-9)
    p = k / n
    centre = p + z * z / (2 * n)
    half = z * np.sqrt(np.maximum(p * (1 - p) / n + z * z / (4 * n * n), 0.0))
    return (centre - half) / (1 + z * z / n)


def hypergeom_tail(population: int, successes: int, draws: int, observed: int) -> float:
    """P(X >= observed) for X ~ Hypergeometric(population, successes, draws)."""
    from scipy.stats import hypergeom

    return min(1.0, float(hypergeom.sf(observed - 1, population, successes, draws)))


@functools.lru_cache(maxsize=16)
def tail_table(population: int, successes: int) -> np.ndarray:
    """``T[d, x]`` = :func:`hypergeom_tail` ``(population, successes, d, x)`` for every ``d`` in
    ``0..population`` and ``x`` in ``0..successes + 1``: the chances of many candidates at once.

    Cached and read-only: a cover asks for the same few tables many times.
    """
    from scipy.stats import hypergeom

    d = np.arange(population + 1)[:, None]
    x = np.arange(successes + 2)[None, :]
    table = np.minimum(1.0, hypergeom.sf(x - 1, population, successes, d))
    table.setflags(write=False)
    return table


__all__ = ["hypergeom_tail", "tail_table", "wilson_low"]
