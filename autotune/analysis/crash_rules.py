"""Which values crash: the crash rules of a study, a minimal explanation of its failures.

:func:`failure_rules` reads the trials (:class:`autotune.store.study_view.TrialRecord`) and returns a
:class:`RuleReport`; ``autotune study explain`` prints it (:mod:`autotune.analysis.explain`), the default
sampler avoids the regions where every trial a rule covers failed (:mod:`autotune.search.samplers`).

A rule is a conjunction of one or two conditions on the *applied* parameter values (``P=v``;
``P >= x`` / ``P <= x`` for a numeric parameter, or over the numbers of a categorical one such as
``[unset, 2, 4]``; ``x`` an observed value), or on a quantity the engine computes from several
of them (:mod:`autotune.config.derived`: ``nccl_buffers_mib``, channels x each connection's buffers, a
boundary no one parameter draws), and predicts one failure kind:
``NCCL_ALGO=Tree -> nccl-error (4 of 4)`` says 4 finished trials had Tree set and all 4 failed
with ``nccl-error``. Finished trials are the measured ones (``ok``; an SLO violation is measured,
not a crash) and the failed ones (``infeasible``); faults are the infrastructure's and say nothing
about a configuration. The rules are found for each failure kind K by sequential greedy set
cover:

0. **A setting the engine's error names** is a rule from one failure: NCCL says which setting it
   could not use (``No algorithm/protocol available for function AllGather ... NCCL_ALGO was set
   to Tree.``), and that is the evidence, not a count. A categorical ``P=v`` whose value and
   parameter (or flag) a failure's message names (:func:`autotune.outcome.failures.names_choice`; not a
   memory kind: memory is a sum no one setting is to blame for) is a rule of that failure's kind
   when no trial that could have refuted it did (nothing measured had ``P=v``, nothing failed
   later in a trial with it): ``NCCL_ALGO=Tree -> nccl-error (1 of 1; the error names it)``. It
   is taken before the cover, which then works on the trials it leaves. (The default sampler
   stops proposing a named choice after one failure, so such a study rarely holds the three
   failures a counted rule needs: without this step ``explain`` said nothing of Tree.)
1. **What a trial says about a rule of kind K** depends on how far it got (:data:`STAGES`: the
   arguments, sizing the KV pool -- before any NCCL collective, whose buffers are allocated
   lazily out of the headroom --, the rest of start-up, under load). A success, or a failure
   *later* in a trial (``crash-under-load`` after start-up), refutes the rule: it counts 1
   against it and is *informative*. A failure *earlier* in a trial (``not-enough-memory`` before
   NCCL ever ran) could not have shown K: it counts 0 and says nothing. A failure of another
   kind at the same stage (an OOM against a NCCL rule) may have come first: it counts half
   (``other_weight``), a quarter once a rule of its own kind explains it (``excused_weight``) --
   but half still against a rule on a parameter of that rule: where a memory fraction above
   0.93 fails both ways, the OOMs that ``mem_fraction_static >= 0.9 -> oom`` explains are the
   fraction's doing too, and say that the kind there is not the fraction's to choose (on the
   GLM-5 host, ``mem_fraction_static >= 0.93 -> nccl-error``, which the model gives 34 % with
   57 % OOMs, was taken that way). And a failure of another kind at the same stage *past*
   every failure of K that a threshold covers, on the threshold's own parameter, counts in full
   against it: along that parameter the kind has changed, where the threshold says it holds all
   the way (on the GLM-5 host NCCL errors at a memory fraction of 0.93 and OOMs at 0.94, where
   there is no room left for the request tables, ``mem_fraction_static >= 0.93 ->
   nccl-error (6 of 9)``, 0.38 by the model, was taken at 100 trials with the OOMs at half, and
   at 200 as a pair with ``NCCL_MIN_NCHANNELS >= 9``, 7 of 8 and 0.45: a pair with such a row
   is not clean, step 5). Two passes: the second knows what the first explained.
2. **A candidate** explains at least ``min_support`` failures of K with precision (failures over
   failures plus what counts against) at least ``min_precision``, and is unlikely by chance
   among the informative trials: the hypergeometric chance of that many K failures among that
   many informative trials drawn at random is below ``alpha``. The informative trials alone,
   because a rule must be told from the trials that could have refuted it: in a study where
   every trial that did not fail with a NCCL error went out of memory first, "low
   ``mem_fraction_static`` -> nccl-error" is no rule, whatever its purity (the NCCL errors
   show only where the OOMs did not pre-empt them). And its failures came in at least
   ``MIN_SUPPORT`` settings of the *other* parameters (:class:`_Settings`; or in as many as the
   study's trials hold): five failures of one configuration with only the rule's own parameters
   moved -- a probe of every draft-token count around one incumbent -- show what fails at that
   configuration, not what fails whatever the rest. A derived quantity moves with each of the
   parameters it is read from, so its failures must come in that many settings of the rest with
   any one of them counted as its own (a probe of channels around one configuration is no
   buffers rule); it is monotone for the kinds it declares (more buffers, more NCCL errors and
   OOMs). On the GLM-5
   host such rules (``mem_fraction_static >= 0.9 & speculative_num_draft_tokens >= 2 ->
   nccl-error (6 of 6)``, five of the six at one setting of the rest) held 18 % of the time over
   the configurations their studies explored: the NCCL buffers fit or not by the memory all the
   other parameters leave. **A memory failure is a boundary** (:data:`autotune.outcome.failures.MEMORY_KINDS`:
   a sum of the KV pool, CUDA graphs, draft tokens and NCCL buffers crossing a capacity), and a
   sampler's failures gather near it, where any parameter's range can hold a few of them: a
   one-condition rule of a memory kind on fewer than ``MIN_BOUNDARY_SUPPORT`` failures must be a
   threshold the way the search space declares its parameter monotone for that kind
   (``mem_fraction_static >= x -> oom`` under ``monotone: {oom: up}``), the declaration being
   what makes one threshold stand for the boundary; otherwise it needs the support of a pair.
   On the explain bench's 30-trial studies, 3 of 9 such rules on 3 failures were true by the
   simulator's model; the two false ones (``speculative_num_draft_tokens <= 4 -> oom``,
   ``NCCL_MAX_NCHANNELS <= 12 -> oom``, model 0.23 and 0.37) were on undeclared parameters.
3. **The search is paid for**: a one-condition rule must also be one that, had the failures
   nothing to do with the parameters, would turn up as surely among *all* the candidate
   conditions in fewer than ``alpha_family`` of ``permutations`` shuffles of the outcomes over
   the trials (a Westfall-Young max-statistic test). A study has hundreds of conditions (every
   threshold of every parameter), so "6 of 6 failed, chance 2 %" is expected somewhere when most
   trials fail; only the outcomes are shuffled, so the sampler's habits (parameters that moved
   together) are kept. Seeded: the same study gives the same rules.
4. **Each step** takes the surest acceptable candidate -- the highest lower bound (Wilson, 90 %)
   of the precision, which weighs purity and support together, then the most failures net of
   what counts against, then the tightest --, over the trials no earlier rule covers: its
   failures are then explained and its trials leave the pool, so a later rule is judged only on
   what is left, and a rule whose failures another explains is never printed. **A rule whose
   failures divide between causes is not taken**: when a one-condition rule that some trial of
   the study counts against would take failures of which a condition on another parameter
   explains some as surely over the whole study (an acceptable candidate there, going with the
   failures on its own at ``alpha_alone``), leaving it fewer than ``min_support`` of its own, the
   data show two causes each too thin for a rule, not one: the next candidate is tried. On the
   Kimi host ``cuda_graph_max_bs >= 94 -> oom (6 of 7)`` took three OOMs of three causes (8 and
   6 draft tokens, a batch of 256 at 480 requests), one of them also under a memory fraction at
   the boundary; the model gave it 0.26. A clean rule (nothing against it) is kept: every Tree
   trial failed, whether or not its buffers would have crashed too. Also measured and
   not kept: taking, of the surest few, the one that leaves the most failures to the others (it
   recovered a Tree rule whose trials a channels threshold had taken, but as often preferred a
   threshold over the failures of two causes, which the model then refuted).
5. **A pair of conditions** is taken only when it is clean (no informative trial against it: two
   thresholds fitted to the data need no counterexample), surer than any one condition --
   neither alone explains those failures, as when only many channels *and* a high
   ``mem_fraction_static`` run out of memory --, with ``alpha_pair`` for chance, each condition
   going with the failures on its own (``alpha_alone``) and mattering given the other (among
   the trials one covers, the other picks out the failures beyond chance, ``alpha_within``,
   both ways). The tests keep out the pairs that the sampler's habits make look good (it
   concentrates every parameter near the best trials, so any parameter seems to "split" a few).
   A pair rests on at least ``min_pair_support`` failures: its two thresholds sit at the
   failures nearest the successes, one on each axis, and a few failures place them where no
   failure was on both at once. On the explain bench's longer studies every pair of 3 or 4
   failures (four of them) was imprecise or false by the simulator's model (0.34-0.73: NCCL
   buffers that fail with many channels and a high memory fraction, but also by buffer size and
   protocol), and none of the eleven of 5 or more was false.
6. **Confounds are named, not resolved by fiat**: conditions on other parameters that hold in
   every failure the rule explains, are refuted by no more informative trials than it, and go
   with the failures on their own (``alpha``) are the rule's rivals (``confounded_with``, at
   most ``MAX_RIVALS``, tightest first): the data cannot tell them from the rule, which is then
   "one of these". A rival that explains more failures, and is a rule by itself, takes the
   rule's place. Conditions on other parameters that would have been taken as surely at that
   step (the same lower bound and the same failures net of what counts against), explaining
   other failures of the kind, are named too (``as_sure``, at most ``MAX_RIVALS``): with nothing
   in the data to choose between them, which one is printed first is an accident of order, and
   the rule is one of them (``NCCL_MIN_NCHANNELS >= 18`` and ``mem_fraction_static >= 0.91``,
   each over three of four NCCL errors and no success: tests/analysis/test_explain.py).
7. Each failure is attributed to the first rule that covers it; the others are reported as
   explained by no rule.

A value that merely co-occurred with the cause (``speculative_num_draft_tokens=4`` in the two
trials that both had ``NCCL_ALGO=Tree``) explains nothing once the cause is taken, so it is not
printed; failures of two kinds are never one rule; two failures are no rule, unless the engine's
error names the setting (step 0).

What a rule does not say: it holds over the configurations the study tried. A threshold sits at
the failure nearest the successes (the tightest rule), but where the true boundary also depends
on a parameter the failures did not vary (NCCL buffers per channel depend on ``NCCL_PROTO``), the
rule claims more than the data can show; docs/BENCHMARKS.md measures how often, against the
simulator's model. Where the search space declares a parameter monotone for the rule's kind
(``monotone: {nccl-error: up}`` on ``NCCL_MIN_NCHANNELS``: more channels fail the same way) and
the trials the rule was judged on (those it covers that no earlier rule of its kind covers) all
lay on the failing side of what the study tried elsewhere, the rule says so (its ``scope``:
``NCCL_BUFFSIZE >= 8388608 -> nccl-error (6 of 6; shown only with NCCL_MIN_NCHANNELS >= 8)``):
fewer channels were never tried with those buffers, and by the declaration they may be what
made the buffers fit or fail. Likewise on the rule's own threshold, unless the space declares
that parameter monotone for the kind: where the study tried nothing beyond some value that the
space allows, or its judged trials there failed earlier in a trial (``not-enough-memory``
sizing the KV pool, before NCCL ran), the rule says it was shown up to that value only
(``mem_fraction_static >= 0.59 -> nccl-error (3 of 4; shown only with mem_fraction_static <=
0.59)``): past it, the study cannot say whether NCCL would have failed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from autotune.config.derived import DERIVED, derived_inputs, derived_value, derived_values
from autotune.outcome.failures import MEMORY_KINDS, names_choice
from autotune.store.record import TrialRecord

MIN_SUPPORT = 3
"""Fewest failures a crash rule rests on..."""
MIN_PAIR_SUPPORT = 5
"""...and a two-condition one (the module docstring, step 5)..."""
MIN_BOUNDARY_SUPPORT = 5
"""...and a one-condition rule of a memory kind on a parameter the space does not declare
monotone for that kind, that way (the module docstring, step 2)."""
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
STAGES = {"invalid-argument": 0, "not-enough-memory": 1, "crash-under-load": 3, "request-errors": 3}
"""Where in a trial a failure kind happens: the arguments, sizing the KV pool (before any NCCL
collective), the rest of start-up (out of memory, NCCL errors, timeouts, unknown kinds:
:data:`START_UP`), under load."""
START_UP = 2
MAX_PAIR_CANDIDATES = 400
"""Conditions (those with the most failures) tried in pairs."""
MAX_RANKED = 500
"""Candidates tested for chance, surest first, before a cover step gives up."""
MAX_RIVALS = 3
"""Conditions the data cannot tell from a rule, named with it at most."""
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
            v = derived_value(self.param, params)  # a quantity the parameters give (autotune.config.derived)
        if v is None:
            return False
        if self.op == "=":
            return bool(v == self.value and isinstance(v, bool) == isinstance(self.value, bool))
        if not is_number(v):
            return False
        return bool(v >= self.value) if self.op == ">=" else bool(v <= self.value)

    def __str__(self) -> str:
        if self.op == "=":
            return f"{self.param}={show_value(self.value)}"
        return f"{self.param} {self.op} {show_value(self.value)}"

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
    as_sure: list[Condition] = field(default_factory=list)
    """Conditions on other parameters the cover would have taken as surely at the step that took
    this rule, over other failures of its kind: the data does not choose between them (the
    module docstring, step 6)."""
    named: bool = False
    """The rule rests on the engine's error naming its setting (the module docstring, step 0)."""
    scope: list[Condition] = field(default_factory=list)
    """Where the rule was shown. On its own thresholds: how far the trials it was judged on (those
    it covers that no earlier rule of its kind covers) got to where its kind happens, the rest
    having failed earlier (:func:`rule_reach`). On parameters monotone for its kind: those trials
    held these conditions, and other trials of the study did not (:func:`rule_scope`; see the
    module docstring)."""

    @property
    def condition(self) -> str:
        return " & ".join(str(c) for c in self.conditions)

    def __str__(self) -> str:
        named = "; the error names it" if self.named else ""
        scope = f"; shown only with {', '.join(str(c) for c in self.scope)}" if self.scope else ""
        return f"{self.condition} -> {self.kind} ({self.failed} of {self.covered}{named}{scope})"

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
            "named_by_error": self.named,
            "confounded_with": [str(c) for c in self.confounded_with],
            "confounded_conditions": [c.to_json() for c in self.confounded_with],
            "as_sure": [str(c) for c in self.as_sure],
            "as_sure_conditions": [c.to_json() for c in self.as_sure],
            "scope": [str(c) for c in self.scope],
            "scope_conditions": [c.to_json() for c in self.scope],
            "derived": {c.param: DERIVED[c.param].meaning for c in (*self.conditions, *self.confounded_with, *self.as_sure)
                        if c.param in DERIVED},
        }


