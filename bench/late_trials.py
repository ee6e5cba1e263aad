"""Who proposes the trials after the 10th, how often each fails or improves, and how well the
failure boundary foresaw the failures: on generated hosts of the development half (or a built-in scenario).

Each study is the default strategy (``autotune`` of ``autotune bench tuner``: the real driver
and sampler on the simulator's model, space ``sglang_nccl``, objective ``quick``). For every
launched trial after the ``--after``-th, what proposed it (``screen``, ``probe``, ``raise``,
``hint``, ``confirm``, else ``tpe``), whether it failed, and whether it beat the best measured
value so far by more than 1%. Then, for the TPE draws and the probes among them, each proposal's
chance of failing by two failure boundaries fitted to the trials before it: the one shipped
(:class:`~autotune.search.feasibility.FeasibilityModel` with the space's ``monotone:``
declarations) and a free fit that waits for 3 failures of a kind (the classifier before the
declarations signed it), as the area under the ROC curve (0.5: no better than a coin).

    python bench/late_trials.py --generated 0-47 --seeds 2 --trials 40
    python bench/late_trials.py --scenario rtx6000-pcie-kimi-eagle3 --seeds 10 --trials 60
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autotune.bench.family import family_files  # noqa: E402
from autotune.bench.setups import Setup  # noqa: E402
from autotune.bench.study_trace import StudyTask, run_trials  # noqa: E402
from autotune.search.feasibility import FeasibilityModel  # noqa: E402
from autotune.search.implied import SKIPPED  # noqa: E402
from autotune.sim.family import parse_seeds  # noqa: E402
from autotune.store.record import PROPOSED_ATTR  # noqa: E402

SPACE, OBJECTIVE = "sglang_nccl", "quick"


def study(args: tuple[str, int, int]) -> list[dict[str, Any]]:
    """One study's launched trials, in order: who proposed each, its outcome, kind and value."""
    path, seed, trials = args
    warnings.filterwarnings("ignore")
    task = StudyTask(Setup(path, SPACE, OBJECTIVE, None), "autotune", seed, trials, optimum=0.0)  # not scored here
    out = []
    for t in run_trials(task):
        if t.user_attrs.get("outcome") == SKIPPED:
            continue
        why = t.system_attrs.get(PROPOSED_ATTR) if isinstance(t.system_attrs.get(PROPOSED_ATTR), dict) else {}
        by = "confirm" if "confirms" in t.user_attrs else "screen" if why.get("screen") else str(why.get("by", "tpe"))
        outcome = t.user_attrs.get("outcome")
        out.append({"by": by, "outcome": outcome, "kind": t.user_attrs.get("failure_kind"), "params": dict(t.params),
                    "value": t.value if outcome == "ok" else None})
    return out


def tally(runs: list[list[dict[str, Any]]], after: int) -> dict[str, Counter[str]]:
    """Per proposer: late trials, failed, improved (beat the best so far by more than 1%)."""
    out: dict[str, Counter[str]] = {}
    for trials in runs:
        best = None
        for n, t in enumerate(trials, start=1):
            v = t["value"]
            if n > after:
                c = out.setdefault(t["by"], Counter())
                c["trials"] += 1
                c["failed"] += t["outcome"] == "infeasible"
                c["improved"] += v is not None and best is not None and v > best * 1.01
            if v is not None:
                best = v if best is None else max(best, v)
    return out


def auc(runs: list[list[dict[str, Any]]], after: int, who: str, signed: bool, space: Any) -> tuple[float, int, int]:
    """The boundary's area under the ROC curve over the late proposals of ``who`` (over the search
    ``space``); their count and how many failed."""
    dists, monotone = space.distributions(), space.monotone()
    scores: list[tuple[float, bool]] = []
    for trials in runs:
        for i, t in enumerate(trials):
            if i + 1 <= after or t["by"] != who:
                continue
            ran = [p["params"] for p in trials[:i] if p["outcome"] in ("ok", "stopped")]
            failed = [(p["kind"], p["params"]) for p in trials[:i] if p["outcome"] == "infeasible" and p["kind"]]
            if signed:
                model = FeasibilityModel(dists, monotone).fit(ran, failed)
            else:  # as it was: no signs, a kind modelled from its 3rd failure
                seen = Counter(k for k, _ in failed)
                model = FeasibilityModel(dists).fit(ran, [(k, p) for k, p in failed if seen[k] >= 3])
            scores.append((model.chance(t["params"]), t["outcome"] == "infeasible"))
    bad = [s for s, f in scores if f]
    good = [s for s, f in scores if not f]
    pairs = sum((b > g) + 0.5 * (b == g) for b in bad for g in good)
    return (pairs / (len(bad) * len(good)) if bad and good else float("nan")), len(scores), len(bad)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--generated", default="0-47", help="generated host seeds (A-B or a comma-separated mix)")
    ap.add_argument("--scenario", help="a built-in scenario instead of generated hosts")
    ap.add_argument("--seeds", type=int, default=2, help="studies per host (seeds 0 .. K-1)")
    ap.add_argument("--trials", type=int, default=40)
    ap.add_argument("--after", type=int, default=10, help="count the trials after this many launched")
    ap.add_argument("--jobs", type=int, default=2)
    a = ap.parse_args()
    files = [a.scenario] if a.scenario else family_files(parse_seeds(a.generated))
    tasks = [(f, s, a.trials) for f in files for s in range(a.seeds)]
    with ProcessPoolExecutor(max_workers=a.jobs) as pool:
        runs = list(pool.map(study, tasks))
    print(f"{len(runs)} studies ({len(files)} hosts x {a.seeds} seeds, {a.trials} trials); trials after the {a.after}th")
    space = Setup(files[0], SPACE, OBJECTIVE, None).space
    print(f"{'proposer':10s} {'trials':>7s} {'failed':>14s} {'improved':>14s}")
    for by, c in sorted(tally(runs, a.after).items(), key=lambda kv: -kv[1]["trials"]):
        print(f"{by:10s} {c['trials']:7d} {c['failed']:6d} ({c['failed'] / c['trials']:5.1%}) "
              f"{c['improved']:6d} ({c['improved'] / c['trials']:5.1%})")
    for who in ("tpe", "probe"):
        for signed in (True, False):
            area, n, bad = auc(runs, a.after, who, signed, space)
            name = "shipped (signed, from 1 failure)" if signed else "free fit, from 3 failures"
            print(f"boundary AUC over {who} proposals ({n}, {bad} failed), {name}: {area:.3f}")


if __name__ == "__main__":
    main()
