"""Which parameters matter, and how sure we are: importances with intervals and honest verdicts.

:func:`importance` rates each parameter for the objective (the trials measured to the end, and
those stopped early at their projected value: an upper bound of what they would have measured)
and for feasibility (1 ran, 0 failed, over the finished trials); :func:`importance_of` rates them
for one target. ``autotune study explain`` prints it (:mod:`autotune.analysis.explain`).

- **Shares** (:mod:`autotune.analysis.shares`): the share of the target's variance that only the
  parameter accounts for, given the others (below ``MIN_TRIALS``, those the permutation test
  found), in an additive ridge model, bias-corrected, with a bootstrap interval (``RESAMPLES``
  resamples, ``INTERVAL``); and its share alone (``alone``).
- **Matched comparisons** (:func:`matched_effect`): pairs of trials measured to the end, alike in
  every other parameter, whose differences give the spread of this one's effect. The sampler
  moves every parameter towards the best trials together, so only these can support "no
  measurable effect".

Verdicts (``sureness`` says in words how far the trials go):

- ``not enough trials (N, need M)`` below ``MIN_RATED``; for feasibility also ``not enough
  failures`` (or ``feasible trials``) below ``MIN_OUTCOMES`` of the rarer outcome;
- ``effect``: from ``MIN_TRIALS`` trials, the share's low end, given the others and alone, at
  least ``EFFECT_SHARE``; below ``NO_EFFECT_MIN_TRIALS``, also where a permutation test over all
  the parameters at once finds it (``p`` at most ``FAMILY_ALPHA``; the only way below
  ``MIN_TRIALS``, where a bootstrap runs narrow);
- ``no measurable effect``: at least ``NO_EFFECT_MIN_TRIALS`` trials measured to the end and
  ``NO_EFFECT_MIN_PAIRS`` matched pairs linking every value compared, the matched spread's high
  end and the fit's resolution below ``NO_EFFECT_SPREAD`` of the mean objective
  (``NO_EFFECT_SPREAD_FEASIBILITY``); the claim holds between the values compared
  (``matched.over``), not beyond;
- ``uncertain`` otherwise: the data cannot tell.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from autotune.analysis.conditions import is_number
from autotune.analysis.failure_stages import MEASURED, finished
from autotune.analysis.rule_cover import MIN_SUPPORT
from autotune.analysis.shares import fine_bins, groups_of, marginal_shares, n_bins, partial_shares, stepwise_effects
from autotune.store.record import TrialRecord

MIN_TRIALS = 20
"""Fewest trials (counted ones for the objective, finished ones for feasibility) for an effect
from the bootstrap's interval; below it only the permutation test names one."""
MIN_RATED = 10
"""Fewest trials for any importance."""
PERMUTATIONS = 200
FAMILY_ALPHA = 0.01
"""Below ``NO_EFFECT_MIN_TRIALS`` trials the permutation test
(:func:`autotune.analysis.shares.stepwise_effects`) names an effect at ``p`` at most this, over
all the parameters rated at once."""
MIN_OUTCOMES = MIN_SUPPORT
"""Fewest trials of the rarer outcome (failed or ran) for importances for feasibility: as many
failures as a crash rule rests on."""
RESAMPLES = 40
EFFECT_SHARE = 0.05
NO_EFFECT_SPREAD = 0.02
"""Objective: "no measurable effect" needs the matched spread's high end below 2 % of the mean objective."""
NO_EFFECT_SPREAD_FEASIBILITY = 0.05
NO_EFFECT_MIN_TRIALS = 40
NO_EFFECT_MIN_PAIRS = 20
MATCH_WIDTH = 0.2
"""Two values of a numeric parameter match when within this much of each other in the study's
distribution of it (the share of trials between them)."""
NO_EFFECT_KNOTS = 8
NO_EFFECT_MIN_ROWS = 5
"""Fewest trials a value compared must have (see :func:`_supported`)."""
UNKNOWABLE = 1e300
"""A resample's spread when it cannot estimate it (it lost every pair of some value): above any
known one, and finite so that percentiles stay numbers."""
RANK_TOLERANCE = 1e-9
"""Relative size below which a direction of the matched fit counts as not measured (its rank)."""
NO_EFFECT_RESAMPLES = 100
MAX_PAIRS = 2000
"""Matched pairs fitted at most (the closest); more add little and cost time."""
INTERVAL = (5.0, 95.0)


