"""All engine presets by name."""

from __future__ import annotations

from autotune.engines import EnginePreset
from autotune.engines.sglang import SGLANG, SIM
from autotune.engines.transformers import TRANSFORMERS
from autotune.engines.vllm import VLLM

CUSTOM = EnginePreset(name="custom", template="", api="openai", default_port=8000)
# No server: each trial runs the objective's benchmark command with the trial's env and flags
# (e.g. an NCCL-only study timing collectives).
NONE = EnginePreset(name="none", template="", api="openai", serverless=True)

PRESETS: dict[str, EnginePreset] = {p.name: p for p in (SIM, SGLANG, VLLM, TRANSFORMERS, CUSTOM, NONE)}
