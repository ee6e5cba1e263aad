"""Failures implied by earlier ones (autotune.search.implied): the rule itself, the space's declarations
checked against the simulator's model, and the driver skipping what an earlier failure implies
(real Driver, real SQLite, the model executor)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autotune.store.record import read
from autotune.bench.setups import Setup
from autotune.analysis.conditions import is_number
from autotune.study.driver import Driver, finished_trials
from autotune.errors import ConfigError
from autotune.search.implied import SKIPPED, implied_failure
from autotune.bench.model_executor import ModelExecutor
from autotune.execution.trial import TrialSpec
from autotune.config.space import SearchSpace
from autotune.store.study_view import show_json

MONO = {"mem": {"oom": "up", "not-enough-memory": "down"}, "graphs": {"oom": "up"}}
OOM_AT = (4, "oom", {"mem": 0.8, "graphs": 256, "algo": "Ring"})


@pytest.mark.parametrize("applied, implied", [
    ({"mem": 0.85, "graphs": 256, "algo": "Ring"}, True),    # more memory for the KV pool: OOM again
    ({"mem": 0.85, "graphs": 512, "algo": "Ring"}, True),    # and more graphs too
    ({"mem": 0.75, "graphs": 256, "algo": "Ring"}, False),   # less: may fit
    ({"mem": 0.85, "graphs": 128, "algo": "Ring"}, False),   # one moved back: unknown
    ({"mem": 0.85, "graphs": 256, "algo": "Tree"}, False),   # another parameter changed
    ({"mem": 0.8, "graphs": 256, "algo": "Ring"}, False),    # the same configuration is measured again
])
def test_an_oom_implies_the_same_oom_beyond_it_and_nothing_else(applied: dict, implied: bool) -> None:
    got = implied_failure(applied, [OOM_AT], MONO)
    assert (got is not None) is implied
    if got is not None:
        assert got.trial == 4 and got.kind == "oom" and "mem 0.85 > 0.8" in got.message()


def test_each_kind_extrapolates_in_its_own_direction() -> None:
    short = (2, "not-enough-memory", {"mem": 0.6, "graphs": 256, "algo": "Ring"})
    assert implied_failure({"mem": 0.55, "graphs": 256, "algo": "Ring"}, [short], MONO) is not None
    assert implied_failure({"mem": 0.65, "graphs": 256, "algo": "Ring"}, [short], MONO) is None
    # graphs are monotone for oom only: a KV-pool shortage says nothing about them
    assert implied_failure({"mem": 0.6, "graphs": 128, "algo": "Ring"}, [short], MONO) is None


def test_a_categorical_with_unset_is_monotone_among_its_numbers() -> None:
    """More draft tokens, more memory: an OOM at 4 implies one at 6, never one at unset (no
    speculation), nor one at 6 from an OOM at unset."""
    mono = {"draft": {"oom": "up"}}
    assert implied_failure({"draft": 6}, [(3, "oom", {"draft": 4})], mono) is not None
    assert implied_failure({"draft": "unset"}, [(3, "oom", {"draft": 4})], mono) is None
    assert implied_failure({"draft": 6}, [(3, "oom", {"draft": "unset"})], mono) is None
    assert SearchSpace.load("sglang_nccl").monotone()["speculative_num_draft_tokens"] == {"oom": "up"}


@pytest.mark.parametrize("extra, fragment", [
    ({"type": "categorical", "choices": ["a", "b"], "monotone": {"oom": "up"}}, "needs a numeric parameter"),
    ({"type": "categorical", "choices": ["unset", 2], "monotone": {"oom": "up"}}, "needs a numeric parameter"),
    ({"type": "int", "low": 1, "high": 8, "monotone": {"out-of-luck": "up"}}, "unknown failure kind 'out-of-luck'"),
    ({"type": "int", "low": 1, "high": 8, "monotone": {"oom": "sideways"}}, "monotone"),
])
def test_bad_monotone_declarations_are_refused(tmp_path: Path, extra: dict, fragment: str) -> None:
    path = tmp_path / "space.yaml"
    path.write_text(json.dumps({"name": "s", "parameters": {"x": {**extra, "flag": "--x"}}}))
    with pytest.raises(ConfigError, match=fragment):
        SearchSpace.load(str(path))


@pytest.mark.parametrize("scenario", ["rtx6000-pcie-glm5", "rtx6000-pcie-kimi-eagle3", "h200-nvlink-llama70b"])
def test_the_built_in_declarations_hold_on_the_simulated_hosts(scenario: str) -> None:
    """sglang_nccl's ``monotone`` declarations, against the simulator's model: a random failing
    configuration, one declared parameter moved beyond its value, fails again (with the same
    kind almost always: a rarer earlier failure may show first)."""
    setup = Setup(scenario, "sglang_nccl", "quick", None)
    space, ex = setup.space, setup.executor(None, ready_timeout_s=float("inf"))
    dists = space.distributions()
    rng = random.Random(5)

    def outcome(params: dict) -> tuple[str, dict]:
        launch = space.to_launch(params)
        r = ex.result(TrialSpec(0, env=launch.env, args=launch.args))
        return (r.failure.kind if r.failure else "ok"), launch.applied

    sampler = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    moved = same = 0
    for _ in range(120):
        kind, applied = outcome(sampler.ask(dists).params)
        for name, directions in space.monotone().items():
            if kind not in directions:
                continue
            d = dists[name]
            if not is_number(applied[name]):
                continue  # a choice such as unset stands apart from the declaration
            values = sorted(c for c in d.choices if is_number(c)) if hasattr(d, "choices") else [  # type: ignore[attr-defined]
                space.parameters[name].normalise(round(d.low + (d.high - d.low) * rng.random(), 2)) for _ in range(4)]
            up = directions[kind] == "up"
            beyond = [v for v in values if (v > applied[name] if up else v < applied[name])][:2]
            for v in beyond:
                kind2, applied2 = outcome({**applied, name: v})
                if applied2 != {**applied, name: v}:
                    continue  # a space rule repaired the move: not the declared case
                moved += 1
                assert kind2 != "ok", (name, kind, applied, v)
                same += kind2 == kind
    assert moved >= 5  # the H200 host rarely runs out of memory
    assert same >= 0.95 * moved


def test_the_driver_skips_an_implied_oom_without_launching_it(tmp_path: Path) -> None:
    setup = Setup("rtx6000-pcie-kimi-eagle3", "sglang_nccl", "quick", None)  # its defaults OOM (0.85)
    cfg = setup.config(name="skips", storage=f"sqlite:///{tmp_path}/s.db", sampler="tpe", seed=1, trials=3)
    ex = ModelExecutor.for_target(cfg, setup.objective, seed=1)
    defaults = setup.space.complete({})
    driver = Driver(cfg, setup.space, setup.objective, ex, trials=3)
    study = driver.open_study()
    study.enqueue_trial({**defaults, "mem_fraction_static": 0.9})   # implied by the baseline's OOM
    study.enqueue_trial({**defaults, "mem_fraction_static": 0.5})   # below it: launched
    driver.lease.release()  # type: ignore[union-attr]
    run = Driver(cfg, setup.space, setup.objective, ex, trials=3).run()
    trials = sorted(run.study.get_trials(), key=lambda t: t.number)
    base = trials[0]
    assert base.user_attrs["baseline"] and base.user_attrs["failure_kind"] == "oom"
    skipped = [t for t in trials if t.user_attrs.get("outcome") == SKIPPED]
    assert len(skipped) >= 1
    first = skipped[0]
    assert first.params["mem_fraction_static"] == 0.9 and first.user_attrs["implied_by"] == base.number
    assert first.state == TrialState.COMPLETE and read(first).constraints == {"failure": 1.0}  # the sampler learns it is infeasible
    assert first.system_attrs["constraints"] == [1.0]
    assert first.user_attrs["failure_kind"] == "oom" and first.user_attrs["duration_s"] == 0.0
    launched = {c.number for c in ex.costs}
    assert first.number not in launched and len(launched) == 3 == len(finished_trials(run.study))
    # the model agrees: 0.9 OOMs as the baseline's 0.85 did
    launch = setup.space.to_launch({**defaults, "mem_fraction_static": 0.9})
    assert ex.result(TrialSpec(99, env=launch.env, args=launch.args)).failure.kind == "oom"  # type: ignore[union-attr]
    shown = {t["number"]: t for t in show_json(run.study)["trials"]}
    assert shown[first.number]["outcome"] == SKIPPED and shown[first.number]["failure"]["kind"] == "oom"
