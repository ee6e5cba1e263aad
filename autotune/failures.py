"""Server log text -> failure kind + excerpt.

Kinds (the configuration's fault, told to the sampler as infeasible):
``not-enough-memory``, ``oom``, ``nccl-error``, ``invalid-argument``, ``startup-timeout``,
``crash`` (died with no recognised error), ``crash-under-load``, ``request-errors``,
``slo-violated``. Kinds that are the infrastructure's fault (FAIL, retried): ``launch-failed``,
``port-busy``, ``host-unreachable``, ``disk-full``, ``log-unwritable``, ``interrupted`` (a signal
stopped the trial), the benchmark command's own failures, and an SSH host's: ``connection-lost``,
``remote-timeout``, ``host-key-unknown``, ``host-key-mismatch``, ``auth-failed``, ``setup-failed``,
``gpu-busy``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Sequence

INFEASIBLE_KINDS = frozenset(
    {
        "not-enough-memory",
        "oom",
        "nccl-error",
        "invalid-argument",
        "startup-timeout",
        "crash",
        "crash-under-load",
        "request-errors",
        "slo-violated",
        "timeout",
    }
)
FAULT_KINDS = frozenset(
    {"launch-failed", "port-busy", "host-unreachable", "benchmark-failed", "benchmark-timeout", "result-unparsed",
     "interrupted", "disk-full", "log-unwritable",
     # SSH hosts (autotune.sshhost)
     "connection-lost", "remote-timeout", "host-key-unknown", "host-key-mismatch", "auth-failed", "setup-failed",
     "gpu-busy"}
)
MEMORY_KINDS = ("oom", "not-enough-memory", "crash-under-load")
"""The failure kinds of memory: a sum crossing a capacity, which no one setting is to blame for
(a message that names a setting there does not say the setting cannot be used)."""


def names_choice(message: str, param: str, value: object) -> bool:
    """Whether a failure's ``message`` names the setting ``param`` = ``value``: the parameter (as
    named, or as its flag ``--param-name``) and the value, each as a word of its own. NCCL says
    which setting it could not use (``No algorithm/protocol available for function AllGather ...
    NCCL_ALGO was set to Tree.``). Words: ``Tree``, not ``Trees``; ``algo``, not ``algorithm``;
    a full stop may follow."""
    said = _says(message, param) or _says(message, "--" + param.replace("_", "-"))
    return said and _says(message, str(value))


def _says(text: str, word: str) -> bool:
    return re.search(rf"(?<![\w.-]){re.escape(word)}(?![\w-])", text) is not None


@dataclass(frozen=True)
class Pattern:
    """A regular expression that, found in a log line, identifies a failure kind."""

    kind: str
    regex: re.Pattern[str]


def pattern(kind: str, regex: str) -> Pattern:
    """A :class:`Pattern` from a regular expression (engine presets add their own)."""
    return Pattern(kind, re.compile(regex))


_p = pattern


# Order matters: the first kind with a match wins (a NCCL allocation failure mentions
# "out of memory" too, but it is NCCL's error).
COMMON_PATTERNS: tuple[Pattern, ...] = (
    _p("not-enough-memory", r"Not enough memory\. Please try to increase --mem-fraction-static"),
    _p("not-enough-memory", r"No available memory for the cache blocks"),
    _p("not-enough-memory", r"is less than desired GPU memory utilization"),
    _p("not-enough-memory", r"larger than the available KV cache memory"),
    # vLLM on CPU: the KV cache (VLLM_CPU_KVCACHE_SPACE GiB, or --gpu-memory-utilization of RAM minus
    # what the process holds) or the memory share asked for at start does not fit in free RAM.
    _p("not-enough-memory", r"Available memory on node \d+ \(.*\) on kv cache allocation is less than requested memory for kv"),
    _p("not-enough-memory", r"Available memory on node \d+ \(.*\) on startup is less than desired CPU memory utilization"),
    _p("nccl-error", r"No algorithm/protocol available for function"),
    _p("nccl-error", r"NCCL error"),
    _p("nccl-error", r"ncclInvalidUsage|ncclUnhandledCudaError|ncclSystemError|ncclInternalError"),
    _p("nccl-error", r"NCCL WARN .*(Failed to CUDA calloc|Cuda failure)"),
    _p("nccl-error", r"DistBackendError"),
    _p("oom", r"Capture cuda graph failed"),
    _p("oom", r"CUDA out of memory|OutOfMemoryError|out of memory"),
    _p("invalid-argument", r": error: (argument|unrecognized arguments|the following arguments are required)"),
    _p("invalid-argument", r"^(ValueError|AssertionError|TypeError): "),
)

# Lines that help a person see what happened even when they name no kind.
NOTABLE = re.compile(r"Error|error|Exception|Traceback|WARN|FAILED|Killed|dead|fatal", re.ASCII)


@dataclass(frozen=True)
class Failure:
    """A classified failure: its kind, the first line that identified it, and a log excerpt."""

    kind: str
    message: str
    excerpt: str
    cause: str | None = None

    @property
    def infeasible(self) -> bool:
        return self.kind in INFEASIBLE_KINDS


def find_error(text: str, patterns: Sequence[Pattern] = COMMON_PATTERNS) -> tuple[str, str, int] | None:
    """The first (by priority) failure pattern found in ``text``: (kind, line, line index)."""
    lines = text.splitlines()
    best: tuple[int, str, str, int] | None = None
    for prio, pat in enumerate(patterns):
        if best is not None and prio >= best[0]:
            break
        for i, line in enumerate(lines):
            if pat.regex.search(line):
                best = (prio, pat.kind, line.strip(), i)
                break
    if best is None:
        return None
    return best[1], best[2], best[3]


def excerpt(text: str, focus: int | None = None, *, tail: int = 25, around: int = 12, max_chars: int = 6000) -> str:
    """The lines worth keeping from a log: around the error line ``focus`` and the last ``tail``.

    Never empty for a non-empty log; at most ``max_chars`` characters (the end is kept).
    """
    lines = text.splitlines()
    if not lines:
        return ""
    keep: set[int] = set(range(max(0, len(lines) - tail), len(lines)))
    if focus is not None:
        keep |= set(range(max(0, focus - around), min(len(lines), focus + around + 1)))
    out: list[str] = []
    prev = -1
    for i in sorted(keep):
        if prev >= 0 and i != prev + 1:
            out.append(f"[... {i - prev - 1} lines ...]")
        out.append(lines[i])
        prev = i
    result = "\n".join(out)
    return result[-max_chars:]


def classify(
    log_text: str,
    *,
    phase: str,
    exit_code: int | None,
    patterns: Iterable[Pattern] = COMMON_PATTERNS,
) -> Failure:
    """Classify why a server failed, from its log, the phase it failed in and its exit code.

    ``phase`` is ``"launching"`` (before ready) or ``"measuring"`` (under load). A failure under
    load is ``crash-under-load`` whatever the log says; the log's kind is kept as ``cause``.
    """
    found = find_error(log_text, tuple(patterns))
    if found is None:
        idx = None
        notable = [i for i, line in enumerate(log_text.splitlines()) if NOTABLE.search(line)]
        if notable:
            idx = notable[0]
        code = "" if exit_code is None else f" with exit code {exit_code}"
        if exit_code in (126, 127):
            return Failure("launch-failed", f"server command could not run{code}", excerpt(log_text, idx))
        kind = "crash-under-load" if phase == "measuring" else "crash"
        return Failure(kind, f"server exited{code} without a recognised error", excerpt(log_text, idx))
    kind, line, idx = found
    if phase == "measuring":
        return Failure("crash-under-load", line, excerpt(log_text, idx), cause=kind)
    return Failure(kind, line, excerpt(log_text, idx))
