"""The memory-failure classifier the default sampler consults (autotune.search.feasibility): a logistic
boundary fitted to the trials that ran and those that failed."""

from __future__ import annotations

import random

from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from autotune.search.feasibility import MIN_EACH, FeasibilityModel

SPACE = {"mem": FloatDistribution(0.5, 0.95, step=0.01), "graph": IntDistribution(8, 512, log=True),
         "algo": CategoricalDistribution(["unset", "Ring", "Tree"])}


def _needs(p: dict) -> float:
    """The planted memory: the fraction plus CUDA graphs growing with the batch (linearly, as
    captured graphs do, on a log-scaled parameter); more than 0.85 runs out."""
    return p["mem"] + 0.2 * p["graph"] / 512


def _trials(n: int, seed: int = 3) -> tuple[list[dict], list[tuple[str, dict]]]:
    rng = random.Random(seed)
    ran, failed = [], []
    for _ in range(n):
        p = {"mem": round(rng.uniform(0.5, 0.95), 2), "graph": int(rng.uniform(8, 512)), "algo": rng.choice(["unset", "Ring"])}
        (failed.append(("oom", p)) if _needs(p) > 0.85 else ran.append(p))
    return ran, failed


def test_the_boundary_of_a_sum_of_two_parameters_is_learned() -> None:
    ran, failed = _trials(40)
    model = FeasibilityModel(SPACE).fit(ran, failed)
    assert model.kinds == ("oom",)
    # neither parameter alone draws it: 0.75 runs with a small graph batch, fails with a large one
    assert model.chance({"mem": 0.75, "graph": 500, "algo": "unset"}) > 0.7
    assert model.chance({"mem": 0.75, "graph": 16, "algo": "unset"}) < 0.3
    assert model.chance({"mem": 0.9, "graph": 16, "algo": "Ring"}) > 0.7
    assert model.chance({"mem": 0.55, "graph": 300, "algo": "Ring"}) < 0.3
    # held-out points: the model ranks each failure above each run
    test_ran, test_failed = _trials(60, seed=11)
    worst_ok = max(model.chance(p) for p in test_ran if abs(_needs(p) - 0.85) > 0.05)
    best_bad = min(model.chance(p) for _, p in test_failed if abs(_needs(p) - 0.85) > 0.05)
    assert best_bad > worst_ok


def test_a_choice_that_always_fails_is_a_weight_of_its_own() -> None:
    ran = [{"mem": 0.5 + 0.04 * i, "graph": 8 + 40 * i, "algo": ("unset", "Ring")[i % 2]} for i in range(8)]
    failed = [("nccl-error", {"mem": 0.52 + 0.05 * i, "graph": 20 + 60 * i, "algo": "Tree"}) for i in range(MIN_EACH)]
    model = FeasibilityModel(SPACE).fit(ran, failed)
    assert model.kinds == ("nccl-error",)
    assert model.chance({"mem": 0.6, "graph": 64, "algo": "Tree"}) > 0.7
    assert model.chance({"mem": 0.6, "graph": 64, "algo": "Ring"}) < 0.3


def test_too_few_failures_or_runs_give_no_model() -> None:
    ran, failed = _trials(40)
    few = FeasibilityModel(SPACE).fit(ran, failed[:MIN_EACH - 1])
    assert few.kinds == () and few.chance({"mem": 0.95, "graph": 512, "algo": "unset"}) == 0.0
    assert FeasibilityModel(SPACE).fit(ran[:MIN_EACH - 1], failed).kinds == ()
    # a configuration without every parameter of the space is left out, not guessed
    assert FeasibilityModel(SPACE).fit(ran, failed).chance({"mem": 0.95}) == 0.0
