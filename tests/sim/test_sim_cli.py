"""``autotune sim`` / ``python -m autotune.sim``: scenarios, predict --json, one-line bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from autotune.sim.cli import app

TINY = str(Path(__file__).with_name("tiny_scenario.yaml"))

runner = CliRunner()


def test_scenarios_lists_builtins() -> None:
    out = runner.invoke(app, ["scenarios"])
    assert out.exit_code == 0
    assert "rtx6000-pcie-glm5" in out.stdout and "h200-nvlink-llama70b" in out.stdout


def test_predict_json_seed_behaviours() -> None:
    base = ["predict", "--scenario", "rtx6000-pcie-glm5", "--set", "mem-fraction-static=0.92",
            "--set", "max_running_requests=1024", "--set", "NCCL_MIN_NCHANNELS=8", "--json"]
    out = runner.invoke(app, base)
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert doc["outcome"] == "ok" and doc["output_throughput"] > 0 and doc["total_throughput"] > doc["output_throughput"]
    assert {"outcome", "output_throughput", "total_throughput", "memory", "startup_s", "message"} <= set(doc)
    tree = json.loads(runner.invoke(app, base + ["--set", "NCCL_ALGO=Tree"]).stdout)
    assert tree["outcome"] == "nccl-error" and "ncclInt8" in tree["message"]


def test_predict_user_scenario_and_workload() -> None:
    out = runner.invoke(app, ["predict", "--scenario", TINY, "--concurrency", "8", "--num-prompts", "16",
                              "--input-len", "32", "--output-len", "16", "--set", "--cuda-graph-max-bs=16", "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["details"]["cuda_graph_max_bs"] == 16


def test_predict_bad_input_is_one_line_exit_2() -> None:
    for args in (["--set", "mem-fraction-static=x"], ["--set", "no-such-flag=1"], ["--set", "novalue"],
                 ["--concurrency", "0"]):
        proc = subprocess.run([sys.executable, "-m", "autotune.sim", "predict", "--scenario", TINY, *args],
                              capture_output=True, text=True, timeout=30)
        assert proc.returncode == 2, (args, proc.stderr)
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    proc = subprocess.run([sys.executable, "-m", "autotune.sim", "predict", "--scenario", "nope"],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and proc.stderr.startswith("autotune sim: error: scenario nope:")


def test_an_unknown_option_is_a_usage_error_not_a_traceback() -> None:
    proc = subprocess.run([sys.executable, "-m", "autotune.sim", "predict", "--bogus"],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert "No such option: --bogus" in proc.stderr and "Traceback" not in proc.stderr
