"""What a server measures at Ray's worker niceness (15) against niceness 0, beside busy processes.

Ray starts its workers at niceness 15 unless told otherwise (``RAY_worker_niceness``), and a
trial's server and load generator, started from a worker, inherit it. This measures what that
does to a measurement: whole trials through :class:`autotune.execution.runner.TrialRunner` against the
simulated host (server and load generator in one child process started at the niceness, as in a
Ray task), niceness 0 and 15 alternating, beside ``--busy`` CPU-bound processes at niceness 0
(the rest of a shared host). The figure is the ratio of median output throughputs (15 / 0) in
the same run; ``--busy 0`` is the control (nothing to yield to: the ratio should be near 1).

Usage: ``python bench/worker_niceness.py [--rounds 3] [--busy 3]``; prints a JSON document.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

SCENARIO = "rtx6000-pcie-glm5"
BUSY = "while True: pass"


def child(log_dir: str, number: int) -> None:
    """One trial of the quick objective against a simulated server; prints its tok/s."""
    from autotune.engines.registry import PRESETS
    from autotune.execution.hosts import LocalHost
    from autotune.config.objective import Objective
    from autotune.execution.runner import TrialRunner
    from autotune.execution.trial import TrialSpec

    template = (f"{sys.executable} -m autotune.sim serve --scenario {SCENARIO} --host {{host}} --port {{port}}"
                " --mem-fraction-static 0.8 --max-running-requests 192")
    objective = Objective.load_file("quick", {"load": {"output_len": 8, "warmup_prompts": 2}})
    runner = TrialRunner(LocalHost(), PRESETS["custom"], objective, log_dir=Path(log_dir), template=template,
                         api="sglang", ready_timeout_s=120)
    result = runner.run(TrialSpec(number, {}, []))
    if result.outcome != "ok":
        raise SystemExit(f"trial {number}: {result.outcome} {result.failure}")
    print(result.metrics["output_throughput"])


def trial(log_dir: str, number: int, niceness: int) -> float:
    done = subprocess.run([sys.executable, __file__, "--child", log_dir, str(number)], capture_output=True,
                          text=True, check=False, preexec_fn=lambda: os.nice(niceness))
    if done.returncode != 0:
        raise SystemExit(done.stderr[-2000:] or done.stdout[-2000:])
    value = float(done.stdout.strip().splitlines()[-1])
    print(f"trial {number} niceness {niceness}: {value:.1f} tok/s", file=sys.stderr)
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--busy", type=int, default=3, help="CPU-bound processes beside the trials")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]))
        return
    busy = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(args.busy)]
    by_nice: dict[int, list[float]] = {0: [], 15: []}
    try:
        with tempfile.TemporaryDirectory() as d:
            for r in range(args.rounds):
                order = (0, 15) if r % 2 == 0 else (15, 0)
                for k, n in enumerate(order):
                    by_nice[n].append(trial(d, 2 * r + k, n))
    finally:
        for p in busy:
            p.kill()
            p.wait()
    doc = {
        "busy": args.busy,
        "cores": os.cpu_count(),
        "tok_s_niceness_0": [round(x, 1) for x in by_nice[0]],
        "tok_s_niceness_15": [round(x, 1) for x in by_nice[15]],
        "niceness_15_over_0_median": round(statistics.median(by_nice[15]) / statistics.median(by_nice[0]), 4),
    }
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
