"""Small network helpers shared by the package, its benchmarks and its tests."""

from __future__ import annotations

import socket
import time
from typing import Callable

import requests

__all__ = ["free_port", "http_ok", "wait_http_ok"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing is bound to now, chosen by the OS.

    The socket is closed before returning, so another process may take the port before the
    caller binds it; callers that need the port reserved must keep their own socket.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def http_ok(url: str, timeout_s: float = 1.0) -> bool:
    """True if ``GET url`` answers 200 within ``timeout_s``; False on any other status or error."""
    try:
        return requests.get(url, timeout=timeout_s).status_code == 200
    except requests.RequestException:
        return False


def wait_http_ok(url: str, timeout_s: float, *, alive: Callable[[], bool] = lambda: True,
                 interval_s: float = 0.2) -> bool:
    """Poll ``url`` until it answers 200 (True), ``alive()`` turns false or ``timeout_s`` passes
    (False): e.g. a server's /health while its process runs."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and alive():
        if http_ok(url):
            return True
        time.sleep(interval_s)
    return False
