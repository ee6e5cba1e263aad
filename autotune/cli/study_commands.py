"""``autotune study start|resume|ablate``: the commands that run a study's trials.

Contracts:

- Each builds the study through :mod:`autotune.study.build` (the one place that does) and runs
  its driver in this process; ``start --detach`` runs this very command, less ``--detach``, as a
  daemon (:mod:`autotune.study.service`) once the config and the storage passed their checks.
- ``resume`` and ``ablate`` run a stored study with the config it was started with (``--trials``
  of ``start`` included), its secrets taken from the environment (a secret not set:
  :class:`~autotune.errors.UsageError`); ``resume --trials`` overrides the budget for that run.
- Exit codes: 0 done; 1 a broken host or a storage error (what was recorded stays; ``resume``
  continues); a stop request's own code; 2 bad input (one line).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Optional

import optuna
import sqlalchemy.exc
import typer

from autotune.cli.common import NameArg, StorageOpt, fail, print_json, user_umask
from autotune.cli.common import err as _err
from autotune.cli.common import out as _out
from autotune.config.study import StudyConfig
from autotune.errors import UsageError
from autotune.store.storage import check_storage
from autotune.util.text import counted


def study_start(
    ctx: typer.Context,
    config: Optional[Path] = typer.Argument(None, metavar="CONFIG", help="Study config YAML."),
    demo: bool = typer.Option(False, "--demo", help="Run the built-in demo study on the simulated host."),
    name: Optional[str] = typer.Option(None, "--name", metavar="NAME", help="Override the study name."),
    storage: Optional[str] = typer.Option(None, "--storage", metavar="URL", help="Override the storage URL."),
    trials: Optional[int] = typer.Option(None, "--trials", min=1, metavar="N", help="Override the trial budget."),
    executor: Optional[str] = typer.Option(None, "--executor", metavar="serial|ray", help="serial (one trial at a time) or ray (one per slot)."),
    address: Optional[str] = typer.Option(None, "--address", metavar="auto|HOST:PORT", help="The Ray cluster (auto, HOST:PORT); default: start a local one."),
    seed: Optional[int] = typer.Option(None, "--seed", metavar="N", help="Sampler seed."),
    baseline_from: Optional[str] = typer.Option(None, "--baseline-from", metavar="STUDY[@STORAGE]",
                                                help="Use the best trial of another study as the baseline."),
    warm_start_from: Optional[list[str]] = typer.Option(
        None, "--warm-start-from", metavar="STUDY[@STORAGE]",
        help="Start from what another study found on this host (repeatable): its failures as facts, its best "
             "configuration measured after the baseline."),
    force: bool = typer.Option(False, "--force", help="With --warm-start-from: carry a study of another host or "
                               "engine over anyway (the difference is stated)."),
    detach: bool = typer.Option(False, "--detach", help="Run it in the background (a local daemon) and return."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Check the config and the hosts, print the baseline's "
                                 "command line and env, and stop: nothing launched or recorded."),
) -> None:
    """Start a study (or continue the one of the same name).

    \b
    Examples:
      autotune study start --demo                   # the simulated host, no GPU
      autotune init --engine vllm --model meta-llama/Llama-3.1-8B-Instruct
      autotune study start Llama-3.1-8B-Instruct.yaml --dry-run   # the first launch, not run
      autotune study start Llama-3.1-8B-Instruct.yaml --trials 10
      autotune study start study.yaml --detach      # in the background: study status / stop
      autotune study start kimi.yaml --warm-start-from glm5   # glm5 ran on this host before
    """
    from autotune.config.demo import DEMO_CONFIG

    if demo == (config is not None):
        raise UsageError("give a CONFIG file or --demo (not both)")
    cfg = StudyConfig.from_mapping(DEMO_CONFIG, "demo") if demo else StudyConfig.load(config)  # type: ignore[arg-type]
    overrides: dict[str, Any] = {}
    if name is not None:  # `--name ""` is an error, not "no override"
        overrides["name"] = name
    if storage is not None:
        overrides["storage"] = storage
    if seed is not None:
        overrides["seed"] = seed
    if trials is not None:  # stored with the config: a resume keeps it (unless given its own --trials)
        overrides["budget"] = {**cfg.budget.model_dump(), "trials": trials}
    if baseline_from is not None:
        overrides["baseline_from"] = _study_ref("--baseline-from", baseline_from)
    if force and not warm_start_from:
        raise UsageError("--force is for --warm-start-from")
    if warm_start_from:
        overrides["warm_start"] = [{**_study_ref("--warm-start-from", ref), "force": force} for ref in warm_start_from]
    if executor is not None:
        overrides["executor"] = executor
    if address is not None:
        overrides["ray"] = {**cfg.ray.model_dump(), "address": address}
    if overrides:
        cfg = StudyConfig.from_mapping({**cfg.model_dump(), **overrides}, "command line")
    if address is not None and cfg.executor != "ray":
        raise UsageError("--address is for the Ray executor: add --executor ray")
    check_storage(cfg.storage)  # before anything is created
    if dry_run:
        _dry_run(cfg, trials)
        return
    if detach:  # this very command, less --detach, as a daemon (autotune.study.service)
        _start_detached(cfg, _options(ctx))
        return
    _run_study(cfg, trials)


def _study_ref(option: str, text: str) -> dict[str, str | None]:
    """``STUDY`` or ``STUDY@STORAGE`` as a config's study reference; it splits at the '@' that
    starts a URL, since a study name may hold '@' itself."""
    m = re.fullmatch(r"([^@].*?)(?:@([A-Za-z][\w+.-]*://.*))?", text)
    if m is None:
        raise UsageError(f"{option} '{text}': expected STUDY or STUDY@STORAGE")
    return {"study": m.group(1), "storage": m.group(2)}


def _dry_run(cfg: StudyConfig, trials: int | None) -> None:
    """``study start --dry-run``: the preflight, then the baseline's launch and the study's plan."""
    import shlex

    from autotune.execution.host_factory import make_hosts
    from autotune.study import build, dry_run

    plan = build.plan(cfg, baseline_from=_baseline_from)
    hosts = make_hosts(plan.config.target, child_umask=user_umask())
    try:
        _preflight(plan, hosts)
        launch = dry_run.baseline_launch(plan, hosts)
    finally:
        for host in hosts.values():
            host.close()
    if launch is None:
        _out.print(f"study {cfg.name}: engine {cfg.target.engine} runs no server; each trial runs the objective's "
                   "benchmark command", markup=False, soft_wrap=True)
    else:
        _out.print(f"study {cfg.name}: the baseline (the first trial) on {launch.slot}:", markup=False, soft_wrap=True)
        for key, value in launch.env.items():
            _out.print(f"  {key}={shlex.quote(value)}", markup=False, soft_wrap=True)
        _out.print("  " + shlex.join(launch.argv), markup=False, soft_wrap=True)
        if "{port}" in launch.argv:
            _out.print("  ({port}: a free port, picked at launch)", markup=False)
    for line in dry_run.describe(plan, trials):
        _out.print(line, markup=False, soft_wrap=True)
    _out.print("dry run: nothing launched, nothing recorded", markup=False)


def _preflight(plan: Any, hosts: dict[str, Any]) -> None:
    """The preflight (:func:`autotune.engines.preflight.preflight`: one line and exit 2 for an
    environment no trial can run in), what it found, and a note on GPUs others hold."""
    from autotune.engines.preflight import preflight
    from autotune.execution.gpu_check import busy_note
    from autotune.execution.provenance import runner_for

    target = plan.config.target
    for line in preflight(plan.config, hosts, plan.objective):
        _err.print(line, markup=False, soft_wrap=True)
    for name, host in hosts.items():
        note = busy_note(runner_for(host), target.env, name, target.gpu_busy_wait_s)
        if note is not None:
            _err.print(note, style="yellow", markup=False, soft_wrap=True)


def study_resume(name: str = NameArg, storage: str = StorageOpt,
                 trials: Optional[int] = typer.Option(None, "--trials", min=1, metavar="N", help="Override the trial budget.")) -> None:
    """Continue a stored study with the config it was started with."""
    from autotune.store.study_view import load_study

    study = load_study(name, storage)
    try:
        cfg = _stored_config(study, storage)
    except UsageError:  # e.g. a secret not set: refused, but no server of a dead driver is left running
        _tear_down_left(study, storage)
        raise
    _run_study(cfg, trials)


def _tear_down_left(study: Any, storage: str) -> None:
    """Kill the servers dead drivers left of ``study`` (nothing written; nothing done while a live
    driver owns it), with the stored target's hosts; best effort: a refusal stays one line."""
    from autotune.config.study import TargetConfig
    from autotune.study.leftovers import Leftovers
    from autotune.study.service import live_owner

    data = (study.user_attrs.get("config") or {}).get("target") or {}
    try:
        if live_owner(storage, study.study_name) is not None:
            return
        try:
            target = TargetConfig.model_validate(data)
        except ValueError:  # a config this version rejects: its hosts with the default SSH options
            target = TargetConfig.model_construct(hosts=list(data.get("hosts") or ["local"]))
        leftovers = Leftovers(target, {})
        leftovers.tear_down(study)
        for host in leftovers.hosts.values():
            host.close()
    except Exception:  # noqa: BLE001 - the refusal is what the user sees; a resume with it set cleans up
        pass


