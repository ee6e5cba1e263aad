"""Small statistics shared by the profile's measurement and the ablation (no SciPy needed)."""

from __future__ import annotations

__all__ = ["t95"]

_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
        2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
        2.045, 2.042)
"""Student's t, two-sided 95%, for 1 .. 30 degrees of freedom."""


def t95(df: int) -> float:
    """Student's t quantile for a two-sided 95% interval with ``df`` degrees of freedom."""
    return _T95[df - 1] if 1 <= df <= len(_T95) else (2.0 if df <= 60 else 1.96)
