"""The trial record (autotune.store.record): written once, read the same by every surface, and the only
door to Optuna's private storage API, whose names are pinned here so that an Optuna release that
drops one fails loudly. pyproject.toml pins ``optuna>=5.0,<5.2`` for them: widen the pin only
with this test passing on the new releases."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import optuna
from optuna.trial import TrialState, create_trial

from autotune.store import record
from autotune.outcome.failures import Failure, Phase
from autotune.store.record import FAILURE_CONSTRAINT, Outcome, counts_text, read, read_all
from autotune.util.units import unit_of, with_unit


def test_the_private_names_autotune_relies_on_exist() -> None:
    """Each private Optuna and optuna-dashboard name autotune.store.record (and autotune.study.notes, through
    it) uses: if one is gone, this fails before any study misbehaves."""
    import optuna_dashboard._note as dashboard_note
    import optuna_dashboard._serializer as serializer
    from optuna.study._constrained_optimization import _CONSTRAINTS_KEY, _get_constraints_from_system_attrs

    study = optuna.create_study(direction="maximize")
    trial = study.ask()
    for name in ("_storage", "_study_id", "_get_trials"):
        assert hasattr(study, name), name
    assert hasattr(trial, "_trial_id") and hasattr(study.trials[0], "_trial_id")
    for method in ("get_trial_system_attrs", "set_trial_system_attr", "get_study_system_attrs",
                   "set_study_system_attr", "set_trial_user_attr", "get_trial_id_from_study_id_trial_number",
                   "get_best_trial", "get_trial"):
        assert callable(getattr(study._storage, method)), method
        assert callable(getattr(optuna.storages.RDBStorage, method)), method  # the studies' storage
    # The list form of the constraints: what Optuna's samplers still read, and all the dashboard reads.
    assert _CONSTRAINTS_KEY == record.DASHBOARD_CONSTRAINTS == serializer.CONSTRAINTS_KEY
    assert _get_constraints_from_system_attrs({"constraints": [1.0, -2.0]}) == {"0": 1.0, "1": -2.0}
    assert callable(dashboard_note.get_note_from_system_attrs)
    # record.trials_without overrides what Optuna's samplers call to read a study's trials.
    assert {"deepcopy", "states", "use_cache"} <= set(inspect.signature(optuna.Study._get_trials).parameters)


def test_the_optuna_pin_is_the_one_these_names_were_checked_against() -> None:
    """A change of pyproject's Optuna pin comes here first: the private names above are checked
    for ``optuna>=5.0,<5.2`` and the installed Optuna is within it."""
    text = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert '"optuna>=5.0,<5.2"' in text
    major, minor = (int(x) for x in re.findall(r"\d+", optuna.__version__)[:2])
    assert (5, 0) <= (major, minor) < (5, 2), optuna.__version__


def _told(study: optuna.Study, outcome: Outcome, failure: Failure | None, value: float | None = None) -> None:
    trial = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
    record.write_result(trial, outcome, failure, {"metrics": {"output_throughput": value or 0.0}, "applied": trial.params})
    if outcome is Outcome.FAULT:
        record.tell(study, trial, outcome)
        return
    record.set_constraints(trial, {FAILURE_CONSTRAINT: 1.0 if outcome is Outcome.INFEASIBLE else -1.0})
    fill = record.placeholder(study, [("output_throughput", "maximize")])
    record.tell(study, trial, outcome, values=None if value is None else [value], fill=fill)


def test_a_written_trial_reads_back_with_its_outcome_kind_blame_and_phase() -> None:
    study = optuna.create_study(direction="maximize")
    _told(study, Outcome.OK, None, 500.0)
    _told(study, Outcome.INFEASIBLE, Failure("oom", "CUDA out of memory", "log", phase=Phase.LOAD))
    _told(study, Outcome.FAULT, Failure("gpu-busy", "GPU 0 holds 136.5 GiB", "", cause="oom", phase=Phase.LAUNCH))
    ok, oom, busy = read_all(study)
    assert (ok.outcome, ok.value, ok.failure, ok.blame) == (Outcome.OK, 500.0, None, None)
    assert (oom.outcome, oom.failure_kind, oom.blame, oom.failure.phase) == ("infeasible", "oom", "configuration", "load")
    assert oom.value is None and oom.constraints == {"failure": 1.0} and oom.state == "COMPLETE"
    assert (busy.outcome, busy.failure_kind, busy.blame, busy.failure.cause) == ("fault", "gpu-busy", "environment", "oom")
    assert busy.state == "FAIL" and not busy.finished
    assert oom.to_json()["failure"] == {"kind": "oom", "message": "CUDA out of memory", "excerpt": "log",
                                        "blame": "configuration", "phase": "load"}
    # Optuna's samplers and the dashboard read the one list; the dashboard's best is never the crash.
    frozen = study.trials[1]
    assert frozen.system_attrs["constraints"] == [1.0] and frozen.constraints == {"0": 1.0}
    assert frozen.value < 500.0 and study._storage.get_best_trial(study._study_id).number == 0
    assert [t.number for t in record.finished(study)] == [0, 1]
    assert counts_text(read_all(study)) == "3 trials: 1 ok, 1 infeasible (oom 1), 1 fault (gpu-busy 1)"


def test_a_crash_told_before_any_measurement_is_below_every_later_one() -> None:
    study = optuna.create_study(direction="maximize")
    _told(study, Outcome.INFEASIBLE, Failure("nccl-error", "NCCL error", ""))
    _told(study, Outcome.OK, None, 0.0)  # even a measured zero stands above it
    assert study.trials[0].value < study.trials[1].value
    assert study._storage.get_best_trial(study._study_id).number == 1


def test_a_trial_of_an_earlier_version_reads_the_same() -> None:
    """Recorded before: an infeasible trial PRUNED, named constraints, no blame or phase stored."""
    t = create_trial(state=TrialState.PRUNED, params={"x": 0.5},
                     distributions={"x": optuna.distributions.FloatDistribution(0, 1)},
                     user_attrs={"outcome": "infeasible", "feasible": False, "failure_kind": "crash-under-load",
                                 "failure_message": "died", "failure_cause": "oom"},
                     system_attrs={"constraints:failure": 1.0})
    r = read(t)
    assert (r.outcome, r.failure_kind, r.blame, r.failure.phase, r.constraints) == (
        "infeasible", "crash-under-load", "configuration", None, {"failure": 1.0})
    assert not record.is_measured(t) and record.failed_kind(t) == "crash-under-load"


def test_units_of_the_metrics_a_person_reads() -> None:
    assert [unit_of(m) for m in ("output_throughput", "request_throughput", "p99_ttft_ms", "duration_s",
                                 "latency_us@all_reduce@43008", "busbw_gbps@all_gather@8", "nccl_mem_mib",
                                 "decode/output_throughput", "completed", None)] == [
        "tok/s", "req/s", "ms", "s", "µs", "GB/s", "MiB", "tok/s", "", ""]
    assert with_unit(631.9, "output_throughput") == "631.9 tok/s" and with_unit(None, "x") == "-"
