"""SGLang (``python -m sglang.launch_server``) and the simulated host, which is launched the same
way and speaks the same API."""

from __future__ import annotations

from autotune.engines import EnginePreset

SGLANG = EnginePreset(
    name="sglang",
    package="sglang",
    template="{python} -m sglang.launch_server --model-path {model} --host {host} --port {port}",
    api="sglang",
    default_port=30000,
    info_paths=("/get_server_info",),
)

SIM = EnginePreset(
    name="sim",
    template="{python} -m autotune.sim serve --scenario {scenario} --host {host} --port {port}",
    api="sglang",
    default_port=30000,
    info_paths=("/get_server_info",),
)
