"""Latency and bandwidth of torch.distributed collectives, under the NCCL environment it is given.

Run it as a trial's benchmark command::

    NCCL_ALGO=Ring NCCL_PROTO=LL python -m autotune.benchmarks.collectives \\
        --backend nccl --ops all_reduce,all_gather --sizes 42KB,4MB --dtype bf16 --json -

It starts one process per rank (``--backend nccl``: one per GPU, ``--nprocs`` defaulting to
``torch.cuda.device_count()``; ``--backend gloo``: ``--nprocs`` CPU processes, default 2) on
127.0.0.1 with a free port. Every rank inherits this process's environment, so the ``NCCL_*``
variables of the trial take effect; none of them is changed (``NCCL_NVLS_ENABLE`` stays as given),
except that ``NCCL_DEBUG`` defaults to ``WARN`` so that NCCL explains an error in the log.

For each op and size: one checked call (known inputs, the result compared exactly: a wrong result
is an error), ``--warmup`` calls, then ``--iters`` timed calls after a barrier. NCCL: CUDA events
around each call, with the calls queued ahead on a held stream so that they run back to back as in
a CUDA-graph replay: GPU time, without torch.distributed's CPU launch cost (tens of microseconds,
the same whatever NCCL does). gloo: ``perf_counter`` around each call.

Sizes are like nccl-tests': bytes of the all-reduce / broadcast buffer, of the gathered output of
all_gather and of the scattered input of reduce_scatter. They take the suffixes B, K/KB/KiB,
M/MB/MiB, G/GB/GiB, all binary as in nccl-tests (``42KB`` = 43008 B, a decode step's all-reduce of
3 tokens x hidden 7168 x 2 bytes).

Contract:

- stdout (or the ``--json`` file): one JSON document::

    {"backend": "nccl", "world_size": 8, "dtype": "bf16", "warmup": 5, "iters": 20,
     "device": "NVIDIA H200", "env": {"NCCL_ALGO": "Ring", ...},
     "results": [{"op": "all_reduce", "bytes": 43008, "count": 21504,
                  "latency_us": {"mean": .., "median": .., "min": .., "max": ..},
                  "algbw_gbps": .., "busbw_gbps": .., "correct": true}, ...],
     "nccl_mem_mib": 312.5, "nccl_mem_mib_per_rank": [...], "nccl_mem_mib_after_all": 330.1,
     "torch_version": "2.13.0", "nccl_version": "2.27.3"}

  ``latency_us``: each statistic is taken over the timed iterations of one rank, then the maximum
  over ranks (the slowest rank bounds a collective). ``algbw_gbps`` = bytes / mean latency (GB/s,
  10^9 B/s); ``busbw_gbps`` = algbw x 2(n-1)/n for all_reduce, x (n-1)/n for all_gather and
  reduce_scatter, x 1 for broadcast, as nccl-tests defines them.
  ``nccl_mem_mib`` (NCCL only, else null): GPU memory in use (``mem_get_info``: total - free) after
  the first collective minus before the process group was created, less what torch's caching
  allocator reserved meanwhile (the benchmark's own tensors); the maximum over ranks.
  ``nccl_mem_mib_after_all``: the same, after every op and size ran (NCCL connects lazily, per
  algorithm and protocol).
- stderr: a readable table, and everything the ranks print (NCCL WARN lines, tracebacks), verbatim.
- exit status: 0 measured; 2 bad arguments (argparse); 1 a rank failed (an exception, an NCCL
  error, a wrong result, killed) or ``--timeout`` passed. On the first rank that fails the others
  are stopped at once, and a last line ``collectives: FAILED: ...`` names the rank and its error.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import inspect
import json
import math
import os
import queue
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from autotune.util.net import free_port

if TYPE_CHECKING:
    import torch

OPS: tuple[str, ...] = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
"""Collectives this benchmark can run."""

DTYPES: dict[str, tuple[str, int]] = {
    "bf16": ("bfloat16", 2),
    "fp16": ("float16", 2),
    "fp32": ("float32", 4),
    "int8": ("int8", 1),
}
"""``--dtype`` name -> (torch dtype attribute, bytes per element)."""

DECODE_ALLREDUCE_BYTES = 3 * 7168 * 2
"""A decode step's all-reduce: 3 tokens x hidden 7168 x 2 bytes = 43008 B."""

PREFILL_ALLREDUCE_BYTES = 4 * 1024 * 1024
"""A prefill step's all-reduce of a few MB."""

