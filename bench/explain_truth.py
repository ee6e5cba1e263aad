"""Does ``autotune study explain`` tell the truth? Seeded studies on the simulated host, scored
against the simulator's own model.

    python bench/explain_truth.py                       # 20 studies x 30 trials per scenario and design
    python bench/explain_truth.py --json                # one JSON document instead of the tables
    python bench/explain_truth.py --studies 5 --long-studies 0 --scenario rtx6000-pcie-glm5
    python bench/explain_truth.py --studies 8 --long-studies 0 --trials 20 --early-stop   # the demo's size

No server is launched. Each study is an in-memory Optuna study with the driver's own sampler,
made as the driver makes it (``make_sampler("tpe", seed, ...)`` with the space's rules,
``monotone`` and ``raise_when`` declarations: :class:`autotune.search.samplers.CrashAwareTPESampler`),
the baseline enqueued first as the driver does (the driver's skips of implied failures are not
replayed: every proposal is launched). Each trial's launch (``SearchSpace.to_launch``: the env vars and flags a real
trial gets, rules repaired) is parsed with the simulated server's own argparse and given to
``autotune.sim.model.predict`` under the ``quick`` objective's load (192 requests, 192 in flight,
64 in / 16 out) with the noise of ``AUTOTUNE_SIM_SEED=seed``, and recorded exactly as the driver
records it: ok -> COMPLETE with the output throughput and user attrs ``outcome=ok,
feasible=True, applied``; a failure -> PRUNED with ``outcome=infeasible, feasible=False,
failure_kind=<the model's outcome>, failure_message=<its error line>, applied``; a measured trial also records what its
scheduler log would show (``load_signals``) and the load's concurrency, which the sampler's
raises read. With ``--early-stop`` a trial's load stops as the driver's would (the value to beat
of :func:`autotune.execution.early_stop.value_to_beat` over the study's budget, the model's
progress fed to the driver's ``StopRule``): recorded ``stopped``, PRUNED with its projected values
reported and user attr ``early_stop``, as the driver records it.

Two study designs per built-in scenario:

- ``sglang_nccl``: the built-in space as it is (NCCL env and SGLang flags); on the demo's scenario
  the demo's baseline;
- ``seed``: the launch of the scenario's field report (docs/scenarios.md) with its SGLang flags
  fixed, searching the NCCL variables, ``num_continuous_decode_steps`` and (but on the GLM-5
  host, where the report fixes 0.92) ``mem_fraction_static`` near the known-good value: where the
  planted crashes live.

Then ``autotune.analysis.explain.explain`` runs on each study and is scored, the 30-trial studies and
the longer ones (``--long-studies``, ``--long-trials``) apart:

- **planted behaviours**: whether a printed rule states each behaviour the scenarios plant, out
  of the studies whose trials showed it at least ``MIN_SUPPORT`` times with one failure kind
  (the model says why each trial failed: see :func:`cause`; a rule is of one kind, and with fewer
  failures there can be no rule, by design), or once with an error that names the setting (Tree:
  NCCL's ``NCCL_ALGO was set to Tree``, a rule from one failure). Oversized channels x buffers
  are shown by a NCCL-buffer failure that the same point with the channels left to NCCL and
  4 MiB buffers (NCCL's defaults) does not have, and stated by a ``nccl-error`` rule on
  ``NCCL_MIN_NCHANNELS >=``, ``NCCL_BUFFSIZE >=`` or their product ``nccl_buffers_mib >=``
  (:mod:`autotune.config.derived`; a rule over it is checked by redrawing the variables it is read
  from). The channels x ``mem_fraction_static`` interaction
  is shown by a failure that both parameters caused: the same point at the lowest
  ``mem_fraction_static`` searched runs, and with the channel count left to NCCL does not fail
  that way. A rule on channels alone whose scope says it was shown only with a high
  ``mem_fraction_static`` (the space declares it monotone for ``oom``) states it in part, and is
  counted apart;
- **false rules**: each printed rule is checked against the model by intervention: in every
  finished trial of the study (the configurations the study explored) the rule's parameters are
  set to random values satisfying it, 8 draws each, with a control drawn so that it does not
  hold; a pair where the control fails with the same kind is not testable (that failure is not
  the rule's doing). The rule is imprecise when under 80 % of the testable interventions give
  its failure kind, false under 50 %. A rule named with conditions the data cannot tell from it
  (``confounded_with``: "one of these"), or with conditions as sure as it (``as_sure``), is
  scored by the best of them; a rule with a ``scope``
  ("shown only with NCCL_MIN_NCHANNELS >= 8") is checked in the explored configurations within
  it;
- **num_continuous_decode_steps** (read by no SGLang code; the model ignores it): the verdict on
  its importance for the objective;
- **failures at one configuration**: the unexplained failures ``explain`` lists as what fails
  at one configuration (counted, not scored: each is a trial's own outcome, not a claim beyond it);
- **statements**: per study, the rules printed and the importance verdicts ``effect`` and ``no
  measurable effect`` (objective and feasibility); every ``effect`` is checked by the model
  (:func:`effect_truth`): the parameter alone set to other values the study tried, in up to 24 of
  its trials, must change the noise-free throughput by 0.5 % on average (objective), or turn a
  run into a failure or back in 1 % of the changes (feasibility), else the claim is false;
- **no-effect claims**: every "no measurable effect" on the objective is checked by the model
  over the values it states (``matched.over``): in up to 24 feasible trials with one of them, the
  parameter alone is set to up to 4 others; the claim is false when the mean relative change of
  the noise-free throughput exceeds 3 %.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.analysis.explain import MIN_SUPPORT, MONOTONE_ATTR, explain
from autotune.analysis.conditions import Condition
from autotune.config.demo import DEMO_CONFIG
from autotune.config.derived import derived_inputs
from autotune.execution.early_stop import StopRule, value_to_beat
from autotune.execution.workload import LoadProgress
from autotune.search.factory import make_sampler
from autotune.study.driver import finished_trials
from autotune.outcome.failures import names_choice
from autotune.analysis.importance import NO_EFFECT_SPREAD
from autotune.outcome.load_signals import ATTR as SIGNALS_ATTR
from autotune.sim.args import parse_server_args
from autotune.sim.engine import configure
from autotune.sim.model import Prediction, Workload, predict
from autotune.sim.scenario import load_scenario
from autotune.config.space import SearchSpace

SCENARIOS = ("rtx6000-pcie-glm5", "rtx6000-pcie-kimi-eagle3", "h200-nvlink-llama70b")
WORKLOAD = Workload(concurrency=192, num_prompts=192, input_len=64, output_len=16)  # objectives/quick.yaml
BASE_ENV = {k: v for k, v in DEMO_CONFIG["target"]["env"].items() if k.startswith("NCCL_")}  # the demo target's
TRUE_RATE = 0.80
DRAWS_PER_TRIAL = 8
MIN_TESTED = 20
NO_EFFECT_TOLERANCE = 0.03
NCDS = "num_continuous_decode_steps"
EFFECT_TOLERANCE = {"objective": 0.005, "feasibility": 0.01}
"""An ``effect`` is false where the model's (:func:`effect_truth`) is below this: a mean change of
the throughput under 0.5 %, or under 1 % of the changes turning a run into a failure or back."""

optuna.logging.set_verbosity(optuna.logging.WARNING)
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


# -- study designs ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Design:
    """What a study searches on a scenario: ``space``, flags always given (``fixed``), baseline."""

    name: str
    scenario: str
    space: SearchSpace = field(hash=False, compare=False)
    fixed: tuple[str, ...] = ()
    baseline: tuple[tuple[str, Any], ...] = ()


_FULL = SearchSpace.load("sglang_nccl")
# The field reports' launches (docs/scenarios.md): fixed flags, known-good mem_fraction_static,
# and the range searched around it.
_SEEDS: dict[str, tuple[tuple[str, ...], float | None, float, float]] = {
    # seed 004: 0.92 and 1024 running requests fixed, the NCCL variables searched
    "rtx6000-pcie-glm5": (("--max-running-requests", "1024", "--mem-fraction-static", "0.92"), None, 0, 0),
    "rtx6000-pcie-kimi-eagle3": (("--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "2",
                                  "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "3"), 0.55, 0.50, 0.60),
    "h200-nvlink-llama70b": (("--max-running-requests", "256"), 0.88, 0.80, 0.95),
}
_SEED_PARAMS = ("NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS", "NCCL_BUFFSIZE", "NCCL_ALGO", "NCCL_PROTO", NCDS)


def designs(scenario: str) -> list[Design]:
    full_base = DEMO_CONFIG["baseline"] if scenario == DEMO_CONFIG["target"]["scenario"] else {}
    fixed, good, low, high = _SEEDS[scenario]
    params = {n: _FULL.parameters[n].model_dump(exclude_defaults=True) for n in _SEED_PARAMS}
    seed_base: dict[str, Any] = {}
    if good is not None:
        params["mem_fraction_static"] = {**_FULL.parameters["mem_fraction_static"].model_dump(exclude_defaults=True),
                                         "low": low, "high": high, "default": good}
        seed_base["mem_fraction_static"] = good
    seed_space = SearchSpace.from_mapping({"name": f"seed-{scenario}", "parameters": params,
                                           "rules": ["NCCL_MIN_NCHANNELS <= NCCL_MAX_NCHANNELS"]})
    if scenario == DEMO_CONFIG["target"]["scenario"]:
        seed_base["NCCL_MIN_NCHANNELS"] = 8
    return [
        Design("sglang_nccl", scenario, _FULL, (), tuple(sorted(_FULL.complete(full_base).items()))),
        Design("seed", scenario, seed_space, fixed, tuple(sorted(seed_space.complete(seed_base).items()))),
    ]


# -- the simulated host ---------------------------------------------------------------------------
@cache
def _scenario(name: str) -> Any:
    return load_scenario(name)


def _launch(d: Design, params: dict[str, Any]) -> tuple[Any, dict[str, str]]:
    launch = d.space.to_launch(params)
    _, args = parse_server_args(["--scenario", d.scenario, *d.fixed, *launch.args])
    return args, {**BASE_ENV, **launch.env}


@lru_cache(maxsize=400_000)
def _predict(d: Design, applied: tuple[tuple[str, Any], ...], seed: int | None) -> Prediction:
    args, env = _launch(d, dict(applied))
    return predict(_scenario(d.scenario), args, env, WORKLOAD, seed=seed)


def outcome(d: Design, params: dict[str, Any], seed: int | None = None) -> tuple[str, float]:
    """(the model's outcome, output throughput) of one point of the design's space."""
    p = _predict(d, tuple(sorted(d.space.repair(params).items())), seed)
    return p.outcome, p.output_throughput


@lru_cache(maxsize=400_000)
def _cause(d: Design, applied: tuple[tuple[str, Any], ...]) -> str:
    args, env = _launch(d, dict(applied))
    try:
        cfg = configure(_scenario(d.scenario), args, env)
    except ValueError:
        return "invalid-argument"
    stage = cfg.memory.stage
    if stage in ("kv", "init"):
        return stage
    if cfg.nccl_problem is not None:
        return "tree" if "Tree" in cfg.nccl_problem else "nccl-usage"
    if stage == "nccl":
        return "nccl-buffers"
    if stage == "graph":
        params = dict(applied)
        if cfg.nccl.channels < _scenario(d.scenario).interconnect.default_channels:
            args2, env2 = _launch(d, {**params, "NCCL_MIN_NCHANNELS": 1, "NCCL_MAX_NCHANNELS": 64})
            if configure(_scenario(d.scenario), args2, env2).memory.stage != "graph":
                return "graph-low-channels"
        return "graph"
    return "ok"


def cause(d: Design, params: dict[str, Any]) -> str:
    """Why the model fails this point: ``tree`` (NCCL_ALGO leaves a collective without an
    algorithm), ``nccl-buffers`` (the NCCL buffers do not fit), ``graph-low-channels`` (a graph
    capture OOM that the host's default channel count would not have), else the memory stage
    (``kv``, ``init``, ``graph``), ``invalid-argument`` or ``ok``."""
    return _cause(d, tuple(sorted(d.space.repair(params).items())))


def mfs_matters(d: Design, params: dict[str, Any]) -> bool:
    """The point fails, and the same point at the lowest mem_fraction_static searched does not."""
    if "mem_fraction_static" not in d.space.parameters:
        return False
    low = d.space.parameters["mem_fraction_static"].low
    return outcome(d, params)[0] != "ok" and outcome(d, {**params, "mem_fraction_static": low})[0] == "ok"


def channels_matter(d: Design, params: dict[str, Any], kind: str) -> bool:
    """The point fails with ``kind``, and the same point with the channel count left to NCCL (the
    host's default: ``NCCL_MIN_NCHANNELS=1``, ``NCCL_MAX_NCHANNELS=64``) does not."""
    named = [p for p in ("NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS") if p in d.space.parameters]
    if not named:
        return False
    default = {**params, **{p: 1 if p == "NCCL_MIN_NCHANNELS" else 64 for p in named}}
    return outcome(d, params)[0] == kind and outcome(d, default)[0] != kind


def buffers_oversized(d: Design, params: dict[str, Any], kind: str) -> bool:
    """The point fails with ``kind``, and the same point with the channel count left to NCCL and
    ``NCCL_BUFFSIZE`` at NCCL's default (4 MiB) does not: the channels or buffers it set are what
    does not fit (a failure at the defaults, as when speculation takes the memory the buffers
    need, is not the planted behaviour)."""
    reset = {p: v for p, v in (("NCCL_MIN_NCHANNELS", 1), ("NCCL_MAX_NCHANNELS", 64), ("NCCL_BUFFSIZE", 4 << 20))
             if p in d.space.parameters}
    return bool(reset) and outcome(d, params)[0] == kind and outcome(d, {**params, **reset})[0] != kind


def _stopping(beat: float, why: str) -> tuple[StopRule, Callable[[float, int, int, int], bool]]:
    """The driver's early-stopping rule for the ``quick`` load, and the model's progress hook that
    feeds it as the load generator would (:mod:`autotune.bench.model_executor`). No least time: the
    model's load lasts a few seconds, below the objective's ``min_seconds``, where the demo's real
    loads (start-up included) stop trials."""
    rule = StopRule("output_throughput", beat, why, min_seconds=0.0)
    w = WORKLOAD
    out_total, in_total = float(w.num_prompts * w.output_len), float(w.num_prompts * w.input_len)

    def hook(elapsed_s: float, output_tokens: int, input_tokens: int, completed: int) -> bool:
        return rule.observe(LoadProgress(elapsed_s, completed, 0, w.num_prompts, float(output_tokens),
                                         float(input_tokens), out_total, in_total)) is not None

    return rule, hook


def run_study(d: Design, seed: int, trials: int, sampler: str = "tpe", early_stop: bool = False) -> optuna.Study:
    """One study as the driver runs it (see the module docstring), in memory: the baseline, then
    ``trials`` more. ``early_stop``: a trial's load stops, as the driver's would, when it cannot
    beat the value to beat (:func:`autotune.execution.early_stop.value_to_beat`): recorded
    ``stopped`` (PRUNED, its projected values reported, user attr ``early_stop``)."""
    sampler_ = make_sampler(sampler, seed, launched_as=d.space.repair, monotone=d.space.monotone(),
                            raise_when=d.space.raise_when())
    study = optuna.create_study(study_name=f"{d.scenario}/{d.name}/s{seed}/n{trials + 1}", direction="maximize",
                                sampler=sampler_)
    study.set_user_attr(MONOTONE_ATTR, d.space.monotone())  # as the driver stores it: rules' scopes
    study.enqueue_trial(dict(d.baseline), user_attrs={"baseline": True})
    for _ in range(trials + 1):
        trial = study.ask()
        launch = d.space.to_launch(d.space.suggest(trial))
        p = _predict(d, tuple(sorted(launch.applied.items())), seed)
        kind, value = p.outcome, p.output_throughput
        trial.set_user_attr("applied", dict(launch.applied))
        trial.set_user_attr("env", {**BASE_ENV, **launch.env})
        beat, why = (None, "")
        if early_stop and kind == "ok" and not trial.user_attrs.get("baseline"):
            measured = [t.value for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                        if t.user_attrs.get("outcome") == "ok"]
            beat, why = value_to_beat(measured, trials + 1)
        if beat is not None:
            rule, hook = _stopping(beat, why)
            args, env = _launch(d, dict(launch.applied))
            predict(_scenario(d.scenario), args, env, WORKLOAD, seed=seed, on_progress=hook)
            if rule.stop is not None:
                for k, v in (("outcome", "stopped"), ("feasible", False), ("failure_kind", None),
                             ("early_stop", rule.stop.to_json())):
                    trial.set_user_attr(k, v)
                for step, projected in sorted(rule.intermediate.items()):
                    trial.report(projected, step)
                study.tell(trial, state=TrialState.PRUNED)
                continue
        if kind == "ok":
            for k, v in (("outcome", "ok"), ("feasible", True), ("failure_kind", None),
                         ("metrics", {"output_throughput": value, "max_concurrency": float(WORKLOAD.concurrency)}),
                         (SIGNALS_ATTR, p.signals.to_attr())):
                trial.set_user_attr(k, v)
            study.tell(trial, value)
        else:
            for k, v in (("outcome", "infeasible"), ("feasible", False), ("failure_kind", kind),
                         ("failure_message", p.message or kind)):  # the model's error line, as the driver records it
                trial.set_user_attr(k, v)
            study.tell(trial, state=TrialState.PRUNED)
    return study


# -- checking rules against the model --------------------------------------------------------------
def _uniform_int(dist: optuna.distributions.IntDistribution, rng: random.Random) -> int:
    """As the space samples it: log-uniform for a log-scale parameter."""
    if dist.log:
        x = math.exp(rng.uniform(math.log(max(dist.low - 0.5, 0.5)), math.log(dist.high + 0.5)))
        return int(min(dist.high, max(dist.low, round(x))))
    return rng.randint(dist.low, dist.high)


def _any_value(d: Design, param: str, rng: random.Random) -> Any:
    p = d.space.parameters[param]
    dist = p.distribution()
    if isinstance(dist, optuna.distributions.CategoricalDistribution):
        return rng.choice(list(dist.choices))
    if isinstance(dist, optuna.distributions.IntDistribution):
        return _uniform_int(dist, rng)
    assert isinstance(dist, optuna.distributions.FloatDistribution) and dist.step
    return p.normalise(dist.low + rng.randint(0, round((dist.high - dist.low) / dist.step)) * dist.step)


def _draw(d: Design, conds: list[dict[str, Any]], base: dict[str, Any], rng: random.Random, *,
          satisfy: bool) -> dict[str, Any] | None:
    """``base`` with the conditions' parameters redrawn (as the space samples them) so that the
    conjunction holds (``satisfy``) or does not, as launched (MIN <= MAX repaired)."""
    for _try in range(200):
        point = dict(base)
        for cond in conds:  # a derived quantity's (autotune.config.derived): its inputs the space searches
            for param in derived_inputs(cond["param"]) or (cond["param"],):
                if param in d.space.parameters:
                    point[param] = _any_value(d, param, rng)
        applied = d.space.repair(point)
        if all(Condition(**c).holds(applied) for c in conds) == satisfy:
            return applied
    return None


def rule_truth(d: Design, rule: dict[str, Any], bases: list[dict[str, Any]], seed: int) -> tuple[float, int]:
    """(share of testable interventions that give the rule's failure kind, number testable). A
    rule with a ``scope`` claims nothing outside it: on its own parameters (how far along its
    threshold it was shown), the values drawn keep within it; on others (where the study tried
    it, on parameters monotone for its kind), only the explored configurations within it are
    intervened on."""
    rng = random.Random(seed)
    hits = total = 0
    own = {c["param"] for c in rule["conditions"]}
    scope = [Condition(**c) for c in rule.get("scope_conditions") or [] if c["param"] not in own]
    along = [c for c in rule.get("scope_conditions") or [] if c["param"] in own]
    for base in (b for b in bases if all(c.holds(b) for c in scope)):
        for _ in range(DRAWS_PER_TRIAL):
            point = _draw(d, [*rule["conditions"], *along], base, rng, satisfy=True)
            control = _draw(d, rule["conditions"], base, rng, satisfy=False)
            if point is None or control is None:
                continue
            kind, _ = outcome(d, point)
            if kind != "ok" and outcome(d, control)[0] == kind:
                continue
            hits += kind == rule["kind"]
            total += 1
    return (hits / total if total else float("nan")), total


def no_effect_truth(d: Design, param: str, bases: list[dict[str, Any]], seed: int, over: Any = None) -> float:
    """Mean relative change of the noise-free throughput when ``param`` alone is set, in feasible
    configurations of the study, to up to 4 other values the feasible trials tried (a change that
    the space's rule would repair by moving another parameter is skipped). ``over``: the values
    the claim holds over (``matched.over``: ``[low, high]`` of a numeric parameter, else the
    values): only configurations with one of them, moved to another."""
    def within(v: Any) -> bool:
        if over is None:
            return True
        if isinstance(over, list) and len(over) == 2 and all(isinstance(x, (int, float)) for x in over) \
                and isinstance(v, (int, float)) and not isinstance(v, bool):
            return over[0] <= v <= over[1]
        return any(repr(v) == repr(x) for x in over)

    rng = random.Random(seed)
    changes: list[float] = []
    bases = [b for b in bases if within(b[param])]
    distinct = list({repr(b[param]): b[param] for b in bases}.values())
    for base in bases[:24]:
        _, v0 = outcome(d, base)
        others = [v for v in distinct if repr(v) != repr(base[param])]
        if v0 <= 0 or not others:
            continue
        for value in rng.sample(others, min(4, len(others))):
            changed = {**base, param: value}
            if d.space.repair(changed) != changed:
                continue
            kind, v1 = outcome(d, changed)
            if kind == "ok":
                changes.append(abs(v1 - v0) / v0)
    return statistics.fmean(changes) if changes else float("nan")


def effect_truth(d: Design, target: str, param: str, bases: list[dict[str, Any]], seed: int) -> tuple[float, int]:
    """(the model's effect, number of changes tested) of ``param`` alone set, in up to 24 of the
    ``bases`` (feasible trials for the objective, finished ones for feasibility), to up to 4 other
    values they tried: the mean relative change of the noise-free throughput between two feasible
    points (``objective``), or the share of changes that turn a failure into a run or back
    (``feasibility``). An ``effect`` is false where the model's is below :data:`EFFECT_TOLERANCE`."""
    rng = random.Random(seed)
    distinct = list({repr(b[param]): b[param] for b in bases if param in b}.values())
    changes: list[float] = []
    for base in bases[:24]:
        kind0, v0 = outcome(d, base)
        others = [v for v in distinct if repr(v) != repr(base.get(param))]
        for value in rng.sample(others, min(4, len(others))):
            changed = {**base, param: value}
            if d.space.repair(changed) != changed:
                continue
            kind1, v1 = outcome(d, changed)
            if target == "feasibility":
                changes.append(float((kind0 == "ok") != (kind1 == "ok")))
            elif kind0 == "ok" and kind1 == "ok" and v0 > 0:
                changes.append(abs(v1 - v0) / v0)
    return (statistics.fmean(changes) if changes else float("nan")), len(changes)


# -- the planted behaviours ------------------------------------------------------------------------
def _mentions(conds: list[dict[str, Any]], param: str, op: str | None = None, value: Any = None) -> bool:
    return any(c["param"] == param and (op is None or c["op"] == op) and (value is None or c["value"] == value)
               for c in conds)


def _channels(conds: list[dict[str, Any]]) -> bool:
    return _mentions(conds, "NCCL_MIN_NCHANNELS") or _mentions(conds, "NCCL_MAX_NCHANNELS")


@dataclass(frozen=True)
class Behaviour:
    """A planted behaviour: ``shown`` tells whether one failed trial shows it (by the model's reason
    for the failure), ``stated`` whether a rule (its kind and conditions) states it, ``scoped``
    (counted apart) whether a rule states it in part, the rest in its scope ("shown only with")."""

    name: str
    shown: Callable[[Design, dict[str, Any], str], bool]
    stated: Callable[[str, list[dict[str, Any]]], bool]
    scoped: Callable[[str, list[dict[str, Any]], list[dict[str, Any]]], bool] | None = None
    named: tuple[str, str] | None = None
    """A setting whose failures the engine's error names: one failure that names it shows the
    behaviour (``explain`` states a rule from it, :mod:`autotune.analysis.crash_rules` step 0)."""

    def showing(self, d: Design, trials: list[FrozenTrial]) -> list[FrozenTrial]:
        """The failed ``trials`` that show the behaviour."""
        return [t for t in trials if t.user_attrs.get("failure_kind")
                and self.shown(d, t.user_attrs["applied"], t.user_attrs["failure_kind"])]


BEHAVIOURS = (
    Behaviour("Tree crashes: `NCCL_ALGO=Tree -> nccl-error`",
              shown=lambda d, p, k: k == "nccl-error" and cause(d, p) == "tree",
              stated=lambda k, c: k == "nccl-error" and len(c) == 1 and _mentions(c, "NCCL_ALGO", "=", "Tree"),
              named=("NCCL_ALGO", "Tree")),
    Behaviour("oversized channels x buffers: a `nccl-error` rule on channels >=, NCCL_BUFFSIZE >= or nccl_buffers_mib >=",
              shown=lambda d, p, k: k == "nccl-error" and cause(d, p) == "nccl-buffers" and buffers_oversized(d, p, k),
              stated=lambda k, c: k == "nccl-error" and not _mentions(c, "NCCL_ALGO")
              and (_mentions(c, "NCCL_MIN_NCHANNELS", ">=") or _mentions(c, "NCCL_BUFFSIZE", ">=")
                   or _mentions(c, "nccl_buffers_mib", ">="))),
    Behaviour("channels x mem_fraction_static (memory): a rule over a channels parameter and mem_fraction_static",
              shown=lambda d, p, k: k in ("nccl-error", "oom") and cause(d, p) in ("nccl-buffers", "graph-low-channels")
              and mfs_matters(d, p) and channels_matter(d, p, k),
              stated=lambda k, c: k in ("nccl-error", "oom") and _channels(c) and _mentions(c, "mem_fraction_static"),
              scoped=lambda k, c, s: k in ("nccl-error", "oom") and _channels(c)
              and _mentions(s, "mem_fraction_static", ">=")),
)


# -- scoring ---------------------------------------------------------------------------------------
@dataclass
class Score:
    scenario: str
    design: str
    trials_each: int
    studies: int = 0
    trials: int = 0
    failures: int = 0
    unexplained: int = 0
    explain_s: list[float] = field(default_factory=list)
    behaviours: dict[str, dict[str, int]] = field(default_factory=dict)
    rules: int = 0
    pair_rules: int = 0
    confounded_rules: int = 0
    false_rules: list[dict[str, Any]] = field(default_factory=list)
    untestable: list[dict[str, Any]] = field(default_factory=list)
    rule_rates: list[float] = field(default_factory=list)
    ncds: dict[str, int] = field(default_factory=dict)
    ncds_bounds: list[float] = field(default_factory=list)
    no_effect_claims: int = 0
    false_no_effect: list[dict[str, Any]] = field(default_factory=list)
    at_one_configuration: int = 0
    at_one_configuration_failures: int = 0
    stopped: int = 0
    statements: list[int] = field(default_factory=list)
    """Per study: rules printed, and importance verdicts ``effect`` or ``no measurable effect``
    (objective and feasibility)."""
    rated: dict[str, int] = field(default_factory=dict)
    """Studies whose importances rate the parameters, by target (verdict ``ok``)."""
    effect_claims: int = 0
    false_effect: list[dict[str, Any]] = field(default_factory=list)


def _verdict(doc: dict[str, Any]) -> str:
    part = doc["importance"]["objective"]
    if part["verdict"] != "ok":
        return "not enough trials" if part["verdict"].startswith("not enough") else part["verdict"]
    return (part["params"].get(NCDS) or {}).get("verdict", "absent")


def score_study(sc: Score, d: Design, study: optuna.Study, seed: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    doc = explain(study)
    took = time.perf_counter() - t0
    sc.explain_s.append(took)
    finished = finished_trials(study)
    bases = [dict(t.user_attrs["applied"]) for t in finished]
    feasible = [dict(t.user_attrs["applied"]) for t in finished if t.user_attrs.get("feasible")]
    verdict = _verdict(doc)
    sc.ncds[verdict] = sc.ncds.get(verdict, 0) + 1
    bound = ((doc["importance"]["objective"].get("params", {}).get(NCDS) or {}).get("matched") or {}).get("spread_high")
    if bound is not None:
        sc.ncds_bounds.append(float(bound))
    record: dict[str, Any] = {"study": study.study_name, "trials": len(finished), "explain_s": round(took, 3),
                              "ncds_verdict": verdict, "ncds_spread_high": bound, "rules": []}
    for param, imp in doc["importance"]["objective"]["params"].items():
        if imp.get("verdict") == "no measurable effect":
            change = no_effect_truth(d, param, feasible, seed, (imp.get("matched") or {}).get("over"))
            sc.no_effect_claims += 1
            if change > NO_EFFECT_TOLERANCE:
                sc.false_no_effect.append({"study": study.study_name, "param": param, "mean_change": round(change, 4)})
    statements = len(doc["failure_rules"])
    for target in ("objective", "feasibility"):
        part = doc["importance"][target]
        sc.rated[target] = sc.rated.get(target, 0) + (part["verdict"] == "ok")
        for param, imp in part.get("params", {}).items():
            statements += imp.get("verdict") in ("effect", "no measurable effect")
            if imp.get("verdict") == "effect":
                sc.effect_claims += 1
                change, tested = effect_truth(d, target, param, bases if target == "feasibility" else feasible, seed)
                record.setdefault("effects", []).append({"target": target, "param": param, "p": imp.get("p"),
                                                         "median": imp.get("median"), "low": imp.get("low"),
                                                         "alone": (imp.get("alone") or {}).get("median"),
                                                         "model_change": round(change, 4), "tested": tested})
                if tested >= MIN_TESTED and change < EFFECT_TOLERANCE[target]:
                    sc.false_effect.append({"study": study.study_name, "target": target, "param": param,
                                            "change": round(change, 4), "tested": tested})
    sc.statements.append(statements)
    record["statements"] = statements
    record["importance"] = {t: {"verdict": doc["importance"][t]["verdict"], "trials": doc["importance"][t]["trials"],
                                "params": {k: v["verdict"] for k, v in doc["importance"][t].get("params", {}).items()}}
                            for t in ("objective", "feasibility")}
    sc.stopped += sum(t.user_attrs.get("outcome") == "stopped" for t in finished)
    sc.studies += 1
    sc.trials += len(finished)
    sc.failures += doc["unexplained_failures"]["count"] + sum(len(r["trials"]) for r in doc["failure_rules"])
    sc.unexplained += doc["unexplained_failures"]["count"]
    local = doc["unexplained_failures"]["at_one_configuration"]
    sc.at_one_configuration += len(local)
    sc.at_one_configuration_failures += sum(len(g["trials"]) for g in local)
    for rule in doc["failure_rules"]:
        # a rule named with its confounds, or with the conditions as sure as it, says "one of
        # these": the best of them is what it claims
        named = [*rule.get("confounded_conditions", []), *rule.get("as_sure_conditions", [])]
        alternatives = [rule] + [{"conditions": [c], "kind": rule["kind"]} for c in named]
        rate, tested = max((rule_truth(d, alt, bases, seed) for alt in alternatives),
                           key=lambda rt: (rt[1] >= MIN_TESTED, rt[0] if rt[0] == rt[0] else -1.0))
        sc.rules += 1
        sc.pair_rules += len(rule["conditions"]) == 2
        sc.confounded_rules += len(alternatives) > 1
        entry = {"study": study.study_name, "rule": rule["rule"], "model_rate": round(rate, 3), "tested": tested,
                 "confounded_with": rule.get("confounded_with", []), "as_sure": rule.get("as_sure", [])}
        record["rules"].append(entry)
        if tested < MIN_TESTED:
            sc.untestable.append(entry)
            continue
        sc.rule_rates.append(rate)
        if not rate >= TRUE_RATE:
            sc.false_rules.append(entry)
    for b in BEHAVIOURS:
        # a rule is of one failure kind: the behaviour is shown when MIN_SUPPORT failures of one kind
        # show it, or one whose error names the setting
        showing = b.showing(d, finished)
        shows = Counter(t.user_attrs["failure_kind"] for t in showing)
        named = b.named is not None and any(names_choice(str(t.user_attrs.get("failure_message") or ""), *b.named)
                                            for t in showing)
        stated = any(b.stated(r["kind"], r["conditions"]) for r in doc["failure_rules"])
        scoped = b.scoped is not None and not stated and any(
            b.scoped(r["kind"], r["conditions"], r.get("scope_conditions") or []) for r in doc["failure_rules"])
        row = sc.behaviours.setdefault(b.name, {"shown": 0, "stated_when_shown": 0, "stated_otherwise": 0,
                                                "scoped_when_shown": 0})
        if max(shows.values(), default=0) >= MIN_SUPPORT or named:
            row["shown"] += 1
            row["stated_when_shown"] += stated
            row["scoped_when_shown"] += scoped
        else:
            row["stated_otherwise"] += stated
    return record


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--studies", type=int, default=20)
    ap.add_argument("--trials", type=int, default=30)
    ap.add_argument("--long-studies", type=int, default=3, help="longer studies per scenario and design, scored alike")
    ap.add_argument("--long-trials", type=int, default=100)
    ap.add_argument("--scenario", action="append", help="only these scenarios (repeat)")
    ap.add_argument("--design", action="append", choices=["sglang_nccl", "seed"], help="only these designs (repeat)")
    ap.add_argument("--early-stop", action="store_true",
                    help="stop a trial's load, as the driver does, when it cannot beat the value to beat")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--verbose", action="store_true", help="each study's rules and verdict on stderr")
    ns = ap.parse_args(argv)
    scores: list[Score] = []
    records: list[dict[str, Any]] = []
    t_start = time.perf_counter()
    for scenario in ns.scenario or SCENARIOS:
        for d in designs(scenario):
            if ns.design and d.name not in ns.design:
                continue
            for first, count, trials in ((0, ns.studies, ns.trials), (1000, ns.long_studies, ns.long_trials)):
                if not count:
                    continue
                sc = Score(scenario, d.name, trials)
                for seed in range(first, first + count):
                    rec = score_study(sc, d, run_study(d, seed, trials - 1, early_stop=ns.early_stop), seed)
                    records.append(rec)
                    if ns.verbose:
                        print(json.dumps(rec), file=sys.stderr)
                scores.append(sc)
    wall = time.perf_counter() - t_start
    if ns.json:
        print(json.dumps({"settings": vars(ns), "wall_s": round(wall, 1), "scores": [_summary(s) for s in scores],
                          "studies": records}, indent=1))
        return 0
    for s in scores:
        _print_table(s)
    times = [t for s in scores for t in s.explain_s]
    print(f"\nexplain: median {statistics.median(times):.2f} s, max {max(times):.2f} s over {len(times)} studies; "
          f"bench wall {wall:.0f} s")
    return 0


def _summary(s: Score) -> dict[str, Any]:
    out = {k: v for k, v in vars(s).items() if k not in ("explain_s", "rule_rates")}
    out["median_rule_model_rate"] = round(statistics.median(s.rule_rates), 3) if s.rule_rates else None
    out["statements_mean"] = round(statistics.fmean(s.statements), 2) if s.statements else None
    out["explain_s_median"] = round(statistics.median(s.explain_s), 3) if s.explain_s else None
    out["explain_s_max"] = round(max(s.explain_s), 3) if s.explain_s else None
    return out


def _print_table(s: Score) -> None:
    print(f"\n#### {s.scenario}, design `{s.design}`: {s.studies} studies x {s.trials_each} trials "
          f"({s.failures} failures, {s.unexplained} explained by no rule)\n")
    print("| check | result |")
    print("| --- | --- |")
    for name, row in s.behaviours.items():
        scoped = (f"; in {row['scoped_when_shown']} more in part (the rest in the rule's scope)"
                  if row["scoped_when_shown"] else "")
        print(f"| {name} | stated in {row['stated_when_shown']} of {row['shown']} studies that show it "
              f"(>= {MIN_SUPPORT} such failures of one kind){scoped}; stated in {row['stated_otherwise']} others |")
    rate = f"; median model rate {statistics.median(s.rule_rates):.2f}" if s.rule_rates else ""
    print(f"| rules printed | {s.rules} ({s.pair_rules} over two parameters, {s.confounded_rules} named with "
          f"conditions the data cannot tell from them){rate} |")
    wrong = [f for f in s.false_rules if f["model_rate"] < 0.5]
    print(f"| rules the model gives less than {TRUE_RATE:.0%} of the time | {len(s.false_rules)}, "
          f"of which {len(wrong)} less than 50 % |")
    for f in s.false_rules:
        print(f"| {'false' if f['model_rate'] < 0.5 else 'imprecise'} | {f['study']}: `{f['rule']}` "
              f"(model {f['model_rate']:.2f}) |")
    print(f"| unexplained failures listed at one configuration | {s.at_one_configuration_failures} "
          f"in {s.at_one_configuration} groups |")
    if s.untestable:
        print(f"| rules the model could not test (< {MIN_TESTED} testable interventions) | {len(s.untestable)} |")
    print(f"| `{NCDS}`, {s.trials_each} trials | {_counts(s.ncds)} |")
    if s.ncds_bounds:
        b = sorted(s.ncds_bounds)
        print(f"| `{NCDS}`: the matched spread's high end, where pairs bound it | {len(b)} studies: "
              f"{b[0]:.1%} to {b[-1]:.1%}, median {statistics.median(b):.1%} (a claim needs below {NO_EFFECT_SPREAD:.0%}) |")
    print(f"| 'no measurable effect' claims (model-checked) | {s.no_effect_claims}, false: {len(s.false_no_effect)} |")
    for f in s.false_no_effect:
        print(f"| false | {f['study']}: {f['param']} (mean change {f['mean_change']:.1%}) |")
    if s.statements:
        print(f"| statements per study (rules, effect and no-effect verdicts) | mean {statistics.fmean(s.statements):.2f}, "
              f"median {statistics.median(s.statements):g}; importances rated in {s.rated.get('objective', 0)} "
              f"(objective) and {s.rated.get('feasibility', 0)} (feasibility) of {s.studies} studies; "
              f"{s.stopped} trials stopped early |")
    print(f"| 'effect' claims (model-checked) | {s.effect_claims}, false: {len(s.false_effect)} |")
    for f in s.false_effect:
        print(f"| false | {f['study']}: {f['param']} for {f['target']} (model {f['change']:.1%}) |")
    if s.explain_s:
        print(f"| explain run time | median {statistics.median(s.explain_s):.2f} s, max {max(s.explain_s):.2f} s |")


def _counts(d: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(d.items(), key=lambda kv: -kv[1])) or "-"


if __name__ == "__main__":
    raise SystemExit(main())
