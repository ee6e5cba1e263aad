"""``predict``: what a launch configuration does on a scenario's host under a workload.

It is the same engine the HTTP server runs (:mod:`autotune.sim.engine` for memory and timing,
:mod:`autotune.sim.scheduler` for continuous batching), driven by an ideal closed-loop client
(``concurrency`` requests in flight, a finished one replaced at once), so the numbers are what
``sglang.bench_serving`` would measure against ``python -m autotune.sim serve``.

The client can watch the run on the model's own clock as a load generator watches a real one
(:data:`ProgressHook`, called after every forward) and stop it there; the prediction is then of
the run so far (``Prediction.stopped_s``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping

from autotune.outcome.load_signals import LoadSignals
from autotune.sim.args import ServerArgs
from autotune.sim.engine import EngineConfig, InvalidArgument, configure, noise_factor, startup_seconds
from autotune.sim.scenario import Scenario
from autotune.sim.scheduler import Scheduler, SimRequest
from autotune.sim.texts import summary

__all__ = ["Outcome", "Prediction", "ProgressHook", "Workload", "predict", "OUTCOMES"]

OUTCOMES = ("ok", "not-enough-memory", "oom", "nccl-error", "crash-under-load", "invalid-argument")
Outcome = str
ProgressHook = Callable[[float, int, int, int], bool]
"""``hook(elapsed_s, output_tokens, input_tokens, completed) -> stop``: the load's progress after a
forward, on the model's clock from the first request (tokens delivered so far, in flight
included; the prompts of requests whose first token came; requests completed). True stops the
run there."""


@dataclass(frozen=True)
class Workload:
    """A closed-loop benchmark: ``num_prompts`` requests, ``concurrency`` in flight, fixed lengths."""

    concurrency: int = 256
    num_prompts: int = 1024
    input_len: int = 256
    output_len: int = 128

    def __post_init__(self) -> None:
        for name in ("concurrency", "num_prompts", "input_len", "output_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"workload {name} must be a positive integer, got {value!r}")


@dataclass
class Prediction:
    """What the configuration does.

    Throughputs are tokens (or requests) per second over the run, as sglang.bench_serving defines
    them (0 unless ``outcome == "ok"``). ``startup_s`` is the real (uncompressed) time to ready;
    ``failure_s`` the real time from launch to the failure (``None`` when ok). ``memory`` is the
    per-GPU budget in GiB. ``message`` is the failure's one-line text (empty when ok).
    ``stopped_s``: the load's time when a :data:`ProgressHook` stopped it (throughputs and counts
    are then of the run so far), else None.
    """

    outcome: Outcome
    output_throughput: float = 0.0
    total_throughput: float = 0.0
    request_throughput: float = 0.0
    memory: dict[str, float] = field(default_factory=dict)
    startup_s: float = 0.0
    failure_s: float | None = None
    message: str = ""
    details: dict[str, Any] = field(default_factory=dict)
    stopped_s: float | None = None
    signals: LoadSignals = field(default_factory=LoadSignals)
    """What the server's scheduler lines would show of the load, as the runner reads them
    (:mod:`autotune.outcome.load_signals`): each prefill batch's moment (SGLang logs every prefill batch;
    the decode lines between show no busier one)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _fail(outcome: str, message: str, failure_s: float, cfg: EngineConfig | None) -> Prediction:
    return Prediction(outcome=outcome, message=message, failure_s=round(failure_s, 3),
                      memory=cfg.memory.breakdown() if cfg is not None else {},
                      details=_details(cfg) if cfg is not None else {})


def _details(cfg: EngineConfig) -> dict[str, Any]:
    return {
        "max_total_num_tokens": cfg.memory.kv_tokens,
        "max_running_requests": cfg.max_running_requests,
        "nccl_channels": cfg.nccl.channels,
        "nccl_transport": "P2P" if cfg.nccl.p2p else "SHM",
        "cuda_graph": cfg.cuda_graph,
        "cuda_graph_max_bs": cfg.cuda_graph_max_bs if cfg.cuda_graph else 0,
        "mem_fraction_static": cfg.mem_fraction_static,
        "chunked_prefill_size": cfg.chunked_prefill_size,
        "speculative_accept_length": round(cfg.spec_accept_len, 4) if cfg.speculative else None,
    }


