"""The default sampler (autotune.samplers): TPE that does not propose into a region where every
trial crashed. Real Optuna studies, trials recorded as the driver records them."""

from __future__ import annotations

import optuna
from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.trial import TrialState, create_trial

from autotune.driver import make_sampler
from autotune.samplers import CrashAwareTPESampler

DISTS = {"algo": CategoricalDistribution(["Ring", "Tree", "unset"]), "mem": FloatDistribution(0.5, 0.95)}


OK_MEMS = (0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.87, 0.88, 0.89)


def _study(crashes: int) -> optuna.Study:
    """Measured trials at :data:`OK_MEMS`, whose throughput grows with ``mem`` (the best right
    below 0.9, so TPE's proposals spill over it), and ``crashes`` trials from 0.9 to 0.95 that
    all ran out of memory, whatever ``algo``."""
    study = optuna.create_study(direction="maximize")
    for i, mem in enumerate(OK_MEMS):
        params = {"algo": DISTS["algo"].choices[i % 3], "mem": mem}
        study.add_trial(create_trial(params=params, distributions=DISTS, value=1000 * mem,
                                     user_attrs={"outcome": "ok", "feasible": True, "applied": params}))
    for i in range(crashes):
        params = {"algo": DISTS["algo"].choices[i % 3], "mem": round(0.9 + 0.05 * i / max(1, crashes - 1), 4)}
        study.add_trial(create_trial(params=params, distributions=DISTS, state=TrialState.PRUNED,
                                     user_attrs={"outcome": "infeasible", "feasible": False,
                                                 "failure_kind": "oom", "applied": params}))
    return study


def _proposals(study: optuna.Study, sampler: optuna.samplers.BaseSampler, n: int = 40) -> list[float]:
    """The ``mem`` of ``n`` proposals (each told FAIL: not counted, every ask sees the same study)."""
    study.sampler = sampler
    mems = []
    for _ in range(n):
        trial = study.ask()
        trial.suggest_categorical("algo", DISTS["algo"].choices)
        mems.append(trial.suggest_float("mem", 0.5, 0.95))
        study.tell(trial, state=TrialState.FAIL)
    return mems


def test_a_region_where_every_trial_crashed_is_not_proposed_again() -> None:
    crash_aware = CrashAwareTPESampler(seed=1)
    mems = _proposals(_study(crashes=3), crash_aware)
    (rule,) = crash_aware.sure_rules(_study(crashes=3))
    assert [str(c) for c in rule] == ["mem >= 0.9"]
    assert not any(rule[0].holds({"mem": m}) for m in mems), mems
    # TPE alone, same seed, same study, proposes into it (the avoidance is what keeps it out)
    alone = _proposals(_study(crashes=3), CrashAwareTPESampler(seed=1, avoid_crashes=False))
    assert sum(m >= 0.9 for m in alone) >= 3, alone


def test_a_region_with_too_few_crashes_or_a_success_is_still_searched() -> None:
    few = CrashAwareTPESampler(seed=1)
    assert few.sure_rules(_study(crashes=2)) == []
    mixed = _study(crashes=3)
    params = {"algo": "Tree", "mem": 0.93}
    mixed.add_trial(create_trial(params=params, distributions=DISTS, value=930.0,
                                 user_attrs={"outcome": "ok", "feasible": True, "applied": params}))
    assert CrashAwareTPESampler(seed=1).sure_rules(mixed) == []


def test_study_start_uses_the_crash_aware_sampler() -> None:
    sampler = make_sampler("tpe", 3)
    assert isinstance(sampler, CrashAwareTPESampler) and sampler.avoid_crashes
    assert isinstance(make_sampler("random", 3), optuna.samplers.RandomSampler)


