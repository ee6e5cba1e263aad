"""``autotune export``: the launch profile of a stored study's best trial, with its provenance.

Contracts:

- :func:`chosen_trial`: the trial to export: as ``study best`` chooses it (the best configuration
  by its figure, not the luckiest run); of a multi-objective study, the Pareto front's trial the
  rule picks; or a measured trial given by number. The profile says how it was chosen.
- :func:`from_study`: that trial's profile (:func:`autotune.profiles.formats.profile`) with its
  memory parameters backed off (:mod:`autotune.profiles.memory`), its measurement pooled over
  trials with identical parameters, and its provenance: engine and version, GPU, driver, NCCL
  (the trial's own server info and log first, then the other trials of its host), dates in UTC.
- What :func:`autotune.profiles.verify.verify` needs to measure it again goes in ``verify``: the
  target's fields and the objective as data (read again by name when it cannot be read here).
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import Any

from autotune.config.pareto import ChoiceRule, dominates
from autotune.errors import UsageError
from autotune.profiles.command import DEFAULT_PYTHON
from autotune.profiles.formats import now_utc, profile
from autotune.profiles.measurement import pooled, show_value
from autotune.profiles.memory import DEFAULT_MEMORY_MARGIN, memory_backoff
from autotune.store.record import TrialRecord
from autotune.store.study_view import best_of


def _utc(when: Any) -> str | None:
    if not isinstance(when, datetime.datetime):
        return None
    return when.astimezone(datetime.timezone.utc).isoformat(timespec="seconds")


def _objective_data(config: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The study's objective as data (load, metric, benchmark, constraints), for verify."""
    from autotune.config.objective import Objective

    name = config.get("objective") or "throughput"
    overrides = config.get("objective_overrides") or {}
    try:
        o = Objective.load_file(str(name), overrides)
    except UsageError as exc:
        return ({"name": str(name), "overrides": overrides},
                [f"the study's objective could not be read here ({exc}); verify reads it again by name"])
    return o.to_json(), []


def _study_space(study: Any, config: Mapping[str, Any]) -> tuple[Any, list[str]]:
    """The study's search space, or None with the reason (missing, changed since)."""
    import optuna

    from autotune.config.space import SearchSpace

    name = config.get("space")
    if not name:
        return None, ["the study records no search space"]
    try:
        space = SearchSpace.load(str(name))
    except UsageError as exc:
        return None, [f"search space {name} could not be read ({exc})"]
    stored = study.user_attrs.get("space_distributions")
    if isinstance(stored, dict):
        now = {n: optuna.distributions.distribution_to_json(d) for n, d in space.distributions().items()}
        if now != stored:
            return None, [f"search space {name} has changed since the study ran"]
    return space, []


def _read_log(storage: str, study_name: str, trial: Any) -> str:
    """The trial's server log (its artifact, else the study's log folder), at most 8 MiB."""
    from autotune.store.storage import artifact_dir

    root = artifact_dir(storage)
    candidates = []
    if trial.user_attrs.get("log_artifact"):
        candidates.append(root / str(trial.user_attrs["log_artifact"]))
    candidates.append(root / "logs" / study_name / f"trial-{trial.number:04d}.log")
    for path in candidates:
        try:
            with open(path, "rb") as f:
                return f.read(8 * 1024 * 1024).decode("utf-8", errors="replace")
        except (OSError, ValueError):
            continue
    return ""


def chosen_trial(study: Any, views: Sequence[TrialRecord], *, rule: ChoiceRule | None = None,
                 number: int | None = None) -> tuple[TrialRecord, dict[str, Any] | None]:
    """The trial to export and, when it was not simply the best of a single-objective study, how
    it was chosen: ``{"rule", ..., "text", "trial", "front"}`` (:meth:`autotune.config.pareto.Choice.to_json`;
    ``rule`` is ``trial`` for one given by number).

    A multi-objective study: the trial ``rule`` (default: the study's) picks from the Pareto front.
    ``number``: that trial, which must have been measured.

    Raises:
        UsageError: no feasible trial; trial ``number`` was not measured; ``rule`` given for a
            single-objective study.
    """
    from autotune.store.study_view import is_multi_objective, objectives, pick

    name = study.study_name
    feasible = [v for v in views if v.value is not None]
    if not feasible:
        raise UsageError(f"study '{name}' has no feasible trial to export")
    multi = is_multi_objective(study)
    if rule is not None and not multi:
        raise UsageError(f"--choose picks from a multi-objective study's Pareto front; study '{name}' has one "
                         "objective (--trial N exports another trial)")
    if not multi:  # as `study best` chooses: the best configuration by its figure, not the luckiest run
        best = best_of(feasible, study.direction.name == "MAXIMIZE")
        assert best is not None
    chosen = pick(study, list(views), rule) if multi else None
    if number is None:
        if chosen is None:
            return best, None
        return next(v for v in feasible if v.number == chosen.number), chosen.to_json()
    given = next((v for v in feasible if v.number == number), None)
    if given is None:
        shown = ", ".join(str(v.number) for v in sorted(feasible, key=lambda v: v.number)[:20])
        raise UsageError(f"--trial {number}: study '{name}' has no measured trial {number} (measured: {shown}"
                         f"{', ...' if len(feasible) > 20 else ''})")
    if chosen is None:
        why = "the best" if given.params == best.params else f"the best is trial {best.number}"
        return given, {"rule": "trial", "text": f"trial {number}, given with --trial ({why})", "trial": number,
                       "front": []}
    goals = objectives(study)
    beaten = [v.number for v in feasible if v.values is not None and given.values is not None
              and dominates(v.values, given.values, goals)]
    where = ("on the Pareto front" if not beaten else
             f"not on the Pareto front: trial {beaten[0]} is at least as good on every objective")
    return given, {"rule": "trial", "text": f"trial {number}, given with --trial ({where}; the rule would pick "
                                            f"trial {chosen.number})", "trial": number, "front": list(chosen.front)}


