"""Summarise the `study show --json` documents of bench/gpu/transformers_study.sh.

Writes OUT/summary.json (per study: trials with outcome, failure kind and message, throughput,
startup_s, duration; the best trial vs the baseline) and OUT/summary.md (the same as tables, for
docs/BENCHMARKS.md). Needs nothing beyond the standard library.

    python bench/gpu/summarize.py --out OUT [--model-info model.json] OUT/show-c16.json ...
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any


def _study(doc: dict[str, Any]) -> dict[str, Any]:
    trials = []
    for t in doc.get("trials", []):
        failure = t.get("failure") or {}
        trials.append({
            "number": t.get("number"),
            "baseline": bool(t.get("baseline")),
            "state": t.get("state"),
            "outcome": t.get("outcome"),
            "params": t.get("params"),
            "value": t.get("value"),
            "startup_s": t.get("startup_s"),
            "duration_s": t.get("duration_s"),
            "failure_kind": failure.get("kind"),
            "failure_message": (failure.get("message") or "")[:300] or None,
            "metrics": {k: (t.get("metrics") or {}).get(k) for k in (
                "output_throughput", "total_throughput", "request_throughput", "completed", "failed",
                "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "median_itl_ms", "duration_s")},
        })
    ok = [t for t in trials if t["outcome"] == "ok" and t["value"] is not None]
    # The best as `study best` chooses it: the configuration with the best mean of its measurements
    # (the study's confirmation runs measure the top ones again), reported at its first trial.
    groups: dict[str, list[dict[str, Any]]] = {}
    for t in ok:
        groups.setdefault(json.dumps(t["params"], sort_keys=True, default=str), []).append(t)
    best = None
    if groups:
        rows = max(groups.values(), key=lambda g: sum(t["value"] for t in g) / len(g))
        best = {**rows[0], "value": sum(t["value"] for t in rows) / len(rows), "measured_in": [t["number"] for t in rows]}
    base = next((t for t in trials if t["baseline"] and t["value"] is not None), None)
    startups = [t["startup_s"] for t in trials if t["startup_s"] is not None]
    return {
        "study": doc.get("study"),
        "metric": doc.get("metric"),
        "trials": trials,
        "counts": {o: sum(t["outcome"] == o for t in trials) for o in sorted({t["outcome"] for t in trials if t["outcome"]})},
        "best": best,
        "baseline_value": None if base is None else base["value"],
        "best_vs_baseline": None if not (best and base and base["value"]) else round(best["value"] / base["value"], 3),
        "startup_s": None if not startups else {"min": min(startups), "max": max(startups),
                                                 "mean": round(sum(startups) / len(startups), 2)},
    }


def _fmt(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _markdown(summary: dict[str, Any]) -> str:
    lines = ["# transformers serve --continuous-batching on one GPU", ""]
    if summary.get("model"):
        lines += [f"model: {json.dumps(summary['model'])}", ""]
    for s in summary["studies"]:
        lines += [f"## {s['study']} ({s['metric']})", "",
                  f"outcomes: {s['counts']}; baseline {_fmt(s['baseline_value'])}; best "
                  f"{_fmt(s['best'] and s['best']['value'])} (trial {s['best'] and s['best']['number']}, "
                  f"{_fmt(s['best_vs_baseline'])}x); startup_s {s['startup_s']}", "",
                  "| # | outcome | failure | output tok/s | startup s | trial s | parameters |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        for t in s["trials"]:
            params = " ".join(f"{k}={v}" for k, v in (t["params"] or {}).items())
            msg = t["failure_kind"] or ""
            if t["failure_message"]:
                msg += ": " + re.sub(r"\s+", " ", t["failure_message"])[:120].replace("|", "/")
            lines.append(f"| {t['number']}{' (baseline)' if t['baseline'] else ''} | {t['outcome']} | {msg} | "
                         f"{_fmt(t['value'])} | {_fmt(t['startup_s'])} | {_fmt(t['duration_s'])} | {params} |")
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--model-info", type=Path)
    ap.add_argument("shows", nargs="*", type=Path)
    args = ap.parse_args()
    studies = []
    for path in args.shows:
        try:
            studies.append(_study(json.loads(path.read_text())))
        except (OSError, ValueError) as exc:
            studies.append({"study": path.name, "metric": None, "trials": [], "counts": {}, "best": None,
                            "baseline_value": None, "best_vs_baseline": None, "startup_s": None,
                            "error": f"{type(exc).__name__}: {exc}"})
    model = None
    if args.model_info and args.model_info.is_file():
        try:
            model = json.loads(args.model_info.read_text().strip().splitlines()[-1])
        except (ValueError, IndexError):
            model = None
    summary = {"model": model, "studies": studies,
               "trials": sum(len(s["trials"]) for s in studies)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    (args.out / "summary.md").write_text(_markdown(summary))
    print(_markdown(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
