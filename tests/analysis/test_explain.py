"""``autotune study explain``: crash rules as a minimal explanation of the failures, importances
with an interval and honest verdicts. Real stored studies (SQLite), their trials written with the
attributes the driver writes (``outcome``, ``feasible``, ``failure_kind``, ``applied``)."""

from __future__ import annotations

import io
import json
import random
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pytest
from optuna.trial import TrialState, create_trial

from autotune.analysis.explain import MIN_SUPPORT, crash_rules, explain
from autotune.analysis.importance import MIN_TRIALS, _Matching, matched_effect
from autotune.config.space import SearchSpace
from tests.helpers.cli import autotune

optuna.logging.set_verbosity(optuna.logging.WARNING)
SPACE = SearchSpace.load("sglang_nccl")
DISTS = SPACE.distributions()
MIB = 1 << 20


def _random_params(rng: random.Random) -> dict[str, Any]:
    """A point of the sglang_nccl space, drawn at random (MIN <= MAX repaired as the driver does)."""
    values: dict[str, Any] = {}
    for name, dist in DISTS.items():
        if isinstance(dist, optuna.distributions.CategoricalDistribution):
            values[name] = rng.choice(list(dist.choices))
        elif isinstance(dist, optuna.distributions.IntDistribution):
            values[name] = rng.randint(dist.low, dist.high)
        else:
            assert isinstance(dist, optuna.distributions.FloatDistribution) and dist.step
            values[name] = round(dist.low + rng.randint(0, round((dist.high - dist.low) / dist.step)) * dist.step, 2)
    return SPACE.repair(values)


def _trial(params: dict[str, Any], kind: str | None, value: float | None,
           message: str | None = None) -> optuna.trial.FrozenTrial:
    """One trial as the driver tells it: ok -> COMPLETE, a failure -> PRUNED (its error line
    ``message``, or ``simulated <kind>``)."""
    attrs: dict[str, Any] = {"applied": params, "feasible": kind is None, "failure_kind": kind,
                             "outcome": "ok" if kind is None else "infeasible", "metrics": {}}
    if kind is None:
        attrs["metrics"] = {"output_throughput": value}
        return create_trial(params=params, distributions=DISTS, value=value, user_attrs=attrs)
    attrs["failure_message"] = message or f"simulated {kind}"
    return create_trial(params=params, distributions=DISTS, state=TrialState.PRUNED, user_attrs=attrs)


def _study(tmp_path: Path, name: str, n: int, judge: Callable[[dict[str, Any], random.Random], tuple[str | None, float]],
           *, seed: int = 0, fixed: list[dict[str, Any]] | None = None) -> tuple[optuna.Study, str]:
    """A stored study of ``n`` random trials (plus ``fixed`` ones first), each judged by ``judge``."""
    storage = f"sqlite:///{tmp_path}/studies.db"
    study = optuna.create_study(study_name=name, storage=storage, direction="maximize")
    rng = random.Random(seed)
    points = [SPACE.repair({**_random_params(rng), **f}) for f in fixed or []]
    points += [_random_params(rng) for _ in range(n)]
    for p in points:
        kind, value = judge(p, rng)
        study.add_trial(_trial(p, kind, value))
    return study, storage


PROTO_SPEED = {"unset": 1.0, "LL": 0.6, "LL128": 1.15, "Simple": 0.8}


def _throughput(p: dict[str, Any], rng: random.Random) -> float:
    """Throughput that depends on NCCL_PROTO (a lot), with 2 % noise; nothing else matters."""
    return 1000.0 * PROTO_SPEED[p["NCCL_PROTO"]] * (1 + 0.02 * rng.gauss(0, 1))


def _rules(doc: dict[str, Any]) -> list[str]:
    return [r["rule"] for r in doc["failure_rules"]]


def test_a_confounded_value_is_not_blamed(tmp_path: Path) -> None:
    """Every failing trial with draft tokens 4 also had NCCL_ALGO=Tree: only Tree is a rule, and
    every failure is attributed to it."""
    def judge(p: dict[str, Any], rng: random.Random) -> tuple[str | None, float]:
        return ("nccl-error", 0.0) if p["NCCL_ALGO"] == "Tree" else (None, _throughput(p, rng))

    tree_spec4 = {"NCCL_ALGO": "Tree", "speculative_num_draft_tokens": 4}
    study, _ = _study(tmp_path, "confounded", 24, judge, fixed=[tree_spec4] * 3)
    doc = explain(study)
    tree = [v for v in study.trials if v.user_attrs["applied"]["NCCL_ALGO"] == "Tree"]
    assert len(tree) >= 5 and all(t.user_attrs["failure_kind"] == "nccl-error" for t in tree)
    assert _rules(doc) == [f"NCCL_ALGO=Tree -> nccl-error ({len(tree)} of {len(tree)})"]
    (rule,) = doc["failure_rules"]
    assert rule["trials"] == sorted(t.number for t in tree) and rule["kind"] == "nccl-error"
    assert rule["conditions"] == [{"param": "NCCL_ALGO", "op": "=", "value": "Tree"}]
    assert rule["support"] == {"failed": len(tree), "covered": len(tree)}
    assert doc["unexplained_failures"] == {"count": 0, "trials": [], "kinds": {}, "at_one_configuration": []}


NO_ALGO = ("torch.distributed.DistBackendError: NCCL error: invalid usage: No algorithm/protocol available for "
           "function AllGather with datatype ncclBfloat16. NCCL_ALGO was set to Tree.")


@pytest.mark.parametrize("case", ["named", "unnamed", "ran-once", "memory"])
def test_a_setting_the_error_names_is_a_rule_from_one_failure(tmp_path: Path, case: str) -> None:
    """NCCL's error names the choice it could not use: one such failure is a rule, with the
    engine's words as its evidence, while the same failure with a message that does not name it,
    a Tree trial that ran, or a memory failure whose message names it, gives none."""
    rng = random.Random(3)
    study = optuna.create_study(direction="maximize")
    for i in range(20):
        p = SPACE.repair({**_random_params(rng), "NCCL_ALGO": ("unset", "Ring")[i % 2]})
        study.add_trial(_trial(p, None, _throughput(p, rng)))
    tree = SPACE.repair({**_random_params(rng), "NCCL_ALGO": "Tree"})
    kind = "oom" if case == "memory" else "nccl-error"
    study.add_trial(_trial(tree, kind, None, None if case == "unnamed" else NO_ALGO))
    if case == "ran-once":
        p = SPACE.repair({**_random_params(rng), "NCCL_ALGO": "Tree"})
        study.add_trial(_trial(p, None, _throughput(p, rng)))
    doc = explain(study)
    if case != "named":
        assert doc["failure_rules"] == [] and doc["unexplained_failures"]["trials"] == [20]
        return
    (rule,) = doc["failure_rules"]
    assert rule["rule"] == "NCCL_ALGO=Tree -> nccl-error (1 of 1; the error names it)"
    assert rule["named_by_error"] is True and rule["trials"] == [20]
    assert doc["unexplained_failures"]["count"] == 0
    assert crash_rules(study) == [rule["rule"]]


def test_a_confound_the_data_cannot_resolve_is_named(tmp_path: Path) -> None:
    """Every failure had both NCCL_ALGO=Tree and NCCL_PROTO=LL (the search set them together): the
    rule says so rather than pretend to know which one crashes."""
    def judge(p: dict[str, Any], rng: random.Random) -> tuple[str | None, float]:
        return ("nccl-error", 0.0) if p["NCCL_ALGO"] == "Tree" else (None, _throughput(p, rng))

    study, _ = _study(tmp_path, "alias", 0, judge, fixed=[{"NCCL_ALGO": "Tree", "NCCL_PROTO": "LL"}] * 4
                      + [{"NCCL_ALGO": a, "NCCL_PROTO": p} for a in ("unset", "Ring") for p in ("unset", "LL128", "Simple")] * 3)
    (rule,) = explain(study)["failure_rules"]
    assert rule["kind"] == "nccl-error" and len(rule["trials"]) == 4
    assert {str(c["value"]) for c in rule["conditions"]} <= {"Tree", "LL"}
    assert rule["confounded_with"] == ["NCCL_PROTO=LL" if rule["conditions"][0]["value"] == "Tree" else "NCCL_ALGO=Tree"]


