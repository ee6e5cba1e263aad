"""Latency and bandwidth of torch.distributed collectives, under the NCCL environment it is given.

Run it as a trial's benchmark command::

    NCCL_ALGO=Ring NCCL_PROTO=LL python -m autotune.benchmarks.collectives \\
        --backend nccl --ops all_reduce,all_gather --sizes 42KB,4MB --dtype bf16 --json -

It starts one process per rank under torchrun (``torch.distributed.run``'s launch API, standalone:
``--backend nccl``: one per GPU, ``--nprocs`` defaulting to ``torch.cuda.device_count()``;
``--backend gloo``: ``--nprocs`` CPU processes, default 2). Every rank inherits this process's
environment, so the trial's ``NCCL_*`` variables take effect unchanged, except that ``NCCL_DEBUG``
defaults to ``WARN`` so that NCCL explains an error in the log. A rank
(:mod:`autotune.benchmarks.collective_rank`) makes, for each op and size, one checked call (a wrong
result is an error), ``--warmup`` calls, then ``--iters`` timed calls after a barrier: GPU time
from CUDA events for NCCL, ``perf_counter`` for gloo.

Sizes are like nccl-tests' (:func:`parse_size`, binary suffixes): bytes of the all-reduce /
broadcast buffer, of the gathered output of all_gather and of the scattered input of reduce_scatter.

Contract:

- stdout (or the ``--json`` file): one JSON document (its fields: :func:`_aggregate`).
- stderr: a readable table, and everything the ranks print (NCCL WARN lines, tracebacks), verbatim.
- exit status: 0 measured; 2 bad arguments (argparse); 1 a rank failed (an exception, an NCCL
  error, a wrong result, killed) or ``--timeout`` passed. On the first rank that fails the others
  are stopped at once, and a last line ``collectives: FAILED: ...`` names the rank and its error.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import signal
import statistics
import sys
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

from autotune.benchmarks import collective_rank
from autotune.benchmarks.collective_rank import DTYPES, OPS, op_shape

DECODE_ALLREDUCE_BYTES = 3 * 7168 * 2
"""A decode step's all-reduce: 3 tokens x hidden 7168 x 2 bytes = 43008 B."""

PREFILL_ALLREDUCE_BYTES = 4 * 1024 * 1024
"""A prefill step's all-reduce of a few MB."""

DEFAULT_SIZES: tuple[int, ...] = (DECODE_ALLREDUCE_BYTES, PREFILL_ALLREDUCE_BYTES)
DEFAULT_OPS: tuple[str, ...] = ("all_reduce", "all_gather")

_PROG = "python -m autotune.benchmarks.collectives"
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
# How torchrun starts a rank: its file, loaded by path, so that a rank imports nothing but the
# standard library and torch (not the autotune package and its dependencies).
_RANK_BOOT = (
    "import importlib.util, sys; "
    "spec = importlib.util.spec_from_file_location('_autotune_collective_rank', {path!r}); "
    "module = importlib.util.module_from_spec(spec); sys.modules[spec.name] = module; "
    "spec.loader.exec_module(module); sys.exit(module.main(sys.argv[1:]))"
)
_STOP_GRACE_S = 2
"""Seconds the other ranks get between SIGTERM and SIGKILL once one failed."""


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
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status (argparse exits with 2 itself on bad arguments)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    return _launch(parser, args)


# --------------------------------------------------------------------------------------------
# The launcher: torchrun starts the ranks and stops them all on the first failure; this aggregates.


class _TimedOut(Exception):
    """``--timeout`` passed (raised in the main thread by SIGALRM)."""


@contextlib.contextmanager
def _alarm(timeout_s: float) -> Iterator[None]:
    """Raise :class:`_TimedOut` here after ``timeout_s``: torchrun's agent then stops every rank.
    Only the main thread receives signals: elsewhere (an in-process caller's thread) no limit."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def ring(signum: int, frame: object) -> None:
        raise _TimedOut

    previous = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """Point file descriptor 1 at stderr while the ranks run (they inherit it): what they print
    (NCCL logs to stdout) goes to the log, and stdout keeps the JSON document alone."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _describe_exit(rank: int, exitcode: int, outdir: Path) -> str:
    """``rank R exited with code C`` or ``rank R was killed by SIGNAL``, with the rank's own error
    line (its ``rankR.error`` file) where it wrote one."""
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        what = f"rank {rank} was killed by {name}"
    else:
        what = f"rank {rank} exited with code {exitcode}"
    try:
        return f"{what}: {(outdir / f'rank{rank}.error').read_text().strip()}"
    except OSError:
        return what


