"""The default sampler (autotune.search.samplers): TPE that does not propose into a region where every
trial crashed. Real Optuna studies, trials recorded as the driver records them."""

from __future__ import annotations

import optuna
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState, create_trial

from autotune.search.factory import make_sampler
from autotune.outcome.load_signals import ATTR as SIGNALS_ATTR, LoadSignals
from autotune.search.moves import failed_moves, refused
from autotune.search.samplers import TPE_EVERY, CrashAwareTPESampler
from autotune.store.study_view import proposal_text
from autotune.store.record import PROPOSED_ATTR

DISTS = {"algo": CategoricalDistribution(["Ring", "Tree", "unset"]), "mem": FloatDistribution(0.5, 0.95)}
MONOTONE = {"mem": {"oom": "up"}}
"""``mem`` declared monotone for OOMs: a rule of 3 OOMs on it is a threshold the declaration
supports (:data:`autotune.analysis.rule_cover.MIN_BOUNDARY_SUPPORT`)."""


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
    crash_aware = CrashAwareTPESampler(seed=1, monotone=MONOTONE)
    mems = _proposals(_study(crashes=3), crash_aware)
    (rule,) = crash_aware.sure_rules(_study(crashes=3))
    assert [str(c) for c in rule] == ["mem >= 0.9"]
    assert not any(rule[0].holds({"mem": m}) for m in mems), mems
    # TPE alone, same seed, same study, proposes into it (the avoidance is what keeps it out)
    alone = _proposals(_study(crashes=3), CrashAwareTPESampler(seed=1, avoid_crashes=False, probes=False, monotone=MONOTONE))
    # undeclared, three OOMs on a memory parameter are too thin for a rule: no region
    assert CrashAwareTPESampler(seed=1).sure_rules(_study(crashes=3)) == []
    assert sum(m >= 0.9 for m in alone) >= 3, alone


def test_a_region_with_too_few_crashes_or_a_success_is_still_searched() -> None:
    few = CrashAwareTPESampler(seed=1, monotone=MONOTONE)
    assert few.sure_rules(_study(crashes=2)) == []
    mixed = _study(crashes=3)
    params = {"algo": "Tree", "mem": 0.93}
    mixed.add_trial(create_trial(params=params, distributions=DISTS, value=930.0,
                                 user_attrs={"outcome": "ok", "feasible": True, "applied": params}))
    assert CrashAwareTPESampler(seed=1, monotone=MONOTONE).sure_rules(mixed) == []


def test_a_run_stopped_early_inside_a_region_ends_it_at_once() -> None:
    """A load stopped early ran: the rules read it as evidence against the region it lies in, and
    the sampler's regions follow at the next ask (they are recomputed when a trial of any
    outcome the rules read has finished, not only a measured or failed one)."""
    study = _study(crashes=3)
    sampler = CrashAwareTPESampler(seed=1, monotone=MONOTONE)
    assert [[str(c) for c in conditions] for conditions, _, _ in sampler.regions(study)] == [["mem >= 0.9"]]
    params = {"algo": "Ring", "mem": 0.92}
    study.add_trial(create_trial(params=params, distributions=DISTS, state=TrialState.PRUNED,
                                 user_attrs={"outcome": "stopped", "feasible": True, "applied": params}))
    assert sampler.regions(study) == []


def test_study_start_uses_the_crash_aware_sampler() -> None:
    sampler = make_sampler("tpe", 3)
    assert isinstance(sampler, CrashAwareTPESampler) and sampler.avoid_crashes
    assert isinstance(make_sampler("random", 3), optuna.samplers.RandomSampler)


def _peaked(study: optuna.Study, mems: tuple[float, ...], algos: tuple[str, ...] | list[str]) -> None:
    """Measured trials at ``mems`` (``algo`` in turn from ``algos``), the best at 0.75."""
    for i, mem in enumerate(mems):
        params = {"algo": algos[i % len(algos)], "mem": mem}
        study.add_trial(create_trial(params=params, distributions=DISTS, value=1000 - abs(mem - 0.75) * 100,
                                     user_attrs={"outcome": "ok", "feasible": True, "applied": params}))


