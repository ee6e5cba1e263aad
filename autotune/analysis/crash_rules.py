"""Which values crash: the crash rules of a study, a minimal explanation of its failures.

:func:`failure_rules` reads the finished trials and returns a
:class:`~autotune.analysis.rule_report.RuleReport` (``study explain`` prints it; the default sampler
avoids its regions). A rule is one or two :class:`~autotune.analysis.conditions.Condition` on the
applied parameters, or on a quantity derived from them (:mod:`autotune.config.derived`), and
predicts one failure kind: ``NCCL_ALGO=Tree -> nccl-error (4 of 4)``. For each kind K the rules
are a sequential greedy cover (:class:`~autotune.analysis.rule_cover.RuleCover`, which holds the
constants named here):

0. ``P=v`` named by a failure's message (:func:`~autotune.outcome.failures.names_choice`, not a
   memory kind) and refuted by no trial is a rule from that one failure, taken first.
1. Against a rule of K a success or a later failure counts 1, an earlier one 0, another kind at
   the same stage (:data:`~autotune.analysis.failure_stages.STAGES`) ``OTHER_WEIGHT``, or
   ``EXCUSED_WEIGHT`` once another rule explains it. Two passes: the second knows the first's.
2. A candidate explains ``MIN_SUPPORT`` failures at precision ``MIN_PRECISION``, its
   hypergeometric chance among the informative trials is below ``ALPHA``, its failures come at
   ``MIN_SUPPORT`` settings of the other parameters, and a memory kind's on fewer than
   ``MIN_BOUNDARY_SUPPORT`` failures is a threshold the space declares monotone.
3. A one-condition rule passes a Westfall-Young test over every condition (``ALPHA_FAMILY`` of
   ``PERMUTATIONS`` seeded shuffles of the outcomes).
4. Each step takes the surest candidate over the trials no earlier rule covers, passing over one
   whose failures divide between causes (:meth:`~autotune.analysis.rule_cover.RuleCover.split`).
5. A pair is taken only clean, surer than any one condition, on ``MIN_PAIR_SUPPORT`` failures
   (:meth:`~autotune.analysis.rule_cover.RuleCover.pair`).
6. Rivals the data cannot tell from a rule (``confounded_with``) or as sure (``as_sure``) are named.
7. Each failure goes to the first rule covering it; the rest are unexplained.

A rule holds where the study tried: its ``scope`` says how far (:func:`rule_reach`, :func:`rule_scope`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from autotune.analysis.conditions import Condition, candidate_conditions, is_number, numbers
from autotune.analysis.failure_stages import base_kind, finished, is_crash, rule_kind, stage
from autotune.analysis.rule_cover import (EXCUSED_WEIGHT, MIN_SUPPORT, OTHER_WEIGHT, Chosen, OtherSettings, RuleCover)
from autotune.analysis.rule_report import FailureRule, OneConfiguration, RuleReport
from autotune.analysis.rule_stats import hypergeom_tail
from autotune.config.derived import DERIVED, derived_inputs, derived_values
from autotune.outcome.failures import MEMORY_KINDS, names_choice
from autotune.store.record import TrialRecord


def failure_rules(views: Sequence[TrialRecord], monotone: Mapping[str, Mapping[str, str]] | None = None,
                  bounds: Mapping[str, tuple[float, float]] | None = None) -> RuleReport:
    """The crash rules of the finished trials ``views`` (see the module docstring); ``monotone``:
    the search space's declarations (parameter -> {failure kind: "up" | "down"}), and ``bounds``:
    each numeric parameter's range in the space, for each rule's :attr:`~FailureRule.scope`."""
    bounds = bounds or {}
    monotone = {**{d.name: dict(d.monotone) for d in DERIVED.values()}, **(monotone or {})}
    rows = [replace(v, params={**v.params, **derived_values(v.params, v.env)}) for v in finished(views)]
    n = len(rows)
    crashed = np.array([is_crash(v) for v in rows], dtype=bool)
    kinds_of = np.array([rule_kind(v) if c else "" for v, c in zip(rows, crashed)], dtype=object)
    stage_of = np.array([stage(k) if k else -1 for k in kinds_of])
    kinds = sorted({k for k in kinds_of if k})
    conds, masks = candidate_conditions(rows)
    params_of = np.array([c.param for c in conds], dtype=object)
    settings = OtherSettings(rows)
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
            vals = numbers(rows, name)
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
                           *RuleCover(kinds_of == kind, weights(kind, explained), conds, masks, params_of, family_bounds,
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
                         settings: OtherSettings) -> list[OneConfiguration]:
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


__all__ = ["at_one_configuration", "failure_rules", "named_rules", "rule_reach", "rule_scope"]
