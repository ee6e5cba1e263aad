"""Engine presets: how each inference engine is launched, when it is ready, how it fails.

A preset turns the target config into an argv (never a shell string: each template word is
formatted separately, so a value with spaces stays one argument) and says which API the load
generator speaks, which path answers readiness, and where server-side metrics are read.
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass, field
from typing import Literal, Mapping

from autotune.outcome.failures import SERVER_PATTERNS, Pattern


@dataclass(frozen=True)
class EnginePreset:
    """One engine's launch template and behaviour.

    ``template`` is a command line whose words may hold ``{python}``, ``{port}``, ``{host}``,
    ``{model}`` and ``{scenario}``; the trial's flags are appended after it. ``serverless``: no
    server at all, the objective's benchmark command is the trial.
    """

    name: str
    template: str
    api: Literal["openai", "sglang"]
    ready_path: str = "/health"
    default_port: int = 30000
    info_paths: tuple[str, ...] = ()
    serverless: bool = False
    ready_probe: bool = False
    """After the ready path answers 200, also require one tiny completion to succeed (engines that
    set up batching or check flags at the first request, like transformers serve)."""
    patterns: tuple[Pattern, ...] = field(default=SERVER_PATTERNS)
    env: Mapping[str, str] = field(default_factory=dict)
    """Environment every trial's server gets unless the target's ``env`` sets it (vLLM's stats
    line every second instead of every 10, so the scheduler's load shows in a short trial)."""
    package: str | None = None
    """The Python package (its import name) the engine is: its installed version is the engine's
    version where the server does not say it (:func:`autotune.execution.provenance.host_facts`)."""

    def argv(self, *, port: int | str, template: str | None = None, fields: Mapping[str, str] | None = None) -> list[str]:
        """The command (without the trial's flags) for a server listening on ``port``."""
        values = {"python": sys.executable, "port": str(port), "host": "127.0.0.1", "model": "", "scenario": ""}
        values.update({k: v for k, v in (fields or {}).items() if v is not None})
        return [word.format(**values) for word in shlex.split(template or self.template)]


def get_preset(name: str) -> EnginePreset:
    """The preset for an engine name (validated by the config beforehand)."""
    from autotune.engines.registry import PRESETS

    return PRESETS[name]
