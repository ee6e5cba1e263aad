"""vLLM (``vllm serve``): OpenAI API, readiness on /health, Prometheus metrics on /metrics."""

from __future__ import annotations

from autotune.engines import EnginePreset

VLLM = EnginePreset(
    name="vllm",
    template="vllm serve {model} --host {host} --port {port}",
    api="openai",
    default_port=8000,
    info_paths=("/metrics",),
)
