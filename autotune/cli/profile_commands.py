"""``autotune export|verify|report``: what a person takes away from a study.

Contracts:

- ``export`` writes the launch profile of the best trial (of a multi-objective study: the one the
  rule, or ``--choose``, picks; ``--trial N``: that one) in ``--format`` sh, env, yaml or json,
  to stdout or ``-o FILE`` (written whole, mode 0600, 0700 for ``sh``); memory back-offs are
  told on stderr. The output path is checked before anything is read (:mod:`autotune.util.files`:
  only a regular file is written or created; a device, a FIFO, a folder or a name ending in ``/``
  is refused, as for ``report -o``).
- ``verify`` launches a profile on this machine: exit 0 within the tolerance, 1 worse or failed;
  a profile that is not a regular file (a FIFO, ``/dev/zero``) or over 4 MiB is refused unread.
- ``report`` writes one self-contained HTML page (:mod:`autotune.profiles.report`).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from autotune.cli.common import NameArg, StorageOpt, print_json, user_umask
from autotune.cli.common import err as _err
from autotune.cli.common import out as _out
from autotune.errors import UsageError
from autotune.profiles.memory import DEFAULT_MEMORY_MARGIN


def export(
    name: str,
    fmt: str = typer.Option(..., "--format", "-f", help="sh | env | yaml | json"),
    output: Optional[str] = typer.Option(None, "-o", "--output", help="Write to this file (default: stdout); a "
                                         "regular file only, written whole."),
    storage: str = StorageOpt,
    port: Optional[int] = typer.Option(None, "--port", help="Port in the profile (default: the engine's)."),
    python: Optional[str] = typer.Option(None, "--python", metavar="PATH",
                                         help="The serving host's interpreter to bake in (default: python3; "
                                              "PYTHON overrides it at launch)."),
    memory_margin: float = typer.Option(DEFAULT_MEMORY_MARGIN, "--memory-margin", min=0.0, max=1.0,
                                        help="How far below the nearest memory failure the study saw a memory "
                                             "parameter is exported: absolute for fractions, else relative; one "
                                             "grid step at least."),
    choose: Optional[str] = typer.Option(None, "--choose", metavar="RULE",
                                         help="A multi-objective study: the rule that picks from its Pareto front: "
                                              "bound (the objective's, else within 10% of the front's best on every "
                                              "objective after the first), bound:TOLERANCE, knee or first."),
    trial: Optional[int] = typer.Option(None, "--trial", min=0, help="Export this measured trial instead."),
) -> None:
    """Export the best configuration of a study as a launch profile (of a multi-objective study: the
    trial of its Pareto front that the objective's rule, or --choose, picks)."""
    from autotune.profiles.export import from_study
    from autotune.profiles.formats import FORMATS, render
    from autotune.profiles.writing import FILE_MODE, SH_MODE
    from autotune.util.files import check_output, write_whole
    from autotune.config.pareto import ChoiceRule
    from autotune.store.study_view import choice_rule, load_study

    if fmt not in FORMATS:
        raise UsageError(f"--format {fmt}: expected one of {', '.join(FORMATS)}")
    if port is not None and not 1 <= port <= 65535:
        raise UsageError(f"--port {port}: expected a port number between 1 and 65535")
    if python is not None and (not python.strip() or any(c in python for c in "\x00\n\r")):
        raise UsageError("--python: expected the interpreter's name or path on the serving host")
    if output is not None:
        check_output(output)  # before anything is read or rendered
    if choose is not None and trial is not None:
        raise UsageError("give --choose or --trial, not both")
    rule = None
    if choose is not None:
        try:
            rule = ChoiceRule.parse(choose)
        except ValueError as exc:
            raise UsageError(f"--choose: {exc}") from None
    study = load_study(name, storage)
    if rule is not None and choose is not None and choose.strip() == "bound":
        rule = ChoiceRule.parse(choose, default=choice_rule(study))
    prof, best = from_study(study, storage, port=port, python=python, memory_margin=memory_margin, rule=rule,
                            number=trial)
    text = render(fmt, prof)
    changed = [m["text"] for m in prof["memory"] if m["exported"] != m["measured"]]
    if output is None:
        sys.stdout.write(text)
    else:
        write_whole(output, text, SH_MODE if fmt == "sh" else FILE_MODE)
        chosen = f"; chosen: {prof['choice']['text']}" if prof.get("choice") else ""
        _err.print(f"wrote {output} (trial {best.number}, {prof['metric']}={prof['value']:.4g}{chosen})",
                   markup=False, highlight=False, soft_wrap=True)
    for line in changed:
        _err.print(f"memory back-off: {line}", markup=False, highlight=False, soft_wrap=True)


def verify(
    profile_path: Path = typer.Argument(..., metavar="PROFILE", help="A profile written by `autotune export`."),
    repeats: int = typer.Option(1, "--repeats", "--trials", min=1, max=100, help="Launches to measure."),
    timeout: Optional[float] = typer.Option(None, "--timeout", min=1.0,
                                            help="Seconds the server may take to be ready (default: the study's)."),
    tolerance: float = typer.Option(0.10, "--tolerance", min=0.0, max=1.0,
                                    help="How much worse than recorded still passes (0.10: 10%)."),
    python: Optional[str] = typer.Option(None, "--python", metavar="PATH",
                                         help="The interpreter to run the engine with (default: $PYTHON, else "
                                              "the profile's)."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Launch a profile once on this machine under the study's load and compare with what was recorded.

    Exit 0 within the tolerance, 1 when worse (or the launch failed), 2 on bad input.
    """
    from autotune.profiles.verify import verify as verify_profile
    from autotune.profiles.verify import verify_lines
    from autotune.util.files import check_input
    from autotune.util.yaml_files import MAX_FILE_BYTES

    check_input(profile_path, "profile", MAX_FILE_BYTES)  # a FIFO or a device would hang or never end
    doc = verify_profile(profile_path, repeats=repeats, timeout_s=timeout, python=python, tolerance=tolerance,
                         child_umask=user_umask(),
                         say=lambda line: _err.print(line, markup=False, highlight=False, soft_wrap=True))
    if as_json:
        print_json(doc)
    else:
        for line in verify_lines(doc):
            _out.print(line, markup=False, highlight=False, soft_wrap=True)
    if doc["code"]:
        raise typer.Exit(doc["code"])


def report(
    name: str = NameArg,
    output: str = typer.Option(..., "-o", "--output", help="The HTML file to write (a regular file only)."),
    storage: str = StorageOpt,
) -> None:
    """One self-contained HTML page: history, importances, feasibility, crash rules, ablation, best profile."""
    from autotune.profiles.writing import FILE_MODE
    from autotune.util.files import check_output, write_whole
    from autotune.profiles.report import build_report
    from autotune.store.study_view import load_study

    check_output(output)  # before anything is read or rendered
    page = build_report(load_study(name, storage), storage)
    write_whole(output, page, FILE_MODE)
    _err.print(f"wrote {output} ({len(page.encode()) // 1024} KiB)", markup=False, highlight=False)
