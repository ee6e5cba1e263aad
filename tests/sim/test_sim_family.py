"""The generated family of hosts: deterministic, varied, served, and loadable by `autotune sim`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autotune.sim.args import ServerArgs
from autotune.sim.cli import app
from autotune.sim.family import DEVELOPMENT, HELD_BACK, generate, generate_sibling, parse_seeds, to_yaml
from autotune.sim.model import Workload, predict
from autotune.sim.scenario import load_scenario, parse_scenario

runner = CliRunner()
SEEDS = range(0, 60)


def test_the_same_seed_gives_the_same_host_and_the_file_reads_back() -> None:
    a, b = generate(7), generate(7)
    assert a == b and a.name == "generated-7"
    assert parse_scenario(to_yaml(a), "generated-7.yaml") == a
    assert generate(8) != a


def test_the_family_varies_what_the_issue_names() -> None:
    hosts = [generate(s) for s in SEEDS]
    assert {h.gpu.count for h in hosts} == {2, 4, 8}
    assert len({h.gpu.memory_gb for h in hosts}) >= 5
    kinds = {(h.interconnect.kind, h.interconnect.p2p) for h in hosts}
    assert kinds == {("nvlink", True), ("pcie", True), ("pcie", False)}
    assert {h.model.moe for h in hosts} == {True, False}
    assert any(h.model.draft is None for h in hosts) and any(h.model.draft is not None for h in hosts)
    shares = [h.model.weights_gb / h.gpu.memory_gb for h in hosts]
    assert min(shares) < 0.2 and max(shares) > 0.5  # weights, and so the memory boundaries, in different places
    assert any("mem-fraction-static" in h.launch_defaults for h in hosts)


def test_speculation_helps_on_some_hosts_and_hurts_on_others() -> None:
    """At the quick objective's load, on the hosts with a draft model: the best of a small grid
    with EAGLE against the best without."""
    load = Workload(concurrency=192, num_prompts=192, input_len=64, output_len=16)
    helps = hurts = 0
    for seed in SEEDS:
        host = generate(seed)
        if host.model.draft is None:
            continue
        best = {}
        for draft in (None, 2, 3, 4):
            spec = {} if draft is None else {"speculative_algorithm": "EAGLE3", "speculative_num_draft_tokens": draft,
                                             "speculative_num_steps": draft - 1, "speculative_eagle_topk": 1}
            values = [predict(host, ServerArgs(mem_fraction_static=f, max_running_requests=r, **spec), {}, load)
                      for f in (0.6, 0.85) for r in (32, 128)]
            best[draft] = max(p.output_throughput for p in values)
        if best[None] == 0:
            continue
        with_draft = max(best[d] for d in (2, 3, 4))
        helps += with_draft > best[None] * 1.02
        hurts += with_draft < best[None] * 0.95
    assert helps >= 2 and hurts >= 10, (helps, hurts)


@pytest.mark.parametrize("seed", [0, 3, 57, 150])
def test_every_host_serves_at_some_memory_fraction(seed: int) -> None:
    host = generate(seed)
    small = Workload(concurrency=8, num_prompts=8, input_len=64, output_len=16)
    outcomes = [predict(host, ServerArgs(mem_fraction_static=f), {}, small).outcome for f in (0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95)]
    assert "ok" in outcomes


@pytest.mark.parametrize("seed", [0, 3, 57, 150])
def test_a_sibling_is_another_model_on_the_same_host(seed: int, tmp_path: Path) -> None:
    from autotune.study.warm_start import fingerprint

    host, sibling = generate(seed), generate_sibling(seed)
    assert sibling == generate_sibling(seed) and sibling.name == f"generated-{seed}-sibling"
    assert (sibling.gpu.name, sibling.gpu.count, sibling.interconnect) == (host.gpu.name, host.gpu.count, host.interconnect)
    assert sibling.model.name != host.model.name
    assert parse_scenario(to_yaml(sibling)) == sibling
    # the warm start reads the two files as one host serving two models
    prints = []
    for sc in (host, sibling):
        path = tmp_path / f"{sc.name}.yaml"
        path.write_text(to_yaml(sc), encoding="utf-8")
        prints.append(fingerprint({"target": {"engine": "sim", "scenario": str(path)}}, {}))
    assert prints[0].host == prints[1].host and prints[0].model != prints[1].model, prints


def test_halves_do_not_overlap() -> None:
    assert set(DEVELOPMENT).isdisjoint(HELD_BACK) and len(DEVELOPMENT) == len(HELD_BACK)


def test_parse_seeds() -> None:
    assert parse_seeds("3") == [3]
    assert parse_seeds("0-3,10,2") == [0, 1, 2, 3, 10]
    for bad in ("x", "5-2", "-1", "1-", ""):
        with pytest.raises(ValueError):
            parse_seeds(bad)


def test_generate_prints_one_host_and_writes_several(tmp_path: Path) -> None:
    one = runner.invoke(app, ["generate", "12"])
    assert one.exit_code == 0, one.output
    assert parse_scenario(one.stdout) == generate(12)
    many = runner.invoke(app, ["generate", "4-6", "--out", str(tmp_path)])
    assert many.exit_code == 0, many.output
    files = sorted(tmp_path.iterdir())
    assert [f.name for f in files] == ["generated-4.yaml", "generated-5.yaml", "generated-6.yaml"]
    assert load_scenario(str(files[1])) == generate(5)
    # the simulator predicts on a written host as on a built-in
    out = runner.invoke(app, ["predict", "--scenario", str(files[0]), "--set", "mem-fraction-static=0.6", "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["outcome"] in ("ok", "oom", "not-enough-memory", "nccl-error", "crash-under-load")


@pytest.mark.parametrize("args, fragment", [
    (["generate", "x"], "is not a seed"),
    (["generate", "0-3"], "give --out DIR"),
])
def test_generate_bad_input_is_one_line_exit_2(args: list[str], fragment: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "autotune.sim", *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and fragment in proc.stderr and "Traceback" not in proc.stderr
