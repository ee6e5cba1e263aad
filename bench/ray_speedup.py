"""Ray executor vs serial executor: wall-clock speedup and best-found (issue: Ray executor).

One local Ray cluster (:class:`autotune.testing.ray_cluster.LocalRayCluster`, one node per
simulated slot, each advertising ``autotune_slot:<name>``) serves the whole run. For each seed
the demo study (simulated host, ``autotune study start --demo``) runs twice, each in a fresh
SQLite storage: once with the serial executor, once with ``--executor ray --address``. The order
alternates (serial first for even seeds, Ray first for odd ones), so both see the same machine
noise. What is timed is the whole ``autotune study start`` process, start-up and Ray connection
included.

Per seed: wall clock of each, speedup (serial / Ray), best feasible value of each
(:func:`autotune.store.study_view.best_view`; infeasible trials are stored PRUNED), best ratio (Ray
over serial, >= 1 is "no worse", whatever the study's direction), how many Ray trials ran at once
at the peak (from ``datetime_start`` / ``datetime_complete``), and the slots the trials used.

Sanity reference, the ideal speedup: the summed trial durations of the serial run over the
busiest slot's summed durations in the Ray run (what the speedup would be with no driver, no
start-up and no idle slot). ``ray sum/busiest`` is the same bound from the Ray run's own trials.

Goal (exit 1 if missed, both reported): median speedup >= 2.4 and median best ratio >= 1.0. The
load average (1 minute) at each run's start is printed beside the speedups: the machine's other
work slows the two runs unequally.

Usage: ``python bench/ray_speedup.py [--seeds 5] [--trials 12] [--slots 3] [--json PATH]
[--out-dir DIR]``
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import optuna

from autotune.store.study_view import best_view
from autotune.testing.ray_cluster import LocalRayCluster

SPEEDUP_GOAL = 2.4
RATIO_GOAL = 1.0
SLOT_NAMES = "abcdefghijklmnopqrstuvwxyz"


def uptime() -> str:
    return subprocess.run(["uptime"], check=False, capture_output=True, text=True).stdout.strip()


def loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def peak_concurrency(trials: list[optuna.trial.FrozenTrial]) -> int:
    """The most trials whose runs overlap at once. A run is [told - duration_s, told]: the
    runner's own span (``datetime_start`` is when the trial was asked, before it got a slot)."""
    events: list[tuple[dt.datetime, int]] = []
    for t in trials:
        if t.datetime_complete is None or "duration_s" not in t.user_attrs:
            continue
        events += [(t.datetime_complete - dt.timedelta(seconds=float(t.user_attrs["duration_s"])), 1),
                   (t.datetime_complete, -1)]
    events.sort(key=lambda e: (e[0], e[1]))  # an end before a start at the same instant
    now = peak = 0
    for _, delta in events:
        now += delta
        peak = max(peak, now)
    return peak


