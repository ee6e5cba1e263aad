"""Fixtures for the simulated host: real server processes on loopback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping, Sequence

import pytest
import requests

from autotune.util.net import free_port


@dataclass
class SimProcess:
    """A running ``python -m autotune.sim serve`` and its log file."""

    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text()

    def wait_ready(self, timeout: float = 30.0) -> bool:
        """True once /health answers 200; False if the process exited first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                if requests.get(self.url + "/health", timeout=1).status_code == 200:
                    return True
            except requests.RequestException:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"server not ready after {timeout} s:\n{self.log()}")

    def wait_exit(self, timeout: float = 30.0) -> int:
        return self.proc.wait(timeout=timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


@pytest.fixture
def sim_server(tmp_path: Path) -> Iterator:
    """Factory: ``sim_server(scenario, *flags, env={...}, time_scale=...)`` -> SimProcess."""
    started: list[SimProcess] = []

    def start(scenario: str, *flags: str, env: Mapping[str, str] | None = None,
              time_scale: float = 1000.0, seed: int = 1) -> SimProcess:
        port = free_port()
        log_path = tmp_path / f"sim-{port}.log"
        cmd: Sequence[str] = [sys.executable, "-m", "autotune.sim", "serve", "--scenario", scenario,
                              "--port", str(port), *flags]
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_")}
        full_env.update(AUTOTUNE_SIM_TIME_SCALE=str(time_scale), AUTOTUNE_SIM_SEED=str(seed))
        full_env.update(env or {})
        with open(log_path, "wb") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=full_env,
                                    start_new_session=True)
        sp = SimProcess(proc, port, log_path)
        started.append(sp)
        return sp

    yield start
    for sp in started:
        sp.stop()
