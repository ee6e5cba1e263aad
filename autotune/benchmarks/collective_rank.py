"""One rank of the collectives benchmark: its buffers, its checked and timed calls, its result file.

:func:`autotune.benchmarks.collectives.main` starts this file under torchrun (one process per
rank; ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and the rendezvous come from torchrun's
environment), loaded by path so that a rank imports the standard library and torch only.
Arguments (internal): the measurement's (``--backend``, ``--nprocs``, ``--ops``, ``--sizes`` in
bytes, ``--dtype``, ``--warmup``, ``--iters``, ``--pg-timeout``), ``--outdir`` and ``--parent``.

A rank that measured writes ``OUTDIR/rankR.json`` (its timings, device, NCCL version and memory)
and exits 0. A rank that failed prints its traceback and a line :data:`FAILED_MARK` + its error
on stderr, writes that error to ``OUTDIR/rankR.error`` and exits 1, without interpreter teardown
(destroying a broken process group can hang). ``NCCL_DEBUG`` defaults to ``WARN``.
"""

from __future__ import annotations

import argparse
import datetime
import inspect
import json
import os
import signal
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["DTYPES", "FAILED_MARK", "OPS", "Case", "WrongResultError", "main", "op_shape", "run_rank"]

OPS: tuple[str, ...] = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
"""Collectives this benchmark can run."""

DTYPES: dict[str, tuple[str, int]] = {
    "bf16": ("bfloat16", 2),
    "fp16": ("float16", 2),
    "fp32": ("float32", 4),
    "int8": ("int8", 1),
}
"""``--dtype`` name -> (torch dtype attribute, bytes per element)."""

FAILED_MARK = "collectives: rank {rank} failed: "
"""How a failed rank's error line starts on stderr."""

_MIB = 1024 * 1024
_CHUNK = 50  # timed NCCL calls queued at once
_SPIN_CYCLES_PER_S = 2.0e9  # GPU clock for sizing the spin that holds the stream (a lower clock holds longer)


def op_shape(op: str, nbytes: int, elem_size: int, world_size: int) -> tuple[int, int]:
    """(count, bytes) of ``op`` for a requested size, like nccl-tests.

    ``count`` is the per-rank element count of the call (all_gather: elements each rank sends;
    reduce_scatter: elements each rank receives; all_reduce, broadcast: the buffer's elements).
    ``bytes`` is the size actually measured: the requested size rounded down to whole elements (and
    for all_gather / reduce_scatter to a multiple of the world size). ``count`` may be 0.
    """
    total = nbytes // elem_size
    if op in ("all_gather", "reduce_scatter"):
        count = total // world_size
        return count, count * world_size * elem_size
    if op in ("all_reduce", "broadcast"):
        return total, total * elem_size
    raise ValueError(f"unknown op {op!r}")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="collective_rank", description="one rank (started by the collectives benchmark)")
    p.add_argument("--backend", choices=("nccl", "gloo"), required=True)
    p.add_argument("--nprocs", type=int, required=True)
    p.add_argument("--ops", type=lambda t: t.split(","), required=True)
    p.add_argument("--sizes", type=lambda t: [int(s) for s in t.split(",")], required=True)
    p.add_argument("--dtype", choices=tuple(DTYPES), required=True)
    p.add_argument("--warmup", type=int, required=True)
    p.add_argument("--iters", type=int, required=True)
    p.add_argument("--pg-timeout", type=float, required=True)
    p.add_argument("--outdir", required=True)
    p.add_argument("--parent", type=int, default=None)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run this rank (``RANK`` from the environment); never returns (``os._exit``: 0 or 1)."""
    args = _parser().parse_args(argv)
    rank = int(os.environ["RANK"])
    _die_with_parent(args.parent)
    if args.backend == "nccl":
        os.environ.setdefault("NCCL_DEBUG", "WARN")
    try:
        run_rank(args, rank)
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the log and the exit code
        traceback.print_exc()
        text = " | ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        error = f"{type(exc).__name__}: {text}"[:2000]
        print(FAILED_MARK.format(rank=rank) + error, file=sys.stderr)
        sys.stderr.flush()
        sys.stdout.flush()
        try:
            (Path(args.outdir) / f"rank{rank}.error").write_text(error)
        except OSError:
            pass
        os._exit(1)  # no interpreter teardown: destroying a broken process group can hang
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _die_with_parent(parent: int | None) -> None:
    """Ask Linux to SIGKILL this rank when the launcher dies, so that no rank outlives it."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if parent is not None and os.getppid() != parent:
        os._exit(1)


class WrongResultError(RuntimeError):
    """A collective returned a result that differs from the exact expected one."""


