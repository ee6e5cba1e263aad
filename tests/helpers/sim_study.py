"""Study configs on the simulated host, and the one real study that several modules read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import yaml

from tests.helpers.cli import autotune

SCENARIO = "rtx6000-pcie-glm5"
SMALL_LOAD = {"load": {"concurrency": 32, "num_prompts": 64, "input_len": 64, "output_len": 16, "warmup_prompts": 2}}
MFS = {"type": "float", "low": 0.5, "high": 0.95, "step": 0.01, "flag": "--mem-fraction-static", "default": 0.92}
MIN_CH = {"type": "int", "low": 1, "high": 32, "env": "NCCL_MIN_NCHANNELS", "default": 8}


def write_study(tmp: Path, name: str, parameters: dict[str, Any], *, baseline: dict[str, Any] | None = None,
                trials: int = 1, overrides: dict[str, Any] | None = None, env: dict[str, str] | None = None) -> Path:
    """A study config ``tmp/NAME.yaml`` (its space beside it) on the simulated GLM-5 host, stored in
    ``tmp/studies.db``."""
    space = tmp / f"{name}-space.yaml"
    space.write_text(yaml.safe_dump({"name": f"{name}-space", "parameters": parameters}))
    cfg = tmp / f"{name}.yaml"
    cfg.write_text(yaml.safe_dump({
        "name": name,
        "target": {"engine": "sim", "scenario": SCENARIO, "ready_timeout_s": 60,
                   # Fixed flags go in the template; SGLang's default request pool does not fit
                   # the GLM-5 host's headroom at mem-fraction-static 0.92.
                   "command": "{python} -m autotune.sim serve --scenario {scenario} --host {host} --port {port}"
                              " --max-running-requests 128",
                   "env": {"NCCL_IB_DISABLE": "1", **(env or {})}},
        "space": str(space),
        "objective": "quick",
        "objective_overrides": overrides if overrides is not None else SMALL_LOAD,
        "baseline": baseline or {},
        "budget": {"trials": trials},
        "storage": f"sqlite:///{tmp}/studies.db",
        "seed": 1,
    }))
    return cfg


# -- the recorded study (the ``recorded_study`` fixture) --------------------------------------------
ALGO = {"type": "categorical", "choices": ["Ring", "Tree"], "env": "NCCL_ALGO", "default": "Ring"}
TREE_NCCL = {"NCCL_ALGO": "Tree", "mem_fraction_static": 0.92}  # NCCL error at start-up on the GLM-5 host
RING_OOM = {"NCCL_ALGO": "Ring", "mem_fraction_static": 0.95}  # no headroom left: torch OOM at start-up
RING_OK = {"NCCL_ALGO": "Ring", "mem_fraction_static": 0.92}  # serves
RECORDED_LOAD = {"load": {"concurrency": 16, "num_prompts": 16, "input_len": 64, "output_len": 16, "warmup_prompts": 0}}
RECORDED = "recorded"


def record_study(folder: Path) -> Path:
    """Run a real study ``recorded`` in ``folder`` (``studies.db``) by ``autotune study start`` on
    the simulated host: trial 0 crashes with an NCCL error, trial 1 with an OOM, trial 2 is
    measured. Returns ``folder``."""
    storage = f"sqlite:///{folder}/studies.db"
    study = optuna.create_study(storage=storage, study_name=RECORDED, direction="maximize")
    for params in (TREE_NCCL, RING_OOM, RING_OK):
        study.enqueue_trial(params)
    cfg = write_study(folder, RECORDED, {"NCCL_ALGO": ALGO, "mem_fraction_static": MFS}, trials=3,
                      overrides=RECORDED_LOAD)
    autotune("study", "start", str(cfg), cwd=folder)
    return folder
