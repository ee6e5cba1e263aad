"""The sequential greedy cover of one failure kind's trials, and the settings it is judged by.

:class:`RuleCover` takes, over the failures of one kind no rule explains yet, the surest
acceptable rule of one or two conditions, and repeats (steps 2-6 of
:mod:`autotune.analysis.crash_rules`, which runs it for each kind). The module's constants are
the cover's settings (:func:`rule_settings` lists them as ``explain`` reports them);
:class:`OtherSettings` tells whether a rule's failures came at enough settings of the other
parameters.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from autotune.analysis.conditions import Condition
from autotune.analysis.rule_stats import hypergeom_tail, tail_table, wilson_low
from autotune.config.derived import DERIVED, derived_inputs
from autotune.store.record import TrialRecord

MIN_SUPPORT = 3
"""Fewest failures a crash rule rests on..."""
MIN_PAIR_SUPPORT = 5
"""...and a two-condition one (:mod:`~autotune.analysis.crash_rules`, step 5)..."""
MIN_BOUNDARY_SUPPORT = 5
"""...and a one-condition rule of a memory kind on a parameter the space does not declare
monotone for that kind, that way (:mod:`~autotune.analysis.crash_rules`, step 2)."""
MIN_PRECISION = 0.8
ALPHA = 0.03
"""Chance (hypergeometric tail, informative trials) a one-condition rule must be below..."""
ALPHA_FAMILY = 0.05
"""...and the share of outcome permutations in which some condition does as well (Westfall-Young)."""
PERMUTATIONS = 199
PERMUTATION_SEED = 0
ALPHA_PAIR = 0.001
ALPHA_ALONE = 0.05
"""Each condition of a pair must go with the failures on its own below this chance..."""
ALPHA_WITHIN = 0.005
"""...and pick them out among the trials the other condition covers below this chance."""
OTHER_WEIGHT = 0.5
"""How much a failure of another kind at the same stage counts against a rule (a success: 1)..."""
EXCUSED_WEIGHT = 0.25
"""...and once a rule of its own kind explains it."""
MAX_PAIR_CANDIDATES = 400
"""Conditions (those with the most failures) tried in pairs."""
MAX_RANKED = 500
"""Candidates tested for chance, surest first, before a cover step gives up."""
MAX_RIVALS = 3
"""Conditions the data cannot tell from a rule, named with it at most."""


def rule_settings() -> dict[str, Any]:
    """The crash rules' settings (this module's constants), as ``explain`` reports them."""
    return {"min_support": MIN_SUPPORT, "min_pair_support": MIN_PAIR_SUPPORT,
            "min_boundary_support": MIN_BOUNDARY_SUPPORT, "min_precision": MIN_PRECISION,
            "alpha": ALPHA, "alpha_family": ALPHA_FAMILY, "permutations": PERMUTATIONS, "alpha_pair": ALPHA_PAIR, "alpha_alone": ALPHA_ALONE,
            "alpha_within": ALPHA_WITHIN, "other_weight": OTHER_WEIGHT, "excused_weight": EXCUSED_WEIGHT}


Chosen = tuple[tuple[int, ...], np.ndarray, list[int], list[int]]
"""A rule the cover took: its condition indices, the rows it covers, its rivals' indices and the
indices of the conditions as sure as it at the step that took it."""


class OtherSettings:
    """The finished trials' settings of every parameter but some (:mod:`~autotune.analysis.crash_rules`,
    step 2): a rule over parameters ``P`` rests on failures at ``MIN_SUPPORT`` distinct settings of the
    parameters other than ``P``, or at as many as the study tried (a study that varied only ``P``
    has one)."""

    def __init__(self, rows: Sequence[TrialRecord]) -> None:
        self.names = sorted({k for v in rows for k in v.params if k not in DERIVED})  # derived: functions of these
        columns = []
        for name in self.names:
            index: dict[str, int] = {}
            columns.append([index.setdefault(repr(v.params.get(name)), len(index)) for v in rows])
        self.codes = np.array(columns, dtype=np.int64).T.reshape(len(rows), len(self.names))
        self._ids: dict[frozenset[str], np.ndarray] = {}

    def ids(self, names: frozenset[str]) -> np.ndarray:
        """Per row, an id of its setting of the parameters not in ``names`` (equal ids: equal settings)."""
        if names not in self._ids:
            sub = self.codes[:, [i for i, n in enumerate(self.names) if n not in names]]
            self._ids[names] = (np.unique(sub, axis=0, return_inverse=True)[1].reshape(-1) if sub.shape[1]
                                else np.zeros(len(sub), dtype=np.int64))
        return self._ids[names]

    def enough(self, names: set[str], rows: np.ndarray) -> bool:
        """Whether ``rows`` (a mask) hold ``MIN_SUPPORT`` distinct settings of the parameters not
        in ``names``, or as many as the study's trials hold. A derived quantity
        (:mod:`autotune.config.derived`) moves with each of its inputs: its failures must come in enough
        settings of the rest with any one input held as the rule's own (failures of a probe of
        channels around one configuration are one setting of all but the channels)."""
        plain = frozenset(n for n in names if n not in DERIVED)
        inputs = sorted({p for n in names for p in derived_inputs(n) if p in self.names})
        return all(self._enough(plain | {p}, rows) for p in inputs) if inputs else self._enough(plain, rows)

    def _enough(self, names: frozenset[str], rows: np.ndarray) -> bool:
        ids = self.ids(names)
        return len(np.unique(ids[rows])) >= min(MIN_SUPPORT, int(ids.max(initial=-1)) + 1)


class RuleCover:
    """The sequential greedy cover of one kind's failures (:mod:`~autotune.analysis.crash_rules`,
    steps 2-6); :meth:`run` gives the rules in the order taken.

    Args:
        kind_fail: The rows that failed with the kind.
        weight: How much each other row counts against a rule covering it (0: says nothing;
            1: refutes it, and is informative).
        conds: The candidate conditions (:func:`~autotune.analysis.conditions.candidate_conditions`);
            ``masks``: the rows each holds in; ``params_of``: each one's parameter.
        bounds: The permutation bounds already computed (the second pass often asks for the same).
        dense: ``masks`` as float32, for the products.
        settings: The rows' settings of the other parameters.
        exposed: See :attr:`exposed`; ``beyond``: see :attr:`beyond` (step 1).
        taken: The rows the named rules (step 0) cover already.
        thin_ok: See :attr:`thin_ok` (step 2).
    """

    def __init__(self, kind_fail: np.ndarray, weight: np.ndarray, conds: list[Condition], masks: np.ndarray,
                 params_of: np.ndarray, bounds: dict[bytes, float], dense: np.ndarray, settings: OtherSettings,
                 exposed: np.ndarray | None = None, taken: np.ndarray | None = None,
                 thin_ok: np.ndarray | None = None, beyond: np.ndarray | None = None) -> None:
        self.kind_fail, self.weight, self.conds, self.masks, self.params_of = kind_fail, weight, conds, masks, params_of
        self.dense = dense
        self.settings = settings
        """The rows' settings of the other parameters (:class:`OtherSettings`)."""
        self.beyond = beyond
        """Per threshold condition, the rows it covers that failed with another kind at the same
        stage past every failure of the kind it covers, on its own parameter: they count 1
        against it (:mod:`~autotune.analysis.crash_rules`, step 1); None: no such row."""
        self.exposed = exposed
        """Per condition, the rows it covers whose failure (of another kind) a rule on the
        condition's own parameter explains: they count ``OTHER_WEIGHT`` against it, not
        ``EXCUSED_WEIGHT`` (:mod:`~autotune.analysis.crash_rules`, step 1); None: no such row."""
        self.counted = kind_fail | (weight > 0)
        self.against = self.counted & ~kind_fail
        self.hard = self.against & (weight >= 1.0)
        self.thin_ok = thin_ok
        """Per condition, whether a one-condition rule on it may rest on fewer than
        ``MIN_BOUNDARY_SUPPORT`` failures (None: every one may)."""
        self.active = np.ones(len(kind_fail), dtype=bool) if taken is None else ~taken
        """The rows no rule covers yet (``taken``: those the named rules cover, step 0)."""
        self.every = np.arange(len(conds))
        self.bounds = bounds
        self.banned: set[int] = set()
        """One-condition rules whose failures divide between causes (:meth:`split`); refused for
        the rest of the cover: rows only leave the pool, so their own failures only shrink."""

    # -- counts and chances ----------------------------------------------------------------------
    def stats(self, rows_a: np.ndarray, rows_b: np.ndarray | None = None,
              act: np.ndarray | None = None) -> tuple[np.ndarray, ...]:
        """Failures, weighted count against, informative trials against and rows covered, of
        each condition ``rows_a`` (or pair ``rows_a`` x ``rows_b``) over the rows ``act`` (default:
        the active ones)."""
        act = self.active if act is None else act
        cols = np.stack([self.kind_fail & act, (self.against & act) * self.weight, self.hard & act, act]).astype(np.float32)
        ma = self.dense[rows_a]
        unexcuse = (self.against & act).astype(np.float32) * (OTHER_WEIGHT - EXCUSED_WEIGHT)
        if rows_b is None:
            out = list((ma @ cols.T).T.astype(np.float64))
            if self.exposed is not None:
                out[1] = out[1] + (self.exposed[rows_a] @ unexcuse).astype(np.float64)
            if self.beyond is not None:  # up to 1 (a row also exposed was raised by unexcuse already)
                rest = (self.against & act).astype(np.float32) * (1.0 - self.weight).astype(np.float32)
                out[1] = out[1] + (self.beyond[rows_a] @ rest).astype(np.float64)
                if self.exposed is not None:
                    out[1] = out[1] - ((self.beyond[rows_a] * self.exposed[rows_a]) @ unexcuse).astype(np.float64)
            return tuple(out)
        mb = self.dense[rows_b]
        out = [((ma * c) @ mb.T).astype(np.float64) for c in cols]
        if self.exposed is not None:  # rows excused by a rule on either parameter of the pair
            xa, xb = self.exposed[rows_a] * unexcuse, self.exposed[rows_b]
            out[1] = out[1] + (xa @ mb.T + (ma * unexcuse) @ xb.T - xa @ xb.T).astype(np.float64)
        return tuple(out)

    def chance(self, fail: np.ndarray, nag: np.ndarray, act: np.ndarray | None = None) -> np.ndarray:
        """Of the informative rows of ``act`` (the kind's failures, and the rows that refute a
        rule), the chance that ``fail + nag`` drawn at random hold ``fail`` failures or more."""
        act = self.active if act is None else act
        table = tail_table(int(((self.kind_fail | self.hard) & act).sum()), int((self.kind_fail & act).sum()))
        f = np.rint(np.asarray(fail)).astype(int)
        return table[f + np.rint(np.asarray(nag)).astype(int), np.minimum(f, table.shape[1] - 1)]

    def valid(self, fail: np.ndarray, agn: np.ndarray) -> np.ndarray:
        return (fail >= MIN_SUPPORT) & (fail >= MIN_PRECISION * (fail + agn) - 1e-9)

    def thin(self, j: int, failures: float) -> bool:
        """Whether a one-condition rule ``j`` over ``failures`` failures is too thin: a boundary's
        kind, fewer than ``MIN_BOUNDARY_SUPPORT`` failures, and not a parameter the space declares
        monotone for the kind that way (:mod:`~autotune.analysis.crash_rules`, step 2)."""
        return self.thin_ok is not None and not self.thin_ok[j] and failures < MIN_BOUNDARY_SUPPORT - 1e-9

    def spread(self, idx: Sequence[int], mask: np.ndarray) -> bool:
        """Whether the failures of the kind that the rule ``idx`` covers among the active rows
        came in enough settings of the other parameters (:mod:`~autotune.analysis.crash_rules`, step 2)."""
        return self.settings.enough({str(self.params_of[i]) for i in idx}, mask & self.kind_fail & self.active)

    def family_bound(self) -> float:
        """The largest chance a one-condition rule may have so that, had the failures nothing to
        do with the parameters, a rule as sure turns up among all the conditions in fewer than
        ``ALPHA_FAMILY`` of ``PERMUTATIONS`` shuffles of the outcomes over the active rows."""
        rows = np.flatnonzero(self.counted & self.active)
        key = b"".join(a[rows].tobytes() for a in (self.kind_fail, self.weight)) + rows.tobytes()
        if key in self.bounds:
            return self.bounds[key]
        packed = np.packbits(self.masks[:, rows], axis=1)
        _, first = np.unique(packed, axis=0, return_index=True)
        m = self.dense[first][:, rows]
        k = self.kind_fail[rows]
        labels = np.stack([k, np.where(k, 0.0, self.weight[rows]), (k | self.hard[rows])]).astype(np.float32)
        table = tail_table(int(labels[2].sum()), int(k.sum()))
        rng = np.random.default_rng(PERMUTATION_SEED)
        perms = np.argsort(rng.random((PERMUTATIONS, len(rows))), axis=1)
        out = m @ labels[:, perms].reshape(3 * PERMUTATIONS, len(rows)).T
        fail = np.rint(out[:, :PERMUTATIONS]).astype(int)
        agn = out[:, PERMUTATIONS:2 * PERMUTATIONS]
        draws = np.rint(out[:, 2 * PERMUTATIONS:]).astype(int)
        p = np.where(self.valid(fail, agn), table[draws, fail], 1.0)
        least = np.sort(p.min(axis=0))
        allowed = int(math.floor(ALPHA_FAMILY * (PERMUTATIONS + 1))) - 1
        self.bounds[key] = float(least[allowed]) if allowed < PERMUTATIONS else 1.0
        return self.bounds[key]

    # -- choosing ----------------------------------------------------------------------------------
    def pick(self, fail: np.ndarray, agn: np.ndarray, nag: np.ndarray, cov: np.ndarray, alpha: float, *,
             extra_ok: Any = None, family: bool = False, count: int = 1) -> list[int]:
        """Up to ``count`` acceptable candidates, surest first: the lower bound of the precision
        (purity and support together, so a pure rule takes its failures before a broader, less
        pure one that covers some of them too), then the most failures net of what counts
        against, then the tightest (fewest rows)."""
        idx = np.flatnonzero(self.valid(fail, agn))
        out: list[int] = []
        if not len(idx):
            return out
        lb = wilson_low(fail[idx], fail[idx] + agn[idx])
        idx = idx[np.lexsort((idx, cov[idx], -(fail[idx] - agn[idx]), -np.round(lb, 6)))][:MAX_RANKED]
        p = self.chance(fail[idx], nag[idx])
        bound = self.family_bound() if family and bool((p <= alpha).any()) else 1.0
        for j, pj in zip(idx, p):
            if pj <= alpha and (not family or pj < bound) and (extra_ok is None or extra_ok(int(j))):
                out.append(int(j))
                if len(out) >= count:
                    break
        return out

    def single(self, counts: tuple[np.ndarray, ...] | None = None) -> tuple[list[int], tuple[np.ndarray, ...]]:
        """The one-condition rule this step would take (the surest acceptable one) followed by
        the acceptable conditions on other parameters exactly as sure (the same lower bound of
        the precision and the same failures net of what counts against; at most
        ``MAX_RIVALS``), or ``[]``; and every condition's counts."""
        counts = self.stats(self.every) if counts is None else counts  # given: the active rows unchanged
        fail, agn, nag, cov = counts
        ranked = self.pick(fail, agn, nag, cov, ALPHA, family=True, count=MAX_RANKED,
                           extra_ok=lambda j: j not in self.banned and not self.thin(j, fail[j])
                           and self.spread((j,), self.masks[j]))
        if not ranked:
            return [], counts

        def sureness(j: int) -> tuple[float, float]:
            return round(float(wilson_low(fail[j], fail[j] + agn[j])), 6), round(float(fail[j] - agn[j]), 6)

        first = ranked[0]
        out, params = [first], {self.params_of[first]}
        for j in ranked[1:]:
            if sureness(j) != sureness(first):
                break
            if self.params_of[j] not in params:
                out.append(j)
                params.add(self.params_of[j])
                if len(out) > MAX_RIVALS:
                    break
        return out, counts

    def pair(self, counts: tuple[np.ndarray, ...], best_single: float) -> tuple[int, int] | None:
        """The two-condition rule this step would take, if any (:mod:`~autotune.analysis.crash_rules`,
        step 5): among the ``MAX_PAIR_CANDIDATES`` conditions with the most failures, each going with
        the failures on its own (chance at most ``ALPHA_ALONE``), a pair on two parameters that is
        clean (no informative trial against it, none past either's failures), rests on
        ``MIN_PAIR_SUPPORT`` failures, is surer than ``best_single``, has chance at most
        ``ALPHA_PAIR``, and whose conditions each pick out the failures among the trials the other
        covers (chance at most ``ALPHA_WITHIN``)."""
        fail1, _, nag1, _ = counts
        cand = np.flatnonzero(fail1 > 0)
        cand = cand[np.argsort(-fail1[cand], kind="stable")[:MAX_PAIR_CANDIDATES]]
        cand = cand[self.chance(fail1[cand], nag1[cand]) <= ALPHA_ALONE]
        if len(cand) < 2:
            return None
        n = len(cand)
        fail2, agn2, nag2, cov2 = self.stats(cand, cand)
        params = self.params_of[cand]
        allowed = np.triu(np.ones((n, n), dtype=bool), k=1) & (params[:, None] != params[None, :]) & (nag2 == 0)
        if self.beyond is not None:  # not clean either: a failure of another kind past either one's failures
            r = (self.against & self.active).astype(np.float32)
            ba, ma = self.beyond[cand] * r, self.dense[cand]
            allowed &= (ba @ ma.T + ma @ ba.T) == 0
        fail2 = np.where(allowed & (fail2 >= MIN_PAIR_SUPPORT) & (wilson_low(fail2, fail2 + agn2) > best_single),
                         fail2, 0.0)

        def both_needed(flat: int) -> bool:
            """Among the rows one condition covers, the other picks out the failures beyond
            chance, both ways (else it is one condition plus a coincidence); and the failures
            came in enough settings of the other parameters."""
            a, b = divmod(flat, n)
            if not self.spread((cand[a], cand[b]), self.masks[cand[a]] & self.masks[cand[b]]):
                return False
            for x in (a, b):
                within, k_within = int(fail1[cand[x]] + nag1[cand[x]]), int(fail1[cand[x]])
                if hypergeom_tail(within, k_within, int(fail2.flat[flat] + nag2.flat[flat]),
                                  int(fail2.flat[flat])) > ALPHA_WITHIN:
                    return False
            return True

        found = self.pick(fail2.ravel(), agn2.ravel(), nag2.ravel(), cov2.ravel(), ALPHA_PAIR, extra_ok=both_needed)
        if not found:
            return None
        a, b = divmod(found[0], n)
        return int(cand[a]), int(cand[b])

    def rivals(self, idx: tuple[int, ...], mask: np.ndarray) -> tuple[tuple[int, ...], np.ndarray, list[int]]:
        """The rule, and the conditions on other parameters that hold in every failure it
        explains, are refuted by no more informative trials than it and go with the failures on
        their own: the data cannot tell them from the rule (tightest first). A rival that
        explains more failures, and is a rule by itself, takes the rule's place."""
        f = mask & self.kind_fail & self.active
        ok = self.masks[:, f].all(axis=1) & ~np.isin(self.params_of, [self.params_of[i] for i in idx])
        ok &= self.masks[:, self.hard & self.active].sum(axis=1) <= int((mask & self.hard & self.active).sum())
        cand = np.flatnonzero(ok)
        if not len(cand):
            return idx, mask, []
        fail, agn, nag, cov = self.stats(cand)
        keep = self.chance(fail, nag) <= ALPHA
        better = keep & (fail > f.sum()) & self.valid(fail, agn)
        better &= np.array([not self.thin(c, f_c) for c, f_c in zip(cand, fail)])
        better &= np.array([self.spread((c,), self.masks[c]) for c in cand]) if better.any() else better
        if better.any():
            c = int(cand[np.flatnonzero(better)[np.argmax(fail[better])]])
            return self.rivals((c,), self.masks[c])
        found: dict[tuple[str, str], int] = {}
        for pos in np.flatnonzero(keep):
            c = self.conds[cand[pos]]
            key = (c.param, c.op if c.op != "=" else f"={c.value!r}")
            if key not in found or cov[pos] < cov[found[key]]:
                found[key] = int(pos)
        ranked = sorted(found.values(), key=lambda pos: (cov[pos], cand[pos]))
        return idx, mask, [int(cand[pos]) for pos in ranked[:MAX_RIVALS]]

    def split(self, j: int, counts: tuple[np.ndarray, ...]) -> bool:
        """Whether one-condition rule ``j`` (``counts``: every condition's over the active rows,
        as :meth:`single` gives them) has failures that divide between causes (:mod:`~autotune.analysis.crash_rules`,
        step 4): some trial of the study counts against it (it is not clean), and a
        condition on another parameter explains some of its failures among the active rows but
        not all, leaving it fewer than ``MIN_SUPPORT`` of its own, while being over all the rows
        an acceptable candidate at least as sure as ``j`` that goes with the failures on its own
        (chance at most ``ALPHA_ALONE``)."""
        all_rows = np.ones(len(self.kind_fail), dtype=bool)
        if float(self.stats(np.array([j]), act=all_rows)[1][0]) == 0.0:
            return False  # clean: whatever else the failures had, every trial it covers failed
        own = self.masks[j] & self.kind_fail & self.active
        inside = self.masks[:, own].sum(axis=1)
        n_own = int(own.sum())
        cand = np.flatnonzero((inside > 0) & (inside < n_own) & (n_own - inside < MIN_SUPPORT)
                              & (self.params_of != self.params_of[j]))
        if not len(cand):
            return False
        fail, agn, nag, _ = self.stats(cand, act=all_rows)
        sure = wilson_low(fail, fail + agn) >= wilson_low(counts[0][j], counts[0][j] + counts[1][j]) - 1e-9
        return bool((self.valid(fail, agn) & sure & (self.chance(fail, nag, all_rows) <= ALPHA_ALONE)).any())

    def run(self) -> list[Chosen]:
        """The rules, in the order taken."""
        chosen: list[Chosen] = []
        if int(self.kind_fail.sum()) < MIN_SUPPORT or not len(self.conds):
            return chosen
        while int((self.kind_fail & self.active).sum()) >= MIN_SUPPORT:
            ranked, counts = self.single()
            while ranked and self.split(ranked[0], counts):
                self.banned.add(ranked[0])
                ranked, counts = self.single(counts)
            j = ranked[0] if ranked else None
            best_single = float(wilson_low(counts[0][j], counts[0][j] + counts[1][j])) if j is not None else -np.inf
            pair = self.pair(counts, best_single)
            if pair is not None:
                chosen.append((*self.rivals(pair, self.masks[pair[0]] & self.masks[pair[1]]), []))
            elif j is not None:
                idx, mask, rival = self.rivals((j,), self.masks[j])
                named = {self.params_of[i] for i in (*idx, *rival)}
                chosen.append((idx, mask, rival, [a for a in ranked[1:] if self.params_of[a] not in named]))
            else:
                break
            self.active &= ~chosen[-1][1]
        return chosen


__all__ = ["ALPHA", "ALPHA_ALONE", "ALPHA_FAMILY", "ALPHA_PAIR", "ALPHA_WITHIN", "Chosen", "EXCUSED_WEIGHT",
           "MAX_PAIR_CANDIDATES", "MAX_RANKED", "MAX_RIVALS", "MIN_BOUNDARY_SUPPORT", "MIN_PAIR_SUPPORT", "MIN_PRECISION",
           "MIN_SUPPORT", "OTHER_WEIGHT", "OtherSettings", "PERMUTATIONS", "PERMUTATION_SEED", "RuleCover",
           "rule_settings"]