def test_kinds_are_not_merged(tmp_path: Path) -> None:
    """High mem_fraction_static OOMs, LL128 hangs NCCL; the two overlap in some trials. Each rule
    predicts one kind, and a failure of one kind is never attributed to the other's rule."""
    def judge(p: dict[str, Any], rng: random.Random) -> tuple[str | None, float]:
        if p["mem_fraction_static"] >= 0.9:
            return "oom", 0.0
        if p["NCCL_PROTO"] == "LL128":
            return "nccl-error", 0.0
        return None, _throughput(p, rng)

    study, _ = _study(tmp_path, "mixed", 40, judge, seed=3,
                      fixed=[{"mem_fraction_static": 0.93, "NCCL_PROTO": "LL128"},
                             {"mem_fraction_static": 0.91, "NCCL_PROTO": "LL128"}])
    doc = explain(study)
    kinds = {t.number: t.user_attrs["failure_kind"] for t in study.trials}
    by_kind = {r["kind"]: r for r in doc["failure_rules"]}
    assert set(by_kind) == {"oom", "nccl-error"} and len(doc["failure_rules"]) == 2, _rules(doc)
    assert by_kind["oom"]["conditions"][0]["param"] == "mem_fraction_static"
    assert by_kind["nccl-error"]["conditions"] == [{"param": "NCCL_PROTO", "op": "=", "value": "LL128"}]
    for rule in doc["failure_rules"]:
        assert {kinds[n] for n in rule["trials"]} == {rule["kind"]}
    # The LL128 trials that OOMed first do not refute the LL128 rule, and are shown as covered.
    ll128 = [t for t in study.trials if t.user_attrs["applied"]["NCCL_PROTO"] == "LL128"]
    assert by_kind["nccl-error"]["support"] == {"failed": sum(kinds[t.number] == "nccl-error" for t in ll128),
                                                "covered": len(ll128)}
    assert by_kind["nccl-error"]["other_failures"] >= 2
    assert doc["unexplained_failures"]["count"] == 0
    assert crash_rules(study) == _rules(doc)  # the printed rules alone, without the importances


def test_a_mixed_region_makes_no_rule(tmp_path: Path) -> None:
    """Today's ``mem_fraction_static >= 0.87: 2/2 infeasible (mostly oom)``: two failures of two
    kinds are no rule, and are reported as explained by no rule."""
    def judge(p: dict[str, Any], rng: random.Random) -> tuple[str | None, float]:
        return None, _throughput(p, rng)

    study, _ = _study(tmp_path, "few", 20, judge, seed=5)
    for params, kind in (({"mem_fraction_static": 0.88}, "oom"), ({"mem_fraction_static": 0.9}, "nccl-error")):
        study.add_trial(_trial(SPACE.repair({**_random_params(random.Random(9)), **params}), kind, None))
    doc = explain(study)
    assert doc["failure_rules"] == []
    assert doc["unexplained_failures"]["count"] == 2
    assert doc["unexplained_failures"]["kinds"] == {"nccl-error": 1, "oom": 1}


def test_a_failure_earlier_in_a_trial_does_not_refute_a_rule(tmp_path: Path) -> None:
    """Under 0.56 mem_fraction_static the KV pool does not fit, before NCCL ever runs; Tree trials
    that get past it fail with a NCCL error. The Tree trials that ran out of memory first do not
    count against the Tree rule (they could not show a NCCL error): one rule, Tree alone, with them
    covered as other failures -- not a two-condition rule that fences them off."""
    def judge(p: dict[str, Any], rng: random.Random) -> tuple[str | None, float]:
        if p["mem_fraction_static"] <= 0.55:
            return "not-enough-memory", 0.0
        if p["NCCL_ALGO"] == "Tree":
            return "nccl-error", 0.0
        return None, _throughput(p, rng)

    study, _ = _study(tmp_path, "stages", 24, judge, seed=0,
                      fixed=[{"NCCL_ALGO": "Tree", "mem_fraction_static": 0.8}] * 4
                      + [{"NCCL_ALGO": "Tree", "mem_fraction_static": 0.5}] * 3 + [{"NCCL_ALGO": "Ring", "mem_fraction_static": 0.5}] * 2)
    by_kind = {r["kind"]: r for r in explain(study)["failure_rules"]}
    tree = [t for t in study.trials if t.user_attrs["applied"]["NCCL_ALGO"] == "Tree"]
    nccl = [t for t in tree if t.user_attrs["failure_kind"] == "nccl-error"]
    rule = by_kind["nccl-error"]
    assert rule["conditions"] == [{"param": "NCCL_ALGO", "op": "=", "value": "Tree"}], rule
    assert rule["support"] == {"failed": len(nccl), "covered": len(tree)}
    assert rule["other_failures"] == len(tree) - len(nccl) >= 3
    assert by_kind["not-enough-memory"]["conditions"][0]["param"] == "mem_fraction_static"


def test_a_study_where_every_trial_failed_makes_no_rule(tmp_path: Path) -> None:
    """Above 0.6 mem_fraction_static every trial runs out of memory; below, Tree trials fail with
    a NCCL error and the others run out of memory at graph capture. No trial succeeded, so none
    could refute anything: "mem_fraction_static <= x -> nccl-error" would only say where the OOMs
    did not come first. No rule; every failure is reported as explained by none."""
    def judge(p: dict[str, Any], rng: random.Random) -> tuple[str | None, float]:
        if p["mem_fraction_static"] >= 0.6:
            return "oom", 0.0
        return ("nccl-error", 0.0) if p["NCCL_ALGO"] == "Tree" else ("oom", 0.0)

    study, _ = _study(tmp_path, "allfail", 24, judge, seed=1,
                      fixed=[{"NCCL_ALGO": "Tree", "mem_fraction_static": 0.52 + 0.01 * i} for i in range(4)]
                      + [{"NCCL_ALGO": "Tree", "mem_fraction_static": 0.8}] * 3)
    doc = explain(study)
    assert doc["outcomes"] == {"infeasible": len(study.trials)}
    assert doc["failure_rules"] == []
    assert doc["unexplained_failures"]["count"] == len(study.trials)


@pytest.mark.parametrize("seed", [3, 5, 7, 9])
def test_failures_unrelated_to_the_parameters_make_no_rule(tmp_path: Path, seed: int) -> None:
    """60 % of the trials run out of memory whatever their configuration. Among the hundreds of
    conditions a study offers, one of them covers 5 to 10 trials that all failed (chance a few per
    cent each); the search is paid for, so none is a rule."""
    def judge(p: dict[str, Any], rng: random.Random) -> tuple[str | None, float]:
        return ("oom", 0.0) if rng.random() < 0.6 else (None, _throughput(p, rng))

    study, _ = _study(tmp_path, f"chance{seed}", 30, judge, seed=seed)
    assert sum(t.user_attrs["failure_kind"] == "oom" for t in study.trials) >= 12
    assert explain(study)["failure_rules"] == []


def test_a_numeric_confound_is_named(tmp_path: Path) -> None:
    """16 channels or more crash NCCL (the buffers do not fit), and the search set
    NCCL_MAX_NCHANNELS = 64 in exactly those trials: the data cannot tell the two thresholds
    apart, so the rule names the other one."""
    def judge(p: dict[str, Any], rng: random.Random) -> tuple[str | None, float]:
        return ("nccl-error", 0.0) if p["NCCL_MIN_NCHANNELS"] >= 16 else (None, _throughput(p, rng))

    fixed = ([{"NCCL_ALGO": "Ring", "NCCL_MIN_NCHANNELS": 20 + 2 * i, "NCCL_MAX_NCHANNELS": 64} for i in range(5)]
             + [{"NCCL_ALGO": ("unset", "Ring")[i % 2], "NCCL_MIN_NCHANNELS": 1 + i % 12, "NCCL_MAX_NCHANNELS": 16}
                for i in range(20)])
    study, _ = _study(tmp_path, "alias", 0, judge, seed=0, fixed=fixed)
    doc = explain(study)
    (rule,) = doc["failure_rules"]
    assert rule["kind"] == "nccl-error" and rule["support"] == {"failed": 5, "covered": 5}, rule
    (cond,) = rule["conditions"]
    assert cond["param"] in ("NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS") and cond["op"] == ">="
    other = ({"NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS"} - {cond["param"]}).pop()
    assert [c["param"] for c in rule["confounded_conditions"]] == [other]
    assert rule["confounded_with"] == [f"{c['param']} {c['op']} {c['value']}" for c in rule["confounded_conditions"]]
    text = autotune("study", "explain", "alias", "--storage", f"sqlite:///{tmp_path}/studies.db", cwd=tmp_path).stdout
    assert f"not told apart from {rule['confounded_with'][0]}" in " ".join(text.split())