def _options(ctx: typer.Context) -> list[str]:
    """The command's own arguments, less ``--detach``: each of its parameters with a value (not
    None, not an unset flag), read from the command itself so that none can be left out; paths
    absolute. What ``study start --detach`` hands its daemon."""
    argv: list[str] = []
    for param in ctx.command.params:
        value = ctx.params.get(param.name or "")
        if param.name == "detach" or value is None:
            continue
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(v, Path):
                v = v.absolute()
            if param.param_type_name == "argument":
                argv.append(str(v))
            elif getattr(param, "is_flag", False) and isinstance(v, bool):
                argv.extend(param.opts[:1] if v else param.secondary_opts[:1])
            else:
                argv.append(f"{param.opts[0]}={v}")
    return argv


def _start_detached(cfg: StudyConfig, argv: list[str]) -> None:
    """``study start --detach``, once the config and the storage passed their checks: run
    ``study start ARGV`` as a daemon and print its pid, log and the commands that follow it."""
    import shlex

    from autotune.study import service
    from autotune.config.study import DEFAULT_STORAGE

    try:
        info = service.detach(argv, cfg.name, cfg.storage, umask=user_umask())
    except service.DaemonExitedError as exc:
        fail(str(exc), exc.code)
    where = "" if cfg.storage == DEFAULT_STORAGE else f" --storage {shlex.quote(cfg.storage)}"
    if info.exit_code is not None:
        _out.print(f"study {cfg.name} ended at once (exit code {info.exit_code}): nothing left to run?", markup=False)
    elif info.running:
        _out.print(f"study {cfg.name} runs in the background: pid {info.pid}", markup=False)
    else:
        _out.print(f"study {cfg.name}: pid {info.pid} has not taken the study's lease after "
                   f"{service.START_WAIT_S:.0f}s (still starting)", markup=False)
    _out.print(f"log: {info.log}", markup=False, soft_wrap=True)
    _out.print(f"pid file: {info.pid_file}", markup=False, soft_wrap=True)
    _out.print(f"status: autotune study status {shlex.quote(cfg.name)}{where}", markup=False, soft_wrap=True)
    _out.print(f"stop: autotune study stop {shlex.quote(cfg.name)}{where}", markup=False, soft_wrap=True)


