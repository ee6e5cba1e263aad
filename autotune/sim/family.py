"""A family of generated hosts: plausible scenarios drawn from seeds.

:func:`generate` draws one :class:`~autotune.sim.scenario.Scenario` from a seed: a GPU of
:data:`GPUS` (memory, bandwidth, compute), 2, 4 or 8 of them over NVLink or PCIe with or without
P2P, a dense or MoE model of :data:`MODELS` at a precision the GPU runs whose weights take 8-72%
of a GPU, a draft model whose acceptance is drawn so that speculation helps on some hosts and
hurts on others, and memory outside the weights (workspaces, CUDA graphs, a low-channel capture
cost, a launch command's memory fraction) drawn so that the memory boundaries fall in different
places. Every figure is derived from the draws the way the built-in scenarios' are
(docs/scenarios.md).

Contract: the same seed gives the same scenario (a ``random.Random(seed)`` is the only source);
every generated host serves a small load at some ``--mem-fraction-static`` with otherwise
default flags (draws that would not are redrawn, still from the seed's generator).
:func:`generate_sibling` draws another model on a seed's host (a pair that shares a host).
:func:`to_yaml` writes one as a scenario file that ``autotune sim`` and ``autotune bench tuner``
load; :func:`parse_seeds` reads ``A-B`` / ``A,B,C`` seed lists; :data:`DEVELOPMENT` and
:data:`HELD_BACK` are the halves of the family a change may be tuned on and the one it is judged on.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import yaml

from autotune.sim.args import ServerArgs
from autotune.sim.model import Workload, predict
from autotune.sim.scenario import Scenario

__all__ = ["DEVELOPMENT", "GPUS", "HELD_BACK", "MODELS", "generate", "generate_sibling", "generated_name", "parse_seeds",
           "to_yaml"]

DEVELOPMENT = range(0, 100)
"""Seeds a change to the tuner may be developed and tuned on."""
HELD_BACK = range(100, 200)
"""Seeds no change is tuned on: the family's goals are reported on these."""
_MAX_REDRAWS = 50


@dataclass(frozen=True)
class GpuKind:
    """A GPU model: what torch reports, HBM bandwidth (TB/s), dense bf16 TFLOP/s, and how it connects."""

    name: str
    memory_gb: float
    bandwidth_tbs: float
    tflops: float
    nvlink_gbs: float | None
    """Bus bandwidth of an NVLink system (None: a PCIe card)."""
    pcie_gbs: float
    precisions: tuple[float, ...]
    """Bytes per weight it serves well: 2 (bf16), 1 (fp8), 0.5 (fp4 / int4)."""


GPUS = (
    GpuKind("NVIDIA H100 80GB HBM3", 79.1, 3.35, 990, 360, 48, (2, 1, 0.5)),
    GpuKind("NVIDIA H200", 139.8, 4.8, 990, 360, 48, (2, 1, 0.5)),
    GpuKind("NVIDIA A100-SXM4-80GB", 79.1, 2.0, 312, 230, 24, (2, 0.5)),
    GpuKind("NVIDIA A100-SXM4-40GB", 39.4, 1.55, 312, 230, 24, (2, 0.5)),
    GpuKind("NVIDIA B200", 178.4, 8.0, 2250, 720, 48, (2, 1, 0.5)),
    GpuKind("NVIDIA H100 PCIe", 79.1, 2.0, 756, None, 48, (2, 1, 0.5)),
    GpuKind("NVIDIA L40S", 44.4, 0.86, 362, None, 24, (2, 1, 0.5)),
    GpuKind("NVIDIA GeForce RTX 4090", 23.6, 1.0, 330, None, 24, (2, 1, 0.5)),
    GpuKind("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", 95.59, 1.8, 500, None, 48, (2, 1, 0.5)),
)


@dataclass(frozen=True)
class ModelKind:
    """A model architecture: total and active parameters (billions), layers, hidden size, KV
    heads (0: MLA, a 576-wide latent per layer on every GPU), vocabulary, MoE experts."""

    name: str
    params_b: float
    active_b: float
    layers: int
    hidden: int
    kv_heads: int
    vocab: int
    experts: int = 1
    experts_per_token: int = 1


