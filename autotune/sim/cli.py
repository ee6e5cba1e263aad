"""``autotune sim ...`` / ``python -m autotune.sim ...``: serve, scenarios, predict, generate.

Commands only: parse, call, print. Bad input prints one line on stderr and exits 2.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import List, Optional

import typer

from autotune.sim.args import ServerArgs, args_from_mapping
from autotune.sim.model import Workload, predict
from autotune.sim.scenario import ScenarioError, load_scenario, scenario_descriptions

__all__ = ["app"]

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=None,
                  help="The simulated GPU host: an SGLang-like server driven by a scenario file.")


def _bad(message: str) -> typer.Exit:
    sys.stderr.write(f"autotune sim: error: {' '.join(message.split())}\n")
    return typer.Exit(2)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True,
                               "help_option_names": []})
def serve(ctx: typer.Context) -> None:
    """Launch a simulated SGLang server: --scenario NAME|FILE --port P [SGLang flags]."""
    from autotune.sim.server import main

    raise typer.Exit(main(list(ctx.args)))


@app.command()
def scenarios(as_json: bool = typer.Option(False, "--json", help="One JSON object: name -> description.")) -> None:
    """List the built-in scenarios with a one-line description."""
    try:
        found = scenario_descriptions()
    except ScenarioError as exc:  # a broken built-in is a packaging bug, still one line
        raise _bad(str(exc)) from None
    if as_json:
        sys.stdout.write(json.dumps(found) + "\n")
        return
    width = max(len(n) for n in found) if found else 0
    for name, text in found.items():
        sys.stdout.write(f"{name:<{width}}  {text}\n")


def _split_sets(items: List[str]) -> tuple[dict[str, str], dict[str, str]]:
    env: dict[str, str] = {}
    flags: dict[str, str] = {}
    for item in items:
        if "=" not in item:
            raise _bad(f"--set {item!r}: expected KEY=VALUE (an NCCL_* variable or an SGLang flag)")
        key, value = item.split("=", 1)
        key = key.strip()
        if not key:
            raise _bad(f"--set {item!r}: empty KEY")
        if key.upper().startswith("NCCL_") and not key.startswith("-"):
            env[key.upper()] = value.strip()
        else:
            flags[key] = value.strip()
    return env, flags


@app.command(name="generate")
def generate_cmd(
    seeds: str = typer.Argument(..., metavar="SEEDS", help="Seeds: N, A-B (inclusive) or a comma-separated mix."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Folder to write generated-SEED.yaml files into "
                                       "(default: print the YAML of one seed)."),
) -> None:
    """Draw plausible hosts from seeds (the generated family): scenario YAML that `autotune sim`
    and `autotune bench tuner` load. The same seed gives the same host."""
    from autotune.sim.family import generate, generated_name, parse_seeds, to_yaml

    try:
        chosen = parse_seeds(seeds)
    except ValueError as exc:
        raise _bad(str(exc)) from None
    if out is None:
        if len(chosen) > 1:
            raise _bad(f"{len(chosen)} seeds: give --out DIR to write them (one seed prints its YAML)")
        sys.stdout.write(to_yaml(generate(chosen[0])))
        return
    try:
        out.mkdir(parents=True, exist_ok=True)
        for seed in chosen:
            path = out / f"{generated_name(seed)}.yaml"
            path.write_text(to_yaml(generate(seed)), encoding="utf-8")
            sys.stdout.write(f"{path}\n")
    except OSError as exc:
        raise _bad(f"--out {out}: cannot write: {exc.strerror}") from None


@app.command(name="predict")
def predict_cmd(
    scenario: str = typer.Option(..., "--scenario", "-s", help="Built-in scenario name or a scenario YAML file."),
    sets: Optional[List[str]] = typer.Option(None, "--set", help="KEY=VALUE: NCCL_* env var or SGLang flag (repeat)."),
    concurrency: int = typer.Option(256, "--concurrency", help="Requests in flight."),
    num_prompts: int = typer.Option(1024, "--num-prompts", help="Requests in the run."),
    input_len: int = typer.Option(256, "--input-len", help="Prompt tokens per request."),
    output_len: int = typer.Option(128, "--output-len", help="Output tokens per request."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Add the run-to-run noise the server would have with AUTOTUNE_SIM_SEED=SEED."),
    use_env: bool = typer.Option(False, "--use-env", help="Also read NCCL_* variables from this shell's environment."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
) -> None:
    """Predict outcome, throughput, memory and start-up time of one launch configuration."""
    try:
        sc = load_scenario(scenario)
    except ScenarioError as exc:
        raise _bad(str(exc)) from None
    env, flags = _split_sets(sets or [])
    if use_env:
        env = {**{k: v for k, v in os.environ.items() if k.startswith("NCCL_")}, **env}
    try:
        args = args_from_mapping(flags) if flags else ServerArgs()
        workload = Workload(concurrency=concurrency, num_prompts=num_prompts, input_len=input_len,
                            output_len=output_len)
    except ValueError as exc:
        raise _bad(str(exc)) from None
    p = predict(sc, args, env, workload, seed=seed)
    doc = {
        "outcome": p.outcome,
        "output_throughput": p.output_throughput,
        "total_throughput": p.total_throughput,
        "request_throughput": p.request_throughput,
        "memory": p.memory,
        "startup_s": p.startup_s,
        "failure_s": p.failure_s,
        "message": p.message,
        "details": p.details,
    }
    if as_json:
        sys.stdout.write(json.dumps(doc) + "\n")
        return
    lines = [f"scenario: {sc.name}", f"outcome: {p.outcome}"]
    if p.outcome == "ok":
        lines += [f"output throughput: {p.output_throughput:.1f} tok/s",
                  f"total throughput: {p.total_throughput:.1f} tok/s",
                  f"request throughput: {p.request_throughput:.3f} req/s",
                  f"start-up: {p.startup_s:.0f} s (real, uncompressed)"]
    else:
        lines += [f"failure after: {p.failure_s:.0f} s (real, uncompressed)", f"message: {p.message}"]
    if p.memory:
        lines.append("memory per GPU (GiB): " + ", ".join(f"{k}={v:g}" for k, v in p.memory.items()))
    if p.details:
        lines.append("details: " + ", ".join(f"{k}={v}" for k, v in p.details.items()))
    sys.stdout.write("\n".join(lines) + "\n")
