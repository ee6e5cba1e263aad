"""Bad input: one line on stderr naming the problem, exit code 2, no traceback, nothing lost."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

GOOD_SPACE = """
name: tiny
parameters:
  mfs: {type: float, low: 0.5, high: 0.95, step: 0.01, flag: --mem-fraction-static, default: 0.85}
"""


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "autotune", *args], cwd=cwd, capture_output=True, text=True, timeout=60)


def _config(tmp: Path, space: str = "tiny.yaml", baseline: str = "{mfs: 0.9}") -> Path:
    (tmp / "tiny.yaml").write_text(GOOD_SPACE)
    cfg = tmp / "study.yaml"
    cfg.write_text(
        f"""
name: t1
target: {{engine: sim, scenario: rtx6000-pcie-glm5, hosts: [local], ready_timeout_s: 30}}
space: {space}
objective: quick
baseline: {baseline}
budget: {{trials: 1}}
storage: sqlite:///{tmp}/t.db
"""
    )
    return cfg


def _assert_one_line(proc: subprocess.CompletedProcess[str], fragment: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert fragment in lines[0], lines[0]


def test_missing_config_file(tmp_path: Path) -> None:
    _assert_one_line(_run(["study", "start", str(tmp_path / "nope.yaml")], tmp_path), "not found")


def test_malformed_yaml(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ntarget: {engine: sim\n  scenario: [\n")
    _assert_one_line(_run(["study", "start", str(bad)], tmp_path), "malformed YAML")


def test_unknown_parameter_type(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    (tmp_path / "tiny.yaml").write_text(GOOD_SPACE.replace("type: float", "type: decimal"))
    _assert_one_line(_run(["study", "start", str(cfg)], tmp_path), "parameters.mfs.type")


def test_inverted_range(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    (tmp_path / "tiny.yaml").write_text(GOOD_SPACE.replace("low: 0.5, high: 0.95", "low: 0.95, high: 0.5"))
    _assert_one_line(_run(["study", "start", str(cfg)], tmp_path), "inverted range")


def test_baseline_outside_range(tmp_path: Path) -> None:
    cfg = _config(tmp_path, baseline="{mfs: 0.99}")
    _assert_one_line(_run(["study", "start", str(cfg)], tmp_path), "mfs=0.99 is outside [0.5, 0.95]")


def test_unknown_config_key(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    cfg.write_text(cfg.read_text() + "colour: blue\n")
    _assert_one_line(_run(["study", "start", str(cfg)], tmp_path), "colour: unknown key")


@pytest.mark.parametrize("command", [["study", "show", "ghost"], ["study", "best", "ghost"], ["export", "ghost", "--format", "sh"]])
def test_study_that_does_not_exist(tmp_path: Path, command: list[str]) -> None:
    proc = _run([*command, "--storage", f"sqlite:///{tmp_path}/empty.db"], tmp_path)
    _assert_one_line(proc, "no study named 'ghost'")


def test_bad_export_format(tmp_path: Path) -> None:
    _assert_one_line(_run(["export", "x", "--format", "toml", "--storage", f"sqlite:///{tmp_path}/e.db"], tmp_path), "--format toml")
