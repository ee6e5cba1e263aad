"""Stopping a study on a signal without leaving a server behind.

SIGTERM (``timeout``, systemd, Slurm), SIGHUP (a closed terminal) and SIGINT (Ctrl-C) never
raise in the middle of a storage write or a teardown. :func:`handle_signals` turns them into a
:class:`StopRequest` that the runner polls: the first signal asks the running trial to stop (it is
torn down with the usual grace period and recorded as ``fault``/``interrupted``, its parameters
enqueued again); every later signal asks the teardown to hurry (SIGKILL at once), so a second
Ctrl-C cannot orphan the server either. SIGKILL cannot be caught: the next start or resume of
the study removes what a killed driver left (see :mod:`autotune.study.lease`).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from types import FrameType
from typing import Iterator

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


class StopRequest:
    """A request to stop the study, set by a signal (or by a caller) and polled by the runner.

    ``requested``: stop after tearing down the running trial. ``hurry``: a second request; skip
    the teardown grace period. ``signum`` is the first signal received, or None.
    """

    def __init__(self) -> None:
        self._requested = threading.Event()
        self._hurry = threading.Event()
        self.signum: int | None = None
        self.reason = ""

    @property
    def requested(self) -> bool:
        return self._requested.is_set()

    @property
    def hurry(self) -> bool:
        return self._hurry.is_set()

    def request(self, reason: str, signum: int | None = None) -> None:
        """Ask for a stop; a second call asks for a hurried teardown."""
        if self._requested.is_set():
            self._hurry.set()
            return
        self.signum = signum
        self.reason = reason
        self._requested.set()

    def mirror(self, reason: str, hurry: bool) -> None:
        """Become (at least) what another process's request is: requested with ``reason``, and
        hurried if ``hurry``. Calling it again with the same state does nothing."""
        if reason and not self.requested:
            self.request(reason)
        if hurry and not self.hurry:
            self.request(reason)

    @property
    def exit_code(self) -> int:
        """The shell convention for a process ended by ``signum`` (130 for SIGINT), else 1."""
        return 128 + self.signum if self.signum is not None else 1


@contextlib.contextmanager
def handle_signals(stop: StopRequest) -> Iterator[StopRequest]:
    """Within the block, SIGTERM, SIGHUP and SIGINT call ``stop.request`` instead of killing us.

    Only the main thread can install handlers; elsewhere the block runs with the handlers as
    they are. The previous handlers are restored on exit.
    """
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.request(f"stopped by {signal.Signals(signum).name}", signum)

    previous = {sig: signal.signal(sig, on_signal) for sig in STOP_SIGNALS}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
