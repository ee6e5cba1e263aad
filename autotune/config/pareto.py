"""Multi-objective studies: the Pareto front of the measured trials, and the rule that picks one.

A multi-objective study (an objective file listing ``objectives:``) has no single best trial: a
trial is on the *front* when it is feasible and no other feasible trial is at least as good on
every objective and better on one. What is exported, shown as "best" and used as another study's
baseline is the front's trial that a stated :class:`ChoiceRule` picks:

``bound`` (the default)
    The front's best on the first objective among its trials within a bound on every other
    objective: an absolute bound where ``bounds`` names that objective's metric (``p99_ttft_ms:
    500``: at most 500, or at least for a maximised one), else within ``tolerance`` (default 10%)
    of the front's best on it. When no trial meets every bound, the one that misses them by the
    least (its largest shortfall relative to the bound) is picked, and the rule's text says so.
``knee``
    The trial nearest the ideal point once every objective is scaled to [0, 1] over the front
    (0 its best value, 1 its worst): the balanced compromise, with no setting.
``first``
    The front's best on the first objective (ties broken by the next ones): a lexicographic order.

Ties are broken by the lower trial number, so a pick is reproducible. Everything here is pure:
values in, trial numbers out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from autotune.util.text import counted

Direction = Literal["maximize", "minimize"]
RuleName = Literal["bound", "knee", "first"]
RULES: tuple[str, ...] = ("bound", "knee", "first")
DEFAULT_TOLERANCE = 0.10


@dataclass(frozen=True)
class Goal:
    """One objective: a metric and whether higher or lower is better."""

    metric: str
    direction: Direction

    def to_json(self) -> dict[str, str]:
        return {"metric": self.metric, "direction": self.direction}


@dataclass(frozen=True)
class ChoiceRule:
    """How a front is reduced to the one trial exported (module docstring)."""

    rule: RuleName = "bound"
    tolerance: float = DEFAULT_TOLERANCE
    bounds: Mapping[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"rule": self.rule}
        if self.rule == "bound":
            out["tolerance"] = self.tolerance
            if self.bounds:
                out["bounds"] = dict(self.bounds)
        return out

    @classmethod
    def from_json(cls, data: object) -> ChoiceRule:
        """The rule stored by :meth:`to_json` (anything unreadable: the default rule)."""
        if not isinstance(data, Mapping) or data.get("rule") not in RULES:
            return cls()
        bounds = data.get("bounds") if isinstance(data.get("bounds"), Mapping) else {}
        tol = data.get("tolerance", DEFAULT_TOLERANCE)
        return cls(data["rule"], float(tol) if isinstance(tol, (int, float)) else DEFAULT_TOLERANCE,
                   {str(k): float(v) for k, v in bounds.items() if isinstance(v, (int, float))})  # type: ignore[union-attr]

    @classmethod
    def parse(cls, text: str, default: ChoiceRule | None = None) -> ChoiceRule:
        """``bound``, ``bound:0.05`` (a relative tolerance), ``knee`` or ``first``, as given to
        ``autotune export --choose``; ``bound`` alone keeps ``default``'s bounds and tolerance.

        Raises:
            ValueError: one line naming what is wrong.
        """
        name, _, arg = text.strip().partition(":")
        if name not in RULES:
            raise ValueError(f"unknown rule '{text}' (expected bound, bound:TOLERANCE, knee or first)")
        if name != "bound":
            if arg:
                raise ValueError(f"rule '{name}' takes no value (got '{text}')")
            return cls(name)  # type: ignore[arg-type]
        base = default if default is not None and default.rule == "bound" else cls()
        if not arg:
            return base
        try:
            tol = float(arg)
        except ValueError:
            raise ValueError(f"rule '{text}': the tolerance '{arg}' is not a number (e.g. bound:0.05)") from None
        if not (math.isfinite(tol) and 0 <= tol <= 10):
            raise ValueError(f"rule '{text}': the tolerance must be between 0 and 10 (0.05: within 5%)")
        return cls("bound", tol, {})


@dataclass(frozen=True)
class Choice:
    """The trial a rule picked from a front, and a sentence that says how."""

    number: int
    front: tuple[int, ...]
    rule: ChoiceRule
    text: str

    def to_json(self) -> dict[str, object]:
        return {**self.rule.to_json(), "text": self.text, "trial": self.number, "front": list(self.front)}


Point = tuple[int, Sequence[float]]
"""A trial number and its objective values, in the goals' order."""