def test_a_probe_changes_one_parameter_of_the_best_towards_what_was_explored_least() -> None:
    """Past the start-up, a trial whose number is not a multiple of ``TPE_EVERY`` is a coverage probe: the best measured trial with
    one parameter moved into the part of its range no measured trial has tried (here ``algo``'s
    choices are all tried, so a ``mem`` probe lands in the one empty quarter, 0.5..0.6125)."""
    study = optuna.create_study(direction="maximize")
    _peaked(study, (0.62, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.93, 0.95), DISTS["algo"].choices)
    sampler = CrashAwareTPESampler(seed=4)
    study.sampler = sampler
    probes = []
    for _ in range(8):
        trial = study.ask()
        params = {"algo": trial.suggest_categorical("algo", DISTS["algo"].choices),
                  "mem": trial.suggest_float("mem", 0.5, 0.95)}
        if trial.number % TPE_EVERY != 0:
            probes.append((params, study._storage.get_trial(trial._trial_id).system_attrs.get(PROPOSED_ATTR)))
        study.tell(trial, state=TrialState.FAIL)  # not counted: each ask sees the same measured trials
    best = {"algo": "Ring", "mem": 0.75}
    best_number = max((t for t in study.trials if t.value is not None), key=lambda t: t.value).number
    for p, why in probes:
        changed = [k for k in p if p[k] != best[k]]
        assert len(changed) == 1, p
        assert why == {"by": "probe", "param": changed[0], "around": best_number}  # what study show tells
        if changed == ["mem"]:
            assert 0.5 <= p["mem"] <= 0.6125, p
    assert {k for p, _ in probes for k in p if p[k] != best[k]} == {"algo", "mem"}  # the parameters in turn
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
        for i, mem in enumerate((0.9, 0.91, 0.92, 0.93, 0.94)):  # 4 of 5 fail above 0.9, whatever the algorithm
            params = {"algo": ("Ring", "unset", "Ring", "Tree", "Ring")[i], "mem": mem}
            ok = i == 2
            study.add_trial(create_trial(
                params=params, distributions=DISTS, value=930.0 if ok else None,
                state=TrialState.COMPLETE if ok else TrialState.PRUNED,
                user_attrs={"outcome": "ok" if ok else "infeasible", "feasible": ok, "applied": params,
                            "failure_kind": None if ok else "oom", "duration_s": 300.0 if ok else fail_s}))
        return study

    fast, slow = study_with(30.0), study_with(900.0)
    inside = {"algo": "Ring", "mem": 0.93}
    (conditions, p_fail, _), = CrashAwareTPESampler(seed=1, monotone=MONOTONE).regions(fast)
    assert [str(c) for c in conditions] == ["mem >= 0.9"] and p_fail == 0.8
    w_fast = CrashAwareTPESampler(seed=1, monotone=MONOTONE).worth(fast, inside)
    w_slow = CrashAwareTPESampler(seed=1, monotone=MONOTONE).worth(slow, inside)
    assert 0 < w_slow < w_fast < 1
    assert CrashAwareTPESampler(seed=1, monotone=MONOTONE).worth(fast, {"algo": "Ring", "mem": 0.6}) == 1.0


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


BACK_OFF_DISTS = {"algo": CategoricalDistribution(["Ring", "Tree", "unset"]),
                  "mem": FloatDistribution(0.5, 0.95, step=0.01),
                  "slots": IntDistribution(16, 1024, log=True)}
MONOTONE = {"mem": {"oom": "up", "not-enough-memory": "down"}, "slots": {"oom": "up"}}


def _failed(study: optuna.Study, params: dict, kind: str, **attrs: object) -> None:
    study.add_trial(create_trial(params=params, distributions=BACK_OFF_DISTS, state=TrialState.PRUNED,
                                 user_attrs={"outcome": "infeasible", "feasible": False, "failure_kind": kind,
                                             "applied": params, **attrs}))


def _relative(study: optuna.Study, sampler: CrashAwareTPESampler) -> tuple[int, dict]:
    trial = study.ask()
    frozen = study.get_trials(deepcopy=False)[-1]
    params = sampler.sample_relative(study, frozen, sampler.infer_relative_search_space(study, frozen))
    study.tell(trial, state=TrialState.FAIL)
    return trial.number, params