@dataclass
class OneConfiguration:
    """Failures of one kind that no rule explains, at one setting of every parameter but one
    (a probe of ``param`` around one configuration, say): what fails *there*, not a rule (the
    module docstring, step 2). ``failed``: the values of ``param`` that failed with ``kind``;
    ``ran``: those measured at the same setting of the rest; ``trials``: the failures."""

    kind: str
    param: str
    failed: list[Any]
    ran: list[Any]
    trials: list[int]

    def __str__(self) -> str:
        ran = f"; {', '.join(map(show_value, self.ran))} ran" if self.ran else ""
        return (f"at one configuration (trial {self.trials[0]}'s, the rest unchanged): {self.param} "
                f"{', '.join(map(show_value, self.failed))} failed ({self.kind}){ran}: what fails there, not a rule")

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "param": self.param, "failed": self.failed, "ran": self.ran, "trials": self.trials,
                "text": str(self)}


@dataclass
class RuleReport:
    """The rules, the failures no rule explains (trial numbers per kind), and those of them that
    came at one configuration (:class:`OneConfiguration`)."""

    rules: list[FailureRule]
    unexplained: dict[str, list[int]]
    finished: int
    at_one_configuration: list[OneConfiguration] = field(default_factory=list)

    def unexplained_json(self) -> dict[str, Any]:
        trials = sorted(n for ns in self.unexplained.values() for n in ns)
        return {"count": len(trials), "trials": trials,
                "kinds": {k: len(v) for k, v in sorted(self.unexplained.items()) if v},
                "at_one_configuration": [c.to_json() for c in self.at_one_configuration]}


