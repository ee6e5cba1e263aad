"""A real multi-node Ray cluster on this machine, for tests and benchmarks.

Each node is a real ``ray start`` (a head, then workers joining it), each advertising one
``autotune_slot:<name>`` resource, as the nodes of ``ray_cluster.yaml`` do. :meth:`kill_node`
kills one node's raylet with SIGKILL, which is what a machine that drops out looks like to the
rest of the cluster. :meth:`stop` removes only this cluster's processes, never another Ray on the
machine: every one of them inherits a tag in its environment (:data:`autotune.execution.hosts.TAG_ENV`,
as the servers of a trial do), and :func:`autotune.execution.hosts.tagged_pids` finds them.

Token authentication as Ray 2.60 does it is on: the nodes run with ``RAY_AUTH_MODE=token`` and
the token in ``~/.ray/auth_token`` (made by ``ray get-auth-token --generate`` if missing); a
driver connecting with ``RAY_AUTH_MODE`` unset finds the token there.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

from autotune.util.net import free_port
from autotune.execution.hosts import TAG_ENV, tagged_pids
from autotune.util.polling import wait_until

__all__ = ["LocalRayCluster"]


def _ray_bin() -> str:
    return str(Path(sys.executable).with_name("ray"))


class LocalRayCluster:
    """``ray start`` nodes on 127.0.0.1 named ``slots`` (``autotune_slot:<name>`` = 1 each).

    Use as a context manager; ``address`` is ``127.0.0.1:PORT`` for ``--address``.
    """

    def __init__(self, slots: list[str], *, cpus_per_node: int = 1) -> None:
        self.slots = list(slots)
        self.cpus_per_node = cpus_per_node
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.temp_dir = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # Ray's socket paths must stay short
        self.tag = f"ray-cluster-{uuid.uuid4().hex}"
        self.env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_DEDUP_LOGS": "0", "RAY_USAGE_STATS_ENABLED": "0",
                    "RAY_worker_niceness": "0", TAG_ENV: self.tag}

    def _start(self, name: str, head: bool) -> None:
        resources = '{"autotune_slot:%s": 1}' % name
        argv = [_ray_bin(), "start", f"--num-cpus={self.cpus_per_node}", f"--resources={resources}",
                "--disable-usage-stats"]
        if head:
            argv += ["--head", f"--port={self.port}", "--node-ip-address=127.0.0.1", "--include-dashboard=false",
                     f"--temp-dir={self.temp_dir}"]
        else:
            argv += [f"--address={self.address}", "--node-ip-address=127.0.0.1"]
        proc = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"ray start ({name}) failed: {(proc.stderr or proc.stdout)[-2000:]}")

    def start(self) -> LocalRayCluster:
        # `ray start` in token mode needs the token to exist (it does not make one): make it, as a
        # user does once (an existing token is kept).
        proc = subprocess.run([_ray_bin(), "get-auth-token", "--generate"], env=self.env, capture_output=True,
                              text=True, timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"ray get-auth-token --generate failed: {(proc.stderr or proc.stdout)[-2000:]}")
        self._start(self.slots[0], head=True)
        for name in self.slots[1:]:
            self._start(name, head=False)
        return self

    def __enter__(self) -> LocalRayCluster:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def raylet_pid(self, name: str) -> int | None:
        """The raylet of node ``name`` (its static resources name the slot)."""
        for pid in tagged_pids(self.tag):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if cmd[0].endswith(b"raylet") and any(f"autotune_slot:{name},1".encode() in c for c in cmd):
                return pid
        return None

    def kill_node(self, name: str) -> None:
        """SIGKILL node ``name``'s raylet: the node dies, with the tasks it ran."""
        pid = self.raylet_pid(name)
        if pid is None:
            raise RuntimeError(f"no raylet for node {name}")
        os.kill(pid, signal.SIGKILL)

    def stop(self) -> None:
        """Kill every process of this cluster (those carrying its tag)."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            pids = tagged_pids(self.tag)
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            if pids:
                wait_until(lambda: not any(Path(f"/proc/{p}").exists() for p in pids), 5, 0.1)
        shutil.rmtree(self.temp_dir, ignore_errors=True)