def test_a_pairwise_rule_when_only_the_combination_crashes(tmp_path: Path) -> None:
    """Many channels crash only with big buffers (the buffers do not fit): one rule over both."""
    def judge(p: dict[str, Any], rng: random.Random) -> tuple[str | None, float]:
        if p["NCCL_MIN_NCHANNELS"] >= 12 and p["NCCL_BUFFSIZE"] >= 8 * MIB:
            return "nccl-error", 0.0
        return None, _throughput(p, rng)

    study, _ = _study(tmp_path, "pair", 60, judge, seed=1,
                      fixed=[{"NCCL_MIN_NCHANNELS": 16, "NCCL_BUFFSIZE": 8 * MIB},
                             {"NCCL_MIN_NCHANNELS": 24, "NCCL_BUFFSIZE": 16 * MIB},
                             {"NCCL_MIN_NCHANNELS": 32, "NCCL_BUFFSIZE": 16 * MIB},
                             {"NCCL_MIN_NCHANNELS": 20, "NCCL_BUFFSIZE": 1 * MIB},
                             {"NCCL_MIN_NCHANNELS": 2, "NCCL_BUFFSIZE": 16 * MIB}])
    doc = explain(study)
    failed = sorted(t.number for t in study.trials if t.user_attrs["failure_kind"])
    assert len(failed) >= 4
    (rule,) = doc["failure_rules"]
    assert {c["param"] for c in rule["conditions"]} == {"NCCL_MIN_NCHANNELS", "NCCL_BUFFSIZE"}
    assert all(c["op"] == ">=" for c in rule["conditions"]) and rule["kind"] == "nccl-error"
    assert rule["trials"] == failed and rule["support"] == {"failed": len(failed), "covered": len(failed)}
    assert " & " in rule["rule"] and rule["rule"].endswith(f"-> nccl-error ({len(failed)} of {len(failed)})")


TPE_PARAMS = ("NCCL_PROTO", "NCCL_ALGO", "mem_fraction_static", "num_continuous_decode_steps", "max_running_requests")


def _tpe_study(name: str, n: int, judge: Callable[[dict[str, Any], random.Random], tuple[str | None, float]],
               *, seed: int) -> optuna.Study:
    """A study of ``n`` trials proposed by multivariate TPE over ``TPE_PARAMS``, each judged by
    ``judge`` and told as the driver tells it: the sampler drifts every parameter toward the best
    trials together, as in a real study. In memory (TPE reads every trial at each ask)."""
    study = optuna.create_study(study_name=name, direction="maximize",
                                sampler=optuna.samplers.TPESampler(seed=seed, multivariate=True, n_startup_trials=8))
    rng = random.Random(seed)
    for _ in range(n):
        trial = study.ask({k: DISTS[k] for k in TPE_PARAMS})
        params = dict(trial.params)
        kind, value = judge(params, rng)
        assert kind is None
        for key, attr in (("applied", params), ("feasible", True), ("failure_kind", None), ("outcome", "ok"),
                          ("metrics", {"output_throughput": value})):
            trial.set_user_attr(key, attr)
        study.tell(trial, value)
    return study


def _speed(p: dict[str, Any], rng: random.Random, *, few_requests: int = 0) -> float:
    """Throughput that depends on NCCL_PROTO and mem_fraction_static, with 2 % noise; under
    ``few_requests`` running requests it collapses."""
    speed = PROTO_SPEED[p["NCCL_PROTO"]] * (0.8 + 0.4 * (p["mem_fraction_static"] - 0.5) / 0.45)
    speed *= 0.3 if p["max_running_requests"] < few_requests else 1.0
    return 1000.0 * speed * (1 + 0.02 * rng.gauss(0, 1))


def test_no_effect_needs_many_trials_and_matched_evidence(tmp_path: Path) -> None:
    """num_continuous_decode_steps does nothing. In a TPE study every parameter drifts toward the
    best trials together; pairs of trials alike in all the others still show, over 150 trials, that
    it moves nothing (the spread's high end is small over the values they compared); NCCL_PROTO has
    an effect; over few trials only "not enough trials"."""
    storage = f"sqlite:///{tmp_path}/tpe.db"
    optuna.copy_study(from_study_name="many", from_storage=_tpe_study("many", 150, lambda p, rng: (None, _speed(p, rng)),
                                                                     seed=1)._storage, to_storage=storage)
    study = optuna.load_study(study_name="many", storage=storage)
    doc = explain(study)
    imp = doc["importance"]["objective"]
    assert imp["verdict"] == "ok" and imp["trials"] == 150
    ncds = imp["params"]["num_continuous_decode_steps"]
    assert ncds["verdict"] == "no measurable effect", ncds
    matched = ncds["matched"]
    assert matched["pairs"] >= 20 and 0.0 <= matched["spread"] <= matched["spread_high"] < 0.02
    assert 0.0 < matched["resolution"] < 0.02  # what the fit's own noise would show: below the bound claimed
    assert len(matched["over"]) == 2 and 1 <= matched["over"][0] < matched["over"][1] <= 8
    assert imp["params"]["NCCL_PROTO"]["verdict"] == "effect"
    assert imp["params"]["mem_fraction_static"]["verdict"] != "no measurable effect"
    assert ncds["values"] == [1, 8]  # the values tried
    text = autotune("study", "explain", "many", "--storage", storage, cwd=tmp_path).stdout
    assert (f"no measurable effect (between the values compared: {matched['over'][0]}..{matched['over'][1]})"
            in " ".join(text.split()))
    # an uncertain verdict says how large an effect the matched pairs still allow
    bounded = [(k, v["matched"]["spread_high"]) for k, v in imp["params"].items()
               if v["verdict"] == "uncertain" and (v.get("matched") or {}).get("spread_high") is not None]
    assert bounded, imp["params"]
    for k, high in bounded:
        assert re.search(rf"{k} +[0-9.]+ \[[0-9., ]+\]  uncertain \(spread <= {100 * high:.1f} %\)", text), text
    assert "'no measurable effect' needs below 2 % of the mean" in " ".join(text.split())

    def judge(p: dict[str, Any], rng: random.Random) -> tuple[str | None, float]:
        return None, _throughput(p, rng)

    few, _ = _study(tmp_path, "few", 12, judge, seed=2)
    part = explain(few)["importance"]["objective"]
    assert part["verdict"] == "ok" and part["trials"] == 12 and part["sureness"].startswith("few trials (12)")
    assert part["params"]["NCCL_PROTO"]["verdict"] == "effect" and part["params"]["NCCL_PROTO"]["p"] <= 0.01
    assert part["params"]["NCCL_PROTO"]["low"] >= 0.5  # given only what the test found: not lost among 10 terms
    assert all(v["verdict"] != "no measurable effect" for v in part["params"].values())
    assert part["params"]["num_continuous_decode_steps"]["verdict"] == "uncertain"
    tiny, _ = _study(tmp_path, "tiny", 9, judge, seed=2)
    assert explain(tiny)["importance"]["objective"]["verdict"] == "not enough trials (9, need 10)"


def test_no_effect_holds_only_between_the_values_compared(tmp_path: Path) -> None:
    """Under 64 running requests the throughput collapses. Five trials tried 16-40 requests, all
    with NCCL_ALGO=Tree, which no other trial had: they are alike only among themselves, and
    compare those values (all collapsed) with each other, never with the rest. Above 128 the requests do
    nothing, which pairs of the other trials show: "no measurable effect" is claimed between the
    values those pairs compared, which leave the rare ones out."""
    rng = random.Random(0)
    study = optuna.create_study(study_name="rare", storage=f"sqlite:///{tmp_path}/rare.db", direction="maximize")
    fixed = {"NCCL_PROTO": "LL128", "NCCL_BUFFSIZE": 4 * MIB, "NCCL_MIN_NCHANNELS": 4, "NCCL_MAX_NCHANNELS": 16,
             "speculative_num_draft_tokens": "unset", "cuda_graph_max_bs": 256}
    for i in range(105):
        rare = i % 21 == 20
        p = SPACE.repair({**fixed, "NCCL_ALGO": "Tree" if rare else rng.choice(["unset", "Ring"]),
                          "mem_fraction_static": round(rng.uniform(0.8, 0.9), 2),
                          "num_continuous_decode_steps": rng.randint(1, 8),
                          "max_running_requests": rng.randint(16, 40) if rare else int(round(2 ** rng.uniform(7, 10)))})
        study.add_trial(_trial(p, None, _speed(p, rng, few_requests=64)))
    mrr = explain(study)["importance"]["objective"]["params"]["max_running_requests"]
    assert mrr["values"][0] < 64  # tried
    assert mrr["verdict"] == "no measurable effect", mrr
    assert 128 <= mrr["matched"]["over"][0] < mrr["matched"]["over"][1] <= 1024, mrr


