"""Live progress of a study on the terminal (rich), or plain lines when output is not a terminal.

Names, parameter values, phases and failure messages are user data: they are always rendered as
:class:`rich.text.Text` (or printed with ``markup=False``), never parsed as rich markup, so a value
such as ``[/x]`` or ``[bold]`` is shown as written and cannot break the display.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import optuna
from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from autotune.runner import TrialResult
from autotune.study_view import TrialView, trial_views


class ConsoleReporter:
    """Shows trial number, phase, elapsed time and best so far; a summary table at the end."""

    def __init__(self, console: Console | None = None, metric: str = "value") -> None:
        self.console = console or Console(stderr=True)
        self.metric = metric
        self.live: Live | None = None
        self.running: dict[int, _Running] = {}
        """The trials in flight (several with a parallel executor), by number."""
        self.study_start = time.monotonic()
        self.best: float | None = None
        self.done = 0
        self.budget: int | None = None
        self.name = ""

    # -- Reporter protocol ----------------------------------------------------------------
    def study_started(self, name: str, done: int, budget: int | None) -> None:
        self.name, self.done, self.budget = name, done, budget
        self.study_start = time.monotonic()
        left = "" if budget is None else f", budget {budget}"
        self.console.print(Text.assemble((f"study {name}", "bold"), f": {done} trials already finished{left}"))
        if self.console.is_terminal:
            self.live = Live(self._status(), console=self.console, refresh_per_second=4, transient=True)
            self.live.start()

    def trial_started(self, number: int, params: dict[str, Any], baseline: bool, slot: str = "") -> None:
        self.running[number] = _Running(time.monotonic(), slot)
        tag = " (baseline)" if baseline else ""
        where = f" on {slot}" if slot and slot != "local" else ""
        shown = " ".join(f"{k}={v}" for k, v in params.items() if v != "unset")
        self.console.print(Text(f"trial {number}{tag}{where}: {shown}", style="dim"))
        self.phase(number, "launching", "")

    def phase(self, number: int, phase: str, detail: str) -> None:
        run = self.running.get(number)
        if run is None:
            run = self.running[number] = _Running(time.monotonic(), "")
        changed = phase != run.phase
        run.phase, run.detail = phase, detail
        if self.live is not None:
            self.live.update(self._status())
        elif changed:
            self.console.print(Text(f"  trial {number}: {phase} ({time.monotonic() - run.start:.1f}s)"))

    def trial_finished(self, result: TrialResult, value: float | None, best: float | None) -> None:
        self.best = best
        self.running.pop(result.number, None)
        if result.outcome != "fault":
            self.done += 1
        took = f"{result.duration_s:.1f}s"
        if result.outcome == "ok":
            line = Text.assemble(f"trial {result.number}: ", ("ok", "green"), f" {self.metric}={value:.4g}  ({took})")
        else:
            kind = result.failure.kind if result.failure else "?"
            msg = (result.failure.message if result.failure else "")[:110]
            style = "yellow" if result.outcome == "infeasible" else "red"
            line = Text.assemble(f"trial {result.number}: ", (f"{result.outcome} {kind}", style), f"  {msg}  ({took})")
        self.console.print(line)
        if self.live is not None:
            self.live.update(self._status())

    def slot_quarantined(self, slot: str, reason: str) -> None:
        self.console.print(Text.assemble(("slot quarantined", "red"), f": {slot}: {reason}"))

    def study_finished(self, study: optuna.Study, reason: str) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None
        maximize = study.direction == optuna.study.StudyDirection.MAXIMIZE
        self.console.print(summary_table(trial_views(study), self.metric, maximize))
        if reason:
            self.console.print(Text(reason))

    # -- rendering ------------------------------------------------------------------------
    def _status(self) -> Text:
        budget = "" if self.budget is None else f"/{self.budget}"
        best = "none yet" if self.best is None else f"{self.best:.4g}"
        now = time.monotonic()
        parts: list[str | tuple[str, str]] = [(f"{self.name} ", "bold"), f"{self.done}{budget} done  "]
        for number, run in sorted(self.running.items()):
            parts += [f"trial {number} ", (run.phase, "cyan"), f" {run.detail}  {now - run.start:.1f}s  "]
        parts.append(f"best {self.metric}: {best}  total {now - self.study_start:.0f}s")
        return Text.assemble(*parts)


@dataclass
class _Running:
    """A trial in flight as the console shows it."""

    start: float
    slot: str
    phase: str = ""
    detail: str = ""


def summary_table(views: list[TrialView], metric: str, maximize: bool = True) -> Table:
    """A table of every trial: number, outcome, value, failure kind, the parameters that differ
    from the baseline's (all of them for the baseline), duration. The best trial is in green."""
    table = Table(title=Text(f"trials ({metric})"), show_lines=False)
    for col in ("#", "outcome", "value", "failure", "parameters (vs baseline)", "time"):
        table.add_column(col, overflow="fold")
    values = [v.value for v in views if v.value is not None]
    best = (max if maximize else min)(values) if values else None
    base = next((v.params for v in views if v.baseline), {})
    for v in views:
        value = "" if v.value is None else f"{v.value:.4g}"
        style = "bold green" if v.value is not None and v.value == best else None
        shown = v.params if v.baseline else {k: p for k, p in v.params.items() if base.get(k) != p}
        params = " ".join(f"{k}={p}" for k, p in shown.items())
        cells = (str(v.number) + (" (baseline)" if v.baseline else ""), v.outcome, value, v.failure_kind or "",
                 params, f"{v.duration_s:.1f}s" if isinstance(v.duration_s, (int, float)) and v.duration_s else "")
        table.add_row(*(Text(str(c)) for c in cells), style=style)  # Text: a value is never markup
    return table
