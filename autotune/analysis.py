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
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import optuna
from optuna.trial import TrialState

from autotune.study_view import TrialView, view

MIN_SUPPORT = 3
"""Fewest failures a crash rule rests on."""
MIN_PRECISION = 0.8
ALPHA = 0.03
"""Chance (hypergeometric tail) a one-condition rule must be below..."""
ALPHA_FAMILY = 0.05
"""...and the share of outcome permutations in which some condition does as well (Westfall-Young)."""
PERMUTATIONS = 199
PERMUTATION_SEED = 0
MAX_RIVALS = 3
"""Conditions the data cannot tell from a rule, named with it at most."""
LOOKAHEAD = 4
"""Acceptable rules (the surest) a cover step compares by what each leaves to the others."""
STAGES = {"invalid-argument": 0, "not-enough-memory": 1, "crash-under-load": 3, "request-errors": 3}
"""Where in a trial a failure kind happens: the arguments, sizing the KV pool (before any NCCL
collective: its buffers are allocated lazily, out of the headroom), the rest of start-up (out of
memory, NCCL errors, timeouts: ``LATER_UNKNOWN``), under load."""
LATER_UNKNOWN = 2
ALPHA_PAIR = 0.001
ALPHA_ALONE = 0.05
"""Each condition of a pair must go with the failures on its own below this chance..."""
ALPHA_WITHIN = 0.005
"""...and pick them out among the trials the other condition covers below this chance."""
OTHER_WEIGHT = 0.5
"""How much a failure of another kind counts against a rule (a success: 1)..."""
EXCUSED_WEIGHT = 0.25
"""...and once a rule of its own kind explains it."""
MAX_PAIR_CANDIDATES = 400
"""Conditions (those with the most failures) tried in pairs."""
MAX_RANKED = 500
"""Candidates tested for chance, surest first, before a cover step gives up."""
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
NOT_A_CRASH = ("slo-violated",)


# -- conditions and rules ------------------------------------------------------------------------
@dataclass(frozen=True)
class Condition:
    """``param op value`` with ``op`` one of ``=``, ``>=``, ``<=``."""

    param: str
    op: str
    value: Any

    def holds(self, params: dict[str, Any]) -> bool:
        v = params.get(self.param)
        if v is None:
            return False
        if self.op == "=":
            return bool(v == self.value and isinstance(v, bool) == isinstance(self.value, bool))
        if not _is_number(v):
            return False
        return bool(v >= self.value) if self.op == ">=" else bool(v <= self.value)

    def __str__(self) -> str:
        if self.op == "=":
            return f"{self.param}={_fmt(self.value)}"
        return f"{self.param} {self.op} {_fmt(self.value)}"

    def to_json(self) -> dict[str, Any]:
        return {"param": self.param, "op": self.op, "value": self.value}


@dataclass
class FailureRule:
    """``conditions`` held in ``covered`` finished trials, ``failed`` of which failed with ``kind``.

    ``trials``: the failures attributed to this rule (each failure to one rule); ``other_failures``:
    covered trials that failed with another kind; ``p_value``: the chance of at least ``failed``
    failures of ``kind`` among the covered trials that could show it, drawn at random from the
    study's (its failures, successes, failures later in a trial); ``confounded_with``: conditions
    on other parameters that every one of those failures also had and no more trials refute (a
    confound the data cannot resolve: the rule is one of them).
    """

    conditions: tuple[Condition, ...]
    kind: str
    failed: int
    covered: int
    trials: list[int] = field(default_factory=list)
    other_failures: int = 0
    p_value: float = 1.0
    confounded_with: list[Condition] = field(default_factory=list)

    @property
    def condition(self) -> str:
        return " & ".join(str(c) for c in self.conditions)

    def __str__(self) -> str:
        return f"{self.condition} -> {self.kind} ({self.failed} of {self.covered})"

    def to_json(self) -> dict[str, Any]:
        return {
            "rule": str(self),
            "condition": self.condition,
            "conditions": [c.to_json() for c in self.conditions],
            "kind": self.kind,
            "support": {"failed": self.failed, "covered": self.covered},
            "other_failures": self.other_failures,
            "trials": list(self.trials),
            "p_value": float(f"{self.p_value:.3g}"),
            "confounded_with": [str(c) for c in self.confounded_with],
            "confounded_conditions": [c.to_json() for c in self.confounded_with],
        }


