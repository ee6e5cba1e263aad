"""Small statistics shared by the profile's measurement, the confirmation runs and the ablation.

:func:`t95` is Student's t quantile of a two-sided 95 % interval (SciPy, imported on first use:
``autotune``'s command line starts without it); :func:`mean_interval` the mean, sample standard
deviation and t-interval of a sample.
"""

from __future__ import annotations

__all__ = ["mean_interval", "t95"]

import functools
import math
from collections.abc import Sequence


@functools.lru_cache(maxsize=None)
def t95(df: int) -> float:
    """Student's t quantile for a two-sided 95% interval with ``df`` degrees of freedom.

    Raises:
        ValueError: ``df`` is below 1.
    """
    if df < 1:
        raise ValueError(f"t95 needs at least 1 degree of freedom, got {df}")
    from scipy.stats import t

    return float(t.ppf(0.975, df))


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
