"""The transformers preset against the real engine: `transformers serve` on CPU with a tiny model.

Each study runs `python -m autotune study start CONFIG` as a user would, in a subprocess, and reads
the result back with `study show --json`. Needs torch and transformers[serving]: skipped without
them, except under CI (env var CI set), where they are installed and their absence is a failure.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.needs import require_modules

pytestmark = pytest.mark.engine

ENGINE_MODULES = ("torch", "transformers", "tokenizers", "fastapi", "uvicorn", "openai")
STUDY_TIMEOUT_S = 150


def _require_engine() -> None:
    require_modules(ENGINE_MODULES, "transformers serve", "pip install torch 'transformers[serving]'")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    _require_engine()
    from autotune.testing import make_tiny_llama

    return make_tiny_llama(tmp_path_factory.mktemp("model") / "tiny-llama", hidden_size=64, layers=2, vocab=1024)


def _write_study(tmp_path: Path, name: str, model: Path, parameters: dict[str, Any], trials: int,
                 baseline: dict[str, Any] | None = None) -> tuple[Path, str]:
    space = tmp_path / f"{name}-space.yaml"
    space.write_text(yaml.safe_dump({"name": f"{name}-space", "parameters": parameters}))
    storage = f"sqlite:///{tmp_path / 'studies.db'}"
    config = {
        "name": name,
        "target": {
            "engine": "transformers",
            "model": str(model),
            "ready_timeout_s": 120,
            # Keep the 2-core CI machine responsive and make sure nothing is fetched from a hub.
            "env": {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"},
        },
        "space": str(space),
        "objective": "transformers_cpu",
        "baseline": baseline or {},
        "budget": {"trials": trials},
        "storage": storage,
        "seed": 0,
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path, storage


def _autotune(*args: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "autotune", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def _show(name: str, storage: str, cwd: Path) -> dict[str, Any]:
    proc = _autotune("study", "show", name, "--json", "--storage", storage, cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    doc: dict[str, Any] = json.loads(proc.stdout)
    return doc


# Small, fixed KV caches: the engine's default sizes the cache from free RAM (GBs on CPU).
CB_PARAMETERS: dict[str, Any] = {
    "cb_num_blocks": {"type": "categorical", "choices": [32, 64], "flag": "--cb-num-blocks", "default": 32},
    "cb_block_size": {"type": "categorical", "choices": [16, 32], "flag": "--cb-block-size", "default": 32},
    "cb_max_batch_tokens": {"type": "categorical", "choices": [64, 256], "flag": "--cb-max-batch-tokens",
                            "default": 256},
}


def test_study_measures_real_throughput(tiny_model: Path, tmp_path: Path) -> None:
    config, storage = _write_study(tmp_path, "tf-ok", tiny_model, CB_PARAMETERS, trials=3)
    proc = _autotune("study", "start", str(config), cwd=tmp_path, timeout=STUDY_TIMEOUT_S)
    assert proc.returncode == 0, f"study failed:\n{proc.stdout}\n{proc.stderr[-4000:]}"
    doc = _show("tf-ok", storage, tmp_path)
    trials = doc["trials"]
    assert len(trials) == 3
    ok = [t for t in trials if t["outcome"] == "ok"]
    assert ok, json.dumps(trials, indent=1)[:4000]
    for t in ok:
        assert t["value"] is not None and t["value"] > 0
        assert t["metrics"]["output_throughput"] == pytest.approx(t["value"], rel=1e-3)
        assert t["metrics"]["completed"] == 32 and t["metrics"]["failed"] == 0
        # The tiny model never stops early: every request generated its output_len tokens.
        assert t["metrics"]["output_tokens"] == 32 * 16
        assert t["startup_s"] is not None and t["startup_s"] > 0
    baseline = [t for t in trials if t.get("baseline")]
    assert baseline and baseline[0]["params"] == {"cb_num_blocks": 32, "cb_block_size": 32, "cb_max_batch_tokens": 256}
    # transformers serve does not say its version: the profile reads the installed package's
    import transformers

    proc = _autotune("export", "tf-ok", "--format", "json", "--storage", storage, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    prov = json.loads(proc.stdout)["provenance"]
    assert prov["engine_version"] == transformers.__version__ and prov["sources"]["engine_version"] == "host facts"


def test_rejected_value_is_infeasible_with_engine_text(tiny_model: Path, tmp_path: Path) -> None:
    # The engine refuses a KV block (page) size below 4 when continuous batching starts, i.e. at
    # the first request: 5.17 "Block size must be at least 4, but got 2", 5.24 "page_size must be
    # at least 4 but got cb_config.page_size = 2".
    parameters = dict(CB_PARAMETERS)
    parameters["cb_block_size"] = {"type": "categorical", "choices": [2, 32], "flag": "--cb-block-size", "default": 2}
    config, storage = _write_study(tmp_path, "tf-bad", tiny_model, parameters, trials=1)
    proc = _autotune("study", "start", str(config), cwd=tmp_path, timeout=STUDY_TIMEOUT_S)
    assert proc.returncode == 0, f"study failed:\n{proc.stdout}\n{proc.stderr[-4000:]}"
    (trial,) = _show("tf-bad", storage, tmp_path)["trials"]
    assert trial["params"]["cb_block_size"] == 2
    assert trial["outcome"] == "infeasible", trial
    assert trial["state"] != "FAIL"  # told to the sampler, not retried as an infrastructure fault
    failure = trial["failure"]
    assert failure is not None
    assert failure["kind"] == "invalid-argument", failure  # found at launch by the ready probe
    assert "must be at least 4" in failure["message"] + failure["excerpt"], failure
    assert "must be at least 4" in failure["excerpt"], failure


def test_prompts_are_the_objectives_tokens_by_the_servers_count(tiny_model: Path, tmp_path: Path) -> None:
    """`input_len` is tokens of the model's tokenizer, made as `vllm bench serve --dataset-name random`
    makes them: transformers serve's own usage counts exactly `input_len` prompt tokens per request.
    (5.19's GET /v1/models answers 500: the tokenizer comes from the target's model path.)
    The KV cache is bounded by --cb-num-blocks: left to the engine it takes most of free host
    memory (15 GiB here), and a loaded CI machine's OOM killer ended the server mid-load."""
    from autotune.config.objective import Objective
    from autotune.execution.loadgen import run_load_sync
    from autotune.execution.workload import workload_of
    from autotune.util.net import free_port, wait_http_ok

    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    log_path = tmp_path / "server.log"
    with log_path.open("wb") as log:
        server = subprocess.Popen([sys.executable, "-m", "transformers.cli.transformers", "serve", str(tiny_model),
                                   "--host", "127.0.0.1", "--port", str(port), "--continuous-batching",
                                   "--cb-num-blocks", "64", "--cb-block-size", "32", "--cb-max-batch-tokens", "256"],
                                  env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        assert wait_http_ok(url + "/health", 120, alive=lambda: server.poll() is None), "transformers serve not ready"
        load = Objective.load_file("transformers_cpu").load
        workload = workload_of(load, api="openai", model=None, tokenizer_hint=str(tiny_model))
        result = run_load_sync(url, workload)
        server_log = log_path.read_text(errors="replace")[-3000:]
        assert (result.completed, result.failed) == (load.num_prompts, 0), (result.errors, server_log)
        assert result.prompts.startswith(f"prompts: {load.input_len} tokens of {tiny_model}'s tokenizer"), result.prompts
        assert result.metrics["input_tokens"] == load.num_prompts * load.input_len  # the server's usage
        assert result.metrics["output_tokens"] == load.num_prompts * load.output_len
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(30)
