"""Small network helpers shared by the package, its benchmarks and its tests."""

from __future__ import annotations

import socket

__all__ = ["free_port"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing is bound to now, chosen by the OS.

    The socket is closed before returning, so another process may take the port before the
    caller binds it; callers that need the port reserved must keep their own socket.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
