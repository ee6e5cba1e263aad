"""A launch profile as data (:func:`profile`) and as text (:func:`render`), in :data:`FORMATS`.

Formats: ``sh`` (a runnable bash script, every value quoted), ``env`` (``KEY=value`` lines for
``set -a; source FILE`` in bash, every value quoted), ``yaml`` and ``json`` (the whole profile as
data).

Contracts:

- Run by bash, an ``sh`` profile execs exactly the trial's argv (the port filled in, the
  interpreter replaced: :mod:`autotune.profiles.command`) with exactly its env, less any memory
  back-off the header states; sourced by bash, an ``env`` profile sets exactly that env.
- ``sh`` runs ``"$PYTHON"`` (``PYTHON`` from the environment, default the profile's ``python``);
  the data formats hold ``python`` and the command with it filled in.
- Provenance (header comments for ``sh``/``env``, ``provenance``/``measured``/``memory`` objects
  in the data): engine and version, GPU, driver, NCCL, study, trial, the measured mean with its
  95% interval and count, dates (UTC).
- Secrets are exported as references to be supplied at launch: ``sh`` refuses to start without
  them, ``env`` takes them from the environment, ``yaml``/``json`` list them under ``secrets``.
- ``sh`` and ``env`` are for a person first: the tuned parameters first, each marked with the
  baseline's value where it differs, then the measurement and provenance; the env the parameters
  set (``tuned_env``) before the fixed env of the study's config, each group under its comment.
- Comment lines are safe against any text: control, line-separator and bidi characters in a
  value are shown escaped, so nothing in a value can end a comment. ``sh`` and ``env`` end with
  one compact JSON comment line, :data:`PROFILE_LINE` ``{...}`` (:func:`record`: what
  :func:`autotune.profiles.verify.verify` reads), after everything a person reads.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import shlex
import sys
import textwrap
from collections.abc import Iterable, Mapping
from typing import Any

import yaml

from autotune.errors import UsageError
from autotune.config.secrets import reference
from autotune.profiles.command import (
    DEFAULT_PYTHON,
    command_template,
    display_words,
    fill,
    interpreter_spans,
    missing_secret,
    secret_env,
    secret_names,
    sh_words,
)
from autotune.profiles.measurement import measurement, show_number, show_value
from autotune.store.record import TrialRecord
from autotune.util.text import one_line
from autotune.util.units import unit_of

FORMATS = ("sh", "env", "yaml", "json")
PROFILE_VERSION = 1
"""The version of the profile's data (``autotune_profile``) that this autotune writes and reads."""
PROFILE_LINE = "# autotune-profile: "
"""The last line of ``sh`` and ``env`` profiles: the record :func:`record` keeps, as JSON."""
RECORD_KEYS = ("autotune_profile", "study", "trial", "metric", "unit", "direction", "value", "measured", "port",
               "python", "command_template", "python_words", "env", "secret_env", "secret_args", "verify")
"""What the record line of ``sh`` and ``env`` profiles holds: what ``autotune verify`` reads. The
whole profile (provenance, metrics, memory back-off as data) is the ``json``/``yaml`` formats'."""
_MEASURED_KEYS = ("mean", "count", "interval95")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PLAIN_WORD = re.compile(r"[A-Za-z0-9_./+@%:=,-]+")


def profile(study_name: str, metric: str | None, direction: str, best: TrialRecord, port: int, *,
            python: str = DEFAULT_PYTHON, launch_template: str | None = None, interpreters: Iterable[str] = (),
            measured: dict[str, Any] | None = None, provenance: dict[str, Any] | None = None,
            memory: list[dict[str, Any]] | None = None, verify: dict[str, Any] | None = None,
            warnings: Iterable[str] = (), exported_at: str | None = None, tuned_names: Iterable[str] = (),
            baseline: TrialRecord | None = None) -> dict[str, Any]:
    """The launch profile as data (the ``json``/``yaml`` formats).

    ``env`` and ``command`` hold secrets as references ``${NAME}``; ``secrets`` names them;
    ``command_line`` is the command for a shell (secrets as ``"${NAME}"``). ``command`` has the
    interpreter ``python`` where the trial ran the tuner host's (``launch_template``'s ``{python}``
    fields, ``interpreters``, or the tuner's own); ``command_template`` has ``{port}`` and
    ``{python}`` there instead (``python_words``: the words holding ``{python}``).
    ``exported_at``: the date of the export (default: now, UTC). ``tuned_env``: the env names the
    parameters set (``tuned_names``: the search space's env names and flags, else the parameters'
    names); ``baseline``: the baseline trial's number and parameters, where the study has one.
    """
    raw = list(best.argv_template or best.argv)
    spans = interpreter_spans(raw, launch_template, interpreters)
    template = command_template(raw, spans)
    python_words = sorted(spans)
    argv = fill(template, python_words, port=port, python=python)
    value = best.value
    prof: dict[str, Any] = {
        "autotune_profile": PROFILE_VERSION,
        "study": study_name,
        "trial": best.number,
        "metric": metric,
        "unit": unit_of(metric),
        "direction": direction,
        "value": value,
        "measured": measured or measurement([float(value)] if value is not None else [], [best.number]),
        "provenance": provenance or {},
        "memory": list(memory or []),
        "params": best.params,
        "baseline": None if baseline is None else {"trial": baseline.number, "params": baseline.params},
        "tuned_env": [k for k in best.env if k in {*tuned_names, *best.params}],
        "tuned_flags": list(dict.fromkeys(w.split("=", 1)[0] for w in template
                                          if w.startswith("-") and w.split("=", 1)[0] in set(tuned_names))),
        "python": python,
        "command_line": display_words(argv, best.secret_args),
        "command": argv,
        "env": best.env,
        "port": port,
        "secrets": secret_names(best.env, template, best.secret_env, best.secret_args),
        "metrics": best.metrics,
        "exported_at": exported_at or now_utc(),
        "command_template": template,
        "python_words": python_words,
        "secret_env": secret_env(best.env, best.secret_env),
        "secret_args": {str(i): n for i, n in sorted(best.secret_args.items())},
        "verify": verify or {},
        "warnings": list(warnings),
    }
    prof["warnings"] += _tuner_paths(prof)
    return prof


