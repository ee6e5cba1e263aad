"""How often early stopping stops a configuration that would in fact have won, on the simulator.

The simulator knows each configuration's noise-free value, so a stop can be judged against the
truth. For each built-in scenario and run-to-run noise level, a pool of feasible random
configurations (the ``sglang_nccl`` space) is measured in random orders, as studies of ``--trials``
trials: each trial's load runs once to its end (its measured value) and once under each variant
of the stopping rule, against the value to beat of the trials measured before it
(:func:`~autotune.execution.early_stop.value_to_beat`, the study's budget ``--trials``). A stop
*would have won* when the stopped configuration's noise-free value is above the noise-free value
of the best measured configuration so far; it *was among the good* when above that of the
configuration that set the value to beat.

Variants: ``before`` (no least load, the value to beat as measured), ``least load`` (the
objective's default ``min_requests`` and ``min_seconds``), ``noise`` (the value to beat lowered
by ``NOISE_SDS`` x the noise, which a study measures from its repeats; here the scenario's own),
``both`` (the rule as shipped).

    python bench/early_stop_regret.py --objective throughput --studies 8 --trials 40
"""

from __future__ import annotations

import argparse
import random
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import optuna  # noqa: E402

from autotune.bench.model_executor import model_workload  # noqa: E402
from autotune.bench.setups import Setup  # noqa: E402
from autotune.execution.early_stop import StopRule, value_to_beat  # noqa: E402
from autotune.execution.workload import LoadProgress  # noqa: E402
from autotune.sim.args import parse_server_args  # noqa: E402
from autotune.sim.model import predict  # noqa: E402
from autotune.sim.scenario import list_scenarios  # noqa: E402

VARIANTS = ("before", "least load", "noise", "both")


@dataclass
class Tally:
    trials: int = 0
    stopped: int = 0
    won: int = 0
    good: int = 0
    load_s: float = 0.0
    saved_s: float = 0.0
    examples: list[str] = field(default_factory=list)


def _pool(setup: Setup, size: int, draws: int) -> list[tuple[object, dict[str, str], float]]:
    """Up to ``size`` feasible random configurations: (server args, env, noise-free value)."""
    ex = setup.executor(None)
    w = model_workload(setup.objective)
    space = setup.space
    probe = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    out = []
    for _ in range(draws):
        launch = space.to_launch(space.applied(probe.ask(space.distributions()).params))
        try:
            _, args = parse_server_args([*ex.server_args, *launch.args])
        except SystemExit:
            continue
        env = {**ex.env, **launch.env}
        p = predict(setup.scenario, args, env, w, seed=None)
        if p.outcome == "ok" and p.details.get("completed"):
            out.append((args, env, p.output_throughput))
            if len(out) >= size:
                break
    return out


def _stopped_at(setup: Setup, args: object, env: dict[str, str], seed: int, rule: StopRule) -> float | None:
    """The simulated seconds at which ``rule`` stops this run, or None when it runs to its end."""
    w = model_workload(setup.objective)
    out_total, in_total = float(w.num_prompts * w.output_len), float(w.num_prompts * w.input_len)

    def hook(elapsed_s: float, output_tokens: int, input_tokens: int, completed: int) -> bool:
        p = LoadProgress(elapsed_s, completed, 0, w.num_prompts, float(output_tokens), float(input_tokens),
                         out_total, in_total)
        return rule.observe(p) is not None

    p = predict(setup.scenario, args, env, w, seed=seed, on_progress=hook)  # type: ignore[arg-type]
    return None if p.stopped_s is None else rule.stop.elapsed_s if rule.stop else None


def run(scenario: str, objective: str, noise: float, studies: int, trials: int, pool_size: int) -> dict[str, Tally]:
    setup = Setup(scenario, "sglang_nccl", objective, noise)
    pool = _pool(setup, pool_size, 40 * pool_size)
    w = model_workload(setup.objective)
    tallies = {v: Tally() for v in VARIANTS}
    stop_after = setup.objective.stop_after
    for study in range(studies):
        order = random.Random(study).sample(range(len(pool)), min(trials, len(pool)))
        measured: list[tuple[float, int]] = []  # (measured value, pool index)
        for i, idx in enumerate(order):
            args, env, truth = pool[idx]
            seed = 1000 * study + i + 1
            full = predict(setup.scenario, args, env, w, seed=seed)  # type: ignore[arg-type]
            value, duration = full.output_throughput, float(full.details["duration_s"])
            values = [v for v, _ in measured]
            if values:
                best_truth = pool[max(measured)[1]][2]
                for variant in VARIANTS:
                    sd = noise if variant in ("noise", "both") else None
                    beat, why = value_to_beat(values, trials, noise_sd=sd)
                    if beat is None:
                        continue
                    least = variant in ("least load", "both")
                    rule = StopRule("output_throughput", beat, why, stop_after.min_requests if least else 0,
                                    stop_after.min_seconds if least else 0.0)
                    at = _stopped_at(setup, args, env, seed, rule)
                    t = tallies[variant]
                    t.trials += 1
                    t.load_s += duration
                    if at is None:
                        continue
                    t.stopped += 1
                    t.saved_s += duration - at
                    raw_beat = value_to_beat(values, trials)[0]
                    setter = next(j for v, j in measured if v == raw_beat)
                    t.won += truth > best_truth
                    t.good += truth > pool[setter][2]
                    if truth > best_truth and len(t.examples) < 3:
                        t.examples.append(f"study {study} trial {i}: truth {truth:.1f} > best's {best_truth:.1f}, "
                                          f"run read {value:.1f}, stopped at {at:.1f}s of {duration:.1f}s")
            measured.append((value, idx))
    return tallies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--objective", default="throughput")
    parser.add_argument("--noise", default="0.02,0.05,0.1")
    parser.add_argument("--studies", type=int, default=8)
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--pool", type=int, default=40)
    parser.add_argument("--scenarios", default=",".join(list_scenarios()))
    a = parser.parse_args()
    warnings.simplefilter("ignore")
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    print(f"objective {a.objective}, {a.studies} studies x {a.trials} trials per scenario and noise, pool of "
          f"{a.pool} feasible random configurations (sglang_nccl)\n")
    print("| scenario | noise sd | rule | trials judged | stopped | stopped that would have won | stopped above the value-setter | load time saved |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for scenario in a.scenarios.split(","):
        for noise in (float(x) for x in a.noise.split(",")):
            tallies = run(scenario, a.objective, noise, a.studies, a.trials, a.pool)
            for variant, t in tallies.items():
                saved = t.saved_s / t.load_s if t.load_s else 0.0
                print(f"| {scenario} | {noise:g} | {variant} | {t.trials} | {t.stopped} | {t.won} "
                      f"({t.won / max(1, t.stopped):.1%}) | {t.good} | {saved:.1%} |", flush=True)
            for variant, t in tallies.items():
                for e in t.examples:
                    print(f"<!-- {scenario} {noise:g} {variant}: {e} -->", file=sys.stderr)


if __name__ == "__main__":
    main()
