"""Files the user names on the command line: inputs read, outputs written whole.

Contracts:

- :func:`check_input` refuses, before a byte is read, what is not a regular file (a FIFO, a
  device such as ``/dev/zero``, a socket, a folder) or is larger than the limit given: reading
  one would hang or never end.
- :func:`check_output` refuses, before anything is computed, a name that ends in ``/`` (a
  folder's name: ``-o`` takes a file), an existing folder, an existing file that is not a regular
  file (a device such as ``/dev/full``, a FIFO, a socket: never replaced), and a missing folder.
  A symlink at the path is replaced, not followed.
- :func:`write_whole` writes a regular file whole or not at all, with exactly the mode given
  whatever the umask: a private temporary file in the same folder, renamed over the path.

Each refusal is a one-line :class:`~autotune.errors.UsageError` naming the path.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from autotune.errors import UsageError
from autotune.util.text import one_line

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def file_kind(mode: int) -> str:
    """What a ``st_mode`` is, in words ("a regular file", "a FIFO", "a character device", ...)."""
    if stat.S_ISREG(mode):
        return "a regular file"
    return next((words for test, words in _KINDS if test(mode)), "not a regular file")


def check_input(path: str | os.PathLike[str], what: str, max_bytes: int) -> None:
    """Check that ``path`` is a regular file of at most ``max_bytes`` (symlinks followed), without
    opening it.

    Raises:
        UsageError: it does not exist, is not a regular file, or is larger than ``max_bytes``.
    """
    shown = one_line(os.fspath(path))
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise UsageError(f"{what} not found: {shown}") from None
    except OSError as exc:
        raise UsageError(f"cannot read {what} {shown}: {exc.strerror or exc}") from None
    if stat.S_ISDIR(st.st_mode):
        raise UsageError(f"{what} {shown}: is a folder, not a file")
    if not stat.S_ISREG(st.st_mode):
        raise UsageError(f"{what} {shown}: is {file_kind(st.st_mode)}, not a regular file")
    if st.st_size > max_bytes:
        raise UsageError(f"{what} {shown}: {st.st_size} bytes, too large (at most {_size(max_bytes)})")


def _size(n: int) -> str:
    return f"{n // (1024 * 1024)} MiB" if n >= 1024 * 1024 else f"{n // 1024} KiB"


def check_output(path: str | os.PathLike[str], flag: str = "-o") -> Path:
    """Check that a file can be written at ``path`` (see the module docstring) and return it as a
    :class:`~pathlib.Path`.

    Raises:
        UsageError: one line starting with ``flag`` and the path.
    """
    raw = os.fspath(path)
    shown = f"{flag} {one_line(raw)}"
    if not raw:
        raise UsageError(f"{flag}: expected a file name")
    if raw.endswith(os.sep) or raw.endswith("/."):
        raise UsageError(f"{shown}: names a folder; give a file name (e.g. {one_line(raw.rstrip('/.') or '.')}/out)")
    p = Path(raw)
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise UsageError(f"{shown}: cannot look at it: {exc.strerror or exc}") from None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise UsageError(f"{shown}: is a folder; give a file name")
    if st is not None and not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
        raise UsageError(f"{shown}: is {file_kind(st.st_mode)}; only a regular file is written (or created)")
    parent = p.parent
    if not parent.exists():
        raise UsageError(f"{shown}: folder {one_line(str(parent))} does not exist")
    if not parent.is_dir():
        raise UsageError(f"{shown}: {one_line(str(parent))} is not a folder")
    return p


def write_whole(path: str | os.PathLike[str], data: str | bytes, mode: int, flag: str = "-o") -> Path:
    """Write ``data`` (text as UTF-8) to ``path`` with exactly ``mode``, whole or not at all:
    checked by :func:`check_output` first, then a private temporary file in the same folder
    renamed over it (nothing is left behind on failure).

    Raises:
        UsageError: as :func:`check_output`, or the folder cannot be written.
    """
    p = check_output(path, flag)
    shown = f"{flag} {one_line(os.fspath(path))}"
    body = data.encode("utf-8", errors="surrogateescape") if isinstance(data, str) else data
    try:
        fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
    except OSError as exc:
        raise UsageError(f"{shown}: cannot write: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), mode)
            f.write(body)
        check_output(path, flag)  # a device put there since the check is still not replaced
        os.replace(tmp, p)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise UsageError(f"{shown}: cannot write: {exc.strerror}") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return p
