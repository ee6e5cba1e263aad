"""The modes of the files ``autotune export`` and ``autotune report`` write (through
:func:`autotune.util.files.write_whole`, whole or not at all, with exactly this mode)."""

from __future__ import annotations

FILE_MODE = 0o600
"""A profile or a report: private to the user."""
SH_MODE = 0o700
"""An ``sh`` profile: private, and executable."""