@dataclass
class RuleReport:
    """The rules, and the failures no rule explains (trial numbers per kind)."""

    rules: list[FailureRule]
    unexplained: dict[str, list[int]]
    finished: int

    def unexplained_json(self) -> dict[str, Any]:
        trials = sorted(n for ns in self.unexplained.values() for n in ns)
        return {"count": len(trials), "trials": trials,
                "kinds": {k: len(v) for k, v in sorted(self.unexplained.items()) if v}}


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(float(x))


def _fmt(x: Any) -> str:
    if isinstance(x, float):
        return f"{x:g}" if abs(x) < 1e6 else str(int(x)) if x.is_integer() else repr(x)
    return str(x)


def _crashed(v: TrialView) -> bool:
    return v.outcome == "infeasible" and (v.failure_kind or "") not in NOT_A_CRASH


def _finished(views: Sequence[TrialView]) -> list[TrialView]:
    return [v for v in views if v.outcome in ("ok", "infeasible")]


def candidate_conditions(rows: Sequence[TrialView]) -> tuple[list[Condition], np.ndarray]:
    """Every condition worth testing, and which rows each holds in (a conditions x rows matrix).

    Numeric parameters (every value a number): ``P >= x`` and ``P <= x`` at each observed ``x``
    that leaves at least one row out; others: ``P=v`` for each observed ``v``. A parameter with
    one value says nothing.
    """
    names = sorted({k for v in rows for k in v.params})
    conds: list[Condition] = []
    masks: list[np.ndarray] = []
    for name in names:
        values = [v.params.get(name) for v in rows]
        present = [x for x in values if x is not None]
        distinct = sorted(set(map(repr, present)))
        if len(distinct) < 2:
            continue
        if all(_is_number(x) for x in present):
            arr = np.array([float(x) if x is not None else np.nan for x in values])
            uniq = sorted(set(present))
            for x in uniq[1:]:
                conds.append(Condition(name, ">=", x))
                masks.append(arr >= float(x))
            for x in uniq[:-1]:
                conds.append(Condition(name, "<=", x))
                masks.append(arr <= float(x))
        else:
            seen: dict[str, Any] = {}
            for x in present:
                seen.setdefault(repr(x), x)
            for x in seen.values():
                c = Condition(name, "=", x)
                conds.append(c)
                masks.append(np.array([c.holds(v.params) for v in rows]))
            # choices such as [unset, 2, 3, 4]: ``P >= 2`` says "set, to at least 2"
            numbers = sorted({x for x in present if _is_number(x)})
            arr = np.array([float(x) if _is_number(x) else np.nan for x in values])
            for x in numbers[1:]:
                conds.append(Condition(name, ">=", x))
                masks.append(arr >= float(x))
            for x in numbers[:-1] if len(numbers) > 1 else []:
                conds.append(Condition(name, "<=", x))
                masks.append(arr <= float(x))
            if numbers and len(numbers) < len(seen):
                conds.append(Condition(name, ">=", numbers[0]))
                masks.append(arr >= float(numbers[0]))
    if not masks:
        return [], np.zeros((0, len(rows)), dtype=bool)
    return conds, np.vstack(masks)


def _wilson_low(k: Any, n: Any, z: float = 1.28) -> Any:
    """Lower end of the Wilson interval (90 % two-sided) of a proportion ``k`` of ``n``."""
    k, n = np.asarray(k, dtype=float), np.maximum(np.asarray(n, dtype=float), 1e-9)
    p = k / n
    centre = p + z * z / (2 * n)
    half = z * np.sqrt(np.maximum(p * (1 - p) / n + z * z / (4 * n * n), 0.0))
    return (centre - half) / (1 + z * z / n)


