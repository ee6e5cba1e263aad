"""What a trial's outcome tells the analysis: whether it finished, crashed, and how far it got.

:func:`finished` picks the trials the analysis reads; :func:`is_crash` the failures that say
something about a configuration; :func:`rule_kind` the kind a crash rule states for a failure
and :func:`stage` where in a trial that kind happens (:data:`STAGES`).
"""

from __future__ import annotations

from collections.abc import Sequence

from autotune.store.record import TrialRecord

MEASURED = ("ok", "stopped")
"""Outcomes of a configuration that ran: measured to the end, or until it could not win."""
NOT_A_CRASH = ("slo-violated",)
"""Failure kinds of a trial that ran: measured, not crashed."""
STAGES = {"invalid-argument": 0, "not-enough-memory": 1, "crash-under-load": 3, "request-errors": 3}
"""Where in a trial a failure kind happens: the arguments, sizing the KV pool (before any NCCL
collective), the rest of start-up (out of memory, NCCL errors, timeouts, unknown kinds:
:data:`START_UP`), under load."""
START_UP = 2
UNDER_LOAD = " under load"
"""The suffix of a rule's kind for an engine error that happened under load (``oom under load``)."""


def finished(views: Sequence[TrialRecord]) -> list[TrialRecord]:
    """The measured (``ok``, and ``stopped``: a load stopped early ran fine) and failed
    (``infeasible``) trials: what the analysis reads."""
    return [v for v in views if v.outcome in (*MEASURED, "infeasible")]


def is_crash(v: TrialRecord) -> bool:
    """Whether ``v`` failed (``infeasible``) with a kind that is a crash (:data:`NOT_A_CRASH`)."""
    return v.outcome == "infeasible" and (v.failure_kind or "") not in NOT_A_CRASH


def stage(kind: str) -> int:
    """Where in a trial a failure of ``kind`` happens (:data:`STAGES`; a kind seen under load,
    :func:`rule_kind`, is at the last stage)."""
    return STAGES["crash-under-load"] if kind.endswith(UNDER_LOAD) else STAGES.get(kind, START_UP)


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


__all__ = ["MEASURED", "NOT_A_CRASH", "STAGES", "START_UP", "UNDER_LOAD", "base_kind", "finished", "is_crash",
           "rule_kind", "stage"]
