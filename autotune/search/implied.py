"""Failures implied by earlier ones: configurations a study need not launch to know they fail.

Some failures are monotone in a parameter. SGLang sizes its KV pool from
``--mem-fraction-static`` and captures CUDA graphs in what is left, so a graph-capture OOM at
0.80 is an OOM at 0.85 too when nothing else changed; its "Not enough memory" for the KV pool at
0.55 is the same failure at 0.50. A search space says so per parameter (``monotone: {oom: up,
not-enough-memory: down}``, :class:`autotune.config.space.Parameter`), and the driver skips a proposal
that an earlier failure implies: it records the trial as ``skipped`` (no server launched, no GPU
time spent, not counted against the trial budget) and tells the sampler it is infeasible, so the
sampler learns from it as from the failure itself.

Contract of :func:`implied_failure`: a configuration is implied to fail with kind K by an earlier
trial that failed with K when every parameter either has the earlier trial's applied value, or is
monotone for K and lies beyond the earlier value in the declared direction; at least one
parameter must differ (an identical configuration is not skipped: a repeat is a measurement).
Only the declared parameters are extrapolated, and only the applied values (rules repaired) are
compared.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from autotune.analysis.conditions import is_number, show_value

SKIPPED = "skipped"
"""The ``outcome`` of a trial the driver did not launch because an earlier failure implies it."""
MAX_SKIPS_IN_A_ROW = 25
"""Proposals skipped one after another before the driver launches the next one anyway (a
sampler that keeps proposing implied failures is not left to spin)."""


@dataclass(frozen=True)
class Implication:
    """Why a configuration is known to fail: the earlier trial, its failure kind, and the
    parameters that moved beyond its values (``{name: (earlier, now)}``)."""

    trial: int
    kind: str
    moved: dict[str, tuple[Any, Any]]

    def message(self) -> str:
        moves = ", ".join(f"{n} {show_value(now)} {'>' if now > before else '<'} {show_value(before)}"
                          for n, (before, now) in self.moved.items())
        return (f"skipped: trial {self.trial} failed with {self.kind}, and this configuration differs from it only by "
                f"{moves}, which the search space declares fails the same way (monotone)")


def implied_failure(applied: Mapping[str, Any], failures: Iterable[tuple[int, str, Mapping[str, Any]]],
                    monotone: Mapping[str, Mapping[str, str]]) -> Implication | None:
    """The first earlier failure that implies ``applied`` fails too (module docstring), or None.

    ``failures``: ``(trial number, failure kind, applied parameters)`` of the study's infeasible
    trials, in trial order; ``monotone``: parameter -> {failure kind: "up" | "down"}.
    """
    for number, kind, before in failures:
        moved: dict[str, tuple[Any, Any]] = {}
        for name, now in applied.items():
            was = before.get(name)
            if was == now and isinstance(was, bool) == isinstance(now, bool):
                continue
            direction = monotone.get(name, {}).get(kind)
            if direction is None or not (is_number(was) and is_number(now)) or (now > was) != (direction == "up"):
                break
            moved[name] = (was, now)
        else:
            if moved and set(before) <= set(applied):
                return Implication(number, kind, moved)
    return None


__all__ = ["Implication", "MAX_SKIPS_IN_A_ROW", "SKIPPED", "implied_failure"]
