"""Live progress of a study on the terminal (rich), or plain lines when output is not a terminal.

Names, parameter values, phases and failure messages are user data: they are always rendered as
:class:`rich.text.Text` (or printed with ``markup=False``), never parsed as rich markup, so a value
such as ``[/x]`` or ``[bold]`` is shown as written and cannot break the display.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import optuna
from rich import box
from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from autotune.analysis.explain import crash_rules
from autotune.config.pareto import Goal
from autotune.execution.trial import TrialResult
from autotune.store.study_view import best_of, is_multi_objective, measured_configs, objectives, pick, trial_views
from autotune.store.record import TrialRecord, counts_text
from autotune.util.text import counted
from autotune.util.versus import versus_text
from autotune.util.units import unit_of, with_unit


MESSAGE_LIMIT = 240
"""A failure message on the console keeps at most this much (its start and its end)."""
TOP_TRIALS = 5
"""How many best trials the end-of-study summary shows."""


class ConsoleReporter:
    """Shows trial number, phase, elapsed time and best so far; a summary table at the end."""

    def __init__(self, console: Console | None = None, metric: str = "value", objectives: Sequence[str] = (),
                 baseline: Mapping[str, Any] | None = None) -> None:
        self.console = console or Console(stderr=True)
        self.baseline = dict(baseline or {})
        """The baseline's parameter values: a trial's line shows only what it changes from them."""
        self.metric = metric
        self.objectives = list(objectives)
        """A multi-objective study's metrics: each finished trial shows them all."""
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
        self.console.print(Text.assemble((f"study {name}", "bold"), f": {counted(done, 'trial')} already finished{left}"))
        if self.console.is_terminal:
            # The renderable is this reporter: Live asks it for a fresh line at every refresh, so
            # the clocks move while a server starts (a Text made once would freeze them).
            self.live = Live(_LiveStatus(self), console=self.console, refresh_per_second=4, transient=True)
            self.live.start()

    def trial_started(self, number: int, params: dict[str, Any], baseline: bool, slot: str = "",
                      why: str | None = None) -> None:
        self.running[number] = _Running(time.monotonic())
        tag = " (baseline)" if baseline else ""
        where = f" on {slot}" if slot and slot != "local" else ""
        if baseline or not self.baseline:
            shown = " ".join(f"{k}={v}" for k, v in params.items() if v != "unset")
        else:  # what it changes from the baseline: ten parameters filled three lines at 80 columns
            changed = {k: v for k, v in params.items() if k in self.baseline and self.baseline[k] != v}
            rest = {k: v for k, v in params.items() if k not in self.baseline and v != "unset"}
            shown = " ".join(f"{k}={v}" for k, v in {**changed, **rest}.items())
            shown = f"{shown} (the rest as the baseline)" if shown else "the baseline's values"
        self.console.print(Text(f"trial {number}{tag}{where}: {shown}", style="dim"))
        if why:  # why the sampler proposed it (a raise the scheduler log called for, a probe, a back-off)
            self.console.print(Text(f"  {why}", style="dim"))
        self.phase(number, "launching", "")

    def phase(self, number: int, phase: str, detail: str) -> None:
        run = self.running.get(number)
        if run is None:
            run = self.running[number] = _Running(time.monotonic())
        changed = phase != run.phase
        run.phase, run.detail = phase, detail
        if self.live is None and changed:
            self.console.print(Text(f"  trial {number}: {phase} ({time.monotonic() - run.start:.1f}s)"))

    def trial_finished(self, result: TrialResult, value: float | None, best: float | None,
                       moved: str | None = None) -> None:
        self.best = best
        self.running.pop(result.number, None)
        if result.outcome != "fault":
            self.done += 1
        took = f"{result.duration_s:.1f}s"
        if result.outcome == "ok" and len(self.objectives) > 1:
            shown = " ".join(f"{m}={result.metrics[m]:.4g}" for m in self.objectives if m in result.metrics)
            line = Text.assemble(f"trial {result.number}: ", ("ok", "green"), f" {shown}  ({took})")
        elif result.outcome == "ok":
            line = Text.assemble(f"trial {result.number}: ", ("ok", "green"),
                                 f" {self.metric}={with_unit(value, self.metric)}  ({took})")
        elif result.outcome == "stopped":
            why = result.early_stop.message if result.early_stop is not None else ""
            line = Text.assemble(f"trial {result.number}: ", ("stopped early", "cyan"), f" {shorten(why, MESSAGE_LIMIT)}  ({took})")
        else:
            kind = result.failure.kind if result.failure else "?"
            msg = shorten(result.failure.message if result.failure else "", MESSAGE_LIMIT)
            style = "yellow" if result.outcome == "infeasible" else "red"
            blame = f" (the {result.failure.blame}'s fault)" if result.failure and result.outcome == "fault" else ""
            line = Text.assemble(f"trial {result.number}: ", (f"{result.outcome} {kind}", style), f"{blame}  {msg}  ({took})")
        self.console.print(line)
        if moved:  # why the best moved: a new best, or a configuration's figure after it was measured again
            self.console.print(Text(f"  {moved}", style="bold" if result.outcome == "ok" else None))

    def trial_skipped(self, number: int, params: dict[str, Any], reason: str) -> None:
        self.console.print(Text.assemble(f"trial {number}: ", ("skipped", "yellow"),
                                         f"  {shorten(reason, MESSAGE_LIMIT)}  (not launched)"))

    def slot_quarantined(self, slot: str, reason: str) -> None:
        self.console.print(Text.assemble(("slot quarantined", "red"), f": {slot}: {reason}"))

    def note(self, text: str) -> None:
        """A warning about the measurements themselves, printed once where it arises."""
        self.console.print(Text.assemble(("note", "yellow"), f": {text}"))

    def study_finished(self, study: optuna.Study, reason: str) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None
        views = trial_views(study)
        if is_multi_objective(study):
            chosen = pick(study, views)
            self.console.print(summary_table([v for v in views if chosen is not None and v.number in chosen.front],
                                             self.metric, goals=objectives(study), front=chosen.front if chosen else (),
                                             chosen=chosen.number if chosen else None, title="Pareto front"))
            if chosen is not None:
                self.console.print(Text(f"chosen: trial {chosen.number} by the rule {chosen.text}"))
        else:
            maximize = study.direction == optuna.study.StudyDirection.MAXIMIZE
            self.console.print(top_table(views, self.metric, maximize))
        for line in outcome_lines(views, crash_rules(study)):  # the rules alone: no importance fit
            self.console.print(line)
        self.console.print(Text(f"every trial: autotune study show {study.study_name}", style="dim"))
        if reason:
            self.console.print(Text(reason))

    # -- rendering ------------------------------------------------------------------------
    def status_line(self) -> Text:
        """The live line: trials done, best so far (with its unit) and the study's time, then each running trial with its
        phase and clock (in an 80-column terminal one trial fits whole; with more in flight the
        line ends in an ellipsis rather than wrap)."""
        budget = "" if self.budget is None else f"/{self.budget}"
        best = "none yet" if self.best is None else with_unit(self.best, self.metric)
        now = time.monotonic()
        parts: list[str | tuple[str, str]] = [(f"{self.name} ", "bold"), f"{self.done}{budget} done  best {best}  "
                                              f"{now - self.study_start:.0f}s"]
        for number, run in sorted(self.running.items()):
            parts += [f"  trial {number} ", (run.phase, "cyan"), f" {run.detail} {now - run.start:.1f}s"]
        line = Text.assemble(*parts)
        line.no_wrap = True
        line.overflow = "ellipsis"
        return line


