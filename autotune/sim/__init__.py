"""The simulated GPU host: a scenario-driven model of an SGLang server and a real HTTP server.

``python -m autotune.sim serve --scenario NAME --port P [SGLang flags]`` launches a process that
behaves like ``python -m sglang.launch_server`` on the scenario's host; :func:`predict` computes
what it would do without starting it. This package imports nothing from the rest of autotune.
"""

from __future__ import annotations

from autotune.sim.args import ServerArgs
from autotune.sim.model import OUTCOMES, Prediction, Workload, predict
from autotune.sim.scenario import Scenario, ScenarioError, list_scenarios, load_scenario

__all__ = [
    "OUTCOMES",
    "Prediction",
    "Scenario",
    "ScenarioError",
    "ServerArgs",
    "Workload",
    "list_scenarios",
    "load_scenario",
    "predict",
]
