"""The collectives benchmark, run for real: gloo ranks on CPU, real faults, real process clean-up."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.needs import import_module

torch = import_module("torch", "the collectives benchmark (torch.distributed, gloo on CPU)",
                      "pip install torch; .ci/run installs the CPU build")

from autotune.benchmarks.collective_rank import Case, WrongResultError, op_shape
from autotune.benchmarks.collectives import bus_factor, latency_stats, parse_size
from autotune.outcome.results import parse_result

pytestmark = pytest.mark.torch

CMD = [sys.executable, "-m", "autotune.benchmarks.collectives"]


def _run(*args: str, env: dict[str, str] | None = None, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CMD, *args], capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}, check=False
    )


def _children(pid: int) -> list[int]:
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            kids.append(int(stat.parent.name))
    return kids


def test_gloo_run_reports_latency_and_nccl_tests_bandwidths() -> None:
    proc = _run(
        "--backend",
        "gloo",
        "--nprocs",
        "2",
        "--sizes",
        "42KB,1MB",
        "--iters",
        "5",
        "--json",
        "-",
        env={"NCCL_ALGO": "Ring", "NCCL_NVLS_ENABLE": "0"},
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["backend"] == "gloo" and doc["world_size"] == 2 and doc["dtype"] == "bf16"
    assert doc["env"]["NCCL_ALGO"] == "Ring" and doc["env"]["NCCL_NVLS_ENABLE"] == "0"  # as given
    assert doc["nccl_mem_mib"] is None and doc["nccl_version"] is None
    assert doc["torch_version"] == torch.__version__
    assert [(r["op"], r["bytes"]) for r in doc["results"]] == [
        ("all_reduce", 43008), ("all_reduce", 1048576), ("all_gather", 43008), ("all_gather", 1048576),
    ]  # fmt: skip
    n = doc["world_size"]
    for r in doc["results"]:
        lat = r["latency_us"]
        assert 0 < lat["min"] <= lat["median"] <= lat["max"] and lat["min"] <= lat["mean"] <= lat["max"]
        assert r["correct"] is True
        assert r["algbw_gbps"] == pytest.approx(r["bytes"] / (lat["mean"] * 1e3), rel=1e-3)
        factor = 2 * (n - 1) / n if r["op"] == "all_reduce" else (n - 1) / n
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * factor, rel=1e-4, abs=2e-6)
    assert doc["results"][2]["count"] == 43008 // 2 // n  # all_gather: size is the gathered output
    assert "all_reduce" in proc.stderr and "busbw_GB/s" in proc.stderr  # the table
    metrics = parse_result("collectives", proc.stdout)
    assert metrics["busbw_gbps@all_gather@1048576"] == doc["results"][3]["busbw_gbps"]


def test_bad_arguments_exit_2_before_starting_ranks() -> None:
    for args in (
        ["--dtype", "fp64"],
        ["--sizes", "42XB"],
        ["--ops", "all_to_all"],
        ["--iters", "0"],
        ["--backend", "gloo", "--nprocs", "4", "--ops", "all_gather", "--sizes", "6B"],
    ):
        proc = _run(*args, timeout=30)
        assert proc.returncode == 2, (args, proc.stderr)
        assert "error:" in proc.stderr and "Traceback" not in proc.stderr


def test_a_failing_rank_fails_the_run_promptly_with_its_error_text() -> None:
    # A real gloo fault, as a wrong NCCL_SOCKET_IFNAME would be for NCCL: no such interface.
    proc = _run("--backend", "gloo", "--sizes", "4KB", "--iters", "2", env={"GLOO_SOCKET_IFNAME": "nosuchif0"})
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert "RuntimeError" in proc.stderr and "Unable to find address for: nosuchif0" in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("collectives: FAILED: rank ") and "nosuchif0" in last


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_killed_rank_stops_the_others_at_once() -> None:
    proc = subprocess.Popen(
        [*CMD, "--backend", "gloo", "--sizes", "4KB", "--warmup", "0", "--iters", "100000000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        ranks: list[int] = []
        while len(ranks) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
            ranks = _children(proc.pid)
        assert len(ranks) == 2
        time.sleep(4)  # let them get into the timed loop (the result is the same if they have not)
        os.kill(max(ranks), signal.SIGKILL)
        _, err = proc.communicate(timeout=60)  # the survivors stop at once; this only bounds a hang
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
    assert proc.returncode == 1
    assert "was killed by SIGKILL" in err.strip().splitlines()[-1]
    assert not [pid for pid in ranks if Path(f"/proc/{pid}").exists() and "Z" not in _state(pid)]


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "Z"


def test_timeout_stops_every_rank() -> None:
    # 10**8 iterations would run for hours: the benchmark's own 3 s timeout must end it (the
    # subprocess timeout only bounds a hang; no wall-clock assertion on a loaded machine).
    proc = _run("--backend", "gloo", "--sizes", "4KB", "--iters", "100000000", "--timeout", "3", timeout=120)
    assert proc.returncode == 1
    assert "timed out after 3 s" in proc.stderr.strip().splitlines()[-1]


# --- the pure parts ---------------------------------------------------------------------------


def test_sizes_are_binary_like_nccl_tests() -> None:
    assert parse_size("42KB") == parse_size("42KiB") == parse_size("42k") == 43008 == 3 * 7168 * 2
    assert parse_size("4MB") == parse_size("4MiB") == 4 * 1024 * 1024
    assert parse_size("1.5K") == 1536 and parse_size("512") == parse_size("512B") == 512
    for bad in ("", "0", "1.3B", "4TB", "-1", "KB"):
        with pytest.raises(ValueError):
            parse_size(bad)


def test_shapes_and_bus_factors() -> None:
    assert op_shape("all_reduce", 43008, 2, 8) == (21504, 43008)
    assert op_shape("all_gather", 43008, 2, 8) == (2688, 43008)  # per-rank count, total bytes
    assert op_shape("reduce_scatter", 1000, 4, 3) == (83, 996)
    assert op_shape("all_gather", 6, 2, 4) == (0, 0)
    assert bus_factor("all_reduce", 8) == 2 * 7 / 8
    assert bus_factor("all_gather", 8) == bus_factor("reduce_scatter", 8) == 7 / 8
    assert bus_factor("broadcast", 8) == 1.0


def test_latency_is_the_slowest_rank_per_statistic() -> None:
    stats = latency_stats([[10.0, 20.0, 30.0], [15.0, 15.0, 16.0]])
    assert stats == {"mean": 20.0, "median": 20.0, "min": 15.0, "max": 30.0}


@pytest.mark.parametrize("op", ["all_reduce", "all_gather", "reduce_scatter", "broadcast"])
def test_a_wrong_result_is_an_error(op: str) -> None:
    world, rank, count = 3, 1, 10
    inp = torch.zeros(count * world, dtype=torch.bfloat16)
    out = torch.zeros(count * world, dtype=torch.bfloat16)
    case = Case(op, count, count * 2, world, rank, inp, out)
    case.fill()
    case.dst.copy_(case._expected().to(case.dst.dtype))  # what a correct collective leaves
    case.verify("bf16")
    case.dst[3] += 1
    with pytest.raises(
        WrongResultError, match=rf"{op} of 20 B .* on rank 1: 1 of \d+ elements differ \(first at index 3"
    ):
        case.verify("bf16")


def test_a_rank_killed_by_a_signal_is_named_first_even_when_its_peer_s_error_reads_earlier(tmp_path: Path) -> None:
    # the race the test above meets under load, made exact: torchrun reads rank 0's error file
    # (a collective with a dead peer) with an earlier time than it saw rank 1's SIGKILL
    from types import SimpleNamespace

    from autotune.benchmarks.collectives import _failure

    (tmp_path / "rank0.error").write_text("RuntimeError: Connection closed by peer\n")
    failures = {0: SimpleNamespace(exitcode=1, timestamp=100), 1: SimpleNamespace(exitcode=-9, timestamp=101)}
    assert _failure(failures, tmp_path) == "rank 1 was killed by SIGKILL (then rank(s) 0 failed or were stopped)"
    # torchrun's own stop (SIGTERM) is a consequence, not a cause
    failures = {0: SimpleNamespace(exitcode=1, timestamp=100), 1: SimpleNamespace(exitcode=-15, timestamp=101)}
    assert _failure(failures, tmp_path).startswith("rank 0 exited with code 1: RuntimeError: Connection closed by peer")
