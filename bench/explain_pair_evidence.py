"""How much evidence the explain bench's studies hold for the planted interactions that
``study explain`` states seldom: the most any rule over the two parameters could state, study
by study.

``bench/explain_truth.py`` counts an interaction as shown where a study's failures need both
parameters (its ``BEHAVIOURS``), and as stated where ``study explain`` prints a rule over both.
``explain`` asks a two-condition rule for ``MIN_PAIR_SUPPORT`` failures and, for each condition,
that it picks the failures out among the trials the other covers below ``ALPHA_WITHIN``
(:mod:`autotune.analysis.crash_rules`, step 5). For each form below, this script takes each study that
shows the interaction and searches every rule of the form over the values the study tried, for
the one with the most failures of its kind and no trial that ran (the best such a rule could
claim; failures of other kinds are left aside), and prints:

- its failures, against the ``MIN_PAIR_SUPPORT`` a pair needs, counted before any other rule
  takes some: an upper bound on what the rule could rest on;
- for each condition, the chance that it picks those failures out among the trials the other
  one covers (hypergeometric over the failures of the kind and the runs; ``a needed`` is the
  first condition's among the trials the second covers; above ``ALPHA_WITHIN`` the data do not
  show that condition is needed: the other one plus a coincidence explains the failures too);
- how true it is: the share of interventions in the model that fail as it says (the explain
  bench's test, which redraws a derived quantity's inputs; 0.8 and above is true, below 0.5
  false).

The forms: on the Kimi host's ``seed`` design, channels x ``mem_fraction_static``
(``NCCL_MAX_NCHANNELS <= c & mem_fraction_static >= m -> oom``: the simulated engine captures
CUDA graphs with more memory when fewer channels are allowed, out of what the fraction leaves);
on the GLM-5 host's ``sglang_nccl`` design, oversized NCCL buffers x ``mem_fraction_static``
(``nccl_buffers_mib >= b & mem_fraction_static >= m -> nccl-error``: the buffers are allocated
out of what the fraction leaves, and what the other parameters take of it moves the boundary).

Run from the repository root: ``python bench/explain_pair_evidence.py`` (the explain bench's
seeds: 20 studies of 30 trials, 10 of 100 and 3 of 200 per form; 1.6 min on a 2-core machine).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from explain_truth import BEHAVIOURS, designs, rule_truth, run_study  # noqa: E402

from autotune.analysis.rule_cover import ALPHA_WITHIN, MIN_PAIR_SUPPORT  # noqa: E402
from autotune.analysis.rule_stats import hypergeom_tail  # noqa: E402
from autotune.config.derived import DERIVED, derived_value  # noqa: E402
from autotune.study.driver import finished_trials  # noqa: E402


@dataclass(frozen=True)
class Form:
    """A two-condition rule's form: ``a op_a x & b op_b y -> kind``, for the interaction
    ``BEHAVIOURS[behaviour]`` on ``scenario``'s ``design``; ``unset``: ``a``'s value when a trial
    leaves it unset (NCCL's own)."""

    scenario: str
    design: str
    behaviour: int
    kind: str
    a: str
    op_a: str
    b: str
    op_b: str
    unset: float | None = None

    def value(self, name: str, applied: dict[str, Any]) -> float | None:
        if name in DERIVED:
            return derived_value(name, applied)
        raw = applied.get(name)
        return self.unset if raw is None or str(raw).lower() == "unset" else float(raw)


FORMS = (
    Form("rtx6000-pcie-kimi-eagle3", "seed", 2, "oom", "NCCL_MAX_NCHANNELS", "<=", "mem_fraction_static", ">=",
         unset=64),
    Form("rtx6000-pcie-glm5", "sglang_nccl", 1, "nccl-error", "nccl_buffers_mib", ">=", "mem_fraction_static", ">="),
)


def _holds(value: float | None, op: str, bound: float) -> bool:
    return value is not None and (value <= bound if op == "<=" else value >= bound)


def best_pair(form: Form, rows: list[tuple[float | None, float | None, str]]) -> dict[str, Any] | None:
    """Of the rules of ``form`` over the tried values with no trial that ran among those they
    cover: the one with the most failures of its kind, then the least chance on its weaker
    side. ``rows``: (a's value, b's value, outcome or failure kind) per trial."""
    best: tuple[tuple[int, float], dict[str, Any]] | None = None
    for x in sorted({r[0] for r in rows if r[0] is not None}):
        for y in sorted({r[1] for r in rows if r[1] is not None}):
            in_a = [_holds(r[0], form.op_a, x) for r in rows]
            in_b = [_holds(r[1], form.op_b, y) for r in rows]
            inside = [r for r, ha, hb in zip(rows, in_a, in_b) if ha and hb]
            failed = sum(r[2] == form.kind for r in inside)
            if failed < 2 or any(r[2] == "ok" for r in inside):
                continue
            chances = []  # within the rows one condition covers, the other's chance
            for holds in (in_b, in_a):
                within = [r for r, h in zip(rows, holds) if h and r[2] in (form.kind, "ok")]
                chances.append(hypergeom_tail(len(within), sum(r[2] == form.kind for r in within), failed, failed))
            key = (failed, -max(chances))
            if best is None or key > best[0]:
                best = (key, {"a": x, "b": y, "failures": failed, "chance_a_needed": round(chances[0], 4),
                              "chance_b_needed": round(chances[1], 4)})
    return None if best is None else best[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ns = ap.parse_args(argv)
    out = []
    for form in FORMS:
        d = next(x for x in designs(form.scenario) if x.name == form.design)
        shown = BEHAVIOURS[form.behaviour]
        for first, count, trials in ((0, 20, 30), (1000, 10, 100), (1000, 3, 200)):
            for seed in range(first, first + count):
                done = finished_trials(run_study(d, seed, trials - 1))
                showing = shown.showing(d, done)
                if len(showing) < 3:  # the explain bench's MIN_SUPPORT: no rule of one kind below it
                    continue
                rows = [(form.value(form.a, t.user_attrs["applied"]), form.value(form.b, t.user_attrs["applied"]),
                         t.user_attrs.get("failure_kind") or "ok") for t in done]
                rec: dict[str, Any] = {"scenario": form.scenario, "design": form.design, "trials": trials,
                                       "seed": seed, "showing": len(showing), "best": best_pair(form, rows)}
                if rec["best"] is not None:
                    b = rec["best"]
                    b["rule"] = f"{form.a} {form.op_a} {b['a']:g} & {form.b} {form.op_b} {b['b']:g} -> {form.kind}"
                    rule = {"kind": form.kind, "conditions": [{"param": form.a, "op": form.op_a, "value": b["a"]},
                                                              {"param": form.b, "op": form.op_b, "value": b["b"]}]}
                    rate, tested = rule_truth(d, rule, [dict(t.user_attrs["applied"]) for t in done], seed)
                    b["model_rate"], b["tested"] = round(rate, 3), tested
                out.append(rec)
    if ns.json:
        print(json.dumps({"min_pair_support": MIN_PAIR_SUPPORT, "alpha_within": ALPHA_WITHIN, "studies": out},
                         indent=1))
        return 0
    print(f"a pair needs {MIN_PAIR_SUPPORT} failures and each condition needed below {ALPHA_WITHIN}")
    for rec in out:
        b = rec["best"]
        head = f"{rec['scenario']}/{rec['design']} n{rec['trials']} s{rec['seed']} ({rec['showing']} showing): "
        if b is None:
            print(head + "no rule of the form covers 2 failures and no run")
            continue
        print(head + f"{b['rule']}: {b['failures']} failures, a needed {b['chance_a_needed']:.3f}, "
              f"b needed {b['chance_b_needed']:.3f}, model {b['model_rate']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