def _tuner_paths(prof: Mapping[str, Any]) -> list[str]:
    """Where the profile still names the tuner's own virtual environment (a word the user wrote
    into the target's command or env, kept as written): one warning each."""
    if sys.prefix == sys.base_prefix:  # not a virtual environment: its prefix is the system's
        return []
    roots = {sys.prefix, os.path.realpath(sys.prefix)}
    found = [f"command word {i + 1}" for i, w in enumerate(prof["command_template"]) if any(r in w for r in roots)]
    found += [f"env {k}" for k, v in prof["env"].items() if any(r in v for r in roots)]
    return [f"{where} names the tuner's virtual environment {sys.prefix} (as the study's config has it): "
            "it may not exist on the serving host" for where in found]


def render(fmt: str, prof: dict[str, Any], *, with_record: bool = True) -> str:
    """Render a profile (:func:`profile`) in ``fmt`` (one of :data:`FORMATS`); ``with_record``
    False leaves out an ``sh`` profile's last line, the record (:func:`record`) verify reads.

    The command is the profile's ``command_template`` (``{port}`` fields and, in its
    ``python_words``, ``{python}`` fields; the ``sh`` format reads ``$PORT`` and ``$PYTHON``);
    its secrets are the profile's ``secret_env`` and ``secret_args``.

    Raises:
        UsageError: an env name is not a shell identifier (``sh``/``env`` formats).
    """
    if fmt == "json":
        return json.dumps(prof, indent=2) + "\n"
    if fmt == "yaml":
        return yaml.safe_dump(prof, sort_keys=False)
    template = list(prof["command_template"])
    env: dict[str, str] = prof["env"]
    for k in env:
        if not _ENV_NAME.fullmatch(k):
            raise UsageError(f"env var name {json.dumps(k)} is not a shell name and cannot be exported as {fmt}")
    secrets = secret_env(env, prof.get("secret_env") or {})
    args = {int(i): n for i, n in (prof.get("secret_args") or {}).items()}
    python_words = prof.get("python_words") or []
    if fmt == "env":
        lines = _header(prof, fmt) + [f"# command: {one_line(prof['command_line'])}",
                                      "# for bash: set -a; source THIS_FILE; set +a"]
        for heading, keys in _env_groups(prof):
            lines.append(heading)
            for k in keys:
                if k in secrets:
                    lines.append(f"# {k}: a secret, not stored here: export it before sourcing this file")
                    lines.append(f"{k}={reference(secrets[k])}")
                else:
                    lines.append(f"{k}={shlex.quote(env[k])}")
        return "\n".join(lines + [_record_line(prof)]) + "\n"
    if fmt != "sh":
        raise ValueError(f"unknown format {fmt!r}")
    lines = ["#!/usr/bin/env bash"] + _header(prof, fmt) + [
        "set -euo pipefail",
        f'PORT="${{PORT:-{int(prof["port"])}}}"',
    ]
    if python_words:
        py = prof.get("python") or DEFAULT_PYTHON
        if _PLAIN_WORD.fullmatch(py):
            lines.append(f'PYTHON="${{PYTHON:-{py}}}"')
        else:
            lines.append(f'if [ -z "${{PYTHON:-}}" ]; then PYTHON={shlex.quote(py)}; fi')
    for heading, keys in _env_groups(prof):
        lines.append(heading)
        lines += [f'export {k}="{missing_secret(secrets[k])}"' if k in secrets else f"export {k}={shlex.quote(env[k])}"
                  for k in keys]
    words = sh_words(template, args, python_words)
    lines.append('echo "starting server on port $PORT" >&2')
    if prof.get("tuned_flags"):
        lines += [f"# {part}" for part in _wrapped(one_line(f"tuned flags: {' '.join(prof['tuned_flags'])}; "
                                                            "the rest of the command is fixed"))]
    if words:
        lines.append("exec " + " ".join(words))
    return "\n".join(lines + ([_record_line(prof)] if with_record else [])) + "\n"


