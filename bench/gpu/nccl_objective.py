"""Which configuration each NCCL objective picks: the 42 KB all-reduce alone vs the engine mix.

    python bench/gpu/nccl_objective.py DEFAULTS.json [DEFAULTS2.json ...] BEST.json [--objective nccl]
    python bench/gpu/nccl_objective.py --recorded bench/gpu/recorded/nccl_h200x2_2026-11-30.json

The JSON files are `python -m autotune.benchmarks.collectives` documents (bench/gpu/nccl_study.sh
writes them: NCCL's defaults, twice, and the study's best, at every size); ``--recorded`` reads
runs kept in one file (the numbers docs/BENCHMARKS.md printed). The defaults' latency at each size
is the mean of their runs. Prints a Markdown table: each objective's value for the defaults and
the best, their ratio and which one the objective prefers, then the mix objective's terms.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from autotune.config.objective import Objective  # noqa: E402

OLD_METRIC = "latency_us@all_reduce@43008"
"""The objective `nccl` had before it weighed the engine's mix: the decode step's all-reduce."""


def latencies(doc: dict[str, Any]) -> dict[str, float]:
    """``latency_us@OP@BYTES`` (the mean) of each result of a collectives document."""
    return {f"latency_us@{r['op']}@{r['bytes']}": float(r["latency_us"]["mean"]) for r in doc["results"]}


def mean_of(runs: list[dict[str, float]]) -> dict[str, float]:
    """Each metric's mean over the runs that measured it."""
    keys = sorted({k for run in runs for k in run})
    return {k: statistics.fmean(run[k] for run in runs if k in run) for k in keys}


def table(defaults: dict[str, float], best: dict[str, float], objective: Objective) -> list[str]:
    d, b = objective.derive(defaults), objective.derive(best)
    lines = ["| objective | defaults | best of the 42 KB study | best / defaults | prefers |",
             "| --- | ---: | ---: | ---: | --- |"]
    for label, metric in ((f"before: `{OLD_METRIC}`", OLD_METRIC),
                          (f"`{objective.name}`: `{objective.metric}`", objective.metric)):
        if metric not in d or metric not in b:
            lines.append(f"| {label} | - | - | - | not measured |")
            continue
        better = "best" if b[metric] < d[metric] else "defaults" if d[metric] < b[metric] else "neither"
        lines.append(f"| {label} | {d[metric]:.2f} | {b[metric]:.2f} | {b[metric] / d[metric]:.3f} | {better} |")
    lines += ["", f"`{objective.metric}` term by term (weight x mean latency, us):", "",
              "| term | weight | defaults us | best us | weight x (best - defaults) |", "| --- | ---: | ---: | ---: | ---: |"]
    for wm in objective.weighted:
        if wm.name != objective.metric:
            continue
        for metric, weight in wm.terms:
            if metric in defaults and metric in best:
                lines.append(f"| `{metric}` | {weight:g} | {defaults[metric]:.1f} | {best[metric]:.1f} | "
                             f"{weight * (best[metric] - defaults[metric]):+.1f} |")
            else:
                lines.append(f"| `{metric}` | {weight:g} | - | - | not measured |")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="*", help="DEFAULTS.json [DEFAULTS2.json ...] BEST.json")
    p.add_argument("--recorded", help="one file with runs 'defaults', 'defaults2', ... and 'best'")
    p.add_argument("--objective", default="nccl", help="the objective to weigh the sizes by (default: nccl)")
    args = p.parse_args(argv)
    if args.recorded:
        doc = json.loads(Path(args.recorded).read_text())
        runs = doc["runs"]
        defaults = [latencies(r) for name, r in runs.items() if name.startswith("defaults")]
        best = latencies(runs["best"])
        print(f"recorded: {doc.get('source', args.recorded)}\n")
    elif len(args.files) >= 2:
        docs = [json.loads(Path(f).read_text()) for f in args.files]
        defaults = [latencies(d) for d in docs[:-1]]
        best = latencies(docs[-1])
    else:
        p.error("give DEFAULTS.json ... BEST.json, or --recorded FILE")
    print("\n".join(table(mean_of(defaults), best, Objective.load_file(args.objective))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
