"""Ablation: which of the best trial's changes earned its gain over the baseline.

:func:`plan` lists the runs: the baseline and the best configuration again, and the best with
each changed parameter reverted to its baseline value, one at a time, in ``repeats`` rounds.
They run as ordinary trials of the same study (enqueued, tagged with the user attr
``ablation = {"run", "label"}``), so they are measured, recorded and shown like any other trial.
:func:`analyse` then reads them back: a parameter's share of the gain is
``(best - best with it reverted) / (best - baseline)``, with a 95% Student-t interval from the
repeats; a revert that makes the server fail is reported with its failure kind. Shares need
not add up to 1: parameters interact.
"""

from __future__ import annotations

import datetime
import math
import statistics
import uuid
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.util.stats import t95
from autotune.errors import UsageError
from autotune.store.study_view import best_view
from autotune.store.record import Outcome, is_feasible_measurement, read

ABLATION_ATTR = "ablation"
"""Trial user attr ``{"run", "label"}`` of an ablation run; study user attr: the last analysis."""
INTERVAL = 0.95


@dataclass(frozen=True)
class Run:
    """One trial to run: ``label`` is ``baseline``, ``best`` or ``revert:<param>``."""

    label: str
    params: dict[str, Any]


def _baseline_trial(study: optuna.Study) -> FrozenTrial:
    feasible = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                if t.user_attrs.get("baseline") and is_feasible_measurement(t)]
    if not feasible:
        raise UsageError(f"study '{study.study_name}' has no measured baseline trial to ablate against")
    return feasible[0]


def _best_trial(study: optuna.Study) -> FrozenTrial:
    """The study's best trial, as ``study best`` and ``export`` choose it."""
    best = best_view(study)
    if best is None:
        raise UsageError(f"study '{study.study_name}' has no feasible trial to ablate")
    return study.trials[best.number]


def plan(study: optuna.Study, repeats: int) -> tuple[str, list[Run], FrozenTrial, FrozenTrial]:
    """The runs of a new ablation of ``study``'s best trial: ``(run id, runs, best, baseline)``.

    Raises:
        UsageError: no measured baseline, no feasible trial, the best is the baseline, or the
            study is multi-objective (a gain is one objective's).
    """
    if len(study.directions) > 1:
        raise UsageError(f"study '{study.study_name}' is multi-objective: an ablation attributes one objective's "
                         "gain (single-objective studies only)")
    base, best = _baseline_trial(study), _best_trial(study)
    changed = [k for k in best.params if base.params.get(k) != best.params[k]]
    if not changed:
        raise UsageError(f"study '{study.study_name}': the best trial ({best.number}) is the baseline's "
                         "configuration; there is no gain to attribute")
    runs = [Run("baseline", dict(base.params)), Run("best", dict(best.params))]
    runs += [Run(f"revert:{k}", {**best.params, k: base.params[k]}) for k in changed if k in base.params]
    # In rounds (every run once, then again), not each run's repeats back to back: on several
    # slots, back-to-back repeats run at the same time as each other, so a load on the host biases
    # all of them alike and their spread does not show it; in rounds each repeat meets other company.
    return uuid.uuid4().hex[:12], [r for _ in range(repeats) for r in runs], best, base


def enqueue(study: optuna.Study, run_id: str, runs: list[Run]) -> None:
    """Enqueue ``runs`` as trials tagged with ``run_id``."""
    for r in runs:
        study.enqueue_trial(r.params, user_attrs={ABLATION_ATTR: {"run": run_id, "label": r.label}})


def _interval(best: list[float], other: list[float], gain: float) -> tuple[float | None, float | None]:
    """95% interval of ``(mean(best) - mean(other)) / gain``: Student's t on the difference of
    the two means (pooled variance, ``n_best + n_other - 2`` degrees of freedom), the gain taken
    as measured. None with fewer than two measurements on either side (no spread to go by)."""
    nb, no = len(best), len(other)
    if nb < 2 or no < 2 or not gain:
        return None, None
    mb, mo = statistics.fmean(best), statistics.fmean(other)
    pooled = ((nb - 1) * statistics.variance(best) + (no - 1) * statistics.variance(other)) / (nb + no - 2)
    half = t95(nb + no - 2) * math.sqrt(pooled * (1 / nb + 1 / no))
    ends = ((mb - mo - half) / gain, (mb - mo + half) / gain)
    return min(ends), max(ends)


def analyse(study: optuna.Study, run_id: str, best: FrozenTrial, base: FrozenTrial) -> dict[str, Any]:
    """The ablation ``run_id`` as a JSON-able document (also what ``study ablate --json`` prints).

    Raises:
        UsageError: the baseline or the best configuration was not measured in this run.
    """
    groups: dict[str, list[FrozenTrial]] = {}
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)):
        tag = t.user_attrs.get(ABLATION_ATTR)
        if isinstance(tag, dict) and tag.get("run") == run_id:
            groups.setdefault(str(tag.get("label")), []).append(t)

    def values(label: str) -> list[float]:
        return [float(t.value) for t in groups.get(label, []) if is_feasible_measurement(t)]  # type: ignore[arg-type]

    best_v, base_v = values("best"), values("baseline")
    if not best_v or not base_v:
        raise UsageError("the ablation did not measure both the baseline and the best configuration "
                         "(see `autotune study show`)")
    gain = statistics.fmean(best_v) - statistics.fmean(base_v)
    bv, zv = read(best), read(base)
    rows = []
    for label, trials in groups.items():
        if not label.startswith("revert:"):
            continue
        name = label.removeprefix("revert:")
        got = values(label)
        failed = [str(r.failure_kind or r.outcome) for r in map(read, trials) if r.outcome is not Outcome.OK]
        row: dict[str, Any] = {"parameter": name, "best": best.params.get(name), "baseline": base.params.get(name),
                               "trials": [t.number for t in trials], "measured": len(got), "failed": failed}
        if got:
            mean = statistics.fmean(got)
            lo, hi = _interval(best_v, got, gain)
            row |= {"mean": round(mean, 4), "share": round((statistics.fmean(best_v) - mean) / gain, 4) if gain else None,
                    "share_low": None if lo is None else round(lo, 4), "share_high": None if hi is None else round(hi, 4)}
        rows.append(row)
    rows.sort(key=lambda r: (r.get("share") is None, -(r.get("share") or 0.0)))
    return {
        "run": run_id,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "best_trial": best.number,
        "baseline_trial": base.number,
        "best_mean": round(statistics.fmean(best_v), 4),
        "best_n": len(best_v),
        "baseline_mean": round(statistics.fmean(base_v), 4),
        "baseline_n": len(base_v),
        "gain": round(gain, 4),
        "interval": INTERVAL,
        "applied_best": bv.params,
        "applied_baseline": zv.params,
        "parameters": rows,
    }
