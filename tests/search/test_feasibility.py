"""The memory-failure classifier the default sampler consults (autotune.search.feasibility): a logistic
boundary fitted to the trials that ran and those that failed."""

from __future__ import annotations

import random

from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from autotune.search.feasibility import MIN_FAILED, MIN_RAN, FeasibilityModel

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
    failed = [("nccl-error", {"mem": 0.52 + 0.05 * i, "graph": 20 + 60 * i, "algo": "Tree"}) for i in range(3)]
    model = FeasibilityModel(SPACE).fit(ran, failed)
    assert model.kinds == ("nccl-error",)
    assert model.chance({"mem": 0.6, "graph": 64, "algo": "Tree"}) > 0.7
    assert model.chance({"mem": 0.6, "graph": 64, "algo": "Ring"}) < 0.3


def test_too_few_failures_or_runs_give_no_model() -> None:
    ran, failed = _trials(40)
    few = FeasibilityModel(SPACE).fit(ran, failed[:MIN_FAILED - 1])
    assert few.kinds == () and few.chance({"mem": 0.95, "graph": 512, "algo": "unset"}) == 0.0
    assert FeasibilityModel(SPACE).fit(ran[:MIN_RAN - 1], failed).kinds == ()
    # a configuration without every parameter of the space is left out, not guessed
    assert FeasibilityModel(SPACE).fit(ran, failed).chance({"mem": 0.95}) == 0.0


MONOTONE = {"mem": {"oom": "up"}, "graph": {"oom": "up"}}


def test_a_declared_direction_holds_the_fit_to_it() -> None:
    # one OOM at a small fraction with a large graph batch; the runs at larger fractions had
    # smaller batches: a free fit reads "a larger fraction is safer"
    ran = [{"mem": m, "graph": g, "algo": "unset"} for m, g in
           [(0.9, 300), (0.85, 350), (0.6, 100), (0.5, 60), (0.7, 200), (0.8, 120)]]
    failed = [("oom", {"mem": 0.55, "graph": 480, "algo": "unset"})]
    free = FeasibilityModel(SPACE).fit(ran, failed)
    signed = FeasibilityModel(SPACE, MONOTONE).fit(ran, failed)
    big = [{"mem": m / 100, "graph": 480, "algo": "unset"} for m in range(50, 96, 5)]
    assert free.chance(big[-1]) < 0.3 < free.chance(big[1])  # the free fit turns the declared direction around
    chances = [signed.chance(p) for p in big]
    assert all(b >= a - 1e-9 for a, b in zip(chances, chances[1:]))  # not with the declaration
    assert signed.chance(big[-1]) > 0.5
    assert signed.chance({"mem": 0.95, "graph": 16, "algo": "unset"}) < 0.3
    # a kind the declaration does not name is fitted freely
    assert FeasibilityModel(SPACE, {"mem": {"not-enough-memory": "down"}}).fit(ran, failed).chance(big[-1]) == free.chance(big[-1])


def test_one_failure_is_enough_for_a_model_beside_a_few_runs() -> None:
    ran = [{"mem": 0.5 + 0.05 * i, "graph": 8 + 20 * i, "algo": "unset"} for i in range(MIN_RAN)]
    failed = [("oom", {"mem": 0.9, "graph": 400, "algo": "unset"})]
    model = FeasibilityModel(SPACE, MONOTONE).fit(ran, failed)
    assert model.kinds == ("oom",)
    assert model.chance({"mem": 0.92, "graph": 450, "algo": "Ring"}) > model.chance({"mem": 0.55, "graph": 16, "algo": "Ring"})