def is_number(x: Any) -> bool:
    """A finite int or float (not a bool)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(float(x))


def _numbers(rows: Sequence[TrialRecord], name: str) -> np.ndarray:
    """Each row's value of ``name`` as a float; NaN where it is missing or not a number."""
    return np.array([float(x) if is_number(x := v.params.get(name)) else np.nan for v in rows])


def show_value(x: Any) -> str:
    """A parameter value as a rule or a message names it (floats short, large ones exact)."""
    if isinstance(x, float):
        return f"{x:g}" if abs(x) < 1e6 else str(int(x)) if x.is_integer() else repr(x)
    return str(x)


def _crashed(v: TrialRecord) -> bool:
    return v.outcome == "infeasible" and (v.failure_kind or "") not in NOT_A_CRASH


MEASURED = ("ok", "stopped")
"""Outcomes of a configuration that ran: measured to the end, or until it could not win."""


def finished(views: Sequence[TrialRecord]) -> list[TrialRecord]:
    """The measured (``ok``, and ``stopped``: a load stopped early ran fine) and failed
    (``infeasible``) trials: what the analysis reads."""
    return [v for v in views if v.outcome in (*MEASURED, "infeasible")]


def candidate_conditions(rows: Sequence[TrialRecord]) -> tuple[list[Condition], np.ndarray]:
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
        arr = _numbers(rows, name)
        if all(is_number(x) for x in present):
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
            numbers = sorted({x for x in present if is_number(x)})
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


