"""``autotune report NAME -o report.html``: one self-contained HTML page about a study.

Sections: what to launch and why (the best against the baseline on every metric, with units and
intervals: :mod:`autotune.profiles.best_vs_baseline`, a table ``id="best-vs-baseline"``), outcomes,
optimization history, parameter importances with their intervals (for the
objective and for feasibility), a feasibility map over the two most important parameters, parallel
coordinates, the crash rules, the ablation, the best profile and every trial in one table.

Contracts:

- One document, no network: plotly.js is embedded inline once; every chart is a plotly figure
  (:mod:`autotune.profiles.report_figures`) drawn by it in the browser. Each chart is a
  ``<div id="fig-...">`` with class :data:`FIGURE_CLASS`.
- The page is the Jinja2 template ``templates/report.html.j2`` (shipped in the package),
  rendered with autoescape on: all user data (names, values, failure messages, the profile) is
  HTML-escaped; only the figures' divs and plotly.js are inserted as markup.
- The analysis is :func:`autotune.analysis.explain.explain`'s document, read as it is; a failing
  analysis is reported in the page rather than losing the rest of it.
- The best profile is ``autotune export``'s (:func:`autotune.profiles.export.from_study`: memory
  back-off and provenance included), shown as its ``sh`` format less its last line, the record
  ``autotune verify`` reads.
"""

from __future__ import annotations

import datetime
import functools
import json
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import jinja2
import optuna
from markupsafe import Markup

from autotune.errors import UsageError
from autotune.outcome.results import finite_number
from autotune.profiles import report_figures as charts
from autotune.profiles.best_vs_baseline import compare
from autotune.profiles.report_figures import FIGURE_HEIGHT, text_of
from autotune.store.record import TrialRecord, counts_text
from autotune.store.study_view import backing_text, best_view, objectives, pick, trial_views
from autotune.util.text import counted
from autotune.util.units import with_unit

FIGURE_CLASS = "autotune-figure"
"""Class of the element wrapping each chart (its plotly div is ``id="fig-<name>"``)."""
TEMPLATE = "report.html.j2"


@functools.lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.PackageLoader("autotune.profiles", "templates"), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, keep_trailing_newline=True)
    env.filters["fmt"] = text_of
    return env


# -- reading the analysis ---------------------------------------------------------------------
def importance_rows(target: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One target's importances (``explain(study)["importance"]["objective"|"feasibility"]``) as
    ``[{"parameter", "importance", "low", "high", "verdict"}]``, in the analysis' order (most
    important first); importance, low and high are None for a parameter the analysis only gives a
    verdict for ("not varied")."""
    return [{"parameter": name, "importance": p.get("median"), "low": p.get("low"), "high": p.get("high"),
             "verdict": p["verdict"]} for name, p in target["params"].items()]


def importance_sets(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The analysis' two importances: ``[{"target", "rows", "verdict", "method"}]``.

    ``target``: ``objective`` (over the feasible trials), then ``feasibility`` (over the finished
    ones); a multi-objective study has ``objective-0``, ``objective-1``, ... (each with its
    ``metric``) in place of ``objective``. ``verdict``: the analysis' word on the whole target when it is not ``ok`` (e.g. ``not
    enough trials (4, need 20)``), else None; ``sureness``: else how far its trials go, in words. No analysis
    (``doc`` empty): none.
    """
    imp = doc.get("importance")
    if imp is None:
        return []
    parts = [("objective", imp["objective"]), ("feasibility", imp["feasibility"])]
    if imp.get("objectives"):  # a multi-objective study: one set per objective instead of the first's alone
        parts = [(f"objective-{i}", o) for i, o in enumerate(imp["objectives"])] + parts[1:]
    return [{"target": target, "rows": importance_rows(part),
             "verdict": None if part["verdict"] == "ok" else str(part["verdict"]),
             "sureness": part.get("sureness") if part["verdict"] == "ok" else None,
             "method": imp["method"], **({"metric": part["metric"]} if "metric" in part else {})}
            for target, part in parts]


