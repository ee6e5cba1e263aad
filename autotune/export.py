"""Launch profiles: the best trial's exact env and command, with provenance.

Formats: ``sh`` (a runnable bash script, every value quoted), ``env`` (KEY=value lines for an
env file), ``yaml`` and ``json`` (the whole profile as data).
"""

from __future__ import annotations

import datetime
import json
import shlex
from typing import Any

import yaml

from autotune.study_view import TrialView

FORMATS = ("sh", "env", "yaml", "json")
PORT_FIELD = "{port}"


def profile(study_name: str, metric: str | None, direction: str, best: TrialView, port: int) -> dict[str, Any]:
    """The launch profile as data (the ``json``/``yaml`` formats)."""
    argv = [w.replace(PORT_FIELD, str(port)) for w in (best.argv_template or best.argv)]
    return {
        "study": study_name,
        "trial": best.number,
        "metric": metric,
        "direction": direction,
        "value": best.value,
        "params": best.params,
        "env": best.env,
        "command": argv,
        "command_line": shlex.join(argv),
        "port": port,
        "metrics": best.metrics,
        "exported_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def render(fmt: str, prof: dict[str, Any], template: list[str]) -> str:
    """Render a profile in ``fmt`` (one of :data:`FORMATS`)."""
    if fmt == "json":
        return json.dumps(prof, indent=2) + "\n"
    if fmt == "yaml":
        return yaml.safe_dump(prof, sort_keys=False)
    header = [
        f"autotune launch profile: study {prof['study']}, trial {prof['trial']}",
        f"{prof['metric']} = {prof['value']} ({prof['direction']}), exported {prof['exported_at']}",
        "params: " + " ".join(f"{k}={v}" for k, v in prof["params"].items()),
    ]
    if fmt == "env":
        lines = [f"# {h}" for h in header] + [f"# command: {prof['command_line']}"]
        for k, v in prof["env"].items():
            if "\n" in v:
                raise ValueError(f"env var {k} holds a newline and cannot go in an env file")
            lines.append(f"{k}={v}")
        return "\n".join(lines) + "\n"
    assert fmt == "sh"
    words = []
    for w in template:
        if PORT_FIELD in w:
            parts = w.split(PORT_FIELD)
            words.append('"$PORT"'.join(shlex.quote(p) if p else "" for p in parts))
        else:
            words.append(shlex.quote(w))
    lines = ["#!/usr/bin/env bash"] + [f"# {h}" for h in header] + [
        "set -euo pipefail",
        f'PORT="${{PORT:-{prof["port"]}}}"',
    ]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in prof["env"].items()]
    lines.append('echo "starting server on port $PORT" >&2')
    lines.append("exec " + " ".join(words))
    return "\n".join(lines) + "\n"
