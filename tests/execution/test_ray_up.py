"""``ray up`` of the shipped ray_cluster.yaml, a study on the cluster, ``ray down``: for real.

The copy of ray_cluster.yaml gets only the edits docs/distributed.md documents: the head's IP,
no workers and one slot on the head, the SSH user and key, and an ``ssh_proxy_command``. The
host is this machine, behind a real sshd in namespaces of its own (:class:`RayHost`: the head's
``ray stop``, its fixed ports and /tmp/ray touch no other test's Ray); its python3 has autotune's
requirements installed for the user, not autotune, and pip's index is off: the setup installs
the wheel built here from the checkout, offline. The launcher runs with a home and Ray temp
folder of its own. The waits are guards against a hang, not speed checks.
"""

from __future__ import annotations

import getpass
import importlib.util
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import optuna
import pytest
import yaml

from tests.helpers.ray_host import RayHost
from tests.helpers.sim_study import RECORDED_LOAD, SCENARIO
from tests.needs import unavailable

pytestmark = pytest.mark.timeout(600)

ROOT = Path(__file__).resolve().parents[2]
RAY = Path(sys.executable).with_name("ray")  # the launcher: this environment's Ray CLI
TRIALS = 2


def edited_yaml(host: RayHost) -> str:
    """ray_cluster.yaml with the documented edits only, each checked to apply exactly once."""
    text = (ROOT / "ray_cluster.yaml").read_text()
    edits = [
        (r"head_ip: 10\.0\.0\.10 ", "head_ip: 127.0.0.1 "),
        (r"worker_ips: (.*)\n(    - .*\n)+", r"worker_ips: [] \1\n"),
        (r"ssh_user: ubuntu ", f"ssh_user: {getpass.getuser()} "),
        (r"ssh_private_key: ~/\.ssh/id_ed25519 (.*)\n",
         rf"ssh_private_key: {host.user_key} \1\n  ssh_proxy_command: {host.proxy_command()}\n"),
        (r'(--head .*\\"autotune_slot:\$\(hostname\)\\": )0', r"\g<1>1"),
    ]
    for pattern, replacement in edits:
        text, n = re.subn(pattern, replacement, text)
        assert n == 1, f"{pattern!r} matched {n} times in ray_cluster.yaml"
    return text


@pytest.fixture(scope="module")
def launcher(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, str], RayHost]]:
    """The launcher's folder (the edited yaml, dist/ with the wheel), its environment, and the
    host. The test runs ``ray up`` and ``ray down``; whatever happened, stopping the host kills
    every process left on it (after a ``ray down`` here if the test did not get to its own)."""
    if shutil.which("rsync") is None:
        unavailable("ray up copies its file mounts with rsync (apt-get install rsync)")
    host = RayHost(tmp_path_factory.mktemp("rayhost"))
    folder = tmp_path_factory.mktemp("launcher")
    env = {**os.environ, "HOME": str(folder / "home"), "RAY_TMPDIR": str(folder / "ray-tmp"),
           "TMPDIR": str(folder / "tmp"), "RAY_USAGE_STATS_ENABLED": "0",
           "PATH": f"{RAY.parent}:{os.environ.get('PATH', '')}"}
    for k in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS", "RAY_AUTH_MODE"):
        env.pop(k, None)
    for sub in ("home", "ray-tmp", "tmp"):
        (folder / sub).mkdir()
    host.start()
    try:
        host.provide_python()
        # The documented first steps: the wheel (from the checkout: -w names where it goes; this
        # machine's pip cache holds the build backend), the token.
        build = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(folder / "dist"), str(ROOT)]
        if importlib.util.find_spec("hatchling") is not None:
            build.append("--no-build-isolation")
        run(build, folder, dict(os.environ))
        run([str(RAY), "get-auth-token", "--generate"], folder, env)
        (folder / "cluster.yaml").write_text(edited_yaml(host))
        yield folder, env, host
    finally:
        try:
            if any("raylet" in c for c in host.commands()):
                subprocess.run([str(RAY), "down", "-y", "cluster.yaml"], cwd=folder, env=env, capture_output=True,
                               timeout=120, check=False)
        finally:
            host.stop()


def run(argv: list[str], cwd: Path, env: dict[str, str], timeout: float = 300) -> str:
    done = subprocess.run(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, f"{argv} exited {done.returncode}:\n{done.stdout[-6000:]}\n{done.stderr[-6000:]}"
    return done.stdout + done.stderr


def test_ray_up_runs_a_study_and_ray_down_stops_it(launcher: tuple[Path, dict[str, str], RayHost]) -> None:
    folder, env, host = launcher
    run([str(RAY), "up", "-y", "--no-config-cache", "cluster.yaml"], folder, env, timeout=480)
    assert any("raylet" in c for c in host.commands()), host.commands()

    # The node runs the wheel that `ray up` copied, in the venv the setup made.
    where = run([str(RAY), "exec", "cluster.yaml", "python -c 'import autotune; print(autotune.__file__)'"],
                folder, env)
    assert f"{host.home}/autotune-venv/lib/" in where, where

    # The documented study command, on the head (the config and storage in the host's home).
    storage = f"sqlite:///{host.home}/studies.db"
    (folder / "study.yaml").write_text(yaml.safe_dump({
        "name": "rayup",
        "target": {"engine": "sim", "scenario": SCENARIO, "ready_timeout_s": 60,
                   "env": {"NCCL_IB_DISABLE": "1", "AUTOTUNE_SIM_TIME_SCALE": "300"}},
        "space": "sglang_nccl", "objective": "quick", "objective_overrides": RECORDED_LOAD,
        "budget": {"trials": TRIALS}, "storage": storage, "seed": 1,
    }))
    run([str(RAY), "rsync-up", "cluster.yaml", "study.yaml", f"{host.home}/study.yaml"], folder, env)
    run([str(RAY), "exec", "cluster.yaml",
         f"autotune study start {host.home}/study.yaml --executor ray --address auto"], folder, env, timeout=400)
    study = optuna.load_study(study_name="rayup", storage=storage)
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.COMPLETE] * TRIALS, \
        [(t.number, t.state, t.user_attrs.get("failure_message")) for t in study.trials]
    # Each trial ran in the slot that only the head started by `ray up` advertises.
    assert {t.user_attrs["slot"] for t in study.trials} == {socket.gethostname()}

    out = run([str(RAY), "down", "-y", "cluster.yaml"], folder, env, timeout=120)
    left = [c for c in host.commands() if re.search(r"raylet|gcs_server|ray::", c)]
    assert not left, (left, out)
