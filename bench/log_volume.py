"""Does a server's log volume change what autotune measures? (issue: log reading costs nothing)

Two measurements, each against a baseline in the same run:

1. The runner's per-poll log work, at log sizes of 100 KB and 8 MB: a whole-text scan for
   failure patterns (what every 0.1 s poll did before) against the incremental reader
   (:class:`autotune.execution.log_watcher.LogWatcher`: read what was appended, scan only the new lines).
2. Whole trials through :class:`autotune.execution.runner.TrialRunner` against the simulated host, quiet
   and noisy interleaved: the noisy server writes ``--mb`` MB of log lines while it is measured.
   The ratio of median output throughputs (noisy / quiet) should be within 1% of 1.

Usage: ``python bench/log_volume.py [--rounds 4] [--mb 50]``; prints a JSON document.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from autotune.engines.registry import PRESETS
from autotune.outcome.failures import COMMON_PATTERNS, find_error
from autotune.execution.hosts import LocalHost
from autotune.config.objective import Objective
from autotune.execution.log_watcher import LogWatcher
from autotune.execution.runner import TrialRunner
from autotune.execution.trial import TrialSpec

SCENARIO = "h200-nvlink-llama70b"
LINE = "INFO 12-01 00:00:00 [engine.py:123] Avg prompt throughput: 1234.5 tokens/s, padding padding padding\n"

# Starts the simulated server as a child (sharing the log), waits until it answers, then writes
# MB megabytes of log lines over about SPREAD seconds: while the trial is being measured.
NOISY = """
import subprocess, sys, time, urllib.request
mb, spread, args = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3:]
server = subprocess.Popen([sys.executable, "-m", "autotune.sim", "serve", *args])
port = args[args.index("--port") + 1]
while True:
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
        break
    except Exception:
        if server.poll() is not None:
            sys.exit(server.returncode)
        time.sleep(0.1)
line = %r
chunk = line * (1_000_000 // len(line))
steps = int(mb)
for _ in range(steps):
    sys.stdout.write(chunk)
    sys.stdout.flush()
    time.sleep(spread / steps)
sys.exit(server.wait())
""" % LINE


def per_poll_cost(size: int, polls: int = 20) -> dict[str, float]:
    """Milliseconds per poll at a log of ``size`` bytes: whole-text scan vs incremental read."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "server.log"
        path.write_text(LINE * (size // len(LINE)))
        watcher = LogWatcher(path, COMMON_PATTERNS)
        watcher.read()
        text = watcher.text
        t0 = time.perf_counter()
        for _ in range(polls):
            find_error(text, COMMON_PATTERNS)
        whole = (time.perf_counter() - t0) / polls * 1000
        with open(path, "a") as f:
            t0 = time.perf_counter()
            for _ in range(polls):
                f.write(LINE * 10)  # what a busy server appends between two polls
                f.flush()
                watcher.read()
                assert watcher.error is None
            incremental = (time.perf_counter() - t0) / polls * 1000
    return {"log_bytes": size, "whole_scan_ms": round(whole, 3), "incremental_ms": round(incremental, 3),
            "ratio": round(whole / incremental, 1)}


def trial(tmp: Path, noisy: bool, mb: float, number: int) -> float:
    script = tmp / "noisy.py"
    script.write_text(NOISY)
    sim = f"--scenario {SCENARIO} --host {{host}} --port {{port}} --time-scale 150"
    template = f"{sys.executable} {script} {mb} 6 {sim}" if noisy else f"{sys.executable} -m autotune.sim serve {sim}"
    objective = Objective.load_file("quick", {"load": {"concurrency": 64, "num_prompts": 1024, "input_len": 128,
                                                        "output_len": 64, "warmup_prompts": 8}})
    runner = TrialRunner(LocalHost(), PRESETS["custom"], objective, log_dir=tmp, template=template,
                         api="sglang", ready_timeout_s=120)
    result = runner.run(TrialSpec(number, {}, []))
    if result.outcome != "ok":
        raise SystemExit(f"trial {number} ({'noisy' if noisy else 'quiet'}): {result.outcome} {result.failure}")
    log_mb = Path(result.log_path).stat().st_size / 1e6
    print(f"trial {number} {'noisy' if noisy else 'quiet'}: {result.metrics['output_throughput']:.1f} tok/s, "
          f"{result.metrics['duration_s']:.1f} s measured, log {log_mb:.1f} MB", file=sys.stderr)
    return float(result.metrics["output_throughput"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--mb", type=float, default=50.0)
    args = parser.parse_args()
    polls = [per_poll_cost(100_000), per_poll_cost(8_000_000)]
    quiet: list[float] = []
    noisy: list[float] = []
    with tempfile.TemporaryDirectory() as d:
        for r in range(args.rounds):
            quiet.append(trial(Path(d), False, args.mb, 2 * r))
            noisy.append(trial(Path(d), True, args.mb, 2 * r + 1))
    doc = {
        "per_poll": polls,
        "quiet_tok_s": [round(x, 1) for x in quiet],
        "noisy_tok_s": [round(x, 1) for x in noisy],
        "log_mb_noisy": args.mb,
        "noisy_over_quiet_median": round(statistics.median(noisy) / statistics.median(quiet), 4),
    }
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
