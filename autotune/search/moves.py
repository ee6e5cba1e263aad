"""Failed moves: probes and raises that failed, which later probes do not repeat.

A probe or raise changes one parameter of a configuration that ran, so its failure is that
change's, as far as one launch shows: at that configuration, and where the parameters the space
declares monotone for its failure kind lie as far on the failing side (its
:attr:`~FailedMove.scope`; a protocol whose NCCL buffers did not fit beside 16 channels may fit
beside 2).
:func:`failed_moves` reads them from a study; :func:`refused` tells whether a new probe repeats one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.trial import FrozenTrial

from autotune.analysis.conditions import Condition, is_number
from autotune.store.record import PROPOSED_ATTR, failed_kind


@dataclass(frozen=True)
class FailedMove:
    """A probe or raise that failed: ``param`` moved alone from ``before`` (the value in the
    configuration it moved from, which ran) to ``after``, and the launch failed with ``kind``."""

    param: str
    distribution: BaseDistribution
    before: Any
    after: Any
    kind: str
    scope: tuple[Condition, ...] = ()
    """Where the failure speaks: each other parameter declared monotone for ``kind`` on the
    failing side of (or at) the failed configuration's value, a non-number at that value
    (:func:`failed_moves`); empty: everywhere."""

    def speaks_for(self, params: Mapping[str, Any]) -> bool:
        """Whether the failure speaks for ``params`` (every condition of :attr:`scope` holds)."""
        return all(c.holds(dict(params)) for c in self.scope)


def failed_moves(finished: Sequence[FrozenTrial], search_space: Mapping[str, BaseDistribution],
                 monotone: Mapping[str, Mapping[str, str]] | None = None) -> list[FailedMove]:
    """The study's failed probes and raises (:class:`FailedMove`), in trial order, each scoped by
    the space's ``monotone`` declarations (:attr:`FailedMove.scope`).

    One parameter moved from a configuration that ran and the launch failed: the move caused the
    failure, as far as one launch can show. Trials skipped as implied failures count (their
    failure is known without a launch)."""
    by_number = {t.number: t for t in finished}
    out = []
    for t in finished:
        why = t.system_attrs.get(PROPOSED_ATTR)
        kind = failed_kind(t)
        if not kind or not isinstance(why, dict) or why.get("by") not in ("probe", "raise"):
            continue
        ref = by_number.get(why.get("around", why.get("after")))  # type: ignore[arg-type]
        name = why.get("param")
        if ref is None or name not in search_space or name not in t.params or name not in ref.params:
            continue
        out.append(FailedMove(name, search_space[name], ref.params[name], t.params[name], kind,
                              _scope(name, kind, t.params, monotone or {})))
    return out


def _scope(param: str, kind: str, at: Mapping[str, Any], monotone: Mapping[str, Mapping[str, str]]) -> tuple[Condition, ...]:
    """:attr:`FailedMove.scope` of ``param``'s move that failed with ``kind`` at ``at``."""
    out = []
    for name, kinds in sorted(monotone.items()):
        way = kinds.get(kind)
        if way in ("up", "down") and name != param and name in at:
            value = at[name]
            out.append(Condition(name, ("=" if not is_number(value) else ">=" if way == "up" else "<="), value))
    return tuple(out)


def refused(moves: Sequence[FailedMove], search_space: Mapping[str, BaseDistribution], name: str, value: Any,
            current: Any, probe: Mapping[str, Any] | None = None) -> bool:
    """Whether a probe moving ``name`` from ``current`` to ``value`` (the whole configuration:
    ``probe``) repeats a failed move that speaks for it (:meth:`FailedMove.speaks_for`; without
    ``probe``, every move speaks).

    - A failure of an ordered parameter (:func:`ordered`): a move the same way to the failed
      value or beyond (a threshold: more channels than the buffers allow). What lies between the
      value that ran and the one that failed is not known from these two launches: a smaller
      step is a new measurement (no speculation -> 8 draft tokens failing says nothing of 2).
    - A failure of an unordered choice (``NCCL_ALGO=Tree``): that choice.
    """
    dist = search_space[name]
    for m in moves:
        if m.param != name or (probe is not None and not m.speaks_for(probe)):
            continue
        if not ordered(dist):
            if value == m.after:
                return True
            continue
        way = _sign(_position(dist, m.after) - _position(dist, m.before))
        if way == 0 or _sign(_position(dist, value) - _position(dist, current)) != way:
            continue
        if way * (_position(dist, value) - _position(dist, m.after)) >= 0:
            return True
    return False


def ordered(dist: BaseDistribution) -> bool:
    """A number, or a categorical with numeric choices (ordered as listed)."""
    return not isinstance(dist, CategoricalDistribution) or any(is_number(c) for c in dist.choices)


def _position(dist: BaseDistribution, value: Any) -> float:
    """Where ``value`` lies in an ordered parameter's range (:func:`ordered`)."""
    if isinstance(dist, CategoricalDistribution):
        return float(dist.choices.index(value)) if value in dist.choices else -1.0
    return float(value)


def _sign(x: float) -> int:
    return (x > 0) - (x < 0)


__all__ = ["FailedMove", "failed_moves", "ordered", "refused"]