# -- matched comparisons ---------------------------------------------------------------------------
class _Matching:
    """Which pairs of rows are alike in each parameter: categorical values equal, numeric ones
    within ``MATCH_WIDTH`` of each other in the rows' distribution."""

    def __init__(self, rows: list[dict[str, Any]], names: list[str]) -> None:
        self.names = names
        n = len(rows)
        self.numeric: dict[str, np.ndarray] = {}
        self.keys: dict[str, np.ndarray] = {}
        unlike = np.zeros((n, n), dtype=np.int16)
        self.unlike_in: dict[str, np.ndarray] = {}
        for name in names:
            values = [r.get(name) for r in rows]
            self.keys[name] = np.array([repr(v) for v in values], dtype=object)
            if all(is_number(v) for v in values):
                arr = np.array(values, dtype=float)
                where = np.searchsorted(np.sort(arr), arr, side="right") / n  # the share of rows at or below
                self.numeric[name] = where
                far = np.abs(where[:, None] - where[None, :]) > MATCH_WIDTH
            else:
                far = self.keys[name][:, None] != self.keys[name][None, :]
            self.unlike_in[name] = far
            unlike += far
        self.unlike = unlike

    def pairs(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """Rows ``a < b`` alike in every parameter but ``name``, whose ``name`` values differ
        (the closest ``MAX_PAIRS`` when there are more)."""
        keys = self.keys[name]
        ok = (self.unlike - self.unlike_in[name] == 0) & (keys[:, None] != keys[None, :])
        a, b = np.nonzero(np.triu(ok, 1))
        if len(a) > MAX_PAIRS:
            gap = sum(np.abs(w[a] - w[b]) for other, w in self.numeric.items() if other != name)
            keep = np.sort(np.argsort(gap, kind="stable")[:MAX_PAIRS]) if isinstance(gap, np.ndarray) else slice(MAX_PAIRS)
            a, b = a[keep], b[keep]
        return a, b


def _knot_count(distinct: int) -> int:
    """Knots of a numeric parameter's hat basis over ``distinct`` values compared, evenly spaced
    across them (:func:`_basis`; a value's reach in :func:`_supported` is one knot's spacing)."""
    return min(NO_EFFECT_KNOTS, distinct)


def _basis(values: list[Any], rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, Any]:
    """``f``'s basis at every row and at each value compared (the values of ``rows``), and those
    values as the claim states them: one column per level of a categorical parameter; hat
    functions at ``NO_EFFECT_KNOTS`` knots across the distinct values of a numeric one."""
    if all(is_number(v) for v in values):
        arr = np.array(values, dtype=float)
        compared = np.unique(arr[rows])
        k = _knot_count(len(compared))
        knots = np.linspace(0.0, 1.0, k)

        def hats(pos: np.ndarray) -> np.ndarray:
            return np.maximum(0.0, 1.0 - np.abs(pos[:, None] - knots[None, :]) * (k - 1))

        span = max(len(compared) - 1, 1)
        pos = np.clip(np.searchsorted(compared, arr) / span, 0.0, 1.0)
        over = [values[int(rows[np.argmin(arr[rows])])], values[int(rows[np.argmax(arr[rows])])]]
        return hats(pos), hats(np.arange(len(compared)) / span), over
    keys = [repr(v) for v in values]
    levels = list(dict.fromkeys(keys[int(i)] for i in rows))
    at = {key: i for i, key in enumerate(levels)}
    basis = np.zeros((len(values), len(levels)))
    for i, key in enumerate(keys):
        if key in at:
            basis[i, at[key]] = 1.0
    over = [values[keys.index(key)] for key in levels]
    return basis, np.eye(len(levels)), over


def _linked_values(keys: np.ndarray, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The pairs among the values that pairs link to the most trials: a value compared only with
    values no pair links to the rest (a few trials alike only among themselves) says nothing about
    a change from it to the others."""
    index = {key: i for i, key in enumerate(dict.fromkeys(keys))}
    parent = list(range(len(index)))

    def root(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    va, vb = np.array([index[k] for k in keys[a]]), np.array([index[k] for k in keys[b]])
    for x, z in zip(va, vb):
        parent[root(int(x))] = root(int(z))
    group = np.array([root(int(x)) for x in va])
    rows_in = {g: len(np.union1d(a[group == g], b[group == g])) for g in set(group.tolist())}
    keep = group == max(rows_in, key=lambda g: (rows_in[g], -g))
    return a[keep], b[keep]


def _supported(values: list[Any], a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The pairs without the values too few trials compare: a categorical level held by fewer
    than ``NO_EFFECT_MIN_ROWS`` of the pairs' trials, a numeric parameter's lowest or highest
    value while fewer than that many trials lie within its knot's reach (:func:`_basis`). The
    bootstrap loses such a value in many resamples, where its effect is not estimable; the claim
    then holds between the values that remain (``over``)."""
    numeric = all(is_number(v) for v in values)
    arr = np.array(values, dtype=float) if numeric else np.array([repr(v) for v in values], dtype=object)
    while len(a):
        rows = np.union1d(a, b)
        compared, index = np.unique(arr[rows], return_inverse=True)
        if len(compared) < 2:
            break
        if numeric:
            reach = max(1.0, (len(compared) - 1) / (_knot_count(len(compared)) - 1))
            thin = [v for v, near in ((compared[0], index < reach), (compared[-1], index > len(compared) - 1 - reach))
                    if int(near.sum()) < NO_EFFECT_MIN_ROWS]
        else:
            counts = np.bincount(index, minlength=len(compared))
            thin = [compared[int(np.argmin(counts))]] if counts.min() < NO_EFFECT_MIN_ROWS else []
        if not thin:
            break
        keep = ~np.isin(arr[a], thin) & ~np.isin(arr[b], thin)
        a, b = a[keep], b[keep]
    return a, b


def _linked(delta: np.ndarray) -> bool:
    """Every column of the pairs' basis differences is compared, and all are linked by pairs."""
    k = delta.shape[1]
    touched = (np.abs(delta) > 1e-12).astype(float)
    if k < 2 or bool((touched.sum(axis=0) == 0).any()):
        return False
    adjacent = (touched.T @ touched) > 0
    reached = adjacent[0].copy()
    for _ in range(k):
        grown = reached | adjacent[reached].any(axis=0)
        if bool((grown == reached).all()):
            break
        reached = grown
    return bool(reached.all())


def matched_effect(matching: _Matching, values: list[Any], y: np.ndarray, name: str, *,
                   seed: int = 0) -> dict[str, Any] | None:
    """The matched comparison of ``name``: ``{"pairs", "over", "spread", "spread_high",
    "resolution"}`` in ``y``'s units (spreads None where not estimable), or None when no pairs
    link its values.

    The pairs (:meth:`_Matching.pairs`) are kept among the values linked to the most trials
    (:func:`_linked_values`) and held by enough of them (:func:`_supported`). Their differences
    are fitted by least squares as ``f(v_a) - f(v_b)`` plus a linear term in each other numeric
    parameter's remaining difference; ``f`` is one value per level of a categorical, piecewise
    linear over ``NO_EFFECT_KNOTS`` knots of a number (:func:`_basis`). ``spread``: the standard
    deviation of ``f`` between a trial's value and the other values compared, less the fit's own
    noise; ``spread_high``: its ``INTERVAL[1]`` percentile over ``NO_EFFECT_RESAMPLES`` bootstrap
    resamples, where a resample with a singular fit counts as unknown, above any known spread
    (:func:`spread_bound`); ``resolution``: the spread the fit's noise alone would show."""
    a, b = matching.pairs(name)
    if not len(a):
        return None
    a, b = _supported(values, *_linked_values(matching.keys[name], a, b))
    if not len(a):
        return None
    rows = np.union1d(a, b)
    basis, at_values, over = _basis(values, rows)
    delta = basis[a] - basis[b]
    unknown = {"pairs": int(len(a)), "over": over, "spread": None, "spread_high": None}
    if not _linked(delta):
        return unknown
    # the other numeric parameters' differences within the pairs, as an independent set of
    # columns (one that is 0 in every pair, or a combination of others, adjusts nothing)
    adjust = np.column_stack([w[a] - w[b] for other, w in matching.numeric.items() if other != name] or
                             [np.zeros(len(a))])
    u, sv, _ = np.linalg.svd(adjust, full_matrices=False)
    adjust = u[:, sv > RANK_TOLERANCE * max(float(sv.max()), 1e-300)]
    design = np.column_stack([delta[:, 1:], adjust])
    target = y[a] - y[b]
    m = delta.shape[1] - 1
    if not _identified(design.T @ design, m)[0]:
        return unknown  # the pairs cannot tell a value's effect from the others' differences
    n = len(y)
    rng = np.random.default_rng(seed)
    weights = np.stack([np.bincount(rng.integers(0, n, n), minlength=n) for _ in range(NO_EFFECT_RESAMPLES)]).astype(float)
    w_pair = weights[:, a] * weights[:, b]
    weighted = w_pair[:, :, None] * design[None, :, :]
    gram = np.matmul(weighted.transpose(0, 2, 1), design)
    identified, rank = _identified(gram, m)
    # a resample that lost every pair of some value (or the pairs that told it from the others'
    # differences) cannot estimate its effect: its spread is unknown, never 0
    ginv = np.linalg.pinv(gram, rcond=RANK_TOLERANCE, hermitian=True)
    coef = (ginv @ (weighted.transpose(0, 2, 1) @ target)[..., None])[..., 0]
    resid = target[None, :] - coef @ design.T
    s2 = (w_pair * resid ** 2).sum(axis=1) / np.maximum(w_pair.sum(axis=1) - rank, 1.0)
    cov = ginv[:, :m, :m] * s2[:, None, None]
    # half the mean square difference between a trial's value and each other value compared, less
    # what the fit's own noise adds to it (the trace of its covariance against the same form)
    at_rows, at_vals = basis[rows][:, 1:], at_values[:, 1:]
    w = weights[:, rows] / np.maximum(weights[:, rows].sum(axis=1, keepdims=True), 1e-12)
    f_rows, f_vals = coef[:, :m] @ at_rows.T, coef[:, :m] @ at_vals.T
    q = (w * f_rows ** 2).sum(axis=1) - 2 * (w * f_rows).sum(axis=1) * f_vals.mean(axis=1) + (f_vals ** 2).mean(axis=1)
    mean_val = at_vals.mean(axis=0)
    aw = w @ at_rows
    quad = (np.einsum("ra,ai,aj->rij", w, at_rows, at_rows) - aw[:, :, None] * mean_val[None, None, :]
            - mean_val[None, :, None] * aw[:, None, :] + (at_vals.T @ at_vals / len(at_vals))[None])
    noise = np.einsum("rij,rji->r", quad, cov)
    var = (q - noise) / 2.0
    spread = np.where(identified, np.sqrt(np.maximum(var, 0.0)), UNKNOWABLE)
    mid, high = float(np.median(spread)), spread_bound(spread)
    if high is None:
        return {**unknown, "spread": round(mid, 4) if mid < UNKNOWABLE / 2 else None}
    # the spread the fit's own noise would show were there no effect: a bound below it is
    # the noise correction's doing, not the pairs' evidence (an imprecise fit corrects to 0)
    resolution = float(np.median(np.sqrt(np.maximum(noise, 0.0) / 2.0)))
    return {"pairs": int(len(a)), "over": over, "spread": round(mid, 4), "spread_high": round(high, 4),
            "resolution": round(resolution, 4)}


def spread_bound(spread: np.ndarray) -> float | None:
    """The ``INTERVAL[1]`` percentile of the resamples' spreads, or None when it rests on a
    resample that could not estimate it (``UNKNOWABLE``: the percentile would interpolate
    towards it)."""
    high = float(np.percentile(spread, INTERVAL[1]))
    known = spread[spread < UNKNOWABLE / 2]
    return high if len(known) and high <= float(known.max()) else None


def _identified(gram: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    """Whether the first ``m`` coefficients (the values' effects) of a least-squares fit with
    normal matrix ``gram`` (or a stack of them) are estimable, and the fit's rank: they are when
    the rank less the rank of the rest (the adjustments) is ``m``."""
    def rank(g: np.ndarray) -> np.ndarray:
        if g.shape[-1] == 0:
            return np.zeros(g.shape[:-2], dtype=int)
        ev = np.linalg.eigvalsh(g)
        return (ev > RANK_TOLERANCE * np.maximum(ev.max(axis=-1, keepdims=True), 1e-300)).sum(axis=-1)
    full = rank(gram)
    return full - rank(gram[..., m:, m:]) == m, full


def importance_of(rows: list[dict[str, Any]], y: Sequence[float], *, relative: bool,
                  exact: Sequence[bool] | None = None, min_trials: int = MIN_RATED, sure_trials: int = MIN_TRIALS,
                  min_outcomes: int = 0, resamples: int = RESAMPLES, seed: int = 0) -> dict[str, Any]:
    """Each parameter's share of ``y``'s variance and spread, given the others and alone, and its
    verdict (the module docstring); spreads relative to ``y``'s mean when ``relative``, else in
    ``y``'s units (the document says which, ``relative``, and the bound "no measurable effect"
    needs, ``no_effect_spread``). ``exact``: which rows were measured to the end (default all);
    the others (a bound, as a trial stopped early) count in the shares, not in the matched
    comparisons. ``min_outcomes``: for a 0/1 ``y`` (feasibility), the fewest trials of each value;
    below it, or ``min_trials`` trials, the verdict says so and no parameter is rated. Below
    ``sure_trials`` only the permutation test names an effect. ``sureness``: how far the trials
    go, in words."""
    n = len(rows)
    whole = [True] * n if exact is None else [bool(e) for e in exact]
    names = sorted({k for r in rows for k in r})
    no_effect_spread = NO_EFFECT_SPREAD if relative else NO_EFFECT_SPREAD_FEASIBILITY
    doc: dict[str, Any] = {"trials": n, "bounded": n - sum(whole), "min_trials": min_trials,
                           "sure_trials": sure_trials, "relative": relative, "no_effect_spread": no_effect_spread,
                           "params": {}}
    if n < min_trials:
        doc["verdict"] = f"not enough trials ({n}, need {min_trials})"
        return doc
    yv = np.asarray(y, dtype=float)
    if float(yv.std()) == 0.0:
        doc["verdict"] = "the target does not vary"
        return doc
    failed, ran = int((yv == 0.0).sum()), int((yv != 0.0).sum())
    if min(failed, ran) < min_outcomes:
        what = "failures" if failed <= ran else "feasible trials"
        doc["verdict"] = f"not enough {what} ({min(failed, ran)}, need {min_outcomes})"
        return doc
    scale = (abs(float(yv.mean())) or 1.0) if relative else 1.0

    measured = [i for i in range(n) if whole[i]]
    exact_rows = [rows[i] for i in measured]
    matching = _Matching(exact_rows, [name for name in names if len({repr(r.get(name)) for r in exact_rows}) > 1])
    named = [(name, groups_of([r.get(name) for r in rows], n_bins(n))) for name in names]
    varied = [(name, g) for name, g in named if g is not None]
    fines: list[np.ndarray] = [groups_of([r.get(name) for r in rows], fine_bins(n))  # type: ignore[misc]
                               for name, _ in varied]
    doc["verdict"] = "ok"
    found = (stepwise_effects(yv, [g for _, g in varied], alpha=FAMILY_ALPHA, permutations=PERMUTATIONS, seed=seed)
             if n < NO_EFFECT_MIN_TRIALS else {})
    # over few trials a model of every parameter has about as many terms as trials: each share is
    # given only the parameters the permutation test found
    among = set(found) if n < sure_trials else None
    rng = np.random.default_rng(seed)
    share, spread, share1, spread1 = (np.empty((resamples, len(varied))) for _ in range(4))
    for b in range(resamples):
        # a bootstrap: its repeated trials fit some of their own noise, which biases shares up --
        # the safe side for "no measurable effect" (half-samples, unbiased, made false claims)
        idx = rng.integers(0, n, n)
        gs = [np.unique(g[idx], return_inverse=True)[1] for _, g in varied]
        fs = [np.unique(g[idx], return_inverse=True)[1] for g in fines]
        share[b], spread[b] = partial_shares(yv[idx], gs, fs, among)
        share1[b], spread1[b] = marginal_shares(yv[idx], gs)
    spread /= scale
    spread1 /= scale
    lo_q, hi_q = INTERVAL
    for j, (name, _) in enumerate(varied):
        med, lo, hi = float(np.median(share[:, j])), float(np.percentile(share[:, j], lo_q)), float(np.percentile(share[:, j], hi_q))
        alone = [float(np.median(share1[:, j])), float(np.percentile(share1[:, j], lo_q)), float(np.percentile(share1[:, j], hi_q))]
        spread_hi = float(np.percentile(spread[:, j], hi_q))
        matched, p = None, found.get(j)
        if (n >= sure_trials and lo >= EFFECT_SHARE and alone[1] >= EFFECT_SHARE) or p is not None:
            verdict = "effect"  # given the others and alone, or beyond what shuffled trials give
        else:
            if len(measured) >= NO_EFFECT_MIN_TRIALS:
                matched = matched_effect(matching, [r.get(name) for r in exact_rows], yv[measured] / scale, name,
                                         seed=seed)
            verdict = "uncertain"
            if (matched is not None and matched["spread_high"] is not None and matched["pairs"] >= NO_EFFECT_MIN_PAIRS
                    and matched["spread_high"] < no_effect_spread and matched["resolution"] < no_effect_spread):
                verdict = "no measurable effect"
        doc["params"][name] = {"median": round(med, 4), "low": round(lo, 4), "high": round(hi, 4), "verdict": verdict,
                               "alone": {"median": round(alone[0], 4), "low": round(alone[1], 4), "high": round(alone[2], 4)},
                               "spread": round(float(np.median(spread[:, j])), 4), "spread_high": round(spread_hi, 4),
                               "values": _tried([r.get(name) for r in rows]), "matched": matched,
                               **({"p": round(p, 4)} if p is not None else {})}
    for name, g in named:
        if g is None:
            doc["params"][name] = {"verdict": "not varied", "values": _tried([r.get(name) for r in rows])}
    doc["params"] = dict(sorted(doc["params"].items(), key=lambda kv: -kv[1].get("median", -1.0)))
    doc["sureness"] = sureness(n, len(measured), len(varied), sure_trials)
    return doc


def sureness(trials: int, measured: int, rated: int, sure_trials: int = MIN_TRIALS) -> str:
    """How far ``trials`` (``measured`` of them to the end, the rest bounds) go, in words, for
    ``rated`` parameters."""
    if trials < sure_trials:
        text = (f"few trials ({trials}): each share is given only the parameters found by a permutation test "
                f"over all {rated} (p <= {FAMILY_ALPHA:g}), the only ones named an effect; the intervals run "
                f"narrower than the truth")
    elif measured < NO_EFFECT_MIN_TRIALS:
        text = (f"{trials} trials: enough to name an effect, too few to rule one out "
                f"(that needs {NO_EFFECT_MIN_TRIALS} measured to the end)")
    else:
        text = f"{trials} trials"
    if measured < trials:
        text += (f"; {trials - measured} of them stopped early, counted at their projected value "
                 f"(an upper bound of what they would have measured)")
    return text


def _tried(values: list[Any]) -> Any:
    """The values tried: ``[min, max]`` of a numeric parameter, else the distinct values."""
    present = [x for x in values if x is not None]
    if present and all(is_number(x) for x in present):
        return [min(present), max(present)]
    return list({repr(x): x for x in present}.values())


def importance(views: Sequence[TrialRecord], projected: Mapping[int, float] | None = None) -> dict[str, Any]:
    """Importance for the objective (feasible trials measured to the end, and those stopped early
    at their projected value: :func:`stopped_value`) and for feasibility (finished trials; a
    stopped one ran fine). ``projected``: a stopped trial's last projected value by number, where
    its record has none (Optuna's intermediate values)."""
    rows = finished(views)
    scored = [(v, float(v.value)) for v in rows if v.outcome == "ok" and v.value is not None]
    scored += [(v, x) for v in rows if v.outcome == "stopped"
               for x in [stopped_value(v, (projected or {}).get(v.number))] if x is not None]
    scored.sort(key=lambda vx: vx[0].number)
    objective = importance_of([v.params for v, _ in scored], [x for _, x in scored], relative=True,
                              exact=[v.outcome == "ok" for v, _ in scored])
    feas = importance_of([v.params for v in rows], [1.0 if v.outcome in MEASURED else 0.0 for v in rows],
                         relative=False, min_outcomes=MIN_OUTCOMES)
    method = (f"share of the variance only this parameter accounts for in an additive model over all parameters "
              f"(ridge least squares, bias-corrected), bootstrap over trials "
              f"({RESAMPLES} resamples, {INTERVAL[0]:g}-{INTERVAL[1]:g} % interval)")
    no_effect = (f"no measurable effect: pairs of trials alike in every other parameter, the spread of this one's "
                 f"effect between the values they compare below {NO_EFFECT_SPREAD:g} of the mean objective "
                 f"({NO_EFFECT_SPREAD_FEASIBILITY:g} for feasibility) at the {INTERVAL[1]:g}th percentile of "
                 f"{NO_EFFECT_RESAMPLES} bootstrap resamples")
    few = (f"effect below {NO_EFFECT_MIN_TRIALS} trials: also (below {MIN_TRIALS}, only) where the parameter "
           f"accounts for more of what the parameters found before it leave than any parameter does over "
           f"{PERMUTATIONS} shuffles of the trials, but in a share p <= {FAMILY_ALPHA:g} of them")
    return {"method": method, "no_effect_method": no_effect, "few_trials_method": few, "effect_share": EFFECT_SHARE,
            "no_effect_spread": NO_EFFECT_SPREAD, "objective": objective, "feasibility": feas}


def stopped_value(v: TrialRecord, last: float | None = None) -> float | None:
    """What a trial stopped early counts as: its recorded projected value (the final value had the
    rest of its load run at its peak rate, at most its stop's bound; above what it would have
    measured, so its configuration's shortfall is understated, never overstated), else ``last``
    (its last intermediate value), else None (not counted)."""
    stop = v.early_stop or {}
    values = [float(x) for x in (stop.get("projected"), stop.get("bound")) if isinstance(x, (int, float))]
    if values:
        return min(values)
    return None if last is None else float(last)


__all__ = ["importance", "importance_of", "matched_effect", "stopped_value", "sureness"]