def run_study(kind: str, seed: int, trials: int, out: Path, address: str) -> dict[str, Any]:
    """One ``autotune study start --demo`` process in a fresh storage; its wall clock and result."""
    workdir = out / f"seed{seed}-{kind}"
    workdir.mkdir(parents=True, exist_ok=False)
    name = f"bench-{kind}-{seed}"
    storage = f"sqlite:///{workdir / 'study.db'}"
    argv = [sys.executable, "-m", "autotune", "study", "start", "--demo", "--storage", storage,
            "--name", name, "--trials", str(trials), "--seed", str(seed)]
    if kind == "ray":
        argv += ["--executor", "ray", "--address", address]
    else:
        argv += ["--executor", "serial"]
    load = loadavg()
    with open(workdir / "stdout.txt", "wb") as so, open(workdir / "stderr.txt", "wb") as se:
        t_start, t0 = time.time(), time.perf_counter()
        proc = subprocess.run(argv, check=False, cwd=workdir, stdout=so, stderr=se)
        wall = time.perf_counter() - t0
        t_end = time.time()
    if proc.returncode != 0:
        tail = (workdir / "stderr.txt").read_text(errors="replace")[-2000:]
        raise RuntimeError(f"{kind} study (seed {seed}) exited {proc.returncode}:\n{tail}")
    study = optuna.load_study(study_name=name, storage=storage)
    frozen = study.get_trials(deepcopy=False)
    best = best_view(study)
    per_slot: dict[str, float] = {}
    for t in frozen:
        slot = str(t.user_attrs.get("slot", "?"))
        per_slot[slot] = per_slot.get(slot, 0.0) + float(t.user_attrs.get("duration_s") or 0.0)
    outcomes: dict[str, int] = {}
    for t in frozen:
        o = str(t.user_attrs.get("outcome", t.state.name.lower()))
        outcomes[o] = outcomes.get(o, 0) + 1
    maximize = study.direction == optuna.study.StudyDirection.MAXIMIZE
    timed = [t for t in frozen if t.datetime_start is not None and t.datetime_complete is not None]
    # Optuna stores naive local datetimes; time.time() converts to the same clock.
    first = min(t.datetime_start.timestamp() for t in timed)  # type: ignore[union-attr]
    last = max(t.datetime_complete.timestamp() for t in timed)  # type: ignore[union-attr]
    beyond = [(t.datetime_complete - t.datetime_start).total_seconds()  # type: ignore[operator]
              - float(t.user_attrs.get("duration_s") or 0.0) for t in timed]
    return {
        "kind": kind, "seed": seed, "wall_s": round(wall, 2), "load_before": load,
        "trials": len(frozen), "outcomes": outcomes,
        "best": None if best is None else best.value, "best_trial": None if best is None else best.number,
        "maximize": maximize, "peak_concurrency": peak_concurrency(frozen),
        "slot_busy_s": {k: round(v, 2) for k, v in sorted(per_slot.items())},
        "sum_duration_s": round(sum(per_slot.values()), 2), "storage": storage,
        # where the wall clock goes: process start -> first trial asked; the trials' span; last
        # trial told -> process end; per trial, its record's time beyond its own duration_s
        # (ask, submit, Ray scheduling and worker start, result transfer, tell)
        "startup_s": round(first - t_start, 2), "span_s": round(last - first, 2),
        "teardown_s": round(t_end - last, 2), "beyond_trial_s": round(sum(beyond), 2),
        "beyond_trial_max_s": round(max(beyond), 2),
        # slot-seconds in the span with no trial on the slot (mostly the end: budget reached)
        "idle_slot_s": round(len(per_slot) * (last - first) - sum(per_slot.values()) - sum(beyond), 2),
    }


def best_ratio(serial: dict[str, Any], ray: dict[str, Any]) -> float | None:
    """Ray's best relative to serial's, oriented so that >= 1 means Ray found no worse."""
    s, r = serial["best"], ray["best"]
    if s is None or r is None or s == 0 or r == 0:
        return None
    return r / s if serial["maximize"] else s / r


def one_seed(seed: int, trials: int, out: Path, address: str) -> dict[str, Any]:
    order = ["serial", "ray"] if seed % 2 == 0 else ["ray", "serial"]
    runs = {}
    for kind in order:
        runs[kind] = run_study(kind, seed, trials, out, address)
        r = runs[kind]
        print(f"  seed {seed} {kind:6s} {r['wall_s']:7.1f} s  best {fmt(r['best'], '.1f')}  "
              f"(load {r['load_before']})", file=sys.stderr, flush=True)
    s, r = runs["serial"], runs["ray"]
    busiest = max(r["slot_busy_s"].values())
    return {
        "seed": seed, "order": order,
        "wall_serial_s": s["wall_s"], "wall_ray_s": r["wall_s"],
        "speedup": round(s["wall_s"] / r["wall_s"], 3),
        "best_serial": s["best"], "best_ray": r["best"], "best_ratio": best_ratio(s, r),
        "peak_concurrency": r["peak_concurrency"], "slots": sorted(r["slot_busy_s"]),
        "ideal_speedup": round(s["sum_duration_s"] / busiest, 3),
        "ray_self_ideal": round(r["sum_duration_s"] / busiest, 3),
        "serial_overhead_s": round(s["wall_s"] - s["sum_duration_s"], 2),
        "ray_overhead_s": round(r["wall_s"] - busiest, 2),
        "runs": runs,
    }


def fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def load1(row: dict[str, Any], kind: str) -> str:
    """The 1-minute load average when the ``kind`` run of a seed started."""
    return row["runs"][kind]["load_before"].split()[0]