MODELS = (
    ModelKind("dense-8b", 8, 8, 32, 4096, 8, 128256),
    ModelKind("dense-14b", 14, 14, 48, 5120, 8, 152064),
    ModelKind("dense-32b", 32, 32, 64, 5120, 8, 152064),
    ModelKind("dense-70b", 70, 70, 80, 8192, 8, 128256),
    ModelKind("dense-123b", 123, 123, 88, 12288, 8, 32768),
    ModelKind("dense-405b", 405, 405, 126, 16384, 8, 128256),
    ModelKind("moe-30b-a3b", 30, 3.3, 48, 2048, 4, 151936, 128, 8),
    ModelKind("moe-47b-a13b", 47, 13, 32, 4096, 8, 32000, 8, 2),
    ModelKind("moe-106b-a12b", 106, 12, 46, 4096, 8, 151552, 128, 8),
    ModelKind("moe-235b-a22b", 235, 22, 94, 4096, 4, 151936, 128, 8),
    ModelKind("moe-355b-a32b", 355, 32, 92, 5120, 8, 151552, 160, 8),
    ModelKind("moe-671b-a37b", 671, 37, 61, 7168, 0, 129280, 256, 8),
    ModelKind("moe-1t-a32b", 1000, 32, 61, 7168, 0, 163840, 384, 8),
)

_GIB = float(1 << 30)
_PRECISION = {2: "bf16", 1: "fp8", 0.5: "fp4"}
_GATHER = {2: "bfloat16", 1: "fp8", 0.5: "int8"}


def generated_name(seed: int) -> str:
    """The name of the host drawn from ``seed``."""
    return f"generated-{seed}"


def generate(seed: int) -> Scenario:
    """The host drawn from ``seed`` (module docstring)."""
    rng = random.Random(seed)
    for _ in range(_MAX_REDRAWS):
        scenario = _Draw(rng, seed).scenario()
        if _serves(scenario):
            return scenario
    raise RuntimeError(f"seed {seed}: no host that serves in {_MAX_REDRAWS} draws")  # not seen on seeds 0-999


def generate_sibling(seed: int) -> Scenario:
    """Another model on the host drawn from ``seed`` (named ``generated-SEED-sibling``): the same
    GPUs, count and interconnect, a model of :data:`MODELS` other than the host's own, drawn with
    its compute, memory and launch command from a generator of its own (the same seed, the same
    sibling)."""
    host = generate(seed)
    rng = random.Random(f"sibling-{seed}")
    for _ in range(_MAX_REDRAWS):
        scenario = _Draw(rng, seed, host=host).scenario()
        if _serves(scenario):
            return scenario
    raise RuntimeError(f"seed {seed}: no sibling that serves in {_MAX_REDRAWS} draws")


def to_yaml(scenario: Scenario) -> str:
    """A scenario file's text (what :func:`~autotune.sim.scenario.parse_scenario` reads back)."""
    doc = scenario.model_dump(mode="json")
    return yaml.safe_dump(doc, sort_keys=False, width=200)


def parse_seeds(text: str) -> list[int]:
    """``A-B`` (inclusive), ``A,B,C`` or a mix (``0-3,10``), in order without repeats.

    Raises:
        ValueError: one line naming the part that is not a seed or a range of them.
    """
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        lo, sep, hi = part.partition("-")
        try:
            first, last = (int(lo), int(hi)) if sep else (int(part), int(part))
        except ValueError:
            raise ValueError(f"seeds {text!r}: {part!r} is not a seed or a range A-B of them") from None
        if first < 0 or last < first:
            raise ValueError(f"seeds {text!r}: {part!r} is not a range of non-negative seeds (A-B with A <= B)")
        out += [s for s in range(first, last + 1) if s not in out]
    if not out:
        raise ValueError(f"seeds {text!r}: no seed")
    return out


def _serves(scenario: Scenario) -> bool:
    """Whether the host serves a small load at some memory fraction with otherwise default flags."""
    small = Workload(concurrency=8, num_prompts=8, input_len=64, output_len=16)
    for mfs in (0.95, 0.9, 0.85, 0.8, 0.7, 0.6, 0.5):
        if predict(scenario, ServerArgs(mem_fraction_static=mfs), {}, small).outcome == "ok":
            return True
    return False


def _link_words(kind: str, p2p: bool) -> str:
    """How a host's description names its interconnect."""
    return "over NVLink" if kind == "nvlink" else "over PCIe" + ("" if p2p else " without P2P")


