"""How much evidence the explain bench's studies hold for the channels x ``mem_fraction_static``
interaction: the most any rule over the two could state, study by study.

``bench/explain_truth.py`` counts the interaction as shown where a study's out-of-memory
failures need both a channel cap below the host's default and a high ``mem_fraction_static``
(the simulated engine captures CUDA graphs with more memory when fewer channels are allowed,
out of what the memory fraction leaves), and as stated where ``study explain`` prints a rule
over both. ``explain`` asks a two-condition rule for ``MIN_PAIR_SUPPORT`` failures and, for each
condition, that it picks the failures out among the trials the other covers below
``ALPHA_WITHIN`` (:mod:`autotune.crash_rules`, step 5). This script takes each study that shows
the interaction and searches every rule of its form, ``NCCL_MAX_NCHANNELS <= c &
mem_fraction_static >= m -> oom``, over the values the study tried, for the one with the most
failures and no trial that ran (the best a rule of this form could claim), and prints:

- its failures, against the ``MIN_PAIR_SUPPORT`` a pair needs;
- for each condition, the chance that it picks those failures out among the trials the other
  one covers (hypergeometric; ``cap needed`` is the cap's among the trials at the fraction or
  above; a chance above ``ALPHA_WITHIN`` means the data do not show that condition is needed:
  the other one plus a coincidence explains the failures as well). The failures are counted
  before any other rule takes some: an upper bound on what the rule could rest on;
- how true it is: the share of interventions in the model that fail as it says (the explain
  bench's test; 0.8 and above is true, below 0.5 false).

Run from the repository root: ``python bench/explain_pair_evidence.py`` (the explain bench's
designs and seeds: 20 studies of 30 trials, 10 of 100 and 3 of 200 on the Kimi host's ``seed``
design, where the interaction is planted; about 2 minutes).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from explain_truth import BEHAVIOURS, designs, rule_truth, run_study  # noqa: E402
from optuna.trial import TrialState  # noqa: E402

from autotune.crash_rules import ALPHA_WITHIN, MIN_PAIR_SUPPORT, hypergeom_tail  # noqa: E402

MEMORY = BEHAVIOURS[2]
CHANNELS, FRACTION = "NCCL_MAX_NCHANNELS", "mem_fraction_static"


def best_pair(rows: list[tuple[int, float, str]]) -> dict[str, Any] | None:
    """Of the rules ``channels <= c & fraction >= m -> oom`` over the tried values with no trial
    that ran among those they cover: the one with the most failures, then the least chance on
    its weaker side. ``rows``: (channel cap, fraction, outcome or failure kind) per trial."""
    best: tuple[tuple[int, float], dict[str, Any]] | None = None
    for c in sorted({r[0] for r in rows}):
        for m in sorted({r[1] for r in rows}):
            inside = [r for r in rows if r[0] <= c and r[1] >= m]
            failed = sum(r[2] == "oom" for r in inside)
            if failed < 2 or any(r[2] == "ok" for r in inside):
                continue
            chances = []
            for holds in (lambda r: r[0] <= c, lambda r: r[1] >= m):  # within one side, the other picks them out
                within = [r for r in rows if holds(r) and r[2] in ("oom", "ok")]
                chances.append(hypergeom_tail(len(within), sum(r[2] == "oom" for r in within), failed, failed))
            key = (failed, -max(chances))
            if best is None or key > best[0]:
                # chances[0]: within the rows the cap covers, the fraction's; chances[1]: the cap's
                best = (key, {"cap": c, "fraction": m, "failures": failed,
                              "chance_cap_needed": round(chances[1], 4),
                              "chance_fraction_needed": round(chances[0], 4)})
    return None if best is None else best[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ns = ap.parse_args(argv)
    d = next(x for x in designs("rtx6000-pcie-kimi-eagle3") if x.name == "seed")
    out = []
    for first, count, trials in ((0, 20, 30), (1000, 10, 100), (1000, 3, 200)):
        for seed in range(first, first + count):
            study = run_study(d, seed, trials - 1)
            done = [t for t in study.get_trials(deepcopy=False) if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
            showing = [t for t in done if t.user_attrs.get("failure_kind")
                       and MEMORY.shown(d, t.user_attrs["applied"], t.user_attrs["failure_kind"])]
            if len(showing) < 3:  # the explain bench's MIN_SUPPORT: no rule of one kind below it
                continue
            rows = [(int(t.user_attrs["applied"].get(CHANNELS) or 64), float(t.user_attrs["applied"][FRACTION]),
                     t.user_attrs.get("failure_kind") or "ok") for t in done]
            rec: dict[str, Any] = {"trials": trials, "seed": seed, "showing": len(showing), "best": best_pair(rows)}
            if rec["best"] is not None:
                b = rec["best"]
                rule = {"kind": "oom", "conditions": [{"param": CHANNELS, "op": "<=", "value": b["cap"]},
                                                      {"param": FRACTION, "op": ">=", "value": b["fraction"]}]}
                rate, tested = rule_truth(d, rule, [dict(t.user_attrs["applied"]) for t in done], seed)
                b["model_rate"], b["tested"] = round(rate, 3), tested
            out.append(rec)
    if ns.json:
        print(json.dumps({"min_pair_support": MIN_PAIR_SUPPORT, "alpha_within": ALPHA_WITHIN, "studies": out}, indent=1))
        return 0
    print(f"a pair needs {MIN_PAIR_SUPPORT} failures and each side's chance <= {ALPHA_WITHIN}")
    print("trials  seed  showing  best clean rule                                   fails  cap needed  mfs needed  model")
    for rec in out:
        b = rec["best"]
        if b is None:
            print(f"{rec['trials']:>6}  {rec['seed']:>4}  {rec['showing']:>7}  (no rule of the form covers 2 failures and no run)")
            continue
        rule = f"{CHANNELS} <= {b['cap']} & {FRACTION} >= {b['fraction']}"
        print(f"{rec['trials']:>6}  {rec['seed']:>4}  {rec['showing']:>7}  {rule:<48}  {b['failures']:>5}  "
              f"{b['chance_cap_needed']:>10.3f}  {b['chance_fraction_needed']:>10.3f}  {b['model_rate']:>5.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
