"""Small statistics shared by the profile's measurement and the ablation (no SciPy needed)."""

from __future__ import annotations

__all__ = ["mean_interval", "t95"]

import math
from collections.abc import Sequence

_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
        2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
        2.045, 2.042)
"""Student's t, two-sided 95%, for 1 .. 30 degrees of freedom."""


def t95(df: int) -> float:
    """Student's t quantile for a two-sided 95% interval with ``df`` degrees of freedom."""
    return _T95[df - 1] if 1 <= df <= len(_T95) else (2.0 if df <= 60 else 1.96)


def mean_interval(values: Sequence[float]) -> tuple[float, float | None, tuple[float, float] | None]:
    """Mean, sample standard deviation and 95% t-interval of the mean of ``values`` (sd and
    interval None for fewer than two values).

    Raises:
        ValueError: ``values`` is empty.
    """
    n = len(values)
    if n == 0:
        raise ValueError("mean_interval of no values")
    mean = sum(values) / n
    if n < 2:
        return mean, None, None
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = t95(n - 1) * sd / math.sqrt(n)
    return mean, sd, (mean - half, mean + half)
