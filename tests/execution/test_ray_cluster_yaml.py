"""``ray_cluster.yaml``: checked by Ray's own cluster-launcher code, its start commands run through
a shell as Ray's command runner wraps them, and its slot resource advertised by a real Ray node.

No test stops any Ray but its own: the real node runs under ``ray start --block`` in its own
process group with its own temp dir, free ports and a tag in its environment
(:data:`autotune.execution.hosts.TAG_ENV`, as autotune marks a server), and teardown kills exactly the
processes that carry the tag (:func:`autotune.execution.hosts.tagged_pids`). ``ray stop`` (every Ray on
the machine) is never run; the start commands' ``ray`` is a stub that records its arguments.
"""

from __future__ import annotations

import copy
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray
import yaml
from ray._private.authentication.authentication_token_setup import (
    _get_default_token_path,
)
from ray.autoscaler._private.command_runner import _with_interactive
from ray.autoscaler._private.commands import _bootstrap_config
from ray.autoscaler._private.util import (
    hash_runtime_conf,
    prepare_config,
    validate_config,
    with_envs,
)

from autotune.util.net import free_port
from autotune.execution.hosts import TAG_ENV, tagged_pids

ROOT = Path(__file__).resolve().parents[2]
CLUSTER_YAML = ROOT / "ray_cluster.yaml"
RAY = Path(sys.executable).parent / "ray"  # the venv's, next to the interpreter pytest runs in
SLOT_PREFIX = "autotune_slot:"
NODE = "gpu-node-7"  # what the stub `hostname` answers on the "worker"
HEAD_IP = "10.0.0.10"
VENV = "autotune-venv"  # the yaml's venv, under the remote home

STUB_RAY = """#!{python}
import json, os, sys
with open(os.environ["STUB_LOG"], "a") as f:
    f.write(json.dumps({{"argv": sys.argv[1:], "auth_mode": os.environ.get("RAY_AUTH_MODE"),
                        "worker_niceness": os.environ.get("RAY_worker_niceness")}}) + "\\n")
"""


@pytest.fixture(scope="module")
def config() -> dict[str, Any]:
    return yaml.safe_load(CLUSTER_YAML.read_text())


def run_like_ray(commands: list[str], env_prefix: dict[str, str], home: Path) -> list[dict[str, Any]]:
    """Run start commands as a launcher's NodeUpdater does on a node, with a stub ``ray``.

    Each command gets Ray's environment prefix (``with_envs``: ``export RAY_HEAD_IP=...;``) and
    Ray's wrapping for a login shell (``_with_interactive``: ``source ~/.bashrc; ... && (cmd)``,
    quoted for the remote shell). The outer ``bash -c`` plays the remote shell that ssh hands the
    line to, the inner one Ray's ``bash -c`` (without --login -i, to keep this machine's profile
    out). ``$HOME/autotune-venv/bin/ray`` records its arguments; ``hostname`` answers NODE.
    """
    venv_bin = home / VENV / "bin"
    venv_bin.mkdir(parents=True, exist_ok=True)
    (venv_bin / "ray").write_text(STUB_RAY.format(python=sys.executable))
    (venv_bin / "ray").chmod(0o755)
    tools = home / "tools"
    tools.mkdir(exist_ok=True)
    (tools / "hostname").write_text(f"#!/bin/sh\necho {NODE}\n")
    (tools / "hostname").chmod(0o755)
    (home / ".bashrc").touch()
    log = home / "calls.jsonl"
    log.unlink(missing_ok=True)
    env = {"HOME": str(home), "PATH": f"{tools}:/usr/bin:/bin", "STUB_LOG": str(log)}
    for cmd in with_envs(commands, env_prefix):
        remote_line = "bash -c " + _with_interactive(cmd)[-1]
        done = subprocess.run(["bash", "-c", remote_line], check=False, env=env, capture_output=True, text=True,
                              timeout=30)
        assert done.returncode == 0, f"{cmd!r} failed: {done.stdout}{done.stderr}"
    return [json.loads(line) for line in log.read_text().splitlines()]


