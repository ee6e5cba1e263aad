"""How rare a near-optimal configuration is on a scenario: random configurations of a space
through the noise-free model (`autotune.bench_tuner.Evaluator`), the shares that are feasible and
that reach 90% and 95% of the optimum (`autotune.bench_tuner.find_optimum`), and the range of each
parameter among those reaching 90%. docs/BENCHMARKS.md quotes it for the built-in scenarios.

    python bench/tuner_landscape.py rtx6000-pcie-kimi-eagle3 4000 [--space sglang_nccl] [--objective quick]
"""

from __future__ import annotations

import argparse
import collections
import warnings

import optuna

from autotune.bench_tuner import Evaluator, Setup, find_optimum


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scenario")
    ap.add_argument("configurations", type=int)
    ap.add_argument("--space", default="sglang_nccl")
    ap.add_argument("--objective", default="quick")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore")
    setup = Setup(a.scenario, a.space, a.objective, None)
    opt, ev = find_optimum(setup), Evaluator(setup)
    sampler = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=a.seed))
    dists = setup.space.distributions()
    rows = []
    for _ in range(a.configurations):
        params = ev.applied(sampler.ask(dists).params)
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


if __name__ == "__main__":
    main()
