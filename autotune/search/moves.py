"""Failed moves: probes and raises that failed, which later probes do not repeat.

A probe or raise changes one parameter of a configuration that ran, so its failure is that
change's, as far as one launch shows: at that configuration, and where the parameters the space
declares monotone for its failure kind lie as far on the failing side (:func:`speaks_for`; a
protocol whose NCCL buffers did not fit beside 16 channels may fit beside 2).
:func:`failed_moves` reads them from a study; :func:`refused` tells whether a new probe repeats one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.trial import FrozenTrial

from autotune.analysis.conditions import is_number
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
    at: Mapping[str, Any] = field(default_factory=dict)
    """The configuration that failed (empty: not known; the move speaks everywhere)."""


def failed_moves(finished: Sequence[FrozenTrial], search_space: Mapping[str, BaseDistribution]) -> list[FailedMove]:
    """The study's failed probes and raises (:class:`FailedMove`), in trial order.

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
        out.append(FailedMove(name, search_space[name], ref.params[name], t.params[name], kind, dict(t.params)))
    return out


def speaks_for(move: FailedMove, params: Mapping[str, Any], monotone: Mapping[str, Mapping[str, str]]) -> bool:
    """Whether ``move``'s failure speaks for ``params``: each other parameter ``monotone``
    declares for its kind ("up": more fails) is at least the failed configuration's value
    ("down": at most); a non-number such as ``unset`` only at the same value. A move whose
    configuration is not known speaks everywhere."""
    for name, kinds in monotone.items():
        way = kinds.get(move.kind)
        if way not in ("up", "down") or name == move.param or name not in move.at or name not in params:
            continue
        then, now = move.at[name], params[name]
        if not (is_number(then) and is_number(now)):
            if then != now:
                return False
        elif (now < then) if way == "up" else (now > then):
            return False
    return True


def refused(moves: Sequence[FailedMove], search_space: Mapping[str, BaseDistribution], name: str, value: Any,
            current: Any, probe: Mapping[str, Any] | None = None,
            monotone: Mapping[str, Mapping[str, str]] | None = None) -> bool:
    """Whether a probe moving ``name`` from ``current`` to ``value`` (the whole configuration:
    ``probe``) repeats a failed move that speaks for it (:func:`speaks_for`, with the space's
    ``monotone`` declarations; without ``probe``, every move speaks).

    - A failure of an ordered parameter (:func:`ordered`): a move the same way to the failed
      value or beyond (a threshold: more channels than the buffers allow). What lies between the
      value that ran and the one that failed is not known from these two launches: a smaller
      step is a new measurement (no speculation -> 8 draft tokens failing says nothing of 2).
    - A failure of an unordered choice (``NCCL_ALGO=Tree``): that choice.
    """
    dist = search_space[name]
    for m in moves:
        if m.param != name or (probe is not None and not speaks_for(m, probe, monotone or {})):
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


__all__ = ["FailedMove", "failed_moves", "ordered", "refused", "speaks_for"]