def _failure(failures: dict[int, Any], outdir: Path) -> str:
    """The verdict on torchrun's failed ranks (rank -> ``ProcessFailure``): the first to fail, and
    which others failed or were stopped. A rank killed by a signal other than SIGTERM (torchrun's
    stop) comes first: its peers' failures follow from it (a collective with a dead peer raises),
    but torchrun may read their error files' times before it sees the death; then the earliest
    time, then the order torchrun saw them in."""
    def killed(r: int) -> bool:
        return failures[r].exitcode < 0 and failures[r].exitcode != -signal.SIGTERM

    first = min(failures, key=lambda r: (not killed(r), failures[r].timestamp))
    others = [str(r) for r in sorted(failures) if r != first]
    note = f" (then rank(s) {', '.join(others)} failed or were stopped)" if others else ""
    return _describe_exit(first, failures[first].exitcode, outdir) + note


def _run_ranks(backend: str, world: int, args: argparse.Namespace, outdir: Path) -> str | None:
    """Run the ranks under torchrun; None when all exited 0, else what went wrong (every rank is
    stopped by then)."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    rank_argv = [
        "-u", "-c", _RANK_BOOT.format(path=str(Path(collective_rank.__file__).resolve())),
        "--backend", backend, "--nprocs", str(world), "--ops", ",".join(args.ops),
        "--sizes", ",".join(str(s) for s in args.sizes), "--dtype", args.dtype,
        "--warmup", str(args.warmup), "--iters", str(args.iters),
        "--pg-timeout", str(args.pg_timeout), "--outdir", str(outdir), "--parent", str(os.getpid()),
    ]  # fmt: skip
    # torchrun --standalone --nproc-per-node WORLD --max-restarts 0, as an API call.
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=world, run_id=str(uuid.uuid4()),
                          rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0,
                          monitor_interval=0.1, shutdown_timeout=_STOP_GRACE_S)
    try:
        with _stdout_to_stderr(), _alarm(args.timeout):
            elastic_launch(config, sys.executable)(*rank_argv)
    except ChildFailedError as exc:
        return _failure(exc.failures, outdir)
    except _TimedOut:
        running = [str(r) for r in range(world) if not (outdir / f"rank{r}.json").exists()]
        return f"timed out after {args.timeout:g} s with rank(s) {', '.join(running)} still running (stopped)"
    return None


def _launch(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    import torch  # here, not at import: bad arguments fail fast
    from torch.distributed.elastic.multiprocessing.api import SignalException

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
        env.setdefault("NCCL_DEBUG", "WARN")  # as each rank sets it
    nccl_env = {k: v for k, v in sorted(env.items()) if k.startswith("NCCL_")}

    with tempfile.TemporaryDirectory(prefix="autotune-collectives-") as tmp:
        outdir = Path(tmp)
        try:
            failure = _run_ranks(backend, world, args, outdir)
        except SignalException as exc:  # SIGTERM/SIGINT here: torchrun's agent stopped the ranks
            return 128 + int(exc.sigval)
        if failure is not None:
            print(f"collectives: FAILED: {failure}", file=sys.stderr, flush=True)
            return 1
        files = [outdir / f"rank{r}.json" for r in range(world)]
        missing = [str(i) for i, f in enumerate(files) if not f.exists()]
        if missing:
            print(f"collectives: FAILED: rank(s) {', '.join(missing)} exited 0 without results",
                  file=sys.stderr, flush=True)
            return 1
        per_rank = [json.loads(f.read_text()) for f in files]

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

def _aggregate(
    per_rank: Sequence[dict[str, Any]],
    *,
    backend: str,
    world: int,
    args: argparse.Namespace,
    env: dict[str, str],
    torch_version: str,
) -> dict[str, Any]:
    """The JSON document of the run, from each rank's ``rankR.json``::

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
    """
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


if __name__ == "__main__":
    sys.exit(main())
