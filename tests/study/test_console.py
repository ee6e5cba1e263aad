"""What a person sees while a study runs: a moving clock per running trial, failure messages that
keep their last words, and a summary that fits an 80-column terminal (checked by hand under tmux
at 80x24 too: see docs/usage.md)."""

from __future__ import annotations

import io
import re
from pathlib import Path

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, IntDistribution
from rich.cells import cell_len
from rich.console import Console

from autotune.outcome.failures import Failure
from autotune.study.progress import ConsoleReporter, _LiveStatus, shorten
from autotune.execution.trial import TrialResult

TREE = ("NCCL error in: ProcessGroupNCCL.cpp:3356, invalid usage (run with NCCL_DEBUG=WARN for details), "
        "NCCL version 2.27.3 ncclInvalidUsage: This usually reflects invalid usage of NCCL library. Last error: "
        "Error : no algorithm/protocol available for function AllGather with datatype ncclInt8. "
        "NCCL_ALGO was set to Tree.")


def _study(tmp: Path, n: int = 30) -> optuna.Study:
    study = optuna.create_study(study_name="wide", storage=f"sqlite:///{tmp}/c.db", direction="maximize")
    dists = {"NCCL_MIN_NCHANNELS": IntDistribution(1, 64), "NCCL_ALGO": CategoricalDistribution(["unset", "Tree", "Ring"]),
             "a_very_long_parameter_name_for_a_server_flag": IntDistribution(1, 100000)}
    for i in range(n):
        params = {"NCCL_MIN_NCHANNELS": 1 + i % 64, "NCCL_ALGO": ["unset", "Tree", "Ring"][i % 3],
                  "a_very_long_parameter_name_for_a_server_flag": 1000 * i + 1}
        ok = params["NCCL_ALGO"] != "Tree"
        attrs = {"outcome": "ok" if ok else "infeasible", "feasible": ok, "applied": params, "baseline": i == 0,
                 "failure_kind": None if ok else "nccl-error", "duration_s": 12.5}
        study.add_trial(optuna.trial.create_trial(
            params=params, distributions=dists, user_attrs=attrs,
            value=100.0 + i if ok else None,
            state=optuna.trial.TrialState.COMPLETE if ok else optuna.trial.TrialState.PRUNED))
    return study


def test_the_summary_fits_80_columns_and_shows_the_top_trials(tmp_path: Path) -> None:
    out = io.StringIO()
    reporter = ConsoleReporter(Console(file=out, width=80, force_terminal=False, color_system=None), metric="tok/s")
    reporter.study_finished(_study(tmp_path), "budget reached: 30 trials")
    lines = out.getvalue().splitlines()
    assert max(cell_len(line) for line in lines) <= 80, max(lines, key=cell_len)
    assert len(lines) < 40  # not a row per trial: 30 trials here
    text = out.getvalue()
    assert "129" in text and "(baseline)" in text  # the best trial (value 129) and the baseline
    assert "NCCL_ALGO=Tree" in text  # the crash rule
    assert "20 ok, 10 infeasible (nccl-error 10)" in text
    assert "autotune study show wide" in text


