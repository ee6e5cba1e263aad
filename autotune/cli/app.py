"""The ``autotune`` command line: parse, call, print. Bad input exits 2 with one line."""

from __future__ import annotations

import datetime
import json
import re
import sys
import textwrap
from pathlib import Path
from typing import Any, NoReturn, Optional

import click
import sqlalchemy.exc
import typer
import typer._click.exceptions as _click_exc
from rich.console import Console
from rich.text import Text

from autotune.util.text import counted
from autotune.config.study import DEFAULT_STORAGE, StudyConfig
from autotune.errors import ConfigError, UsageError
from autotune.profiles.export import DEFAULT_MEMORY_MARGIN
from autotune.store.record import Outcome, counts, objective_metric
from autotune.util.units import unit_of, with_unit
from autotune.store.storage import check_storage, has_studies, open_storage

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Find the best launch configuration of an LLM inference server, by experiment.")
study_app = typer.Typer(no_args_is_help=True, help="Run and inspect tuning studies.")
app.add_typer(study_app, name="study")
from autotune.bench.cli import app as bench_app  # noqa: E402 - beside the sub-app it joins

app.add_typer(bench_app, name="bench", help="Benchmarks of the tuner itself (no GPU needed).")

try:
    from autotune.sim.cli import app as sim_app

    app.add_typer(sim_app, name="sim", help="The simulated GPU host (no GPU needed).")
except ImportError:  # pragma: no cover - the simulator ships with the package
    pass

def _console(stderr: bool = False) -> Console:
    probe = Console(stderr=stderr)
    return probe if probe.is_terminal else Console(stderr=stderr, width=150)


_out = _console()
_err = _console(stderr=True)

_USER_UMASK: int | None = None
"""The umask the user ran us with (restored for launched servers); None when not run by main()."""

StorageOpt = typer.Option(DEFAULT_STORAGE, "--storage", help="Optuna storage URL.")
NameArg = typer.Argument(..., metavar="NAME", help="The study name.")


def _print_json(doc: Any) -> None:
    sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")


