"""``autotune verify PROFILE``: launch a profile on this machine and measure it again.

Contracts:

- :func:`load_profile` reads a profile of any format (``sh``/``env`` by their
  ``# autotune-profile:`` line); anything else is one line of
  :class:`~autotune.errors.UsageError`, before anything is launched.
- :func:`verify` runs it as a person would (an ``sh`` profile with ``bash``, ``PORT`` set; the
  others their command and env, secrets from the environment) under the study's objective load
  with the project's runner, tears it down, and compares the mean with the recorded one:
  ``code`` 0 within the tolerance, 1 worse or a failed run. Server logs are kept only to read why.
- The result also says where the new mean falls against the recorded 95% interval
  (``inside_interval``: inside, below, above; None without one), pass or fail.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import shutil
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from autotune.config.secrets import reference
from autotune.errors import UsageError
from autotune.profiles.command import DEFAULT_PYTHON, PORT_FIELD, PYTHON_FIELD, secret_word
from autotune.profiles.formats import PROFILE_LINE, PROFILE_VERSION
from autotune.profiles.measurement import is_number, show_number
from autotune.util.text import counted, one_line


@dataclasses.dataclass
class LoadedProfile:
    """A profile read back: its data, and the ``sh`` script to run when it is one."""

    path: Path
    data: dict[str, Any]
    script: bool


def load_profile(path: Path) -> LoadedProfile:
    """Read a profile of any format (``sh``/``env`` by their ``# autotune-profile:`` line).

    Raises:
        UsageError: one line: the file cannot be read, or is not an autotune launch profile.
    """
    shown = one_line(str(path))
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"{shown}: no such file") from None
    except IsADirectoryError:
        raise UsageError(f"{shown}: is a folder; give a profile file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{shown}: cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    data: Any = None
    line = next((ln for ln in text.splitlines() if ln.startswith(PROFILE_LINE)), None)
    script = False
    try:
        if line is not None:
            data = json.loads(line[len(PROFILE_LINE):])
            script = text.startswith("#!") and "\nexec " in text
        else:
            try:
                data = json.loads(text)
            except ValueError:
                data = yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise UsageError(f"{shown}: not an autotune launch profile: cannot parse it "
                         f"({one_line(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)})") from None
    problem = _profile_problem(data)
    if problem:
        raise UsageError(f"{shown}: not an autotune launch profile: {problem}")
    return LoadedProfile(path, data, script)


def _profile_problem(data: Any) -> str:
    """Why ``data`` cannot be verified, or ""."""
    if not isinstance(data, dict) or "autotune_profile" not in data:
        return "no autotune_profile data (export it again with this version of autotune)"
    if data["autotune_profile"] != PROFILE_VERSION:
        return f"profile version {data['autotune_profile']!r}, this autotune reads {PROFILE_VERSION}"
    tmpl = data.get("command_template")
    if not isinstance(tmpl, list) or not tmpl or not all(isinstance(w, str) for w in tmpl):
        return "command_template: expected a non-empty list of words"
    env = data.get("env")
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        return "env: expected a mapping of text to text"
    if not isinstance(data.get("python_words"), list) or not all(isinstance(i, int) for i in data["python_words"]):
        return "python_words: expected a list of word numbers"
    if data.get("direction") not in ("maximize", "minimize"):
        return "direction: expected maximize or minimize"
    measured = data.get("measured")
    mean = measured.get("mean") if isinstance(measured, dict) else None
    if not is_number(mean) or mean <= 0:  # type: ignore[operator]
        return "measured.mean: expected a positive number (the recorded measurement)"
    v = data.get("verify")
    if not isinstance(v, dict) or not isinstance(v.get("objective"), dict):
        return "verify.objective: missing (what load to measure it under)"
    from autotune.engines.registry import PRESETS

    if v.get("engine") not in PRESETS:
        return f"verify.engine: unknown engine {v.get('engine')!r}"
    if PRESETS[v["engine"]].serverless:
        return f"engine {v['engine']} runs no server: there is nothing to launch"
    for key in ("model", "scenario"):
        if not isinstance(v.get(key) or "", str):
            return f"verify.{key}: expected text"
    if not isinstance(v.get("secrets") or [], list) or not all(isinstance(s, str) for s in v.get("secrets") or []):
        return "verify.secrets: expected a list of env names and flags"
    for key in ("secret_env", "secret_args"):
        if not isinstance(data.get(key, {}), dict):
            return f"{key}: expected a mapping"
    return ""


def _escape(word: str, fields: Iterable[str]) -> str:
    """``word`` as a launch template word: braces doubled except in the given ``{field}``\\ s."""
    parts = [word]
    for f in fields:
        parts = [q for p in parts for q in _split_keep(p, f)]
    return "".join(p if p in fields else p.replace("{", "{{").replace("}", "}}") for p in parts)


def _split_keep(text: str, sep: str) -> list[str]:
    pieces = text.split(sep)
    out: list[str] = []
    for i, p in enumerate(pieces):
        if i:
            out.append(sep)
        out.append(p)
    return out


def _expand_secrets(data: Mapping[str, Any], environ: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """The profile's env and command template with its secrets taken from ``environ``.

    Raises:
        UsageError: a secret is not set (named).
    """
    def value(name: str) -> str:
        v = environ.get(name)
        if not v:
            raise UsageError(f"the profile refers to the secret {name}, which it does not store: "
                             f"set {name} in the environment")
        return v

    env = dict(data["env"])
    for k, name in (data.get("secret_env") or {}).items():
        if env.get(k) == reference(name):
            env[k] = value(name)
    words = list(data["command_template"])
    for i, name in (data.get("secret_args") or {}).items():
        idx = int(i)
        hit = secret_word(words[idx], name) if 0 <= idx < len(words) else None
        if hit is not None:
            words[idx] = hit[0] + value(name)
    return env, words


def verify(path: Path, *, repeats: int = 1, timeout_s: float | None = None, python: str | None = None,
           tolerance: float = 0.10, child_umask: int | None = None,
           say: Callable[[str], None] = lambda line: None, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Launch the profile at ``path`` on this machine ``repeats`` times under the study's
    objective load, measure each run with the project's runner, tear it down, and compare the
    mean with the recorded one.

    An ``sh`` profile runs as a person runs it (``bash PROFILE``, ``PORT`` set); the others run
    their command and env. The interpreter: ``python``, else ``$PYTHON``, else the profile's.

    Returns ``{"ok", "code", "ratio", "measured", "recorded", ...}``: ``code`` 0 when the mean is
    not worse than the recorded one by more than ``tolerance`` (slower for a maximised metric,
    higher for a minimised one), 1 when it is or a run failed (``failure`` says how).

    Raises:
        UsageError: the profile cannot be read or verified (a missing secret, a bad objective).
    """
    from autotune.execution.hosts import LocalHost
    from autotune.execution.trial import TrialSpec
    from autotune.study.build import profile_objective, profile_runner

    environ = os.environ if environ is None else environ
    loaded = load_profile(path)
    data = loaded.data
    objective = profile_objective(data)
    metric = data.get("metric") or objective.metric
    host = LocalHost(child_umask=child_umask)
    chosen_python = python or environ.get("PYTHON") or data.get("python") or DEFAULT_PYTHON
    if loaded.script:
        port: int | None = host.free_port()
        template = "bash " + shlex.quote(_escape(str(path.resolve()), ()))
        env = {"PORT": str(port), **({"PYTHON": python} if python else {})}
        how = f"bash {path}"
    else:
        port = None
        env, words = _expand_secrets(data, environ)
        python_words = set(data["python_words"])
        template = " ".join(shlex.quote(_escape(w, (PORT_FIELD, PYTHON_FIELD) if i in python_words else (PORT_FIELD,)))
                            for i, w in enumerate(words))
        how = "its command"
    log_dir = Path(tempfile.mkdtemp(prefix="autotune-verify-"))  # after every check: nothing left on bad input
    runner = profile_runner(data["verify"], objective, host, log_dir=log_dir, template=template,
                            python=chosen_python, env=env, port=port, timeout_s=timeout_s)
    recorded = data["measured"]
    values: list[float] = []
    failure: dict[str, Any] | None = None
    for i in range(repeats):
        say(f"run {i + 1}/{repeats}: launching {how} (interpreter {chosen_python}) under objective "
            f"{objective.name}, then measuring {metric}")
        result = runner.run(TrialSpec(number=i + 1, env={}, args=[]))
        got = result.metrics.get(metric)
        if result.outcome != "ok" or got is None:
            f = result.failure
            failure = {"run": i + 1, "kind": f.kind if f else "metric-missing",
                       "message": f.message if f else f"{metric} not in the results",
                       "excerpt": f.excerpt if f else "",
                       "log": result.log_path if Path(result.log_path).is_file() else None}
            break
        values.append(float(got))
        say(f"run {i + 1}/{repeats}: {metric} = {show_number(float(got))}")
    doc: dict[str, Any] = {"profile": str(path), "study": data.get("study"), "trial": data.get("trial"),
                           "metric": metric, "direction": data["direction"], "recorded": recorded.get("mean"),
                           "recorded_count": recorded.get("count"), "tolerance": tolerance, "runs": len(values),
                           "values": values, "measured": None, "ratio": None, "failure": failure,
                           "recorded_interval95": _interval(recorded.get("interval95")), "inside_interval": None}
    if failure is not None or not values:
        doc.update(ok=False, code=1)
        keep_logs = failure is not None and failure["log"] is not None
    else:
        mean = sum(values) / len(values)
        ratio = mean / float(recorded["mean"])
        worse = ratio < 1 - tolerance if data["direction"] == "maximize" else ratio > 1 + tolerance
        doc.update(measured=mean, ratio=ratio, ok=not worse, code=1 if worse else 0,
                   inside_interval=inside_interval(mean, doc["recorded_interval95"]))
        keep_logs = worse
    if keep_logs:  # for the person to read why
        doc["log_dir"] = str(log_dir)
    else:
        shutil.rmtree(log_dir, ignore_errors=True)
    return doc


def _interval(value: Any) -> list[float] | None:
    """A recorded ``interval95`` as ``[low, high]``; None where the profile has none (one
    measurement) or it is not two numbers."""
    if isinstance(value, (list, tuple)) and len(value) == 2 and all(is_number(x) for x in value):
        return [float(value[0]), float(value[1])]
    return None


def inside_interval(mean: float, interval: list[float] | None) -> str | None:
    """Where ``mean`` falls against the recorded 95% interval: ``inside``, ``below`` or ``above``;
    None without an interval."""
    if interval is None:
        return None
    lo, hi = interval
    return "below" if mean < lo else "above" if mean > hi else "inside"


def interval_line(doc: Mapping[str, Any]) -> str:
    """The recorded 95% interval and where the new mean falls against it, pass or fail."""
    interval = doc.get("recorded_interval95")
    if interval is None:
        return f"recorded interval: none ({counted(doc['recorded_count'] or 0, 'measurement')} recorded: no spread to judge by)"
    lo, hi = interval
    where = doc.get("inside_interval")
    shown = f"recorded 95% interval [{show_number(lo)}, {show_number(hi)}]"
    if where == "inside":
        return f"{shown}: the new {'mean' if doc['runs'] > 1 else 'run'} is inside it"
    what = "mean" if doc["runs"] > 1 else "run"
    line = f"{shown}: the new {what} is OUTSIDE it ({where} it){', though within the tolerance' if doc['ok'] else ''}"
    if doc["runs"] == 1:
        line += "; the interval is of the recorded mean and one run varies more: --repeats 3 tells a change from noise"
    return line


def verify_lines(doc: Mapping[str, Any]) -> list[str]:
    """A verify result for a person: the verdict against the tolerance, then the recorded 95%
    interval and whether the new mean falls inside it (said even when the run passes)."""
    rec = f"{show_number(doc['recorded'])} recorded ({counted(doc['recorded_count'], 'measurement')})"
    where = f"study {doc['study']} trial {doc['trial']}"
    if doc.get("failure"):
        f = doc["failure"]
        lines = [f"FAILED: run {f['run']} of the profile ({where}) did not measure: {f['kind']}: {one_line(str(f['message']))}"]
        if f.get("log"):
            lines.append(f"server log: {f['log']}")
        return lines
    better = "higher" if doc["direction"] == "maximize" else "lower"
    verdict = "ok" if doc["ok"] else f"WORSE than recorded by more than {100 * doc['tolerance']:.0f}%"
    runs = counted(doc['runs'], 'run')
    line = (f"{doc['metric']}: {show_number(doc['measured'])} measured ({runs}) vs {rec}, {where}: ratio {doc['ratio']:.3f} "
            f"({better} is better, tolerance {100 * doc['tolerance']:.0f}%): {verdict}")
    return [line, interval_line(doc)] + ([f"server logs: {doc['log_dir']}"] if doc.get("log_dir") else [])
