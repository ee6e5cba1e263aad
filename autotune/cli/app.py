"""The ``autotune`` command line: the commands and their order, and :func:`main`, its entry point.

Contracts:

- Commands parse, call and print; each lives in a module of this package by what it does
  (:mod:`~autotune.cli.study_commands`, :mod:`~autotune.cli.service_commands`,
  :mod:`~autotune.cli.show_commands`, :mod:`~autotune.cli.profile_commands`) and is listed here,
  in the order ``--help`` shows it.
- :func:`main` never shows a traceback for bad input: one line on stderr and exit code 2
  (a usage error of the parser, :class:`~autotune.errors.UsageError`,
  :class:`~autotune.errors.ConfigError`); a bare group prints its help and exits 0; Ctrl-C
  outside a study exits 130.
- Files and folders the tool creates are private (umask 077); launched servers keep the user's.
"""

from __future__ import annotations

import re
import sys
from typing import NoReturn

import typer

from autotune.cli import init_command, profile_commands, service_commands, show_commands, study_commands
from autotune.cli.common import fail, set_user_umask
from autotune.errors import ConfigError, UsageError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=None,
                  help="Find the best launch configuration of an LLM inference server, by experiment.")
app.command("init", short_help="Write a starter study config for your own vLLM, SGLang or transformers server.")(
    init_command.init)
study_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None, help="Run and inspect tuning studies.")
app.add_typer(study_app, name="study")

study_app.command("start")(study_commands.study_start)
study_app.command("resume")(study_commands.study_resume)
study_app.command("status")(service_commands.study_status)
study_app.command("stop")(service_commands.study_stop)
study_app.command("list")(show_commands.study_list)
study_app.command("show")(show_commands.study_show)
study_app.command("best", short_help="The best feasible trial of a study (multi-objective: its Pareto front and pick)."
                  )(show_commands.study_best)
study_app.command("explain")(show_commands.study_explain)
study_app.command("ablate", short_help="Which of the best trial's changes earned its gain: each reverted, measured "
                  "again.")(study_commands.study_ablate)

from autotune.bench.cli import app as bench_app  # noqa: E402 - beside the sub-app it joins

app.add_typer(bench_app, name="bench", help="Benchmarks of the tuner itself (no GPU needed).")

try:
    from autotune.sim.cli import app as sim_app

    app.add_typer(sim_app, name="sim", help="The simulated GPU host (no GPU needed).")
except ImportError:  # pragma: no cover - the simulator ships with the package
    pass

app.command("export", short_help="Export the best configuration of a study as a launch profile.")(
    profile_commands.export)
app.command("verify")(profile_commands.verify)
app.command("report")(profile_commands.report)
app.command("dashboard")(service_commands.dashboard)


def _parser_error(exc: Exception) -> NoReturn:
    """Exit as ``autotune`` does for an error of the command-line parser (typer's, which raises
    :class:`typer.TyperException` subclasses): a bare group prints its help and
    exits 0; any other prints one line, with the command's usage when it is a usage error."""
    ctx = getattr(exc, "ctx", None)  # a usage error has the context of the command it is about
    if type(exc).__name__ == "NoArgsIsHelpError":  # by name, as typer tells it apart (typer #1278)
        sys.stdout.write(exc.format_message().rstrip("\n") + "\n")  # type: ignore[attr-defined]
        sys.exit(0)
    usage = ctx.get_usage().removeprefix("Usage: ").strip() if ctx is not None else ""
    usage = re.sub(r"\{([^{}]*)\}", r"\1", usage)  # typer writes a required argument as {NAME}
    fail(exc.format_message() + (f" (usage: {usage})" if usage else ""),  # type: ignore[attr-defined]
         getattr(exc, "exit_code", 2))


def main() -> None:
    """Console entry point: one-line errors with exit code 2 for bad input, never a traceback.

    Files and folders the tool creates are private (umask 077: 0600 and 0700); the servers it
    launches keep the user's umask.
    """
    import os
    import warnings

    set_user_umask(os.umask(0o077))

    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    try:
        rc = app(args=sys.argv[1:], prog_name="autotune", standalone_mode=False)
    except typer.TyperException as exc:  # typer >= 0.26 raises its vendored click's errors
        _parser_error(exc)
    except (typer.Abort, KeyboardInterrupt):
        sys.exit(130)  # Ctrl-C outside a study (a study handles its signals itself)
    except (UsageError, ConfigError) as exc:  # StudyNotFoundError too
        fail(str(exc))
    sys.exit(rc if isinstance(rc, int) else 0)


if __name__ == "__main__":
    main()