def _pattern(rank: int, count: int, offset: int, device: torch.device) -> torch.Tensor:
    """Rank ``rank``'s known input: small integers 1..5, exact in every dtype, distinct per rank."""
    import torch

    idx = torch.arange(offset, offset + count, device=device, dtype=torch.int64)
    return (idx + 7 * rank) % 5 + 1


class Case:
    """One op at one size on this rank: its buffers, its call, and its exact check."""

    def __init__(
        self, op: str, count: int, nbytes: int, world: int, rank: int, inp: torch.Tensor, out: torch.Tensor
    ) -> None:
        import torch.distributed as dist

        self.op, self.count, self.nbytes, self.world, self.rank = op, count, nbytes, world, rank
        all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        n = world
        if op == "all_reduce":
            self.src = self.dst = inp[:count]
            self.call: Callable[[], object] = lambda: dist.all_reduce(self.dst)
        elif op == "all_gather":
            self.src, self.dst = inp[:count], out[: count * n]
            self.call = lambda: all_gather(self.dst, self.src)
        elif op == "reduce_scatter":
            self.src, self.dst = inp[: count * n], out[:count]
            self.call = lambda: reduce_scatter(self.dst, self.src)
        elif op == "broadcast":
            self.src = self.dst = inp[:count]
            self.call = lambda: dist.broadcast(self.dst, src=0)
        else:
            raise ValueError(f"unknown op {op!r}")

    def _expected(self) -> torch.Tensor:
        import torch

        dev, n, c = self.src.device, self.world, self.count
        if self.op == "all_reduce":
            return sum((_pattern(r, c, 0, dev) for r in range(n)), torch.zeros(c, dtype=torch.int64, device=dev))
        if self.op == "all_gather":
            return torch.cat([_pattern(r, c, 0, dev) for r in range(n)])
        if self.op == "reduce_scatter":
            off = self.rank * c
            return sum((_pattern(r, c, off, dev) for r in range(n)), torch.zeros(c, dtype=torch.int64, device=dev))
        return _pattern(0, c, 0, dev)

    def fill(self) -> None:
        """Put the known input in place (and clear the output)."""
        src_len = self.src.numel()
        self.dst.zero_()
        self.src.copy_(_pattern(self.rank, src_len, 0, self.src.device))

    def verify(self, dtype_name: str) -> None:
        """Compare the output with the exact expected result; raise :class:`WrongResultError`."""
        import torch

        expected = self._expected().to(self.dst.dtype)  # int8 wraps like the collective's own sum
        if torch.equal(self.dst, expected):
            return
        bad = self.dst != expected
        n_bad = int(bad.sum().item())
        first = int(bad.nonzero()[0].item())
        raise WrongResultError(
            f"{self.op} of {self.nbytes} B ({dtype_name}, {self.world} ranks) gave a wrong result on rank "
            f"{self.rank}: {n_bad} of {self.dst.numel()} elements differ (first at index {first}: "
            f"got {self.dst[first].item()}, expected {expected[first].item()})"
        )


def _gpu_used(device: torch.device) -> tuple[int, int]:
    """(bytes in use on the GPU by anyone, bytes reserved by torch's caching allocator)."""
    import torch

    torch.cuda.synchronize(device)
    free, total = torch.cuda.mem_get_info(device)
    return total - free, torch.cuda.memory_reserved(device)


