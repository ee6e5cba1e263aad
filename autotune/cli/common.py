"""What the command modules of ``autotune`` share: consoles, common arguments, the error exit.

Contracts:

- ``out`` (stdout) carries what a command answers; ``err`` (stderr) its progress and notes.
  Callers print user data with ``markup=False``: a name or a value is never read as rich markup.
  Their width is the terminal's; off a terminal, ``COLUMNS`` or else 80 (rich's own rule), so a
  piped table fits the width a user asks for. One-line messages are printed with ``soft_wrap``.
- :func:`fail` prints ``autotune: error: MESSAGE`` (:data:`autotune.errors.ERROR_PREFIX`) as one
  line on stderr and exits with the code given (2: bad input).
- :func:`user_umask` is the umask the user ran ``autotune`` with, which the servers it launches
  keep; :func:`autotune.cli.app.main` records it before setting the tool's own (077).
"""

from __future__ import annotations

import json
import sys
from typing import Any, NoReturn

import typer
from rich.console import Console

from autotune.config.study import DEFAULT_STORAGE
from autotune.errors import ERROR_PREFIX

StorageOpt = typer.Option(DEFAULT_STORAGE, "--storage", help="Optuna storage URL.")
NameArg = typer.Argument(..., metavar="NAME", help="The study name.")


def _console(stderr: bool = False) -> Console:
    return Console(stderr=stderr)


out = _console()
err = _console(stderr=True)

_user_umask: int | None = None


def user_umask() -> int | None:
    """The umask the user ran us with (restored for launched servers); None when not run by main()."""
    return _user_umask


def set_user_umask(mask: int | None) -> None:
    """Record the user's umask (:func:`autotune.cli.app.main`, before it sets the tool's own)."""
    global _user_umask
    _user_umask = mask


def print_json(doc: Any) -> None:
    """``doc`` as indented JSON on stdout (anything JSON does not know as its ``str``)."""
    sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")


def fail(message: str, code: int = 2) -> NoReturn:
    """Print ``autotune: error: MESSAGE`` as one line on stderr and exit with ``code``."""
    sys.stderr.write(f"{ERROR_PREFIX} {' '.join(message.split()) or 'invalid input'}\n")
    sys.exit(code)
