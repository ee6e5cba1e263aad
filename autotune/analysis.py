"""After a study: which values crash, which parameters matter, and how sure we are.

Read-only over the storage. :func:`explain` returns one JSON-able document; ``autotune study
explain`` prints it. Trials of an ablation (user attr ``ablation``) are left out: they repeat
chosen configurations and would count the same evidence several times.

Crash rules (:func:`failure_rules`; :func:`crash_rules`: their printed lines alone)
-----------------------------------------------------------------------------------

A rule is a conjunction of one or two conditions on the *applied* parameter values (``P=v``;
``P >= x`` / ``P <= x`` for a numeric parameter, or over the numbers of a categorical one such as
``[unset, 2, 4]``; ``x`` an observed value) and predicts one failure kind:
``NCCL_ALGO=Tree -> nccl-error (4 of 4)`` says 4 finished trials had Tree set and all 4 failed
with ``nccl-error``. Finished trials are the measured ones (``ok``; an SLO violation is measured,
not a crash) and the failed ones (``infeasible``); faults are the infrastructure's and say nothing
about a configuration. The rules are a minimal explanation of the failures, found for each
failure kind K by sequential greedy set cover:

1. What counts against a rule of kind K among the trials it covers: a success 1; a failure of
   another kind 0.5, or 0.25 once a rule of that kind explains it (a start-up that failed
   earlier, e.g. ``not-enough-memory`` before NCCL ever ran, cannot show a NCCL error; it only
   half refutes a rule about NCCL). Two passes: the second knows what the first explained.
2. A candidate explains at least ``min_support`` failures of K, with precision (failures over
   failures plus what counts against) at least ``min_precision``, and is unlikely by chance: the
   hypergeometric probability of that many K-failures among that many trials drawn from the
   study is below ``alpha`` (``alpha_pair`` for two conditions: many more pairs are tried).
3. Each step takes the surest candidate -- the highest lower bound (Wilson, 90 %) of its
   precision, which weighs purity and support together, so a pure rule takes its failures before
   a broader, less pure one that covers some of them too -- then the one explaining the most
   failures net of what counts against it, then the tightest; all over the trials no earlier
   rule covers: its failures are then explained and its trials leave the pool, so a later rule
   is judged only on what is left, and a rule whose failures another explains is never printed.
4. A pair of conditions is taken only when it is surer than any single condition -- neither
   alone explains those failures -- and only when each condition goes with the failures
   on its own (``alpha_alone``) *and* matters given the other (among the trials one covers, the
   other picks out the failures beyond chance, ``alpha_within``, both ways). Both tests keep out
   the pairs that the sampler's habits make look good (the search concentrates every parameter
   near the best trials, so any parameter seems to "split" a few trials).
5. Each failure is attributed to the first rule that covers it; the others are reported as
   explained by no rule. Values of other parameters that every failure of a rule also had are
   listed with it (``also_in_all``): the data cannot tell those apart from the rule.

A value that merely co-occurred with the cause (``speculative_num_draft_tokens=4`` in the two
trials that both had ``NCCL_ALGO=Tree``) explains nothing once the cause is taken, so it is not
printed; failures of two kinds are never one rule; two failures are no rule.

Importance (:func:`importance`)
-------------------------------

For each parameter, the share of a target's variance that *only it* accounts for, for the
objective over the feasible trials and for feasibility (1 ok, 0 otherwise) over all finished
trials. The model is additive over the parameters' groups (the values of a categorical one;
quantile bins of a numeric one, 2 to 5 with the number of trials), fitted by backfitting with
group means shrunk by one pseudo-trial. A parameter's share is the residual sum of squares the
model saves with it (at twice the resolution, so an effect confined to a few values is seen)
over the model without it, less what its extra group means would save by chance, over the total;
its *spread* is the same as a standard deviation, relative to the mean objective (absolute for
feasibility). Given the others, because the sampler concentrates every parameter near the best
trials: alone, a parameter with no effect goes with the objective as much as the ones that have
one (``alone`` in the JSON shows it). The interval is a bootstrap over trials (``RESAMPLES``
resamples: the median and the 5-95 % range). Verdicts:

- ``not enough trials (N, need M)`` below ``MIN_TRIALS`` trials of the target;
- ``effect`` when the share's low end is at least ``EFFECT_SHARE``, and so is the low end of
  its share alone (a parameter that only seems to matter given the others may be the sampler's
  doing; one that matters but hides behind another stays ``uncertain``);
- ``no measurable effect`` only with evidence: at least ``NO_EFFECT_MIN_TRIALS`` trials, every
  value (or bin) tried at least ``MIN_GROUP`` times, the share's high end below
  ``NO_EFFECT_SHARE`` and the spread's high end below ``NO_EFFECT_SPREAD`` (2 % of the mean
  objective, about the run-to-run noise of a measurement); it holds over the values tried
  (``values`` in the JSON), not beyond;
- ``uncertain`` otherwise: the data cannot tell.

Why not fANOVA: Optuna's needs scikit-learn (not a dependency) and a forest per bootstrap
resample, and its importances are normalised to sum to 1, so a parameter with no effect still
gets a share of the noise (Optuna's default evaluator, PED-ANOVA, gave
``num_continuous_decode_steps`` 0.24 on the demo, where it has no effect). The additive model is
cheap enough to bootstrap (about a second for 100 trials), reads as "accounts for this much of
the variation", and with its bias correction sits near 0 for a parameter with no effect. Its
limit: an interaction is split between its parameters (the crash rules cover the interactions
that crash), and a parameter that always moved with another during the search cannot be told
apart from it -- the interval stays wide and the verdict "uncertain".
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
import optuna
from optuna.trial import TrialState

from autotune.crash_rules import MIN_SUPPORT, failure_rules, finished, is_number, rule_settings
from autotune.study_view import TrialView, view

MIN_TRIALS = 20
"""Fewest trials (feasible ones for the objective, finished ones for feasibility) for importances."""
RESAMPLES = 40
RIDGE = 1.0
SWEEPS = 12
EFFECT_SHARE = 0.05
NO_EFFECT_SHARE = 0.05
NO_EFFECT_SPREAD = 0.02
"""Objective: "no measurable effect" needs the spread's high end below 2 % of the mean objective."""
NO_EFFECT_SPREAD_FEASIBILITY = 0.05
NO_EFFECT_MIN_TRIALS = 40
MIN_GROUP = 5
"""A value (or bin) tried fewer times than this leaves its effect unknown: no "no measurable effect"."""
INTERVAL = (5.0, 95.0)


