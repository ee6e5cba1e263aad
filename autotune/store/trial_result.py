"""A trial's result as the attributes the study keeps of it.

:func:`result_attrs` is what :func:`autotune.store.record.write_result` stores of a
:class:`~autotune.execution.trial.TrialResult`: metrics and times rounded, the launch as run,
which env names and argv words held secrets, the early stop and the load signals.
:func:`compact_info` cuts the server's info down to what fits a user attribute.
"""

from __future__ import annotations

from typing import Any

from autotune.execution.trial import TrialResult
from autotune.outcome.load_signals import ATTR as SIGNALS_ATTR


def result_attrs(result: TrialResult, applied: dict[str, Any]) -> dict[str, Any]:
    """The user attrs of ``result`` (``applied``: the parameters as launched)."""
    return {
        "metrics": {k: round(v, 4) for k, v in result.metrics.items()},
        "applied": applied,
        "env": result.env,
        "argv": result.argv,
        "argv_template": result.argv_template,
        "port": result.port,
        "host": result.host,
        "startup_s": None if result.startup_s is None else round(result.startup_s, 3),
        "duration_s": round(result.duration_s, 3),
        "server_info": compact_info(result.server_info),
        "secret_env": list(result.secret_env),
        "secret_args": {str(i): n for i, n in sorted(result.secret_args.items())},
        "early_stop": result.early_stop.to_json() if result.early_stop is not None else None,
        SIGNALS_ATTR: result.signals.to_attr() if result.signals is not None else None,
    }


def compact_info(info: dict[str, Any] | None, limit: int = 4000) -> dict[str, Any] | None:
    """Server info small enough for a user attr: scalars only, at most ``limit`` characters, and
    every ``version`` whatever the limit (SGLang puts it after its 500-odd server args; the
    profile's provenance needs it)."""
    if not info:
        return None
    out: dict[str, Any] = {}
    size = 0
    for path, body in info.items():
        if not isinstance(body, dict):
            continue
        for k, v in body.items():
            if isinstance(v, (int, float, str, bool)) or v is None:
                text = f"{k}{v}"
                if size + len(text) > limit and k != "version":
                    continue
                out[f"{path.strip('/')}.{k}"] = v
                size += len(text)
    return out