def test_a_middling_study_is_uncertain_not_no_effect(tmp_path: Path) -> None:
    """30 trials are too few to rule an effect out: no parameter gets "no measurable effect"."""
    def judge(p: dict[str, Any], rng: random.Random) -> tuple[str | None, float]:
        return None, _throughput(p, rng)

    study, _ = _study(tmp_path, "thirty", 30, judge, seed=4)
    params = explain(study)["importance"]["objective"]["params"]
    assert params["num_continuous_decode_steps"]["verdict"] == "uncertain"
    assert all(v["verdict"] != "no measurable effect" for v in params.values())
    assert params["NCCL_PROTO"]["verdict"] == "effect"


def test_explain_json_and_text_through_the_cli(tmp_path: Path) -> None:
    def judge(p: dict[str, Any], rng: random.Random) -> tuple[str | None, float]:
        if p["NCCL_ALGO"] == "Tree":
            return "nccl-error", 0.0
        if p["mem_fraction_static"] <= 0.52:
            return "not-enough-memory", 0.0
        return None, _throughput(p, rng)

    study, storage = _study(tmp_path, "cli", 40, judge, seed=7,
                            fixed=[{"mem_fraction_static": 0.9, "NCCL_ALGO": "Ring"}] * 1)
    proc = autotune("study", "explain", "cli", "--storage", storage, "--json", cwd=tmp_path)
    doc = json.loads(proc.stdout)
    assert doc == json.loads(json.dumps(explain(study)))  # the CLI prints explain()'s document
    assert "importances" not in doc and all("failed_of_covered" not in r for r in doc["failure_rules"])
    assert doc["rule_settings"]["min_support"] == MIN_SUPPORT
    tree = sum(1 for t in study.trials if t.user_attrs["failure_kind"] == "nccl-error")
    assert f"NCCL_ALGO=Tree -> nccl-error ({tree} of {tree})" in _rules(doc)
    for part in ("objective", "feasibility"):
        body = doc["importance"][part]
        assert body["verdict"] == "ok"
        for v in body["params"].values():
            assert {"median", "low", "high", "verdict", "alone", "spread", "spread_high", "values"} <= set(v)
            assert v["low"] <= v["median"] <= v["high"]
    assert doc["importance"]["feasibility"]["params"]["NCCL_ALGO"]["verdict"] == "effect"
    text = autotune("study", "explain", "cli", "--storage", storage, cwd=tmp_path).stdout
    assert f"NCCL_ALGO=Tree -> nccl-error ({tree} of {tree})" in text
    assert "what matters for the objective" in text and "what matters for feasibility" in text
    assert "NCCL_PROTO" in text
    n, ok = len(study.trials), sum(1 for t in study.trials if t.user_attrs["outcome"] == "ok")
    assert f"cli: {n} trials: {ok} ok, {n - ok} infeasible" in text  # counts, most first, as the summary's


def test_a_spread_bound_resting_on_a_resample_that_lost_its_pairs_is_unknown() -> None:
    """The 95th percentile of 100 resamples interpolates between the 95th and 96th smallest.
    With 5 resamples unable to estimate the spread (UNKNOWABLE), it lay 5 % of the way to 1e300,
    and explain printed ``uncertain (spread <= 4999...8.0 %)`` on a Kimi study of the explain
    bench. Such a bound is unknown; one among known resamples stays as it was."""
    from autotune.analysis.importance import UNKNOWABLE, spread_bound

    known = np.linspace(0.01, 0.05, 100)
    assert spread_bound(known) == pytest.approx(float(np.percentile(known, 95)))
    four = known.copy()
    four[-4:] = UNKNOWABLE  # the percentile still lies between known resamples
    assert spread_bound(four) == pytest.approx(float(np.percentile(known, 95)))
    five = known.copy()
    five[-5:] = UNKNOWABLE
    assert float(np.percentile(five, 95)) > 1e298  # what was printed
    assert spread_bound(five) is None
    assert spread_bound(np.full(100, UNKNOWABLE)) is None


@pytest.mark.parametrize("failing", [1, 2, 3])
def test_feasibility_needs_as_many_failures_as_a_crash_rule(tmp_path: Path, failing: int) -> None:
    """One or two failures in 30 trials would give every parameter a share of those trials' luck:
    feasibility says "not enough failures" (the demo printed ten lines of "uncertain" over one
    NCCL error); from MIN_SUPPORT failures on, its parameters are rated."""
    judged = iter(range(10**6))

    def judge(p: dict[str, Any], rng: random.Random) -> tuple[str | None, float]:
        return ("nccl-error", 0.0) if next(judged) < failing else (None, _throughput(p, rng))  # the fixed ones

    study, storage = _study(tmp_path, f"f{failing}", 30, judge, seed=3, fixed=[{"NCCL_ALGO": "Tree"}] * failing)
    assert sum(t.user_attrs.get("outcome") == "infeasible" for t in study.trials) == failing
    doc = explain(study)
    feas = doc["importance"]["feasibility"]
    if failing < MIN_SUPPORT:
        assert feas["verdict"] == f"not enough failures ({failing}, need {MIN_SUPPORT})" and feas["params"] == {}
        text = autotune("study", "explain", f"f{failing}", "--storage", storage, cwd=tmp_path).stdout
        assert f"what matters for feasibility: not enough failures ({failing}, need {MIN_SUPPORT})" in text
    else:
        assert feas["verdict"] == "ok" and "NCCL_ALGO" in feas["params"]
    assert doc["importance"]["objective"]["verdict"] == "ok"


@pytest.mark.parametrize("n", [0, 3])
def test_tiny_studies_explain_without_error(tmp_path: Path, n: int) -> None:
    def judge(p: dict[str, Any], rng: random.Random) -> tuple[str | None, float]:
        return ("oom", 0.0) if rng.random() < 0.5 else (None, _throughput(p, rng))

    study, _ = _study(tmp_path, f"tiny{n}", n, judge)
    doc = explain(study)
    assert doc["failure_rules"] == [] and doc["trials"] == n
    assert doc["importance"]["objective"]["verdict"].startswith("not enough trials")


def test_a_rule_says_where_it_was_tried_on_parameters_monotone_for_its_kind(tmp_path: Path) -> None:
    """Large buffers crash only with many channels (the buffers per channel add up); the search
    tried 8 MiB buffers only with 16 channels or more. The space declares channels monotone for
    nccl-error, so the rule says it was tried only there: fewer channels may be what makes such
    buffers fit. A study without the declarations (made before they were stored) says only that
    the search never tried buffers past 8 MiB (16 MiB is in the space): by nothing it knows does
    the rule go on there."""
    def judge(p: dict[str, Any], rng: random.Random) -> tuple[str | None, float]:
        crash = p["NCCL_BUFFSIZE"] >= 8 * MIB and p["NCCL_MIN_NCHANNELS"] >= 12
        return ("nccl-error", 0.0) if crash else (None, _throughput(p, rng))

    big = [{"NCCL_BUFFSIZE": 8 * MIB, "NCCL_MIN_NCHANNELS": c, "NCCL_MAX_NCHANNELS": 32, "NCCL_ALGO": "unset"}
           for c in (16, 20, 24, 28, 32)]
    small = [{"NCCL_BUFFSIZE": b * MIB, "NCCL_MIN_NCHANNELS": c, "NCCL_MAX_NCHANNELS": 32, "NCCL_ALGO": "unset"}
             for b in (1, 2) for c in (1, 2, 4, 8, 16, 32)]
    study, _ = _study(tmp_path, "scope", 0, judge, fixed=big + small * 2)
    assert explain(study)["failure_rules"][0]["scope"] == ["NCCL_BUFFSIZE <= 8388608"]  # nothing stored
    study.set_user_attr("space_monotone", SPACE.monotone())
    (rule,) = explain(study)["failure_rules"]
    assert rule["conditions"] == [{"param": "NCCL_BUFFSIZE", "op": ">=", "value": 8 * MIB}]
    assert rule["scope"] == ["NCCL_MIN_NCHANNELS >= 16"]
    assert rule["rule"] == "NCCL_BUFFSIZE >= 8388608 -> nccl-error (5 of 5; shown only with NCCL_MIN_NCHANNELS >= 16)"
    assert crash_rules(study) == [rule["rule"]]


