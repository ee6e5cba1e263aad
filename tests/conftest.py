"""Fixtures that more than one test module uses, and how pytest-xdist shares the tests out.

Plain helper functions and classes are in :mod:`tests.helpers`; a part a test needs and may not
find (an engine, sshd, chromium, torch) goes through :mod:`tests.needs`.

The README's test command runs the suite on four pytest-xdist workers with ``--dist loadfile``:
each test module runs whole on one worker, so a module-scoped fixture (a study run once, a Ray
cluster, a tiny model, a bare venv) is made once. (``--dist loadgroup`` would share tests out
more finely, but pytest-xdist 3.8 cannot tag pytest 9's node ids with the group: it ran a
module's tests on several workers, each making the module's fixtures again.) A session-scoped
fixture is made once per worker that needs it. Everything a test starts (servers, sshd, Ray
nodes, Chromium) takes a free port and a folder of its own, so that workers never share one.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import pytest

from tests.helpers.sim_study import record_study
from tests.helpers.sshd import Sshd, new_sshd

# The command line's consoles take COLUMNS (else 80) off a terminal: tests read its lines whole, so
# the processes they start get a wide one; the width tests set their own.
os.environ["COLUMNS"] = "200"


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    """One real sshd on 127.0.0.1 for the tests that do not break it (one that does makes its
    own with :func:`tests.helpers.sshd.new_sshd`)."""
    server = new_sshd(tmp_path_factory.mktemp("sshd"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def recorded_study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder of a real study run once per test session (per worker) by ``autotune study
    start`` on the simulated host (``studies.db``, study ``recorded``): trial 0 crashes with an
    NCCL error, trial 1 with an OOM, trial 2 is measured. Copy it before writing to it."""
    return record_study(tmp_path_factory.mktemp("recorded"))