# -- statistics ----------------------------------------------------------------------------------
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


def tail_table(population: int, successes: int) -> np.ndarray:
    """``T[d, x]`` = :func:`hypergeom_tail` ``(population, successes, d, x)`` for every ``d`` in
    ``0..population`` and ``x`` in ``0..successes + 1``: the chances of many candidates at once."""
    lf = np.concatenate([[0.0], np.cumsum(np.log(np.arange(1, population + 1, dtype=float)))])
    d = np.arange(population + 1)[:, None]
    x = np.arange(successes + 1)[None, :]
    rest = d - x
    ok = (rest >= 0) & (rest <= population - successes)
    rest = np.clip(rest, 0, population - successes)
    log_p = (lf[successes] - lf[x] - lf[successes - x] + lf[population - successes] - lf[rest]
             - lf[population - successes - rest] - (lf[population] - lf[d] - lf[population - d]))
    pmf = np.where(ok, np.exp(log_p), 0.0)
    tail = np.cumsum(pmf[:, ::-1], axis=1)[:, ::-1]
    return np.minimum(1.0, np.concatenate([tail, np.zeros((population + 1, 1))], axis=1))


def stage(kind: str) -> int:
    """Where in a trial a failure of ``kind`` happens (:data:`STAGES`; a kind seen under load,
    :func:`rule_kind`, is at the last stage)."""
    return STAGES["crash-under-load"] if kind.endswith(UNDER_LOAD) else STAGES.get(kind, START_UP)


