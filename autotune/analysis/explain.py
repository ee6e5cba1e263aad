"""After a study: which values crash, which parameters matter, and how sure we are.

Read-only over the storage. :func:`explain` returns one JSON-able document; ``autotune study
explain`` prints it, ``autotune report`` and the console's summary read it. Trials of an ablation
(user attr ``ablation``) are left out: they repeat chosen configurations and would count the same
evidence several times.

- Crash rules (:func:`autotune.analysis.crash_rules.failure_rules`; :func:`crash_rules`: their printed
  lines alone): a minimal explanation of the failures, each failure attributed to one rule, each
  rule judged on the trials that could have refuted it, paid for the search over every
  condition, and named with the conditions the data cannot tell from it.
- Importance (:func:`autotune.analysis.importance.importance`): each parameter's share of the objective's
  and of feasibility's variance with a bootstrap interval, and a verdict, from 10 trials on
  (trials stopped early count at their projected value; ``sureness`` says how far the trials
  go); "no measurable effect" only from matched comparisons that the sampler's drift does not
  fake. In a multi-objective study for each objective too (``importance.objectives``, in order;
  ``importance.objective`` is the first's).

The modules' docstrings say how.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import optuna
from optuna.trial import TrialState

from autotune.analysis.conditions import is_number
from autotune.analysis.crash_rules import failure_rules
from autotune.analysis.failure_stages import finished
from autotune.analysis.rule_cover import MIN_SUPPORT, rule_settings
from autotune.analysis.importance import importance, importance_of
from autotune.store.study_view import objectives
from autotune.store.record import TrialRecord, read

MONOTONE_ATTR = "space_monotone"
"""The study user attr with the search space's ``monotone:`` declarations (the driver writes it)."""


# -- the document --------------------------------------------------------------------------------
def analysed_views(study: optuna.Study) -> list[TrialRecord]:
    """The trials the analysis reads: all but ablation runs and trials still waiting in the queue."""
    return [read(t) for t in study.get_trials(deepcopy=False)
            if not t.user_attrs.get("ablation") and t.state != TrialState.WAITING]


def space_monotone(study: optuna.Study) -> dict[str, dict[str, str]]:
    """The search space's ``monotone:`` declarations as the driver stored them with the study
    (:data:`MONOTONE_ATTR`; empty for a study made before they were stored): each crash rule's
    scope is judged by them (:func:`autotune.analysis.crash_rules.rule_scope`)."""
    stored = study.user_attrs.get(MONOTONE_ATTR)
    if not isinstance(stored, dict):
        return {}
    return {str(n): {str(k): str(d) for k, d in kinds.items()} for n, kinds in stored.items() if isinstance(kinds, dict)}


def space_bounds(study: optuna.Study) -> dict[str, tuple[float, float]]:
    """Each numeric parameter's range as the study's finished trials were given it (Optuna's
    intersection search space of their distributions; a categorical parameter whose choices are
    all numbers spans them): a crash rule's threshold is said to be shown only up to the value its
    trials reached when the space goes further (:func:`autotune.analysis.crash_rules.rule_reach`)."""
    trials = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
    out: dict[str, tuple[float, float]] = {}
    for name, dist in optuna.search_space.intersection_search_space(trials, include_pruned=True).items():
        if isinstance(dist, (optuna.distributions.IntDistribution, optuna.distributions.FloatDistribution)):
            out[name] = (float(dist.low), float(dist.high))
        elif isinstance(dist, optuna.distributions.CategoricalDistribution) and all(is_number(c) for c in dist.choices):
            out[name] = (float(min(dist.choices)), float(max(dist.choices)))  # type: ignore[type-var]
    return out


def last_projected(study: optuna.Study) -> dict[int, float]:
    """Each PRUNED trial's last intermediate value, by number: a trial stopped early reports its
    projected value at each tenth of its load (:mod:`autotune.execution.early_stop`)."""
    return {t.number: float(t.intermediate_values[max(t.intermediate_values)])
            for t in study.get_trials(deepcopy=False, states=(TrialState.PRUNED,)) if t.intermediate_values}


def crash_rules(study: optuna.Study) -> list[str]:
    """The study's crash rules as ``study explain`` prints them (``NCCL_ALGO=Tree -> nccl-error
    (4 of 4)``), in its order; the rules alone, without the importances' bootstrap, so cheap enough
    for the end of every study."""
    return [str(r) for r in failure_rules(analysed_views(study), space_monotone(study), space_bounds(study)).rules]


def explain(study: optuna.Study) -> dict[str, Any]:
    """Outcome counts, failure kinds, crash rules and importances, as one JSON-able document."""
    views = analysed_views(study)
    report = failure_rules(views, space_monotone(study), space_bounds(study))
    kinds = Counter(v.failure_kind for v in views if v.failure_kind and v.outcome != "skipped")  # those that ran
    imp = importance(views, last_projected(study))
    goals = objectives(study)
    if len(goals) > 1:  # a multi-objective study: ``objective`` is the first's, ``objectives`` each one's
        measured = [v for v in finished(views) if v.outcome == "ok" and v.values is not None]
        imp["objectives"] = [{"metric": g.metric, "direction": g.direction,
                              **importance_of([v.params for v in measured],
                                              [v.values[i] for v in measured if v.values is not None], relative=True)}
                             for i, g in enumerate(goals)]
    objective = study.user_attrs.get("objective") or {}
    return {
        "study": study.study_name,
        "trials": len(views),
        "finished": report.finished,
        "outcomes": dict(Counter(v.outcome for v in views)),
        "failure_kinds": dict(kinds),
        "failure_rules": [r.to_json() for r in report.rules],
        "unexplained_failures": report.unexplained_json(),
        "rule_settings": rule_settings(),
        "metric": objective.get("metric"),
        "importance": imp,
    }


__all__ = ["MIN_SUPPORT", "MONOTONE_ATTR", "analysed_views", "crash_rules", "explain", "failure_rules", "importance",
           "importance_of", "last_projected", "space_bounds", "space_monotone"]