def test_while_nothing_has_run_every_second_proposal_backs_off_the_memory_parameters() -> None:
    """The Kimi host's failure mode: every trial out of memory, TPE centring on the failures. A
    back-off is the baseline with the parameters declared ``oom: up`` below every OOM of its
    line (the baseline, and failures that kept its other values: here 0.7 and 60 slots), above
    the highest ``not-enough-memory`` (0.55; ``slots`` is not declared for it, so its 40 slots
    bound nothing), the undeclared ``algo`` kept; a trial elsewhere
    (``algo=Ring``, 0.52 and 20 slots) is not on the line and bounds nothing."""
    study = optuna.create_study(direction="maximize")
    _failed(study, {"algo": "unset", "mem": 0.85, "slots": 128}, "oom", baseline=True)
    _failed(study, {"algo": "Ring", "mem": 0.52, "slots": 20}, "oom")
    _failed(study, {"algo": "unset", "mem": 0.7, "slots": 60}, "oom")
    _failed(study, {"algo": "unset", "mem": 0.55, "slots": 40}, "not-enough-memory")
    sampler = CrashAwareTPESampler(seed=5, monotone=MONOTONE)
    back_offs, others = [], []
    for _ in range(12):
        number, p = _relative(study, sampler)
        (back_offs if number % 2 == 1 else others).append(p)
    assert len(back_offs) == 6
    for p in back_offs:
        assert p["algo"] == "unset" and 0.55 < p["mem"] < 0.7 and 16 <= p["slots"] < 60, p
    assert len({(p["mem"], p["slots"]) for p in back_offs}) > 1  # drawn, not one point again
    # the other proposals are random draws over the space, not TPE centred on the failures
    assert {p["algo"] for p in others} != {"unset"} and max(p["mem"] for p in others) > 0.7
    # without declarations there is nothing to back off along: every proposal is drawn at random
    plain = CrashAwareTPESampler(seed=5)
    assert any(not (0.55 < p["mem"] < 0.7) for p in (_relative(study, plain)[1] for _ in range(12)))


DRAFT_DISTS = {"draft": CategoricalDistribution(["unset", 2, 4, 8]), "mem": FloatDistribution(0.5, 0.95, step=0.01)}


def test_a_back_off_reads_a_categorical_declaration_among_its_numbers() -> None:
    """Draft tokens declared ``oom: up`` among 2-8; ``unset`` (no speculation) stands apart. A
    baseline with 4 that ran out of memory backs off to 2 (an OOM with ``unset`` bounds
    nothing); a baseline without speculation keeps it off and backs off the memory fraction."""
    def back_offs(baseline: dict, other: dict) -> list[dict]:
        study = optuna.create_study(direction="maximize")
        for params, attrs in ((baseline, {"baseline": True}), (other, {})):
            study.add_trial(create_trial(params=params, distributions=DRAFT_DISTS, state=TrialState.PRUNED,
                                         user_attrs={"outcome": "infeasible", "feasible": False, "failure_kind": "oom",
                                                     "applied": params, **attrs}))
        sampler = CrashAwareTPESampler(seed=5, monotone={"draft": {"oom": "up"}, "mem": {"oom": "up"}})
        return [p for number, p in (_relative(study, sampler) for _ in range(8)) if number % 2 == 1]

    spec = back_offs({"draft": 4, "mem": 0.85}, {"draft": "unset", "mem": 0.85})
    assert spec and all(p["draft"] == 2 and p["mem"] < 0.85 for p in spec), spec
    plain = back_offs({"draft": "unset", "mem": 0.85}, {"draft": 4, "mem": 0.7})
    assert plain and all(p["draft"] == "unset" and p["mem"] < 0.85 for p in plain), plain


def test_once_a_trial_has_run_there_are_no_back_offs() -> None:
    study = optuna.create_study(direction="maximize")
    _failed(study, {"algo": "unset", "mem": 0.85, "slots": 128}, "oom", baseline=True)
    for i, mem in enumerate((0.9, 0.91, 0.92, 0.93)):  # what ran: all far above the baseline's memory
        params = {"algo": "Tree", "mem": mem, "slots": 1000 - i}
        study.add_trial(create_trial(params=params, distributions=BACK_OFF_DISTS, value=10.0 + i,
                                     user_attrs={"outcome": "ok", "feasible": True, "applied": params}))
    sampler = CrashAwareTPESampler(seed=5, monotone=MONOTONE)
    proposals = [_relative(study, sampler)[1] for _ in range(10)]
    assert all(p for p in proposals)  # TPE's (past its start-up)
    assert sum(p["mem"] < 0.85 and p["slots"] < 128 for p in proposals) <= 2, proposals


