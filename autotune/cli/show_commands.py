"""``autotune study list|show|best|explain``: read a stored study and print it for a person.

Contracts:

- Read only: nothing is written to the storage (a missing SQLite file lists no study and is not
  created).
- ``--json`` prints one JSON document on stdout, the same data as the text.
- Text fits an 80-column terminal: items wrap with their continuation lines indented
  (:func:`_print_item`); names and values are user data, printed as text, never rich markup.
- ``_out`` is this module's console (stdout); tests put their own in its place.
"""

from __future__ import annotations

import datetime
import textwrap
from typing import Any

import typer
from rich.text import Text

from autotune.cli.common import NameArg, StorageOpt, print_json
from autotune.cli.common import err as _err
from autotune.cli.common import out as _out
from autotune.errors import UsageError
from autotune.store.record import Outcome, counts, objective_metric
from autotune.store.storage import has_studies, open_storage
from autotune.util.text import counted
from autotune.util.units import unit_of, with_unit
from autotune.util.versus import versus_text


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
        change = versus_text(best.value, base[0].value, study.direction.name == "MAXIMIZE")
        vs = f" (baseline {with_unit(base[0].value, metric)}: {change})"
    # Names and values are user data: printed as text, never read as rich markup.
    _out.print(f"best: trial {best.number} {metric}={with_unit(best.value, metric)}{vs}", markup=False, soft_wrap=True)
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
        print_json(rows)
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


def study_show(name: str = NameArg, storage: str = StorageOpt, as_json: bool = typer.Option(False, "--json"),
               excerpts: bool = typer.Option(True, "--excerpts/--no-excerpts", help="Print failure log excerpts.")) -> None:
    """Every trial of a study: outcome, value, failure kind and log excerpt."""
    from autotune.study.progress import summary_table
    from autotune.store.study_view import (WARM_START_ATTR, is_multi_objective, load_study, objectives, pick,
                                           proposal_text, show_json, trial_views)

    study = load_study(name, storage)
    if as_json:
        print_json(show_json(study))
        return
    metric = objective_metric(study) or "value"
    views = trial_views(study)
    if is_multi_objective(study):
        chosen = pick(study, views)
        _out.print(summary_table(views, metric, goals=objectives(study), front=chosen.front if chosen else (),
                                 chosen=chosen.number if chosen else None))
    else:
        _out.print(summary_table(views, metric, study.direction.name == "MAXIMIZE"))
    warm = study.user_attrs.get(WARM_START_ATTR)
    for line in (warm.get("lines") or []) if isinstance(warm, dict) else []:
        _out.print(line, markup=False, highlight=False)
    raised = [(v.number, proposal_text(v.proposed)) for v in views
              if (v.proposed or {}).get("by") in ("raise", "warm-start")]
    for number, why in raised:
        _out.print(f"trial {number}: {why}", markup=False, highlight=False)
    if excerpts:
        for v in views:
            if v.failure:
                _out.rule(Text(f"trial {v.number}: {v.failure.kind}"))
                _out.print(v.failure.message, markup=False, highlight=False)
                if v.failure.excerpt:
                    _out.print(v.failure.excerpt, markup=False, highlight=False, style="dim")


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
        print_json(doc)
        return
    _print_best(study, objective_metric(study) or "value")


def study_explain(name: str = NameArg, storage: str = StorageOpt, as_json: bool = typer.Option(False, "--json")) -> None:
    """Which parameters mattered, and which values crash."""
    from autotune.analysis.explain import explain
    from autotune.store.study_view import load_study

    doc = explain(load_study(name, storage))
    if as_json:
        print_json(doc)
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
                   Text(f"(share of the variance it accounts for, {part['trials']} trials: median [90 % interval])"))
        if part.get("sureness"):
            _print_item(f"how sure: {part['sureness']}")
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
            if verdict == "effect" and isinstance(v.get("p"), (int, float)):
                verdict += f" (p {v['p']:.2g})"
            share = f"{v['median']:.2f} [{v['low']:.2f}, {v['high']:.2f}]  " if "median" in v else ""
            line = f"{k:{width}s}  {share}"
            _print_item(line + verdict, hang=2 + len(line))  # a long verdict wraps under itself
        if bounded:
            need = f"{100 * part['no_effect_spread']:g} % of the mean" if relative else f"{part['no_effect_spread']:g}"
            _print_item(f"(spread <= x: its effect over the values compared, in pairs of trials alike in the "
                        f"rest, 95th percentile; 'no measurable effect' needs below {need})", style="dim")