def _stored_config(study: Any, storage: str) -> StudyConfig:
    """The config ``study`` was started with (secrets from the environment), on ``storage``.

    Raises:
        UsageError: autotune did not start the study, or a secret it refers to is not set.
    """
    name = study.study_name
    data = study.user_attrs.get("config")
    if not data:
        raise UsageError(f"study '{name}' was not started by autotune (no stored config)")
    return StudyConfig.from_mapping(_with_secrets(data, name) | {"storage": storage}, f"stored study {name}")


def _with_secrets(data: dict[str, Any], name: str) -> dict[str, Any]:
    """A stored config with its ``${NAME}`` secret references filled in from the environment.

    Raises:
        UsageError: a referenced secret is not set in the environment (named in the message).
    """
    from autotune.config.secrets import expand_command, expand_env

    target = dict(data.get("target") or {})
    extra = target.get("secrets") or []
    where = f"stored study {name}"
    if isinstance(target.get("env"), dict):
        target["env"] = expand_env(target["env"], extra, where=where)
    if isinstance(target.get("command"), str):
        target["command"] = expand_command(target["command"], extra, where=where)
    return {**data, "target": target}


def _run_study(cfg: StudyConfig, trials: int | None, *, show_best: bool = True) -> None:
    from autotune.study import build
    from autotune.study.driver import HostBrokenError
    from autotune.execution.host_factory import make_hosts
    from autotune.study.progress import ConsoleReporter
    from autotune.execution.stopping import StopRequest

    plan = build.plan(cfg, baseline_from=_baseline_from)
    cfg, objective = plan.config, plan.objective
    stop = StopRequest()
    hosts = make_hosts(cfg.target, child_umask=user_umask())
    _preflight(plan, hosts)  # an environment no trial can run in: one line, exit 2, before any trial
    executor = build.executor(plan, hosts, stop=stop, child_umask=user_umask())
    reporter = ConsoleReporter(_err, metric=objective.metric,
                               objectives=[g.metric for g in objective.goals] if objective.multi else (),
                               baseline=plan.space.to_launch(plan.space.complete(cfg.baseline)).applied)
    driver = build.driver(plan, executor, reporter=reporter, trials=trials, stop=stop, hosts=hosts)
    try:
        run = driver.run()
    except HostBrokenError as exc:
        _err.print(str(exc), style="red", markup=False, soft_wrap=True)  # one line, however long
        raise typer.Exit(1) from None
    except (sqlalchemy.exc.SQLAlchemyError, optuna.exceptions.StorageInternalError) as exc:
        # Locked for longer than the storage waits, its disk full, the file read-only or deleted:
        # the running trials were torn down, and what was recorded stays (RUNNING trials included,
        # which a resume recovers).
        cause = exc.__cause__ if isinstance(exc, optuna.exceptions.StorageInternalError) and exc.__cause__ else exc
        orig = getattr(cause, "orig", None) or cause
        fail(f"storage error, study stopped (its running trials torn down): "
             f"{str(orig).splitlines()[0] if str(orig) else type(orig).__name__}; "
             f"`autotune study resume {cfg.name}` continues once the storage can be written", 1)
    finally:
        build.close(driver)
    if stop.requested:
        raise typer.Exit(stop.exit_code)
    if show_best:
        from autotune.cli.show_commands import _print_best

        _print_best(run.study, objective.metric, brief=True)


