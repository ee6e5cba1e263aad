"""`autotune study ablate` on the simulated host: the gain is attributed to the parameters that
cause it in the scenario's model.

On rtx6000-pcie-glm5 at 192 requests in flight, the model's throughput rises with
NCCL_MIN_NCHANNELS (1 -> 16: about +25%) and with the running-request limit (64 -> 192: about
+65%), while --num-continuous-decode-steps has no effect (`autotune sim predict` shows each).
The study's best changes all three; the ablation must give the first two a clear share and the
third none.
"""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import yaml

from tests.helpers.cli import autotune

PARAMS = {
    "NCCL_MIN_NCHANNELS": {"type": "int", "low": 1, "high": 32, "env": "NCCL_MIN_NCHANNELS", "default": 1},
    "num_continuous_decode_steps": {"type": "int", "low": 1, "high": 8, "flag": "--num-continuous-decode-steps",
                                    "default": 1},
    "max_running_requests": {"type": "int", "low": 32, "high": 512, "flag": "--max-running-requests", "default": 64},
}
BEST = {"NCCL_MIN_NCHANNELS": 16, "num_continuous_decode_steps": 8, "max_running_requests": 192}


def test_ablate_attributes_the_gain_to_the_parameters_that_cause_it(tmp_path: Path) -> None:
    (tmp_path / "space.yaml").write_text(yaml.safe_dump({"name": "abl", "parameters": PARAMS}))
    storage = f"sqlite:///{tmp_path}/a.db"
    (tmp_path / "study.yaml").write_text(yaml.safe_dump({
        "name": "abl",
        "target": {"engine": "sim", "scenario": "rtx6000-pcie-glm5", "ready_timeout_s": 60,
                   "command": "{python} -m autotune.sim serve --scenario {scenario} --host {host} --port {port}"
                              " --mem-fraction-static 0.8",
                   "env": {"AUTOTUNE_SIM_TIME_SCALE": "300"},
                   # Three slots on this machine, run side by side by a local Ray cluster.
                   "host_gpus": 3, "gpus_per_trial": 1},
        "executor": "ray",
        "space": str(tmp_path / "space.yaml"), "objective": "quick", "budget": {"trials": 1},
        # Half the quick load's tokens per request: the same batching effects, in half the time.
        "objective_overrides": {"load": {"output_len": 8, "warmup_prompts": 2}},
        "storage": storage, "seed": 0,
    }))
    autotune("study", "start", str(tmp_path / "study.yaml"), cwd=tmp_path)  # the baseline
    optuna.load_study(study_name="abl", storage=storage).enqueue_trial(BEST)
    autotune("study", "resume", "abl", "--storage", storage, "--trials", "2", cwd=tmp_path)
    # Three repeats: an interval from two is a t-interval with one degree of freedom (12.7 standard
    # errors wide), whose low end a loaded machine's noise pushed below 0 (-0.008) once in a run
    # beside two benchmark processes; with three, 4.3.
    doc = json.loads(autotune("study", "ablate", "abl", "--storage", storage, "--repeats", "3", "--json",
                              cwd=tmp_path, timeout=600).stdout)
    assert doc["best_trial"] == 1 and doc["baseline_trial"] == 0 and doc["gain"] > 0
    rows = {r["parameter"]: r for r in doc["parameters"]}
    assert set(rows) == set(PARAMS)
    assert all(r["measured"] == 3 and not r["failed"] for r in rows.values())
    assert rows["max_running_requests"]["share"] > 0.3 and rows["NCCL_MIN_NCHANNELS"]["share"] > 0.1
    assert rows["max_running_requests"]["share_low"] > 0 and rows["NCCL_MIN_NCHANNELS"]["share_low"] > 0
    no_effect = rows["num_continuous_decode_steps"]
    # The simulator's run-to-run noise (2%) moves a no-effect share by a few percent of the gain.
    assert abs(no_effect["share"]) < 0.2, no_effect
    assert rows["NCCL_MIN_NCHANNELS"]["share"] > no_effect["share"] + 0.1
    # No real part of the gain is claimed for it: its interval's low end is under a tenth of the
    # gain (the causal parameters': above 0.1 and 0.3). On a loaded machine the three slots' runs
    # overlap unevenly, and three repeats have resolved that from 0 both ways: an interval wholly
    # below 0 (share -0.045) and one wholly above it (low end +0.052, in CI beside the README run).
    assert no_effect["share_low"] < 0.1, no_effect
    study = optuna.load_study(study_name="abl", storage=storage)
    assert study.user_attrs["ablation"]["run"] == doc["run"]  # stored with the study ...
    tagged = [t for t in study.trials if t.user_attrs.get("ablation")]
    assert len(tagged) == 15  # ... beside its trials: 3 x (baseline, best, 3 reverts)
    assert len({t.user_attrs["slot"] for t in tagged}) == 3
    # Every server ran at normal CPU priority, not at Ray's worker niceness (15). At 15, beside three
    # busy processes, the gain measured 25 tok/s of 200 and a share's interval ran from -2.4 to +4.7
    # (docs/BENCHMARKS.md, "Ray workers' niceness"); at 0, beside the same, it is what it is alone.
    assert {t.user_attrs["niceness"] for t in study.trials} == {0}
