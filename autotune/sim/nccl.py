"""NCCL as the simulator sees it: environment parsing, channel count, cost model and buffer memory.

Constants and rules follow ``reference/engine-facts.md`` (NCCL 2.30 src/graph/tuning.cc,
enqueue.cc, transport/p2p.cc):

- channels: the host's default (topology search) raised to ``NCCL_MIN_NCHANNELS`` and capped by
  ``NCCL_MAX_NCHANNELS`` (a ceiling only; if min > max both become max);
- per call, the channels used shrink with message size (``nBytes < nc * nthreads * threshold``);
- time = launch + base latency + hops x per-hop latency + bytes / bus bandwidth, with bus
  bandwidth = min(ceiling, channels used x per-channel bandwidth) x protocol efficiency;
- the tuner picks the fastest allowed (algorithm, protocol); ``NCCL_ALGO``/``NCCL_PROTO`` restrict
  the choice, and a collective left with no algorithm is ``invalid usage``;
- buffers per rank: channels x (LL 0.5 MiB + LL128 4.7 MiB + BUFFSIZE) x peers x communicators,
  Tree doubling it, allocated lazily at the first collective.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping

from autotune.engines.nccl_env import (DEFAULT_BUFFSIZE, LL128_BUFFER_MIB, LL_BUFFER_MIB, MIB, PROTOCOLS,
                               connection_buffer_mib, parse_set)
from autotune.sim.scenario import Scenario

__all__ = ["NcclConfig", "NcclError", "Nccl", "parse_nccl_env"]

LAUNCH_US = 3.0
BASE_US = {"ring": {"LL": 6.6, "LL128": 14.0, "Simple": 8.4}, "tree": {"LL": 6.8, "LL128": 14.0, "Simple": 8.4}}
PROTO_EFFICIENCY = {"LL": 0.5, "LL128": 0.92, "Simple": 1.0}
THREAD_THRESHOLD = {"LL": 8, "LL128": 8, "Simple": 64}  # bytes per thread, x nranks for ring
NVLS_LATENCY_US = 25.0
NVLS_MEMORY_MIB = 256.0
DEFAULT_NTHREADS = 512
_ALGOS = {"ring": "Ring", "tree": "Tree", "collnetdirect": "CollnetDirect", "collnetchain": "CollnetChain",
          "nvls": "NVLS", "nvlstree": "NVLSTree", "pat": "PAT"}
_LEVELS = {"LOC": 0, "NVL": 1, "PIX": 2, "PXB": 3, "PHB": 4, "SYS": 5}
ALLREDUCE_ALGOS = frozenset({"Ring", "Tree", "CollnetDirect", "CollnetChain", "NVLS", "NVLSTree"})
ALLGATHER_ALGOS = frozenset({"Ring", "PAT", "NVLS", "CollnetDirect"})
_NCCL_DTYPE = {"int8": "ncclInt8", "fp8": "ncclFloat8e4m3", "bfloat16": "ncclBfloat16",
               "float16": "ncclFloat16", "float32": "ncclFloat32"}


class NcclError(Exception):
    """A NCCL configuration the library rejects (``invalid usage``)."""


@dataclass(frozen=True)
class NcclConfig:
    """The NCCL_* variables that matter, parsed the way NCCL parses them.

    ``algos``/``protos`` are ``None`` when unset (NCCL's tuner decides). ``warnings`` holds the
    ``NCCL WARN`` lines NCCL prints for values it ignores. ``invalid`` is set when NCCL would
    refuse the value outright (an unknown algorithm or protocol name).
    """

    min_channels: int | None = None
    max_channels: int | None = None
    buffsize: int = DEFAULT_BUFFSIZE
    algos: frozenset[str] | None = None
    algo_text: str | None = None
    protos: frozenset[str] | None = None
    nthreads: int = DEFAULT_NTHREADS
    p2p_disable: bool = False
    p2p_level: int | None = None
    nvls_enable: bool = False
    warnings: tuple[str, ...] = ()
    invalid: str | None = None


def _int_env(env: Mapping[str, str], name: str, warnings: list[str]) -> int | None:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        return int(raw.strip(), 0)
    except ValueError:
        warnings.append(f"NCCL WARN Invalid value {raw} for {name}, using default")
        return None


def parse_nccl_env(env: Mapping[str, str]) -> NcclConfig:
    """Read the NCCL_* variables of ``env``; unknown variables are ignored, bad numbers warned."""
    warnings: list[str] = []
    min_ch = _int_env(env, "NCCL_MIN_NCHANNELS", warnings)
    if min_ch is None:
        min_ch = _int_env(env, "NCCL_MIN_CTAS", warnings)
    max_ch = _int_env(env, "NCCL_MAX_NCHANNELS", warnings)
    if max_ch is None:
        max_ch = _int_env(env, "NCCL_MAX_CTAS", warnings)
    if min_ch is not None:
        min_ch = max(0, min(64, min_ch))
    if max_ch is not None:
        max_ch = max(1, min(64, max_ch))
    buffsize = _int_env(env, "NCCL_BUFFSIZE", warnings)
    if buffsize is not None and buffsize <= 0:
        warnings.append(f"NCCL WARN Invalid value {buffsize} for NCCL_BUFFSIZE, using default")
        buffsize = None
    nthreads = _int_env(env, "NCCL_NTHREADS", warnings)
    if nthreads is not None and (nthreads % 32 or not 64 <= nthreads <= 512):
        warnings.append(f"NCCL WARN Invalid NCCL_NTHREADS {nthreads} (must be a multiple of 32 in 64..512), using default")
        nthreads = None
    invalid = None
    algos = protos = None
    algo_text = env.get("NCCL_ALGO")
    if algo_text and algo_text.strip():
        algos, bad = parse_set(algo_text, _ALGOS, frozenset(_ALGOS.values()))
        if bad is not None:
            invalid = f"Invalid NCCL_ALGO: unknown algorithm '{bad}'"
    proto_text = env.get("NCCL_PROTO")
    if proto_text and proto_text.strip():
        protos, bad = parse_set(proto_text, PROTOCOLS, frozenset(PROTOCOLS.values()))
        if bad is not None and invalid is None:
            invalid = f"Invalid NCCL_PROTO: unknown protocol '{bad}'"
        if not protos and invalid is None:
            invalid = "NCCL_PROTO leaves no protocol enabled"
    level = None
    raw_level = env.get("NCCL_P2P_LEVEL")
    if raw_level and raw_level.strip():
        text = raw_level.strip().upper()
        if text in _LEVELS:
            level = _LEVELS[text]
        elif text.isdigit():
            level = min(5, int(text))
        else:
            warnings.append(f"NCCL WARN Invalid value {raw_level} for NCCL_P2P_LEVEL, using default")
    p2p_disable = (env.get("NCCL_P2P_DISABLE") or "0").strip() not in ("", "0")
    nvls = (env.get("NCCL_NVLS_ENABLE") or "0").strip() not in ("", "0")  # SGLang sets 0 unless given
    return NcclConfig(
        min_channels=min_ch,
        max_channels=max_ch,
        buffsize=buffsize if buffsize is not None else DEFAULT_BUFFSIZE,
        algos=algos,
        algo_text=algo_text.strip() if algo_text else None,
        protos=protos,
        nthreads=nthreads if nthreads is not None else DEFAULT_NTHREADS,
        p2p_disable=p2p_disable,
        p2p_level=level,
        nvls_enable=nvls,
        warnings=tuple(warnings),
        invalid=invalid,
    )


@dataclass
class Nccl:
    """The NCCL communicator of one TP group on a scenario's host, with a given env.

    All times are microseconds, sizes bytes, memory MiB.
    """

    scenario: Scenario
    config: NcclConfig
    nranks: int
    channels: int = field(init=False)
    p2p: bool = field(init=False)

    def __post_init__(self) -> None:
        ic = self.scenario.interconnect
        ch = ic.default_channels
        if self.config.min_channels:
            ch = max(ch, self.config.min_channels)
        if self.config.max_channels is not None:
            ch = min(ch, self.config.max_channels)
        self.channels = max(1, min(64, ch))
        level = self.config.p2p_level if self.config.p2p_level is not None else _LEVELS["PXB"]
        path = _LEVELS[ic.path]
        self.p2p = ic.p2p and not self.config.p2p_disable and (path <= level or ic.path == "NVL")
        self._cache: dict[tuple[str, int], float] = {}

    # -- what is allowed ------------------------------------------------------------------
    def _protos(self) -> list[str]:
        if self.config.protos is not None:
            return sorted(self.config.protos)
        protos = ["LL", "Simple"]
        if self.scenario.interconnect.kind == "nvlink":  # LL128 is on by default only over NVLink
            protos.append("LL128")
        return protos

    def _algos(self, universe: frozenset[str]) -> set[str]:
        allowed = universe if self.config.algos is None else universe & self.config.algos
        usable = {"Ring", "Tree"}
        if self.config.nvls_enable and self.scenario.interconnect.nvls:
            usable.add("NVLS")
        if self.config.algos is not None and "PAT" in self.config.algos:
            usable.add("PAT")
        return set(allowed) & usable

    def check(self, *, allgather_dtype: str) -> None:
        """Raise :class:`NcclError` with NCCL's text if a collective the engine runs is unusable."""
        if self.config.invalid is not None:
            raise NcclError(self.config.invalid)
        if not self._algos(ALLREDUCE_ALGOS) - {"PAT"}:
            raise NcclError(self._no_algo("AllReduce", "bfloat16"))
        if not self._algos(ALLGATHER_ALGOS) - {"Tree"}:
            raise NcclError(self._no_algo("AllGather", allgather_dtype))

    def _no_algo(self, func: str, dtype: str) -> str:
        text = f"No algorithm/protocol available for function {func} with datatype {_NCCL_DTYPE[dtype]}."
        if self.config.algo_text:
            text += f" NCCL_ALGO was set to {self.config.algo_text}."
        return text

    # -- cost model -----------------------------------------------------------------------
    def _hop_us(self, algo: str, proto: str) -> float:
        ic = self.scenario.interconnect
        table = ic.latency_us.tree if algo == "tree" else ic.latency_us.ring
        hop = getattr(table, proto)
        if not self.p2p:
            hop += ic.host_latency_us + ic.proxy_us_per_channel * self.channels
        return hop

    def _busbw_gbs(self, used: int, proto: str) -> float:
        ic = self.scenario.interconnect
        ceiling = ic.bandwidth_gbs if self.p2p else min(ic.bandwidth_gbs, ic.host_bandwidth_gbs)
        per_channel = ic.channel_bandwidth_gbs * min(1.0, self.config.nthreads / 256)
        return min(ceiling, used * per_channel) * PROTO_EFFICIENCY[proto]

    def _used_channels(self, nbytes: float, proto: str) -> int:
        nt = 640 if proto == "LL128" else self.config.nthreads
        per_channel = nt * THREAD_THRESHOLD[proto] * self.nranks
        return max(1, min(self.channels, int(nbytes // per_channel) or 1))

    def _time_us(self, kind: str, algo: str, proto: str, nbytes: float) -> float:
        n = self.nranks
        if algo == "NVLS":
            bw = self.scenario.interconnect.bandwidth_gbs * 1.5
            return LAUNCH_US + NVLS_LATENCY_US + nbytes / (bw * 1e3)
        used = self._used_channels(nbytes, proto)
        bw = self._busbw_gbs(used, proto)  # GB/s = 1e3 bytes/us
        if kind == "allreduce":
            key = "tree" if algo == "Tree" else "ring"
            hops = 2 * (n - 1)
            traffic = nbytes * 2 * (n - 1) / n
            if algo == "Tree":
                bw *= 0.9  # intra-node tree is a chain: a little below the ring's bus bandwidth
        else:  # allgather (Ring/PAT): nbytes is the gathered output
            key = "ring"
            hops = n - 1
            traffic = nbytes * (n - 1) / n
        return LAUNCH_US + BASE_US[key][proto] + hops * self._hop_us(key, proto) + traffic / (bw * 1e3)

    def best(self, kind: str, nbytes: float) -> tuple[float, str, str]:
        """(time_us, algorithm, protocol) NCCL's tuner picks for one collective of ``nbytes``."""
        if self.nranks <= 1:
            return 0.0, "none", "none"
        universe = ALLREDUCE_ALGOS if kind == "allreduce" else ALLGATHER_ALGOS
        algos = self._algos(universe) - ({"PAT"} if kind == "allreduce" else {"Tree"})
        best: tuple[float, str, str] | None = None
        for algo in sorted(algos):
            for proto in self._protos():
                t = self._time_us(kind, algo, proto, nbytes)
                if best is None or t < best[0]:
                    best = (t, algo, proto)
        if best is None:
            return math.inf, "none", "none"
        return best

    def time_us(self, kind: str, nbytes: float) -> float:
        """Time of one ``allreduce``/``allgather`` of ``nbytes`` (microseconds), cached by size."""
        key = (kind, int(nbytes) >> 8)
        hit = self._cache.get(key)
        if hit is None:
            hit = self.best(kind, nbytes)[0]
            self._cache[key] = hit
        return hit

    # -- memory ---------------------------------------------------------------------------
    def buffer_mib(self, communicators: int, *, sizes: tuple[float, ...] = ()) -> float:
        """Receive buffers per rank: channels x (LL + LL128 + BUFFSIZE) x peers x communicators.

        Protocols turned off by ``NCCL_PROTO`` get no buffer. Tree connections (when the tuner picks
        Tree for any of ``sizes`` or NCCL_ALGO forces it) double the ring's. NVLS adds its own.
        """
        if self.nranks <= 1:
            return 0.0
        protos = self.config.protos if self.config.protos is not None else frozenset(PROTOCOLS.values())
        per_conn = connection_buffer_mib(protos, self.config.buffsize)
        algos = {self.best("allreduce", s)[1] for s in sizes}
        tree = "Tree" in algos or (self.config.algos is not None and "Ring" not in self.config.algos
                                   and "Tree" in self.config.algos)
        total = self.channels * per_conn * (self.nranks - 1) * communicators * (2 if tree else 1)
        if "NVLS" in algos:
            total += NVLS_MEMORY_MIB
        return total

    def largest_alloc_bytes(self) -> int:
        """The single allocation NCCL makes per connection (what ``Failed to CUDA calloc`` names)."""
        protos = set(self.config.protos) if self.config.protos is not None else {"LL", "LL128", "Simple"}
        size = 0.0
        if "LL" in protos:
            size += LL_BUFFER_MIB * MIB
        if "LL128" in protos:
            size += LL128_BUFFER_MIB * MIB
        if "Simple" in protos:
            size += self.config.buffsize
        return int(size) * self.channels