@pytest.fixture(scope="module")
def worker_calls(config: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    home = tmp_path_factory.mktemp("worker-home")
    # What Ray's autoscaler (v2 and v1) prefixes to a worker's start commands.
    return run_like_ray(config["worker_start_ray_commands"],
                        {"RAY_HEAD_IP": HEAD_IP, "RAY_CLOUD_INSTANCE_ID": "10.0.0.11",
                         "RAY_NODE_TYPE_NAME": "local.cluster.node"}, home)


def resources_of(argv: list[str]) -> dict[str, Any]:
    values = [a.split("=", 1)[1] for a in argv if a.startswith("--resources=")]
    assert len(values) <= 1, argv
    return json.loads(values[0]) if values else {}


def test_rays_launcher_accepts_the_config(config: dict[str, Any]) -> None:
    # What `ray up` does with the file before anything is started: prepare (the on-prem node type,
    # min/max workers from worker_ips, the local defaults merged in), validate against
    # ray-schema.json, then the provider's bootstrap.
    prepared = prepare_config(copy.deepcopy(config))
    validate_config(prepared)
    boot = _bootstrap_config(copy.deepcopy(config), no_config_cache=True)
    validate_config(boot)
    assert config["provider"]["type"] == "local"
    workers = config["provider"]["worker_ips"]
    assert isinstance(config["provider"]["head_ip"], str) and workers
    assert config["provider"]["head_ip"] not in workers
    (node_type,) = boot["available_node_types"].values()
    assert node_type["min_workers"] == node_type["max_workers"] == len(workers)
    # prepare_config merges setup_commands into head_ and worker_setup_commands: both get them.
    assert boot["head_setup_commands"] == boot["worker_setup_commands"] == config["setup_commands"]
    # Without --autoscaling-config the head starts no autoscaler, which is what sets up the workers.
    assert any("--autoscaling-config=~/ray_bootstrap_config.yaml" in c for c in config["head_start_ray_commands"])


def test_setup_installs_autotune_next_to_this_ray(config: dict[str, Any]) -> None:
    installs = [c for c in config["setup_commands"] if re.search(r"\bpip install\b", c)]
    assert any("autotune" in c for c in installs), installs
    # The launcher's machine and the cluster run one Ray version (validate_config's error names a mismatch).
    assert any(f'"ray=={ray.__version__}"' in c for c in installs), installs
    # The wheel comes from the checkout's dist/, which the file mounts copy to every node.
    assert config["file_mounts"]["~/autotune-dist"] == "./dist"
    assert all("~/autotune-dist/autotune-*.whl" in c for c in installs if "autotune" in c), installs


def test_auth_settings(config: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    auth = config["auth"]
    assert isinstance(auth["ssh_user"], str) and auth["ssh_user"]
    assert isinstance(auth["ssh_private_key"], str) and auth["ssh_private_key"]
    # The token goes to every node at Ray's default token path, the same on both sides.
    monkeypatch.setenv("HOME", str(tmp_path))
    token_mounts = {remote: local for remote, local in config["file_mounts"].items()
                    if Path(os.path.expanduser(remote)) == _get_default_token_path()}
    assert token_mounts == {"~/.ray/auth_token": "~/.ray/auth_token"}
    # The documented first step writes the mount's source, and the launcher can read it (`ray up`
    # hashes every file mount's source before it starts anything).
    env = {**os.environ, "HOME": str(tmp_path)}
    (tmp_path / "dist").mkdir()  # what `pip wheel -w dist .` makes, where `ray up` runs
    (tmp_path / "dist" / "autotune-0.1.0-py3-none-any.whl").write_bytes(b"")
    monkeypatch.chdir(tmp_path)
    for k in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        env.pop(k, None)
    done = subprocess.run([str(RAY), "get-auth-token", "--generate"], check=False, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    token_file = tmp_path / ".ray" / "auth_token"
    assert token_file.read_text() == done.stdout.strip() != ""
    hash_runtime_conf(config["file_mounts"], None, config, generate_file_mounts_contents_hash=True)
    # Ray writes the file with the umask's mode (0644 under 022): the setup makes it private.
    assert any("chmod 600 ~/.ray/auth_token" in c for c in config["setup_commands"])


def test_worker_start_commands_as_ray_runs_them(worker_calls: list[dict[str, Any]]) -> None:
    assert [c["argv"][0] for c in worker_calls] == ["stop", "start"]
    start = worker_calls[1]
    assert start["auth_mode"] == "token"
    # The trials' servers run at normal CPU priority, not at Ray's worker niceness 15.
    assert start["worker_niceness"] == "0"
    assert f"--address={HEAD_IP}:6379" in start["argv"]
    resources = resources_of(start["argv"])
    slots = {k: v for k, v in resources.items() if k.startswith(SLOT_PREFIX)}
    assert slots == {f"{SLOT_PREFIX}{NODE}": 1}
    assert all(type(v) is int and v > 0 for v in slots.values())


def head_calls(commands: list[str], home: Path) -> list[dict[str, Any]]:
    return run_like_ray(commands, {"RAY_enable_autoscaler_v2": "1", "RAY_CLOUD_INSTANCE_ID": HEAD_IP,
                                   "RAY_NODE_TYPE_NAME": "local.cluster.node"}, home)


def test_head_advertises_no_slot_and_uses_the_token(config: dict[str, Any], tmp_path: Path) -> None:
    calls = head_calls(config["head_start_ray_commands"], tmp_path)
    assert [c["argv"][0] for c in calls] == ["stop", "start"]
    start = calls[1]
    assert "--head" in start["argv"] and "--port=6379" in start["argv"]
    assert start["auth_mode"] == "token" and start["worker_niceness"] == "0"
    # 0 units: Ray leaves the resource out, so the head offers no slot.
    assert resources_of(start["argv"]) == {f"{SLOT_PREFIX}{NODE}": 0}


def test_one_edit_makes_the_head_run_trials(config: dict[str, Any], tmp_path: Path) -> None:
    # The documented option: the head's 0 becomes the trials it runs at once (tests/execution/test_ray_up.py
    # runs a study on such a head).
    (line,) = [c for c in config["head_start_ray_commands"] if "--head" in c]
    edited = line.replace('\\": 0}', '\\": 2}')
    assert edited != line
    start = head_calls([edited], tmp_path)[0]
    assert resources_of(start["argv"]) == {f"{SLOT_PREFIX}{NODE}": 2}


# --- a real Ray node with the worker's resources argument --------------------------------------

PROBE = """
import json, sys, ray
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
print(json.dumps(ray.cluster_resources()))
ray.shutdown()
"""


@pytest.fixture
def ray_node(worker_calls: list[dict[str, Any]], tmp_path: Path) -> Iterator[dict[str, Any]]:
    """``ray start --head --block`` with the worker's --resources argument as the worker's shell
    produced it, token auth on (the token in $HOME/.ray/auth_token, as the yaml places it)."""
    (resources_arg,) = [a for a in worker_calls[1]["argv"] if a.startswith("--resources=")]
    home = tmp_path / "home"
    (home / ".ray").mkdir(parents=True)
    token = secrets.token_hex(32)
    (home / ".ray" / "auth_token").write_text(token)
    (home / ".ray" / "auth_token").chmod(0o600)
    temp_dir = tempfile.mkdtemp(prefix="rcy", dir="/tmp")  # short: Ray's socket paths must fit
    tag = f"ray-yaml-test-{secrets.token_hex(8)}"
    env = {**os.environ, "HOME": str(home), "RAY_AUTH_MODE": "token",
           "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0", "RAY_USAGE_STATS_ENABLED": "0"}
    for k in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS"):
        env.pop(k, None)
    env[TAG_ENV] = tag
    port = free_port()
    cmd = [str(RAY), "start", "--head", f"--port={port}", "--num-cpus=1", resources_arg,
           "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={temp_dir}",
           f"--dashboard-port={free_port()}",  # (no --ray-client-server-port: minimal ray refuses it)
           f"--dashboard-agent-listen-port={free_port()}", f"--dashboard-agent-grpc-port={free_port()}",
           f"--runtime-env-agent-port={free_port()}", f"--metrics-export-port={free_port()}",
           "--object-store-memory=100000000", "--block"]
    log = tmp_path / "head.log"
    with open(log, "wb") as out:
        head = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    try:
        address_file = Path(temp_dir) / "ray_current_cluster"
        deadline = time.monotonic() + 120  # a guard against a hang, not a speed check
        while not address_file.is_file() or not address_file.read_text().strip():
            assert head.poll() is None, f"ray start exited {head.returncode}:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"no Ray head after 120 s:\n{log.read_text()[-3000:]}"
            time.sleep(0.2)
        yield {"address": address_file.read_text().strip(), "env": env, "token": token}
    finally:
        try:
            os.killpg(head.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            head.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait(timeout=5)
        # Workers that raylet started lead their own sessions; they carry the tag too.
        deadline = time.monotonic() + 10
        while tagged_pids(tag) and time.monotonic() < deadline:
            time.sleep(0.3)
        for pid in tagged_pids(tag):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_a_real_node_advertises_the_slot_and_requires_the_token(ray_node: dict[str, Any]) -> None:
    probe = [sys.executable, "-c", PROBE, ray_node["address"]]
    done = subprocess.run(probe, check=False, env=ray_node["env"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    resources = json.loads(done.stdout.strip().splitlines()[-1])
    assert resources.get(f"{SLOT_PREFIX}{NODE}") == 1.0, resources
    # A client with another token is turned away: the node really runs with token auth.
    wrong = {**ray_node["env"], "RAY_AUTH_TOKEN": "not-" + ray_node["token"], "RAY_NUM_REDIS_GET_RETRIES": "1"}
    refused = subprocess.run(probe, check=False, env=wrong, capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0
    assert "InvalidAuthToken" in refused.stdout + refused.stderr, refused.stdout + refused.stderr