def test_a_probe_first_reverts_the_parameter_to_the_baseline() -> None:
    """A probe of a parameter the best changed from the baseline first tries the baseline's
    value with the rest of the best (the ablation's question, "did this change help?"): a run
    that locked in with speculation on, or a small CUDA-graph batch, is one revert from the
    optimum on the Kimi and H200 hosts (docs/BENCHMARKS.md)."""
    study = optuna.create_study(direction="maximize")
    base = {"algo": "Ring", "mem": 0.6}  # Ring the most tried choice: the least-explored rule would pick unset
    study.add_trial(create_trial(params=base, distributions=DISTS, value=500.0,
                                 user_attrs={"outcome": "ok", "feasible": True, "applied": base, "baseline": True}))
    _peaked(study, (0.62, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.93), ("Ring", "Tree"))
    sampler = CrashAwareTPESampler(seed=4)
    study.sampler = sampler
    probes = []
    for _ in range(4):
        number, p = _relative(study, sampler)
        if number % TPE_EVERY != 0:
            probes.append(p)
    probes = probes[:2]  # the first probe of each parameter
    best = {"algo": "Tree", "mem": 0.75}
    assert sorted(probes, key=str) == sorted([{"algo": "Ring", "mem": 0.75}, {"algo": "Tree", "mem": 0.6}], key=str)
    assert all(sum(p[k] != best[k] for k in p) == 1 for p in probes)


PROTO_DISTS = {**DISTS, "proto": CategoricalDistribution(["LL", "Simple", "unset"])}


def test_a_probe_goes_first_to_the_parameter_least_probed_around_the_incumbent() -> None:
    """The best configuration was already probed in ``algo`` and ``mem`` (a trial differing from
    it in that parameter alone, each worse); ``proto`` never was around it. Whatever the
    shuffled cycle's order (the seed), the next probe changes ``proto``. On the Kimi host a
    run stayed below 90% of the optimum because the CUDA-graph limit, probed early around a
    poor incumbent, waited for the cycle to come round before it was probed around the good one."""
    incumbent = {"algo": "Ring", "mem": 0.75, "proto": "LL"}
    rows = [({"algo": "Tree", "mem": 0.75, "proto": "LL"}, 900.0), ({"algo": "Ring", "mem": 0.6, "proto": "LL"}, 900.0),
            (incumbent, 1000.0)]
    rows += [({"algo": ("Tree", "unset")[i % 2], "mem": 0.5 + 0.05 * i, "proto": ("Simple", "unset")[i % 2]}, 500.0 + i)
             for i in range(7)]
    firsts = []
    for seed in range(6):
        study = optuna.create_study(direction="maximize")
        for params, value in rows:
            study.add_trial(create_trial(params=params, distributions=PROTO_DISTS, value=value,
                                         user_attrs={"outcome": "ok", "feasible": True, "applied": params}))
        sampler = CrashAwareTPESampler(seed=seed)
        number, probe = _relative(study, sampler)
        assert number % TPE_EVERY != 0 and number >= 8  # a probe's turn
        firsts.append([k for k in probe if probe[k] != incumbent[k]])
    assert all(changed == ["proto"] for changed in firsts), firsts


def test_after_a_baseline_that_ran_the_next_trials_screen_each_parameter_alone() -> None:
    """The screen: the baseline ran, so the trials after it, one per parameter and one more, are
    probes of the incumbent (the baseline here), each parameter moved alone, all of them in turn,
    whatever the seed; then TPE's start-up as before (no relative proposal). After a baseline
    that failed there is no screen: the trials after the first that ran are TPE's start-up, as
    before the screen, until :data:`PROBE_AFTER`."""
    base = {"algo": "unset", "mem": 0.85, "proto": "unset"}
    for seed in range(4):
        study = optuna.create_study(direction="maximize")
        study.add_trial(create_trial(params=base, distributions=PROTO_DISTS, value=500.0, user_attrs={
            "outcome": "ok", "feasible": True, "applied": base, "baseline": True}))
        sampler = CrashAwareTPESampler(seed=seed)
        changed = []
        for _ in range(len(PROTO_DISTS) + 1):
            number, p = _relative(study, sampler)
            diff = [k for k in p if p[k] != base[k]]
            assert len(diff) == 1, (number, p)
            why = study._storage.get_trial(study.trials[number]._trial_id).system_attrs.get(PROPOSED_ATTR)
            assert why == {"by": "probe", "param": diff[0], "around": 0, "screen": True}
            assert proposal_text(why) == (f"{diff[0]} moved alone from trial 0 (the best so far), the rest kept "
                                          "(the screen of the baseline: one change at a time)")
            changed += diff
        assert set(changed[:len(PROTO_DISTS)]) == set(PROTO_DISTS), changed  # each parameter once
        assert _relative(study, sampler)[1] == {}  # past the screen: TPE's start-up draws

        failed = optuna.create_study(direction="maximize")
        failed.add_trial(create_trial(params=base, distributions=PROTO_DISTS, state=TrialState.PRUNED, user_attrs={
            "outcome": "infeasible", "feasible": False, "failure_kind": "oom", "applied": base, "baseline": True}))
        ran = {"algo": "Ring", "mem": 0.6, "proto": "LL"}
        failed.add_trial(create_trial(params=ran, distributions=PROTO_DISTS, value=400.0, user_attrs={
            "outcome": "ok", "feasible": True, "applied": ran}))
        assert [_relative(failed, CrashAwareTPESampler(seed=seed))[1] for _ in range(4)] == [{}] * 4


