"""The real ``autotune`` command line, run by tests: as a subprocess or in-process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest


def autotune(*args: str, cwd: Path, timeout: float = 240, check: bool = True) -> subprocess.CompletedProcess[str]:
    """``python -m autotune ARGS`` in ``cwd``; with ``check``, a non-zero exit is an AssertionError
    that shows both outputs."""
    proc = subprocess.run([sys.executable, "-m", "autotune", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"autotune {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def show(tmp: Path, name: str) -> dict[str, Any]:
    """``autotune study show NAME --json`` of the study in ``tmp/studies.db``."""
    return json.loads(autotune("study", "show", name, "--json", "--storage", f"sqlite:///{tmp}/studies.db", cwd=tmp).stdout)


def run_in_process(argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> tuple[object, str, str]:
    """Run ``autotune ARGV`` through ``autotune.cli.app.main``; returns (exit code, stdout, stderr)."""
    from autotune.cli import app as cli

    monkeypatch.setattr(sys, "argv", ["autotune", *argv])
    umask = os.umask(0o022)  # main() sets the tool's own umask: give the test process its own back
    os.umask(umask)
    try:
        with pytest.raises(SystemExit) as exited:
            cli.main()
    finally:
        os.umask(umask)
    out = capsys.readouterr()
    return exited.value.code, out.out, out.err


def stop_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process group, then SIGKILL if it has not gone after 10 s."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
