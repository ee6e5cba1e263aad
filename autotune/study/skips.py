"""Asking for the next trial, and skipping the proposals an earlier failure implies.

:func:`ask` asks the study for a trial and turns its parameters into a launch; a proposal that an
earlier infeasible trial implies fails (:func:`autotune.search.implied.implied_failure`, along the
space's ``monotone`` parameters) is handed to ``skip`` and the sampler asked again, up to
:data:`~autotune.search.implied.MAX_SKIPS_IN_A_ROW` times. :func:`record_skip` records such a
proposal without launching it and tells the sampler it is infeasible.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import optuna

from autotune.config.space import Launch, SearchSpace
from autotune.outcome.failures import Failure
from autotune.search.implied import MAX_SKIPS_IN_A_ROW, Implication, implied_failure
from autotune.store import record
from autotune.store.record import FAILURE_CONSTRAINT, Outcome
from autotune.study.notes import write_trial_note


def ask(study: optuna.Study, space: SearchSpace, *, skip_implied: bool,
        skip: Callable[[optuna.Trial, dict[str, Any], Implication], None]) -> tuple[optuna.Trial, dict[str, Any], Launch]:
    """The next trial to launch, its raw parameters and its launch.

    Args:
        study: The study to ask.
        space: Its search space.
        skip_implied: Whether implied failures are skipped at all. The baseline and
            confirmation runs never are.
        skip: Called with each skipped trial, its applied parameters and why.
    """
    monotone = space.monotone() if skip_implied else {}
    for _ in range(MAX_SKIPS_IN_A_ROW):
        trial = study.ask()
        params = space.suggest(trial)
        launch = space.to_launch(params)
        why = None
        if monotone and "confirms" not in trial.user_attrs and not trial.user_attrs.get("baseline"):
            why = implied_failure(launch.applied, failures(study), monotone)
        if why is None:
            return trial, params, launch
        skip(trial, launch.applied, why)
    trial = study.ask()
    params = space.suggest(trial)
    return trial, params, space.to_launch(params)


def failures(study: optuna.Study) -> list[tuple[int, str, dict[str, Any]]]:
    """(number, failure kind, applied parameters) of the study's launched infeasible trials."""
    return [(r.number, str(r.failure_kind), r.params) for r in record.read_all(study)
            if r.outcome is Outcome.INFEASIBLE and r.failure_kind]


def record_skip(study: optuna.Study, trial: optuna.Trial, applied: dict[str, Any], why: Implication, *,
                owner: str, constraints: Sequence[Any], fill: Callable[[], list[float]]) -> str:
    """Record ``trial`` as skipped (owned by ``owner``, its failure constraint 1 and each SLO
    ``constraints``' 0), tell it with ``fill()``'s values, write its note; returns why, in words."""
    message = why.message()
    trial.set_user_attr("owner", owner)
    record.write_skipped(trial, Failure(why.kind, message, ""), {"applied": applied, "implied_by": why.trial})
    record.set_constraints(trial, {FAILURE_CONSTRAINT: 1.0, **{f"slo:{c}": 0.0 for c in constraints}})
    record.tell(study, trial, Outcome.SKIPPED, fill=fill())
    try:
        write_trial_note(study, trial)
    except Exception:  # noqa: BLE001 - a note is a courtesy: it never stops a study
        pass
    return message
