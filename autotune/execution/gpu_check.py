"""Whose memory is on the GPUs: processes autotune did not start, found before a launch.

A trial's server gets the slot's GPUs (``CUDA_VISIBLE_DEVICES`` in its launch env, see
:mod:`autotune.execution.slots`). Before a launch, after the previous server was torn down, nothing of
ours runs on them, so every compute process there holding more than :data:`FOREIGN_MIB` is
someone else's, and so is memory that ``nvidia-smi`` shows used but lists no process for (a
process in another container). Such a GPU cannot give a configuration a fair trial: the runner
waits for it (:func:`wait_until_free`), then reports ``gpu-busy``, the environment's fault.

The host is asked through a :data:`~autotune.execution.provenance.Runner` (:func:`~autotune.execution.provenance.runner_for`:
a subprocess here, the SSH host's ``run`` there). Where ``nvidia-smi`` is missing or fails (CPU
hosts, CI), nothing is found, after one failed command.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from autotune.execution.provenance import Runner
from autotune.util.polling import wait_until

FOREIGN_MIB = 1024
"""A process (or unlisted memory) holding more than this many MiB of a GPU before our launch is
someone else's; below it, a driver's or a monitor's context."""
GPU_BUSY_WAIT_S = 60.0
"""How long a launch waits for foreign processes to release its GPUs before ``gpu-busy``
(the target's ``gpu_busy_wait_s``)."""
GPU_BUSY_POLL_S = 1.0
"""How often the GPUs are asked again while waiting."""

QUERY_GPUS = ["nvidia-smi", "--query-gpu=index,uuid,memory.total,memory.used", "--format=csv,noheader,nounits"]
QUERY_APPS = ["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory,gpu_uuid",
              "--format=csv,noheader,nounits"]

GpuId = int | str
"""A GPU as ``CUDA_VISIBLE_DEVICES`` names it: its index, or its UUID (``GPU-...``, or a prefix)."""


@dataclass(frozen=True)
class Gpu:
    """One line of :data:`QUERY_GPUS`: the GPU's index, UUID, total and used memory (MiB)."""

    index: int
    uuid: str
    total_mib: int
    used_mib: int


@dataclass(frozen=True)
class ComputeApp:
    """One line of :data:`QUERY_APPS`: a process, its name, the MiB it holds and on which GPU."""

    pid: int
    name: str
    used_mib: int
    gpu_uuid: str


@dataclass(frozen=True)
class Holder:
    """Memory on GPU ``gpu`` (its index) held by someone else: process ``pid`` (``name``), or,
    with ``pid`` None, memory no listed process accounts for."""

    gpu: int
    mib: int
    pid: int | None = None
    name: str = ""

    def describe(self) -> str:
        """``pid 2921 (python3) 136.5 GiB``, or ``12.0 GiB no process is listed for``."""
        if self.pid is None:
            return f"{gib(self.mib)} no process is listed for (another container's?)"
        return f"pid {self.pid} ({self.name or '?'}) {gib(self.mib)}"


def gib(mib: int) -> str:
    """``136.5 GiB`` for 139776 MiB."""
    return f"{mib / 1024:.1f} GiB"


# -- parsing ----------------------------------------------------------------------------------
def _cells(text: str, count: int) -> list[list[str]]:
    """The lines of a ``--format=csv,noheader`` answer with at least ``count`` cells, each cut
    into ``count`` stripped cells (the second takes any extra commas: a process name may hold
    some); others (blank lines, ``No devices were found``) are skipped."""
    rows = []
    for line in text.splitlines():
        first, _, rest = line.partition(",")
        cells = [first, *rest.rsplit(",", count - 2)] if rest else [first]
        if len(cells) >= count:
            rows.append([c.strip() for c in cells])
    return rows


def _int(text: str) -> int | None:
    """``text`` as an integer (``123``, ``123.0``), None for ``[N/A]`` and the like."""
    try:
        return int(float(text))
    except (ValueError, OverflowError):
        return None


def parse_gpus(text: str) -> list[Gpu]:
    """The GPUs of :data:`QUERY_GPUS`'s answer; a line with a value that is not a number
    (``[N/A]``) is skipped."""
    gpus = []
    for index, uuid, total, used in _cells(text, 4):
        i, t, u = _int(index), _int(total), _int(used)
        if i is not None and t is not None and u is not None:
            gpus.append(Gpu(i, uuid, t, u))
    return gpus


def parse_compute_apps(text: str) -> list[ComputeApp]:
    """The processes of :data:`QUERY_APPS`'s answer. The name is everything between the pid and
    the last two cells (it may hold commas); a line whose pid or memory is not a number
    (``[N/A]``, ``[Insufficient Permissions]``) is skipped."""
    apps = []
    for pid_text, name, used_text, uuid in _cells(text, 4):
        pid, used = _int(pid_text), _int(used_text)
        if pid is not None and used is not None:
            apps.append(ComputeApp(pid, name, used, uuid))
    return apps