@pytest.mark.parametrize(("way", "failures", "declared", "stated"), [
    ("up", 4, True, True),     # a threshold the way the space declares cuda_graph_max_bs monotone for oom
    ("up", 4, False, False),   # the same failures, no declarations stored: too thin for a boundary
    ("down", 4, True, False),  # against the declared way
    ("down", 5, True, True),   # the support of a pair
])
def test_a_thin_memory_rule_must_be_a_declared_threshold(way: str, failures: int, declared: bool,
                                                         stated: bool) -> None:
    """Out of memory is a boundary over several parameters: a one-condition rule on fewer than
    five failures of a memory kind is stated only as a threshold the way the space declares its
    parameter monotone for that kind."""
    rng = random.Random(7)
    study = optuna.create_study(direction="maximize")
    if declared:
        study.set_user_attr("space_monotone", SPACE.monotone())
    big = way == "up"
    for i in range(24):
        p = SPACE.repair({**_random_params(rng), "cuda_graph_max_bs": rng.randint(40, 300)})
        study.add_trial(_trial(p, None, _throughput(p, rng)))
    for i in range(failures):
        p = SPACE.repair({**_random_params(rng), "cuda_graph_max_bs": 420 + 20 * i if big else 10 + i})
        study.add_trial(_trial(p, "oom", None))
    rules = explain(study)["failure_rules"]
    if not stated:
        assert rules == []
        return
    (rule,) = rules
    assert rule["conditions"] == [{"param": "cuda_graph_max_bs", "op": ">=" if big else "<=",
                                   "value": 420 if big else 10 + failures - 1}]
    assert rule["support"] == {"failed": failures, "covered": failures}


def test_the_driver_stores_the_declarations_that_scope_the_rules(tmp_path: Path) -> None:
    """A study the driver runs keeps its space's ``monotone:`` declarations, which explain reads."""
    from autotune.analysis.explain import space_monotone
    from autotune.bench.setups import Setup
    from autotune.study.driver import Driver
    from autotune.bench.model_executor import ModelExecutor

    setup = Setup("rtx6000-pcie-glm5", "sglang_nccl", "quick", None)
    cfg = setup.config(name="mono", storage=f"sqlite:///{tmp_path}/m.db", sampler="tpe", seed=0, trials=2)
    ex = ModelExecutor.for_target(cfg, setup.objective, seed=0)
    study = Driver(cfg, setup.space, setup.objective, ex, trials=2).run().study
    assert space_monotone(study) == setup.space.monotone() and space_monotone(study)["NCCL_MIN_NCHANNELS"]["nccl-error"] == "up"


def test_a_rules_scope_is_read_from_the_trials_it_was_judged_on(tmp_path: Path) -> None:
    """Two causes of OOM: a memory fraction of 0.9 or more, and 8 draft tokens with CUDA graphs up
    to a batch of 256 or more. Two trials with 8 draft tokens and small graphs failed too, at 0.92:
    the memory rule explains them, so they are not the draft-token rule's evidence, and its scope
    names the large graphs where its own failures were."""
    def judge(p: dict[str, Any], rng: random.Random) -> tuple[str | None, float]:
        if p["mem_fraction_static"] >= 0.9:
            return "oom", 0.0
        if p["speculative_num_draft_tokens"] == 8 and p["cuda_graph_max_bs"] >= 256:
            return "oom", 0.0
        return None, _throughput(p, rng)

    fixed_rest = {"NCCL_MIN_NCHANNELS": 4, "NCCL_MAX_NCHANNELS": 16, "NCCL_BUFFSIZE": 4 * MIB, "NCCL_ALGO": "unset",
                  "max_running_requests": 128}
    memory = [{"mem_fraction_static": 0.92, "speculative_num_draft_tokens": s, "cuda_graph_max_bs": g}
              for s, g in (("unset", 16), (8, 16), (8, 32), ("unset", 300), (2, 400), ("unset", 500), (3, 64),
                           ("unset", 128), (2, 200), ("unset", 256))]
    drafts = [{"mem_fraction_static": 0.7, "speculative_num_draft_tokens": 8, "cuda_graph_max_bs": g}
              for g in (256, 300, 384, 448, 512)]
    fine = [{"mem_fraction_static": m, "speculative_num_draft_tokens": s, "cuda_graph_max_bs": g}
            for m in (0.7, 0.8, 0.85) for s in ("unset", 2, 3) for g in (16, 64, 300, 512)]
    study, _ = _study(tmp_path, "judged", 0, judge, fixed=[{**fixed_rest, **f} for f in memory + drafts + fine])
    study.set_user_attr("space_monotone", SPACE.monotone())
    rules = {r["conditions"][0]["param"]: r for r in explain(study)["failure_rules"]}
    assert set(rules) == {"mem_fraction_static", "speculative_num_draft_tokens"}
    draft = rules["speculative_num_draft_tokens"]
    assert draft["support"]["covered"] == 7 and sorted(draft["trials"]) == [10, 11, 12, 13, 14]
    assert draft["scope"] == ["cuda_graph_max_bs >= 256"]  # over all 7 it covers, graphs from 16: no scope


def test_a_threshold_is_shown_only_as_far_as_its_trials_reached_the_failure(tmp_path: Path) -> None:
    """NCCL buffers stop fitting at a memory fraction of 0.86 (an NCCL error at start-up); from 0.9
    the KV pool cannot even be sized (not-enough-memory, before NCCL ever runs). The NCCL rule
    says it was shown up to 0.89 only: past it the trials failed before they could show it. The
    space declares the fraction monotone for OOMs, not for NCCL errors, so nothing else carries it
    further. A rule on a parameter declared monotone for its kind is not bounded so."""
    def judge(p: dict[str, Any], rng: random.Random) -> tuple[str | None, float]:
        if p["mem_fraction_static"] >= 0.9:
            return "not-enough-memory", 0.0
        if p["mem_fraction_static"] >= 0.86:
            return "nccl-error", 0.0
        return None, _throughput(p, rng)

    fixed = [{"mem_fraction_static": m, "NCCL_ALGO": "unset"} for m in (0.86, 0.87, 0.88, 0.89, 0.9, 0.93, 0.95)]
    study, _ = _study(tmp_path, "reach", 24, judge, fixed=fixed)
    study.set_user_attr("space_monotone", SPACE.monotone())
    rules = {r["kind"]: r for r in explain(study)["failure_rules"]}
    nccl = rules["nccl-error"]
    assert nccl["conditions"] == [{"param": "mem_fraction_static", "op": ">=", "value": 0.86}]
    assert nccl["scope"] == ["mem_fraction_static <= 0.89"]
    assert nccl["rule"].startswith("mem_fraction_static >= 0.86 -> nccl-error (")
    assert nccl["rule"].endswith("; shown only with mem_fraction_static <= 0.89)")
    # not-enough-memory is declared monotone (down) in the fraction, not up: its threshold is bounded
    # only by what was tried; the study tried up to the space's top, so there is nothing to say.
    nem = rules["not-enough-memory"]
    assert nem["conditions"] == [{"param": "mem_fraction_static", "op": ">=", "value": 0.9}]
    assert not any(c["param"] == "mem_fraction_static" for c in nem["scope_conditions"])


def test_a_rule_names_the_conditions_the_trials_do_not_choose_from(tmp_path: Path) -> None:
    """Four NCCL errors: two with many channels at a high memory fraction, one with many channels
    at a low one, one with few channels at a high one. ``NCCL_MIN_NCHANNELS >= 18`` and
    ``mem_fraction_static >= 0.91`` each cover three of them and no success: the rule printed
    first says the other explains as many, as cleanly."""
    failing = {(20, 0.92), (24, 0.93), (18, 0.6), (2, 0.91)}

    def judge(p: dict[str, Any], rng: random.Random) -> tuple[str | None, float]:
        failed = (p["NCCL_MIN_NCHANNELS"], p["mem_fraction_static"]) in failing
        return ("nccl-error", 0.0) if failed else (None, _throughput(p, rng))

    base = {"NCCL_ALGO": "unset", "NCCL_MAX_NCHANNELS": 32}
    fine = [(c, m) for c in (1, 2, 4, 8, 12) for m in (0.6, 0.7, 0.8, 0.85)] * 2
    fixed = [{**base, "NCCL_MIN_NCHANNELS": c, "mem_fraction_static": m} for c, m in [*sorted(failing), *fine]]
    study, _ = _study(tmp_path, "as-sure", 0, judge, fixed=fixed)
    (rule,) = explain(study)["failure_rules"]
    first, = rule["conditions"]
    other = {"NCCL_MIN_NCHANNELS": "mem_fraction_static", "mem_fraction_static": "NCCL_MIN_NCHANNELS"}[first["param"]]
    assert [c["param"] for c in rule["as_sure_conditions"]] == [other]
    assert rule["support"] == {"failed": 3, "covered": 3}
    assert rule["as_sure"] == [f"{c['param']} {c['op']} {c['value']}" for c in rule["as_sure_conditions"]]
    text = autotune("study", "explain", "as-sure", "--storage", f"sqlite:///{tmp_path}/studies.db", cwd=tmp_path).stdout
    assert f"or as surely {rule['as_sure'][0]}: these trials do not choose" in " ".join(text.split())


