"""The scores of `autotune bench tuner`, per study and over the seeds.

Per study (a :class:`~autotune.bench.study_trace.StudyTrace`):

- *best / optimum after n trials* (n in :data:`CHECKPOINTS`): the study's best trial by its
  **measured** value (what ``study best`` reports), re-predicted without noise, over the optimum
  (:func:`~autotune.bench.optimum.find_optimum`); 0 while no trial was feasible;
- *trials and GPU-hours to p%* (p in :data:`TARGETS`): the first trial (and the simulated
  GPU-hours spent up to and including it: each trial's
  :class:`~autotune.bench.model_executor.ModelExecutor` cost x the scenario's GPUs) after which
  that score is >= p; a study that never gets there within its budget counts as not reached
  (infinite);
- *infeasible share*: infeasible trials over all trials, and over the trials after the
  :data:`AFTER`-th and the :data:`WARM_AFTER`-th;
- *stopped share* and *GPU-hours saved*: trials whose load stopped early
  (:mod:`autotune.execution.early_stop`; a stopped trial costs its simulated time until it
  stopped) over all trials, and the GPU-hours their whole loads would have cost more
  (``TrialCost.full_seconds``), in hours and as a share of what the study would have cost.

Over the seeds (:func:`summarize`): median and quartiles (:func:`quartiles`: linear
interpolation; a quartile that falls on a run that never reached is infinite, ``null`` in
JSON), and how many runs reached.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from autotune.bench.study_trace import StudyTrace

CHECKPOINTS = (10, 20, 40)
"""Trial counts after which best / optimum is reported."""
TARGETS = (0.90, 0.95, 0.98)
"""Fractions of the optimum whose trials and GPU-hours are reported."""
AFTER = 10
"""The infeasible share is also reported over the trials after this many."""
WARM_AFTER = 5
"""... and after this many (a warm start's goal)."""


def quartiles(values: Sequence[float]) -> dict[str, float | None]:
    """Median and quartiles (linear interpolation between order statistics); an infinite value
    (a run that never reached) makes a quantile that touches it ``None``."""
    xs = sorted(values)

    def q(p: float) -> float | None:
        if not xs:
            return None
        pos = p * (len(xs) - 1)
        lo, hi = math.floor(pos), math.ceil(pos)
        frac = pos - lo
        a, b = xs[lo], xs[hi]
        if math.isinf(a) or (frac > 0 and math.isinf(b)):
            return None
        return a + (b - a) * frac

    return {"q1": q(0.25), "median": q(0.5), "q3": q(0.75)}


def _first(values: Sequence[float], target: float) -> int | None:
    """The 1-based index of the first value >= ``target``, or None."""
    for i, v in enumerate(values):
        if v >= target - 1e-12:
            return i + 1
    return None


def summarize(traces: Sequence[StudyTrace], trials: int, gpus: int | Mapping[str, int]) -> dict[str, Any]:
    """The scores of one strategy on one scenario over its runs (see the module docstring);
    ``gpus`` per scenario (a mapping) when the runs are on several."""
    def g(t: StudyTrace) -> int:
        return gpus if isinstance(gpus, int) else gpus[t.scenario]

    out: dict[str, Any] = {"runs": len(traces)}
    out["best_over_optimum_after"] = {str(c): quartiles([t.ratio[min(c, len(t.ratio)) - 1] for t in traces])
                                      for c in CHECKPOINTS if c <= trials}
    out["best_over_optimum_final"] = quartiles([t.ratio[-1] for t in traces])
    out["best_over_optimum_max"] = max(t.ratio[-1] for t in traces)
    to_trials: dict[str, Any] = {}
    to_hours: dict[str, Any] = {}
    for target in TARGETS:
        key = f"{round(target * 100)}"
        firsts = [_first(t.ratio, target) for t in traces]
        reached = sum(f is not None for f in firsts)
        # "at_least": the median with a run that never got there counted at what it spent without
        # getting there (its trials + 1, its GPU-hours): a lower bound on what it needed
        trials_spent = [len(t.ratio) + 1 if f is None else f for t, f in zip(traces, firsts)]
        hours_spent = [sum(t.seconds[:f]) * g(t) / 3600 for t, f in zip(traces, firsts)]  # [:None]: all
        to_trials[key] = {**quartiles([math.inf if f is None else n for f, n in zip(firsts, trials_spent)]),
                          "reached": reached, "at_least": quartiles(trials_spent)["median"]}
        to_hours[key] = {**quartiles([math.inf if f is None else h for f, h in zip(firsts, hours_spent)]),
                         "reached": reached, "at_least": quartiles(hours_spent)["median"]}
    out["trials_to"] = to_trials
    out["gpu_hours_to"] = to_hours
    out["infeasible_share"] = quartiles([sum(t.infeasible) / len(t.infeasible) for t in traces])
    for n in (AFTER, WARM_AFTER):
        after = [t.infeasible[n:] for t in traces if len(t.infeasible) > n]
        out[f"infeasible_share_after_{n}"] = quartiles([sum(a) / len(a) for a in after])
    within = min(40, trials)
    out["never_90"] = {"within": within, "runs": sum(_first(t.ratio[:within], 0.90) is None for t in traces)}
    out["gpu_hours_total"] = quartiles([sum(t.seconds) * g(t) / 3600 for t in traces])
    out["stopped_share"] = quartiles([sum(t.stopped) / len(t.seconds) for t in traces])
    saved = [(sum(t.full_seconds or t.seconds) - sum(t.seconds)) * g(t) / 3600 for t in traces]
    out["gpu_hours_saved"] = quartiles(saved)
    out["gpu_hours_saved_share"] = quartiles([s / (s + sum(t.seconds) * g(t) / 3600) if s > 0 else 0.0
                                              for s, t in zip(saved, traces)])
    out["driver_ms_per_trial"] = quartiles([1000 * sum(t.driver_s) / len(t.driver_s) for t in traces if t.driver_s])
    tail = [t.driver_s[-max(1, len(t.driver_s) // 10):] for t in traces if t.driver_s]
    out["driver_ms_per_trial_last_tenth"] = quartiles([1000 * sum(x) / len(x) for x in tail])
    out["trial_s"] = quartiles([s for t in traces for s in t.seconds])
    errors = [abs(t.reported_over_true - 1) for t in traces if t.reported_over_true is not None]
    out["reported_best_error"] = {**quartiles(errors), "within_2pct": sum(e <= 0.02 for e in errors),
                                  "of": len(errors)}
    out["reported_best_measurements"] = quartiles([float(t.reported_count) for t in traces if t.reported_count])
    out["skipped"] = quartiles([float(t.skipped) for t in traces])
    out["confirmation_runs"] = quartiles([float(t.confirmations) for t in traces])
    return out
