"""Scenario files: the simulated host's hardware, interconnect, model, compute and timings.

A scenario is a YAML file validated into a typed :class:`Scenario` (unknown keys are rejected).
Built-in scenarios ship in ``autotune/sim/scenarios/*.yaml``; :func:`load_scenario` takes a
built-in name or a path. Every key is described in ``docs/scenarios.md``.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any, Literal, Optional, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

__all__ = ["Scenario", "ScenarioError", "list_scenarios", "load_scenario", "scenario_descriptions"]


class ScenarioError(ValueError):
    """A scenario could not be found, read or validated. The message is one line naming the key."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GPU(_Strict):
    """The accelerators of the host (all alike)."""

    name: str
    memory_gb: float = Field(gt=0, description="total memory per GPU, GiB")
    count: int = Field(ge=1, le=64)
    reserved_gb: float = Field(
        default=1.2, ge=0, description="taken before SGLang measures free memory: CUDA context, NCCL init"
    )


class ProtoLatency(_Strict):
    """Per-hop latency (microseconds) of each NCCL protocol."""

    LL: float = Field(gt=0)
    LL128: float = Field(gt=0)
    Simple: float = Field(gt=0)


class HopLatency(_Strict):
    """Per-hop latency per algorithm and protocol over the direct GPU-to-GPU path."""

    ring: ProtoLatency
    tree: ProtoLatency


class Interconnect(_Strict):
    """How the GPUs talk: the inputs of the NCCL cost model (engine-facts: NCCL tuning.cc)."""

    kind: Literal["pcie", "nvlink"]
    p2p: bool = Field(description="GPUs can reach each other directly (else through host memory)")
    path: Literal["NVL", "PIX", "PXB", "PHB", "SYS"] = Field(
        default="PXB", description="topology distance between GPUs; P2P is used when NCCL_P2P_LEVEL >= path"
    )
    latency_us: HopLatency
    bandwidth_gbs: float = Field(gt=0, description="bus-bandwidth ceiling of the direct path, GB/s")
    channel_bandwidth_gbs: float = Field(gt=0, description="bus bandwidth one NCCL channel can drive, GB/s")
    host_latency_us: float = Field(default=10.0, ge=0, description="extra per hop through host memory")
    host_bandwidth_gbs: float = Field(default=40.0, gt=0, description="bus-bandwidth ceiling through host memory")
    proxy_us_per_channel: float = Field(
        default=0.0, ge=0, description="extra per hop per connected channel when transfers go through the host"
    )
    default_channels: int = Field(ge=1, le=64, description="channels NCCL builds on this host with no env set")
    communicators: int = Field(
        default=1, ge=1, le=8, description="NCCL communicators over the TP group that carry traffic"
    )
    nvls: bool = Field(default=False, description="NVLink SHARP (NVSwitch) available")


class Draft(_Strict):
    """A speculative-decoding draft model (EAGLE/EAGLE3)."""

    acceptance: float = Field(gt=0, lt=1, description="per-token acceptance probability")
    weights_gb: float = Field(default=1.0, ge=0, description="draft weights per GPU, GiB")
    layers: int = Field(default=1, ge=1)
    forward_ms: float = Field(default=1.0, ge=0, description="compute of one draft forward at batch 1, ms")
    token_us: float = Field(default=2.0, ge=0, description="draft compute per token, us")
    overhead_ms: float = Field(default=2.0, ge=0, description="scheduling overhead per speculative iteration, ms")
    default_steps: int = Field(default=3, ge=1)
    default_topk: int = Field(default=1, ge=1)
    default_draft_tokens: int = Field(default=4, ge=2)


class Model(_Strict):
    """The served model as one GPU sees it under tensor parallelism over all GPUs."""

    name: str
    weights_gb: float = Field(gt=0, description="weights per GPU at TP = gpu.count, GiB")
    layers: int = Field(ge=1)
    hidden_size: int = Field(ge=1)
    vocab_size: int = Field(default=128000, ge=1)
    context_len: int = Field(default=131072, ge=1)
    kv_bytes_per_token: float = Field(gt=0, description="KV-cache bytes per token per GPU")
    moe: bool = False
    experts: int = Field(default=1, ge=1)
    experts_per_token: int = Field(default=1, ge=1)
    dense_fraction: float = Field(default=1.0, ge=0, le=1, description="share of weights read by every token")
    allgather_dtype: Literal["int8", "fp8", "bfloat16", "float16", "float32"] = "bfloat16"
    draft: Optional[Draft] = None


class Compute(_Strict):
    """Per-forward compute cost of one GPU (milliseconds unless named otherwise)."""

    forward_overhead_ms: float = Field(ge=0, description="fixed per forward with CUDA graphs")
    eager_overhead_ms: float = Field(ge=0, description="extra per forward without a CUDA graph")
    weight_read_ms: float = Field(ge=0, description="reading every weight of one GPU once")
    token_us: float = Field(ge=0, description="compute per token of a decode/verify forward")
    attention_us_per_ktok: float = Field(
        default=0.05, ge=0, description="attention per token per 1000 tokens of context"
    )
    prefill_token_us: float = Field(ge=0, description="compute per prompt token of a prefill forward")


