"""What a running study tells the person: why a trial runs, and notes on what it saw.

Each function returns one line of text (or None); none prints. The driver hands them to its
reporter (:class:`autotune.study.reporting.Reporter`) or puts them in an error.
"""

from __future__ import annotations

import optuna

from autotune.outcome.failures import Failure
from autotune.store import record
from autotune.store.record import PROPOSED_ATTR
from autotune.store.study_view import proposal_text


def why_text(study: optuna.Study, trial: optuna.Trial) -> str | None:
    """Why ``trial`` runs, in words: it measures another's configuration again, runs a trial
    again after a fault, or what the sampler proposed it for (None: nothing recorded)."""
    ua = trial.user_attrs
    if "confirms" in ua:
        return (f"measures trial {ua['confirms']}'s configuration again: a candidate for the best, whose figure "
                "is the mean of its runs after the first")
    if ua.get("retry_of") is not None:
        return f"runs trial {ua['retry_of']} again: it did not finish through no fault of its configuration"
    return proposal_text(record.system_attrs(study, trial).get(PROPOSED_ATTR))


def niceness_note(number: int, niceness: int, host: str) -> str:
    """Trial ``number``'s server runs above CPU niceness 0 on ``host``: what it costs, what to do."""
    return (f"trial {number}: the server runs at CPU niceness {niceness} on {host}: where anything "
            "else is busy it gets less CPU than it will serve with, and measures that. A server inherits "
            "the niceness of what starts it: run autotune, an SSH host's login shell and Ray's nodes "
            "(RAY_worker_niceness=0) at niceness 0 (docs/distributed.md)")


def fatal_text(number: int, failure: Failure) -> str:
    """Trial ``number`` failed in a way no configuration avoids (the engine or the model missing)."""
    return (f"trial {number}: {failure.kind}: {failure.message} "
            f"(the {failure.blame}'s fault, not the configuration's; fix it and resume)")


def interrupted_text(reason: str, name: str) -> str:
    """The study ``name`` stops on a signal or `study stop` (``reason``)."""
    return f"interrupted: {reason}; `autotune study resume {name}` continues"


def quarantine_text(slot: str, why: str, *, only_slot: bool) -> str:
    """The study stops: ``slot`` was quarantined (``why``) and no healthy slot is left."""
    if only_slot:
        return f"stopped: {why}"
    return f"stopped: no healthy slot left (last quarantined: {slot}: {why})"
