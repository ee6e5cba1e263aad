"""Small network helpers shared by the package, its benchmarks and its tests."""

from __future__ import annotations

import socket
from typing import Callable

import requests

from autotune.util.polling import polling

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
    for _ in polling(timeout_s, interval_s):
        if not alive():
            return False
        if http_ok(url):
            return True
    return False
