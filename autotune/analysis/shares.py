"""Each parameter's share of a target's variance, and whether chance could have given it.

:func:`partial_shares`: the share of the target's variance that only the parameter accounts for,
given the others, in an additive ridge model over the parameters' groups (:func:`groups_of`: a
categorical's values, quantile bins of a number), bias-corrected; :func:`marginal_shares`: its
share alone. :func:`stepwise_effects`: the parameters that account for the target beyond what
shuffling the trials gives, found one at a time (the test a study of few trials needs before it
names an effect: a model over every parameter has about as many terms as trials, and a bootstrap
of few trials runs narrow). An interaction is split between its parameters, and a parameter that
always moved with another cannot be told apart from it. Read by :mod:`autotune.analysis.importance`.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import Any

import numpy as np

from autotune.analysis.conditions import is_number

RIDGE = 1.0
"""Each group's effect is shrunk as by this many pseudo-trials at the mean."""
MIN_GROUP = 5
"""Trials per fine bin for the shares' finer resolution."""


def n_bins(n: int) -> int:
    """Quantile bins of a numeric parameter over ``n`` trials."""
    return 2 if n < 40 else 3 if n < 80 else 4 if n < 160 else 5


def fine_bins(n: int) -> int:
    """Bins of the parameter rated (:func:`partial_shares`' finer resolution) over ``n`` trials."""
    return max(2 * n_bins(n), n // (2 * MIN_GROUP))


def groups_of(values: list[Any], bins: int) -> np.ndarray | None:
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
        if len(uniq) <= bins:
            idx = np.searchsorted(uniq, arr)
        else:  # quantile bins by the rank of a value's first occurrence: equal values stay together
            idx = np.minimum(bins - 1, np.searchsorted(sorted_vals, arr, side="left") * bins // len(sorted_vals))
        idx = np.where(ok, idx, bins)
        return np.unique(idx, return_inverse=True)[1]
    keys = [repr(x) for x in values]
    return np.unique(np.array(keys, dtype=object), return_inverse=True)[1]


def epsilon_sq(y: np.ndarray, g: np.ndarray, sst: float) -> tuple[float, float]:
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


def backfit(y: np.ndarray, groups: list[np.ndarray], sizes: list[int], skip: frozenset[int] = frozenset()) -> np.ndarray:
    """Residuals of the additive model ``y ~ mean + sum_c f_c(group_c)`` over the components ``c``
    not in ``skip``, each group's effect shrunk as by ``RIDGE`` pseudo-trials at the mean: the
    ridge least-squares fit, solved at once (the fixed point backfitting would reach, sweep by
    sweep, without its cost)."""
    n = len(y)
    r = y - y.mean()
    keep = [c for c in range(len(groups)) if c not in skip]
    if not keep:
        return r
    offsets = np.cumsum([0] + [sizes[c] for c in keep])
    cols = np.concatenate([groups[c] + offsets[i] for i, c in enumerate(keep)])
    rows = np.tile(np.arange(n), len(keep))
    z = np.zeros((n, int(offsets[-1])))
    z[rows, cols] = 1.0
    z -= z.mean(axis=0)
    beta = np.linalg.solve(z.T @ z + RIDGE * np.eye(z.shape[1]), z.T @ r)
    return r - z @ beta


def _one_share(y: np.ndarray, groups: list[np.ndarray], sizes: list[int], fine: np.ndarray, j: int,
               sst: float) -> tuple[float, float]:
    """Parameter ``j``'s share and spread given the others (:func:`partial_shares`)."""
    n = len(y)
    with_j = groups[:j] + [fine] + groups[j + 1:]
    sizes_j = sizes[:j] + [int(fine.max()) + 1] + sizes[j + 1:]
    rss = float((backfit(y, with_j, sizes_j) ** 2).sum())
    s2 = rss / max(n - 1 - sum(k - 1 for k in sizes_j), 1)
    saved = float((backfit(y, groups, sizes, skip=frozenset([j])) ** 2).sum()) - rss
    excess = max(0.0, saved - (sizes_j[j] - 1) * s2)
    return excess / sst, math.sqrt(excess / n)


def partial_shares(y: np.ndarray, groups: list[np.ndarray], fine: list[np.ndarray],
                   among: Collection[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Each parameter's share of the total variance that only it accounts for, and its spread (the
    same as a standard deviation over trials, in ``y``'s units); ``among``: given only these
    parameters (by index), not all the others.

    For parameter ``j`` the additive model is fitted with ``j`` at a finer resolution (``fine``: an
    effect confined to a few of its values is not averaged away in a wide bin) and without ``j``;
    the share is the residual sum of squares ``j`` saves, less what its ``k - 1`` group means would
    save by chance (``k - 1`` times the residual variance)."""
    sst = float(((y - y.mean()) ** 2).sum())
    shares, spreads = np.zeros(len(groups)), np.zeros(len(groups))
    if sst <= 0:
        return shares, spreads
    sizes = [int(g.max()) + 1 for g in groups]
    for j in range(len(groups)):
        model = list(range(len(groups))) if among is None else sorted({*among, j})
        shares[j], spreads[j] = _one_share(y, [groups[c] for c in model], [sizes[c] for c in model], fine[j],
                                           model.index(j), sst)
    return shares, spreads


def marginal_shares(y: np.ndarray, groups: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Each parameter's share and spread alone (one-way, bias-corrected)."""
    sst = float(((y - y.mean()) ** 2).sum())
    out = [epsilon_sq(y, g, sst) for g in groups]
    return np.array([o[0] for o in out]), np.array([o[1] for o in out])


def stepwise_effects(y: np.ndarray, groups: list[np.ndarray], *, alpha: float, permutations: int,
                     seed: int = 0) -> dict[int, float]:
    """The parameters (indices into ``groups``) whose groups account for ``y`` beyond chance, with
    their ``p``, found one at a time: the parameter whose groups account for the largest share of
    what the parameters found so far leave (the residual of their additive fit, :func:`backfit`)
    is found when that share beats the largest any parameter reaches over ``permutations``
    shuffles of the residual over the trials in at most ``alpha`` of them (the maximum over the
    parameters: the test is of all of them at once); the first that does not ends the search."""
    n = len(y)
    sizes = [int(g.max()) + 1 for g in groups]
    rng = np.random.default_rng(seed)
    orders = np.stack([rng.permutation(n) for _ in range(permutations)]) if permutations else np.zeros((0, n), int)
    found: dict[int, float] = {}
    r = y - y.mean()
    while len(found) < len(groups):
        left = [j for j in range(len(groups)) if j not in found]
        sst = float((r ** 2).sum())
        if sst <= 1e-12 * max(float((y ** 2).sum()), 1e-300):
            break
        shares = [epsilon_sq(r, groups[j], sst)[0] for j in left]
        best = int(np.argmax(shares))
        if shares[best] <= 0.0:
            break
        null = np.array([max(epsilon_sq(r[o], groups[j], sst)[0] for j in left) for o in orders])
        p = (1 + int((null >= shares[best] - 1e-12).sum())) / (1 + permutations)
        if p > alpha:
            break
        found[left[best]] = p
        r = backfit(y, [groups[j] for j in found], [sizes[j] for j in found])
    return found


__all__ = ["MIN_GROUP", "RIDGE", "backfit", "epsilon_sq", "fine_bins", "groups_of", "marginal_shares", "n_bins",
           "partial_shares", "stepwise_effects"]