class Memory(_Strict):
    """Memory the engine needs outside weights and the KV pool (GiB unless named otherwise)."""

    workspace_gb: float = Field(default=1.0, ge=0, description="cuBLAS/attention/MoE workspaces, fixed")
    activation_mib_per_token: float = Field(default=0.1, ge=0, description="activations per token of a forward")
    graph_base_gb: float = Field(default=0.3, ge=0, description="CUDA-graph pool, fixed part")
    graph_mib_per_bs: float = Field(default=4.0, ge=0, description="CUDA-graph pool per captured batch size unit")
    capture_low_channel_gb: float = Field(
        default=0.0,
        ge=0,
        description="extra capture memory at full channel deficit (x (default-channels)/default)",
    )
    chunked_prefill_size: int = Field(default=8192, ge=1, description="SGLang's default for this GPU")
    default_mem_fraction_static: float = Field(default=0.85, gt=0, lt=1)
    default_cuda_graph_max_bs: int = Field(default=256, ge=1)


class Startup(_Strict):
    """Real (uncompressed) start-up timings in seconds."""

    init_s: float = Field(default=15.0, ge=0, description="process start, torch distributed init")
    weights_load_s: float = Field(ge=0)
    kv_alloc_s: float = Field(default=3.0, ge=0)
    graph_capture_s: float = Field(default=30.0, ge=0, description="at the default cuda-graph-max-bs")
    warmup_s: float = Field(default=5.0, ge=0)


class Noise(_Strict):
    """Run-to-run variation."""

    throughput_sd: float = Field(default=0.02, ge=0, lt=0.5, description="relative sd of throughput")


class Scenario(_Strict):
    """A simulated host: what it is, what it serves and how fast it does it."""

    name: str
    description: str = ""
    gpu: GPU
    interconnect: Interconnect
    model: Model
    compute: Compute
    memory: Memory = Memory()
    startup: Startup
    noise: Noise = Noise()
    launch_defaults: dict[str, Union[bool, int, float, str]] = Field(
        default_factory=dict,
        description="SGLang flags the host's launch command always carries (used where not given)",
    )

    @field_validator("launch_defaults")
    @classmethod
    def _known_flags(cls, value: dict[str, Any]) -> dict[str, Any]:
        from autotune.sim.args import known_fields, flag_to_field

        for key in value:
            name = flag_to_field(key)
            if name not in known_fields():
                raise ValueError(f"unknown SGLang flag {key!r}")
        return value


_PACKAGE = "autotune.sim.scenarios"


def _builtin_files() -> dict[str, Any]:
    root = resources.files(_PACKAGE)
    return {p.name[: -len(".yaml")]: p for p in root.iterdir() if p.name.endswith(".yaml")}


def list_scenarios() -> list[str]:
    """Names of the built-in scenarios, sorted."""
    return sorted(_builtin_files())


def scenario_descriptions() -> dict[str, str]:
    """Built-in name -> its one-line description."""
    return {name: load_scenario(name).description.strip().splitlines()[0] for name in list_scenarios()}


def _format_error(source: str, err: ValidationError) -> str:
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"]) or "(top level)"
    msg = first["msg"]
    if first["type"] == "extra_forbidden":
        msg = "unknown key"
    more = len(err.errors()) - 1
    tail = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
    return f"scenario {source}: {loc}: {msg}{tail}"


def parse_scenario(text: str, source: str = "<string>") -> Scenario:
    """Validate YAML text into a :class:`Scenario`.

    Raises:
        ScenarioError: the text is not YAML, not a mapping, or a key is missing, unknown or out of
            range; the one-line message names the source and the key.
    """
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ScenarioError(f"scenario {source}: not valid YAML{where}") from None
    if not isinstance(data, dict):
        raise ScenarioError(f"scenario {source}: expected a mapping of keys at the top level")
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        raise ScenarioError(_format_error(source, exc)) from None


def load_scenario(name_or_path: str | Path) -> Scenario:
    """A built-in scenario by name, or a scenario file by path.

    A string that names a built-in wins over a file of the same name in the working directory
    only if no such file exists.

    Raises:
        ScenarioError: no such built-in or file, or the file is invalid (one-line message).
    """
    text_name = str(name_or_path)
    path = Path(text_name).expanduser()
    if path.is_file():
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ScenarioError(f"scenario {path.name}: cannot read: {exc.strerror}") from None
        return parse_scenario(text, path.name)
    builtins = _builtin_files()
    if text_name in builtins:
        return parse_scenario(builtins[text_name].read_text(encoding="utf-8"), f"{text_name}.yaml")
    known = ", ".join(sorted(builtins))
    raise ScenarioError(f"scenario {text_name}: no such file or built-in scenario (built-ins: {known})")
