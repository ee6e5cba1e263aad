"""Watching a server start: the incremental log reader, and the start-up timeouts a study learns
(a multiple of the slowest successful start-up; a log that stopped growing). Real processes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from autotune.study.driver import startup_timeout
from autotune.engines.registry import PRESETS
from autotune.outcome.failures import COMMON_PATTERNS, find_error
from autotune.execution.hosts import LocalHost, tagged_pids
from autotune.config.objective import Objective
from autotune.execution.log_watcher import LogWatcher
from autotune.execution.runner import TrialRunner
from autotune.execution.trial import TrialSpec

LINES = [
    "INFO loading weights",
    "Capture cuda graph begin",
    "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
    "NCCL WARN Failed to CUDA calloc 8388608 bytes",
    "ValueError: bad value",
    "a line with no error at all",
    "",
]


@settings(max_examples=60, deadline=None)
@given(lines=st.lists(st.sampled_from(LINES), max_size=30), cuts=st.lists(st.integers(0, 2000), max_size=6))
def test_the_incremental_reader_finds_what_a_whole_scan_finds(tmp_path_factory, lines: list[str], cuts: list[int]) -> None:
    """However the log arrives (cut at any byte), the watcher's error is find_error's over the
    whole text: the same priority rule, computed on new lines only."""
    path = tmp_path_factory.mktemp("log") / "server.log"
    data = ("\n".join(lines) + "\n").encode()
    watcher = LogWatcher(path, COMMON_PATTERNS)
    written = 0
    with open(path, "wb") as f:
        for cut in sorted(c for c in cuts if c < len(data)) + [len(data)]:
            f.write(data[written:cut])
            f.flush()
            written = max(written, cut)
            watcher.read()
    assert watcher.text == data.decode()
    whole = find_error(watcher.text, COMMON_PATTERNS)
    assert watcher.error == (None if whole is None else whole[:2])


def test_the_reader_keeps_only_the_last_limit_characters(tmp_path: Path) -> None:
    path = tmp_path / "big.log"
    watcher = LogWatcher(path, limit=1000)
    with open(path, "w") as f:
        for i in range(500):
            f.write(f"line {i:04d} padding padding\n")
            f.flush()
            watcher.read()
    assert len(watcher.text) == 1000 and watcher.text.endswith("line 0499 padding padding\n")


# A server that never answers: it logs a line every 0.2 s, or nothing at all.
NEVER_READY = "import sys, time\nwhile True:\n    if sys.argv[1] == 'talk':\n        print('still loading', flush=True)\n    time.sleep(0.2)\n"


def _runner(tmp_path: Path, mode: str, *, log_stall_s: float | None) -> TrialRunner:
    script = tmp_path / "never_ready.py"
    script.write_text(NEVER_READY)
    return TrialRunner(LocalHost(), PRESETS["custom"], Objective.load_file("quick"), log_dir=tmp_path,
                       template=f"{sys.executable} {script} {mode} {{port}}", ready_timeout_s=600,
                       log_stall_s=log_stall_s, teardown_grace_s=2)


def test_a_start_up_slower_than_the_study_has_seen_is_a_startup_timeout(tmp_path: Path) -> None:
    timeout, why = startup_timeout([0.3, 0.5], cap_s=600, factor=3, floor_s=1)
    result = _runner(tmp_path, "talk", log_stall_s=30).run(TrialSpec(0, {}, [], ready_timeout_s=timeout,
                                                                     ready_timeout_reason=why))
    assert result.outcome == "infeasible" and result.failure is not None
    assert result.failure.kind == "startup-timeout"
    assert "not ready after 1.5s (3 x the slowest successful start-up, 0.5s" in result.failure.message
    assert "still loading" in result.failure.excerpt


def test_a_silent_log_while_not_ready_is_a_startup_timeout(tmp_path: Path) -> None:
    runner = _runner(tmp_path, "quiet", log_stall_s=1.0)
    tags: list[str] = []
    result = runner.run(TrialSpec(0, {}, []), lambda phase, detail: tags.append(detail) if phase == "launched" else None)
    assert result.outcome == "infeasible" and result.failure is not None
    assert result.failure.kind == "startup-timeout"
    assert "its log has not grown for 1s" in result.failure.message
    assert tags and not tagged_pids(json.loads(tags[0])["tag"])  # torn down


def test_the_next_trial_s_timeout_follows_the_start_ups_seen() -> None:
    assert startup_timeout([], cap_s=600, factor=3, floor_s=120) == (600, "the target's ready_timeout_s")
    assert startup_timeout([100.0, 50.0], cap_s=600, factor=3, floor_s=120) == (
        300.0, "3 x the slowest successful start-up, 100.0s")
    assert startup_timeout([10.0], cap_s=600, factor=3, floor_s=120) == (120, "startup_timeout_floor_s")
    assert startup_timeout([400.0], cap_s=600, factor=3, floor_s=120) == (600, "the target's ready_timeout_s")
