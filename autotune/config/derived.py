"""Quantities the engine computes from several parameters, for the crash rules to read.

Some failures sit on a boundary that no one parameter draws. NCCL's receive buffers are
``channels x (LL 0.5 MiB + LL128 4.7 MiB + NCCL_BUFFSIZE)`` per peer connection (the protocols
``NCCL_PROTO`` leaves enabled; ``reference/engine-facts.md``), allocated lazily out of the memory
the server left: 20 channels at 4 MiB fail where 9 at 2 MiB run, and 7 at 16 MiB fail too. A
threshold on channels alone or on the buffer size alone then takes some failures and leaves the
others, each too few for a rule. Over the product it is one threshold:
``nccl_buffers_mib >= 94 -> nccl-error (4 of 4)``.

:func:`derived_values` adds such quantities to a trial's applied parameters
(:mod:`autotune.analysis.crash_rules` reads them as parameters of their own); :meth:`Condition.holds
<autotune.analysis.conditions.Condition.holds>` computes one the parameters lack, so the default sampler
avoids a region stated over it. A quantity is computed only when the parameters say enough: the
buffers need ``NCCL_MIN_NCHANNELS`` or ``NCCL_MIN_CTAS`` (the channel count is otherwise the
topology's choice, unknown here), the other variables take NCCL's defaults when unset. Parameters are read by
NCCL's own names (as the built-in spaces name them), or from the launch's environment.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from autotune.engines.nccl_env import DEFAULT_BUFFSIZE, PROTOCOLS, connection_buffer_mib, parse_set

UNSET = ("", "unset", "none")


def _number(value: Any) -> int | None:
    """An integer setting as NCCL reads it (``"0x400000"`` too); None when unset or not a number."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return int(value)
    text = str(value).strip()
    if text.lower() in UNSET:
        return None
    try:
        return int(text, 0)
    except ValueError:
        return None


def _either(params: Mapping[str, Any], name: str, newer: str) -> Any:
    """A variable under NCCL's older name, or its newer one (``NCCL_MIN_CTAS``, 2.17+)."""
    value = params.get(name)
    return value if value is not None and str(value).strip().lower() not in UNSET else params.get(newer)


def enabled_protocols(value: Any) -> frozenset[str] | None:
    """The protocols ``NCCL_PROTO=value`` leaves enabled (``"LL,LL128"``, ``"^LL"``, per-collective
    ``allreduce:simple``); all three when unset; None for a name NCCL does not know."""
    every = frozenset(PROTOCOLS.values())
    text = "" if value is None else str(value).strip()
    if text.lower() in UNSET:
        return every
    chosen, unknown = parse_set(text, PROTOCOLS, every)
    return None if unknown is not None else chosen


def nccl_buffers_mib(params: Mapping[str, Any]) -> float | None:
    """NCCL's receive buffers per peer, MiB, at the fewest channels the settings allow:
    ``NCCL_MIN_NCHANNELS`` (or ``NCCL_MIN_CTAS``; capped by ``NCCL_MAX_NCHANNELS`` or
    ``NCCL_MAX_CTAS``, as NCCL caps it) x one connection's buffers. None without a floor on the
    channels or with a protocol NCCL does not know."""
    low = _number(_either(params, "NCCL_MIN_NCHANNELS", "NCCL_MIN_CTAS"))
    if low is None or low < 1:
        return None
    high = _number(_either(params, "NCCL_MAX_NCHANNELS", "NCCL_MAX_CTAS"))
    channels = min(low, high) if high is not None and high >= 1 else low
    protocols = enabled_protocols(params.get("NCCL_PROTO"))
    buffsize = _number(params.get("NCCL_BUFFSIZE"))
    if protocols is None:
        return None
    return round(channels * connection_buffer_mib(protocols, buffsize if buffsize and buffsize > 0 else DEFAULT_BUFFSIZE), 1)


@dataclass(frozen=True)
class Derived:
    """A derived quantity: its name in a rule, what it means, the parameters it is read from,
    how each failure kind goes with it (as a space's ``monotone:`` declares), and how to compute it."""

    name: str
    meaning: str
    inputs: tuple[str, ...]
    monotone: Mapping[str, str]
    compute: Callable[[Mapping[str, Any]], float | None]


DERIVED = {
    d.name: d for d in (
        Derived("nccl_buffers_mib",
                "NCCL's receive buffers per peer, MiB: NCCL_MIN_NCHANNELS x (LL 0.5 + LL128 4.7 + NCCL_BUFFSIZE) "
                "over the protocols NCCL_PROTO enables",
                ("NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS", "NCCL_MIN_CTAS", "NCCL_MAX_CTAS", "NCCL_BUFFSIZE",
                 "NCCL_PROTO"),
                {"nccl-error": "up", "oom": "up"}, nccl_buffers_mib),
    )
}
"""The derived quantities, by name."""


def derived_value(name: str, params: Mapping[str, Any]) -> float | None:
    """The derived quantity ``name`` of ``params`` (None: not derived, or not computable)."""
    d = DERIVED.get(name)
    return d.compute(params) if d is not None else None


def derived_values(params: Mapping[str, Any], env: Mapping[str, str] | None = None) -> dict[str, float]:
    """The derived quantities ``params`` (applied values; ``env``, the launch's environment,
    fills what they lack) let one compute, when one of their inputs is a parameter: a quantity
    of settings fixed for the whole study varies with nothing, and says nothing."""
    merged = {**(env or {}), **params}
    out: dict[str, float] = {}
    for d in DERIVED.values():
        if any(p in params for p in d.inputs) and (value := d.compute(merged)) is not None:
            out[d.name] = value
    return out


def derived_inputs(name: str) -> tuple[str, ...]:
    """The parameters derived quantity ``name`` is read from (empty for a parameter)."""
    d = DERIVED.get(name)
    return d.inputs if d is not None else ()


__all__ = ["DERIVED", "Derived", "derived_inputs", "derived_value", "derived_values",
           "enabled_protocols", "nccl_buffers_mib"]