def startup_outcome(cfg: EngineConfig) -> tuple[str, str, float] | None:
    """(outcome, message, real seconds from launch) of a start-up failure, or ``None``."""
    times = startup_seconds(cfg)
    stage = cfg.memory.stage
    if stage == "kv":
        return "not-enough-memory", summary("not-enough-memory", cfg), times["weights"] + 0.5
    if stage == "init":
        return "oom", summary("init", cfg), times["kv"]
    if cfg.nccl_problem is not None:
        return "nccl-error", summary("nccl-usage", cfg, cfg.nccl_problem), times["kv"] + 1.0
    if stage == "nccl":
        return "nccl-error", summary("nccl", cfg), times["kv"] + 1.0
    if stage == "graph":
        return "oom", summary("graph", cfg), times["kv"] + 0.15 * (times["capture"] - times["kv"]) + 1.0
    return None


def predict(scenario: Scenario, args: ServerArgs, env: Mapping[str, str], workload: Workload = Workload(),
            *, seed: int | None = None, on_progress: ProgressHook | None = None) -> Prediction:
    """Predict the outcome and throughput of one launch configuration under ``workload``.

    ``seed=None`` gives the noise-free expectation; an integer gives the run the server started
    with ``AUTOTUNE_SIM_SEED=seed`` would measure. ``on_progress`` watches the load (and may stop
    it: :data:`ProgressHook`).
    """
    try:
        cfg = configure(scenario, args, env)
    except InvalidArgument as exc:
        return _fail("invalid-argument", f"ValueError: {exc}", 2.0, None)
    failed = startup_outcome(cfg)
    if failed is not None:
        return _fail(failed[0], failed[1], failed[2], cfg)
    startup = startup_seconds(cfg)["ready"]
    speed = noise_factor(cfg, seed) if seed is not None else 1.0
    return run_closed_loop(cfg, workload, speed, startup, on_progress=on_progress)


def run_closed_loop(cfg: EngineConfig, workload: Workload, speed: float, startup: float,
                    *, on_progress: ProgressHook | None = None) -> Prediction:
    """Drive the scheduler with an ideal closed-loop client and measure like bench_serving;
    ``on_progress`` is called after every forward and stops the run when it returns True."""
    sched = Scheduler(cfg, speed)
    w = workload
    now = 0.0
    sent = 0
    done = 0
    started = 0  # requests whose first token came
    stopped: float | None = None
    ttft: list[float] = []
    signals = LoadSignals()
    for _ in range(min(w.concurrency, w.num_prompts)):
        sched.add(SimRequest(sent, w.input_len, w.output_len, now))
        sent += 1
    if sched.rejected:
        return Prediction(outcome="ok", memory=cfg.memory.breakdown(), startup_s=round(startup, 3),
                          message=f"requests of {w.input_len + w.output_len} tokens exceed the KV pool "
                                  f"({cfg.memory.kv_tokens} tokens) or context length: all rejected",
                          details=_details(cfg))
    while True:
        fwd = sched.plan()
        if fwd is None:
            break
        if fwd.oom_gb > 0:
            msg = summary("load", cfg, f"{fwd.kind} of {fwd.tokens} tokens needs {fwd.oom_gb:.2f} GiB more")
            return _fail("crash-under-load", msg, startup + now, cfg)
        now += fwd.duration
        running_before = len(sched.running)
        gained, finished = sched.apply(fwd, now)
        if fwd.kind == "prefill":
            started += len(gained)  # a prefill's gainers are the requests it gave a first token
            signals.seen(running_before + fwd.batch, len(sched.waiting))
        for r in finished:
            done += 1
            if r.first_token_at is not None:
                ttft.append(r.first_token_at - r.arrival)
            if sent < w.num_prompts:
                sched.add(SimRequest(sent, w.input_len, w.output_len, now))
                sent += 1
        if on_progress is not None and on_progress(now, sched.generated_total, started * w.input_len, done):
            stopped = now
            break
    duration = max(now, 1e-9)
    out_tokens = done * w.output_len
    details = _details(cfg)
    details.update({"duration_s": round(duration, 3), "completed": done,
                    "mean_ttft_ms": round(1000 * sum(ttft) / len(ttft), 2) if ttft else None,
                    "noise_factor": round(speed, 4)})
    return Prediction(
        outcome="ok",
        output_throughput=round(out_tokens / duration, 2),
        total_throughput=round(done * (w.input_len + w.output_len) / duration, 2),
        request_throughput=round(done / duration, 4),
        memory=cfg.memory.breakdown(),
        startup_s=round(startup, 3),
        details=details,
        stopped_s=None if stopped is None else round(stopped, 3),
        signals=signals,
    )
