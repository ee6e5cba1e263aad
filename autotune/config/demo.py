"""The demo study: the GLM-5 TP8 host of the field report, simulated, so it needs no GPU."""

from __future__ import annotations

from typing import Any

DEMO_CONFIG: dict[str, Any] = {
    "name": "demo",
    "target": {
        "engine": "sim",
        "scenario": "rtx6000-pcie-glm5",
        "env": {"NCCL_IB_DISABLE": "1", "NCCL_P2P_LEVEL": "5", "AUTOTUNE_SIM_TIME_SCALE": "300"},
        "ready_timeout_s": 60,
    },
    "space": "sglang_nccl",
    "objective": "quick",
    "baseline": {"mem_fraction_static": 0.92, "NCCL_MIN_NCHANNELS": 8},
    "budget": {"trials": 20},
    "seed": 0,
}
