"""A figure against the baseline's, in words that cannot read as a gain when it is a loss.

:func:`versus_text` gives the relative change with its sign and a verdict: ``+23% better`` for
more throughput, ``-19% better`` for a lower latency, ``+5.0% worse`` for a higher one. A bare
ratio (``1.05x``) reads like a gain whatever the metric's direction; this text does not.
:func:`higher_is_better` tells a metric's direction from its name where the study does not state
it (rates: higher; times: lower; counts and unknown names: None, no verdict).
"""

from __future__ import annotations

import math

from autotune.util.units import unit_of

__all__ = ["higher_is_better", "versus_text"]

_HIGHER_UNITS = ("tok/s", "req/s", "GB/s")
_LOWER_UNITS = ("ms", "s", "µs")


def higher_is_better(metric: str | None) -> bool | None:
    """Whether more of ``metric`` is better: True for rates (tok/s, req/s, GB/s), False for times
    (ms, s, µs), None where its unit does not say (counts, unknown names)."""
    unit = unit_of(metric)
    if unit in _HIGHER_UNITS:
        return True
    if unit in _LOWER_UNITS:
        return False
    return None


def versus_text(value: float | None, base: float | None, higher_better: bool | None) -> str:
    """``value`` against ``base`` as a signed relative change and a verdict (``+23% better``,
    ``-19% better``, ``+5.0% worse``, ``same``); without a verdict where ``higher_better`` is
    None; "" where there is nothing to compare (a missing or zero base, a non-finite number).
    Changes under 10% keep one decimal."""
    if value is None or base is None or base == 0 or not (math.isfinite(value) and math.isfinite(base)):
        return ""
    change = (value - base) / abs(base) * 100.0
    shown = f"{change:+.0f}%" if abs(change) >= 9.95 else f"{change:+.1f}%"
    if shown in ("+0.0%", "-0.0%"):
        return "same"
    if higher_better is None:
        return shown
    return f"{shown} {'better' if (change > 0) == higher_better else 'worse'}"