DEFAULT_SIZES: tuple[int, ...] = (DECODE_ALLREDUCE_BYTES, PREFILL_ALLREDUCE_BYTES)
DEFAULT_OPS: tuple[str, ...] = ("all_reduce", "all_gather")

_PROG = "python -m autotune.benchmarks.collectives"
_MIB = 1024 * 1024
_CHUNK = 50  # timed NCCL calls queued at once
_SPIN_CYCLES_PER_S = 2.0e9  # GPU clock for sizing the spin that holds the stream (a lower clock holds longer)
_UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    "k": 1024,
    "kb": 1024,
    "kib": 1024,
    "m": 1024**2,
    "mb": 1024**2,
    "mib": 1024**2,
    "g": 1024**3,
    "gb": 1024**3,
    "gib": 1024**3,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")
_FAILED_MARK = "collectives: rank {rank} failed: "
# How the launcher starts a rank: this very file, loaded by path, so that a rank imports nothing
# but the standard library and torch (not the autotune package and its dependencies).
_RANK_BOOT = (
    "import importlib.util, sys; "
    "spec = importlib.util.spec_from_file_location('_autotune_collectives_rank', {path!r}); "
    "module = importlib.util.module_from_spec(spec); sys.modules[spec.name] = module; "
    "spec.loader.exec_module(module); sys.exit(module.main(sys.argv[1:]))"
)


# --------------------------------------------------------------------------------------------
# Pure helpers (no torch): sizes, bandwidth, statistics.


def parse_size(text: str) -> int:
    """Bytes from ``"43008"``, ``"42KB"``, ``"4MiB"``, ``"1.5M"`` (K, M, G are binary, as in nccl-tests).

    Raises:
        ValueError: not a size, or not a positive whole number of bytes.
    """
    m = _SIZE.match(text)
    if m is None or m.group(2).lower() not in _UNITS:
        raise ValueError(f"invalid size {text!r} (expected e.g. 43008, 42KB, 4MiB)")
    value = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if value < 1 or value != int(value):
        raise ValueError(f"invalid size {text!r}: not a positive whole number of bytes")
    return int(value)


def bus_factor(op: str, world_size: int) -> float:
    """nccl-tests' bus bandwidth factor: busbw = algbw x this."""
    n = world_size
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter"):
        return (n - 1) / n
    if op == "broadcast":
        return 1.0
    raise ValueError(f"unknown op {op!r}")


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


def latency_stats(per_rank_us: Sequence[Sequence[float]]) -> dict[str, float]:
    """mean, median, min, max over each rank's iterations, then the maximum over ranks."""
    if not per_rank_us or any(not times for times in per_rank_us):
        raise ValueError("no timings")
    stats: dict[str, float] = {}
    for name, fn in (("mean", statistics.fmean), ("median", statistics.median), ("min", min), ("max", max)):
        stats[name] = round(max(float(fn(times)) for times in per_rank_us), 3)
    return stats


