"""The best configuration against the baseline, metric by metric: what the report opens with.

Contracts:

- :func:`compare` gives one row per metric the best's runs recorded: the objective's metric first,
  then throughputs, then TTFT/TPOT/ITL/E2E latency (mean, median, p99), then the rest by name.
- The best's figures are ``study best --json``'s: ``value`` and ``metrics`` (the mean of the runs
  after the first where the configuration was measured again); the objective's interval is its
  ``measurements.interval95``, another metric's the t-interval of the same runs (where there are two
  or more). The baseline's are the same figures of the baseline's configuration.
- The change is :func:`autotune.util.versus.versus_text`: a worse figure reads "worse" in a
  minimize study too; a metric's direction is the study's for an objective, else its unit's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from autotune.store.record import TrialRecord
from autotune.store.study_view import best_of, measured_configs
from autotune.util.stats import mean_interval
from autotune.util.units import unit_of
from autotune.util.versus import higher_is_better, versus_text

_RATES = ("output_throughput", "total_throughput", "input_throughput", "request_throughput")
_LATENCIES = tuple(f"{stat}_{what}_ms" for what in ("ttft", "tpot", "itl", "e2e_latency")
                   for stat in ("mean", "median", "p99"))


def metric_order(names: Sequence[str], first: Sequence[str] = ()) -> list[str]:
    """``names`` in the table's order: ``first`` (the objectives), the throughputs, the latencies
    (mean, median, p99 of TTFT, TPOT, ITL, E2E), then the rest by name."""
    known = [*first, *_RATES, *_LATENCIES]
    out = [n for n in dict.fromkeys(known) if n in names]
    return out + sorted(n for n in names if n not in out)


def _configuration(views: Sequence[TrialRecord], trial: int, maximize: bool) -> TrialRecord | None:
    """The figure of the configuration trial ``trial`` measured, as ``study best`` figures a
    configuration (None when it was not measured)."""
    m = next((c for c in measured_configs(views) if trial in c.trials), None)
    if m is None:
        return None
    return best_of([v for v in views if v.number in m.trials], maximize)


def compare(views: Sequence[TrialRecord], best: TrialRecord, directions: dict[str, str]) -> dict[str, Any]:
    """The best (``best_view``'s record) against the baseline trial of ``views``.

    ``directions``: the objectives' metrics and directions (``{"output_throughput": "maximize"}``).
    Returns ``{"rows", "runs", "baseline", "changed", "note"}``: ``rows`` of ``{"metric", "unit",
    "best", "interval", "baseline", "change"}`` (``interval`` ``[low, high]`` or None); ``runs``: the
    runs the best's figures are the mean of; ``baseline``: the baseline's trial number or None;
    ``changed``: the parameters the best changes from the baseline; ``note``: why there is no
    baseline figure, or "".
    """
    maximize = next(iter(directions.values()), "maximize") == "maximize"
    base_view = next((v for v in views if v.baseline), None)
    base = None if base_view is None else _configuration(views, base_view.number, maximize)
    note = ""
    if base_view is None:
        note = "the study has no baseline trial"
    elif base is None:
        kind = base_view.failure_kind or base_view.outcome
        note = f"the baseline (trial {base_view.number}) was not measured: {kind}"
    runs = list(best.measured.backing_trials) if best.measured is not None else [best.number]
    run_views = [v for v in views if v.number in runs]
    rows = []
    for name in metric_order([k for k, x in best.metrics.items() if isinstance(x, (int, float))], list(directions)):
        interval = None
        if name in directions and best.measured is not None and name == next(iter(directions)):
            interval = best.measured.interval95
        elif len(run_views) > 1 and all(name in v.metrics for v in run_views):
            interval = mean_interval([float(v.metrics[name]) for v in run_views])[2]
        up = directions[name] == "maximize" if name in directions else higher_is_better(name)
        base_value = None if base is None else base.metrics.get(name)
        rows.append({"metric": name, "unit": unit_of(name), "best": float(best.metrics[name]),
                     "interval": None if interval is None else [float(interval[0]), float(interval[1])],
                     "baseline": base_value,
                     "change": "" if best.baseline else versus_text(float(best.metrics[name]), base_value, up)})
    changed = {} if base_view is None else {k: p for k, p in best.params.items() if base_view.params.get(k) != p}
    return {"rows": rows, "runs": runs, "baseline": None if base_view is None else base_view.number,
            "changed": changed, "note": note}