def test_the_summary_and_the_best_fit_an_80x24_screen(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What ``study start`` leaves on the screen: the summary, then the best in brief (the
    table's first row has what it changed; ``study best`` has every parameter), 23 lines at most
    so that the prompt below them fits a 24-row terminal too."""
    from autotune.cli import show_commands as cli

    out = io.StringIO()
    console = Console(file=out, width=80, force_terminal=False, color_system=None)
    study = _study(tmp_path)
    ConsoleReporter(console, metric="tok/s").study_finished(study, "budget reached: 30 trials")
    monkeypatch.setattr(cli, "_out", console)
    cli._print_best(study, "tok/s", brief=True)
    lines = out.getvalue().splitlines()
    assert len(lines) <= 23 and max(cell_len(line) for line in lines) <= 80, out.getvalue()
    assert lines[-4].startswith("best: trial 29 tok/s=129") and "1 measurement, no interval" in lines[-3]
    assert lines[-2].strip() == "every parameter: autotune study best wide"
    assert lines[-1].strip().startswith("export it: autotune export wide")


def test_study_show_at_80_columns_keeps_each_parameter_whole(tmp_path: Path) -> None:
    """``study show``'s table of every trial: at 80 columns its parameters column was 17 wide and
    broke every ``NAME=value`` in two. Failure and parameters share one column that takes the
    width the rest leaves, so each setting of up to 34 characters (the width left here) stays on
    one line."""
    from autotune.study.progress import summary_table
    from autotune.store.study_view import trial_views

    study = _study(tmp_path)
    out = io.StringIO()
    Console(file=out, width=80, force_terminal=False, color_system=None).print(
        summary_table(trial_views(study), "tok/s"))
    text = out.getvalue()
    assert max(cell_len(line) for line in text.splitlines()) <= 80
    for t in study.trials[1:]:
        if t.params["NCCL_MIN_NCHANNELS"] != 1:  # the baseline's
            assert f"NCCL_MIN_NCHANNELS={t.params['NCCL_MIN_NCHANNELS']} " in text, t.number
    assert text.count("nccl-error") == 10  # the failure kind, above the parameters


def test_the_summary_puts_the_best_that_study_best_chooses_first(tmp_path: Path) -> None:
    """x=0.1 was confirmed at 645 (700, then 640 and 650); x=0.2, measured once at 680, reads above
    it by less than the noise, so ``study best`` keeps 0.1 (tests/study/test_confirmation.py). The
    summary agrees: 0.1's row first and in green, 0.2's below it, and the caption says why."""
    study = optuna.create_study(study_name="lucky", storage=f"sqlite:///{tmp_path}/l.db", direction="maximize")
    dist = {"x": optuna.distributions.FloatDistribution(0, 1)}
    for x, value in ((0.0, 500.0), (0.1, 700.0), (0.2, 680.0), (0.1, 640.0), (0.1, 650.0)):
        study.add_trial(optuna.trial.create_trial(params={"x": x}, distributions=dist, value=value, user_attrs={
            "outcome": "ok", "feasible": True, "applied": {"x": x}, "baseline": x == 0.0}))
    out = io.StringIO()
    reporter = ConsoleReporter(Console(file=out, width=80, force_terminal=True, color_system="standard"), metric="tok/s")
    reporter.study_finished(study, "")
    rows = [line for line in out.getvalue().splitlines() if "x=" in line or "(baseline)" in line]
    assert "1,3,4" in rows[0] and "645" in rows[0] and "\x1b[1;32m" in rows[0], rows  # bold green
    assert "680" in rows[1] and "x=0.2" in rows[1] and "32m" not in rows[1], rows
    assert "a single run above it is within the noise" in " ".join(re.sub(r"\x1b\[[0-9;]*m", "", out.getvalue()).split())


def test_a_failure_message_keeps_the_value_that_failed() -> None:
    short = shorten(TREE, 120)
    assert len(short) <= 120 and short.endswith("NCCL_ALGO was set to Tree.") and short.startswith("NCCL error in")
    assert shorten("a  b\nc", 120) == "a b c"
    out = io.StringIO()
    reporter = ConsoleReporter(Console(file=out, width=80, force_terminal=False, color_system=None))
    reporter.trial_finished(TrialResult(3, "infeasible", failure=Failure("nccl-error", TREE, "")), None, None)
    assert "set to Tree" in " ".join(out.getvalue().split())


def test_the_live_line_is_made_afresh_for_each_refresh() -> None:
    """Live redraws its renderable four times a second: it must be computed each time (a Text
    made once froze the clock at 0.0s), with every running trial and its own phase."""
    reporter = ConsoleReporter(Console(file=io.StringIO(), width=80, force_terminal=False))
    reporter.study_started("s", 0, 10)
    reporter.trial_started(0, {"p": 1}, True, "a")
    reporter.trial_started(1, {"p": 2}, False, "b")
    live = _LiveStatus(reporter)
    first = live.__rich__().plain
    reporter.phase(1, "measuring", "10/64 requests")
    second = live.__rich__().plain
    assert "trial 0 launching" in first and "trial 1 launching" in first
    assert "trial 1 measuring 10/64 requests" in second and first != second
    reporter.running[0].start -= 90  # a minute and a half later, the same line says so
    assert "90." in live.__rich__().plain or "91." in live.__rich__().plain


def test_the_live_line_of_one_trial_fits_80_columns_whole() -> None:
    """Done, best and total time first, then the trial's phase and clock: nothing cut at 80."""
    out = io.StringIO()
    reporter = ConsoleReporter(Console(file=out, width=80, force_terminal=True), metric="output_throughput")
    reporter.study_started("demo", 3, 20)
    reporter.best = 634.2
    reporter.trial_started(13, {"p": 1}, False, "")
    reporter.phase(13, "measuring", "140/192 requests")
    line = _LiveStatus(reporter).__rich__()
    assert line.plain.startswith("demo 3/20 done  best 634.2 tok/s  0s  trial 13 ") and line.plain.endswith("s")
    assert "trial 13 measuring 140/192 requests" in line.plain and cell_len(line.plain) <= 80, line.plain


def test_study_list_at_80_columns_shows_each_name_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A study's name is what every other command takes: at 80 columns ``study list`` cut
    ``sglang_nccl-1006`` to ``sglang_nccl-10…``. The name keeps its width; the creation time
    gives way (to the minute, under its date)."""
    from autotune.cli import show_commands as cli

    storage = f"sqlite:///{tmp_path}/l.db"
    for name in ("sglang_nccl-1006", "rtx6000-kimi-seed-1001"):
        study = optuna.create_study(study_name=name, storage=storage, direction="maximize")
        study.set_user_attr("created", "2026-12-05T00:34:56+00:00")
    out = io.StringIO()
    monkeypatch.setattr(cli, "_out", Console(file=out, width=80, force_terminal=False, color_system=None))
    cli.study_list(storage=storage, as_json=False)
    text = out.getvalue()
    assert max(cell_len(line) for line in text.splitlines()) <= 80, text
    assert "sglang_nccl-1006 " in text and "rtx6000-kimi-seed-1001 " in text and "…" not in text, text
    assert "2026-12-05" in text and "00:34 UTC" in text and "00:34:56" not in text


@pytest.mark.parametrize("command", [["study", "show"], ["study", "status"], ["study", "best"]])
def test_piped_output_fits_the_columns_asked_for_with_names_whole(recorded_study: Path, command: list[str]) -> None:
    """Off a terminal the command line honours COLUMNS (else 80): no line wider, and no parameter
    name broken across lines."""
    import os
    import subprocess
    import sys

    storage = f"sqlite:///{recorded_study}/studies.db"
    for columns in (80, 100):
        proc = subprocess.run([sys.executable, "-m", "autotune", *command, "recorded", "--storage", storage],
                              capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": str(columns)})
        assert proc.returncode == 0, proc.stderr
        lines = proc.stdout.splitlines()
        assert lines and max(cell_len(line) for line in lines) <= columns, max(lines, key=cell_len)
        names = set(optuna.load_study(study_name="recorded", storage=storage).trials[0].params)
        shown = [n for n in names if f"{n}=" in proc.stdout]  # each parameter shown is on one line whole
        assert shown or command[1] == "status", proc.stdout
        for name in names - set(shown):
            assert name[: len(name) // 2] + "\n" not in proc.stdout, name


def test_a_trials_live_line_shows_what_it_changes_from_the_baseline() -> None:
    out = io.StringIO()
    base = {"a": 1, "b": "x", "c": "unset"}
    reporter = ConsoleReporter(Console(file=out, width=80, force_terminal=False, color_system=None), baseline=base)
    reporter.trial_started(0, base, True)
    reporter.trial_started(1, {"a": 2, "b": "x", "c": "unset"}, False)
    reporter.trial_started(2, dict(base), False)
    lines = [line for line in out.getvalue().splitlines() if line.startswith("trial")]
    assert lines == ["trial 0 (baseline): a=1 b=x", "trial 1: a=2 (the rest as the baseline)",
                     "trial 2: the baseline's values"]