RAISE_DISTS = {"graph": IntDistribution(8, 512, log=True), "mem": FloatDistribution(0.5, 0.95),
               "slots": IntDistribution(16, 1024, log=True)}
RAISE_WHEN = {"slots": "queued", "graph": "running-above"}


def _ran(study: optuna.Study, params: dict, value: float, signals: LoadSignals | None = None, *,
         dists: dict = RAISE_DISTS, **attrs: object) -> None:
    study.add_trial(create_trial(params=params, distributions=dists, value=value, user_attrs={
        "outcome": "ok", "feasible": True, "applied": params, "metrics": {"max_concurrency": 192.0},
        SIGNALS_ATTR: signals.to_attr() if signals else None, **attrs}))


def _others(study: optuna.Study) -> None:
    """Four worse measured trials with no scheduler log: past TPE's start-up, so a proposal that
    is not a raise is TPE's, not an empty start-up draw."""
    for i, (graph, mem, slots) in enumerate(((16, 0.6, 20), (100, 0.7, 300), (400, 0.55, 40), (20, 0.9, 700))):
        _ran(study, {"graph": graph, "mem": mem, "slots": slots}, 100.0 + i)


def test_the_best_trials_scheduler_log_raises_the_cap_it_found_full() -> None:
    """The field report's biggest win: requests queued while the running cap was full, so the
    cap is raised -- here the baseline ran 64 at a time with 86 more waiting under 192 clients,
    and its decode batches outgrew the 32 the CUDA graphs cover. The next proposals are the
    baseline with the graph limit raised to the 64 seen running, then the cap to the clients'
    192; each once. A cap the memory kept from filling (50 in flight of 64) is not raised."""
    study = optuna.create_study(direction="maximize")
    base = {"graph": 32, "mem": 0.8, "slots": 64}
    full = LoadSignals(in_flight_max=64, queued_max=128, demand_max=150, queued_at_max=86, lines=9)
    _ran(study, base, 500.0, full, baseline=True)
    _others(study)
    sampler = CrashAwareTPESampler(seed=3, raise_when=RAISE_WHEN)
    _, first = _relative(study, sampler)
    assert first == {**base, "graph": 64}
    _ran(study, first, 450.0)  # worse: the baseline stays the best
    _, second = _relative(study, sampler)
    assert second == {**base, "slots": 192}
    _ran(study, second, 400.0)
    _, third = _relative(study, sampler)
    assert third and third not in (first, second)  # TPE's turn: each raise once
    # without the declarations, or with the memory keeping the cap from filling, no raise
    plain = _relative(study, CrashAwareTPESampler(seed=3))[1]
    assert plain and plain not in (first, second)
    kv_bound = optuna.create_study(direction="maximize")
    _ran(kv_bound, base, 500.0, LoadSignals(in_flight_max=50, queued_max=100, demand_max=150, queued_at_max=100,
                                              lines=9), baseline=True)
    _others(kv_bound)
    kv_proposal = _relative(kv_bound, CrashAwareTPESampler(seed=3, raise_when={"slots": "queued"}))[1]
    assert kv_proposal and kv_proposal != {**base, "slots": 192}