def test_failures_of_several_causes_make_no_rule_on_a_bystander(tmp_path: Path) -> None:
    """Three OOMs share large CUDA-graph batches (``cuda_graph_max_bs`` 400), and only a Tree
    crash -- which could have pre-empted an OOM -- stands against it; but two of them had 8 draft
    tokens, which ran out of memory in every trial that had them, and the third ran 700 requests.
    The batch limit is a bystander of two causes, each shown by too few failures for a rule: no
    rule on it, and those three failures stay unexplained."""
    def judge(p: dict[str, Any], rng: random.Random) -> tuple[str | None, float]:
        if p["NCCL_ALGO"] == "Tree":
            return "nccl-error", 0.0
        if (p["mem_fraction_static"] >= 0.9 or p["speculative_num_draft_tokens"] == 8
                or (p["cuda_graph_max_bs"] >= 300 and p["max_running_requests"] >= 600)):
            return "oom", 0.0
        return None, _throughput(p, rng)

    base = {"NCCL_ALGO": "unset", "speculative_num_draft_tokens": "unset", "cuda_graph_max_bs": 64,
            "max_running_requests": 64, "mem_fraction_static": 0.6}
    too_much = [{**base, "mem_fraction_static": m} for m in (0.9, 0.91, 0.92, 0.93, 0.94, 0.95, 0.9, 0.93)]
    too_much.append({**base, "mem_fraction_static": 0.92, "speculative_num_draft_tokens": 8})
    bystander = [{**base, "cuda_graph_max_bs": 400, "speculative_num_draft_tokens": 8}] * 2
    bystander += [{**base, "cuda_graph_max_bs": 400, "max_running_requests": 700},
                  {**base, "cuda_graph_max_bs": 400, "NCCL_ALGO": "Tree"}]
    fine = [{**base, "mem_fraction_static": m, "cuda_graph_max_bs": c, "max_running_requests": r,
             "speculative_num_draft_tokens": s}
            for m, c, r, s in zip((0.6, 0.7, 0.8, 0.85) * 5, (8, 32, 128, 200, 96) * 4, (16, 64, 256, 500) * 5,
                                  ("unset", 2, 3, "unset", 2) * 4)]
    study, _ = _study(tmp_path, "bystander", 0, judge, fixed=too_much + bystander + fine)
    doc = explain(study)
    assert _rules(doc) == ["mem_fraction_static >= 0.9 -> oom (9 of 9)"]
    by_number = {t.number: t.user_attrs["applied"] for t in study.trials}
    left = doc["unexplained_failures"]["trials"]
    assert [by_number[n]["cuda_graph_max_bs"] for n in left] == [400] * 4  # the three OOMs and the Tree crash
    assert doc["unexplained_failures"]["kinds"] == {"oom": 3, "nccl-error": 1}