def _baseline_from(cfg: StudyConfig, space: Any) -> dict[str, Any]:
    """The best trial of ``cfg.baseline_from`` restricted to this space, under ``cfg.baseline``."""
    from autotune.store.study_view import best_view, load_study

    assert cfg.baseline_from is not None
    source = load_study(cfg.baseline_from.study, cfg.baseline_from.storage or cfg.storage)
    best = best_view(source)
    if best is None:
        raise UsageError(f"baseline_from: study '{source.study_name}' has no feasible trial")
    shared = {k: v for k, v in best.params.items() if k in space.parameters}
    if not shared:
        raise UsageError(f"baseline_from: study '{source.study_name}' shares no parameter with space {space.name}")
    _err.print(f"baseline from study {source.study_name} trial {best.number}: "
               + " ".join(f"{k}={v}" for k, v in shared.items()), markup=False)
    return {**shared, **cfg.baseline}


def study_ablate(name: str = NameArg, storage: str = StorageOpt,
                 repeats: int = typer.Option(2, "--repeats", min=1, max=20, help="Measurements of each run."),
                 as_json: bool = typer.Option(False, "--json")) -> None:
    """Which of the best trial's changes earned its gain: the best with each changed parameter
    reverted to the baseline, one at a time, and the baseline and the best again, each measured
    --repeats times as trials of the same study."""
    from optuna.trial import TrialState

    from autotune.analysis import ablation
    from autotune.study.driver import finished_trials
    from autotune.study.service import live_owner
    from autotune.store.study_view import load_study

    study = load_study(name, storage)
    cfg = _stored_config(study, storage)
    # The ablation's trials are its own: nothing is enqueued while another driver runs the study,
    # and the study's hour budget does not stop them.
    cfg = cfg.model_copy(update={"budget": cfg.budget.model_copy(update={"hours": None})})
    owner = live_owner(storage, name)
    if owner is not None:
        raise UsageError(f"study '{name}' is being run by another driver: {owner.describe()}; "
                         f"`autotune study stop {name}` first")
    run_id, runs, best, base = ablation.plan(study, repeats)
    waiting = len(study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))
    ablation.enqueue(study, run_id, runs)
    reverted = sorted({r.label.removeprefix("revert:") for r in runs if r.label.startswith("revert:")})
    _err.print(f"ablating trial {best.number} against the baseline (trial {base.number}): "
               f"{counted(len(reverted), 'changed parameter')}, {counted(len(runs), 'trial')} ({repeats} of each run)",
               markup=False, soft_wrap=True)
    _run_study(cfg, len(finished_trials(study)) + waiting + len(runs), show_best=False)
    study = load_study(name, storage)
    doc = ablation.analyse(study, run_id, best, base)
    study.set_user_attr(ablation.ABLATION_ATTR, doc)
    if as_json:
        print_json(doc)
        return
    _out.print(f"gain of trial {doc['best_trial']} over the baseline: {doc['best_mean']:.4g} (n={doc['best_n']}) vs "
               f"{doc['baseline_mean']:.4g} (n={doc['baseline_n']}) = {doc['gain']:+.4g}", markup=False, soft_wrap=True)
    for row in doc["parameters"]:
        if row.get("share") is None:
            _out.print(f"  {row['parameter']}: reverting it failed every time ({', '.join(row['failed'])})", markup=False)
            continue
        failed = f"; failed {len(row['failed'])}x ({', '.join(sorted(set(row['failed'])))})" if row["failed"] else ""
        interval = ("" if row["share_low"] is None else
                    f" [{100 * row['share_low']:.0f}%, {100 * row['share_high']:.0f}%]")
        _out.print(f"  {row['parameter']} ({row['baseline']} -> {row['best']}): {100 * row['share']:.0f}% of the gain"
                   f"{interval}{failed}", markup=False, soft_wrap=True)
    _out.print(f"(shares: (best - best with it reverted) / gain; {int(100 * doc['interval'])}% Student-t intervals "
               "from the repeats (none with --repeats 1); they need not add up to 100% when parameters interact)",
               markup=False, soft_wrap=True)
