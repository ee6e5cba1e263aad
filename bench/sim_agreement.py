"""Measured (load generator against `sim serve`) vs predicted (`sim predict`) throughput, for
every built-in scenario, on this machine.

    python bench/sim_agreement.py            # prints a markdown table; exit 1 if any ratio is off by > 5%

Both sides use the same seed (AUTOTUNE_SIM_SEED / --seed), so the server's run-to-run noise is
the one the prediction includes, and the ratio measures the served simulator, not the noise.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import requests

from autotune.loadgen import Workload, run_load_sync

SEED = 7
CASES = [
    # scenario, server flags, NCCL env, workload (concurrency, prompts, input, output, api)
    ("rtx6000-pcie-glm5", ["--mem-fraction-static", "0.92", "--max-running-requests", "1024"],
     {"NCCL_MIN_NCHANNELS": "8"}, (512, 1024, 128, 32, "sglang")),
    ("rtx6000-pcie-kimi-eagle3", ["--mem-fraction-static", "0.55", "--max-running-requests", "64"],
     {}, (32, 128, 128, 64, "openai")),
    ("h200-nvlink-llama70b", ["--mem-fraction-static", "0.85", "--max-running-requests", "256"],
     {}, (256, 1024, 128, 128, "openai")),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _flag_sets(flags: list[str], env: dict[str, str]) -> list[str]:
    out: list[str] = []
    for i in range(0, len(flags), 2):
        out += ["--set", f"{flags[i].lstrip('-')}={flags[i + 1]}"]
    for k, v in env.items():
        out += ["--set", f"{k}={v}"]
    return out


def main() -> int:
    print("| scenario | load (concurrency, prompts, in/out, api) | measured tok/s | predicted tok/s | ratio |")
    print("| --- | --- | ---: | ---: | ---: |")
    worst = 0.0
    for scenario, flags, env, (conc, prompts, inp, outp, api) in CASES:
        pred = json.loads(subprocess.run(
            [sys.executable, "-m", "autotune.sim", "predict", "--scenario", scenario, *_flag_sets(flags, env),
             "--concurrency", str(conc), "--num-prompts", str(prompts), "--input-len", str(inp),
             "--output-len", str(outp), "--seed", str(SEED), "--json"],
            capture_output=True, text=True, check=True).stdout)
        if pred["outcome"] != "ok":
            print(f"| {scenario} | predicted {pred['outcome']}: {pred.get('message')} | | | |")
            continue
        port = _free_port()
        server = subprocess.Popen(
            [sys.executable, "-m", "autotune.sim", "serve", "--scenario", scenario, "--port", str(port), *flags],
            env={**os.environ, **env, "AUTOTUNE_SIM_SEED": str(SEED)},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    if requests.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                        break
                except requests.RequestException:
                    pass
                time.sleep(0.2)
            result = run_load_sync(f"http://127.0.0.1:{port}", Workload(
                api=api, concurrency=conc, num_prompts=prompts, input_len=inp, output_len=outp, warmup_prompts=0))
        finally:
            os.killpg(server.pid, 9)
            server.wait()
        measured = result.metrics["output_throughput"]
        ratio = measured / pred["output_throughput"]
        worst = max(worst, abs(1 - ratio))
        print(f"| {scenario} {' '.join(flags)} {' '.join(f'{k}={v}' for k, v in env.items())} "
              f"| {conc}, {prompts}, {inp}/{outp}, {api} | {measured:,.0f} | {pred['output_throughput']:,.0f} | {ratio:.3f} |",
              flush=True)
    print(f"\nlargest deviation: {worst:.1%}")
    return 0 if worst <= 0.05 else 1


if __name__ == "__main__":
    sys.exit(main())
