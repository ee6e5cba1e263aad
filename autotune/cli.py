"""The ``autotune`` command line: parse, call, print. Bad input exits 2 with one line."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Optional

import click
import typer
from rich.console import Console

from autotune.config import DEFAULT_STORAGE, StudyConfig
from autotune.errors import ConfigError, UsageError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Find the best launch configuration of an LLM inference server, by experiment.")
study_app = typer.Typer(no_args_is_help=True, help="Run and inspect tuning studies.")
app.add_typer(study_app, name="study")

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

StorageOpt = typer.Option(DEFAULT_STORAGE, "--storage", help="Optuna storage URL.")


def _print_json(doc: Any) -> None:
    sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")


# -- study start / resume -------------------------------------------------------------------
@study_app.command("start")
def study_start(
    config: Optional[Path] = typer.Argument(None, help="Study config YAML."),
    demo: bool = typer.Option(False, "--demo", help="Run the built-in demo study on the simulated host."),
    name: Optional[str] = typer.Option(None, "--name", help="Override the study name."),
    storage: Optional[str] = typer.Option(None, "--storage", help="Override the storage URL."),
    trials: Optional[int] = typer.Option(None, "--trials", min=1, help="Override the trial budget."),
    executor: str = typer.Option("serial", "--executor", help="serial (only one for now)."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Sampler seed."),
    baseline_from: Optional[str] = typer.Option(None, "--baseline-from", metavar="STUDY[@STORAGE]",
                                                help="Use the best trial of another study as the baseline."),
) -> None:
    """Start a study (or continue the one of the same name)."""
    from autotune.demo import DEMO_CONFIG

    if demo == (config is not None):
        raise UsageError("give a CONFIG file or --demo (not both)")
    cfg = StudyConfig.from_mapping(DEMO_CONFIG, "demo") if demo else StudyConfig.load(config)  # type: ignore[arg-type]
    overrides: dict[str, Any] = {}
    if name:
        overrides["name"] = name
    if storage:
        overrides["storage"] = storage
    if seed is not None:
        overrides["seed"] = seed
    if baseline_from:
        other, _, other_storage = baseline_from.partition("@")
        overrides["baseline_from"] = {"study": other, "storage": other_storage or None}
    if overrides:
        cfg = StudyConfig.from_mapping({**cfg.model_dump(), **overrides}, "command line")
    if executor != "serial":
        raise UsageError(f"--executor {executor}: only 'serial' is available in this version")
    _run_study(cfg, trials)


@study_app.command("resume")
def study_resume(name: str, storage: str = StorageOpt,
                 trials: Optional[int] = typer.Option(None, "--trials", min=1, help="Override the trial budget.")) -> None:
    """Continue a stored study with the config it was started with."""
    from autotune.study_view import load_study

    study = load_study(name, storage)
    data = study.user_attrs.get("config")
    if not data:
        raise UsageError(f"study '{name}' was not started by autotune (no stored config)")
    _run_study(StudyConfig.from_mapping({**data, "storage": storage}, f"stored study {name}"), trials)


def _run_study(cfg: StudyConfig, trials: int | None) -> None:
    from autotune.driver import Driver, HostBrokenError, artifact_dir
    from autotune.engines import get_preset
    from autotune.executors import SerialExecutor
    from autotune.hosts import make_host
    from autotune.objective import Objective
    from autotune.progress import ConsoleReporter
    from autotune.runner import TrialRunner
    from autotune.space import SearchSpace

    space = SearchSpace.load(cfg.space)
    objective = Objective.load_file(cfg.objective, cfg.objective_overrides)
    if cfg.baseline_from is not None:
        cfg = cfg.model_copy(update={"baseline": _baseline_from(cfg, space)})
    space.complete(cfg.baseline)  # validate the baseline before anything runs
    if preset_needs_benchmark(cfg.target.engine) and objective.benchmark is None:
        raise UsageError(f"engine '{cfg.target.engine}' runs no server: the objective needs a 'benchmark' command")
    if cfg.storage.startswith("sqlite:///"):
        db_dir = Path(cfg.storage.removeprefix("sqlite:///")).parent
        if not db_dir.is_dir():
            raise UsageError(f"storage {cfg.storage}: folder {db_dir} does not exist")
    preset = get_preset(cfg.target.engine)
    runner = TrialRunner(
        make_host(cfg.target.hosts[0]),
        preset,
        objective,
        log_dir=artifact_dir(cfg.storage) / "logs" / cfg.name,
        template=cfg.target.command,
        fields={"scenario": cfg.target.scenario or "", "model": cfg.target.model or "",
                # transformers serve pins its model: requests must name it as the command does.
                "served_model_name": cfg.target.model if cfg.target.engine == "transformers" else ""},
        fixed_env=cfg.target.env,
        ready_timeout_s=cfg.target.ready_timeout_s,
        ready_path=cfg.target.ready_path,
        api=cfg.target.api,
        port=cfg.target.port,
    )
    reporter = ConsoleReporter(_err, metric=objective.metric)
    driver = Driver(cfg, space, objective, SerialExecutor(runner), reporter=reporter, trials=trials)
    try:
        run = driver.run()
    except HostBrokenError as exc:
        _err.print(f"[red]{exc}[/red]")
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        _err.print("interrupted: the running trial was recorded as FAIL; `autotune study resume` continues")
        raise typer.Exit(130) from None
    _print_best(run.study, objective.metric)


def preset_needs_benchmark(engine: str) -> bool:
    from autotune.engines import get_preset

    return get_preset(engine).serverless


def _baseline_from(cfg: StudyConfig, space: Any) -> dict[str, Any]:
    """The best trial of ``cfg.baseline_from`` restricted to this space, under ``cfg.baseline``."""
    from autotune.study_view import best_view, load_study

    assert cfg.baseline_from is not None
    source = load_study(cfg.baseline_from.study, cfg.baseline_from.storage or cfg.storage)
    best = best_view(source)
    if best is None:
        raise UsageError(f"baseline_from: study '{source.study_name}' has no feasible trial")
    shared = {k: v for k, v in best.params.items() if k in space.parameters}
    if not shared:
        raise UsageError(f"baseline_from: study '{source.study_name}' shares no parameter with space {space.name}")
    _err.print(f"baseline from study {source.study_name} trial {best.number}: "
               + " ".join(f"{k}={v}" for k, v in shared.items()))
    return {**shared, **cfg.baseline}


def _print_best(study: Any, metric: str) -> None:
    from autotune.study_view import best_view, trial_views

    best = best_view(study)
    if best is None:
        _err.print("no feasible trial yet")
        return
    base = [v for v in trial_views(study) if v.baseline and v.value is not None]
    vs = ""
    if best.baseline:
        vs = " (the baseline)"
    elif base and base[0].value:
        vs = f" ({best.value / base[0].value:.2f}x the baseline's {base[0].value:.4g})"  # type: ignore[operator]
    _out.print(f"best: trial {best.number} {metric}={best.value:.4g}{vs}")
    _out.print("  " + " ".join(f"{k}={v}" for k, v in best.params.items()))
    _out.print(f"  export it: autotune export {study.study_name} --format sh -o profile.sh")


# -- study list / show / best / explain -----------------------------------------------------
@study_app.command("list")
def study_list(storage: str = StorageOpt, as_json: bool = typer.Option(False, "--json")) -> None:
    """List the studies in a storage."""
    import optuna
    from rich.table import Table

    from autotune.study_view import best_view, trial_views

    try:
        summaries = optuna.get_all_study_summaries(storage=storage, include_best_trial=False)
    except Exception as exc:  # noqa: BLE001
        raise UsageError(f"cannot open storage {storage}: {str(exc).splitlines()[0]}") from None
    rows = []
    for s in summaries:
        study = optuna.load_study(study_name=s.study_name, storage=storage)
        views = trial_views(study)
        best = best_view(study)
        rows.append({"study": s.study_name, "trials": len(views),
                     "feasible": sum(v.value is not None for v in views),
                     "infeasible": sum(v.outcome == "infeasible" for v in views),
                     "best": None if best is None else best.value,
                     "created": s.user_attrs.get("created")})
    if as_json:
        _print_json(rows)
        return
    table = Table(title=f"studies in {storage}")
    for col in ("study", "trials", "feasible", "infeasible", "best", "created"):
        table.add_column(col)
    for r in rows:
        table.add_row(*(("" if r[c] is None else f"{r[c]:.4g}" if isinstance(r[c], float) else str(r[c])) for c in
                        ("study", "trials", "feasible", "infeasible", "best", "created")))
    _out.print(table)


@study_app.command("show")
def study_show(name: str, storage: str = StorageOpt, as_json: bool = typer.Option(False, "--json"),
               excerpts: bool = typer.Option(True, "--excerpts/--no-excerpts", help="Print failure log excerpts.")) -> None:
    """Every trial of a study: outcome, value, failure kind and log excerpt."""
    from autotune.progress import summary_table
    from autotune.study_view import load_study, show_json, trial_views

    study = load_study(name, storage)
    if as_json:
        _print_json(show_json(study))
        return
    metric = (study.user_attrs.get("objective") or {}).get("metric", "value")
    views = trial_views(study)
    _out.print(summary_table(views, metric, study.direction.name == "MAXIMIZE"))
    if excerpts:
        for v in views:
            if v.failure:
                _out.rule(f"trial {v.number}: {v.failure['kind']}")
                _out.print(v.failure.get("message") or "", markup=False, highlight=False)
                if v.failure.get("excerpt"):
                    _out.print(v.failure["excerpt"], markup=False, highlight=False, style="dim")


@study_app.command("best")
def study_best(name: str, storage: str = StorageOpt, as_json: bool = typer.Option(False, "--json")) -> None:
    """The best feasible trial of a study."""
    from autotune.study_view import best_json, best_view, load_study

    study = load_study(name, storage)
    best = best_view(study)
    if best is None:
        raise UsageError(f"study '{name}' has no feasible trial yet")
    if as_json:
        _print_json(best_json(best))
        return
    _print_best(study, (study.user_attrs.get("objective") or {}).get("metric", "value"))


@study_app.command("explain")
def study_explain(name: str, storage: str = StorageOpt, as_json: bool = typer.Option(False, "--json")) -> None:
    """Which parameters mattered, and which values crash."""
    from autotune.analysis import explain
    from autotune.study_view import load_study

    doc = explain(load_study(name, storage))
    if as_json:
        _print_json(doc)
        return
    _out.print(f"[bold]{doc['study']}[/bold]: {doc['trials']} trials, outcomes {doc['outcomes']}")
    if doc["failure_kinds"]:
        _out.print("failure kinds: " + ", ".join(f"{k} x{n}" for k, n in doc["failure_kinds"].items()))
    if doc["failure_rules"]:
        _out.print("[bold]what fails[/bold]")
        for rule in doc["failure_rules"]:
            _out.print(f"  {rule}")
    if doc["importances"]:
        _out.print("[bold]what matters[/bold] (fANOVA over feasible trials)")
        for k, v in doc["importances"].items():
            _out.print(f"  {k:32s} {v:.3f}")
    else:
        _out.print("importances: too few feasible trials")


# -- export / dashboard -------------------------------------------------------------------------
@app.command("export")
def export(
    name: str,
    fmt: str = typer.Option(..., "--format", "-f", help="sh | env | yaml | json"),
    output: Optional[Path] = typer.Option(None, "-o", "--output", help="Write to this file (default: stdout)."),
    storage: str = StorageOpt,
    port: Optional[int] = typer.Option(None, "--port", help="Port in the profile (default: the engine's)."),
) -> None:
    """Export the best configuration of a study as a launch profile."""
    from autotune.engines.registry import PRESETS
    from autotune.export import FORMATS, profile, render
    from autotune.study_view import best_view, load_study

    if fmt not in FORMATS:
        raise UsageError(f"--format {fmt}: expected one of {', '.join(FORMATS)}")
    study = load_study(name, storage)
    best = best_view(study)
    if best is None:
        raise UsageError(f"study '{name}' has no feasible trial to export")
    engine = ((study.user_attrs.get("config") or {}).get("target") or {}).get("engine", "sim")
    chosen_port = port or (PRESETS[engine].default_port if engine in PRESETS else 30000)
    objective = study.user_attrs.get("objective") or {}
    prof = profile(name, objective.get("metric"), study.direction.name.lower(), best, chosen_port)
    text = render(fmt, prof, best.argv_template or best.argv)
    if output is None:
        sys.stdout.write(text)
        return
    output.write_text(text)
    if fmt == "sh":
        output.chmod(0o755)
    _err.print(f"wrote {output} (trial {best.number}, {objective.get('metric')}={best.value:.4g})")


@app.command("dashboard")
def dashboard(storage: str = StorageOpt, host: str = typer.Option("127.0.0.1", "--host"),
              port: int = typer.Option(8080, "--port")) -> None:
    """Serve optuna-dashboard over the storage, with trial logs as artifacts."""
    from optuna.artifacts import FileSystemArtifactStore
    from optuna_dashboard import run_server

    from autotune.driver import artifact_dir

    store_dir = artifact_dir(storage)
    store_dir.mkdir(parents=True, exist_ok=True)
    _err.print(f"optuna-dashboard on http://{host}:{port}/ (storage {storage})")
    run_server(storage, host=host, port=port, artifact_store=FileSystemArtifactStore(str(store_dir)))


def main() -> None:
    """Console entry point: one-line errors with exit code 2 for bad input, never a traceback."""
    import warnings

    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    try:
        rc = app(standalone_mode=False)
    except click.exceptions.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        sys.exit(130)
    except (UsageError, ConfigError) as exc:
        sys.stderr.write(f"autotune: error: {' '.join(str(exc).split())}\n")
        sys.exit(2)
    sys.exit(rc if isinstance(rc, int) else 0)


if __name__ == "__main__":
    main()