def table(rows: list[dict[str, Any]]) -> str:
    head = (f"{'seed':>4} {'serial s':>8} {'ray s':>6} {'speedup':>7} {'ideal':>5} "
            f"{'best serial':>11} {'best ray':>8} {'ratio':>5} {'peak':>4} {'load s/r':>9} slots")
    lines = [head]
    for r in rows:
        lines.append(f"{r['seed']:>4} {r['wall_serial_s']:>8.1f} {r['wall_ray_s']:>6.1f} "
                     f"{r['speedup']:>7.2f} {r['ideal_speedup']:>5.2f} {fmt(r['best_serial'], '11.1f')} "
                     f"{fmt(r['best_ray'], '8.1f')} {fmt(r['best_ratio'], '5.3f')} "
                     f"{r['peak_concurrency']:>4} {load1(r, 'serial'):>4}/{load1(r, 'ray'):<4} {','.join(r['slots'])}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5, help="seeds 0..N-1")
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--slots", type=int, default=3)
    parser.add_argument("--json", metavar="PATH", help="also write the JSON document here")
    parser.add_argument("--out-dir", help="storages and logs (default: a new folder under /tmp)")
    args = parser.parse_args()
    out = Path(args.out_dir) if args.out_dir else Path(tempfile.mkdtemp(prefix="ray-speedup-"))
    out.mkdir(parents=True, exist_ok=True)
    slots = [SLOT_NAMES[i] for i in range(args.slots)]
    uptime_before = uptime()
    print(f"out: {out}\nbefore: {uptime_before}", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    with LocalRayCluster(slots) as cluster:
        cluster_s = time.perf_counter() - t0
        print(f"cluster {cluster.address} ({len(slots)} nodes) up in {cluster_s:.1f} s",
              file=sys.stderr, flush=True)
        rows = [one_seed(seed, args.trials, out, cluster.address) for seed in range(args.seeds)]
    uptime_after = uptime()

    speedups = [r["speedup"] for r in rows]
    ratios = [r["best_ratio"] for r in rows if r["best_ratio"] is not None]
    med_speedup = statistics.median(speedups)
    med_ratio = statistics.median(ratios) if ratios else None
    med_ideal = statistics.median(r["ideal_speedup"] for r in rows)
    med_ray_over = statistics.median(r["ray_overhead_s"] for r in rows)
    med_serial_over = statistics.median(r["serial_overhead_s"] for r in rows)

    def med(kind: str, key: str) -> float:
        return statistics.median(r["runs"][kind][key] for r in rows)
    ok_speedup = med_speedup >= SPEEDUP_GOAL
    starts = sorted(float(load1(r, k)) for r in rows for k in ("serial", "ray"))
    ok_ratio = med_ratio is not None and med_ratio >= RATIO_GOAL
    doc = {
        "trials": args.trials, "slots": slots, "seeds": args.seeds, "address": cluster.address,
        "cluster_start_s": round(cluster_s, 2), "uptime_before": uptime_before,
        "uptime_after": uptime_after, "rows": rows,
        "median_speedup": med_speedup, "median_best_ratio": med_ratio,
        "median_ideal_speedup": med_ideal, "median_ray_overhead_s": med_ray_over,
        "median_serial_overhead_s": med_serial_over, "load_at_starts": [starts[0], starts[-1]],
        "goal": {"speedup": SPEEDUP_GOAL, "best_ratio": RATIO_GOAL,
                 "speedup_met": ok_speedup, "best_ratio_met": ok_ratio},
    }
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
    print(table(rows))
    print(f"median speedup {med_speedup:.2f}x (goal >= {SPEEDUP_GOAL}): "
          f"{'met' if ok_speedup else 'MISSED'}; ideal from trial durations {med_ideal:.2f}x; "
          f"load (1 min) {starts[0]:.2f}-{starts[-1]:.2f} at the runs' starts, {loadavg()} now "
          f"({os.cpu_count()} CPUs)")
    print(f"median best ratio ray/serial {fmt(med_ratio, '.3f')} (goal >= {RATIO_GOAL}): "
          f"{'met' if ok_ratio else 'MISSED'}")
    print(f"median overhead beyond trials: serial {med_serial_over:.1f} s, "
          f"ray {med_ray_over:.1f} s (wall - busiest slot)")
    for kind in ("serial", "ray"):
        print(f"median {kind:6s}: start-up {med(kind, 'startup_s'):.1f} s, span "
              f"{med(kind, 'span_s'):.1f} s, end {med(kind, 'teardown_s'):.1f} s, "
              f"trials' records beyond their durations (summed) {med(kind, 'beyond_trial_s'):.1f} s, idle slot-s "
              f"{med(kind, 'idle_slot_s'):.1f}")
    print(f"before: {uptime_before}")
    print(f"after:  {uptime_after}")
    return 0 if ok_speedup and ok_ratio else 1


if __name__ == "__main__":
    sys.exit(main())