class _Draw:
    """One draw of a host from ``rng`` (each figure a method, in a fixed order)."""

    def __init__(self, rng: random.Random, seed: int, host: Scenario | None = None) -> None:
        self.rng = rng
        self.seed = seed
        self.host = host
        self.gpu = rng.choice(GPUS) if host is None else next(g for g in GPUS if g.name == host.gpu.name)
        counts = (2, 4, 8) if host is None else (host.gpu.count,)
        options = [(m, b, n) for m in MODELS for b in self.gpu.precisions for n in counts
                   if 0.08 <= self._weights(m, b, n) / self.gpu.memory_gb <= 0.72
                   and (host is None or not host.model.name.startswith(f"generated/{m.name}-"))]
        self.model, self.bytes, self.count = rng.choice(options)
        self.weights_gb = self._weights(self.model, self.bytes, self.count)

    def _weights(self, m: ModelKind, b: float, n: int) -> float:
        return m.params_b * 1e9 * b / n / _GIB

    def u(self, lo: float, hi: float) -> float:
        return self.rng.uniform(lo, hi)

    def scenario(self) -> Scenario:
        interconnect, where = self.interconnect()  # drawn for a sibling too: the draws after it stay put
        if self.host is not None:  # a sibling: the host's own interconnect
            link = self.host.interconnect
            interconnect, where = link.model_dump(mode="json"), _link_words(link.kind, link.p2p)
        model, spec = self.served_model()
        memory, launch = self.memory()
        m = self.model
        doc: dict[str, Any] = {
            "name": generated_name(self.seed) + ("" if self.host is None else "-sibling"),
            "description": (f"{self.count}x {self.gpu.name.replace('NVIDIA ', '')} {where}, {m.name} "
                            f"{_PRECISION[self.bytes]} at TP{self.count}; {spec} (generated, seed {self.seed}"
                            f"{'' if self.host is None else ', sibling'})"),
            "gpu": {"name": self.gpu.name, "memory_gb": self.gpu.memory_gb, "count": self.count,
                    "reserved_gb": round(self.u(0.8, 1.8), 2)},
            "interconnect": interconnect, "model": model, "compute": self.compute(), "memory": memory,
            "startup": {"init_s": round(self.u(12, 30)), "weights_load_s": round(10 + self.weights_gb * self.u(1.5, 4)),
                        "kv_alloc_s": round(self.u(2, 5)), "graph_capture_s": round(self.u(20, 70)),
                        "warmup_s": round(self.u(3, 10))},
            "noise": {"throughput_sd": 0.02},
            "launch_defaults": launch,
        }
        return Scenario.model_validate(doc)

    def interconnect(self) -> tuple[dict[str, Any], str]:
        r = round
        if self.gpu.nvlink_gbs is not None:
            lat = {"LL": r(self.u(0.5, 0.9), 2), "LL128": r(self.u(1.6, 2.4), 2), "Simple": r(self.u(3.0, 4.2), 2)}
            return ({"kind": "nvlink", "p2p": True, "path": "NVL", "latency_us": {"ring": lat, "tree": dict(lat)},
                     "bandwidth_gbs": r(self.gpu.nvlink_gbs * self.u(0.85, 1.0)),
                     "channel_bandwidth_gbs": r(self.gpu.nvlink_gbs / self.rng.choice((12, 16, 24)), 1),
                     "default_channels": self.rng.choice((8, 16, 24, 32)),
                     "communicators": 1, "nvls": self.count == 8 and self.rng.random() < 0.5},
                    _link_words("nvlink", True))
        p2p = self.rng.random() < 0.5
        lat_ring = {"LL": r(self.u(0.8, 1.3), 2), "LL128": r(self.u(2.0, 3.0), 2), "Simple": r(self.u(4.5, 6.5), 2)}
        lat_tree = {"LL": lat_ring["LL"], "LL128": r(lat_ring["LL128"] * 0.8, 2), "Simple": r(lat_ring["Simple"] * 0.7, 2)}
        doc = {"kind": "pcie", "p2p": p2p, "path": self.rng.choice(("PIX", "PXB")) if p2p else "SYS",
               "latency_us": {"ring": lat_ring, "tree": lat_tree},
               "bandwidth_gbs": r(self.gpu.pcie_gbs * self.u(0.8, 1.0)),
               "channel_bandwidth_gbs": r(self.u(3.0, 7.0), 1),
               "host_latency_us": r(self.u(5, 12), 1), "host_bandwidth_gbs": r(self.u(20, 40)),
               "proxy_us_per_channel": r(self.u(0.1, 0.6), 2),
               "default_channels": self.rng.choice((2, 4, 8, 16)),
               "communicators": self.rng.choice((1, 1, 2))}
        return doc, _link_words("pcie", p2p)

    def served_model(self) -> tuple[dict[str, Any], str]:
        m, n = self.model, self.count
        if m.kv_heads == 0:  # MLA: the latent of every layer on every GPU
            kv = (512 + 64) * 2 * m.layers
        else:
            kv = m.layers * max(1.0, m.kv_heads / n) * 128 * 2 * 2
        doc: dict[str, Any] = {
            "name": f"generated/{m.name}-{_PRECISION[self.bytes]}", "weights_gb": round(self.weights_gb, 2),
            "layers": m.layers, "hidden_size": m.hidden, "vocab_size": m.vocab,
            "context_len": self.rng.choice((32768, 131072)), "kv_bytes_per_token": round(kv),
            "moe": m.experts > 1, "experts": m.experts, "experts_per_token": m.experts_per_token,
            "dense_fraction": round(self.u(0.03, 0.15), 3) if m.experts > 1 else 1.0,
            "allgather_dtype": _GATHER[self.bytes], "draft": None,
        }
        if self.rng.random() < 0.25:
            return doc, "no draft model"
        # acceptance over the range real EAGLE heads show: low ones lose to plain decoding, high ones win
        acceptance = round(self.u(0.3, 0.9), 2)
        scale = m.hidden / 8192
        doc["draft"] = {"acceptance": acceptance, "weights_gb": round(self.u(0.3, 1.8) * scale * 8 / n + 0.2, 2),
                        "layers": 1, "forward_ms": round(self.u(0.3, 2.0), 2), "token_us": round(self.u(0.5, 6.0), 2),
                        "overhead_ms": round(self.u(0.5, 4.0), 2), "default_steps": 3, "default_topk": 1,
                        "default_draft_tokens": 4}
        return doc, f"draft acceptance {acceptance:.2f}"

    def compute(self) -> dict[str, Any]:
        active_per_gpu = self.model.active_b * 1e9 / self.count
        token_us = 2 * active_per_gpu / (self.gpu.tflops * 1e12 * self.u(0.45, 0.75)) * 1e6
        overhead = self.u(0.6, 2.0) + 0.02 * self.model.layers
        return {"forward_overhead_ms": round(overhead, 2), "eager_overhead_ms": round(overhead * self.u(3, 9), 2),
                "weight_read_ms": round(self.weights_gb * 1.0737 / self.gpu.bandwidth_tbs * self.u(1.0, 1.3), 2),
                "token_us": round(token_us, 2), "attention_us_per_ktok": round(self.u(0.05, 0.3), 3),
                "prefill_token_us": round(token_us * self.u(0.7, 1.0), 2)}

    def memory(self) -> tuple[dict[str, Any], dict[str, Any]]:
        usable = self.gpu.memory_gb - 1.2
        share = self.weights_gb / usable
        # what is left outside the weights at the highest fraction bounds the workspaces
        room = max(0.02, 0.93 - share - 0.08)
        workspace = usable * (self.u(0.01, min(0.08, room)) if self.rng.random() < 0.75
                              else self.u(min(0.08, room) * 0.9, min(0.35, room)))
        big = self.gpu.memory_gb >= 70
        default_mfs = 0.88 if self.gpu.memory_gb >= 120 else (0.85 if big else 0.8)
        memory = {"workspace_gb": round(workspace, 2), "activation_mib_per_token": round(self.u(0.05, 0.2), 3),
                  "graph_base_gb": round(self.u(0.2, 0.6), 2),
                  "graph_mib_per_bs": round(self.u(2.0, 8.0) * max(0.5, self.model.hidden / 6144), 2),
                  "capture_low_channel_gb": round(self.u(0.5, 3.5), 2) if self.rng.random() < 0.25 else 0.0,
                  "chunked_prefill_size": 16384 if self.gpu.memory_gb >= 120 else (8192 if big else 4096),
                  "default_mem_fraction_static": default_mfs,
                  "default_cuda_graph_max_bs": 512 if self.gpu.memory_gb >= 120 else (256 if big else 160)}
        launch: dict[str, Any] = {}
        draw = self.rng.random()
        if draw < 0.2:  # a launch command that fixes the fraction, as field reports' commands do
            launch["mem-fraction-static"] = round(self.u(max(0.5, share + 0.05), 0.9), 2)
        elif draw < 0.3:
            launch["disable-cuda-graph"] = True
        return memory, launch