# -- study start / resume -------------------------------------------------------------------
@study_app.command("start")
def study_start(
    ctx: typer.Context,
    config: Optional[Path] = typer.Argument(None, metavar="CONFIG", help="Study config YAML."),
    demo: bool = typer.Option(False, "--demo", help="Run the built-in demo study on the simulated host."),
    name: Optional[str] = typer.Option(None, "--name", help="Override the study name."),
    storage: Optional[str] = typer.Option(None, "--storage", help="Override the storage URL."),
    trials: Optional[int] = typer.Option(None, "--trials", min=1, help="Override the trial budget."),
    executor: Optional[str] = typer.Option(None, "--executor", help="serial (one trial at a time) or ray (one per slot)."),
    address: Optional[str] = typer.Option(None, "--address", help="The Ray cluster (auto, HOST:PORT); default: start a local one."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Sampler seed."),
    baseline_from: Optional[str] = typer.Option(None, "--baseline-from", metavar="STUDY[@STORAGE]",
                                                help="Use the best trial of another study as the baseline."),
    detach: bool = typer.Option(False, "--detach", help="Run it in the background (a local daemon) and return."),
) -> None:
    """Start a study (or continue the one of the same name)."""
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
    if baseline_from is not None:
        # STUDY@STORAGE splits at the '@' that starts a URL: a study name may hold '@' itself.
        m = re.fullmatch(r"([^@].*?)(?:@([A-Za-z][\w+.-]*://.*))?", baseline_from)
        if m is None:
            raise UsageError(f"--baseline-from '{baseline_from}': expected STUDY or STUDY@STORAGE")
        overrides["baseline_from"] = {"study": m.group(1), "storage": m.group(2)}
    if executor is not None:
        overrides["executor"] = executor
    if address is not None:
        overrides["ray"] = {**cfg.ray.model_dump(), "address": address}
    if overrides:
        cfg = StudyConfig.from_mapping({**cfg.model_dump(), **overrides}, "command line")
    if address is not None and cfg.executor != "ray":
        raise UsageError("--address is for the Ray executor: add --executor ray")
    check_storage(cfg.storage)  # before anything is created
    if detach:  # this very command, less --detach, as a daemon (autotune.study.service)
        _start_detached(cfg, _options(ctx))
        return
    _run_study(cfg, trials)


@study_app.command("resume")
def study_resume(name: str = NameArg, storage: str = StorageOpt,
                 trials: Optional[int] = typer.Option(None, "--trials", min=1, help="Override the trial budget.")) -> None:
    """Continue a stored study with the config it was started with."""
    from autotune.store.study_view import load_study

    _run_study(_stored_config(load_study(name, storage), storage), trials)


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
        info = service.detach(argv, cfg.name, cfg.storage, umask=_USER_UMASK)
    except service.DaemonExitedError as exc:
        _fail(str(exc), exc.code)
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


@study_app.command("status")
def study_status(name: str = NameArg, storage: str = StorageOpt, as_json: bool = typer.Option(False, "--json")) -> None:
    """Who runs a study, its running trials and their phases, its best value and slots."""
    from autotune.study import service
    from autotune.store.study_view import load_study

    doc = service.study_status(load_study(name, storage), storage)
    if as_json:
        _print_json(doc)
        return
    for line in service.status_lines(doc):
        _out.print(line, markup=False, highlight=False, soft_wrap=True)


@study_app.command("stop")
def study_stop(name: str = NameArg, storage: str = StorageOpt,
               timeout: float = typer.Option(120.0, "--timeout", min=0,
                                             help="Seconds to wait for the driver to stop.")) -> None:
    """Ask a study's driver to stop (running trials torn down, run again on resume) and wait."""
    from autotune.study import service
    from autotune.store.study_view import load_study

    study = load_study(name, storage)
    rdb = open_storage(storage)
    owner = service.lease_owner(rdb, name)
    if owner is None or not service.is_alive(owner):
        _out.print(f"study {name} is not running", markup=False)
        return
    service.request_stop(study, owner)
    done = service.signal_owner(owner)
    _err.print(f"stop requested for study {name} (pid {owner.pid} on {owner.host}): {done}; "
               f"waiting up to {timeout:.0f}s for its running trials' teardown", markup=False, soft_wrap=True)

    def progress(elapsed: float) -> None:
        running = [t for t in study.get_trials(deepcopy=False) if t.state.name == "RUNNING"]
        phases = ", ".join(f"trial {t.number} {t.user_attrs.get('phase', 'starting')}" for t in running)
        _err.print(f"  still running after {elapsed:.0f}s{': ' + phases if phases else ''}", markup=False,
                   soft_wrap=True)

    if not service.wait_stopped(rdb, name, owner, timeout, progress):
        _fail(f"study {name}: its driver (pid {owner.pid} on {owner.host}) still runs after {timeout:.0f}s; "
              "it stops after its running trials' teardown (run `autotune study stop` again to wait more)", 1)
    numbers = service.interrupted_trials(study, owner)
    which = f" ({', '.join(str(n) for n in numbers)})" if numbers else ""
    _out.print(f"study {name} stopped: {counted(len(numbers), 'trial')} interrupted{which}, to run again on "
               f"`autotune study resume {name}`", markup=False, soft_wrap=True)


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
    from autotune.study.driver import Driver, HostBrokenError
    from autotune.store.storage import artifact_dir
    from autotune.execution.executors import Executor, SerialExecutor, make_hosts, make_runner
    from autotune.config.objective import Objective
    from autotune.engines.preflight import preflight
    from autotune.study.progress import ConsoleReporter
    from autotune.execution.slots import host_slots
    from autotune.config.space import SearchSpace
    from autotune.execution.stopping import StopRequest

    space = SearchSpace.load(cfg.space)
    objective = Objective.load_file(cfg.objective, cfg.objective_overrides)
    if cfg.baseline_from is not None:
        cfg = cfg.model_copy(update={"baseline": _baseline_from(cfg, space)})
    space.complete(cfg.baseline)  # validate the baseline before anything runs
    if preset_needs_benchmark(cfg.target.engine) and objective.benchmark is None:
        raise UsageError(f"engine '{cfg.target.engine}' runs no server: the objective needs a 'benchmark' command")
    stop = StopRequest()
    log_dir = artifact_dir(cfg.storage) / "logs" / cfg.name
    public = space.applied_names()
    target = cfg.target
    hosts = make_hosts(target, child_umask=_USER_UMASK)
    preflight(cfg, hosts)  # an engine that cannot start at all: one line, exit 2, before any trial
    executor: Executor
    if cfg.executor == "ray":
        from autotune.execution.ray_executor import RayExecutor

        executor = RayExecutor(cfg, objective, log_dir=log_dir, public=public, child_umask=_USER_UMASK)
    else:
        slots = host_slots(target.hosts, host_gpus=target.host_gpus, gpus_per_trial=target.gpus_per_trial)
        runners = {s.name: make_runner(cfg, objective, hosts[s.host], s, stop=stop, log_dir=log_dir, public=public,
                                       child_umask=_USER_UMASK) for s in slots}
        executor = SerialExecutor(runners, slots)
    reporter = ConsoleReporter(_err, metric=objective.metric,
                               objectives=[g.metric for g in objective.goals] if objective.multi else ())
    driver = Driver(cfg, space, objective, executor, reporter=reporter, trials=trials, stop=stop, hosts=hosts)
    try:
        run = driver.run()
    except HostBrokenError as exc:
        _err.print(str(exc), style="red", markup=False, soft_wrap=True)  # one line, however long
        raise typer.Exit(1) from None
    except sqlalchemy.exc.SQLAlchemyError as exc:
        # Locked for longer than the storage waits, or its disk is full: what was recorded stays.
        orig = getattr(exc, "orig", None) or exc
        _err.print(f"storage error, study stopped: {str(orig).splitlines()[0] if str(orig) else type(orig).__name__}; "
                   f"`autotune study resume {cfg.name}` continues", style="red", markup=False)
        raise typer.Exit(1) from None
    finally:
        executor.close()
        for h in driver.hosts.values():
            h.close()
    if stop.requested:
        raise typer.Exit(stop.exit_code)
    if show_best:
        _print_best(run.study, objective.metric, brief=True)


def preset_needs_benchmark(engine: str) -> bool:
    from autotune.engines import get_preset

    return get_preset(engine).serverless


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


def _print_best(study: Any, metric: str, *, brief: bool = False) -> None:
    """The best configuration, as ``study best`` prints it: its figure against the baseline, what
    backs it, every parameter and how to export it. ``brief``, under the end-of-study summary
    (whose first row is this configuration, with what it changed from the baseline): no
    parameter list and no note on its first run (the table's caption has it), so the summary and
    the best fit an 80x24 screen."""
    from autotune.store.study_view import backing_text, best_view, is_multi_objective, trial_views

    if is_multi_objective(study):
        _print_front(study)
        return
    best = best_view(study)
    if best is None:
        _err.print("no feasible trial yet")
        return
    base = [v for v in trial_views(study) if v.baseline and v.value is not None]
    vs = ""
    if best.baseline:
        vs = " (the baseline)"
    elif base and base[0].value:
        vs = f" ({best.value / base[0].value:.2f}x the baseline's {with_unit(base[0].value, metric)})"  # type: ignore[operator]
    # Names and values are user data: printed as text, never read as rich markup.
    _out.print(f"best: trial {best.number} {metric}={with_unit(best.value, metric)}{vs}", markup=False)
    m = best.measured
    if m is not None and m.first_excluded:
        _print_item(backing_text(m))
        if not brief:
            _print_item(f"its first run (trial {m.trials[0]}: {with_unit(m.values[0], metric)}) is left out: the run that made it "
                        "a candidate reads high")
    elif m is not None:
        _print_item("1 measurement, no interval (the study did not measure it again)")
    if brief:
        _print_item(f"every parameter: autotune study best {study.study_name}")
    else:
        _print_item(" ".join(f"{k}={v}" for k, v in best.params.items()))
    _print_item(f"export it: autotune export {study.study_name} --format sh -o profile.sh")


def _print_item(text: str, indent: int = 2, *, hang: int | None = None, style: str | None = None) -> None:
    """One item of a summary, ``indent`` spaces in, wrapped to the console's width with its
    continuation lines indented ``hang`` spaces (default: two further; an 80-column terminal
    wrapped a parameter line back to column 0). Printed as text: names and values are user data,
    never rich markup."""
    _out.print(textwrap.fill(text, width=max(_out.width, 40), initial_indent=" " * indent,
                             subsequent_indent=" " * (indent + 2 if hang is None else hang),
                             break_long_words=False, break_on_hyphens=False),
               markup=False, soft_wrap=True, style=style, highlight=False)


def _print_front(study: Any) -> None:
    """A multi-objective study's Pareto front, each trial's values, and the one the rule picks."""
    from autotune.store.study_view import objectives, pick, trial_views

    views = trial_views(study)
    chosen = pick(study, views)
    if chosen is None:
        _err.print("no feasible trial yet")
        return
    goals = objectives(study)
    by_number = {v.number: v for v in views}
    _out.print(f"Pareto front: {counted(len(chosen.front), 'trial')}, objectives "
               + ", ".join(f"{g.direction} {g.metric}" for g in goals), markup=False)
    for n in chosen.front:
        v = by_number[n]
        values = " ".join(f"{g.metric}={x:.4g}" for g, x in zip(goals, v.values or []))
        mark = "  <- chosen" if n == chosen.number else ""
        _out.print(f"  trial {n}{' (baseline)' if v.baseline else ''}: {values}{mark}", markup=False)
    best = by_number[chosen.number]
    _out.print(f"chosen: trial {best.number} by the rule {chosen.text}", markup=False, soft_wrap=True)
    _print_item(" ".join(f"{k}={v}" for k, v in best.params.items()))
    _print_item(f"export it: autotune export {study.study_name} --format sh -o profile.sh "
                "(--choose knee|first|bound[:TOLERANCE] or --trial N for another)")


# -- study list / show / best / explain -----------------------------------------------------
@study_app.command("list")
def study_list(storage: str = StorageOpt, as_json: bool = typer.Option(False, "--json")) -> None:
    """List the studies in a storage."""
    import optuna

    from autotune.study.progress import console_table
    from autotune.store.study_view import best_view, trial_views

    # A missing SQLite file lists no study and is not created.
    rdb = open_storage(storage) if has_studies(storage) else None
    summaries = [] if rdb is None else optuna.get_all_study_summaries(storage=rdb, include_best_trial=False)
    rows = []
    for s in summaries:
        study = optuna.load_study(study_name=s.study_name, storage=rdb)
        views = trial_views(study)
        best = best_view(study)
        by = counts(views)
        metric = objective_metric(study)
        rows.append({"study": s.study_name, "trials": len(views),
                     "feasible": by[Outcome.OK], "infeasible": by[Outcome.INFEASIBLE], "stopped": by[Outcome.STOPPED],
                     "fault": by[Outcome.FAULT], "outcomes": {str(o): n for o, n in by.items()},
                     "best": None if best is None else best.value, "best_trial": None if best is None else best.number,
                     "metric": metric, "unit": unit_of(metric),
                     "created": s.user_attrs.get("created")})
    if as_json:
        _print_json(rows)
        return
    # The name is what other commands take: whole where it fits, wrapped where it does not,
    # never cut; the time wraps under its date first (80 columns).
    table = console_table(f"studies in {storage}")
    table.add_column("study", overflow="fold", min_width=min(max((len(r["study"]) for r in rows), default=5), 32))
    for col in ("trials", "ok", "infeasible", "stopped", "best"):  # ok: measured, as the summary counts them
        table.add_column(col, no_wrap=True)
    table.add_column("created", min_width=10, overflow="fold")
    for r in rows:  # Text cells: a study name is never read as markup
        cells = ["" if r[c] is None else f"{r[c]:.4g}" if isinstance(r[c], float) else str(r[c]) for c in
                 ("study", "trials", "feasible", "infeasible", "stopped")]  # JSON's names
        cells.append("" if r["best"] is None else f"{with_unit(r['best'], r['metric'])} (#{r['best_trial']})")
        table.add_row(*map(Text, cells), Text(_minute_utc(r["created"])))
    _out.print(table)


def _minute_utc(stamp: Any) -> str:
    """An ISO time (as the driver stores ``created``) to the minute in UTC, ``2026-12-05 00:34 UTC``;
    anything else as it is."""
    try:
        when = datetime.datetime.fromisoformat(str(stamp))
    except ValueError:
        return "" if stamp is None else str(stamp)
    if when.tzinfo is not None:
        when = when.astimezone(datetime.timezone.utc)
    return when.strftime("%Y-%m-%d %H:%M") + (" UTC" if when.tzinfo is not None else "")


@study_app.command("show")
def study_show(name: str = NameArg, storage: str = StorageOpt, as_json: bool = typer.Option(False, "--json"),
               excerpts: bool = typer.Option(True, "--excerpts/--no-excerpts", help="Print failure log excerpts.")) -> None:
    """Every trial of a study: outcome, value, failure kind and log excerpt."""
    from autotune.study.progress import summary_table
    from autotune.store.study_view import is_multi_objective, load_study, objectives, pick, proposal_text, show_json, trial_views

    study = load_study(name, storage)
    if as_json:
        _print_json(show_json(study))
        return
    metric = objective_metric(study) or "value"
    views = trial_views(study)
    if is_multi_objective(study):
        chosen = pick(study, views)
        _out.print(summary_table(views, metric, goals=objectives(study), front=chosen.front if chosen else (),
                                 chosen=chosen.number if chosen else None))
    else:
        _out.print(summary_table(views, metric, study.direction.name == "MAXIMIZE"))
    raised = [(v.number, proposal_text(v.proposed)) for v in views if (v.proposed or {}).get("by") == "raise"]
    for number, why in raised:
        _out.print(f"trial {number}: {why}", markup=False, highlight=False)
    if excerpts:
        for v in views:
            if v.failure:
                _out.rule(Text(f"trial {v.number}: {v.failure.kind}"))
                _out.print(v.failure.message, markup=False, highlight=False)
                if v.failure.excerpt:
                    _out.print(v.failure.excerpt, markup=False, highlight=False, style="dim")


@study_app.command("best", short_help="The best feasible trial of a study (multi-objective: its Pareto front and pick).")
def study_best(name: str = NameArg, storage: str = StorageOpt, as_json: bool = typer.Option(False, "--json")) -> None:
    """The best feasible trial of a study; of a multi-objective study, its Pareto front and the
    trial the objective's rule picks from it (the one `autotune export` exports)."""
    from autotune.store.study_view import best_json, best_view, front_json, is_multi_objective, load_study, pick, trial_views

    study = load_study(name, storage)
    best = best_view(study)
    if best is None:
        raise UsageError(f"study '{name}' has no feasible trial yet")
    if as_json:
        doc = best_json(best)
        if is_multi_objective(study):
            views = trial_views(study)
            chosen = pick(study, views)
            assert chosen is not None
            doc.update(front_json(study, views, chosen))
        _print_json(doc)
        return
    _print_best(study, objective_metric(study) or "value")


@study_app.command("explain")
def study_explain(name: str = NameArg, storage: str = StorageOpt, as_json: bool = typer.Option(False, "--json")) -> None:
    """Which parameters mattered, and which values crash."""
    from autotune.analysis.explain import explain
    from autotune.store.study_view import load_study

    doc = explain(load_study(name, storage))
    if as_json:
        _print_json(doc)
        return
    counts = ", ".join(f"{n} {o}" for o, n in sorted(doc["outcomes"].items(), key=lambda kv: -kv[1]))
    _out.print(Text.assemble((str(doc["study"]), "bold"), f": {doc['trials']} trials: {counts}"))
    if doc["failure_kinds"]:
        _out.print("failure kinds: " + ", ".join(f"{k} x{n}" for k, n in doc["failure_kinds"].items()), markup=False)
    rules, left = doc["failure_rules"], doc["unexplained_failures"]
    if rules or left["count"]:
        _out.print(Text("what crashes", "bold"), Text("(rule -> kind (failed of covered); each failure attributed to one rule)"))
    # Each item wrapped with its continuation lines indented: at 80 columns a rule with its scope
    # ran to three lines, the second and third back at column 0 among the headings.
    for rule in rules:
        _print_item(f"{rule['rule']}  trials {', '.join(map(str, rule['trials']))}")
        for quantity, meaning in (rule.get("derived") or {}).items():
            _print_item(f"{quantity}: {meaning}", 4)
        if rule.get("confounded_with"):
            _print_item(f"not told apart from {' or '.join(rule['confounded_with'])}: every one of these "
                        "failures also had it, and no more trials refute it", 4)
        if rule.get("as_sure"):
            _print_item(f"or as surely {' or '.join(rule['as_sure'])}: these trials do not choose between "
                        "them (each explains as many failures, as cleanly)", 4)
    if left["count"]:
        kinds = ", ".join(f"{k} x{n}" for k, n in left["kinds"].items())
        _print_item(f"{counted(left['count'], 'failure')} explained by no rule ({kinds}): trials "
                    f"{', '.join(map(str, left['trials']))}")
        for local in left["at_one_configuration"]:
            _print_item(f"{local['text']}: trials {', '.join(map(str, local['trials']))}", 4)
    imp = doc["importance"]
    targets = [(o["metric"], o) for o in imp["objectives"]] if imp.get("objectives") else [("the objective", imp["objective"])]
    for label, part in (*targets, ("feasibility", imp["feasibility"])):
        if part["verdict"] != "ok":
            _out.print(Text.assemble(("what matters for " + label, "bold"), f": {part['verdict']}"))
            continue
        _out.print(Text("what matters for " + label, "bold"),
                   Text(f"(share of the variance only it accounts for, {part['trials']} trials: median [90 % interval])"))
        relative, bounded = part["relative"], False
        width = max((len(k) for k in part["params"]), default=0)  # so that a verdict with its bound fits 80
        for k, v in part["params"].items():
            verdict = v["verdict"]
            over = (v.get("matched") or {}).get("over")
            high = (v.get("matched") or {}).get("spread_high")
            if verdict == "uncertain" and isinstance(high, (int, float)):
                verdict += f" (spread <= {100 * high:.1f} %)" if relative else f" (spread <= {high:.2f})"
                bounded = True
            if verdict == "no measurable effect" and isinstance(over, list):
                numeric = v.get("values") and len(v["values"]) == 2 and all(
                    isinstance(x, (int, float)) and not isinstance(x, bool) for x in v["values"])
                shown = f"{over[0]}..{over[1]}" if numeric else ", ".join(map(str, over))
                verdict += f" (between the values compared: {shown})"
            share = f"{v['median']:.2f} [{v['low']:.2f}, {v['high']:.2f}]  " if "median" in v else ""
            line = f"{k:{width}s}  {share}"
            _print_item(line + verdict, hang=2 + len(line))  # a long verdict wraps under itself
        if bounded:
            need = f"{100 * part['no_effect_spread']:g} % of the mean" if relative else f"{part['no_effect_spread']:g}"
            _print_item(f"(spread <= x: its effect over the values compared, in pairs of trials alike in the "
                        f"rest, 95th percentile; 'no measurable effect' needs below {need})", style="dim")


@study_app.command("ablate", short_help="Which of the best trial's changes earned its gain: each reverted, measured again.")
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
        _print_json(doc)
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


# -- export / dashboard -------------------------------------------------------------------------
@app.command("export", short_help="Export the best configuration of a study as a launch profile.")
def export(
    name: str,
    fmt: str = typer.Option(..., "--format", "-f", help="sh | env | yaml | json"),
    output: Optional[Path] = typer.Option(None, "-o", "--output", help="Write to this file (default: stdout)."),
    storage: str = StorageOpt,
    port: Optional[int] = typer.Option(None, "--port", help="Port in the profile (default: the engine's)."),
    python: Optional[str] = typer.Option(None, "--python", metavar="PATH",
                                         help="The serving host's interpreter to bake in (default: python3; "
                                              "PYTHON overrides it at launch)."),
    memory_margin: float = typer.Option(DEFAULT_MEMORY_MARGIN, "--memory-margin", min=0.0, max=1.0,
                                        help="How far below the nearest memory failure the study saw a memory "
                                             "parameter is exported: absolute for fractions, else relative; one "
                                             "grid step at least."),
    choose: Optional[str] = typer.Option(None, "--choose", metavar="RULE",
                                         help="A multi-objective study: the rule that picks from its Pareto front: "
                                              "bound (the objective's, else within 10% of the front's best on every "
                                              "objective after the first), bound:TOLERANCE, knee or first."),
    trial: Optional[int] = typer.Option(None, "--trial", min=0, help="Export this measured trial instead."),
) -> None:
    """Export the best configuration of a study as a launch profile (of a multi-objective study: the
    trial of its Pareto front that the objective's rule, or --choose, picks)."""
    from autotune.profiles.export import FILE_MODE, FORMATS, SH_MODE, check_output, from_study, render, write_profile
    from autotune.config.pareto import ChoiceRule
    from autotune.store.study_view import choice_rule, load_study

    if fmt not in FORMATS:
        raise UsageError(f"--format {fmt}: expected one of {', '.join(FORMATS)}")
    if port is not None and not 1 <= port <= 65535:
        raise UsageError(f"--port {port}: expected a port number between 1 and 65535")
    if python is not None and (not python.strip() or any(c in python for c in "\x00\n\r")):
        raise UsageError("--python: expected the interpreter's name or path on the serving host")
    if output is not None:
        check_output(output)  # before anything is read or rendered
    if choose is not None and trial is not None:
        raise UsageError("give --choose or --trial, not both")
    rule = None
    if choose is not None:
        try:
            rule = ChoiceRule.parse(choose)
        except ValueError as exc:
            raise UsageError(f"--choose: {exc}") from None
    study = load_study(name, storage)
    if rule is not None and choose is not None and choose.strip() == "bound":
        rule = ChoiceRule.parse(choose, default=choice_rule(study))
    prof, best = from_study(study, storage, port=port, python=python, memory_margin=memory_margin, rule=rule,
                            number=trial)
    text = render(fmt, prof)
    changed = [m["text"] for m in prof["memory"] if m["exported"] != m["measured"]]
    if output is None:
        sys.stdout.write(text)
    else:
        write_profile(output, text, SH_MODE if fmt == "sh" else FILE_MODE)
        chosen = f"; chosen: {prof['choice']['text']}" if prof.get("choice") else ""
        _err.print(f"wrote {output} (trial {best.number}, {prof['metric']}={prof['value']:.4g}{chosen})",
                   markup=False, highlight=False, soft_wrap=True)
    for line in changed:
        _err.print(f"memory back-off: {line}", markup=False, highlight=False, soft_wrap=True)


@app.command("verify")
def verify(
    profile_path: Path = typer.Argument(..., metavar="PROFILE", help="A profile written by `autotune export`."),
    repeats: int = typer.Option(1, "--repeats", "--trials", min=1, max=100, help="Launches to measure."),
    timeout: Optional[float] = typer.Option(None, "--timeout", min=1.0,
                                            help="Seconds the server may take to be ready (default: the study's)."),
    tolerance: float = typer.Option(0.10, "--tolerance", min=0.0, max=1.0,
                                    help="How much worse than recorded still passes (0.10: 10%)."),
    python: Optional[str] = typer.Option(None, "--python", metavar="PATH",
                                         help="The interpreter to run the engine with (default: $PYTHON, else "
                                              "the profile's)."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Launch a profile once on this machine under the study's load and compare with what was recorded.

    Exit 0 within the tolerance, 1 when worse (or the launch failed), 2 on bad input.
    """
    from autotune.profiles.export import verify as verify_profile
    from autotune.profiles.export import verify_lines

    doc = verify_profile(profile_path, repeats=repeats, timeout_s=timeout, python=python, tolerance=tolerance,
                         child_umask=_USER_UMASK,
                         say=lambda line: _err.print(line, markup=False, highlight=False, soft_wrap=True))
    if as_json:
        _print_json(doc)
    else:
        for line in verify_lines(doc):
            _out.print(line, markup=False, highlight=False, soft_wrap=True)
    if doc["code"]:
        raise typer.Exit(doc["code"])


@app.command("report")
def report(
    name: str = NameArg,
    output: Path = typer.Option(..., "-o", "--output", help="The HTML file to write."),
    storage: str = StorageOpt,
) -> None:
    """One self-contained HTML page: history, importances, feasibility, crash rules, ablation, best profile."""
    from autotune.profiles.export import FILE_MODE, check_output, write_profile
    from autotune.profiles.report import build_report
    from autotune.store.study_view import load_study

    check_output(output)  # before anything is read or rendered
    page = build_report(load_study(name, storage), storage)
    write_profile(output, page, FILE_MODE)
    _err.print(f"wrote {output} ({len(page.encode()) // 1024} KiB)", markup=False, highlight=False)


@app.command("dashboard")
def dashboard(storage: str = StorageOpt, host: str = typer.Option("127.0.0.1", "--host"),
              port: int = typer.Option(8080, "--port")) -> None:
    """Serve optuna-dashboard over the storage, with trial logs as artifacts."""
    from optuna.artifacts import FileSystemArtifactStore
    from optuna_dashboard import run_server

    from autotune.store.storage import artifact_dir

    if not 1 <= port <= 65535:
        raise UsageError(f"--port {port}: expected a port number between 1 and 65535")
    if not host.strip():
        raise UsageError("--host: expected an address to listen on, e.g. 127.0.0.1")
    check_storage(storage)  # before anything is created
    store_dir = artifact_dir(storage)
    store_dir.mkdir(parents=True, exist_ok=True)
    # An opened storage, not the URL: optuna-dashboard opens a URL without creating the tables,
    # which fails on a new database.
    rdb = open_storage(storage)
    from autotune.study.notes import write_all_notes

    written = write_all_notes(rdb)  # trials recorded before notes were written read like `study show` too
    _err.print(f"optuna-dashboard on http://{host}:{port}/ (storage {storage}"
               + (f"; {written} trial notes written)" if written else ")"), markup=False, soft_wrap=True)
    run_server(rdb, host=host, port=port, artifact_store=FileSystemArtifactStore(str(store_dir)))


def main() -> None:
    """Console entry point: one-line errors with exit code 2 for bad input, never a traceback.

    Files and folders the tool creates are private (umask 077: 0600 and 0700); the servers it
    launches keep the user's umask.
    """
    import os
    import warnings

    global _USER_UMASK
    _USER_UMASK = os.umask(0o077)

    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    try:
        rc = app(args=sys.argv[1:], prog_name="autotune", standalone_mode=False)
    except (_click_exc.NoArgsIsHelpError, click.exceptions.NoArgsIsHelpError) as exc:
        sys.stdout.write(exc.format_message().rstrip("\n") + "\n")  # a bare group: its help, as --help
        sys.exit(0)
    except (_click_exc.UsageError, click.exceptions.UsageError) as exc:
        usage = exc.ctx.get_usage().removeprefix("Usage: ").strip() if exc.ctx is not None else ""
        usage = re.sub(r"\{([^{}]*)\}", r"\1", usage)  # typer writes a required argument as {NAME}
        _fail(exc.format_message() + (f" (usage: {usage})" if usage else ""))
    except (_click_exc.ClickException, click.exceptions.ClickException) as exc:
        _fail(exc.format_message(), exc.exit_code)
    except (typer.Abort, click.exceptions.Abort, KeyboardInterrupt):
        sys.exit(130)  # Ctrl-C outside a study (a study handles its signals itself)
    except (UsageError, ConfigError) as exc:  # StudyNotFoundError too
        _fail(str(exc))
    sys.exit(rc if isinstance(rc, int) else 0)


def _fail(message: str, code: int = 2) -> NoReturn:
    """Print ``autotune: error: MESSAGE`` (:data:`autotune.errors.ERROR_PREFIX`) as one line on stderr
    and exit with ``code``."""
    from autotune.errors import ERROR_PREFIX

    sys.stderr.write(f"{ERROR_PREFIX} {' '.join(message.split()) or 'invalid input'}\n")
    sys.exit(code)


if __name__ == "__main__":
    main()
