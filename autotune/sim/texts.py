"""The log lines and error texts the simulated engine prints, worded as SGLang/NCCL/torch do."""

from __future__ import annotations

import os
import socket
import time

from autotune.sim.engine import EngineConfig

__all__ = ["stamp", "failure_lines", "oom_under_load_lines"]

NCCL_VERSION = "2.27.3"


def stamp() -> str:
    """SGLang's log prefix: ``[2026-01-01 12:00:00]``."""
    return time.strftime("[%Y-%m-%d %H:%M:%S]")


def _gib(x: float) -> str:
    return f"{x:.2f} GiB"


def _torch_oom(cfg: EngineConfig, alloc_gb: float, free_gb: float) -> str:
    total = cfg.scenario.gpu.memory_gb
    free_gb = max(free_gb, 0.0)
    in_use = total - free_gb
    return (f"CUDA out of memory. Tried to allocate {_gib(alloc_gb)}. GPU 0 has a total capacity of "
            f"{_gib(total)} of which {free_gb * 1024:.2f} MiB is free. Including non-PyTorch memory, this "
            f"process has {_gib(in_use)} memory in use. Of the allocated memory {_gib(in_use * 0.97)} is "
            f"allocated by PyTorch, and {_gib(in_use * 0.01)} is reserved by PyTorch but unallocated. If "
            f"reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
            f"to avoid fragmentation.")


def _traceback(where: str) -> list[str]:
    return [
        "[rank0]: Traceback (most recent call last):",
        '[rank0]:   File "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line 2840, in run_scheduler_process',
        "[rank0]:     scheduler = Scheduler(server_args, port_args, gpu_id, tp_rank, moe_ep_rank, pp_rank, dp_rank)",
        f"[rank0]:   File \"/sgl-workspace/sglang/python/sglang/srt/model_executor/model_runner.py\", line 412, in {where}",
    ]


def failure_lines(cfg: EngineConfig, stage: str, message_detail: str = "") -> list[str]:
    """The lines printed when start-up fails at ``stage`` (kv, init, nccl, nccl-usage, graph)."""
    host = socket.gethostname()
    pid = os.getpid()
    m = cfg.memory
    if stage == "kv":
        return _traceback("init_memory_pool") + [
            "[rank0]:     raise RuntimeError(",
            "[rank0]: RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.",
            f"{stamp()} Received sigquit from a child process. It usually means the child failed.",
        ]
    if stage == "init":
        alloc = max(m.short_by + 0.25, 0.5)
        return _traceback("init_memory_pool") + [
            f"[rank0]: torch.OutOfMemoryError: {_torch_oom(cfg, alloc, alloc - m.short_by)}",
            f"{stamp()} Received sigquit from a child process. It usually means the child failed.",
        ]
    if stage == "nccl-usage":
        detail = message_detail
        return [
            f"{host}:{pid}:{pid} [0] NCCL INFO {detail}",
            f"{host}:{pid}:{pid} [0] enqueue.cc:1971 NCCL WARN {detail}",
            *_traceback("forward"),
            f"[rank0]: torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/"
            f"ProcessGroupNCCL.cpp:3356, invalid usage (run with NCCL_DEBUG=WARN for details), NCCL version {NCCL_VERSION}",
            "[rank0]: ncclInvalidUsage: This usually reflects invalid usage of NCCL library.",
            "[rank0]: Last error:",
            f"[rank0]: {detail}",
            f"{stamp()} Received sigquit from a child process. It usually means the child failed.",
        ]
    if stage == "nccl":
        nbytes = cfg.nccl.largest_alloc_bytes()
        return [
            f"{host}:{pid}:{pid} [0] include/alloc.h:194 NCCL WARN Cuda failure 'out of memory'",
            f"{host}:{pid}:{pid} [0] include/alloc.h:201 NCCL WARN Failed to CUDA calloc {nbytes} bytes",
            f"{host}:{pid}:{pid} [0] NCCL INFO transport/p2p.cc:227 -> 1",
            f"{host}:{pid}:{pid} [0] NCCL INFO transport.cc:197 -> 1",
            *_traceback("forward"),
            f"[rank0]: torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/"
            f"ProcessGroupNCCL.cpp:3356, unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version {NCCL_VERSION}",
            "[rank0]: ncclUnhandledCudaError: Call to CUDA function failed.",
            "[rank0]: Last error:",
            f"[rank0]: Failed to CUDA calloc {nbytes} bytes",
            f"{stamp()} Received sigquit from a child process. It usually means the child failed.",
        ]
    if stage == "graph":
        alloc = max(m.short_by + 0.12, 0.25)
        return _traceback("init_device_graphs") + [
            "[rank0]:     raise Exception(",
            f"[rank0]: Exception: Capture cuda graph failed: {_torch_oom(cfg, alloc, alloc - m.short_by)}",
            "[rank0]: Possible solutions:",
            "[rank0]: 1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)",
            "[rank0]: 2. set --cuda-graph-max-bs-decode to a smaller value (e.g., 16)",
            "[rank0]: 3. disable torch compile by not using --enable-torch-compile",
            "[rank0]: 4. disable CUDA graph by --disable-cuda-graph. (Not recommended. Huge performance loss)",
            "[rank0]: Open an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose",
            f"{stamp()} Received sigquit from a child process. It usually means the child failed.",
        ]
    raise ValueError(f"unknown failure stage {stage!r}")


def oom_under_load_lines(cfg: EngineConfig, shortfall_gb: float) -> list[str]:
    """A scheduler killed by an allocation under load, then SGLang's dead-scheduler line."""
    alloc = shortfall_gb + cfg.memory.free_at_ready
    return [
        f"{stamp()} Scheduler hit an exception: Traceback (most recent call last):",
        '  File "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line 2851, in run_scheduler_process',
        "    scheduler.event_loop_overlap()",
        '  File "/sgl-workspace/sglang/python/sglang/srt/model_executor/model_runner.py", line 1890, in forward',
        f"torch.OutOfMemoryError: {_torch_oom(cfg, alloc, cfg.memory.free_at_ready)}",
        "",
        f"{stamp()} Rank 0 scheduler is dead. Please check if there are relevant logs.",
        f"{stamp()} Received sigquit from a child process. It usually means the child failed.",
    ]


def summary(kind: str, cfg: EngineConfig, detail: str = "") -> str:
    """The one line a prediction reports as its failure message."""
    if kind == "not-enough-memory":
        return "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static."
    if kind == "nccl-usage":
        return f"torch.distributed.DistBackendError: NCCL error: invalid usage: {detail}"
    if kind == "nccl":
        return (f"NCCL WARN Failed to CUDA calloc {cfg.nccl.largest_alloc_bytes()} bytes; "
                f"NCCL error: unhandled cuda error ({cfg.memory.nccl * 1024:.0f} MiB of NCCL buffers, "
                f"{cfg.memory.short_by * 1024:.0f} MiB short)")
    if kind == "graph":
        return (f"Exception: Capture cuda graph failed: CUDA out of memory "
                f"({cfg.memory.short_by:.2f} GiB short)")
    if kind == "init":
        return f"torch.OutOfMemoryError: CUDA out of memory ({cfg.memory.short_by:.2f} GiB short before serving)"
    if kind == "load":
        return f"torch.OutOfMemoryError: CUDA out of memory under load ({detail}); Rank 0 scheduler is dead."
    return detail