# -- importance ----------------------------------------------------------------------------------
def _groups(values: list[Any], n_bins: int) -> np.ndarray | None:
    """Group index of each row: the value (categorical) or a quantile bin (numeric); None if the
    parameter has a single value."""
    present = [x for x in values if x is not None]
    if len(set(map(repr, present))) < 2:
        return None
    if present and all(is_number(x) for x in present):
        arr = np.array([float(x) if x is not None else np.nan for x in values])
        ok = ~np.isnan(arr)
        sorted_vals = np.sort(arr[ok])
        uniq = np.unique(sorted_vals)
        if len(uniq) <= n_bins:
            idx = np.searchsorted(uniq, arr)
        else:  # quantile bins by the rank of a value's first occurrence: equal values stay together
            idx = np.minimum(n_bins - 1, np.searchsorted(sorted_vals, arr, side="left") * n_bins // len(sorted_vals))
        idx = np.where(ok, idx, n_bins)
        return np.unique(idx, return_inverse=True)[1]
    keys = [repr(x) for x in values]
    return np.unique(np.array(keys, dtype=object), return_inverse=True)[1]


def _epsilon_sq(y: np.ndarray, g: np.ndarray, sst: float) -> tuple[float, float]:
    """What groups ``g`` account for in ``y``: the bias-corrected share of ``sst`` and the spread
    (the standard deviation over rows of the group effects, bias-corrected, in ``y``'s units)."""
    n = len(y)
    k_max = int(g.max()) + 1
    counts = np.bincount(g, minlength=k_max)
    sums = np.bincount(g, weights=y, minlength=k_max)
    means = np.divide(sums, counts, out=np.zeros(k_max), where=counts > 0)
    k = int((counts > 0).sum())
    fitted = means[g]
    ssb = float(((fitted - y.mean()) ** 2).sum())
    ssw = float(((y - fitted) ** 2).sum())
    if n - k <= 0 or sst <= 0:
        return 0.0, 0.0
    excess = max(0.0, ssb - (k - 1) * ssw / (n - k))
    return excess / sst, math.sqrt(excess / n)


def _backfit(y: np.ndarray, groups: list[np.ndarray], sizes: list[int], skip: frozenset[int] = frozenset()) -> np.ndarray:
    """Residuals of the additive model ``y ~ mean + sum_c f_c(group_c)`` over the components ``c``
    not in ``skip``, fitted by backfitting with each group mean shrunk by ``RIDGE`` pseudo-trials."""
    r = y - y.mean()
    comps = [np.zeros(k) for k in sizes]
    for _ in range(SWEEPS):
        for c, g in enumerate(groups):
            if c in skip:
                continue
            part = r + comps[c][g]
            new = np.bincount(g, weights=part, minlength=sizes[c]) / (np.bincount(g, minlength=sizes[c]) + RIDGE)
            new -= new[g].mean()
            r = part - new[g]
            comps[c] = new
    return r


def _partial(y: np.ndarray, groups: list[np.ndarray], fine: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Each parameter's share of the total variance that only it accounts for, and its spread (the
    same as a standard deviation over trials, in ``y``'s units).

    For parameter ``j`` the additive model is fitted with ``j`` at a finer resolution (``fine``: an
    effect confined to a few of its values is not averaged away in a wide bin) and without ``j``;
    the share is the residual sum of squares ``j`` saves, less what its ``k - 1`` group means would
    save by chance (``k - 1`` times the residual variance)."""
    n = len(y)
    sst = float(((y - y.mean()) ** 2).sum())
    shares, spreads = np.zeros(len(groups)), np.zeros(len(groups))
    if sst <= 0:
        return shares, spreads
    sizes = [int(g.max()) + 1 for g in groups]
    for j in range(len(groups)):
        with_j = groups[:j] + [fine[j]] + groups[j + 1:]
        sizes_j = sizes[:j] + [int(fine[j].max()) + 1] + sizes[j + 1:]
        rss = float((_backfit(y, with_j, sizes_j) ** 2).sum())
        s2 = rss / max(n - 1 - sum(k - 1 for k in sizes_j), 1)
        saved = float((_backfit(y, groups, sizes, skip=frozenset([j])) ** 2).sum()) - rss
        excess = max(0.0, saved - (sizes_j[j] - 1) * s2)
        shares[j], spreads[j] = excess / sst, math.sqrt(excess / n)
    return shares, spreads


def _n_bins(n: int) -> int:
    return 2 if n < 40 else 3 if n < 80 else 4 if n < 160 else 5


def _marginal(y: np.ndarray, groups: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Each parameter's share and spread alone (one-way, bias-corrected)."""
    sst = float(((y - y.mean()) ** 2).sum())
    out = [_epsilon_sq(y, g, sst) for g in groups]
    return np.array([o[0] for o in out]), np.array([o[1] for o in out])


def importance_of(rows: list[dict[str, Any]], y: Sequence[float], *, relative: bool, min_trials: int = MIN_TRIALS,
                  resamples: int = RESAMPLES, seed: int = 0) -> dict[str, Any]:
    """Each parameter's share of ``y``'s variance and spread, given the others and alone (see the
    module docstring); spreads relative to ``y``'s mean when ``relative``, else in ``y``'s units."""
    n = len(rows)
    names = sorted({k for r in rows for k in r})
    doc: dict[str, Any] = {"trials": n, "min_trials": min_trials, "params": {}}
    if n < min_trials:
        doc["verdict"] = f"not enough trials ({n}, need {min_trials})"
        return doc
    yv = np.asarray(y, dtype=float)
    if float(yv.std()) == 0.0:
        doc["verdict"] = "the target does not vary"
        return doc
    scale = (abs(float(yv.mean())) or 1.0) if relative else 1.0

    no_effect_spread = NO_EFFECT_SPREAD if relative else NO_EFFECT_SPREAD_FEASIBILITY
    nb = _n_bins(n)
    named = [(name, _groups([r.get(name) for r in rows], nb)) for name in names]
    varied = [(name, g) for name, g in named if g is not None]
    fines: list[np.ndarray] = [_groups([r.get(name) for r in rows], max(2 * nb, n // (2 * MIN_GROUP)))  # type: ignore[misc]
                               for name, _ in varied]
    doc["verdict"] = "ok"
    rng = np.random.default_rng(seed)
    share, spread, share1, spread1 = (np.empty((resamples, len(varied))) for _ in range(4))
    for b in range(resamples):
        # a bootstrap: its repeated trials fit some of their own noise, which biases shares up --
        # the safe side for "no measurable effect" (half-samples, unbiased, made false claims)
        idx = rng.integers(0, n, n)
        gs = [np.unique(g[idx], return_inverse=True)[1] for _, g in varied]
        fs = [np.unique(g[idx], return_inverse=True)[1] for g in fines]
        share[b], spread[b] = _partial(yv[idx], gs, fs)
        share1[b], spread1[b] = _marginal(yv[idx], gs)
    spread /= scale
    spread1 /= scale
    lo_q, hi_q = INTERVAL
    for j, (name, _) in enumerate(varied):
        med, lo, hi = float(np.median(share[:, j])), float(np.percentile(share[:, j], lo_q)), float(np.percentile(share[:, j], hi_q))
        alone = [float(np.median(share1[:, j])), float(np.percentile(share1[:, j], lo_q)), float(np.percentile(share1[:, j], hi_q))]
        spread_hi = float(np.percentile(spread[:, j], hi_q))
        if lo >= EFFECT_SHARE and alone[1] >= EFFECT_SHARE:  # given the others and alone
            verdict = "effect"
        elif (n >= NO_EFFECT_MIN_TRIALS and hi < NO_EFFECT_SHARE and spread_hi < no_effect_spread
              and int(np.bincount(fines[j]).min()) >= MIN_GROUP):
            verdict = "no measurable effect"
        else:
            verdict = "uncertain"
        doc["params"][name] = {"median": round(med, 4), "low": round(lo, 4), "high": round(hi, 4), "verdict": verdict,
                               "alone": {"median": round(alone[0], 4), "low": round(alone[1], 4), "high": round(alone[2], 4)},
                               "spread": round(float(np.median(spread[:, j])), 4), "spread_high": round(spread_hi, 4),
                               "values": _tried([r.get(name) for r in rows])}
    for name, g in named:
        if g is None:
            doc["params"][name] = {"verdict": "not varied", "values": _tried([r.get(name) for r in rows])}
    doc["params"] = dict(sorted(doc["params"].items(), key=lambda kv: -kv[1].get("median", -1.0)))
    return doc


def _tried(values: list[Any]) -> Any:
    """The values tried: ``[min, max]`` of a numeric parameter, else the distinct values."""
    present = [x for x in values if x is not None]
    if present and all(is_number(x) for x in present):
        return [min(present), max(present)]
    return list({repr(x): x for x in present}.values())


def importance(views: Sequence[TrialView]) -> dict[str, Any]:
    """Importance for the objective (feasible trials) and for feasibility (finished trials)."""
    rows = finished(views)
    feasible = [v for v in rows if v.outcome == "ok" and v.value is not None]
    objective = importance_of([v.params for v in feasible], [float(v.value) for v in feasible],  # type: ignore[arg-type]
                              relative=True)
    feas = importance_of([v.params for v in rows], [1.0 if v.outcome == "ok" else 0.0 for v in rows], relative=False)
    method = (f"share of the variance only this parameter accounts for in an additive model over all parameters "
              f"(backfitting, bias-corrected), bootstrap over trials "
              f"({RESAMPLES} resamples, {INTERVAL[0]:g}-{INTERVAL[1]:g} % interval)")
    return {"method": method, "effect_share": EFFECT_SHARE, "no_effect_share": NO_EFFECT_SHARE,
            "objective": objective, "feasibility": feas}


# -- the document --------------------------------------------------------------------------------
def analysed_views(study: optuna.Study) -> list[TrialView]:
    """The trials the analysis reads: all but ablation runs and trials still waiting in the queue."""
    return [view(t) for t in study.get_trials(deepcopy=False)
            if not t.user_attrs.get("ablation") and t.state != TrialState.WAITING]


def crash_rules(study: optuna.Study) -> list[str]:
    """The study's crash rules as ``study explain`` prints them (``NCCL_ALGO=Tree -> nccl-error
    (4 of 4)``), in its order; the rules alone, without the importances' bootstrap, so cheap enough
    for the end of every study."""
    return [str(r) for r in failure_rules(analysed_views(study)).rules]


def explain(study: optuna.Study) -> dict[str, Any]:
    """Outcome counts, failure kinds, crash rules and importances, as one JSON-able document."""
    views = analysed_views(study)
    report = failure_rules(views)
    kinds = Counter(v.failure_kind for v in views if v.failure_kind)
    imp = importance(views)
    objective = study.user_attrs.get("objective") or {}
    return {
        "study": study.study_name,
        "trials": len(views),
        "finished": report.finished,
        "outcomes": dict(Counter(v.outcome for v in views)),
        "failure_kinds": dict(kinds),
        "failure_rules": [r.to_json() for r in report.rules],
        "unexplained_failures": report.unexplained_json(),
        "rule_settings": rule_settings(),
        "metric": objective.get("metric"),
        "importance": imp,
    }


__all__ = ["MIN_SUPPORT", "analysed_views", "crash_rules", "explain", "failure_rules", "importance", "importance_of"]
