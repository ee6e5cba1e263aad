"""Measured (load generator against `sim serve`) vs predicted (`sim predict`) throughput, for
every built-in scenario, on this machine.

    python bench/sim_agreement.py            # prints a markdown table; exit 1 if any ratio is off by > 5%
    python bench/sim_agreement.py tiny       # only the cases whose scenario names contain "tiny"

Both sides use the same seed (AUTOTUNE_SIM_SEED / --seed), so the server's run-to-run noise is
the one the prediction includes, and the ratio measures the served simulator, not the noise.

The tests only check that the served throughput is never above the prediction (a loaded machine
makes it lower, so a two-sided bound in a test is flaky); how close the two are is measured here,
including the test suite's own case (tests/sim/tiny_scenario.yaml under the load of
tests/sim/test_sim_server.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


from autotune.util.net import free_port, wait_http_ok
from autotune.execution.loadgen import run_load_sync
from autotune.execution.workload import Workload

SEED = 7
READY_TIMEOUT_S = 60
TINY = str(Path(__file__).resolve().parents[1] / "tests" / "sim" / "tiny_scenario.yaml")
CASES = [
    # scenario, server flags, NCCL env, workload (concurrency, prompts, input, output, api)
    ("rtx6000-pcie-glm5", ["--mem-fraction-static", "0.92", "--max-running-requests", "1024"],
     {"NCCL_MIN_NCHANNELS": "8"}, (512, 1024, 128, 32, "sglang")),
    ("rtx6000-pcie-kimi-eagle3", ["--mem-fraction-static", "0.55", "--max-running-requests", "64"],
     {}, (32, 128, 128, 64, "openai")),
    ("h200-nvlink-llama70b", ["--mem-fraction-static", "0.85", "--max-running-requests", "256"],
     {}, (256, 1024, 128, 128, "openai")),
    # tests/sim/test_sim_server.py::test_served_throughput_is_paced_by_the_model (its noise is 0)
    (TINY, [], {}, (64, 256, 64, 64, "sglang")),
]


def _label(scenario: str) -> str:
    """A built-in scenario's name, or a scenario file's name."""
    return Path(scenario).name if scenario.endswith(".yaml") else scenario


def _wait_ready(port: int, server: subprocess.Popen[bytes]) -> bool:
    """True once the server answers /health with 200; False if it exits or the deadline passes."""
    return wait_http_ok(f"http://127.0.0.1:{port}/health", READY_TIMEOUT_S, alive=lambda: server.poll() is None)


def _flag_sets(flags: list[str], env: dict[str, str]) -> list[str]:
    out: list[str] = []
    for i in range(0, len(flags), 2):
        out += ["--set", f"{flags[i].lstrip('-')}={flags[i + 1]}"]
    for k, v in env.items():
        out += ["--set", f"{k}={v}"]
    return out


def main(argv: list[str]) -> int:
    """Measure every case (or those whose scenario names contain one of ``argv``); 1 if any is off."""
    cases = [c for c in CASES if not argv or any(a in _label(c[0]) for a in argv)]
    if not cases:
        print(f"no case matches {' '.join(argv)}; scenarios: {', '.join(_label(c[0]) for c in CASES)}", file=sys.stderr)
        return 2
    print("| scenario | load (concurrency, prompts, in/out, api) | measured tok/s | predicted tok/s | ratio |")
    print("| --- | --- | ---: | ---: | ---: |")
    worst = 0.0
    for scenario, flags, env, (conc, prompts, inp, outp, api) in cases:
        pred = json.loads(subprocess.run(
            [sys.executable, "-m", "autotune.sim", "predict", "--scenario", scenario, *_flag_sets(flags, env),
             "--concurrency", str(conc), "--num-prompts", str(prompts), "--input-len", str(inp),
             "--output-len", str(outp), "--seed", str(SEED), "--json"],
            capture_output=True, text=True, check=True).stdout)
        if pred["outcome"] != "ok":
            print(f"| {_label(scenario)} | predicted {pred['outcome']}: {pred.get('message')} | | | |")
            continue
        port = free_port()
        server = subprocess.Popen(
            [sys.executable, "-m", "autotune.sim", "serve", "--scenario", scenario, "--port", str(port), *flags],
            env={**os.environ, **env, "AUTOTUNE_SIM_SEED": str(SEED)},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            if not _wait_ready(port, server):
                print(f"| {_label(scenario)} | not ready within {READY_TIMEOUT_S} s | | | |", flush=True)
                worst = float("inf")
                continue
            result = run_load_sync(f"http://127.0.0.1:{port}", Workload(
                api=api, concurrency=conc, num_prompts=prompts, input_len=inp, output_len=outp, warmup_prompts=0))
        finally:
            os.killpg(server.pid, 9)
            server.wait(timeout=10)
        measured = result.metrics["output_throughput"]
        ratio = measured / pred["output_throughput"]
        worst = max(worst, abs(1 - ratio))
        case = " ".join([_label(scenario), *flags, *(f"{k}={v}" for k, v in env.items())])
        print(f"| {case} | {conc}, {prompts}, {inp}/{outp}, {api} | {measured:,.0f} "
              f"| {pred['output_throughput']:,.0f} | {ratio:.3f} |", flush=True)
    print(f"\nlargest deviation: {worst:.1%}")
    return 0 if worst <= 0.05 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
