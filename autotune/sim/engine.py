"""The simulated engine's configuration, memory budget and forward-pass timing.

:func:`configure` turns a scenario + server flags + NCCL env into an :class:`EngineConfig`, the
single source of truth that both :func:`autotune.sim.model.predict` and the HTTP server use.

Memory (per GPU, GiB), in the order SGLang allocates it:

1. ``B`` = total - reserved (free after distributed init); weights ``W``; ``A = B - W``
   (``Load weight end ... avail mem=A``).
2. KV pool: ``rest = A - B * (1 - mfs)`` (SGLang's profile_max_num_token); ``rest <= 0`` is
   ``Not enough memory``. Tokens = rest / KV bytes per token. The headroom ``B * (1 - mfs)``
   must hold everything below.
3. Request tables ((max_running_requests + 1) x context_len x 4 bytes), workspaces and the
   activations of one prefill chunk (cached by the allocator at start), the draft model if any.
4. NCCL buffers, allocated lazily at the first collective (``Failed to CUDA calloc`` when short).
5. CUDA graphs (pool grows with --cuda-graph-max-bs; none with --disable-cuda-graph), plus
   ``memory.capture_low_channel_gb`` when fewer channels than the host default are configured.
6. Under load: activations of a forward larger than what was cached (eager decode of a large
   batch, fp32 logits) must fit in what is left, else ``torch.OutOfMemoryError`` kills the server.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from typing import Mapping

from autotune.sim.args import ServerArgs, merge_defaults
from autotune.sim.nccl import MIB, Nccl, NcclConfig, NcclError, parse_nccl_env
from autotune.sim.scenario import Scenario

__all__ = ["EngineConfig", "InvalidArgument", "MemoryPlan", "configure", "noise_factor"]

GIB = 1024.0**3
_GRAPH_BS_STEP = 8


class InvalidArgument(ValueError):
    """A flag value SGLang rejects at start-up (printed as ``ValueError: ...``)."""


@dataclass
class MemoryPlan:
    """Per-GPU memory budget (GiB) and where start-up fails, if it does.

    ``stage`` is ``None`` (fits), ``"kv"`` (not enough memory), ``"init"`` (OOM before the first
    collective), ``"nccl"`` (NCCL buffers do not fit) or ``"graph"`` (OOM at graph capture).
    """

    total: float
    reserved: float
    free_before_weights: float
    weights: float
    free_after_weights: float
    kv_pool: float
    kv_tokens: int
    headroom: float
    request_tables: float
    workspace: float
    prefill_activations: float
    draft: float
    nccl: float
    cuda_graph: float
    stage: str | None = None
    short_by: float = 0.0
    free_at_ready: float = 0.0

    def breakdown(self) -> dict[str, float]:
        """The memory dict of a prediction (GiB, rounded to 3 decimals)."""
        keys = ("total", "reserved", "weights", "kv_pool", "request_tables", "workspace",
                "prefill_activations", "draft", "nccl", "cuda_graph", "headroom", "free_at_ready")
        return {k: round(float(getattr(self, k)), 3) for k in keys}


@dataclass
class EngineConfig:
    """Everything the simulated engine decided at start-up."""

    scenario: Scenario
    args: ServerArgs
    env: dict[str, str]
    nccl_config: NcclConfig
    nccl: Nccl
    tp: int
    mem_fraction_static: float
    chunked_prefill_size: int
    cuda_graph: bool
    cuda_graph_max_bs: int
    context_len: int
    kv_bytes_per_token: float
    speculative: bool
    spec_steps: int
    spec_topk: int
    spec_draft_tokens: int
    spec_accept_len: float
    max_running_requests: int = 0
    memory: MemoryPlan = field(init=False)
    nccl_problem: str | None = None
    weight_scale: float = 1.0

    @property
    def served_model_name(self) -> str:
        return self.args.served_model_name or self.args.model_path or self.scenario.model.name

    # -- timing ---------------------------------------------------------------------------
    def _touched(self, tokens: float) -> float:
        m = self.scenario.model
        if not m.moe or m.experts <= 1:
            return 1.0
        miss = (1.0 - m.experts_per_token / m.experts) ** max(tokens, 1.0)
        return m.dense_fraction + (1.0 - m.dense_fraction) * (1.0 - miss)

    def _comm_ms(self, tokens: float, logits_tokens: float, layers: int) -> float:
        m = self.scenario.model
        if self.tp <= 1:
            return 0.0
        ar = self.nccl.time_us("allreduce", tokens * m.hidden_size * 2)
        ag = self.nccl.time_us("allgather", max(logits_tokens, 1.0) * m.vocab_size * 2) if logits_tokens else 0.0
        return ((2 * layers + 1) * ar + ag) / 1000.0

    def forward_ms(self, tokens: float, context_tokens: float, logits_tokens: float, *,
                   graph: bool, prefill_tokens: float = 0.0) -> float:
        """Time of one target-model forward over ``tokens`` tokens (ms).

        ``context_tokens``: the sum over those tokens of the context each attends to;
        ``logits_tokens``: tokens whose logits are computed and gathered; ``graph``: replayed
        from a CUDA graph (no eager launch overhead).
        """
        c = self.scenario.compute
        m = self.scenario.model
        t = c.forward_overhead_ms + (0.0 if graph else c.eager_overhead_ms)
        per_token = c.prefill_token_us if prefill_tokens else c.token_us
        t += self.weight_scale * (c.weight_read_ms * self._touched(tokens) + tokens * per_token / 1000.0)
        t += context_tokens * c.attention_us_per_ktok / 1e6
        return t + self._comm_ms(tokens, logits_tokens, m.layers)

    def decode_ms(self, batch: int, context_tokens: float) -> float:
        """One decode iteration for ``batch`` running requests (ms), speculative or not."""
        graph = self.cuda_graph and batch <= self.cuda_graph_max_bs
        if not self.speculative:
            return self.forward_ms(batch, context_tokens, batch, graph=graph)
        d = self.scenario.model.draft
        assert d is not None
        c = self.scenario.compute
        # launch overhead scales with the kernels launched, i.e. with the draft's share of layers
        overhead = c.forward_overhead_ms + (0.0 if graph else c.eager_overhead_ms * d.layers / self.scenario.model.layers)
        width = batch * self.spec_topk
        draft_fwd = overhead + d.forward_ms + width * d.token_us / 1000.0 + self._comm_ms(width, width, d.layers)
        verify_tokens = batch * self.spec_draft_tokens
        verify = self.forward_ms(verify_tokens, context_tokens * self.spec_draft_tokens, verify_tokens, graph=graph)
        extend_tokens = batch * (1.0 + self.spec_accept_len)
        extend = overhead + d.forward_ms + extend_tokens * d.token_us / 1000.0 + self._comm_ms(extend_tokens, batch, d.layers)
        return self.spec_steps * draft_fwd + verify + extend + d.overhead_ms

    def tokens_per_decode(self) -> float:
        """Expected tokens each request gains per decode iteration."""
        return self.spec_accept_len if self.speculative else 1.0

    # -- memory under load ----------------------------------------------------------------
    def activation_gb(self, tokens: float, logits_tokens: float) -> float:
        """Activations of one eager forward (GiB): per-token activations + fp32 logits."""
        mm = self.scenario.memory
        return (tokens * mm.activation_mib_per_token * MIB + logits_tokens * self.scenario.model.vocab_size * 4) / GIB

    def load_shortfall_gb(self, kind: str, batch: int, tokens: int) -> float:
        """How much a forward would allocate beyond what is free at ready (GiB; <= 0 fits)."""
        if kind == "decode":
            graph = self.cuda_graph and batch <= self.cuda_graph_max_bs
            if graph:
                return -1.0
            width = batch * (self.spec_draft_tokens if self.speculative else 1)
            need = self.activation_gb(width, width)
        else:
            need = self.activation_gb(tokens, batch)
        extra = need - self.memory.prefill_activations
        return extra - self.memory.free_at_ready


def _graph_sizes(max_bs: int) -> int:
    """How many batch sizes SGLang captures up to ``max_bs`` (1, 2, 4, then steps of 8)."""
    small = sum(1 for b in (1, 2, 4) if b <= max_bs)
    return small + max(0, max_bs // _GRAPH_BS_STEP)


def capture_seconds(cfg: EngineConfig) -> float:
    """Real seconds of CUDA-graph capture (scenario time is for the default max bs)."""
    if not cfg.cuda_graph:
        return 0.0
    s = cfg.scenario
    ref = _graph_sizes(s.memory.default_cuda_graph_max_bs)
    t = s.startup.graph_capture_s * _graph_sizes(cfg.cuda_graph_max_bs) / max(ref, 1)
    return t * (2.0 if cfg.speculative else 1.0)


def _check_args(s: Scenario, a: ServerArgs) -> None:
    def bad(text: str) -> InvalidArgument:
        return InvalidArgument(text)

    if a.mem_fraction_static is not None and not 0.0 < a.mem_fraction_static < 1.0:
        raise bad(f"mem_fraction_static={a.mem_fraction_static} must be in (0, 1)")
    if a.tp_size is not None and a.tp_size < 1:
        raise bad(f"tp_size={a.tp_size} must be >= 1")
    if a.tp_size is not None and a.tp_size > s.gpu.count:
        raise bad(f"tp_size={a.tp_size} needs {a.tp_size} GPUs but this host has {s.gpu.count}")
    for name in ("max_running_requests", "cuda_graph_max_bs", "chunked_prefill_size", "max_total_tokens",
                 "num_continuous_decode_steps", "stream_interval", "context_length"):
        value = getattr(a, name)
        if value is not None and value < 1 and not (name == "chunked_prefill_size" and value == -1):
            raise bad(f"{name}={value} must be a positive integer")
    if a.speculative_algorithm is not None and s.model.draft is None:
        raise bad(f"--speculative-algorithm {a.speculative_algorithm} needs a draft model, "
                  f"but scenario {s.name} has none (model.draft is null)")
    if a.speculative_algorithm is None and (a.speculative_num_steps or a.speculative_num_draft_tokens):
        raise bad("speculative decoding flags given without --speculative-algorithm")
    if a.speculative_eagle_topk is not None and a.speculative_eagle_topk < 1:
        raise bad(f"speculative_eagle_topk={a.speculative_eagle_topk} must be >= 1")
    if a.speculative_num_steps is not None and a.speculative_num_steps < 1:
        raise bad(f"speculative_num_steps={a.speculative_num_steps} must be >= 1")
    if a.speculative_num_draft_tokens is not None and a.speculative_num_draft_tokens < 2:
        raise bad(f"speculative_num_draft_tokens={a.speculative_num_draft_tokens} must be >= 2")


def configure(scenario: Scenario, args: ServerArgs, env: Mapping[str, str]) -> EngineConfig:
    """Resolve flags and env on a scenario's host, and plan memory.

    Raises:
        InvalidArgument: a flag SGLang would reject.
    """
    s = scenario
    args = merge_defaults(args, s.launch_defaults)
    _check_args(s, args)
    nccl_cfg = parse_nccl_env(env)
    tp = args.tp_size or s.gpu.count
    nccl = Nccl(s, nccl_cfg, tp)
    mfs = args.mem_fraction_static
    speculative = args.speculative_algorithm is not None
    if mfs is None:
        mfs = s.memory.default_mem_fraction_static - (0.03 if speculative else 0.0)
    context_len = min(args.context_length or s.model.context_len, s.model.context_len)
    chunk = args.chunked_prefill_size or s.memory.chunked_prefill_size
    if chunk == -1:
        chunk = 1 << 30
    kv_bytes = s.model.kv_bytes_per_token * s.gpu.count / tp
    if args.kv_cache_dtype.startswith("fp8"):
        kv_bytes /= 2
    elif args.kv_cache_dtype.startswith("fp4"):
        kv_bytes /= 4
    steps = topk = draft_tokens = 0
    accept_len = 1.0
    if speculative:
        d = s.model.draft
        assert d is not None
        steps = args.speculative_num_steps or d.default_steps
        topk = args.speculative_eagle_topk or d.default_topk
        draft_tokens = args.speculative_num_draft_tokens or (steps + 1 if topk == 1 else d.default_draft_tokens)
        if topk == 1:
            draft_tokens = steps + 1  # SGLang forces num_draft_tokens = num_steps + 1 for topk 1
        a = 1.0 - (1.0 - d.acceptance) ** topk
        depth = min(steps, draft_tokens - 1)
        accept_len = (1.0 - a ** (depth + 1)) / (1.0 - a)
    cuda_graph = not bool(args.disable_cuda_graph)
    cfg = EngineConfig(
        scenario=s, args=args, env=dict(env), nccl_config=nccl_cfg, nccl=nccl, tp=tp, mem_fraction_static=mfs,
        chunked_prefill_size=chunk, cuda_graph=cuda_graph,
        cuda_graph_max_bs=args.cuda_graph_max_bs or s.memory.default_cuda_graph_max_bs,
        context_len=context_len, kv_bytes_per_token=kv_bytes, speculative=speculative, spec_steps=steps,
        spec_topk=topk, spec_draft_tokens=draft_tokens, spec_accept_len=accept_len,
        weight_scale=s.gpu.count / tp,
    )
    try:
        nccl.check(allgather_dtype=s.model.allgather_dtype)
    except NcclError as exc:
        cfg.nccl_problem = str(exc)
    cfg.memory = _plan_memory(cfg)
    return cfg


def _plan_memory(cfg: EngineConfig) -> MemoryPlan:
    s = cfg.scenario
    mm = s.memory
    total = s.gpu.memory_gb
    b = total - s.gpu.reserved_gb
    w = s.model.weights_gb * cfg.weight_scale
    a = b - w
    rest = a - b * (1.0 - cfg.mem_fraction_static)
    plan = MemoryPlan(total=total, reserved=s.gpu.reserved_gb, free_before_weights=b, weights=w,
                      free_after_weights=a, kv_pool=max(rest, 0.0), kv_tokens=0, headroom=b * (1 - cfg.mem_fraction_static),
                      request_tables=0.0, workspace=0.0, prefill_activations=0.0, draft=0.0, nccl=0.0,
                      cuda_graph=0.0)
    if rest <= 0 or a <= 0:
        plan.stage = "kv"
        plan.short_by = -rest
        plan.kv_pool = 0.0
        return plan
    tokens = int(rest * GIB / cfg.kv_bytes_per_token)
    if cfg.args.max_total_tokens:
        tokens = min(tokens, cfg.args.max_total_tokens)
        plan.kv_pool = tokens * cfg.kv_bytes_per_token / GIB
    plan.kv_tokens = tokens
    # SGLang: the request pool is max_running_requests if given, else scaled from the KV pool.
    pool = min(max(int(tokens / cfg.context_len * 512), 2048), 4096)
    if cfg.args.max_running_requests:
        mrr = cfg.args.max_running_requests
        pool = mrr
    else:
        mrr = 48 if cfg.speculative else min(pool, max(tokens // 2, 1))
    cfg.max_running_requests = max(1, min(mrr, tokens))
    plan.request_tables = (pool + 1) * (cfg.context_len + 4) * 4 / GIB
    plan.workspace = mm.workspace_gb
    plan.prefill_activations = cfg.activation_gb(min(cfg.chunked_prefill_size, 1 << 20), 1)
    if cfg.speculative and s.model.draft is not None:
        d = s.model.draft
        draft_kv_bytes = cfg.kv_bytes_per_token * d.layers / s.model.layers
        plan.draft = d.weights_gb * cfg.weight_scale + tokens * draft_kv_bytes / GIB
    free = plan.headroom - plan.request_tables - plan.workspace - plan.prefill_activations - plan.draft
    if free < 0:
        plan.stage, plan.short_by = "init", -free
        return plan
    sizes = (float(s.model.hidden_size * 2), float(cfg.chunked_prefill_size * s.model.hidden_size * 2))
    plan.nccl = cfg.nccl.buffer_mib(s.interconnect.communicators, sizes=sizes) / 1024.0
    if plan.nccl > free:
        plan.stage, plan.short_by = "nccl", plan.nccl - free
        return plan
    free -= plan.nccl
    if cfg.cuda_graph:
        width = cfg.cuda_graph_max_bs * (cfg.spec_draft_tokens if cfg.speculative else 1)
        graph = mm.graph_base_gb + mm.graph_mib_per_bs * width / 1024.0
        graph += cfg.activation_gb(width, width) if cfg.speculative else 0.0
        default = s.interconnect.default_channels
        if cfg.nccl.channels < default:
            graph += mm.capture_low_channel_gb * (default - cfg.nccl.channels) / default
        plan.cuda_graph = graph
        if graph > free:
            plan.stage, plan.short_by = "graph", graph - free
            return plan
        free -= graph
    plan.free_at_ready = free
    return plan


def noise_factor(cfg: EngineConfig, seed: int | None) -> float:
    """The run's throughput multiplier: 1 + sd x N(0, 1), clipped to [0.5, 1.5].

    With ``seed`` set it is a pure function of (seed, flags, env), so a repeated configuration
    measures the same; ``None`` draws fresh randomness (a new run).
    """
    sd = cfg.scenario.noise.throughput_sd
    if sd <= 0:
        return 1.0
    if seed is None:
        rng = random.Random()
    else:
        key = repr((seed, sorted((k, repr(v)) for k, v in vars(cfg.args).items() if k not in ("host", "port")),
                    sorted((k, v) for k, v in cfg.env.items() if k.startswith("NCCL_"))))
        rng = random.Random(int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big"))
    return min(1.5, max(0.5, 1.0 + sd * rng.gauss(0.0, 1.0)))


def startup_seconds(cfg: EngineConfig) -> dict[str, float]:
    """Real seconds from launch to each start-up milestone (cumulative)."""
    st = cfg.scenario.startup
    weights = st.weights_load_s * cfg.weight_scale
    t_init = st.init_s
    t_weights = t_init + weights
    t_kv = t_weights + st.kv_alloc_s
    t_capture = t_kv + capture_seconds(cfg)
    t_ready = t_capture + st.warmup_s
    return {"init": t_init, "weights": t_weights, "kv": t_kv, "capture": t_capture, "ready": t_ready}

