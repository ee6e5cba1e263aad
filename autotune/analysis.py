"""After a study: which parameters mattered, and which values or ranges crash.

Read-only over the storage. ``failure_rules`` finds parameter values (categorical) or ranges
(numeric, above/below a split point) where most trials were infeasible; ``importances`` runs
Optuna's fANOVA over the feasible trials.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import TrialState

from autotune.study_view import TrialView, trial_views


@dataclass(frozen=True)
class FailureRule:
    """``condition`` held in ``total`` trials, of which ``infeasible`` failed (mostly ``kind``)."""

    condition: str
    infeasible: int
    total: int
    kind: str

    def __str__(self) -> str:
        return f"{self.condition}: {self.infeasible}/{self.total} infeasible (mostly {self.kind})"


def _failed(v: TrialView) -> bool:
    return v.outcome == "infeasible" and v.failure_kind != "slo-violated"


def failure_rules(views: list[TrialView], *, min_trials: int = 2, min_rate: float = 0.75) -> list[FailureRule]:
    """Conditions on one parameter under which at least ``min_rate`` of trials failed."""
    rows = [v for v in views if v.outcome in ("ok", "infeasible")]
    if not rows:
        return []
    names = sorted({k for v in rows for k in v.params})
    rules: list[FailureRule] = []
    overall = sum(_failed(v) for v in rows) / len(rows)
    for name in names:
        values = [v.params.get(name) for v in rows]
        numeric = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in values)
        groups: dict[str, list[TrialView]] = {}
        if numeric and len(set(values)) > 3:
            for cut in sorted(set(values))[1:]:
                hi = [v for v in rows if v.params[name] >= cut]
                lo = [v for v in rows if v.params[name] < cut]
                groups[f"{name} >= {cut:g}"] = hi
                groups[f"{name} < {cut:g}"] = lo
        else:
            for v in rows:
                groups.setdefault(f"{name} = {v.params.get(name)}", []).append(v)
        for cond, members in groups.items():
            bad = [v for v in members if _failed(v)]
            if len(members) >= min_trials and len(bad) / len(members) >= min_rate and len(bad) / len(members) > overall:
                kind = Counter(v.failure_kind for v in bad).most_common(1)[0][0] or "?"
                rules.append(FailureRule(cond, len(bad), len(members), kind))
    # Keep the strongest rule per parameter and kind: most trials covered at the highest rate.
    best: dict[tuple[str, str], FailureRule] = {}
    for r in rules:
        key = (r.condition.split()[0], r.kind)
        old = best.get(key)
        if old is None or (r.infeasible / r.total, r.total) > (old.infeasible / old.total, old.total):
            best[key] = r
    return sorted(best.values(), key=lambda r: (-r.infeasible / r.total, -r.total))


def importances(study: optuna.Study) -> dict[str, float]:
    """fANOVA importance of each parameter for the objective over feasible trials ({} if too few)."""
    feasible = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if t.user_attrs.get("feasible")]
    if len(feasible) < 4:
        return {}
    sub = optuna.create_study(direction=study.direction)
    sub.add_trials(feasible)
    try:
        return dict(optuna.importance.get_param_importances(sub))
    except (RuntimeError, ValueError):
        return {}


def explain(study: optuna.Study) -> dict[str, Any]:
    """Outcome counts, failure kinds, failure rules and importances, as one JSON-able document."""
    views = trial_views(study)
    kinds = Counter(v.failure_kind for v in views if v.failure_kind)
    imps = importances(study)
    return {
        "study": study.study_name,
        "trials": len(views),
        "outcomes": dict(Counter(v.outcome for v in views)),
        "failure_kinds": dict(kinds),
        "failure_rules": [str(r) for r in failure_rules(views)],
        "importances": {k: round(v, 4) for k, v in imps.items() if not math.isnan(v)},
    }
