"""What earlier studies found, in the form the default sampler reads it (a warm start).

A :class:`Prior` holds trial records of other studies (:class:`~autotune.store.record.TrialRecord`):
the failures carried over as facts, and the measured runs that sit beside them. They are
numbered below 0, so that they never meet the study's own numbers, and their parameters are
completed into the study's space. It also holds the failed moves those studies showed
(:class:`Move`: one parameter moved from a configuration that ran, and the launch failed) and
hints (:class:`Hint`): values of another study's best configuration for the study to measure.
:mod:`autotune.study.warm_start` decides what is carried.

:class:`~autotune.search.samplers.CrashAwareTPESampler` reads the records beside its own trials,
in the crash regions, the failure boundary and the choices a failure's message names, adds the
moves to its own failed moves, and proposes each hint once (:meth:`Hint.on`). Contract: the
study's own trials win (:meth:`Prior.weighs_region`, :meth:`Prior.boundary_kinds`,
:meth:`Prior.failed_moves`, :meth:`Hint.on`); TPE's model never sees a prior (another model's
values are not this one's).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from optuna.distributions import BaseDistribution

from autotune.search.moves import FailedMove
from autotune.store.record import Outcome, TrialRecord

MIN_OWN = 3
"""Failures of a kind the study has seen itself before that kind's boundary is fitted to its own
trials only (:meth:`Prior.boundary_kinds`)."""


@dataclass(frozen=True)
class Hint:
    """Values of another study's best configuration (``values``: parameter -> value) and why
    they are proposed (``why``: a :data:`~autotune.store.record.PROPOSED_ATTR`)."""

    values: dict[str, Any]
    why: dict[str, Any]

    def on(self, incumbent: Mapping[str, Any], monotone: Mapping[str, Mapping[str, str]],
           failed_kinds: Sequence[str]) -> dict[str, Any]:
        """The hint on the best configuration measured here (``incumbent``): its values, except
        where the study's own failures speak: a parameter the space declares monotone for a
        failure kind seen here (``failed_kinds``) keeps the incumbent's value."""
        spoken = {n for n, kinds in monotone.items() if any(k in kinds for k in failed_kinds)}
        return {n: (self.values[n] if n in self.values and n not in spoken else v) for n, v in incumbent.items()}


@dataclass(frozen=True)
class Move:
    """A move another study showed failing: ``param`` alone moved from ``before`` (in a
    configuration that ran) to ``after``, and that launch failed with ``kind``."""

    param: str
    before: Any
    after: Any
    kind: str


@dataclass(frozen=True)
class Prior:
    """Other studies' failures carried as facts, their runs beside them, and hints (module
    docstring)."""

    failures: tuple[TrialRecord, ...] = ()
    runs: tuple[TrialRecord, ...] = ()
    hints: tuple[Hint, ...] = field(default=())
    moves: tuple[Move, ...] = field(default=())

    @property
    def views(self) -> tuple[TrialRecord, ...]:
        """Every carried record, failures first."""
        return (*self.failures, *self.runs)

    def __bool__(self) -> bool:
        return bool(self.failures or self.runs or self.hints or self.moves)

    @staticmethod
    def weighs_region(own_in_region: Sequence[TrialRecord]) -> bool:
        """Whether a crash region is weighed with the prior: only while none of the study's own
        trials inside it was measured (one that ran there outweighs what another study saw)."""
        return not any(v.outcome == Outcome.OK for v in own_in_region)

    def boundary_kinds(self, own_failures: Sequence[str]) -> frozenset[str]:
        """The failure kinds whose carried failures join the boundary's fit: those the study has
        seen fewer than :data:`MIN_OWN` failures of itself."""
        seen = Counter(own_failures)
        return frozenset(v.failure.kind for v in self.failures if v.failure and seen[v.failure.kind] < MIN_OWN)

    def failed_moves(self, search_space: Mapping[str, BaseDistribution],
                     measured: Sequence[Mapping[str, Any]]) -> list[FailedMove]:
        """The carried moves over ``search_space``, except each that the study's own
        ``measured`` configurations contradict (one ran with ``param`` at ``after``)."""
        return [FailedMove(m.param, search_space[m.param], m.before, m.after, m.kind) for m in self.moves
                if m.param in search_space and not any(p.get(m.param) == m.after for p in measured)]


__all__ = ["MIN_OWN", "Hint", "Move", "Prior"]