UNDER_LOAD = " under load"


def rule_kind(v: TrialRecord) -> str:
    """The kind a rule states for a failed trial: its failure kind, ``oom under load`` where an
    engine error of that kind happened under load (a limit other than start-up's)."""
    f = v.failure
    if f is None:
        return "?"
    kind = str(f.kind)
    if f.phase == "load" and kind not in STAGES:
        return kind + UNDER_LOAD
    return kind


def base_kind(kind: str) -> str:
    """The failure kind of a rule's kind (``oom under load`` -> ``oom``)."""
    return kind.removesuffix(UNDER_LOAD)


def rule_settings() -> dict[str, Any]:
    """The crash rules' settings (the module's constants), as ``explain`` reports them."""
    return {"min_support": MIN_SUPPORT, "min_pair_support": MIN_PAIR_SUPPORT,
            "min_boundary_support": MIN_BOUNDARY_SUPPORT, "min_precision": MIN_PRECISION,
            "alpha": ALPHA, "alpha_family": ALPHA_FAMILY, "permutations": PERMUTATIONS, "alpha_pair": ALPHA_PAIR, "alpha_alone": ALPHA_ALONE,
            "alpha_within": ALPHA_WITHIN, "other_weight": OTHER_WEIGHT, "excused_weight": EXCUSED_WEIGHT}


# -- the cover -----------------------------------------------------------------------------------
Chosen = tuple[tuple[int, ...], np.ndarray, list[int], list[int]]
"""A rule the cover took: its condition indices, the rows it covers, its rivals' indices and the
indices of the conditions as sure as it at the step that took it."""


class _Settings:
    """The finished trials' settings of every parameter but some (the module docstring, step 2):
    a rule over parameters ``P`` rests on failures at ``MIN_SUPPORT`` distinct settings of the
    parameters other than ``P``, or at as many as the study tried (a study that varied only ``P``
    has one). (Settings that must differ in two parameters or more were measured and dropped:
    they lost Tree rules on the explain bench, whose failures are probes of successive best
    trials, a parameter apart; docs/BENCHMARKS.md.)"""

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