def test_a_categorical_limit_is_raised_to_the_smallest_choice_that_covers_the_log() -> None:
    """vLLM's ``--max-cudagraph-capture-size`` is a categorical (``unset`` or a batch size): the
    log showed 100 requests running past a limit of 16, so the raise is to 128, the smallest
    choice that covers them (not the largest, 512). From ``unset`` (vLLM's own default) there is
    no raise: its value is not known here."""
    dists = {**RAISE_DISTS, "graph": CategoricalDistribution(["unset", 16, 64, 128, 256, 512])}
    busy = LoadSignals(in_flight_max=100, queued_max=0, demand_max=100, queued_at_max=0, lines=5)
    proposals = []
    for graph in (16, "unset"):
        study = optuna.create_study(direction="maximize")
        base = {"graph": graph, "mem": 0.8, "slots": 128}
        _ran(study, base, 500.0, busy, dists=dists)
        for i, mem in enumerate((0.6, 0.65, 0.7, 0.75)):  # worse, with no log: past TPE's start-up
            _ran(study, {**base, "mem": mem}, 100.0 + i, dists=dists)
        proposals.append(_relative(study, CrashAwareTPESampler(seed=3, raise_when={"graph": "running-above"}))[1])
    assert proposals[0] == {"graph": 128, "mem": 0.8, "slots": 128}
    assert proposals[1] and proposals[1] != {"graph": 128, "mem": 0.8, "slots": 128}  # TPE's draw, not a raise


def test_a_raise_into_a_region_where_every_trial_crashed_is_not_proposed() -> None:
    study = optuna.create_study(direction="maximize")
    base = {"graph": 256, "mem": 0.8, "slots": 64}
    _ran(study, base, 500.0, LoadSignals(in_flight_max=64, queued_max=128, demand_max=192, queued_at_max=128, lines=4),
         baseline=True)
    for i, slots in enumerate((16, 20, 24, 30, 36, 40, 48, 56)):  # fewer slots run, a little slower
        _ran(study, {**base, "slots": slots, "mem": 0.6 + 0.02 * i}, 300.0 + slots)
    for slots, graph in ((150, 256), (300, 300), (600, 400)):  # more slots at this memory: out of memory every time
        params = {**base, "slots": slots, "graph": graph}
        study.add_trial(create_trial(params=params, distributions=RAISE_DISTS, state=TrialState.PRUNED, user_attrs={
            "outcome": "infeasible", "feasible": False, "failure_kind": "oom", "applied": params}))
    sampler = CrashAwareTPESampler(seed=3, raise_when=RAISE_WHEN, monotone={"slots": {"oom": "up"}})
    assert sampler.worth(study, {**base, "slots": 192}) < 1.0
    assert _relative(study, sampler)[1] != {**base, "slots": 192}


NCCL_DISTS = {"NCCL_ALGO": CategoricalDistribution(["unset", "Ring", "Tree"]), "mem": FloatDistribution(0.5, 0.95)}


def test_a_choice_its_failure_names_is_not_proposed_again() -> None:
    """NCCL says which setting it could not use (``NCCL_ALGO was set to Tree``): one such failure
    is a crash rule (a counted one needs 3), and the sampler proposes Tree no more. The same
    failure with a message that names no setting is no rule: Tree is weighed by the failure
    boundary's chance alone (one failure beside six runs), worth more than nothing."""
    def study_with(message: str) -> optuna.Study:
        study = optuna.create_study(direction="maximize")
        for i, mem in enumerate((0.55, 0.6, 0.65, 0.7, 0.75, 0.8)):
            params = {"NCCL_ALGO": ("unset", "Ring")[i % 2], "mem": mem}
            study.add_trial(create_trial(params=params, distributions=NCCL_DISTS, value=1000 * mem,
                                         user_attrs={"outcome": "ok", "feasible": True, "applied": params}))
        params = {"NCCL_ALGO": "Tree", "mem": 0.8}
        study.add_trial(create_trial(params=params, distributions=NCCL_DISTS, state=TrialState.PRUNED, user_attrs={
            "outcome": "infeasible", "feasible": False, "failure_kind": "nccl-error", "applied": params,
            "failure_message": message}))
        return study

    named = "NCCL error: invalid usage: No algorithm/protocol available for function AllGather. NCCL_ALGO was set to Tree."
    unnamed = "NCCL error: unhandled system error"
    algos, worth, rules = {}, {}, {}
    for message in (named, unnamed):
        study, sampler = study_with(message), CrashAwareTPESampler(seed=2, probes=False)
        algos[message] = [_relative(study, sampler)[1]["NCCL_ALGO"] for _ in range(30)]
        worth[message] = sampler.worth(study, {"NCCL_ALGO": "Tree", "mem": 0.6})
        rules[message] = [[str(c) for c in r] for r in sampler.sure_rules(study)]
    assert "Tree" not in algos[named], algos[named]
    assert rules[named] == [["NCCL_ALGO=Tree"]] and worth[named] == 0.0
    assert rules[unnamed] == [] and 0.0 < worth[unnamed] < 1.0


