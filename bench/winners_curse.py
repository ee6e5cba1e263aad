"""How far the reported best is from its true value under the study's confirmation procedure.

A Monte Carlo of what ``budget.confirm`` does at its defaults (autotune/confirmation.py): a study
has measured ``N`` configurations once each at relative noise ``NOISE``; the top 3 by their
single measurement are measured again to 3 measurements each; the best is reported. The true
values are ``1 - |normal(0, spread)|``, so ``spread`` sets how close the rivals are. Printed per
spread, the median relative error of the reported figure under two rules: the best by the mean
of all three measurements, reported as that mean (what ``study best`` did before 2026-12-02); and
the best by the mean of its two confirmation runs, reported as that mean (what it does now:
:class:`autotune.study_view.Measured` leaves out the first run, the one that made the
configuration a candidate)::

    python bench/winners_curse.py            # 4000 studies per spread, seed 0
"""

from __future__ import annotations

import sys

import numpy as np

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


def main(argv: list[str]) -> int:
    reps = int(argv[0]) if argv else 4000
    rng = np.random.default_rng(0)
    print("spread  all-runs  confirmation-only")
    for spread in (0.005, 0.01, 0.03, 0.08):
        a, f = errors(spread, reps, rng)
        print(f"{spread:<7g} {a:8.2%}  {f:8.2%}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
