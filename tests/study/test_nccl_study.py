"""NCCL-only studies: trials without a server, a real torch.distributed benchmark (gloo on CPU)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from autotune.config.objective import Objective
from tests.helpers.cli import autotune
from tests.needs import import_module

import_module("torch", "an NCCL-only study (its benchmark runs torch.distributed, gloo on CPU)",
              "pip install torch; .ci/run installs the CPU build")


REPO = Path(__file__).resolve().parents[2]


def _nccl_study(tmp: Path, name: str, extra_params: dict[str, Any] | None = None, trials: int = 3) -> Path:
    space = yaml.safe_load((REPO / "search_spaces" / "nccl_only.yaml").read_text())
    space["parameters"].update(extra_params or {})
    (tmp / f"{name}-space.yaml").write_text(yaml.safe_dump(space))
    cfg = tmp / f"{name}.yaml"
    cfg.write_text(yaml.safe_dump({
        "name": name,
        "target": {"engine": "none", "env": {"NCCL_NVLS_ENABLE": "0"}},
        "space": str(tmp / f"{name}-space.yaml"),
        "objective": "nccl_cpu",
        "baseline": {"NCCL_MIN_NCHANNELS": 2},
        "budget": {"trials": trials},
        "storage": f"sqlite:///{tmp}/nccl.db",
        "seed": 3,
    }))
    return cfg


def test_nccl_only_study_measures_collectives_without_a_server(tmp_path: Path) -> None:
    cfg = _nccl_study(tmp_path, "coll", trials=3)
    autotune("study", "start", str(cfg), cwd=tmp_path)
    storage = f"sqlite:///{tmp_path}/nccl.db"
    doc = json.loads(autotune("study", "show", "coll", "--json", "--storage", storage, cwd=tmp_path).stdout)
    assert doc["direction"] == "minimize" and doc["metric"] == "collective_us_per_step" and len(doc["trials"]) == 3
    # The objective is the engine mix's collective time per forward pass, not the 42 KB all-reduce alone.
    (mix,) = [w for w in Objective.load_file("nccl_cpu").weighted if w.name == "collective_us_per_step"]
    assert {m for m, _ in mix.terms} >= {"latency_us@all_reduce@43008", "latency_us@all_reduce@4194304"}
    for t in doc["trials"]:
        assert t["outcome"] == "ok", t["failure"]
        m = t["metrics"]
        assert m["latency_us@all_reduce@43008"] > 0 and m["busbw_gbps@all_gather@1048576"] > 0
        assert t["value"] == pytest.approx(sum(w * m[name] for name, w in mix.terms), rel=1e-4)
        assert m["collective_us_per_step"] == pytest.approx(t["value"], rel=1e-6)
    assert doc["trials"][0]["params"]["NCCL_MIN_NCHANNELS"] == 2
    best = json.loads(autotune("study", "best", "coll", "--json", "--storage", storage, cwd=tmp_path).stdout)
    assert best["value"] == min(t["value"] for t in doc["trials"])


def test_a_benchmark_that_fails_is_infeasible_with_its_own_error(tmp_path: Path) -> None:
    # The trial's flags are appended to the benchmark command; this value is rejected by it.
    bad = {"dtype": {"type": "categorical", "choices": ["float128"], "flag": "--dtype", "default": "float128"}}
    cfg = _nccl_study(tmp_path, "badcoll", bad, trials=1)
    autotune("study", "start", str(cfg), cwd=tmp_path)
    doc = json.loads(autotune("study", "show", "badcoll", "--json", "--storage", f"sqlite:///{tmp_path}/nccl.db", cwd=tmp_path).stdout)
    (t,) = doc["trials"]
    assert t["outcome"] == "infeasible" and t["failure"]["kind"] == "invalid-argument"
    assert "float128" in t["failure"]["excerpt"]


def test_server_study_takes_the_nccl_study_best_as_baseline(tmp_path: Path) -> None:
    cfg = _nccl_study(tmp_path, "seed-nccl", trials=2)
    autotune("study", "start", str(cfg), cwd=tmp_path)
    best = json.loads(autotune("study", "best", "seed-nccl", "--json", "--storage", f"sqlite:///{tmp_path}/nccl.db", cwd=tmp_path).stdout)
    server_cfg = tmp_path / "server.yaml"
    server_cfg.write_text(yaml.safe_dump({
        "name": "server",
        "target": {"engine": "sim", "scenario": "rtx6000-pcie-glm5", "ready_timeout_s": 60},
        "space": "sglang_nccl",
        "objective": "quick",
        "objective_overrides": {"load": {"concurrency": 16, "num_prompts": 32, "input_len": 32, "output_len": 8, "warmup_prompts": 1}},
        "baseline": {"mem_fraction_static": 0.92},
        "baseline_from": {"study": "seed-nccl", "storage": f"sqlite:///{tmp_path}/nccl.db"},
        "budget": {"trials": 1},
        "storage": f"sqlite:///{tmp_path}/server.db",
    }))
    autotune("study", "start", str(server_cfg), cwd=tmp_path)
    doc = json.loads(autotune("study", "show", "server", "--json", "--storage", f"sqlite:///{tmp_path}/server.db", cwd=tmp_path).stdout)
    first = doc["trials"][0]
    assert first["baseline"]
    for key in ("NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS", "NCCL_BUFFSIZE", "NCCL_ALGO", "NCCL_PROTO"):
        assert first["params"][key] == best["params"][key]
    assert first["params"]["mem_fraction_static"] == 0.92