def test_a_probe_that_failed_one_way_is_not_repeated_that_way() -> None:
    """A probe moves one parameter of a configuration that ran, so its failure is the move's.
    A failure of an ordered parameter refuses later probes that way to its value and beyond (a
    threshold), memory failures too: what lies between the value that ran and the failed one
    was not measured (2 draft tokens ran and 8 failed: 4 is still open, as is anything the
    other way); of an unordered choice, that choice."""
    dists = {"draft": CategoricalDistribution(["unset", 2, 4, 8]), "channels": IntDistribution(1, 32),
             "algo": CategoricalDistribution(["unset", "Ring", "Tree"]), "mem": FloatDistribution(0.5, 0.95)}
    study = optuna.create_study(direction="maximize")
    best = {"draft": 2, "channels": 4, "algo": "unset", "mem": 0.6}
    study.add_trial(create_trial(params=best, distributions=dists, value=500.0,
                                 user_attrs={"outcome": "ok", "feasible": True, "applied": best}))
    for name, value, kind in (("draft", 8, "oom"), ("channels", 24, "nccl-error"), ("algo", "Tree", "nccl-error")):
        params = {**best, name: value}
        study.add_trial(create_trial(
            params=params, distributions=dists, state=TrialState.PRUNED,
            user_attrs={"outcome": "infeasible", "feasible": False, "failure_kind": kind, "applied": params},
            system_attrs={PROPOSED_ATTR: {"by": "probe", "param": name, "around": 0}}))
    moves = failed_moves(study.trials, dists)
    assert [(m.param, m.before, m.after, m.kind) for m in moves] == [
        ("draft", 2, 8, "oom"), ("channels", 4, 24, "nccl-error"), ("algo", "unset", "Tree", "nccl-error")]
    assert refused(moves, dists, "draft", 8, 2) and refused(moves, dists, "draft", 8, "unset")
    assert not refused(moves, dists, "draft", 4, 2) and not refused(moves, dists, "draft", "unset", 2)
    assert refused(moves, dists, "channels", 28, 4) and not refused(moves, dists, "channels", 16, 4)
    assert not refused(moves, dists, "channels", 2, 4)
    assert refused(moves, dists, "algo", "Tree", "unset") and not refused(moves, dists, "algo", "Ring", "unset")
    assert not refused(moves, dists, "mem", 0.9, 0.6)  # never probed: nothing refused
    # where the space declares a parameter monotone for the failure's kind, the move speaks only
    # as far on the failing side as it failed: Tree's NCCL error beside 4 channels says nothing
    # beside 2, 8 draft tokens' OOM at a 0.6 fraction nothing at 0.55
    declared = {"channels": {"nccl-error": "up"}, "mem": {"oom": "up"}}
    moves = failed_moves(study.trials, dists, declared)
    assert refused(moves, dists, "algo", "Tree", "unset", {**best, "algo": "Tree"})
    assert refused(moves, dists, "algo", "Tree", "unset", {**best, "algo": "Tree", "channels": 8})
    assert not refused(moves, dists, "algo", "Tree", "unset", {**best, "algo": "Tree", "channels": 2})
    assert refused(moves, dists, "draft", 8, 2, {**best, "draft": 8, "mem": 0.7})
    assert not refused(moves, dists, "draft", 8, 2, {**best, "draft": 8, "mem": 0.55})
    # and the sampler's worth of the choice follows: nothing where the move speaks, open beside fewer channels
    sampler = CrashAwareTPESampler(seed=0, monotone=declared)
    sampler.sample_relative(study, study.trials[-1], dists)  # reads the moves
    assert sampler.worth(study, {**best, "algo": "Tree"}) == 0.0
    assert sampler.worth(study, {**best, "algo": "Tree", "channels": 2}) > 0.0


BUFFER_DISTS = {"NCCL_MIN_NCHANNELS": IntDistribution(1, 32),
              "NCCL_BUFFSIZE": CategoricalDistribution([1 << 20, 2 << 20, 4 << 20, 8 << 20, 16 << 20])}