class _LiveStatus:
    """Renders the reporter's status line afresh each time Live refreshes."""

    def __init__(self, reporter: ConsoleReporter) -> None:
        self.reporter = reporter

    def __rich__(self) -> Text:
        return self.reporter.status_line()


@dataclass
class _Running:
    """A trial in flight as the console shows it."""

    start: float
    phase: str = ""
    detail: str = ""


def shorten(text: str, limit: int) -> str:
    """``text`` on one line, at most ``limit`` characters: the start and the end are kept (where a
    message names the value that failed), the middle gives way to `` ... ``."""
    flat = " ".join(text.split())
    if len(flat) <= limit:
        return flat
    head = (limit - 5) * 2 // 3
    tail = limit - 5 - head
    return f"{flat[:head]} ... {flat[-tail:]}"


def console_table(title: str, **options: Any) -> Table:
    """A table as autotune prints them: a heavy rule under the header and no outer frame (two
    lines and two columns fewer, which an 80x24 terminal needs); ``options`` go to rich's
    :class:`~rich.table.Table`. The title is text, never markup."""
    return Table(title=Text(title), box=box.HEAVY_HEAD, show_edge=False, **options)


def top_table(views: list[TrialRecord], metric: str, maximize: bool = True, top: int = TOP_TRIALS) -> Table:
    """The baseline and the ``top`` best configurations, each by its figure (a configuration
    measured again is the mean of its runs after the first, and shows every trial that measured
    it), with what it changed from the baseline: a table for an 80-column terminal (``study show``
    has every trial). The first row, in green, is the best as ``study best`` chooses it
    (:func:`~autotune.store.study_view.best_of`), the rest by their figures: a configuration measured
    once may read above a confirmed best by less than the noise, and then stands below it."""
    configs = sorted(measured_configs(views), key=lambda m: m.mean, reverse=maximize)
    chosen = best_of(views, maximize)
    first = next((m for m in configs if chosen is not None and chosen.measured is not None
                  and m.trials == chosen.measured.trials), None)
    if first is not None:
        configs = [first, *(m for m in configs if m is not first)]
    base = next((v for v in views if v.baseline), None)
    rows = configs[:top]
    if base is not None and base.value is not None and not any(base.number in m.trials for m in rows):
        rows += [m for m in configs if base.number in m.trials]
    base_value = next((m.mean for m in configs if base is not None and base.number in m.trials), None)
    notes = []
    if any(m.first_excluded for m in rows):
        notes.append("measured again: the mean of the runs after the first")
    sign = 1.0 if maximize else -1.0
    if rows and any(sign * (m.mean - rows[0].mean) > 0 for m in rows[1:]):
        notes.append("first: the best (study best); a single run above it is within the noise")
    unit = unit_of(metric)
    table = console_table(f"best configurations ({metric}{', ' + unit if unit else ''})", expand=False,
                          caption=Text("\n".join(notes)) if notes else None)
    table.add_column("#", no_wrap=True)
    table.add_column("value", justify="right", no_wrap=True)
    table.add_column("vs base", justify="right", no_wrap=True)
    table.add_column("changed from the baseline", overflow="fold", max_width=52)
    for m in rows:
        is_base = base is not None and base.number in m.trials
        ratio = "" if is_base else versus_text(m.mean, base_value, maximize)
        changed = "(baseline)" if is_base else " ".join(
            f"{k}={p}" for k, p in m.params.items() if base is None or base.params.get(k) != p)
        style = "bold green" if m is rows[0] else None
        table.add_row(Text(",".join(map(str, m.trials))), Text(f"{m.mean:.4g}"), Text(ratio), Text(changed), style=style)
    if base is not None and base.value is None:
        table.add_row(Text(str(base.number)), Text("-"), Text(""), Text(f"(baseline: {base.outcome})"))
    return table


