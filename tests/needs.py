"""Tests that need a real part which may be missing here: an engine, SGLang's parser, an sshd,
chromium, torch.

Outside CI such a test is skipped with the reason and the install line. Under CI (env var ``CI``
set to anything but empty, 0, false or no) ``.ci/run`` installs every part, so a missing one is a
failure, never a silent skip.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterable
from types import ModuleType
from typing import NoReturn

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def unavailable(why: str) -> NoReturn:
    """Skip with ``why``; under CI, fail with it. In a test, that test; at a test module's top
    level, the whole module (under CI, a collection error)."""
    if in_ci():
        pytest.fail(f"CI is set but a real part the test needs is missing: {why}")
    pytest.skip(why, allow_module_level=True)


def require_modules(modules: Iterable[str], what: str, install: str) -> None:
    """Return if every module can be imported, else :func:`unavailable` naming the missing ones."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        unavailable(f"{what} needs {', '.join(missing)} ({install})")


def import_module(module: str, what: str, install: str) -> ModuleType:
    """``module`` imported, else :func:`unavailable`: ``pytest.importorskip`` that fails under CI.
    At a test module's top level it skips (or, under CI, fails) the whole module."""
    require_modules([module], what, install)
    return importlib.import_module(module)
