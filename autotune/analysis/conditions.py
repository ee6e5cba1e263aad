"""Conditions on a trial's parameter values, the terms the crash rules are written in.

:class:`Condition` is ``P=v``, ``P >= x`` or ``P <= x`` over a trial's *applied* parameters, or
over a quantity the engine computes from several of them (:mod:`autotune.config.derived`).
:func:`candidate_conditions` lists every condition worth testing over a set of trials, with the
trials each holds in.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from autotune.config.derived import derived_value
from autotune.store.record import TrialRecord


def is_number(x: Any) -> bool:
    """A finite int or float (not a bool)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(float(x))


def show_value(x: Any) -> str:
    """A parameter value as a rule or a message names it (floats short, large ones exact)."""
    if isinstance(x, float):
        return f"{x:g}" if abs(x) < 1e6 else str(int(x)) if x.is_integer() else repr(x)
    return str(x)


def numbers(rows: Sequence[TrialRecord], name: str) -> np.ndarray:
    """Each row's value of ``name`` as a float; NaN where it is missing or not a number."""
    return np.array([float(x) if is_number(x := v.params.get(name)) else np.nan for v in rows])


@dataclass(frozen=True)
class Condition:
    """``param op value`` with ``op`` one of ``=``, ``>=``, ``<=``.

    A parameter the trial lacks is computed where it is a derived quantity
    (:func:`autotune.config.derived.derived_value`); otherwise the condition does not hold.
    ``=`` tells a bool from an equal number; ``>=`` and ``<=`` hold only for numbers.
    """

    param: str
    op: str
    value: Any

    def holds(self, params: dict[str, Any]) -> bool:
        v = params.get(self.param)
        if v is None:
            v = derived_value(self.param, params)
        if v is None:
            return False
        if self.op == "=":
            return bool(v == self.value and isinstance(v, bool) == isinstance(self.value, bool))
        if not is_number(v):
            return False
        return bool(v >= self.value) if self.op == ">=" else bool(v <= self.value)

    def __str__(self) -> str:
        if self.op == "=":
            return f"{self.param}={show_value(self.value)}"
        return f"{self.param} {self.op} {show_value(self.value)}"

    def to_json(self) -> dict[str, Any]:
        return {"param": self.param, "op": self.op, "value": self.value}


def candidate_conditions(rows: Sequence[TrialRecord]) -> tuple[list[Condition], np.ndarray]:
    """Every condition worth testing, and which rows each holds in (a conditions x rows matrix).

    Numeric parameters (every value a number): ``P >= x`` and ``P <= x`` at each observed ``x``
    that leaves at least one row out. Others: ``P=v`` for each observed ``v``, and the thresholds
    over their numeric values (``[unset, 2, 4]``: ``P >= 2`` says "set, to at least 2"). A
    parameter with one value says nothing.
    """
    names = sorted({k for v in rows for k in v.params})
    conds: list[Condition] = []
    masks: list[np.ndarray] = []
    for name in names:
        values = [v.params.get(name) for v in rows]
        present = [x for x in values if x is not None]
        distinct = sorted(set(map(repr, present)))
        if len(distinct) < 2:
            continue
        arr = numbers(rows, name)
        if all(is_number(x) for x in present):
            uniq = sorted(set(present))
            for x in uniq[1:]:
                conds.append(Condition(name, ">=", x))
                masks.append(arr >= float(x))
            for x in uniq[:-1]:
                conds.append(Condition(name, "<=", x))
                masks.append(arr <= float(x))
        else:
            seen: dict[str, Any] = {}
            for x in present:
                seen.setdefault(repr(x), x)
            for x in seen.values():
                c = Condition(name, "=", x)
                conds.append(c)
                masks.append(np.array([c.holds(v.params) for v in rows]))
            found = sorted({x for x in present if is_number(x)})
            for x in found[1:]:
                conds.append(Condition(name, ">=", x))
                masks.append(arr >= float(x))
            for x in found[:-1] if len(found) > 1 else []:
                conds.append(Condition(name, "<=", x))
                masks.append(arr <= float(x))
            if found and len(found) < len(seen):
                conds.append(Condition(name, ">=", found[0]))
                masks.append(arr >= float(found[0]))
    if not masks:
        return [], np.zeros((0, len(rows)), dtype=bool)
    return conds, np.vstack(masks)


__all__ = ["Condition", "candidate_conditions", "is_number", "numbers", "show_value"]