def outcome_lines(views: list[TrialRecord], rules: list[str]) -> list[Text]:
    """Counts of outcomes, with the failure kinds of the infeasible ones (``20 trials: 13 ok,
    5 stopped, 2 infeasible (nccl-error 2)``), then the crash rules."""
    lines = [Text(counts_text(views))]
    if rules:
        lines.append(Text("crash rules (autotune study explain):"))
        lines += [Text(f"  {r}") for r in rules]
    return lines


def summary_table(views: list[TrialRecord], metric: str, maximize: bool = True, *, goals: Sequence[Goal] = (),
                  front: Sequence[int] = (), chosen: int | None = None, title: str = "trials") -> Table:
    """A table of every trial: number, outcome, value, then in one column the failure kind (for a
    trial stopped early: where and why) above the parameters that differ from the baseline's (all
    of them for the baseline), and duration. The best configuration's trials
    (:func:`~autotune.store.study_view.best_of`) are in green.

    One column for failure and parameters, and no outer frame: at 80 columns the parameters got
    17 and broke every name in two. Now they get the width the rest leaves (34-35 characters at
    80, by the widths of the number and time columns).

    A multi-objective study (``goals``: two or more): one value column per objective, the trials
    on the Pareto front (``front``) marked, the ``chosen`` one in green."""
    multi = len(goals) > 1
    heading = ", ".join(f"{g.direction} {g.metric}" for g in goals) if multi else metric
    heading += f", {unit_of(metric)}" if not multi and unit_of(metric) else ""
    table = console_table(f"{title} ({heading})")
    value_columns = [g.metric for g in goals] if multi else ["value"]
    table.add_column("#", overflow="fold")
    for col in ("outcome", *value_columns):
        table.add_column(col, no_wrap=True)
    table.add_column("failure / parameters (vs baseline)", overflow="fold", ratio=1)
    table.add_column("time", no_wrap=True)
    chosen_best = None if multi else best_of(views, maximize)
    best = set(chosen_best.measured.trials) if chosen_best is not None and chosen_best.measured else set()
    base = next((v.params for v in views if v.baseline), {})
    on_front = set(front)
    for v in views:
        if multi:
            cells_values = [f"{x:.4g}" for x in v.values] if v.values else [""] * len(goals)
            style = "bold green" if v.number == chosen else None
        else:
            cells_values = ["" if v.value is None else f"{v.value:.4g}"]
            style = "bold green" if v.number in best else None  # every measurement of the best
        shown = v.params if v.baseline else {k: p for k, p in v.params.items() if base.get(k) != p}
        params = " ".join(f"{k}={p}" for k, p in shown.items())
        number = str(v.number) + (" (baseline)" if v.baseline else "") + (" (front)" if v.number in on_front else "")
        failure = v.failure_kind or _stopped(v)
        cells = (number, v.outcome, *cells_values, "\n".join(x for x in (failure, params) if x),
                 f"{v.duration_s:.1f}s" if isinstance(v.duration_s, (int, float)) and v.duration_s else "")
        table.add_row(*(Text(str(c)) for c in cells), style=style)  # Text: a value is never markup
    return table


def _stopped(v: TrialRecord) -> str:
    """Where and why a trial's load stopped early (``at 25%: bound 568 < 604``), else ""."""
    es = v.early_stop
    if v.outcome != "stopped" or not es:
        return ""
    try:
        return f"at {float(es['share']):.0%}: bound {float(es['bound']):.4g} < {float(es['beat']):.4g}"
    except (KeyError, TypeError, ValueError):
        return "stopped early"