def _log_comb(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def hypergeom_tail(population: int, successes: int, draws: int, observed: int) -> float:
    """P(X >= observed) for X ~ Hypergeometric(population, successes, draws)."""
    hi = min(successes, draws)
    if observed > hi:
        return 0.0
    lo = max(observed, draws - (population - successes), 0)
    denom = _log_comb(population, draws)
    total = 0.0
    for x in range(lo, hi + 1):
        total += math.exp(_log_comb(successes, x) + _log_comb(population - successes, draws - x) - denom)
    return min(1.0, total)


def _tail_table(population: int, successes: int) -> np.ndarray:
    """``T[d, x]`` = P(X >= x) for X ~ Hypergeometric(population, successes, d), every ``d`` in
    ``0..population`` and ``x`` in ``0..successes + 1`` (the last column 0)."""
    lf = np.concatenate([[0.0], np.cumsum(np.log(np.arange(1, population + 1, dtype=float)))])
    d = np.arange(population + 1)[:, None]
    x = np.arange(successes + 1)[None, :]
    ok = (x <= d) & (d - x <= population - successes)
    with np.errstate(invalid="ignore"):
        log_p = (lf[successes] - lf[x] - lf[np.maximum(successes - x, 0)]
                 + lf[population - successes] - lf[np.clip(d - x, 0, None)]
                 - lf[np.clip(population - successes - (d - x), 0, None)]
                 - (lf[population] - lf[d] - lf[population - d]))
    pmf = np.where(ok, np.exp(np.where(ok, log_p, 0.0)), 0.0)
    tail = np.cumsum(pmf[:, ::-1], axis=1)[:, ::-1]
    return np.minimum(1.0, np.concatenate([tail, np.zeros((population + 1, 1))], axis=1))


def _stage(kind: str) -> int:
    return STAGES.get(kind, LATER_UNKNOWN)


def _rule_settings() -> dict[str, Any]:
    """The crash rules' settings (the module's constants), as ``explain`` reports them."""
    return {"min_support": MIN_SUPPORT, "min_precision": MIN_PRECISION, "alpha": ALPHA, "alpha_family": ALPHA_FAMILY,
            "permutations": PERMUTATIONS, "alpha_pair": ALPHA_PAIR, "alpha_alone": ALPHA_ALONE,
            "alpha_within": ALPHA_WITHIN, "other_weight": OTHER_WEIGHT, "excused_weight": EXCUSED_WEIGHT}


Chosen = tuple[tuple[int, ...], np.ndarray, list[int]]
"""A rule found by the cover: its condition indices, the rows it covers, and its rivals."""


def _cover_kind(kind_fail: np.ndarray, weight: np.ndarray, conds: list[Condition], masks: np.ndarray,
                params_of: np.ndarray) -> list[Chosen]:
    """Sequential greedy cover of the failures ``kind_fail`` (bool per row). ``weight``: how much
    each other row counts against a rule covering it (0: excused; 1: a success, or a failure
    later in the trial than this kind). Each rule is judged on the rows no earlier rule covers (its
    failures are explained, its other rows accounted for). Returns the chosen (condition indices,
    mask, rivals) in the order chosen."""
    counted = kind_fail | (weight > 0)
    against = counted & ~kind_fail
    hard = against & (weight >= 1.0)
    active = np.ones(len(kind_fail), dtype=bool)
    chosen: list[Chosen] = []
    if int(kind_fail.sum()) < MIN_SUPPORT or not len(conds):
        return chosen
    rng = np.random.default_rng(PERMUTATION_SEED)

    def stats(rows_a: np.ndarray, rows_b: np.ndarray | None = None, act: np.ndarray | None = None) -> tuple[np.ndarray, ...]:
        """Failures, weighted count against, informative trials against (``hard``) and rows covered,
        of every condition (or pair of conditions ``rows_a`` x ``rows_b``), over the active rows
        (``act``, default the cover's)."""
        act = active if act is None else act
        f, g, h = kind_fail & act, against & act, hard & act
        ma, mg = masks[rows_a][:, f].astype(np.float64), masks[rows_a][:, g].astype(np.float64)
        mh, mc = masks[rows_a][:, h].astype(np.float64), masks[rows_a][:, act].astype(np.float64)
        if rows_b is None:
            return ma.sum(axis=1), mg @ weight[g], mh.sum(axis=1), mc.sum(axis=1)
        mb, nb = masks[rows_b][:, f].astype(np.float64), masks[rows_b][:, g].astype(np.float64)
        hb, cb = masks[rows_b][:, h].astype(np.float64), masks[rows_b][:, act].astype(np.float64)
        return ma @ mb.T, (mg * weight[g]) @ nb.T, mh @ hb.T, mc @ cb.T

    def chance(fail: float, nag: float, act: np.ndarray | None = None) -> float:
        """Of the informative trials (those that could show ``kind``: its failures, successes and
        failures later in a trial), the chance that ``fail + nag`` drawn at random hold ``fail``
        failures or more."""
        act = active if act is None else act
        population = int(((kind_fail | hard) & act).sum())
        return hypergeom_tail(population, int((kind_fail & act).sum()), int(fail + nag), int(fail))

    def next_gain(j: int, options: list[int]) -> float:
        """Failures the surest other option would still explain, as a rule, once ``j`` is taken."""
        act = active & ~masks[j]
        others = np.array([c for c in options if c != j], dtype=int)
        fail, agn, nag, _ = stats(others, act=act)
        for pos in range(len(others)):
            if (fail[pos] >= MIN_SUPPORT and fail[pos] >= MIN_PRECISION * (fail[pos] + agn[pos]) - 1e-9
                    and chance(fail[pos], nag[pos], act) <= ALPHA):
                return float(fail[pos])
        return 0.0

    def family_bound() -> float:
        """The largest chance a one-condition rule may have so that, had the failures nothing to do
        with the parameters, a rule as sure would turn up among all the conditions in fewer than
        ``ALPHA_FAMILY`` of the permutations of the outcomes over the active rows (Westfall-Young):
        the search over every parameter and threshold is paid for, and the sampler's habits (which
        parameters moved together) are kept, since only the outcomes are shuffled."""
        rows = np.flatnonzero(counted & active)
        m = np.unique(masks[:, rows], axis=0).astype(np.float32)
        k = kind_fail[rows].astype(np.float32)
        w = np.where(kind_fail[rows], 0.0, weight[rows]).astype(np.float32)
        informative = (kind_fail | hard)[rows].astype(np.float32)
        table = _tail_table(int(informative.sum()), int(k.sum()))
        perms = np.argsort(rng.random((PERMUTATIONS, len(rows))), axis=1)
        fail = m @ k[perms].T
        agn = m @ w[perms].T
        draws = m @ informative[perms].T
        valid = (fail >= MIN_SUPPORT) & (fail >= MIN_PRECISION * (fail + agn) - 1e-6)
        p = np.where(valid, table[np.rint(draws).astype(int), np.rint(fail).astype(int)], 1.0)
        least = np.sort(p.min(axis=0))
        allowed = int(math.floor(ALPHA_FAMILY * (PERMUTATIONS + 1))) - 1
        return float(least[allowed]) if allowed < PERMUTATIONS else 1.0

    def pick(fail: np.ndarray, agn: np.ndarray, nag: np.ndarray, cov: np.ndarray, alpha: float,
             extra_ok: Any = None, family: bool = False, count: int = 1) -> list[int]:
        """Up to ``count`` acceptable candidates, surest first: the lower bound of the precision
        (purity and support together, so a pure rule takes its failures before a broader, less
        pure one that covers some of them too), then the most failures net of what counts
        against, then the tightest (fewest rows)."""
        prec = fail / np.maximum(fail + agn, 1e-9)
        idx = np.flatnonzero((fail >= MIN_SUPPORT) & (prec >= MIN_PRECISION))
        out: list[int] = []
        if not len(idx):
            return out
        bound: list[float] = []
        lb = _wilson_low(fail[idx], fail[idx] + agn[idx])
        keys = np.lexsort((idx, cov[idx], -(fail[idx] - agn[idx]), -np.round(lb, 6)))
        for j in idx[keys][:MAX_RANKED]:
            p = chance(fail[j], nag[j])
            if p > alpha:
                continue
            if family:
                if not bound:
                    bound.append(family_bound())
                if p >= bound[0]:
                    continue
            if extra_ok is None or extra_ok(int(j)):
                out.append(int(j))
                if len(out) >= count:
                    break
        return out

    def rivals(idx: tuple[int, ...], mask: np.ndarray) -> Chosen:
        """The rule, and the conditions on other parameters that hold in every failure it explains,
        are refuted by no more trials than it (successes, later failures; a failure at the same
        stage may have come first) and go with the failures on their own: the data cannot tell
        them from the rule (tightest first). A rival that explains more failures, and is a rule
        by itself, takes the rule's place."""
        f = mask & kind_fail & active
        ok = masks[:, f].all(axis=1) & ~np.isin(params_of, [params_of[i] for i in idx])
        ok &= masks[:, hard & active].sum(axis=1) <= int((mask & hard & active).sum())
        cand = np.flatnonzero(ok)
        if not len(cand):
            return idx, mask, []
        fail, agn, nag, cov = stats(cand)
        found: dict[tuple[str, str], int] = {}
        for pos, c in enumerate(cand):
            if chance(fail[pos], nag[pos]) > ALPHA:
                continue
            if fail[pos] > f.sum() and fail[pos] >= MIN_PRECISION * (fail[pos] + agn[pos]):
                return rivals((int(c),), masks[c])
            key = (str(params_of[c]), conds[c].op if conds[c].op != "=" else f"={conds[c].value!r}")
            if key not in found or cov[pos] < cov[found[key]]:
                found[key] = pos
        ranked = sorted(found.values(), key=lambda pos: (cov[pos], cand[pos]))
        return idx, mask, [int(cand[pos]) for pos in ranked[:MAX_RIVALS]]

    every = np.arange(len(conds))
    while int((kind_fail & active).sum()) >= MIN_SUPPORT:
        fail1, agn1, nag1, cov1 = stats(every)
        # of the surest few acceptable rules, the one that leaves the most to the others: a rule
        # over the failures of two causes (channels >= 10 over both the Tree trials and the
        # buffer ones) leaves the Tree rule too few, the Tree rule leaves the channels rule enough
        options = pick(fail1, agn1, nag1, cov1, ALPHA, family=True, count=LOOKAHEAD)
        j = max(options, key=lambda c: fail1[c] + next_gain(c, options)) if len(options) > 1 else next(iter(options), None)
        best_single = float(_wilson_low(fail1[j], fail1[j] + agn1[j])) if j is not None else -np.inf
        # two conditions, when the pair explains more, net of what counts against, than any one
        # condition: each must matter given the other (both_needed)
        # each condition of a pair must go with the failures on its own too (a crash needs both
        # "too many channels" and "too big buffers", each raising the failure rate): a condition
        # that only matters inside the other's trials is a coincidence of the search
        cand = np.flatnonzero(fail1 > 0)
        cand = cand[np.argsort(-fail1[cand], kind="stable")[:MAX_PAIR_CANDIDATES]]
        cand = np.array([c for c in cand if chance(fail1[c], nag1[c]) <= ALPHA_ALONE], dtype=int)
        pair = None
        if len(cand) >= 2:
            n = len(cand)
            fail2, agn2, nag2, cov2 = stats(cand, cand)
            allowed = np.triu(np.ones((n, n), dtype=bool), k=1) & (params_of[cand][:, None] != params_of[cand][None, :])
            # a pair only where it is clean (no success, no later failure covered) and surer than
            # any one condition: two thresholds fitted to the data need no counterexample
            clean = nag2 == 0
            fail2 = np.where(allowed & clean & (_wilson_low(fail2, fail2 + agn2) > best_single), fail2, 0.0)

            def both_needed(flat: int, n: int = n, cand: np.ndarray = cand, fail1: np.ndarray = fail1,
                            nag1: np.ndarray = nag1, fail2: np.ndarray = fail2, nag2: np.ndarray = nag2) -> bool:
                """Among the rows one condition covers, the other picks out the failures beyond
                chance, both ways (else it is one condition plus a coincidence)."""
                for x in divmod(flat, n):
                    within, k_within = int(fail1[cand[x]] + nag1[cand[x]]), int(fail1[cand[x]])
                    if hypergeom_tail(within, k_within, int(fail2.flat[flat] + nag2.flat[flat]),
                                      int(fail2.flat[flat])) > ALPHA_WITHIN:
                        return False
                return True

            flat = next(iter(pick(fail2.ravel(), agn2.ravel(), nag2.ravel(), cov2.ravel(), ALPHA_PAIR, both_needed)), None)
            if flat is not None:
                a, b = divmod(flat, n)
                pair = (int(cand[a]), int(cand[b]))
        if pair is not None:
            mask = masks[pair[0]] & masks[pair[1]]
            chosen.append(rivals(pair, mask))
        elif j is not None:
            chosen.append(rivals((j,), masks[j]))
        else:
            break
        active &= ~chosen[-1][1]
    return chosen


def failure_rules(views: Sequence[TrialView]) -> RuleReport:
    """The crash rules of the finished trials ``views`` (see the module docstring)."""
    rows = _finished(views)
    n = len(rows)
    crashed = np.array([_crashed(v) for v in rows], dtype=bool)
    kinds_of = np.array([(v.failure_kind or "?") if c else "" for v, c in zip(rows, crashed)], dtype=object)
    stage_of = np.array([_stage(k) if k else -1 for k in kinds_of])
    kinds = sorted({k for k in kinds_of if k})
    conds, masks = candidate_conditions(rows)
    params_of = np.array([c.param for c in conds], dtype=object)
    Found = dict[str, list[Chosen]]

    def weights(kind: str, explained: np.ndarray) -> np.ndarray:
        """Against a rule of ``kind``: a success 1; a failure of another kind that happens later
        in a trial 1 (the trial got past where ``kind`` happens), earlier 0 (it never got
        there), at the same stage ``OTHER_WEIGHT``, or ``EXCUSED_WEIGHT`` once a rule of its own
        kind explains it; a failure of ``kind`` 0."""
        stage = _stage(kind)
        w = np.where(crashed, OTHER_WEIGHT, 1.0)
        w[explained & (kinds_of != kind)] = EXCUSED_WEIGHT
        w[crashed & (stage_of > stage)] = 1.0
        w[crashed & (stage_of < stage)] = 0.0
        w[kinds_of == kind] = 0.0
        return w

    def run(explained: np.ndarray) -> Found:
        return {kind: _cover_kind(kinds_of == kind, weights(kind, explained), conds, masks, params_of)
                for kind in kinds}

    def explained_by(found: Found) -> np.ndarray:
        out = np.zeros(n, dtype=bool)
        for kind, chosen in found.items():
            for _, mask, _ in chosen:
                out |= mask & (kinds_of == kind)
        return out

    found = run(explained_by(run(np.zeros(n, dtype=bool))))
    explained = explained_by(found)
    rules: list[FailureRule] = []
    unexplained: dict[str, list[int]] = {}
    for kind in kinds:
        kind_fail = kinds_of == kind
        informative = kind_fail | (weights(kind, explained) >= 1.0)
        left = kind_fail.copy()
        for idx, mask, rival in found[kind]:
            mine = mask & left
            left &= ~mask
            failed = int((mask & kind_fail).sum())
            rules.append(FailureRule(
                conditions=tuple(conds[i] for i in idx), kind=kind, failed=failed, covered=int(mask.sum()),
                trials=[rows[i].number for i in np.flatnonzero(mine)],
                other_failures=int((mask & crashed & ~kind_fail).sum()),
                p_value=hypergeom_tail(int(informative.sum()), int(kind_fail.sum()), int((mask & informative).sum()), failed),
                confounded_with=[conds[i] for i in rival],
            ))
        if left.any():
            unexplained[kind] = [rows[i].number for i in np.flatnonzero(left)]
    rules.sort(key=lambda r: (-len(r.trials), r.kind, r.condition))
    return RuleReport(rules=rules, unexplained=unexplained, finished=n)


# -- importance ----------------------------------------------------------------------------------
def _groups(values: list[Any], n_bins: int) -> np.ndarray | None:
    """Group index of each row: the value (categorical) or a quantile bin (numeric); None if the
    parameter has a single value."""
    present = [x for x in values if x is not None]
    if len(set(map(repr, present))) < 2:
        return None
    if present and all(_is_number(x) for x in present):
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
    if present and all(_is_number(x) for x in present):
        return [min(present), max(present)]
    return list({repr(x): x for x in present}.values())


def importance(views: Sequence[TrialView]) -> dict[str, Any]:
    """Importance for the objective (feasible trials) and for feasibility (finished trials)."""
    rows = _finished(views)
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
        "rule_settings": _rule_settings(),
        "metric": objective.get("metric"),
        "importance": imp,
    }