def test_a_clean_rule_keeps_failures_another_cause_shares(tmp_path: Path) -> None:
    """Three Tree trials all crashed; two of them also had 16 MiB buffers, which crashed in every
    trial that had them (three more, taken first by the channels rule). No trial stands against
    Tree, so the buffers' share does not part it: the Tree rule is stated with all three."""
    def judge(p: dict[str, Any], rng: random.Random) -> tuple[str | None, float]:
        failed = p["NCCL_ALGO"] == "Tree" or p["NCCL_BUFFSIZE"] >= 8 * MIB or p["NCCL_MIN_NCHANNELS"] >= 16
        return ("nccl-error", 0.0) if failed else (None, _throughput(p, rng))

    base = {"NCCL_ALGO": "unset", "NCCL_BUFFSIZE": MIB, "NCCL_MIN_NCHANNELS": 2, "NCCL_MAX_NCHANNELS": 32}
    channels = [{**base, "NCCL_MIN_NCHANNELS": 20}] * 6 + [{**base, "NCCL_MIN_NCHANNELS": 20, "NCCL_BUFFSIZE": 16 * MIB}] * 3
    tree = [{**base, "NCCL_ALGO": "Tree"}] + [{**base, "NCCL_ALGO": "Tree", "NCCL_BUFFSIZE": 16 * MIB}] * 2
    fine = [{**base, "NCCL_ALGO": a, "NCCL_BUFFSIZE": b} for a in ("unset", "Ring") for b in (MIB // 4, MIB, 4 * MIB)] * 3
    study, _ = _study(tmp_path, "clean", 0, judge, fixed=[*channels, *tree, *fine])
    rules = [r.split(";")[0].rstrip(")") + ")" for r in _rules(explain(study))]  # without the scopes
    assert rules == ["NCCL_MIN_NCHANNELS >= 20 -> nccl-error (9 of 9)", "NCCL_ALGO=Tree -> nccl-error (3 of 3)"]


def test_a_kind_is_not_stated_where_a_rule_on_the_same_parameter_explains_another(tmp_path: Path) -> None:
    """A high memory fraction fails: out of memory in eight trials from 0.9 up, NCCL errors in
    three at 0.93. ``mem_fraction_static >= 0.93 -> nccl-error`` covers the three and two OOMs
    at 0.95; the rule ``mem_fraction_static >= 0.9 -> oom`` explains those OOMs, but by the same
    parameter: where the fraction is that high, which kind comes is not the fraction's doing, so
    the OOMs count against the NCCL rule as any failure of another kind does, and it is not
    stated (a quarter each, as for an OOM of another cause, made it 3 of 3.5)."""
    failing = {0.9: "oom", 0.91: "oom", 0.92: "oom", 0.93: "nccl-error", 0.95: "oom"}

    def judge(p: dict[str, Any], rng: random.Random) -> tuple[str | None, float]:
        kind = failing.get(p["mem_fraction_static"])
        return (kind, 0.0) if kind else (None, _throughput(p, rng))

    base = {"NCCL_ALGO": "unset", "NCCL_PROTO": "unset", "NCCL_MIN_NCHANNELS": 2, "NCCL_MAX_NCHANNELS": 32}
    high = [{**base, "mem_fraction_static": m} for m in (0.9, 0.9, 0.91, 0.91, 0.92, 0.92, 0.93, 0.93, 0.93, 0.95, 0.95)]
    fine = [{**base, "mem_fraction_static": m, "NCCL_PROTO": p} for m in (0.6, 0.7, 0.8, 0.85) for p in ("unset", "LL128")] * 3
    study, _ = _study(tmp_path, "same-parameter", 0, judge, fixed=[*high, *fine])
    doc = explain(study)
    assert [r.split(";")[0].rstrip(")") + ")" for r in _rules(doc)] == ["mem_fraction_static >= 0.9 -> oom (8 of 11)"]
    assert doc["unexplained_failures"]["kinds"] == {"nccl-error": 3}


def test_a_threshold_past_whose_failures_the_kind_changes_is_no_rule(tmp_path: Path) -> None:
    """GLM-5's ``sglang_nccl`` studies at 100 and 200 trials: NCCL errors at a memory fraction of
    0.93 (the buffers do not fit), OOMs at 0.94 (the request tables do not). ``mem_fraction_static
    >= 0.93 -> nccl-error`` would be 6 of 9, the three OOMs at half as "may have come first"
    (precision 0.8, just enough); but they lie past every NCCL error on the rule's own parameter:
    there the kind has changed, and they count in full (6 of 9 at 0.67: no rule)."""
    def judge(p: dict[str, Any], rng: random.Random) -> tuple[str | None, float]:
        m = p["mem_fraction_static"]
        return ("oom", 0.0) if m >= 0.94 else ("nccl-error", 0.0) if m >= 0.93 else (None, _throughput(p, rng))

    base = {"NCCL_ALGO": "unset", "NCCL_MAX_NCHANNELS": 32}
    settings = [{"NCCL_PROTO": p, "NCCL_MIN_NCHANNELS": c} for p in ("unset", "LL128") for c in (2, 4, 8)]
    nccl = [{**base, **s, "mem_fraction_static": 0.93} for s in settings]
    oom = [{**base, **s, "mem_fraction_static": 0.94} for s in settings[:3]]
    fine = [{**base, **s, "mem_fraction_static": m} for m in (0.6, 0.7, 0.8, 0.85, 0.9, 0.92) for s in settings] * 2
    study, _ = _study(tmp_path, "kind-changes", 0, judge, fixed=[*nccl, *oom, *fine])
    doc = explain(study)
    assert not [r for r in _rules(doc) if "nccl-error" in r], _rules(doc)
    assert doc["unexplained_failures"]["kinds"].get("nccl-error") == 6


@pytest.mark.parametrize("failures", [4, 5])
def test_a_pair_rule_rests_on_five_failures(tmp_path: Path, failures: int) -> None:
    """Many channels crash only with a high memory fraction (the buffers come out of what the
    fraction leaves). Four clean failures over the two thresholds are not enough to place both
    (on the explain bench every such pair was imprecise or false): no rule, the four left
    unexplained; a fifth makes the pair rule. (The buffer size is fixed: channels x buffers is
    a quantity of its own, autotune.config.derived.)"""
    def judge(p: dict[str, Any], rng: random.Random) -> tuple[str | None, float]:
        if p["NCCL_MIN_NCHANNELS"] >= 12 and p["mem_fraction_static"] >= 0.9:
            return "nccl-error", 0.0
        return None, _throughput(p, rng)

    base = {"NCCL_ALGO": "unset", "NCCL_PROTO": "unset", "NCCL_MAX_NCHANNELS": 64, "NCCL_BUFFSIZE": 4 * MIB}
    crash = [(16, 0.9), (24, 0.92), (32, 0.95), (20, 0.9), (28, 0.93)][:failures]
    fine = [(c, m) for c in (12, 16, 20, 24, 32) for m in (0.6, 0.7)] + [(c, m) for c in (1, 2, 4, 8)
                                                                         for m in (0.6, 0.7, 0.9, 0.95)]
    fixed = [{**base, "NCCL_MIN_NCHANNELS": c, "mem_fraction_static": m} for c, m in [*crash, *fine, *fine]]
    study, _ = _study(tmp_path, f"pair-{failures}", 0, judge, fixed=fixed)
    doc = explain(study)
    if failures < 5:
        assert _rules(doc) == [] and doc["unexplained_failures"]["kinds"] == {"nccl-error": failures}
    else:
        (rule,) = doc["failure_rules"]
        assert {c["param"] for c in rule["conditions"]} in ({"NCCL_MIN_NCHANNELS", "mem_fraction_static"},
                                                            {"nccl_buffers_mib", "mem_fraction_static"})
        assert rule["support"] == {"failed": 5, "covered": 5}


def _couples(n: int, values: Callable[[int], tuple[Any, Any]], rng: random.Random) -> tuple[list[dict[str, Any]], list[float]]:
    """``n`` couples of trials alike in all but ``spec`` (``values(i)``: the couple's two) and a
    small step of ``x``; ``couple`` (a categorical, one value per couple) keeps trials of two
    couples from matching. Throughput 1000 with ``spec`` "slow" 30 % lower, 1 % noise."""
    rows, y = [], []
    for i in range(n):
        for j, spec in enumerate(values(i)):
            rows.append({"spec": spec, "x": 2 * i + j, "couple": f"c{i}"})
            y.append((700.0 if spec == "slow" else 1000.0) * (1 + 0.01 * rng.gauss(0, 1)))
    return rows, y


def test_no_effect_is_not_read_from_pairs_that_cannot_tell_the_value_from_the_rest() -> None:
    """Every pair that compares ``spec``'s two values also moves ``x`` by the same step: the
    pairs cannot tell ``spec``'s 30 % from a slope in ``x``. The fit of such pairs is singular;
    the matched comparison gives no spread (so no "no measurable effect"), not the 0 that a
    singular fit's noise correction made of it (a false claim in the explain bench: a 100-trial
    GLM-5 study's `speculative_num_draft_tokens`, 11 % by the model)."""
    rows, y = _couples(25, lambda i: ("fast", "slow"), random.Random(0))
    matching = _Matching(rows, ["couple", "spec", "x"])
    doc = matched_effect(matching, [r["spec"] for r in rows], np.array(y) / np.mean(y), "spec")
    assert doc is not None and doc["pairs"] == 25
    assert doc["spread_high"] is None, doc
    # the same couples with ``x`` equal within each: the 30 % is measured, far from "no effect"
    for r in rows:
        r["x"] -= r["x"] % 2
    doc = matched_effect(_Matching(rows, ["couple", "spec", "x"]), [r["spec"] for r in rows],
                         np.array(y) / np.mean(y), "spec")
    assert doc is not None and doc["spread_high"] is not None and doc["spread"] > 0.1, doc


def test_no_effect_leaves_out_a_value_too_few_trials_compare() -> None:
    """``spec`` does nothing between "a" and "b" (many couples); "rare" is compared by 3 couples
    only. The claim's values (``over``) leave "rare" out: the bootstrap loses it in many
    resamples, where its effect cannot be estimated."""
    rows, y = _couples(40, lambda i: ("a", "rare" if i < 3 else "b"), random.Random(1))
    for r in rows:
        r["x"] -= r["x"] % 2
    doc = matched_effect(_Matching(rows, ["couple", "spec", "x"]), [r["spec"] for r in rows],
                         np.array(y) / np.mean(y), "spec")
    assert doc is not None and sorted(doc["over"]) == ["a", "b"] and doc["pairs"] == 37, doc
    assert doc["spread_high"] is not None and doc["spread_high"] < 0.02, doc


@pytest.mark.parametrize("seed", [1, 3])
def test_no_effect_is_not_claimed_over_a_value_with_an_effect(seed: int) -> None:
    """num_continuous_decode_steps = 2 is 8 % faster, every other value alike: a spread of about
    2.6 % of the mean across its values, above the 2 % a claim needs. No "no measurable effect"
    may hold over a range with 2 in it. With 3 knots instead of 8 (more pairs per knot: more claims
    in the explain bench) these two studies claimed it over 1..8 and 2..8, the bump smeared
    between the knots at 1 and 4.5; with 4 knots the first did."""
    def judge(p: dict[str, Any], rng: random.Random) -> tuple[str | None, float]:
        return None, _speed(p, rng) * (1.08 if p["num_continuous_decode_steps"] == 2 else 1.0)

    ncds = explain(_tpe_study("bump", 150, judge, seed=seed))["importance"]["objective"]["params"][
        "num_continuous_decode_steps"]
    if ncds["verdict"] == "no measurable effect":
        low, high = ncds["matched"]["over"]
        assert not low <= 2 <= high, ncds


@pytest.mark.parametrize("settings", [1, 3])
def test_a_rule_rests_on_failures_in_three_settings_of_the_other_parameters(tmp_path: Path, settings: int) -> None:
    """The NCCL buffers no longer fit once speculation's draft model takes its share of a high
    memory fraction, at the settings of the rest where memory was already short. A study that
    probed every draft-token count around one incumbent (0.92, speculation off, which ran) saw
    five failures, all at that one setting of the other parameters: they show that speculation
    fails *there*, not that it fails at 0.92 whatever the rest (on the explain bench's GLM-5 host
    such rules, ``mem_fraction_static >= 0.9 & speculative_num_draft_tokens >= 2 -> nccl-error``,
    held 18 % of the time over the configurations the study explored). No rule, and the five
    stay unexplained. The same failures at three settings of the rest make the rule."""
    own = ("speculative_num_draft_tokens", "mem_fraction_static")
    bases = [_random_params(random.Random(100 + i)) for i in range(settings)]

    def judge(p: dict[str, Any], rng: random.Random) -> tuple[str | None, float]:
        short = any(all(p[k] == b[k] for k in p if k not in own) for b in bases)
        if short and p["mem_fraction_static"] >= 0.92 and p["speculative_num_draft_tokens"] != "unset":
            return "nccl-error", 0.0
        return None, _throughput(p, rng)

    drafts = [2, 3, 4, 6, 8]
    probes = [{**bases[i % settings], "mem_fraction_static": 0.92, "speculative_num_draft_tokens": d}
              for i, d in enumerate(drafts)]
    incumbents = [{**bases[i % settings], "mem_fraction_static": 0.92, "speculative_num_draft_tokens": "unset"}
                  for i in range(6)]
    elsewhere = [{"mem_fraction_static": round(0.5 + 0.01 * k, 2),  # never short of memory, speculation seldom
                  "speculative_num_draft_tokens": drafts[k // 5 % 5] if k % 5 == 0 else "unset"} for k in range(40)]
    study, storage = _study(tmp_path, f"settings-{settings}", 0, judge, fixed=incumbents + probes + elsewhere)
    doc = explain(study)
    failed = sorted(t.number for t in study.trials if t.user_attrs["failure_kind"])
    assert len(failed) == 5
    if settings == 1:
        assert _rules(doc) == [] and doc["unexplained_failures"]["trials"] == failed
        # what the five do show, said as a fact of that configuration
        (local,) = doc["unexplained_failures"]["at_one_configuration"]
        assert local["text"] == (f"at one configuration (trial {failed[0]}'s, the rest unchanged): "
                                 "speculative_num_draft_tokens 2, 3, 4, 6, 8 failed (nccl-error); unset ran: "
                                 "what fails there, not a rule")
        assert local["trials"] == failed and local["param"] == "speculative_num_draft_tokens"
        shown = autotune("study", "explain", "settings-1", "--storage", storage, cwd=tmp_path).stdout
        assert f"{local['text']}: trials {', '.join(map(str, failed))}" in " ".join(shown.split())  # wrapped at 80
    else:
        (rule,) = doc["failure_rules"]
        assert rule["trials"] == failed and rule["kind"] == "nccl-error"
        assert any(c["param"] == "speculative_num_draft_tokens" for c in rule["conditions"])
        assert doc["unexplained_failures"]["at_one_configuration"] == []


def test_failures_on_the_product_of_channels_and_buffers_are_one_rule(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """NCCL's buffers are channels x the buffer per connection: failures where that product
    does not fit (many channels at small buffers, few at large ones) are one threshold over the
    derived quantity (autotune.config.derived), which neither parameter alone states; ``--json`` and
    the text say what it means."""
    from autotune.config.derived import nccl_buffers_mib

    rng = random.Random(3)
    storage = f"sqlite:///{tmp_path}/studies.db"
    study = optuna.create_study(study_name="buffers", storage=storage, direction="maximize")
    study.set_user_attr("space_monotone", SPACE.monotone())
    failed = 0
    while len(study.trials) < 40:
        p = SPACE.repair({**_random_params(rng), "NCCL_ALGO": "unset"})
        too_big = (nccl_buffers_mib(p) or 0.0) >= 120.0
        failed += too_big
        study.add_trial(_trial(p, "nccl-error" if too_big else None, None if too_big else _throughput(p, rng),
                               message="NCCL WARN Failed to CUDA calloc 9699328 bytes" if too_big else None))
    assert failed >= 6
    doc = explain(study)
    (rule,) = [r for r in doc["failure_rules"] if r["kind"] == "nccl-error"]
    assert [c["param"] for c in rule["conditions"]] == ["nccl_buffers_mib"]
    assert rule["conditions"][0]["op"] == ">=" and rule["conditions"][0]["value"] >= 120.0  # at a failure
    assert rule["support"]["failed"] == rule["support"]["covered"] == failed
    assert "NCCL_MIN_NCHANNELS x" in rule["derived"]["nccl_buffers_mib"]
    text = autotune("study", "explain", "buffers", "--storage", storage, cwd=tmp_path).stdout
    flat = " ".join(text.split())  # items wrap at the console's width
    assert rule["rule"] in flat and "nccl_buffers_mib: NCCL's receive buffers per peer, MiB" in flat
    # At 80 columns an item's continuation lines are indented under it (they ran on at column 0
    # among the headings), and a parameter's line keeps its verdict whole.
    from rich.console import Console

    from autotune.cli import show_commands as cli

    out = io.StringIO()
    monkeypatch.setattr(cli, "_out", Console(file=out, width=80, force_terminal=False, color_system=None))
    cli.study_explain(name="buffers", storage=storage, as_json=False)
    lines = out.getvalue().splitlines()
    assert max(len(line) for line in lines) <= 80, out.getvalue()
    at = next(i for i, line in enumerate(lines) if line.startswith("    nccl_buffers_mib: NCCL's receive buffers"))
    assert lines[at + 1].startswith("      ") and lines[at + 1].strip(), lines[at:at + 3]
    rated = [line for line in lines if re.search(r"\d\.\d\d \[\d\.\d\d, \d\.\d\d\]", line)]
    assert rated and all(line.startswith("  ") and line.rstrip().endswith(("effect", "uncertain", ")"))
                         for line in rated), rated


def test_a_probe_of_channels_at_one_configuration_is_no_derived_rule() -> None:
    """Failures of one configuration with only the channels moved show what fails there: the
    derived quantity moves with the channels, and its failures must come in several settings of
    the rest with any one of its inputs held."""
    rng = random.Random(5)
    study = optuna.create_study(direction="maximize")
    study.set_user_attr("space_monotone", SPACE.monotone())
    for _ in range(26):
        p = SPACE.repair({**_random_params(rng), "NCCL_MIN_NCHANNELS": rng.randint(1, 6), "NCCL_MAX_NCHANNELS": 64,
                          "NCCL_ALGO": "unset"})
        study.add_trial(_trial(p, None, _throughput(p, rng)))
    incumbent = SPACE.repair({**_random_params(rng), "NCCL_MAX_NCHANNELS": 64, "NCCL_ALGO": "unset",
                              "NCCL_BUFFSIZE": 4 * MIB, "NCCL_PROTO": "unset"})
    for channels in (20, 24, 28, 32):
        study.add_trial(_trial({**incumbent, "NCCL_MIN_NCHANNELS": channels}, "nccl-error", None))
    doc = explain(study)
    assert not [r for r in doc["failure_rules"] if "nccl_buffers_mib" in r["condition"]], _rules(doc)
    assert doc["unexplained_failures"]["count"] == 4, _rules(doc)


def test_a_demo_sized_study_says_what_matters_with_its_uncertainty(tmp_path: Path) -> None:
    """The demo's size: 20 trials by the driver on the simulated GLM-5 host, some stopped early.
    The trials stopped early count at their projected value (an upper bound), each parameter gets
    a share with its interval, an effect its permutation test's p, and the analysis says how sure
    it is; nothing is ruled out over so few trials."""
    from autotune.bench.model_executor import ModelExecutor
    from autotune.bench.setups import Setup
    from autotune.study.driver import Driver

    setup = Setup("rtx6000-pcie-glm5", "sglang_nccl", "quick", None)
    storage = f"sqlite:///{tmp_path}/demo.db"
    cfg = setup.config(name="demo20", storage=storage, sampler="tpe", seed=2, trials=20)
    study = Driver(cfg, setup.space, setup.objective, ModelExecutor.for_target(cfg, setup.objective, seed=2),
                   trials=20).run().study
    outcomes = [t.user_attrs.get("outcome") for t in study.trials]
    stopped, ok = outcomes.count("stopped"), outcomes.count("ok")
    assert stopped >= 1 and ok + stopped < 20 + 1
    part = explain(study)["importance"]["objective"]
    assert part["verdict"] == "ok" and part["trials"] == ok + stopped and part["bounded"] == stopped
    few = part["trials"] < MIN_TRIALS  # a failure or two leave fewer than the sure count
    assert f"{stopped} of them stopped early" in part["sureness"]
    assert part["sureness"].startswith(f"few trials ({part['trials']})") if few else "too few to rule one out" in part["sureness"]
    rated = {k: v for k, v in part["params"].items() if "median" in v}
    assert len(rated) >= 8 and all(0.0 <= v["low"] <= v["median"] <= v["high"] <= 1.0 for v in rated.values())
    assert all(v["verdict"] in ("effect", "uncertain") for v in rated.values())
    effects = [v for v in rated.values() if v["verdict"] == "effect"]
    assert effects and all(v.get("p", 1.0) <= 0.01 or v["low"] >= 0.05 for v in effects), rated
    text = " ".join(autotune("study", "explain", "demo20", "--storage", storage, cwd=tmp_path).stdout.split())
    assert "not enough trials" not in text and f"{ok + stopped} trials: median [90 % interval]" in text


def test_a_stopped_trial_counts_at_its_projected_value_and_never_in_a_matched_pair(tmp_path: Path) -> None:
    """Trials stopped early carry a bound, not a figure: counted at their recorded projected value
    (or, without one, their last intermediate value), and left out of the matched comparisons
    that "no measurable effect" rests on."""
    from autotune.analysis.importance import stopped_value
    from autotune.store.record import read

    rng = random.Random(7)
    study = optuna.create_study(study_name="bounds", storage=f"sqlite:///{tmp_path}/b.db", direction="maximize")
    for i in range(14):
        p = _random_params(rng)
        study.add_trial(_trial(p, None, _throughput(p, rng)))
    for i in range(6):
        p = {**_random_params(rng), "NCCL_PROTO": "LL"}
        attrs = {"applied": p, "feasible": False, "failure_kind": None, "outcome": "stopped", "metrics": {}}
        if i % 2:
            attrs["early_stop"] = {"projected": 590.0 + i, "bound": 640.0 + i}
        study.add_trial(create_trial(params=p, distributions=DISTS, state=TrialState.PRUNED, user_attrs=attrs,
                                     intermediate_values={25: 700.0, 50: 610.0 + i}))
    stopped = [read(t) for t in study.trials if t.user_attrs["outcome"] == "stopped"]
    assert [stopped_value(v, 610.0 + i) for i, v in enumerate(stopped)] == [610.0, 591.0, 612.0, 593.0, 614.0, 595.0]
    part = explain(study)["importance"]["objective"]
    assert part["trials"] == 20 and part["bounded"] == 6 and "6 of them stopped early" in part["sureness"]
    assert part["params"]["NCCL_PROTO"]["verdict"] == "effect"
