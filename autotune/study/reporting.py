"""The events a running study reports, as a protocol any display implements.

The driver calls a :class:`Reporter` as the study goes; :class:`autotune.study.progress.ConsoleReporter`
shows them on a terminal, :class:`QuietReporter` drops them. A reporter only shows: it never
changes the study.
"""

from __future__ import annotations

from typing import Any, Protocol

import optuna

from autotune.execution.trial import TrialResult


class Reporter(Protocol):
    """Receives progress events (a live display, or plain lines when not on a terminal)."""

    def study_started(self, name: str, done: int, budget: int | None) -> None: ...
    def trial_started(self, number: int, params: dict[str, Any], baseline: bool, slot: str = "",
                      why: str | None = None) -> None: ...
    def phase(self, number: int, phase: str, detail: str) -> None: ...
    def trial_finished(self, result: TrialResult, value: float | None, best: float | None,
                       moved: str | None = None) -> None: ...
    def trial_skipped(self, number: int, params: dict[str, Any], reason: str) -> None: ...
    def slot_quarantined(self, slot: str, reason: str) -> None: ...
    def note(self, text: str) -> None: ...
    def study_finished(self, study: optuna.Study, reason: str) -> None: ...


class QuietReporter(Reporter):
    """A reporter that shows nothing: the protocol's methods, each doing nothing."""