class _Cover:
    """The sequential greedy cover of one kind's failures (the module docstring, steps 2-6).

    ``kind_fail``: the rows that failed with the kind; ``weight``: how much each other row counts
    against a rule covering it (0: says nothing; 1: refutes it, and is informative); ``bounds``:
    the permutation bounds already computed (the second pass often asks for the same);
    ``dense``: ``masks`` as float32, for the products."""

    def __init__(self, kind_fail: np.ndarray, weight: np.ndarray, conds: list[Condition], masks: np.ndarray,
                 params_of: np.ndarray, bounds: dict[bytes, float], dense: np.ndarray, settings: _Settings,
                 exposed: np.ndarray | None = None, taken: np.ndarray | None = None,
                 thin_ok: np.ndarray | None = None, beyond: np.ndarray | None = None) -> None:
        self.kind_fail, self.weight, self.conds, self.masks, self.params_of = kind_fail, weight, conds, masks, params_of
        self.dense = dense
        self.settings = settings
        """The rows' settings of the other parameters (:class:`_Settings`)."""
        self.beyond = beyond
        """Per threshold condition, the rows it covers that failed with another kind at the same
        stage past every failure of the kind it covers, on its own parameter: they count 1
        against it (the module docstring, step 1); None: no such row."""
        self.exposed = exposed
        """Per condition, the rows it covers whose failure (of another kind) a rule on the
        condition's own parameter explains: they count ``OTHER_WEIGHT`` against it, not
        ``EXCUSED_WEIGHT`` (the module docstring, step 1); None: no such row."""
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
        monotone for the kind that way (the module docstring, step 2)."""
        return self.thin_ok is not None and not self.thin_ok[j] and failures < MIN_BOUNDARY_SUPPORT - 1e-9

    def spread(self, idx: Sequence[int], mask: np.ndarray) -> bool:
        """Whether the failures of the kind that the rule ``idx`` covers among the active rows
        came in enough settings of the other parameters (the module docstring, step 2)."""
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
        lb = _wilson_low(fail[idx], fail[idx] + agn[idx])
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
            return round(float(_wilson_low(fail[j], fail[j] + agn[j])), 6), round(float(fail[j] - agn[j]), 6)

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
        """The two-condition rule this step would take, if any (the module docstring, step 5)."""
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
        fail2 = np.where(allowed & (fail2 >= MIN_PAIR_SUPPORT) & (_wilson_low(fail2, fail2 + agn2) > best_single),
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
        as :meth:`single` gives them) has failures that divide between causes (the module
        docstring, step 4): some trial of the study counts against it (it is not clean), and a
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
        sure = _wilson_low(fail, fail + agn) >= _wilson_low(counts[0][j], counts[0][j] + counts[1][j]) - 1e-9
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
            best_single = float(_wilson_low(counts[0][j], counts[0][j] + counts[1][j])) if j is not None else -np.inf
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


def failure_rules(views: Sequence[TrialRecord], monotone: Mapping[str, Mapping[str, str]] | None = None,
                  bounds: Mapping[str, tuple[float, float]] | None = None) -> RuleReport:
    """The crash rules of the finished trials ``views`` (see the module docstring); ``monotone``:
    the search space's declarations (parameter -> {failure kind: "up" | "down"}), and ``bounds``:
    each numeric parameter's range in the space, for each rule's :attr:`~FailureRule.scope`."""
    bounds = bounds or {}
    monotone = {**{d.name: dict(d.monotone) for d in DERIVED.values()}, **(monotone or {})}
    rows = [replace(v, params={**v.params, **derived_values(v.params, v.env)}) for v in finished(views)]
    n = len(rows)
    crashed = np.array([_crashed(v) for v in rows], dtype=bool)
    kinds_of = np.array([rule_kind(v) if c else "" for v, c in zip(rows, crashed)], dtype=object)
    stage_of = np.array([stage(k) if k else -1 for k in kinds_of])
    kinds = sorted({k for k in kinds_of if k})
    conds, masks = candidate_conditions(rows)
    params_of = np.array([c.param for c in conds], dtype=object)
    settings = _Settings(rows)
    family_bounds: dict[bytes, float] = {}
    dense = masks.astype(np.float32)
    Found = dict[str, list[Chosen]]

    def weights(kind: str, explained: np.ndarray) -> np.ndarray:
        """Against a rule of ``kind``: a success 1; a failure of another kind later in a trial 1
        (the trial got past where ``kind`` happens), earlier 0 (it never got there), at the same
        stage ``OTHER_WEIGHT``, or ``EXCUSED_WEIGHT`` once a rule of its own kind explains it."""
        w = np.where(crashed, OTHER_WEIGHT, 1.0)
        w[explained & (kinds_of != kind)] = EXCUSED_WEIGHT
        w[crashed & (stage_of > stage(kind))] = 1.0
        w[crashed & (stage_of < stage(kind))] = 0.0
        w[kinds_of == kind] = 0.0
        return w

    def exposed(kind: str, by_param: dict[str, np.ndarray]) -> np.ndarray | None:
        """Per condition, its rows whose failure of another kind a rule on its own parameter explains."""
        own = {name: rows & (kinds_of != kind) for name, rows in by_param.items()}
        if not any(rows.any() for rows in own.values()):
            return None
        zero = np.zeros(n, dtype=bool)
        return dense * np.stack([own.get(name, zero) for name in params_of]).astype(np.float32)

    named = named_rules(rows, kinds_of, weights, conds, masks)

    def thin_ok(kind: str) -> np.ndarray | None:
        """Per condition, whether a rule of ``kind`` on it may rest on fewer failures than
        ``MIN_BOUNDARY_SUPPORT``: any, but for a memory kind, where it must be a threshold the
        way the space declares its parameter monotone for the kind (step 2)."""
        if base_kind(kind) not in MEMORY_KINDS:
            return None
        way = {"up": ">=", "down": "<="}
        return np.array([c.op == way.get(monotone.get(c.param, {}).get(base_kind(kind), ""), "") for c in conds], dtype=bool)

    def beyond(kind: str) -> np.ndarray | None:
        """Per threshold condition, its rows that failed with another kind at the same stage at a
        value of its parameter past every failure of ``kind`` it covers (step 1); None: none.

        A threshold that covers any failure of ``kind`` covers the most extreme one on its side,
        so "past every failure it covers" is past the parameter's highest (``>=``) or lowest
        (``<=``) failure of ``kind``: one comparison per parameter, not per condition."""
        other = crashed & (kinds_of != kind) & (stage_of == stage(kind))
        if not other.any():
            return None
        own = kinds_of == kind
        past: dict[tuple[str, str], np.ndarray] = {}
        for name in {c.param for c in conds if c.op != "="}:
            vals = _numbers(rows, name)
            failed = vals[own & ~np.isnan(vals)]
            if failed.size:
                past[(name, ">=")] = other & (vals > failed.max())
                past[(name, "<=")] = other & (vals < failed.min())
        zero = np.zeros(n, dtype=bool)
        rows_past = np.stack([past.get((c.param, c.op), zero) for c in conds])
        return (masks & rows_past & (masks & own).any(axis=1)[:, None]).astype(np.float32)

    beyond_of = {kind: beyond(kind) for kind in kinds}

    def run(explained: np.ndarray, by_param: dict[str, np.ndarray]) -> Found:
        found: Found = {}
        for kind in kinds:
            taken = np.zeros(n, dtype=bool)
            for i in named.get(kind, []):
                taken |= masks[i]
            found[kind] = [*(((i,), masks[i], [], []) for i in named.get(kind, [])),
                           *_Cover(kinds_of == kind, weights(kind, explained), conds, masks, params_of, family_bounds,
                                   dense, settings, exposed(kind, by_param), taken, thin_ok(kind),
                                   beyond_of[kind]).run()]
        return found

    def explained_by(found: Found) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """The failures the rules explain, and of them those explained by a rule on each parameter."""
        out = np.zeros(n, dtype=bool)
        by_param: dict[str, np.ndarray] = {}
        for kind, chosen in found.items():
            for idx, mask, _, _ in chosen:
                mine = mask & (kinds_of == kind)
                out |= mine
                for i in idx:
                    by_param[conds[i].param] = by_param.get(conds[i].param, np.zeros(n, dtype=bool)) | mine
        return out, by_param

    found = run(*explained_by(run(np.zeros(n, dtype=bool), {})))
    explained, _ = explained_by(found)
    rules: list[FailureRule] = []
    unexplained: dict[str, list[int]] = {}
    local: list[OneConfiguration] = []
    for kind in kinds:
        kind_fail = kinds_of == kind
        informative = kind_fail | (weights(kind, explained) >= 1.0)
        earlier = crashed & (stage_of < stage(kind))
        left = kind_fail.copy()
        taken = np.zeros(n, dtype=bool)
        for idx, mask, rival, sure in found[kind]:
            mine = mask & left
            left &= ~mask
            judged = mask & ~taken  # the trials it was judged on: no earlier rule of its kind covers them
            taken |= mask
            failed = int((mask & kind_fail).sum())
            is_named = len(idx) == 1 and idx[0] in named.get(kind, [])
            rules.append(FailureRule(
                conditions=tuple(conds[i] for i in idx), kind=kind, failed=failed, covered=int(mask.sum()),
                trials=[rows[i].number for i in np.flatnonzero(mine)],
                other_failures=int((mask & crashed & ~kind_fail).sum()),
                p_value=hypergeom_tail(int(informative.sum()), int(kind_fail.sum()), int((mask & informative).sum()), failed),
                confounded_with=[conds[i] for i in rival],
                as_sure=[conds[i] for i in sure],
                named=is_named,
                scope=[] if is_named else  # the engine's words say it fails whatever the rest
                [*rule_reach(rows, judged & ~earlier, judged, tuple(conds[i] for i in idx), kind,
                             monotone=monotone, bounds=bounds),
                 *rule_scope(rows, judged, kind, idx_params={p for i in idx for p in (conds[i].param, *derived_inputs(conds[i].param))},
                            monotone=monotone)],
            ))
        if left.any():
            unexplained[kind] = [rows[i].number for i in np.flatnonzero(left)]
            local += at_one_configuration(rows, left, ~crashed, kind, settings)
    rules.sort(key=lambda r: (-len(r.trials), r.kind, r.condition))
    return RuleReport(rules=rules, unexplained=unexplained, finished=n, at_one_configuration=local)


def named_rules(rows: Sequence[TrialRecord], kinds_of: np.ndarray, weights: Callable[[str, np.ndarray], np.ndarray],
                conds: Sequence[Condition], masks: np.ndarray) -> dict[str, list[int]]:
    """Per failure kind, the conditions (indices into ``conds``) that are rules because a failure's
    message names them (the module docstring, step 0), most failures first: ``P=v`` on a value
    that is not a number, named by the message of a failure of the kind that had it, and no row
    it covers counts fully against a rule of the kind (``weights(kind, nothing explained)``: a
    trial that ran, or failed later in a trial). Each named failure goes to one rule."""
    nothing = np.zeros(len(rows), dtype=bool)
    out: dict[str, list[int]] = {}
    for kind in sorted({k for k in kinds_of if k and base_kind(k) not in MEMORY_KINDS}):
        fail = kinds_of == kind
        against = (weights(kind, nothing) >= 1.0) & ~fail
        cands = [i for i, c in enumerate(conds)
                 if c.op == "=" and not is_number(c.value) and not isinstance(c.value, bool) and not (masks[i] & against).any()
                 and any(names_choice((rows[r].failure.message if rows[r].failure else ""), c.param, c.value)
                         for r in np.flatnonzero(masks[i] & fail))]
        left = fail.copy()
        for i in sorted(cands, key=lambda i: (-int((masks[i] & fail).sum()), i)):
            if (masks[i] & left).any():
                out.setdefault(kind, []).append(i)
                left &= ~masks[i]
    return out


def at_one_configuration(rows: Sequence[TrialRecord], left: np.ndarray, ran: np.ndarray, kind: str,
                         settings: _Settings) -> list[OneConfiguration]:
    """Of the ``left`` rows (failures of ``kind`` no rule explains), the groups of at least
    ``MIN_SUPPORT`` at one setting of every parameter but one, largest first, no row in two;
    with the values of that parameter the ``ran`` rows (measured) had at the same setting."""
    groups: list[tuple[str, np.ndarray]] = []
    for name in settings.names:
        ids = settings.ids(frozenset({name}))
        values, counts = np.unique(ids[left], return_counts=True)
        groups += [(name, left & (ids == v)) for v, c in zip(values, counts) if c >= MIN_SUPPORT]
    out: list[OneConfiguration] = []
    taken = np.zeros(len(rows), dtype=bool)
    for name, group in sorted(groups, key=lambda g: (-int(g[1].sum()), g[0])):
        group = group & ~taken
        if int(group.sum()) < MIN_SUPPORT:
            continue
        taken |= group
        ids = settings.ids(frozenset({name}))
        same = ids == ids[np.flatnonzero(group)[0]]
        out.append(OneConfiguration(
            kind=kind, param=name, failed=_distinct(rows[i].params.get(name) for i in np.flatnonzero(group)),
            ran=_distinct(rows[i].params.get(name) for i in np.flatnonzero(same & ran)),
            trials=[rows[i].number for i in np.flatnonzero(group)]))
    return out


def _distinct(values: Any) -> list[Any]:
    """``values`` without repeats, the numbers in ascending order before the rest."""
    out: list[Any] = []
    for v in values:
        if v not in out:
            out.append(v)
    return sorted(out, key=lambda v: (0, float(v)) if is_number(v) else (1, 0.0))


def rule_reach(rows: Sequence[TrialRecord], reached: np.ndarray, judged: np.ndarray, conditions: Sequence[Condition],
               kind: str, *, monotone: Mapping[str, Mapping[str, str]],
               bounds: Mapping[str, tuple[float, float]]) -> list[Condition]:
    """How far a rule of ``kind`` was shown along its own thresholds: for each ``P >= lo`` of
    ``conditions``, ``P <= hi`` with ``hi`` the largest ``P`` among the ``reached`` rows (those it
    was judged on that got as far in a trial as ``kind`` happens), when the judged rows or the
    space (``bounds``) go further (``P >= lo`` with the smallest, for ``P <= hi``). Beyond it the
    study tried nothing, or its trials failed earlier (a KV pool too large to size before NCCL
    ever ran): they say nothing of the rule there. Not for a parameter the space declares
    monotone for ``kind`` in the threshold's direction: by the declaration, the failures go on."""
    out: list[Condition] = []
    for c in conditions:
        if c.op not in (">=", "<=") or monotone.get(c.param, {}).get(base_kind(kind)) == ("up" if c.op == ">=" else "down"):
            continue
        seen = [x for x in (v.params.get(c.param) for v, r in zip(rows, reached) if r) if is_number(x)]
        every = [x for x in (v.params.get(c.param) for v, j in zip(rows, judged) if j) if is_number(x)]
        if not seen:
            continue
        lo, hi = bounds.get(c.param, (min(every), max(every)))
        if c.op == ">=" and max(seen) < max(hi, max(every)):
            out.append(Condition(c.param, "<=", max(seen)))
        elif c.op == "<=" and min(seen) > min(lo, min(every)):
            out.append(Condition(c.param, ">=", min(seen)))
    return out


