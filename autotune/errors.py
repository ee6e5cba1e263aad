"""Errors that the command line turns into a one-line message and exit code 2."""

from __future__ import annotations

ERROR_PREFIX = "autotune: error:"
"""How the command line starts each one-line error on stderr (``autotune: error: MESSAGE``)."""


class UsageError(Exception):
    """Bad input from the user: a missing file, malformed YAML, an invalid value.

    The message is a single line that names the problem; the CLI prints it and exits with 2.
    """


class ConfigError(UsageError):
    """A study config, search space or objective file is missing or invalid."""


class StudyNotFoundError(UsageError):
    """No study of the given name exists in the storage."""