def test_a_probe_changes_one_parameter_of_the_best_towards_what_was_explored_least() -> None:
    """Past the start-up, an even trial number is a coverage probe: the best measured trial with
    one parameter moved into the part of its range no measured trial has tried (here ``algo``'s
    choices are all tried, so a ``mem`` probe lands in the one empty quarter, 0.5..0.6125)."""
    study = optuna.create_study(direction="maximize")
    for i, mem in enumerate((0.62, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.93, 0.95)):
        params = {"algo": DISTS["algo"].choices[i % 3], "mem": mem}
        study.add_trial(create_trial(params=params, distributions=DISTS, value=1000 - abs(mem - 0.75) * 100,
                                     user_attrs={"outcome": "ok", "feasible": True, "applied": params}))
    sampler = CrashAwareTPESampler(seed=4)
    study.sampler = sampler
    probes = []
    for _ in range(8):
        trial = study.ask()
        params = {"algo": trial.suggest_categorical("algo", DISTS["algo"].choices),
                  "mem": trial.suggest_float("mem", 0.5, 0.95)}
        if trial.number % 2 == 0:
            probes.append(params)
        study.tell(trial, state=TrialState.FAIL)  # not counted: each ask sees the same measured trials
    best = {"algo": "Ring", "mem": 0.75}
    for p in probes:
        changed = [k for k in p if p[k] != best[k]]
        assert len(changed) == 1, p
        if changed == ["mem"]:
            assert 0.5 <= p["mem"] <= 0.6125, p
    assert {k for p in probes for k in p if p[k] != best[k]} == {"algo", "mem"}  # the parameters in turn
    # TPE alone never probes
    plain = CrashAwareTPESampler(seed=4, probes=False, avoid_crashes=False)
    study.sampler = plain
    trial = study.ask()
    assert plain.sample_relative(study, study.get_trials(deepcopy=False)[-1], DISTS) != {}
    study.tell(trial, state=TrialState.FAIL)


def test_a_configuration_already_launched_is_not_proposed_again() -> None:
    study = _study(crashes=0)
    sampler = CrashAwareTPESampler(seed=2)
    measured = {(t.params["algo"], t.params["mem"]) for t in study.trials}
    for _ in range(15):
        trial = study.ask()
        frozen = study.get_trials(deepcopy=False)[-1]
        space = sampler.infer_relative_search_space(study, frozen)
        p = sampler.sample_relative(study, frozen, space)
        assert (p["algo"], p["mem"]) not in measured
        study.tell(trial, state=TrialState.FAIL)


def test_a_region_that_fails_late_is_avoided_more_than_one_that_fails_fast() -> None:
    def study_with(fail_s: float) -> optuna.Study:
        study = optuna.create_study(direction="maximize")
        for i, mem in enumerate(OK_MEMS):
            params = {"algo": DISTS["algo"].choices[i % 3], "mem": mem}
            study.add_trial(create_trial(params=params, distributions=DISTS, value=1000 * mem,
                                         user_attrs={"outcome": "ok", "feasible": True, "applied": params,
                                                     "duration_s": 300.0}))
        for i, mem in enumerate((0.9, 0.91, 0.92, 0.93, 0.94)):  # 4 of 5 fail above 0.9
            params = {"algo": "Ring", "mem": mem}
            ok = i == 2
            study.add_trial(create_trial(
                params=params, distributions=DISTS, value=930.0 if ok else None,
                state=TrialState.COMPLETE if ok else TrialState.PRUNED,
                user_attrs={"outcome": "ok" if ok else "infeasible", "feasible": ok, "applied": params,
                            "failure_kind": None if ok else "oom", "duration_s": 300.0 if ok else fail_s}))
        return study

    fast, slow = study_with(30.0), study_with(900.0)
    inside = {"algo": "Ring", "mem": 0.93}
    (conditions, p_fail, _), = CrashAwareTPESampler(seed=1).regions(fast)
    assert [str(c) for c in conditions] == ["mem >= 0.9"] and p_fail == 0.8
    w_fast = CrashAwareTPESampler(seed=1).worth(fast, inside)
    w_slow = CrashAwareTPESampler(seed=1).worth(slow, inside)
    assert 0 < w_slow < w_fast < 1
    assert CrashAwareTPESampler(seed=1).worth(fast, {"algo": "Ring", "mem": 0.6}) == 1.0


def test_a_proposal_that_launches_a_measured_configuration_is_a_repeat_too() -> None:
    """With the space's repair (here: ``mem`` above 0.89 launches as 0.89), a proposal whose
    launched values were measured already counts as a repeat, though its raw values are new."""
    def clamp(p: dict) -> dict:
        return {**p, "mem": min(p["mem"], 0.89)}

    study = _study(crashes=0)  # measured (Tree, 0.89) among others; the value grows with mem
    sampler = CrashAwareTPESampler(seed=3, launched_as=clamp)
    assert sampler._launch_key({"algo": "Tree", "mem": 0.93}) == sampler._launch_key({"algo": "Tree", "mem": 0.89})
    measured = {(t.params["algo"], t.params["mem"]) for t in study.trials}
    for _ in range(15):
        trial = study.ask()
        frozen = study.get_trials(deepcopy=False)[-1]
        p = sampler.sample_relative(study, frozen, sampler.infer_relative_search_space(study, frozen))
        assert (p["algo"], min(p["mem"], 0.89)) not in measured, p
        study.tell(trial, state=TrialState.FAIL)
