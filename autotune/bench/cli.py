"""``autotune bench ...``: benchmarks of the tuner itself. Commands only: parse, call, print.

``autotune bench tuner`` runs whole studies against the simulator's model
(:mod:`autotune.bench.tuner`) and prints, per scenario, each strategy's scores; ``--json`` prints
the report as one JSON document instead. Bad input raises :class:`~autotune.errors.UsageError`
(one line, exit 2, from ``autotune.cli.app.main``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, List, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from autotune.util.text import counted
from autotune.errors import UsageError

# autotune.bench.tuner (the driver, the simulator) is imported by the command itself: every other
# `autotune` command would otherwise pay for it at start-up.

app = typer.Typer(no_args_is_help=True, rich_markup_mode=None, help="Benchmarks of the tuner itself (no GPU needed).")


def _names(values: List[str] | None) -> tuple[str, ...]:
    """Repeated and comma-separated values, in order, without repeats."""
    out: list[str] = []
    for value in values or []:
        for name in value.split(","):
            name = name.strip()
            if not name:
                raise UsageError(f"empty name in {value!r}")
            if name not in out:
                out.append(name)
    return tuple(out)


@app.command("tuner")
def tuner(
    scenario: Optional[List[str]] = typer.Option(None, "--scenario", metavar="S",
                                                 help="A scenario (repeat or comma-separate; default: every built-in "
                                                      "unless --generated is given)."),
    generated: Optional[str] = typer.Option(None, "--generated", metavar="SEEDS",
                                            help="Also run generated hosts (`autotune sim generate`): A-B or a "
                                                 "comma-separated mix; 0-99 is the development half, 100-199 the "
                                                 "held-back half."),
    space: str = typer.Option("sglang_nccl", "--space", help="Search space (built-in name or file)."),
    objective: str = typer.Option("quick", "--objective", help="Objective (built-in name or file)."),
    trials: int = typer.Option(60, "--trials", help="Trials per study (the baseline included)."),
    seeds: int = typer.Option(20, "--seeds", help="Studies per strategy and scenario (seeds 0 .. K-1)."),
    strategies: Optional[str] = typer.Option(None, "--strategies", metavar="LIST",
                                             help="Comma-separated: autotune, autotune-warm, tpe, random, grid, tpe-naive "
                                                  "(default: all; autotune-warm with --warm-from only)."),
    warm_from: Optional[str] = typer.Option(None, "--warm-from", metavar="S",
                                            help="autotune-warm's source: a scenario whose autotune study (same seed "
                                                 "and budget) each warm-started study starts from; 'sibling' with "
                                                 "--generated: another model on each generated host."),
    force: bool = typer.Option(False, "--force", help="autotune-warm: force the warm start (a source on another host)."),
    jobs: Optional[int] = typer.Option(None, "--jobs", help="Worker processes (default: the CPU count)."),
    noise: Optional[float] = typer.Option(None, "--noise", help="Relative sd of measured throughput (default: the scenario's)."),
    scratch: Optional[Path] = typer.Option(None, "--scratch", help="Folder for the studies' SQLite files (default: /dev/shm, else the temp folder)."),
    optimum_points: Optional[int] = typer.Option(None, "--optimum-points", metavar="N",
                                                 help="Random configurations the optimum's dense search starts from (default 3000)."),
    no_early_stop: bool = typer.Option(False, "--no-early-stop",
                                       help="Run every trial's load to its end (the objective's early_stop off)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document instead of tables."),
) -> None:
    """Compare search strategies in trials and simulated GPU-hours: whole studies with the real
    driver against the simulator's model (no server, no HTTP)."""
    from autotune.bench.tuner import BenchOptions, run_bench
    from autotune.sim.scenario import list_scenarios
    from autotune.bench.strategies import STRATEGIES

    from autotune.sim.family import parse_seeds

    try:
        family = tuple(parse_seeds(generated)) if generated is not None else ()
    except ValueError as exc:
        raise UsageError(f"--generated: {exc}") from None
    opts = BenchOptions(
        scenarios=_names(scenario) or (() if family else tuple(list_scenarios())), generated=family,
        strategies=(_names([strategies]) if strategies is not None
                    else tuple(s for s in STRATEGIES if warm_from or s != "autotune-warm")),
        warm_from=warm_from, force=force,
        space=space, objective=objective, trials=trials, seeds=seeds,
        jobs=jobs if jobs is not None else (os.cpu_count() or 1),
        noise=noise, scratch=str(scratch) if scratch is not None else None, early_stop=not no_early_stop,
        **({"optimum_points": optimum_points} if optimum_points is not None else {}),
    )
    err = Console(stderr=True)
    if err.is_terminal:
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      TimeRemainingColumn(), console=err, transient=True) as bar:
            task = bar.add_task("optimum", total=None)

            def progress(done: int, total: int, what: str) -> None:
                stage = "optimum of each scenario" if what == "optimum" else "studies"
                bar.update(task, description=stage, completed=done, total=total)

            doc = run_bench(opts, progress=progress)
    else:
        doc = run_bench(opts, progress=_plain_progress(err))
    if as_json:
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return
    out = Console()
    print_report(doc, out if out.is_terminal else Console(width=150))


