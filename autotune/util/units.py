"""The unit of a metric, from its name as autotune records it: every figure a person reads says it.

``output_throughput`` and the other token rates are tok/s, ``request_throughput`` req/s,
``*_ms`` ms, ``*_s`` s, ``*_us`` µs, ``*_gbps`` GB/s, ``*_mib`` MiB, ``*_gib`` GiB; a metric of
one load of several (``LOAD/metric``) or of one collective (``metric@op@bytes``) has its base
metric's unit; a count (``completed``) or an unknown name has none ("").
"""

from __future__ import annotations

import re

__all__ = ["unit_of", "with_unit"]

_EXACT = {
    "output_throughput": "tok/s",
    "total_throughput": "tok/s",
    "input_throughput": "tok/s",
    "request_throughput": "req/s",
    "duration_s": "s",
}
_SUFFIXES = (("_tok_s", "tok/s"), ("_throughput", "tok/s"), ("_ms", "ms"), ("_us", "µs"), ("_s", "s"),
             ("_gbps", "GB/s"), ("_mib", "MiB"), ("_gib", "GiB"), ("_gb", "GB"))


def unit_of(metric: str | None) -> str:
    """The unit of ``metric`` ("" where it has none or is unknown)."""
    if not metric:
        return ""
    base = re.split(r"@", metric.rsplit("/", 1)[-1], maxsplit=1)[0]
    if base in _EXACT:
        return _EXACT[base]
    for suffix, unit in _SUFFIXES:
        if base.endswith(suffix):
            return unit
    return ""


def with_unit(value: float | None, metric: str | None, spec: str = ".4g") -> str:
    """``value`` formatted with ``spec`` and its metric's unit (``631.9 tok/s``); ``-`` for None."""
    if value is None:
        return "-"
    unit = unit_of(metric)
    return f"{value:{spec}} {unit}" if unit else f"{value:{spec}}"