def test_a_region_over_the_nccl_buffers_per_peer_is_not_proposed_again() -> None:
    """NCCL's buffers (channels x each connection's) fail past a product no one parameter draws:
    the rule is a threshold on the derived quantity (autotune.config.derived), and the sampler keeps its
    proposals out of it, channels and buffer size together."""
    from autotune.config.derived import nccl_buffers_mib

    def study() -> optuna.Study:
        s = optuna.create_study(direction="maximize")
        ran = [(2, 1), (4, 2), (6, 4), (8, 1), (3, 8), (5, 2), (10, 1), (7, 4), (4, 4), (12, 1), (2, 16), (9, 2)]
        failed = [(20, 4), (8, 16), (28, 2), (14, 8)]
        for channels, mib in ran + failed:
            params = {"NCCL_MIN_NCHANNELS": channels, "NCCL_BUFFSIZE": mib << 20}
            if (channels, mib) in failed:
                s.add_trial(create_trial(params=params, distributions=BUFFER_DISTS, state=TrialState.PRUNED,
                                         user_attrs={"outcome": "infeasible", "feasible": False,
                                                     "failure_kind": "nccl-error", "applied": params}))
            else:  # more channels, more throughput: TPE leans toward the boundary
                s.add_trial(create_trial(params=params, distributions=BUFFER_DISTS, value=100.0 * channels,
                                         user_attrs={"outcome": "ok", "feasible": True, "applied": params}))
        return s

    def proposals(sampler: optuna.samplers.BaseSampler) -> list[float]:
        s = study()
        s.sampler = sampler
        out = []
        for _ in range(40):
            trial = s.ask()
            params = {"NCCL_MIN_NCHANNELS": trial.suggest_int("NCCL_MIN_NCHANNELS", 1, 32),
                      "NCCL_BUFFSIZE": trial.suggest_categorical("NCCL_BUFFSIZE", BUFFER_DISTS["NCCL_BUFFSIZE"].choices)}
            out.append(nccl_buffers_mib(params) or 0.0)
            s.tell(trial, state=TrialState.FAIL)
        return out

    crash_aware = CrashAwareTPESampler(seed=1)
    (rule,) = crash_aware.sure_rules(study())
    assert [c.param for c in rule] == ["nccl_buffers_mib"] and rule[0].op == ">="
    threshold = rule[0].value
    inside = {"NCCL_MIN_NCHANNELS": 24, "NCCL_BUFFSIZE": 8 << 20}  # 24 x 13.2 MiB: a combination no trial tried
    assert crash_aware._regions_worth(study(), inside) == 0.0  # the region holds it, by its parameters alone
    assert not any(x >= threshold for x in proposals(crash_aware))
    assert sum(x >= threshold for x in proposals(CrashAwareTPESampler(seed=1, avoid_crashes=False))) >= 3


def test_a_region_holds_only_where_its_failures_were_shown() -> None:
    """Speculation ran out of memory at every fraction it was tried at, all of them high: the
    region is speculation at those fractions (the rule's scope), not speculation anywhere. A small
    draft at a low fraction was never measured, so nothing the study saw rules it out."""
    dists = {"draft": CategoricalDistribution(["unset", 2, 4, 8]), "mem": FloatDistribution(0.5, 0.95),
             "algo": CategoricalDistribution(["Ring", "Tree", "unset"])}
    monotone = {"draft": {"oom": "up"}, "mem": {"oom": "up"}}
    study = optuna.create_study(direction="maximize")
    for i, mem in enumerate((0.5, 0.6, 0.7, 0.8, 0.85, 0.88, 0.9, 0.92)):
        p = {"draft": "unset", "mem": mem, "algo": dists["algo"].choices[i % 3]}
        study.add_trial(create_trial(params=p, distributions=dists, value=1000 * mem,
                                     user_attrs={"outcome": "ok", "feasible": True, "applied": p}))
    for i, (draft, mem) in enumerate(((2, 0.9), (4, 0.88), (8, 0.92), (2, 0.93))):
        p = {"draft": draft, "mem": mem, "algo": dists["algo"].choices[i % 3]}
        study.add_trial(create_trial(params=p, distributions=dists, state=TrialState.PRUNED,
                                     user_attrs={"outcome": "infeasible", "feasible": False, "failure_kind": "oom",
                                                 "applied": p}))
    sampler = CrashAwareTPESampler(seed=1, monotone=monotone)
    (conditions, p_fail, _), = sampler.regions(study)
    assert [str(c) for c in conditions] == ["draft >= 2", "mem >= 0.88"] and p_fail == 1.0
    assert sampler.worth(study, {"draft": 2, "mem": 0.91, "algo": "Ring"}) == 0.0
    assert sampler.worth(study, {"draft": 2, "mem": 0.6, "algo": "Ring"}) == 1.0
