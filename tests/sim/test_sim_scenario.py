"""Scenario files: built-ins load, bad files are rejected naming the key, user files work."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from autotune.sim import Scenario, ScenarioError, list_scenarios, load_scenario
from autotune.sim.scenario import scenario_descriptions

TINY = Path(__file__).with_name("tiny_scenario.yaml")
BUILTINS = {"rtx6000-pcie-glm5", "rtx6000-pcie-kimi-eagle3", "h200-nvlink-llama70b"}


def test_builtins_listed_and_load() -> None:
    assert BUILTINS <= set(list_scenarios())
    for name in list_scenarios():
        s = load_scenario(name)
        assert isinstance(s, Scenario)
        assert s.name == name
    assert all(len(d.splitlines()) == 1 and d for d in scenario_descriptions().values())


def test_user_scenario_by_path() -> None:
    s = load_scenario(str(TINY))
    assert s.name == "tiny-host" and s.gpu.count == 2 and s.model.draft is None


def _write(tmp_path: Path, data: dict) -> Path:
    p = tmp_path / "foo.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def _tiny() -> dict:
    return yaml.safe_load(TINY.read_text())


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda d: d["gpu"].__setitem__("memory_gb", -1), "scenario foo.yaml: gpu.memory_gb: Input should be greater than 0"),
        (lambda d: d["gpu"].__setitem__("vram", 3), "scenario foo.yaml: gpu.vram: unknown key"),
        (lambda d: d.__setitem__("colour", "red"), "scenario foo.yaml: colour: unknown key"),
        (lambda d: d["interconnect"].__setitem__("kind", "ethernet"), "scenario foo.yaml: interconnect.kind: Input should be 'pcie' or 'nvlink'"),
        (lambda d: d["model"].pop("layers"), "scenario foo.yaml: model.layers: Field required"),
        (lambda d: d.__setitem__("launch_defaults", {"no-such-flag": 1}), "scenario foo.yaml: launch_defaults: Value error, unknown SGLang flag 'no-such-flag'"),
    ],
)
def test_malformed_scenario_names_the_key(tmp_path: Path, change, expected: str) -> None:
    data = _tiny()
    change(data)
    with pytest.raises(ScenarioError) as err:
        load_scenario(str(_write(tmp_path, data)))
    assert str(err.value) == expected
    assert "\n" not in str(err.value)


def test_not_yaml_and_missing(tmp_path: Path) -> None:
    p = tmp_path / "bad.yaml"
    p.write_text("gpu: [unclosed\n")
    with pytest.raises(ScenarioError, match=r"^scenario bad.yaml: not valid YAML"):
        load_scenario(str(p))
    with pytest.raises(ScenarioError, match=r"^scenario nope: no such file or built-in scenario"):
        load_scenario("nope")