def bandwidths(op: str, nbytes: int, mean_us: float, world_size: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (10^9 B/s) for ``nbytes`` moved in ``mean_us`` microseconds."""
    algbw = nbytes / (mean_us * 1e3) if mean_us > 0 else 0.0
    return algbw, algbw * bus_factor(op, world_size)


# --------------------------------------------------------------------------------------------
# Command line.


def _size_list(text: str) -> list[int]:
    try:
        sizes = [parse_size(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if not sizes:
        raise argparse.ArgumentTypeError("no sizes given")
    return sizes


def _op_list(text: str) -> list[str]:
    ops: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        if part not in OPS:
            raise argparse.ArgumentTypeError(f"unknown op {part!r} (choose from {', '.join(OPS)})")
        if part not in ops:
            ops.append(part)
    if not ops:
        raise argparse.ArgumentTypeError("no ops given")
    return ops


def _int_at_least(minimum: int) -> Callable[[str], int]:
    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    return convert


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number: {text!r}") from None
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The command line (see the module docstring)."""
    p = argparse.ArgumentParser(
        prog=_PROG,
        description="Latency and bandwidth of torch.distributed collectives (NCCL on GPUs, gloo on CPU) "
        "under the NCCL_* environment it is given. JSON on stdout, a table on stderr.",
    )
    p.add_argument(
        "--backend",
        choices=("nccl", "gloo", "auto"),
        default="auto",
        help="nccl: one process per GPU; gloo: CPU processes; auto: nccl when a GPU is visible",
    )
    p.add_argument(
        "--nprocs", type=_int_at_least(1), default=None, help="ranks (default: the GPU count for nccl, 2 for gloo)"
    )
    p.add_argument(
        "--ops",
        type=_op_list,
        default=list(DEFAULT_OPS),
        help=f"comma-separated, from {','.join(OPS)} (default: {','.join(DEFAULT_OPS)})",
    )
    p.add_argument(
        "--sizes",
        type=_size_list,
        default=list(DEFAULT_SIZES),
        help="comma-separated sizes in bytes, suffixes B/KB/KiB/MB/MiB/GB/GiB (binary) "
        "(default: 42KB,4MB: a decode and a prefill all-reduce)",
    )
    p.add_argument("--dtype", choices=tuple(DTYPES), default="bf16", help="element type (default: bf16)")
    p.add_argument("--warmup", type=_int_at_least(0), default=5, help="untimed calls per op and size")
    p.add_argument("--iters", type=_int_at_least(1), default=20, help="timed calls per op and size")
    p.add_argument("--json", metavar="OUT", default=None, help="write the JSON document to OUT ('-' or absent: stdout)")
    p.add_argument(
        "--timeout",
        type=_positive_float,
        default=300.0,
        help="seconds for the whole run before every rank is stopped (default: 300)",
    )
    p.add_argument(
        "--pg-timeout",
        type=_positive_float,
        default=120.0,
        help="process group timeout in seconds: a collective stuck longer fails (default: 120)",
    )
    # Internal: how the launcher starts a rank.
    p.add_argument("--_rank", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--_outdir", default=None, help=argparse.SUPPRESS)
    p.add_argument("--_parent", type=int, default=None, help=argparse.SUPPRESS)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status (argparse exits with 2 itself on bad arguments)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args._rank is not None:
        return _rank_main(args)
    return _launch(parser, args)


# --------------------------------------------------------------------------------------------
# The launcher: start the ranks, watch them, stop them all on the first failure, aggregate.


@dataclass
class _Rank:
    rank: int
    proc: subprocess.Popen[bytes]
    tail: collections.deque[str]
    forwarder: threading.Thread


def _forward(stream: IO[bytes], sink: IO[str], lock: threading.Lock, tail: collections.deque[str]) -> None:
    """Copy a rank's output to ``sink`` line by line, verbatim, keeping the last lines in ``tail``."""
    try:
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            tail.append(line)
            with lock:
                sink.write(line + "\n")
                sink.flush()
    except (OSError, ValueError):
        pass
    finally:
        stream.close()


def _stop(ranks: Sequence[_Rank], grace_s: float = 2.0) -> None:
    """SIGTERM every rank still running, SIGKILL those alive after ``grace_s``, reap them all."""
    alive = [r for r in ranks if r.proc.poll() is None]
    for r in alive:
        try:
            r.proc.terminate()
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    for r in alive:
        try:
            r.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            r.proc.kill()
            r.proc.wait()


def _describe_exit(r: _Rank) -> str:
    code = r.proc.returncode
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        what = f"rank {r.rank} was killed by {name}"
    else:
        what = f"rank {r.rank} exited with code {code}"
    mark = _FAILED_MARK.format(rank=r.rank)
    for line in reversed(r.tail):
        if line.startswith(mark):
            return f"{what}: {line[len(mark) :]}"
    return what


def _raise_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _launch(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    import torch  # here, not at import: bad arguments fail fast

    n_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0  # creates no CUDA context
    backend = args.backend
    if backend == "auto":
        backend = "nccl" if n_gpus > 0 else "gloo"
    if backend == "nccl":
        if n_gpus == 0:
            parser.error("--backend nccl needs CUDA GPUs and torch sees none")
        world = args.nprocs if args.nprocs is not None else n_gpus
        if world > n_gpus:
            parser.error(f"--nprocs {world} is more than the {n_gpus} GPUs visible (one rank per GPU)")
    else:
        world = args.nprocs if args.nprocs is not None else 2
    elem = DTYPES[args.dtype][1]
    for op in args.ops:
        for size in args.sizes:
            if op_shape(op, size, elem, world)[0] == 0:
                parser.error(f"--sizes: {size} B is too small for {op} of {args.dtype} over {world} ranks")

    env = dict(os.environ)
    if backend == "nccl":
        env.setdefault("NCCL_DEBUG", "WARN")
    env.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(world),
        PYTHONUNBUFFERED="1",
    )
    nccl_env = {k: v for k, v in sorted(env.items()) if k.startswith("NCCL_")}

    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _raise_on_sigterm) if in_main_thread else None
    lock = threading.Lock()
    ranks: list[_Rank] = []
    with tempfile.TemporaryDirectory(prefix="autotune-collectives-") as outdir:
        try:
            common = [
                sys.executable, "-c", _RANK_BOOT.format(path=str(Path(__file__).resolve())),
                "--backend", backend, "--nprocs", str(world), "--ops", ",".join(args.ops),
                "--sizes", ",".join(str(s) for s in args.sizes), "--dtype", args.dtype,
                "--warmup", str(args.warmup), "--iters", str(args.iters),
                "--pg-timeout", str(args.pg_timeout), "--_outdir", outdir, "--_parent", str(os.getpid()),
            ]  # fmt: skip
            for rank in range(world):
                rank_env = dict(env, RANK=str(rank), LOCAL_RANK=str(rank))
                proc = subprocess.Popen(
                    [*common, "--_rank", str(rank)],
                    env=rank_env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,  # NCCL logs to stdout: keep our stdout for the JSON
                    stderr=subprocess.STDOUT,
                )
                tail: collections.deque[str] = collections.deque(maxlen=200)
                assert proc.stdout is not None
                fwd = threading.Thread(target=_forward, args=(proc.stdout, sys.stderr, lock, tail), daemon=True)
                fwd.start()
                ranks.append(_Rank(rank, proc, tail, fwd))

            failure = _watch(ranks, args.timeout)
            if failure is not None:
                print(f"collectives: FAILED: {failure}", file=sys.stderr, flush=True)
                return 1
            files = [Path(outdir) / f"rank{r.rank}.json" for r in ranks]
            missing = [str(i) for i, f in enumerate(files) if not f.exists()]
            if missing:
                print(
                    f"collectives: FAILED: rank(s) {', '.join(missing)} exited 0 without results",
                    file=sys.stderr,
                    flush=True,
                )
                return 1
            per_rank = [json.loads(f.read_text()) for f in files]
        finally:
            _stop(ranks)
            if in_main_thread:
                signal.signal(signal.SIGTERM, previous)

    doc = _aggregate(
        per_rank, backend=backend, world=world, args=args, env=nccl_env, torch_version=str(torch.__version__)
    )
    _print_table(doc, sys.stderr)
    text = json.dumps(doc, indent=2)
    if args.json in (None, "-"):
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
    else:
        Path(args.json).write_text(text + "\n")
    return 0


def _watch(ranks: Sequence[_Rank], timeout_s: float) -> str | None:
    """Wait for every rank; None when all exited 0, else what went wrong (every rank is stopped).

    Exits are seen in the order they happen (one waiting thread per rank), so the rank named is
    the one that failed first, not one that failed because a peer had gone. The others get a
    second to fail by themselves (a configuration fault hits every rank, and their error text
    belongs in the log too), then they are stopped.
    """
    exits: queue.Queue[_Rank] = queue.Queue()

    def wait_for(r: _Rank) -> None:
        r.proc.wait()
        exits.put(r)

    for r in ranks:
        threading.Thread(target=wait_for, args=(r,), daemon=True).start()
    deadline = time.monotonic() + timeout_s
    first: _Rank | None = None
    message: str | None = None
    pending = len(ranks)
    while pending:
        try:
            r = exits.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            running = [str(r.rank) for r in ranks if r.proc.poll() is None]
            message = f"timed out after {timeout_s:g} s with rank(s) {', '.join(running)} still running (stopped)"
            break
        pending -= 1
        if r.proc.returncode != 0:
            first = r
            settle = time.monotonic() + 1.0
            while time.monotonic() < settle and any(x.proc.poll() is None for x in ranks):
                time.sleep(0.05)
            break
    _stop(ranks)
    for r in ranks:
        r.forwarder.join(timeout=2.0)  # the rank's last lines reach the log before the verdict
    if first is not None:
        others = [str(r.rank) for r in ranks if r is not first and r.proc.returncode != 0]
        note = f" (then rank(s) {', '.join(others)} failed or were stopped)" if others else ""
        message = _describe_exit(first) + note
    return message


def _aggregate(
    per_rank: Sequence[dict[str, Any]],
    *,
    backend: str,
    world: int,
    args: argparse.Namespace,
    env: dict[str, str],
    torch_version: str,
) -> dict[str, Any]:
    results: list[dict[str, Any]] = []
    for i, first in enumerate(per_rank[0]["results"]):
        times = [rank_doc["results"][i]["times_us"] for rank_doc in per_rank]
        lat = latency_stats(times)
        # Bandwidth from the unrounded slowest mean, as nccl-tests does from its max-over-ranks time.
        mean_us = max(statistics.fmean(t) for t in times)
        algbw, busbw = bandwidths(first["op"], first["bytes"], mean_us, world)
        results.append(
            {
                "op": first["op"],
                "bytes": first["bytes"],
                "count": first["count"],
                "latency_us": lat,
                "algbw_gbps": round(algbw, 6),
                "busbw_gbps": round(busbw, 6),
                "correct": all(rank_doc["results"][i]["correct"] for rank_doc in per_rank),
            }
        )

    def worst(key: str) -> float | None:
        values = [d[key] for d in per_rank if d.get(key) is not None]
        return round(max(values), 1) if values else None

    return {
        "backend": backend,
        "world_size": world,
        "dtype": args.dtype,
        "warmup": args.warmup,
        "iters": args.iters,
        "device": per_rank[0].get("device"),
        "env": env,
        "results": results,
        "nccl_mem_mib": worst("nccl_mem_mib"),
        "nccl_mem_mib_per_rank": ([d["nccl_mem_mib"] for d in per_rank] if backend == "nccl" else None),
        "nccl_mem_mib_after_all": worst("nccl_mem_mib_after_all"),
        "torch_version": torch_version,
        "nccl_version": per_rank[0].get("nccl_version"),
    }


def _print_table(doc: dict[str, Any], out: IO[str]) -> None:
    env = " ".join(f"{k}={v}" for k, v in doc["env"].items()) or "(none)"
    lines = [
        (
            f"collectives: {doc['backend']}, {doc['world_size']} ranks on {doc['device']}, {doc['dtype']}, "
            f"{doc['warmup']} warm-up + {doc['iters']} timed calls per size"
        ),
        f"NCCL env: {env}",
        (
            f"{'op':<15}{'bytes':>11}{'count':>11}{'mean_us':>11}{'median_us':>11}{'min_us':>11}{'max_us':>11}"
            f"{'algbw_GB/s':>12}{'busbw_GB/s':>12}"
        ),
    ]
    for r in doc["results"]:
        lat = r["latency_us"]
        lines.append(
            f"{r['op']:<15}{r['bytes']:>11}{r['count']:>11}{lat['mean']:>11.2f}{lat['median']:>11.2f}"
            f"{lat['min']:>11.2f}{lat['max']:>11.2f}{r['algbw_gbps']:>12.3f}{r['busbw_gbps']:>12.3f}"
        )
    if doc["nccl_mem_mib"] is not None:
        lines.append(
            f"NCCL memory per rank (max): {doc['nccl_mem_mib']:.1f} MiB after the first collective, "
            f"{doc['nccl_mem_mib_after_all']:.1f} MiB after all"
        )
    lines.append(f"torch {doc['torch_version']}, NCCL {doc['nccl_version'] or '-'}")
    out.write("\n".join(lines) + "\n")
    out.flush()


# --------------------------------------------------------------------------------------------
# One rank.


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


def _rank_main(args: argparse.Namespace) -> int:
    rank = int(args._rank)
    _die_with_parent(args._parent)
    try:
        _run_rank(args, rank)
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the log and the exit code
        traceback.print_exc()
        text = " | ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        print(_FAILED_MARK.format(rank=rank) + f"{type(exc).__name__}: {text}"[:2000], file=sys.stderr)
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(1)  # no interpreter teardown: destroying a broken process group can hang
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


class WrongResultError(RuntimeError):
    """A collective returned a result that differs from the exact expected one."""


def _pattern(rank: int, count: int, offset: int, device: torch.device) -> torch.Tensor:
    """Rank ``rank``'s known input: small integers 1..5, exact in every dtype, distinct per rank."""
    import torch

    idx = torch.arange(offset, offset + count, device=device, dtype=torch.int64)
    return (idx + 7 * rank) % 5 + 1


class _Case:
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


def _run_rank(args: argparse.Namespace, rank: int) -> None:
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
    cases: list[_Case] = []
    for op in args.ops:
        shapes = [op_shape(op, s, elem, world) for s in args.sizes]
        max_count = max(c for c, _ in shapes)
        in_len = max_count * world if op == "reduce_scatter" else max_count
        out_len = max_count * world if op == "all_gather" else (max_count if op == "reduce_scatter" else 0)
        inp = torch.zeros(in_len, dtype=dtype, device=device)
        out = torch.zeros(out_len, dtype=dtype, device=device)
        cases.extend(_Case(op, c, b, world, rank, inp, out) for c, b in shapes)

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
    path = Path(args._outdir) / f"rank{rank}.json"
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
