"""Executors: where the driver's trials run. ``SerialExecutor`` runs them one at a time here."""

from __future__ import annotations

from typing import Callable

from autotune.runner import TrialResult, TrialRunner, TrialSpec


class SerialExecutor:
    """Runs each trial with one :class:`~autotune.runner.TrialRunner`, in this process."""

    def __init__(self, runner: TrialRunner) -> None:
        self.runner = runner

    def run(self, spec: TrialSpec, on_phase: Callable[[str, str], None]) -> TrialResult:
        return self.runner.run(spec, on_phase)
