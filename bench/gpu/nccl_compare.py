"""Markdown table: NCCL defaults vs the study's best, per op and message size.

    python bench/gpu/nccl_compare.py DEFAULTS.json DEFAULTS2.json BEST.json SHOW.json
"""

from __future__ import annotations

import json
import sys
from collections import Counter


def _rows(path: str) -> tuple[dict[tuple[str, int], dict], dict]:
    """The benchmark's results keyed by (op, bytes), and the whole document."""
    with open(path) as f:
        doc = json.load(f)
    return {(r["op"], r["bytes"]): r for r in doc["results"]}, doc


def main() -> None:
    (d1, doc1), (d2, _), (best, bdoc), show = _rows(sys.argv[1]), _rows(sys.argv[2]), _rows(sys.argv[3]), json.load(open(sys.argv[4]))
    print(f"world size {doc1['world_size']}, {doc1.get('device')}, NCCL {doc1.get('nccl_version')}, torch {doc1.get('torch_version')}")
    print(f"best env: {bdoc.get('env')}")
    print(f"NCCL memory (MiB, max over ranks): defaults {doc1.get('nccl_mem_mib')}, best {bdoc.get('nccl_mem_mib')}\n")
    print("| op | bytes | default mean latency us (run 1 / run 2) | best mean latency us | best/default | default busbw GB/s | best busbw GB/s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for key in sorted(d1, key=lambda k: (k[0], k[1])):
        a, a2, b = d1[key], d2.get(key), best.get(key)
        if b is None:
            continue
        base = (a["latency_us"]["mean"] + (a2["latency_us"]["mean"] if a2 else a["latency_us"]["mean"])) / (2 if a2 else 1)
        print(f"| {key[0]} | {key[1]} | {a['latency_us']['mean']:.1f} / {a2['latency_us']['mean'] if a2 else float('nan'):.1f} "
              f"| {b['latency_us']['mean']:.1f} | {b['latency_us']['mean'] / base:.2f} | {a['busbw_gbps']:.1f} | {b['busbw_gbps']:.1f} |")
    trials = show["trials"]
    outcomes = Counter(t["outcome"] for t in trials)
    kinds = Counter((t["failure"] or {}).get("kind") for t in trials if t["failure"])
    print(f"\ntrials: {len(trials)}, outcomes {dict(outcomes)}, failure kinds {dict(kinds)}")
    print("median trial duration s:", sorted(t["duration_s"] or 0 for t in trials)[len(trials) // 2])


if __name__ == "__main__":
    main()
