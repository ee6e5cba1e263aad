"""A growing log file read incrementally, watched for failure lines and scheduler signals."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from autotune.outcome.failures import SERVER_PATTERNS, Pattern
from autotune.outcome.load_signals import LoadSignals

__all__ = ["LogWatcher"]


class LogWatcher:
    """Reads a growing log file incrementally: each :meth:`read` costs only what was appended.

    It keeps the last ``limit`` bytes of text (:attr:`text`, joined only when asked for) and,
    as lines arrive, the highest-priority failure pattern seen so far (:attr:`error`) and the
    scheduler's busiest moments (:attr:`signals`), so a server that writes megabytes of log costs
    the poll loop nothing more than reading them.
    """

    def __init__(self, path: Path, patterns: Sequence[Pattern] = SERVER_PATTERNS, limit: int = 8 * 1024 * 1024) -> None:
        self.path = path
        self.patterns = tuple(patterns)
        self._offset = 0
        self._limit = limit
        self._chunks: list[str] = []
        self._size = 0
        self._joined: str | None = ""
        self._pending = ""  # the last line, not yet ended by a newline
        self._best: tuple[int, str, str] | None = None  # (priority, kind, line)
        self.signals = LoadSignals()
        """The scheduler's lines read so far (:mod:`autotune.outcome.load_signals`)."""

    def read(self) -> str:
        """Read what was appended since the last call; returns the new text."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return ""
        if not data:
            return ""
        self._offset += len(data)
        new = data.decode("utf-8", errors="replace")
        self._chunks.append(new)
        self._size += len(new)
        self._joined = None
        if self._size > 2 * self._limit:
            self._chunks = [self.text]
            self._size = len(self._chunks[0])
        lines = (self._pending + new).split("\n")
        self._pending = lines.pop()
        for line in lines:
            self._best = self._better(line, self._best)
            self.signals.observe(line)
        return new

    def _better(self, line: str, best: tuple[int, str, str] | None) -> tuple[int, str, str] | None:
        """``best``, or ``line``'s match if a pattern of higher priority (a lower index) matches it."""
        for prio in range(best[0] if best is not None else len(self.patterns)):
            if self.patterns[prio].regex.search(line):
                return prio, self.patterns[prio].kind, line.strip()
        return best

    @property
    def text(self) -> str:
        """The log read so far (its last ``limit`` characters)."""
        if self._joined is None:
            self._joined = "".join(self._chunks)[-self._limit :]
        return self._joined

    @property
    def error(self) -> tuple[str, str] | None:
        """``(kind, line)`` of the highest-priority failure pattern in the log so far, or None
        (the same choice as :func:`~autotune.outcome.failures.find_error` over the whole text)."""
        best = self._better(self._pending, self._best) if self._pending else self._best
        return None if best is None else (best[1], best[2])
