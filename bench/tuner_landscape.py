"""How rare a near-optimal configuration is on a scenario: random configurations of a space
through the noise-free model (`autotune.bench.setups.Evaluator`), the shares that are feasible and
that reach 90% and 95% of the optimum (`autotune.bench.optimum.find_optimum`), and the range of each
parameter among those reaching 90%. With ``--neighbours K``, also how much of the optimum's
neighbourhood fails: K configurations that take 1 (then 3) parameters of the optimum from a random
configuration, the rest kept, and the share of them infeasible -- the failure rate a search that
has found the optimum meets when it looks around it. docs/BENCHMARKS.md quotes both for the
built-in scenarios.

    python bench/tuner_landscape.py rtx6000-pcie-kimi-eagle3 4000 [--neighbours 1000] [--space sglang_nccl] [--objective quick]
"""

from __future__ import annotations

import argparse
import collections
import random
import warnings

import optuna

from autotune.bench.optimum import find_optimum
from autotune.bench.setups import Evaluator, Setup


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scenario")
    ap.add_argument("configurations", type=int)
    ap.add_argument("--space", default="sglang_nccl")
    ap.add_argument("--objective", default="quick")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--neighbours", type=int, default=0, metavar="K",
                    help="also the infeasible share of K neighbours of the optimum (1 and 3 parameters changed)")
    a = ap.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore")
    setup = Setup(a.scenario, a.space, a.objective, None)
    opt, ev = find_optimum(setup), Evaluator(setup)
    sampler = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=a.seed))
    dists = setup.space.distributions()
    rows = []
    for _ in range(a.configurations):
        params = ev.space.applied(sampler.ask(dists).params)
        value = ev.value(params)
        rows.append((params, None if value is None else value / opt.value))
    n = len(rows)
    feasible = [r for r in rows if r[1] is not None]
    good = [p for p, r in feasible if r >= 0.9]
    print(f"{a.scenario}: {len(feasible)} of {n} feasible, {len(good)} reach 90% of the optimum "
          f"({opt.value:.1f}), {sum(r >= 0.95 for _, r in feasible)} reach 95%")
    for name in dists:
        values = [p[name] for p in good]
        if not values:
            continue
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            print(f"  {name}: {min(values)} .. {max(values)}")
        else:
            print(f"  {name}: {dict(collections.Counter(map(str, values)))}")
    rng = random.Random(a.seed)
    for changed in (1, 3) if a.neighbours else ():
        failed = 0
        for _ in range(a.neighbours):
            other = sampler.ask(dists).params
            names = rng.sample(sorted(dists), changed)
            failed += ev.value({**opt.params, **{n: other[n] for n in names}}) is None
        print(f"  neighbours of the optimum with {changed} parameter(s) drawn at random: "
              f"{failed} of {a.neighbours} infeasible ({failed / a.neighbours:.0%})")


if __name__ == "__main__":
    main()