def visible_gpus(env: Mapping[str, str]) -> tuple[GpuId, ...] | None:
    """The GPUs ``CUDA_VISIBLE_DEVICES`` in ``env`` gives a server: indices and UUIDs, in order,
    up to the first entry CUDA would stop at; None where it is not set (every GPU)."""
    value = env.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    out: list[GpuId] = []
    for word in (w.strip() for w in value.split(",")):
        if word.isdigit():
            out.append(int(word))
        elif word.startswith(("GPU-", "MIG-")):
            out.append(word)
        else:
            break  # CUDA ignores this entry and every one after it
    return tuple(out)


def _selected(gpu: Gpu, gpus: Sequence[GpuId] | None) -> bool:
    if gpus is None:
        return True
    return any(g == gpu.index if isinstance(g, int) else gpu.uuid.startswith(g) for g in gpus)


# -- the check --------------------------------------------------------------------------------
def _safe(run: Runner, argv: list[str]) -> str | None:
    try:
        out = run(argv)
    except Exception:  # noqa: BLE001 - a GPU we cannot ask is one we do not judge
        return None
    return out if isinstance(out, str) else None


def foreign_holders(run: Runner, gpus: Sequence[GpuId] | None = None, *, min_mib: int = FOREIGN_MIB) -> list[Holder]:
    """Who holds more than ``min_mib`` of ``gpus`` (indices or UUIDs; None: every GPU) on the host
    ``run`` reaches, as the GPUs and their processes are now.

    Call it only while nothing of ours runs on those GPUs (before a launch, after a teardown):
    every holder found is then someone else's. Returns one :class:`Holder` per (process, GPU),
    plus one per GPU whose used memory no listed process accounts for, largest first; empty
    where ``nvidia-smi`` is missing or fails. ``nvidia-smi`` is asked for the processes only
    where a GPU's used memory is over ``min_mib``. Never raises.
    """
    out = _safe(run, QUERY_GPUS)
    mine = [g for g in parse_gpus(out or "") if _selected(g, gpus)]
    if not any(g.used_mib > min_mib for g in mine):
        return []
    apps = parse_compute_apps(_safe(run, QUERY_APPS) or "")
    found: list[Holder] = []
    for gpu in mine:
        here = [a for a in apps if a.gpu_uuid == gpu.uuid]
        found += [Holder(gpu.index, a.used_mib, a.pid, a.name) for a in here if a.used_mib > min_mib]
        unlisted = gpu.used_mib - sum(a.used_mib for a in here)
        if unlisted > min_mib:
            found.append(Holder(gpu.index, unlisted))
    return sorted(found, key=lambda h: (-h.mib, h.gpu))


def wait_until_free(run: Runner, gpus: Sequence[GpuId] | None, *, wait_s: float = GPU_BUSY_WAIT_S,
                    poll_s: float = GPU_BUSY_POLL_S, stopped: Callable[[], bool] = lambda: False,
                    step_s: float = 0.1) -> list[Holder]:
    """:func:`foreign_holders` of ``gpus``, asked again every ``poll_s`` while any are found, for
    up to ``wait_s`` seconds. Returns the holders still there when the time is up (empty: the
    GPUs are free), or the last ones found as soon as ``stopped()`` turns true (checked every
    ``step_s``)."""
    deadline = time.monotonic() + wait_s
    while True:
        holders = foreign_holders(run, gpus)
        left = deadline - time.monotonic()
        if not holders or left <= 0 or wait_until(stopped, min(poll_s, left), step_s):
            return holders


def describe(holders: Sequence[Holder]) -> str:
    """One line per GPU, joined: ``GPU 0 holds 136.5 GiB in processes autotune did not start:
    pid 2921 (python3) 136.5 GiB``; GPUs in index order."""
    parts = []
    for index in sorted({h.gpu for h in holders}):
        here = [h for h in holders if h.gpu == index]
        total = sum(h.mib for h in here)
        parts.append(f"GPU {index} holds {gib(total)} in processes autotune did not start: "
                     + ", ".join(h.describe() for h in here))
    return "; ".join(parts)


def busy_note(run: Runner, env: Mapping[str, str], where: str, wait_s: float) -> str | None:
    """A line for the console when the GPUs ``env`` gives a server (``CUDA_VISIBLE_DEVICES``) on
    the host ``run`` reaches are held by processes autotune did not start; None when they are free."""
    holders = foreign_holders(run, visible_gpus(env))
    if not holders:
        return None
    return (f"note: on {where}, {describe(holders)}; each launch waits up to {wait_s:g} s for them "
            "(target.gpu_busy_wait_s), then records a gpu-busy fault, not the configuration's")