def _plain_progress(err: Console) -> Any:
    """Progress as a line every tenth of the studies (stderr is not a terminal)."""
    shown = {"at": -1}

    def progress(done: int, total: int, what: str) -> None:
        if what == "optimum":
            if done == 0:
                err.print(f"finding the optimum of {counted(total, 'scenario')}", markup=False, highlight=False)
            return
        step = max(1, total // 10)
        if done == total or done // step > shown["at"]:
            shown["at"] = done // step
            err.print(f"{done}/{total} studies", markup=False, highlight=False)

    return progress


def _q(stat: dict[str, Any], fmt: str = "{:.2f}", pct: bool = False) -> str:
    """``median [q1-q3]``; a quantile that falls on a run that never reached shows as ``-``."""
    def one(x: float | None) -> str:
        if x is None:
            return "-"
        return f"{x:.0%}" if pct else fmt.format(x)

    if all(stat.get(k) is None for k in ("q1", "median", "q3")):
        return "-"
    return f"{one(stat.get('median'))} [{one(stat.get('q1'))}-{one(stat.get('q3'))}]"


def print_report(doc: dict[str, Any], out: Console) -> None:
    """Two tables per scenario (each strategy's median [quartiles] over its runs): how good the
    best found is, and what reaching a share of the optimum costs; then the goals. Generated
    hosts: one line each, then the same tables over the family."""
    o = doc["options"]
    out.print(f"{o['seeds']} seeds x {o['trials']} trials, space {o['space']}, objective {o['objective']}; "
              "median [q1-q3] over seeds; '-': not reached within the budget", markup=False, highlight=False)
    family = doc.get("family")
    for name, sc in doc["scenarios"].items():
        if family is not None and name.startswith("generated-"):
            continue
        opt = sc["optimum"]
        _tables(out, f"{name}: optimum {opt['value']:.1f} {opt['metric']} ({sc['gpus']} GPUs); the baseline "
                     f"(trial 1) reaches {sc['baseline_over_optimum']:.0%} of it", name, sc["strategies"], sc.get("goals", {}))
    if family is not None:
        _hosts(out, doc)
        h = family["halves"]
        _tables(out, f"generated family: {family['hosts']} hosts (seeds {_seeds(family['seeds'])}; development "
                     f"{len(h['development'])}, held back {len(h['held_back'])}), every run pooled, each over its "
                     "host's optimum", "family", family["strategies"], family["goals"])
    out.print(f"wall time {doc['wall_s']:.0f} s", markup=False, highlight=False)


def _tables(out: Console, title: str, name: str, per: dict[str, Any], goals: dict[str, Any]) -> None:
    """A scenario's (or the family's) two tables and its goals."""
    from autotune.bench.scores import AFTER, CHECKPOINTS, TARGETS

    first = next(iter(per.values()))
    checkpoints = [c for c in CHECKPOINTS if str(c) in first["best_over_optimum_after"]]
    quality = Table(title=title, title_justify="left")
    quality.add_column("strategy")
    for c in checkpoints:
        quality.add_column(f"best/optimum @{c}", justify="right")
    quality.add_column("infeasible", justify="right")
    quality.add_column(f"infeasible after {AFTER}", justify="right")
    quality.add_column(f"never 90% in {first['never_90']['within']}", justify="right")
    for strat, s in per.items():
        quality.add_row(strat, *[_q(s["best_over_optimum_after"][str(c)]) for c in checkpoints],
                        _q(s["infeasible_share"], pct=True), _q(s[f"infeasible_share_after_{AFTER}"], pct=True),
                        f"{s['never_90']['runs']}/{s['runs']}")
    out.print(quality)
    cost = Table(title=f"{name}: trials and GPU-hours to reach a share of the optimum (runs that reached it)",
                 title_justify="left")
    cost.add_column("strategy")
    keys = [f"{round(t * 100)}" for t in TARGETS]
    for k in keys:
        cost.add_column(f"trials to {k}%", justify="right")
    for k in keys:
        cost.add_column(f"GPU-h to {k}%", justify="right")
    cost.add_column("stopped early", justify="right")
    cost.add_column("GPU-h saved", justify="right")
    for strat, s in per.items():
        cost.add_row(strat, *[f"{_q(s['trials_to'][k], '{:.0f}')} ({s['trials_to'][k]['reached']}/{s['runs']})"
                              for k in keys],
                     *[_q(s["gpu_hours_to"][k], "{:.1f}") for k in keys],
                     _q(s["stopped_share"], pct=True),
                     f"{_q(s['gpu_hours_saved'], '{:.1f}')} ({_q(s['gpu_hours_saved_share'], '{:.1%}')})")
    out.print(cost)
    for goal, g in goals.items():
        verdict = {True: "met", False: "NOT met", None: "not measured"}[g["met"]]
        out.print(f"  goal {goal}: {verdict}: {g['detail']}", markup=False, highlight=False)


def _hosts(out: Console, doc: dict[str, Any]) -> None:
    """One line per generated host: what it is, its optimum, each strategy's final best/optimum."""
    hosts = {n: sc for n, sc in doc["scenarios"].items() if n.startswith("generated-")}
    strategies = doc["options"]["strategies"]
    table = Table(title="generated hosts: final best/optimum, median over the runs", title_justify="left")
    for col in ("host", "what", "optimum", "baseline"):
        table.add_column(col, justify="left" if col in ("host", "what") else "right")
    for strat in strategies:
        table.add_column(strat, justify="right")
    for name, sc in hosts.items():
        what = sc.get("description", "").split(" (generated")[0]
        table.add_row(name, what, f"{sc['optimum']['value']:.0f}", f"{sc['baseline_over_optimum']:.0%}",
                      *[_q(sc["strategies"][s]["best_over_optimum_final"]) for s in strategies])
    out.print(table)


def _seeds(seeds: list[int]) -> str:
    """``0-19`` for a run of consecutive seeds, else the list."""
    if seeds and seeds == list(range(seeds[0], seeds[0] + len(seeds))):
        return f"{seeds[0]}-{seeds[-1]}"
    return ",".join(map(str, seeds))


__all__ = ["app", "print_report"]


