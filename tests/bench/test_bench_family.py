"""`autotune bench tuner --generated`: generated hosts run like scenarios and pool into the family's
scores and goals. Real driver, real SQLite storages, real model, at small sizes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.bench.family import family_files, halves, summarize_family
from autotune.bench.study_trace import StudyTrace
from autotune.sim.family import generate
from autotune.sim.scenario import load_scenario


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "autotune", "bench", "tuner", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=600)


def test_family_files_hold_each_seeds_host(tmp_path: Path) -> None:
    paths = family_files([5, 105], tmp_path)
    assert [Path(p).name for p in paths] == ["generated-5.yaml", "generated-105.yaml"]
    assert load_scenario(paths[1]) == generate(105)
    assert halves([5, 105, 250]) == {"development": [5], "held_back": [105], "other": [250]}


def test_the_family_pools_runs_each_over_its_own_hosts_optimum() -> None:
    a = StudyTrace("a.yaml", "autotune", 0, ratio=[0.5, 0.96], seconds=[100.0, 100.0], infeasible=[False, False],
                   driver_s=[0.1, 0.1])
    b = StudyTrace("b.yaml", "autotune", 0, ratio=[0.0, 0.5], seconds=[100.0, 100.0], infeasible=[True, False],
                   driver_s=[0.1, 0.1])
    per = summarize_family([a, b], ["autotune"], 2, {"a.yaml": 8, "b.yaml": 2})
    s = per["autotune"]
    assert s["runs"] == 2 and s["never_90"]["runs"] == 1 and s["trials_to"]["95"]["reached"] == 1
    assert s["gpu_hours_total"]["median"] == pytest.approx((200 * 8 / 3600 + 200 * 2 / 3600) / 2)


@pytest.mark.timeout(900)  # three optima (cached after the first run) and two benchmarks
def test_generated_hosts_run_beside_a_built_in_and_report_the_family(tmp_path: Path) -> None:
    # --optimum-points 300 on the GLM-5 host: the optimum test_bench_tuner.py's report test caches too
    proc = _cli("--generated", "3,104", "--scenario", "rtx6000-pcie-glm5", "--seeds", "1", "--trials", "6",
                "--strategies", "autotune", "--jobs", "1", "--optimum-points", "300", "--scratch", str(tmp_path),
                "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["options"]["generated"] == [3, 104]
    assert {"rtx6000-pcie-glm5", "generated-3", "generated-104"} == set(doc["scenarios"])
    assert "generated, seed 3" in doc["scenarios"]["generated-3"]["description"]
    family = doc["family"]
    assert family["hosts"] == 2 and family["halves"] == {"development": [3], "held_back": [104], "other": []}
    assert family["strategies"]["autotune"]["runs"] == 2  # the built-in's run is not the family's
    assert set(family["goals"]) >= {"never_90_within_40", "infeasible_after_10", "trials_to_95_vs_random"}
    table = _cli("--generated", "3", "--seeds", "1", "--trials", "4", "--strategies", "autotune", "--jobs", "1",
                 "--optimum-points", "300", "--scratch", str(tmp_path), cwd=tmp_path)  # its optimum cached above
    assert table.returncode == 0, table.stderr
    assert "generated-3" in table.stdout and "generated family: 1 hosts" in table.stdout


def test_bad_seeds_exit_2_with_one_line(tmp_path: Path) -> None:
    proc = _cli("--generated", "9-2", cwd=tmp_path)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "--generated" in lines[0] and "9-2" in lines[0], proc.stderr
