from __future__ import annotations

import pytest

from autotune.outcome.failures import classify, excerpt, find_error


def test_nccl_invalid_usage_wins_over_generic_lines() -> None:
    log = "\n".join(
        ["[2026] Load weight end. avail mem=12.00 GB"] * 50
        + [
            "Traceback (most recent call last):",
            "torch.distributed.DistBackendError: NCCL error in: ../ProcessGroupNCCL.cpp:1970, invalid usage",
            "Last error:",
            "No algorithm/protocol available for function AllGather with datatype ncclInt8. NCCL_ALGO was set to Tree.",
        ]
        + [f"[rank{i % 8}] shutting down worker {i}" for i in range(80)]
    )
    f = classify(log, phase="launching", exit_code=1)
    assert f.kind == "nccl-error"
    assert "No algorithm/protocol available" in f.message
    assert "NCCL_ALGO was set to Tree" in f.excerpt
    assert "[... " in f.excerpt  # the long head and the shutdown noise were elided, the error kept
    assert "shutting down worker 79" in f.excerpt


def test_graph_capture_oom_and_not_enough_memory() -> None:
    oom = "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 2.00 GiB."
    assert classify(oom, phase="launching", exit_code=1).kind == "oom"
    nem = "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static."
    assert classify(nem, phase="launching", exit_code=1).kind == "not-enough-memory"


def test_an_oom_is_oom_in_every_phase_with_the_phase_beside_it() -> None:
    log = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.5 GiB\nRank 0 scheduler is dead."
    f = classify(log, phase="measuring", exit_code=None)
    assert (f.kind, f.phase, f.blame) == ("oom", "load", "configuration")
    f = classify(log, phase="launching", exit_code=1)
    assert (f.kind, f.phase) == ("oom", "start-up")
    f = classify("Exception: Capture cuda graph failed: CUDA out of memory", phase="launching", exit_code=1)
    assert (f.kind, f.phase) == ("oom", "graph-capture")
    f = classify("hello\nbye", phase="measuring", exit_code=-9)
    assert (f.kind, f.phase) == ("crash-under-load", "load")


def test_every_kind_has_one_blame_and_an_unknown_kind_is_refused() -> None:
    from autotune.outcome.failures import FAULT_KINDS, INFEASIBLE_KINDS, FailureKind, Failure, pattern

    assert not INFEASIBLE_KINDS & FAULT_KINDS
    assert INFEASIBLE_KINDS | FAULT_KINDS == {k.value for k in FailureKind}
    assert Failure("gpu-busy", "m", "").blame == "environment" and not Failure("gpu-busy", "m", "").infeasible
    assert Failure("interrupted", "m", "").blame == "tuner"
    with pytest.raises(ValueError, match="unknown failure kind 'oops'"):
        Failure("oops", "m", "")
    with pytest.raises(ValueError, match="unknown failure kind"):
        pattern("ooom", "x")


def test_unrecognised_exit_and_missing_command() -> None:
    assert classify("hello\nbye", phase="launching", exit_code=3).kind == "crash"
    assert classify("", phase="launching", exit_code=127).kind == "launch-failed"
    assert find_error("all fine\nready") is None


def test_argparse_error_is_invalid_argument() -> None:
    log = "usage: launch_server.py [-h]\nlaunch_server.py: error: argument --mem-fraction-static: invalid float value: 'x'"
    assert classify(log, phase="launching", exit_code=2).kind == "invalid-argument"


def test_excerpt_bounds() -> None:
    text = "\n".join(f"line {i}" for i in range(1000))
    e = excerpt(text, focus=10, tail=5, around=2)
    assert "line 10" in e and "line 999" in e and "line 500" not in e
    assert len(excerpt("x" * 100000)) <= 6000