def from_study(study: Any, storage: str, *, port: int | None = None, python: str | None = None,
               memory_margin: float = DEFAULT_MEMORY_MARGIN, rule: ChoiceRule | None = None,
               number: int | None = None) -> tuple[dict[str, Any], TrialRecord]:
    """The launch profile of a stored study's best feasible trial, and the trial as exported
    (memory parameters backed off). A multi-objective study exports the Pareto front's trial that
    ``rule`` (default: the rule its objective states) picks; ``number`` exports that trial instead
    (:func:`chosen_trial`). The profile then says how it was chosen (``choice``, and a header line).

    Raises:
        UsageError: the study has no feasible trial; as :func:`chosen_trial`.
    """
    from autotune.engines.registry import PRESETS
    from autotune.execution.provenance import engine_version, provenance, select_host_facts
    from autotune.store.study_view import objectives
    from autotune.store.record import objective_metric, read

    name = study.study_name
    frozen = {t.number: t for t in study.get_trials(deepcopy=False)}
    views = [read(t) for t in frozen.values()]
    best, choice = chosen_trial(study, views, rule=rule, number=number)
    config = study.user_attrs.get("config") or {}
    target = config.get("target") or {}
    engine = str(target.get("engine", "sim"))
    preset = PRESETS.get(engine)
    chosen_port = port if port is not None else (preset.default_port if preset is not None else 30000)
    metric = objective_metric(study)
    dates = {n: d for n, t in frozen.items() if (d := _utc(t.datetime_complete))}

    space, why = _study_space(study, config)
    exported, memory = memory_backoff(best, views, space, memory_margin, *why)
    if exported is best:
        measured = pooled(views, best.params, dates)
    else:
        changes = ", ".join(f"{m['parameter']} {show_value(m['measured'])} -> {show_value(m['exported'])}"
                            for m in memory if m["exported"] != m["measured"])
        measured = pooled(views, exported.params, dates, note=f"measured at the backed-off values ({changes})")
        if measured is None:
            measured = pooled(views, best.params, dates, note=f"measured before the memory back-off ({changes}); "
                                                              "the exported values were not measured")

    # provenance: the best trial's own sources first, then the other trials of its host
    trial = frozen[best.number]
    host = trial.user_attrs.get("host")
    same_host = [trial] + [t for t in frozen.values() if t.user_attrs.get("host") == host and t is not trial]
    infos = [t.user_attrs.get("server_info") for t in same_host]
    info = next((i for i in infos if engine_version(i)), infos[0])
    excerpts = [text for t in same_host for k in ("failure_message", "failure_excerpt")
                if (text := str(t.user_attrs.get(k) or ""))]
    exported_at = now_utc()
    prov = provenance(engine=engine, server_info=info, log_text=_read_log(storage, name, trial),
                      facts=select_host_facts(study.user_attrs.get("host_facts"), host), extra_logs=excerpts)
    prov.update(study=name, trial=best.number, host=host, measured_at=dates.get(best.number), exported_at=exported_at)

    ssh = target.get("ssh") or {}
    remote = isinstance(host, str) and host.startswith("ssh://")
    chosen_python = python or (str(ssh.get("python")) if remote and ssh.get("python") else DEFAULT_PYTHON)
    interpreters = [str(ssh["python"])] if remote and ssh.get("python") else []
    objective, warnings = _objective_data(config)
    # what verify needs to run it as the study's runner did (autotune.execution.executors.make_runner):
    # the target's fields (runner_fields) and the config's extra secret names
    verify_data = {"engine": engine, "model": target.get("model"), "scenario": target.get("scenario"),
                   "secrets": [str(s) for s in target.get("secrets") or []], "objective": objective,
                   "ready_path": target.get("ready_path"), "api": target.get("api"),
                   "ready_timeout_s": target.get("ready_timeout_s")}
    launch_template = target.get("command") or (preset.template if preset is not None else None)
    goals = objectives(study)
    prof = profile(name, metric, goals[0].direction, exported, chosen_port, python=chosen_python,
                   launch_template=launch_template, interpreters=interpreters, measured=measured, provenance=prov,
                   memory=memory, verify=verify_data, warnings=warnings, exported_at=exported_at,
                   tuned_names=space.applied_names() if space is not None else (),
                   baseline=next((v for v in views if v.baseline), None))
    if exported is not best:
        prof["measured_params"] = best.params
    if len(goals) > 1:
        prof["objectives"] = [{**g.to_json(), "value": v} for g, v in zip(goals, best.values or [])]
    if choice is not None:
        prof["choice"] = choice
    simpler = getattr(best.measured, "simpler", None) if best.measured is not None else None
    if simpler is not None:  # a better figure within the noise, passed over for fewer changes
        prof["simpler"] = simpler.to_json()
    return prof, exported