def _env_groups(prof: Mapping[str, Any]) -> list[tuple[str, list[str]]]:
    """The env in two commented groups: the variables the tuned parameters set, then the fixed
    ones (the study's config, the engine's); an empty group is left out."""
    env: dict[str, str] = prof["env"]
    tuned = set(prof.get("tuned_env") or [])
    groups = [("# tuned: set by the parameters the study chose", [k for k in env if k in tuned]),
              ("# fixed: the study's config, not tuned", [k for k in env if k not in tuned])]
    return [(h, keys) for h, keys in groups if keys]


def record(prof: Mapping[str, Any]) -> dict[str, Any]:
    """What the last line of ``sh`` and ``env`` profiles holds: the keys :data:`RECORD_KEYS` of the
    profile, its measurement as mean, count and interval."""
    out = {k: prof[k] for k in RECORD_KEYS if k in prof}
    if isinstance(out.get("measured"), Mapping):
        out["measured"] = {k: out["measured"][k] for k in _MEASURED_KEYS if k in out["measured"]}
    if isinstance(out.get("verify"), Mapping):  # what verify reads as missing when it is null
        out["verify"] = _without_nulls(out["verify"])
    return out


def _without_nulls(data: Any) -> Any:
    if isinstance(data, Mapping):
        return {k: _without_nulls(v) for k, v in data.items() if v is not None}
    return data


def _record_line(prof: Mapping[str, Any]) -> str:
    return PROFILE_LINE + one_line(json.dumps(record(prof), ensure_ascii=True, separators=(",", ":")))


def _header(prof: Mapping[str, Any], fmt: str) -> list[str]:
    measured = prof.get("measured") or {}
    prov = prof.get("provenance") or {}
    lines = [f"autotune launch profile: study {prof['study']}, trial {prof['trial']}"]
    lines += _tuned_lines(prof)
    if prof.get("objectives"):
        lines.append(", ".join(f"{g['metric']} = {g['value']} ({g['direction']})" for g in prof["objectives"])
                     + f", exported {prof['exported_at']}")
    else:
        unit = f" {prof['unit']}" if prof.get("unit") else ""
        lines.append(f"{prof['metric']} = {show_number(prof['value'])}{unit} ({prof['direction']}), exported {prof['exported_at']}")
    if prof.get("choice"):
        lines.append(f"chosen: {prof['choice']['text']}")
    if prof.get("simpler"):
        lines.append(f"chosen: {prof['simpler']['text']}")
    if measured.get("text"):
        lines.append(f"measured: {measured['text']}")
    if prov:
        lines.append(f"engine: {prov.get('engine', 'unknown')} (version {prov.get('engine_version', 'unknown')}); "
                     f"GPU: {prov.get('gpu', 'unknown')}; driver: {prov.get('driver', 'unknown')}; "
                     f"NCCL: {prov.get('nccl', 'unknown')}")
    for m in prof.get("memory") or []:
        lines.append(f"memory: {m['text']}")
    if prof.get("secrets"):
        lines.append("secrets, not stored here (set them in the environment): " + " ".join(prof["secrets"]))
    if prof.get("python_words") and fmt == "sh":
        lines.append(f"interpreter: $PYTHON, default {prof['python']} (the serving host's Python with the engine); "
                     "to use another: PYTHON=/opt/venv/bin/python bash THIS_FILE")
    elif prof.get("python_words"):
        lines.append(f"interpreter: {prof['python']} (the serving host's Python with the engine; "
                     "put another in its place in the command)")
    for w in prof.get("warnings") or []:
        lines.append(f"warning: {w}")
    return [f"# {part}" for h in lines for part in _wrapped(one_line(h))]


def _wrapped(line: str, width: int = 98) -> list[str]:
    """``line`` in pieces of at most ``width`` characters (comment lines of 100) at spaces (a
    longer word stays whole), the pieces after the first indented two more than it."""
    indent = " " * (len(line) - len(line.lstrip(" ")) + 2)
    return textwrap.wrap(line, width=width, subsequent_indent=indent, break_long_words=False,
                         break_on_hyphens=False, drop_whitespace=True) or [line]


def _tuned_lines(prof: Mapping[str, Any]) -> list[str]:
    """The tuned parameters, one a line: ``params: a=1 b=2`` in one line when the profile knows no
    baseline, else each with the baseline's value where it differs."""
    params: Mapping[str, Any] = prof["params"]
    base = (prof.get("baseline") or {}).get("params")
    if not isinstance(base, Mapping):
        return ["params: " + " ".join(f"{k}={show_value(v)}" for k, v in params.items())]
    changed = [k for k in params if k in base and base[k] != params[k]]
    lines = [f"params: tuned by the study, {len(changed)} of {len(params)} changed from the baseline "
             f"(trial {prof['baseline'].get('trial')}):"]
    lines += [f"  {k}={show_value(params[k])}  (baseline: {show_value(base[k])})" for k in changed]
    same = [k for k in params if k not in changed]
    if same:
        lines.append("  as the baseline: " + " ".join(f"{k}={show_value(params[k])}" for k in same))
    return lines


def now_utc() -> str:
    """Now, in UTC to the second (ISO 8601): the date of an export."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