def run_rank(args: argparse.Namespace, rank: int) -> None:
    """Measure every op and size on this rank and write its ``rank{R}.json`` into ``args.outdir``."""
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"torch\.distributed")
    import torch
    import torch.distributed as dist

    backend, world = args.backend, int(args.nprocs)
    nccl = backend == "nccl"
    dtype_name = args.dtype
    dtype = getattr(torch, DTYPES[dtype_name][0])
    elem = DTYPES[dtype_name][1]
    if nccl:
        local_rank = int(os.environ.get("LOCAL_RANK", rank))
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")

    # Every buffer up front (one input, one output per op, sized for the largest size), so that
    # the memory NCCL takes can be told apart from the benchmark's own.
    cases: list[Case] = []
    for op in args.ops:
        shapes = [op_shape(op, s, elem, world) for s in args.sizes]
        max_count = max(c for c, _ in shapes)
        in_len = max_count * world if op == "reduce_scatter" else max_count
        out_len = max_count * world if op == "all_gather" else (max_count if op == "reduce_scatter" else 0)
        inp = torch.zeros(in_len, dtype=dtype, device=device)
        out = torch.zeros(out_len, dtype=dtype, device=device)
        cases.extend(Case(op, c, b, world, rank, inp, out) for c, b in shapes)

    before: tuple[int, int] | None = None
    if nccl:
        for case in cases:  # load the kernels the checks use before the baseline is taken
            case.fill()
            case._expected().to(dtype).eq(case.dst).sum().item()
        before = _gpu_used(device)

    timeout = datetime.timedelta(seconds=float(args.pg_timeout))
    if nccl:
        # device_id (torch >= 2.3) binds the group to this GPU and creates the communicator now.
        kwargs: dict[str, Any] = {}
        if "device_id" in inspect.signature(dist.init_process_group).parameters:
            kwargs["device_id"] = device
        dist.init_process_group("nccl", rank=rank, world_size=world, timeout=timeout, **kwargs)
    else:
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timeout)

    def barrier() -> None:
        if nccl:
            dist.barrier(device_ids=[device.index])
        else:
            dist.barrier()

    def mem_mib() -> float | None:
        if before is None:
            return None
        used, reserved = _gpu_used(device)
        return round(((used - before[0]) - (reserved - before[1])) / _MIB, 1)

    first_mem: float | None = None
    results: list[dict[str, Any]] = []
    for i, case in enumerate(cases):
        case.fill()
        case.call()
        if nccl:
            torch.cuda.synchronize(device)
        if i == 0:
            first_mem = mem_mib()
        case.verify(dtype_name)
        case.dst.zero_()
        case.src.zero_()
        t0 = time.perf_counter()
        for _ in range(args.warmup):
            case.call()
        launch_s = (time.perf_counter() - t0) / args.warmup if args.warmup else 100e-6
        if nccl:
            times = _time_gpu(case.call, args.iters, barrier, launch_s)
        else:
            times = _time_cpu(case.call, args.iters, barrier)
        results.append({"op": case.op, "bytes": case.nbytes, "count": case.count, "times_us": times, "correct": True})
    end_mem = mem_mib()
    barrier()

    doc = {
        "rank": rank,
        "device": torch.cuda.get_device_name(device) if nccl else "cpu",
        "nccl_version": _nccl_version() if nccl else None,
        "nccl_mem_mib": first_mem,
        "nccl_mem_mib_after_all": end_mem,
        "results": results,
    }
    path = Path(args.outdir) / f"rank{rank}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    tmp.replace(path)
    dist.destroy_process_group()


def _time_gpu(call: Callable[[], object], iters: int, barrier: Callable[[], None], launch_s: float) -> list[float]:
    """Per-call GPU times in microseconds, from CUDA events around each call on the current stream.

    The stream is held by a spin kernel while the CPU queues the calls, so that they then run back
    to back as in a CUDA-graph replay (a server's decode step): the time is NCCL's on the GPU, not
    torch.distributed's launch path on the CPU (tens of microseconds a call, the same whatever NCCL
    does, which would hide what the NCCL settings change). One untimed call after each hold lines
    the ranks up (their holds end at different times). Calls go in chunks of ``_CHUNK`` so that the
    queue never fills. ``launch_s``: the CPU time to queue one call, to size the hold.
    """
    import torch

    hold_s = min(0.5, 1e-3 + 2.0 * min(iters, _CHUNK) * max(launch_s, 20e-6))
    times: list[float] = []
    while len(times) < iters:
        n = min(_CHUNK, iters - len(times))
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]  # type: ignore[no-untyped-call]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]  # type: ignore[no-untyped-call]
        torch.cuda.synchronize()
        barrier()
        if hasattr(torch.cuda, "_sleep"):
            torch.cuda._sleep(int(hold_s * _SPIN_CYCLES_PER_S))  # type: ignore[no-untyped-call]
        call()
        for start, end in zip(starts, ends):
            start.record()
            call()
            end.record()
        torch.cuda.synchronize()
        times.extend(start.elapsed_time(end) * 1e3 for start, end in zip(starts, ends))
    return times


def _time_cpu(call: Callable[[], object], iters: int, barrier: Callable[[], None]) -> list[float]:
    """Per-call wall times in microseconds (gloo calls return when done)."""
    barrier()
    times: list[float] = []
    for _ in range(iters):
        t0 = time.perf_counter()
        call()
        times.append((time.perf_counter() - t0) * 1e6)
    return times


def _nccl_version() -> str | None:
    import torch

    try:
        version = torch.cuda.nccl.version()  # type: ignore[no-untyped-call]
    except (AttributeError, RuntimeError):
        return None
    if isinstance(version, tuple):
        return ".".join(str(v) for v in version)
    code = int(version)  # older torch: NCCL_VERSION_CODE, e.g. 21803 or 2708
    if code >= 10000:
        return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"
    return f"{code // 1000}.{code % 1000 // 100}.{code % 100}"


if __name__ == "__main__":
    sys.exit(main())
