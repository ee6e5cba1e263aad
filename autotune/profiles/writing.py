"""Writing a profile or a report: checked before anything is computed, then written whole.

Contracts:

- :func:`check_output` refuses, as one line (:class:`~autotune.errors.UsageError`), a path that is
  a folder or whose folder is missing, before anything is read or rendered.
- :func:`write_profile` writes a file whole or not at all, with exactly the mode given (0600,
  :data:`FILE_MODE`; 0700 for ``sh``, :data:`SH_MODE`) whatever the umask; a symlink at the
  path is replaced, not followed.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from autotune.errors import UsageError
from autotune.util.text import one_line

FILE_MODE = 0o600
SH_MODE = 0o700


def check_output(path: Path) -> None:
    """Check that a profile can be written at ``path`` (before anything is computed).

    Raises:
        UsageError: ``path`` is a folder, or its folder does not exist or is not a folder.
    """
    shown = one_line(str(path))
    if path.is_dir():
        raise UsageError(f"-o {shown}: is a folder; give a file name")
    parent = path.parent
    if not parent.exists():
        raise UsageError(f"-o {shown}: folder {one_line(str(parent))} does not exist")
    if not parent.is_dir():
        raise UsageError(f"-o {shown}: {one_line(str(parent))} is not a folder")


def write_profile(path: Path, text: str, mode: int) -> None:
    """Write ``text`` to ``path`` with exactly ``mode`` (whatever the umask), whole or not at all:
    a private temporary file in the same folder, renamed over ``path`` (a symlink at ``path`` is
    replaced, not followed).

    Raises:
        UsageError: as :func:`check_output`, or the folder is not writable (nothing is left
            behind).
    """
    check_output(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise UsageError(f"-o {one_line(str(path))}: cannot write: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), mode)
            f.write(text.encode("utf-8", errors="surrogateescape"))
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise UsageError(f"-o {one_line(str(path))}: cannot write: {exc.strerror}") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