def rule_scope(rows: Sequence[TrialRecord], judged: np.ndarray, kind: str, *, idx_params: set[str],
               monotone: Mapping[str, Mapping[str, str]]) -> list[Condition]:
    """The scope of a rule of ``kind`` judged on the ``judged`` rows: for each parameter the space
    declares monotone for ``kind`` (not one of the rule's own, ``idx_params``), ``P >= lo`` when
    it is "up", every judged trial had ``P >= lo`` and some trial of the study had less (``P <=
    hi`` for "down"): the side the failures lie on, short of what was tried."""
    out: list[Condition] = []
    for name, kinds in sorted(monotone.items()):
        direction = kinds.get(kind)
        if direction not in ("up", "down") or name in idx_params or name in DERIVED:
            continue
        tried = [v.params.get(name) for v in rows]
        mine = [x for x, j in zip(tried, judged) if j and is_number(x)]
        if not mine:
            continue
        others = [x for x in tried if is_number(x)]
        if direction == "up" and min(others) < min(mine):
            out.append(Condition(name, ">=", min(mine)))
        elif direction == "down" and max(others) > max(mine):
            out.append(Condition(name, "<=", max(mine)))
    return out


__all__ = ["Condition", "FailureRule", "MIN_SUPPORT", "OneConfiguration", "RuleReport", "at_one_configuration",
           "candidate_conditions", "failure_rules", "finished", "hypergeom_tail", "is_number", "rule_reach", "rule_scope",
           "rule_settings", "show_value", "stage"]