def _signed(values: Sequence[float], goals: Sequence[Goal]) -> list[float]:
    """Values turned so that lower is better on every objective."""
    return [v if g.direction == "minimize" else -v for v, g in zip(values, goals)]


def dominates(a: Sequence[float], b: Sequence[float], goals: Sequence[Goal]) -> bool:
    """Whether values ``a`` are at least as good as ``b`` on every objective and better on one."""
    sa, sb = _signed(a, goals), _signed(b, goals)
    return all(x <= y for x, y in zip(sa, sb)) and any(x < y for x, y in zip(sa, sb))


def front(points: Sequence[Point], goals: Sequence[Goal]) -> list[Point]:
    """The non-dominated points, by trial number (trials with equal values are all kept)."""
    kept = [p for p in points if not any(dominates(q[1], p[1], goals) for q in points if q is not p)]
    return sorted(kept, key=lambda p: p[0])


def _fmt(x: float) -> str:
    return f"{x:.4g}"


def _best(points: Sequence[Point], goals: Sequence[Goal], first: int = 0) -> Point:
    """The point best on objective ``first``, then on the others in order, then lowest number."""
    order = [first] + [i for i in range(len(goals)) if i != first]
    return min(points, key=lambda p: (*(_signed([p[1][i]], [goals[i]])[0] for i in order), p[0]))


def choose(points: Sequence[Point], goals: Sequence[Goal], rule: ChoiceRule) -> Choice:
    """The trial of the front of ``points`` that ``rule`` picks (see the module docstring).

    Raises:
        ValueError: no points.
    """
    if not points:
        raise ValueError("no feasible trial to choose from")
    pf = front(points, goals)
    numbers = tuple(p[0] for p in pf)
    n = f"{counted(len(pf), 'trial')} on the Pareto front"
    head = goals[0].metric
    if rule.rule == "first":
        pick = _best(pf, goals)
        return Choice(pick[0], numbers, rule, f"first: the best {head} on the front ({n})")
    if rule.rule == "knee":
        lo = [min(_signed(p[1], goals)[i] for p in pf) for i in range(len(goals))]
        hi = [max(_signed(p[1], goals)[i] for p in pf) for i in range(len(goals))]

        def distance(p: Point) -> float:
            s = _signed(p[1], goals)
            return math.sqrt(sum(((s[i] - lo[i]) / (hi[i] - lo[i])) ** 2 for i in range(len(goals)) if hi[i] > lo[i]))

        pick = min(pf, key=lambda p: (distance(p), p[0]))
        return Choice(pick[0], numbers, rule, "knee: the trial nearest the ideal point, each objective scaled to "
                                              f"[0, 1] over the front ({n})")
    # bound: each other objective within its absolute bound, or within the tolerance of the front's best
    limits: list[tuple[int, float, str]] = []
    for i, g in enumerate(goals[1:], start=1):
        if g.metric in rule.bounds:
            limit = float(rule.bounds[g.metric])
            limits.append((i, limit, f"{g.metric} {'<=' if g.direction == 'minimize' else '>='} {_fmt(limit)}"))
        else:
            best = _best(pf, goals, i)[1][i]
            gap = rule.tolerance * abs(best)
            limit = best + gap if g.direction == "minimize" else best - gap
            limits.append((i, limit, f"{g.metric} within {100 * rule.tolerance:g}% of the front's best "
                                     f"{_fmt(best)} ({'<=' if g.direction == 'minimize' else '>='} {_fmt(limit)})"))

    def shortfall(p: Point) -> float:
        """How far ``p`` misses its worst bound, relative to the bound (0: meets them all)."""
        worst = 0.0
        for i, limit, _ in limits:
            v = p[1][i]
            miss = v - limit if goals[i].direction == "minimize" else limit - v
            worst = max(worst, miss / (abs(limit) or 1.0))
        return worst

    within = [p for p in pf if shortfall(p) <= 0]
    said = "; ".join(text for _, _, text in limits)
    if within:
        pick = _best(within, goals)
        return Choice(pick[0], numbers, rule, f"bound: the best {head} on the front among its trials with {said} "
                                              f"({len(within)} of {n})")
    pick = min(pf, key=lambda p: (shortfall(p), p[0]))
    return Choice(pick[0], numbers, rule, f"bound: no trial on the front has {said}; the one nearest to it "
                                          f"({n})")


__all__ = ["Choice", "ChoiceRule", "DEFAULT_TOLERANCE", "Goal", "RULES", "choose", "dominates", "front"]
