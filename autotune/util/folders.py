"""Folders a process must be able to write into."""

from __future__ import annotations

import os
from pathlib import Path


def ensure_writable(folder: Path) -> None:
    """Make ``folder`` (and its parents) if missing and write and remove a probe file in it.

    Raises:
        OSError: the folder cannot be made, or a file cannot be written in it.
    """
    folder.mkdir(parents=True, exist_ok=True)
    probe = folder / f".write-probe-{os.getpid()}-{id(folder)}"
    probe.write_bytes(b"")
    probe.unlink()