def _measured(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows with a share (and its interval): the parameters the study varied."""
    return [r for r in rows if r["importance"] is not None]


def _rule_parameters(rule: Mapping[str, Any], names: Iterable[str]) -> list[str]:
    """The parameters of the rule's conditions that the trials have, in the rule's order."""
    known = set(names)
    return [c["param"] for c in rule["conditions"] if c["param"] in known]


def top_parameters(imps: list[dict[str, Any]], rules: list[Mapping[str, Any]], views: list[TrialRecord], n: int = 2) -> list[str]:
    """The ``n`` parameters for the feasibility map: those the crash rules name first (the
    parameters that explain the failures, in the rules' order), then the most important
    (``imps``: rows of one or more importances, the feasibility's first where given; a parameter
    ranks by its largest share in any), then the rest in the order trials list them, those the
    trials varied before those they did not (an axis with one value maps nothing)."""
    names: list[str] = []
    for v in views:
        for k in v.params:
            if k not in names:
                names.append(k)
    varied = {k for k in names if len({repr(v.params.get(k)) for v in views}) > 1}
    names = [k for k in names if k in varied] + [k for k in names if k not in varied]
    share: dict[str, float] = {}
    for r in imps:
        if r["importance"] is not None and r["parameter"] in names:
            share[r["parameter"]] = max(share.get(r["parameter"], float("-inf")), r["importance"])
    out = [p for r in rules for p in _rule_parameters(r, names)]
    out += sorted(share, key=lambda k: -share[k])
    out += names
    seen: list[str] = []
    for p in out:
        if p not in seen:
            seen.append(p)
    return seen[:n]


# -- sections ---------------------------------------------------------------------------------
_RULE_COLUMNS = ["when", "fails with", "failed of covered", "other failures", "trials explained", "p-value",
                 "not told apart from", "or as surely"]


def _rules(rules: list[Mapping[str, Any]], doc: Mapping[str, Any]) -> dict[str, Any]:
    """The crash rules' table, what their derived quantities mean, the failures no rule explains."""
    rows = [[r["condition"], r["kind"], f"{r['support']['failed']} of {r['support']['covered']}", r["other_failures"],
             r["trials"], r["p_value"], r["confounded_with"], r["as_sure"]] for r in rules]
    unexplained = doc["unexplained_failures"]
    left = None
    if unexplained["count"]:
        left = {"text": f"{counted(unexplained['count'], 'failure')} explained by no rule",
                "kinds": ", ".join(f"{k} x{n}" for k, n in unexplained["kinds"].items()),
                "trials": unexplained["trials"], "local": unexplained["at_one_configuration"]}
    return {"headers": _RULE_COLUMNS, "rows": rows,
            "derived": {k: v for r in rules for k, v in (r.get("derived") or {}).items()}, "unexplained": left,
            "settings": ", ".join(f"{k}={text_of(v)}" for k, v in doc["rule_settings"].items())}


_ABLATION_SUMMARY = {"parameters", "best_trial", "baseline_trial", "best_mean", "best_n", "baseline_mean", "baseline_n",
                     "gain", "run", "date", "interval"}


def _ablation(doc: Any) -> dict[str, Any]:
    """The ablation stored on the study (``autotune study ablate``): none, a document read as
    it is when it is not a mapping, else its summary, table and the rest of it."""
    out: dict[str, Any] = {"none": not doc, "raw": None, "summary": [], "headers": [], "rows": [], "rest": None}
    if not doc:
        return out
    if not isinstance(doc, Mapping):
        out["raw"] = json.dumps(doc, indent=2, default=str, ensure_ascii=False)
        return out
    t = {k: text_of(doc.get(k)) for k in _ABLATION_SUMMARY}
    if "best_trial" in doc or "baseline_trial" in doc:
        out["summary"].append(f"best trial {t['best_trial']} (mean {t['best_mean']}, n={t['best_n']}) vs the baseline "
                              f"trial {t['baseline_trial']} (mean {t['baseline_mean']}, n={t['baseline_n']}): "
                              f"gain {t['gain']}")
    if doc.get("run") or doc.get("date"):
        out["summary"].append(f"run {t['run']}, {t['date']}")
    rows = [r for r in doc.get("parameters") or [] if isinstance(r, Mapping)]
    if rows:
        level = finite_number(doc.get("interval"))
        out["headers"] = ["parameter", "best", "baseline", "mean reverted", "share of the gain",
                          f"interval ({level:.0%})" if level else "interval", "measured", "failed"]
        out["rows"] = [[r.get("parameter"), r.get("best"), r.get("baseline"), r.get("mean"), r.get("share"),
                        "" if r.get("share_low") is None else f"{text_of(r.get('share_low'))} .. {text_of(r.get('share_high'))}",
                        r.get("measured"), ", ".join(map(str, r.get("failed") or []))] for r in rows]
    rest = {k: v for k, v in doc.items() if k not in _ABLATION_SUMMARY}
    if rest:
        out["rest"] = json.dumps(rest, indent=2, default=str, ensure_ascii=False)
    return out


def _profile(study: optuna.Study, storage: str, best: TrialRecord | None) -> dict[str, Any] | None:
    """The profile ``autotune export`` writes for the best trial, as its ``sh`` format (``yaml``
    when an env name is not a shell name); None without a feasible trial."""
    if best is None:
        return None
    from autotune.profiles.export import from_study
    from autotune.profiles.formats import render

    prof, _ = from_study(study, storage)
    fmt = "sh"
    try:
        text = render("sh", prof, with_record=False)  # the record verify reads is the exported file's
    except UsageError:  # an env name that is not a shell name: the data format instead
        fmt, text = "yaml", render("yaml", prof)
    return {"trial": prof["trial"], "metric": prof["metric"], "value": prof["value"], "text": text,
            "command": f"autotune export {study.study_name} --format {fmt} -o profile.{fmt}"}


def _trial_rows(views: list[TrialRecord], best: TrialRecord | None) -> list[list[Any]]:
    rows = []
    for v in views:
        msg = text_of(v.failure.message if v.failure else (v.early_stop or {}).get("message"))
        rows.append([f"{v.number}" + (" (baseline)" if v.baseline else "") + (" (best)" if best and v.number == best.number else ""),
                     v.outcome, v.state, v.value, v.failure_kind or "", msg if len(msg) <= 200 else msg[:199] + "…",
                     " ".join(f"{k}={text_of(p)}" for k, p in v.params.items()),
                     "" if v.duration_s is None else f"{v.duration_s:.1f}s"])
    return rows


def _figure(name: str, make: Callable[[], Any], caption: str = "") -> dict[str, Any]:
    """The chart ``make()`` returns (a figure, or ``(figure, caption)``) as the template's
    ``figure`` macro takes it: its div (None when there is no chart), its caption, or why it
    could not be drawn."""
    try:
        fig = make()
        if isinstance(fig, tuple):
            fig, caption = fig
        html = None if fig is None else Markup(charts.figure_html(name, fig))  # plotly's own markup
    except Exception as exc:  # noqa: BLE001 - one chart that cannot be drawn is said so, not fatal
        return {"name": name, "html": None, "caption": "", "error": f"{type(exc).__name__}: {exc}"}
    return {"name": name, "html": html, "caption": caption, "error": None}


def _launch(study: optuna.Study, views: list[TrialRecord], best: TrialRecord | None,
            goals: list[Any]) -> dict[str, Any] | None:
    """What to launch and why: the best's changes from the baseline, what backs its figures, and
    the best against the baseline on every metric (:func:`autotune.profiles.best_vs_baseline.compare`)."""
    if best is None:
        return None
    doc = compare(views, best, {g.metric: g.direction for g in goals})
    if best.baseline:
        changes = "the baseline itself: no configuration measured better"
    elif doc["changed"]:
        changes = "changes from the baseline: " + " ".join(f"{k}={text_of(p)}" for k, p in doc["changed"].items())
    else:
        changes = "no change from the baseline"
    backing = backing_text(best.measured) if best.measured is not None else "1 measurement, no interval"
    headers = ["metric", "unit", f"best (trial {best.number})", "95% interval",
               "baseline" + ("" if doc["baseline"] is None else f" (trial {doc['baseline']})"), "vs baseline"]
    rows = [[r["metric"], r["unit"], r["best"], "" if r["interval"] is None else
             f"{text_of(r['interval'][0])} .. {text_of(r['interval'][1])}", r["baseline"], r["change"]]
            for r in doc["rows"]]
    return {"trial": best.number, "changes": changes, "backing": backing, "note": doc["note"],
            "headers": headers, "rows": rows,
            "runs": f"trial{'s' if len(doc['runs']) != 1 else ''} {', '.join(map(str, doc['runs']))}",
            "command": f"autotune export {study.study_name} --format sh -o profile.sh"}


def _summary(study: optuna.Study, views: list[TrialRecord], best: TrialRecord | None, metric: str) -> str:
    goals = objectives(study)
    if len(goals) == 1:
        figure_of = "" if best is None or best.measured is None else f" ({backing_text(best.measured)})"
        return (f"{counts_text(views)}; objective: {goals[0].direction} {metric}"
                + (f"; best: trial {best.number}, {metric} = {with_unit(best.value, metric)}{figure_of}"
                   if best else "; no feasible trial yet"))
    chosen = pick(study, views)
    listed = f"{len(views)} trials; objectives: " + ", ".join(f"{g.direction} {g.metric}" for g in goals)
    if chosen is None or best is None:
        return listed + "; no feasible trial yet"
    return (listed + f"; Pareto front: trials {', '.join(map(str, chosen.front))}; chosen: trial {best.number} ("
            + ", ".join(f"{g.metric} = {text_of(x)}" for g, x in zip(goals, best.values or [])) + ") by the rule "
            + chosen.text)


def build_report(study: optuna.Study, storage: str, *, analysis: Mapping[str, Any] | None = None) -> str:
    """The report of ``study`` (stored in ``storage``) as one HTML document.

    ``analysis``: the document of :func:`autotune.analysis.explain.explain` (computed when None).

    Raises:
        UsageError: the study has no trials.
    """
    import plotly.offline

    views = trial_views(study)
    if not views:
        raise UsageError(f"study '{study.study_name}' has no trials yet: nothing to report")
    metric = str((study.user_attrs.get("objective") or {}).get("metric") or "value")
    goals = objectives(study)
    multi = len(goals) > 1
    best = best_view(study)
    problem = ""
    if analysis is None:
        from autotune.analysis.explain import explain

        try:
            analysis = explain(study)
        except Exception as exc:  # noqa: BLE001 - the rest of the report is still worth having
            analysis, problem = {}, f"{type(exc).__name__}: {exc}"
    doc: Mapping[str, Any] = analysis
    sets = importance_sets(doc)
    imps = [r for st in sets for r in st["rows"]]
    rules: list[Mapping[str, Any]] = doc.get("failure_rules", [])
    sub = charts.feasible_study(study)

    pareto = None
    if multi:
        pareto = _figure("pareto", lambda: charts.pareto(sub, goals),
                         "every measured trial; the front's trials are not beaten on every objective at once"
                         if sub is not None else "no feasible trial yet")
    history = _figure("history", lambda: charts.history(sub, metric, best),
                      "every measured trial's objective and the best single run so far; the dashed line is the best "
                      "as study best chooses it (a configuration measured again is judged on its runs after the "
                      "first); infeasible trials are not measured, and trials stopped early have no final value"
                      + (f" (the first objective, {metric})" if multi else ""))
    titles = {"objective": f"What moves {metric} (over the feasible trials)",
              "feasibility": "What decides whether a trial is feasible (over the finished trials)"}
    importances = []
    for st in sets:
        name = "importance" if st["target"] == "objective" else f"importance-{st['target']}"
        title = titles.get(st["target"]) or f"What moves {st.get('metric', metric)} (over the feasible trials)"
        rated = _measured(st["rows"])
        importances.append({
            "title": title, "verdict": st["verdict"] or st["sureness"],  # the analysis' word, or how sure it is
            "figure": _figure(name, lambda st=st, title=title: charts.importance(st["rows"], title), st["method"])
            if rated else None,
            "rows": [[r["parameter"], r["importance"], r["low"], r["high"], r["verdict"]] for r in st["rows"]]})

    feasible_first = [r for st in sets if st["target"] == "feasibility" for r in st["rows"]]
    pair = top_parameters(feasible_first + imps, rules, views)
    feasibility = None
    if pair:
        named = {p for r in rules for p in _rule_parameters(r, pair)}
        rated_names = {r["parameter"] for r in imps if r["importance"] is not None}
        why = {p: "named by a crash rule" if p in named else "important" if p in rated_names else "varied by the trials"
               for p in pair}
        over = ", ".join(f"{p} ({why[p]})" for p in pair)
        feasibility = _figure("feasibility", lambda: charts.feasibility(views, pair, metric),
                              f"each trial over {over}; the axes are the parameters the crash rules name, then the "
                              f"most important for feasibility: circles were measured (colour: {metric}), open circles "
                              "stopped early, crosses failed (one colour per failure kind); a marker's size grows with "
                              "the trials at its point, and markers of different kinds at one point are set apart")
    stored_ablation = study.user_attrs.get("ablation")
    ablation = _ablation(stored_ablation)
    ablation["figure"] = (_figure("ablation", lambda: charts.ablation(stored_ablation))
                          if isinstance(stored_ablation, Mapping) else None)

    page = _environment().get_template(TEMPLATE).render(
        name=study.study_name, summary=_summary(study, views, best, metric),
        outcomes=sorted(Counter(str(v.outcome) for v in views).items()),
        blames=Counter(f"{v.failure_kind} ({v.blame})" for v in views if v.failure_kind).most_common(),
        problem=problem, launch=_launch(study, views, best, goals), pareto=pareto, history=history, importances=importances, feasibility=feasibility,
        parallel=_figure("parallel", lambda: charts.parallel(sub, metric),
                         "feasible trials only" if sub is not None else "no feasible trial yet"),
        rules=None if problem else _rules(rules, doc), ablation=ablation, profile=_profile(study, storage, best),
        trials=_trial_rows(views, best), figure_class=FIGURE_CLASS, figure_height=FIGURE_HEIGHT,
        now=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        plotly_js=Markup(plotly.offline.get_plotlyjs()))
    return page
