"""The crash rules as reported: :class:`FailureRule`, :class:`OneConfiguration`, :class:`RuleReport`.

Each prints as ``study explain`` shows it and gives the JSON ``study explain --json`` writes;
:func:`autotune.analysis.crash_rules.failure_rules` makes them. The steps cited below are those
of :mod:`autotune.analysis.crash_rules`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from autotune.analysis.conditions import Condition, show_value
from autotune.config.derived import DERIVED


@dataclass
class FailureRule:
    """``conditions`` held in ``covered`` finished trials, ``failed`` of which failed with ``kind``.

    ``trials``: the failures attributed to this rule (each failure to one rule); ``other_failures``:
    covered trials that failed with another kind; ``p_value``: the chance of at least ``failed``
    failures of ``kind`` among the covered trials that could show it, drawn at random from the
    study's (its failures, successes, failures later in a trial); ``confounded_with``: conditions
    on other parameters that every one of those failures also had and no more trials refute (a
    confound the data cannot resolve: the rule is one of them).
    """

    conditions: tuple[Condition, ...]
    kind: str
    failed: int
    covered: int
    trials: list[int] = field(default_factory=list)
    other_failures: int = 0
    p_value: float = 1.0
    confounded_with: list[Condition] = field(default_factory=list)
    as_sure: list[Condition] = field(default_factory=list)
    """Conditions on other parameters the cover would have taken as surely at the step that took
    this rule, over other failures of its kind: the data does not choose between them (step 6)."""
    named: bool = False
    """The rule rests on the engine's error naming its setting (step 0)."""
    scope: list[Condition] = field(default_factory=list)
    """Where the rule was shown: on its own thresholds, how far the trials it was judged on got
    to where its kind happens (:func:`~autotune.analysis.crash_rules.rule_reach`); on parameters
    monotone for its kind, the side those trials held and other trials of the study did not
    (:func:`~autotune.analysis.crash_rules.rule_scope`)."""

    @property
    def condition(self) -> str:
        return " & ".join(str(c) for c in self.conditions)

    def __str__(self) -> str:
        named = "; the error names it" if self.named else ""
        scope = f"; shown only with {', '.join(str(c) for c in self.scope)}" if self.scope else ""
        return f"{self.condition} -> {self.kind} ({self.failed} of {self.covered}{named}{scope})"

    def to_json(self) -> dict[str, Any]:
        return {
            "rule": str(self),
            "condition": self.condition,
            "conditions": [c.to_json() for c in self.conditions],
            "kind": self.kind,
            "support": {"failed": self.failed, "covered": self.covered},
            "other_failures": self.other_failures,
            "trials": list(self.trials),
            "p_value": float(f"{self.p_value:.3g}"),
            "named_by_error": self.named,
            "confounded_with": [str(c) for c in self.confounded_with],
            "confounded_conditions": [c.to_json() for c in self.confounded_with],
            "as_sure": [str(c) for c in self.as_sure],
            "as_sure_conditions": [c.to_json() for c in self.as_sure],
            "scope": [str(c) for c in self.scope],
            "scope_conditions": [c.to_json() for c in self.scope],
            "derived": {c.param: DERIVED[c.param].meaning for c in (*self.conditions, *self.confounded_with, *self.as_sure)
                        if c.param in DERIVED},
        }


@dataclass
class OneConfiguration:
    """Failures of one kind that no rule explains, at one setting of every parameter but one
    (a probe of ``param`` around one configuration, say): what fails *there*, not a rule (step
    2). ``failed``: the values of ``param`` that failed with ``kind``; ``ran``: those measured at
    the same setting of the rest; ``trials``: the failures."""

    kind: str
    param: str
    failed: list[Any]
    ran: list[Any]
    trials: list[int]

    def __str__(self) -> str:
        ran = f"; {', '.join(map(show_value, self.ran))} ran" if self.ran else ""
        return (f"at one configuration (trial {self.trials[0]}'s, the rest unchanged): {self.param} "
                f"{', '.join(map(show_value, self.failed))} failed ({self.kind}){ran}: what fails there, not a rule")

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "param": self.param, "failed": self.failed, "ran": self.ran, "trials": self.trials,
                "text": str(self)}


@dataclass
class RuleReport:
    """The rules, the failures no rule explains (trial numbers per kind), and those of them that
    came at one configuration (:class:`OneConfiguration`)."""

    rules: list[FailureRule]
    unexplained: dict[str, list[int]]
    finished: int
    at_one_configuration: list[OneConfiguration] = field(default_factory=list)

    def unexplained_json(self) -> dict[str, Any]:
        trials = sorted(n for ns in self.unexplained.values() for n in ns)
        return {"count": len(trials), "trials": trials,
                "kinds": {k: len(v) for k, v in sorted(self.unexplained.items()) if v},
                "at_one_configuration": [c.to_json() for c in self.at_one_configuration]}


__all__ = ["FailureRule", "OneConfiguration", "RuleReport"]
