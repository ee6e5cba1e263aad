"""How far the reported best is from its true value under the study's confirmation procedure.

A Monte Carlo of what ``budget.confirm`` does at its defaults (autotune/study/confirmation.py): a study
has measured ``N`` configurations once each at relative noise ``NOISE``; the top 3 by their
single measurement are measured again to 3 measurements each; the best is reported. The true
values are ``1 - |normal(0, spread)|``, so ``spread`` sets how close the rivals are. Printed per
spread, the median relative error of the reported figure under two rules: the best by the mean
of all three measurements, reported as that mean (what ``study best`` did before 2026-12-02); and
the best by the mean of its two confirmation runs, reported as that mean (what it does now:
:class:`autotune.store.study_view.Measured` leaves out the first run, the one that made the
configuration a candidate).

Then the reported best's 95% interval: how often it holds the true value, and its median
half-width, when the pooled run-to-run noise (:func:`autotune.store.study_view.pooled_noise`) counts
the runs after the first only (what it did before 2026-12-03: with fewer than two such runs
anywhere, the best's own runs' t-interval, or none) or every run of the configurations measured
again (what it does now), for several counts of runs after the first per candidate: ``2 2 2`` is
the default confirmation at full budget, ``2 1 1`` one that the budget cut short::

    python bench/winners_curse.py            # 4000 studies per case, seed 0
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autotune.util.stats import t95  # noqa: E402
from autotune.store.study_view import measured_configs  # noqa: E402
from autotune.store.record import TrialRecord

N = 40
NOISE = 0.02
CANDIDATES = 3
MEASUREMENTS = 3


def errors(spread: float, reps: int, rng: np.random.Generator) -> tuple[float, float]:
    """Median |reported / true - 1| over ``reps`` studies: (all runs, confirmation runs only),
    each rule choosing its best by the mean it reports."""
    e_all, e_fresh = [], []
    for _ in range(reps):
        true = 1 - np.abs(rng.normal(0, spread, N))
        first = true * (1 + rng.normal(0, NOISE, N))
        cand = np.argsort(first)[-CANDIDATES:]
        fresh = true[cand, None] * (1 + rng.normal(0, NOISE, (CANDIDATES, MEASUREMENTS - 1)))
        every = np.concatenate([first[cand, None], fresh], axis=1)
        b = int(np.argmax(every.mean(1)))
        e_all.append(abs(every[b].mean() / true[cand][b] - 1))
        f = int(np.argmax(fresh.mean(1)))
        e_fresh.append(abs(fresh[f].mean() / true[cand][f] - 1))
    return float(np.median(e_all)), float(np.median(e_fresh))


def _pool(runs: list[np.ndarray]) -> tuple[float, int]:
    """Relative squared deviations of the runs after the first from each configuration's own
    mean, summed, and their degrees of freedom (the pool before 2026-12-03)."""
    squares = sum(float(((r / r.mean() - 1) ** 2).sum()) for r in runs if len(r) >= 2)
    return squares, sum(len(r) - 1 for r in runs if len(r) >= 2)


def intervals(spread: float, after: tuple[int, ...], reps: int,
              rng: np.random.Generator) -> dict[str, tuple[float, float, int]]:
    """Coverage of the true value, median half-width (relative) and count of studies with an
    interval, for the best by the mean of its runs after the first: ``after`` runs after the
    first for each candidate, best-ranked first. ``after-first``: the noise pooled over the
    runs after the first (used where it has more degrees of freedom than the best's own runs,
    else the own runs' t-interval); ``every-run``: :func:`autotune.store.study_view.measured_configs`'s
    interval, pooled over every run of each candidate."""
    out: dict[str, list[tuple[bool, float]]] = {"after-first": [], "every-run": []}
    for _ in range(reps):
        true = 1 - np.abs(rng.normal(0, spread, N))
        first = true * (1 + rng.normal(0, NOISE, N))
        cand = np.argsort(first)[::-1][:len(after)]
        fresh = [true[c] * (1 + rng.normal(0, NOISE, k)) for c, k in zip(cand, after)]
        b = int(np.argmax([f.mean() for f in fresh]))
        mean, n, truth = float(fresh[b].mean()), len(fresh[b]), float(true[cand[b]])
        squares, df = _pool(fresh)
        if df > n - 1:
            half = t95(df) * math.sqrt(squares / df) * mean / math.sqrt(n)
        elif n >= 2:
            half = t95(n - 1) * float(fresh[b].std(ddof=1)) / math.sqrt(n)
        else:
            half = math.nan
        if not math.isnan(half):
            out["after-first"].append((abs(mean - truth) <= half, half / mean))
        # what `study best` does now: autotune.store.study_view's own figure and interval
        best = measured_configs([TrialRecord(i, "COMPLETE", "ok", {"c": int(c)}, float(v), {}, None, None)
                                 for i, (c, v) in enumerate([(c, first[c]) for c in cand]
                                                            + [(c, x) for c, f in zip(cand, fresh) for x in f])])[b]
        lo, hi = best.interval95  # type: ignore[misc]
        out["every-run"].append((lo <= truth <= hi, (hi - lo) / 2 / best.mean))
    return {k: (float(np.mean([c for c, _ in v])) if v else math.nan,
                float(np.median([w for _, w in v])) if v else math.nan, len(v)) for k, v in out.items()}


def main(argv: list[str]) -> int:
    reps = int(argv[0]) if argv else 4000
    rng = np.random.default_rng(0)
    print("spread  all-runs  confirmation-only")
    for spread in (0.005, 0.01, 0.03, 0.08):
        a, f = errors(spread, reps, rng)
        print(f"{spread:<7g} {a:8.2%}  {f:8.2%}")
    print("\n95% interval of the best: covered, median half-width; pooled over the runs after the first"
          " (studies with an interval) | over every run")
    print("runs after the first  spread  | after the first          | every run")
    for after in ((2, 2, 2), (2, 1, 1), (1, 1, 1), (2,)):
        for spread in (0.005, 0.03):
            r = intervals(spread, after, reps, rng)
            (c0, w0, n0), (c1, w1, _) = r["after-first"], r["every-run"]
            first = f"{c0:6.1%} {w0:7.2%} ({n0})" if n0 else f"{'no interval':>22s}"
            print(f"{' '.join(map(str, after)):<21s} {spread:<6g}  | {first:<24s} | {c1:6.1%} {w1:7.2%}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
