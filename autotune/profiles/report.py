"""``autotune report NAME -o report.html``: one self-contained HTML page about a study.

Sections: outcomes, optimization history, parameter importances with their intervals (for the
objective and for feasibility), a feasibility map over the two most important parameters, parallel
coordinates, the crash rules, the ablation, the best profile and every trial in one table.

Contracts:

- One document, no network: plotly.js is embedded inline once; every chart is a plotly figure
  (Optuna's ``optuna.visualization`` where one fits, else ``plotly.graph_objects``) drawn by it
  in the browser. Each chart is a ``<div id="fig-...">`` with class :data:`FIGURE_CLASS`.
- All user data (names, values, failure messages, the profile) is HTML-escaped in the page; in
  the figures' JSON ``<`` is escaped by plotly, so nothing in a value can end a script.
- The analysis is :func:`autotune.analysis.explain.explain`'s document, read as it is; a failing
  analysis is reported in the page rather than losing the rest of it.
- The best profile is ``autotune export``'s (:func:`autotune.profiles.export.from_study`: memory back-off
  and provenance included), shown as its ``sh`` format.
"""

from __future__ import annotations

import datetime
import html
import json
import math
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import optuna
from optuna.trial import TrialState

from autotune.util.text import counted
from autotune.errors import UsageError
from autotune.outcome.results import finite_number
from autotune.store.study_view import backing_text, best_view, is_multi_objective, objectives, pick, trial_views
from autotune.store.record import TrialRecord, counts_text, is_feasible_measurement
from autotune.util.units import unit_of, with_unit

FIGURE_CLASS = "autotune-figure"
"""Class of the element wrapping each chart (its plotly div is ``id="fig-<name>"``)."""
FIGURE_HEIGHT = 460


def _e(value: Any) -> str:
    """``value`` as escaped HTML text."""
    return html.escape(value if isinstance(value, str) else _fmt(value), quote=True)


def _fmt(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(_fmt(v) for v in value)
    if isinstance(value, dict):
        return json.dumps(value, default=str, ensure_ascii=False)
    return str(value)


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
    enough trials (4, need 20)``), else None. No analysis (``doc`` empty): none.
    """
    imp = doc.get("importance")
    if imp is None:
        return []
    parts = [("objective", imp["objective"]), ("feasibility", imp["feasibility"])]
    if imp.get("objectives"):  # a multi-objective study: one set per objective instead of the first's alone
        parts = [(f"objective-{i}", o) for i, o in enumerate(imp["objectives"])] + parts[1:]
    return [{"target": target, "rows": importance_rows(part),
             "verdict": None if part["verdict"] == "ok" else str(part["verdict"]),
             "method": imp["method"], **({"metric": part["metric"]} if "metric" in part else {})}
            for target, part in parts]


def _measured(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows with a share (and its interval): the parameters the study varied."""
    return [r for r in rows if r["importance"] is not None]


def _rule_parameter(rule: Mapping[str, Any], names: Iterable[str]) -> str | None:
    """The parameter of the rule's first condition, when the trials have it."""
    param = rule["conditions"][0]["param"]
    return param if param in set(names) else None


def top_parameters(imps: list[dict[str, Any]], rules: list[Mapping[str, Any]], views: list[TrialRecord], n: int = 2) -> list[str]:
    """The ``n`` parameters for the feasibility map: the most important first (``imps``: rows of
    one or more importances; a parameter ranks by its largest share in any), then those the
    crash rules name, then the rest in the order trials list them, those the trials varied
    before those they did not (an axis with one value maps nothing)."""
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
    out = sorted(share, key=lambda k: -share[k])
    out += [p for p in (_rule_parameter(r, names) for r in rules) if p]
    out += names
    seen: list[str] = []
    for p in out:
        if p not in seen:
            seen.append(p)
    return seen[:n]


# -- figures ----------------------------------------------------------------------------------
def _quiet(make: Callable[[], Any]) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return make()


def _feasible_study(study: optuna.Study) -> optuna.Study | None:
    """An in-memory copy of ``study`` with only its feasible trials (None if there are none)."""
    feasible = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if is_feasible_measurement(t)]
    if not feasible:
        return None
    sub = optuna.create_study(directions=study.directions)
    sub.add_trials(feasible)
    return sub


def _history(sub: optuna.Study | None, metric: str, best: TrialRecord | None) -> Any:
    """The measured trials' values in order with Optuna's best-so-far line (single runs), and the
    best as ``study best`` chooses it as a line of its own, named: the two differ where a
    configuration measured again read lower than its first run."""
    from optuna.visualization import plot_optimization_history

    if sub is None:
        return None
    name = f"{metric} ({unit_of(metric)})" if unit_of(metric) else metric
    if is_multi_objective(sub):  # the first objective's history (the Pareto front has its own chart)
        return _quiet(lambda: plot_optimization_history(sub, target=lambda t: t.values[0], target_name=name))
    fig = _quiet(lambda: plot_optimization_history(sub, target_name=name))
    if best is not None and best.value is not None:
        how = "" if best.measured is None or not best.measured.first_excluded else ", the mean of its runs after the first"
        fig.add_hline(y=best.value, line_dash="dash", line_color="green",
                      annotation_text=f"the best (study best): trial {best.number}, {with_unit(best.value, metric)}{how}",
                      annotation_position="bottom right")
    return fig


def _pareto(sub: optuna.Study | None, goals: list[Any]) -> Any:
    from optuna.visualization import plot_pareto_front

    if sub is None:
        return None
    return _quiet(lambda: plot_pareto_front(sub, target_names=[g.metric for g in goals]))


def _importance_figure(rows: list[dict[str, Any]], title: str) -> Any:
    """Importances with their intervals as error bars (None when no parameter was varied)."""
    import plotly.graph_objects as go

    rows = list(reversed(_measured(rows)))  # plotly draws the first bar at the bottom
    if not rows:
        return None
    fig = go.Figure(go.Bar(
        x=[r["importance"] for r in rows], y=[r["parameter"] for r in rows], orientation="h",
        error_x={"type": "data", "symmetric": False,
                 "array": [max(0.0, r["high"] - r["importance"]) for r in rows],
                 "arrayminus": [max(0.0, r["importance"] - r["low"]) for r in rows]},
        text=[r["verdict"] or "" for r in rows], hovertemplate="%{y}: %{x:.3f} (%{text})<extra></extra>"))
    fig.update_layout(title=title, xaxis_title="share of the variance (median, with its interval)", yaxis_title="")
    return fig


def _axis_values(values: list[Any]) -> list[Any]:
    """Values for one plot axis: numbers stay numbers; anything else (or a mix) becomes text."""
    if all(finite_number(v) is not None for v in values):
        return values
    return [_fmt(v) for v in values]


def _feasibility_figure(views: list[TrialRecord], params: list[str], metric: str) -> Any:
    """Every measured trial over the two parameters: feasible ones coloured by the objective,
    stopped ones (load stopped early) as open circles, infeasible ones as crosses, one trace per
    failure kind."""
    import plotly.graph_objects as go

    rows = [v for v in views if v.outcome in ("ok", "stopped", "infeasible")
            and all(v.params.get(p) is not None for p in params)]
    x_name = params[0]
    y_name = params[1] if len(params) > 1 else None
    xs = _axis_values([v.params[x_name] for v in rows])
    ys = _axis_values([v.params[y_name] for v in rows]) if y_name else [0] * len(rows)
    at = {v.number: (x, y) for v, x, y in zip(rows, xs, ys)}

    def hover(v: TrialRecord) -> str:
        lines = [f"trial {v.number}" + (" (baseline)" if v.baseline else ""), f"outcome: {v.outcome}"]
        if v.value is not None:
            lines.append(f"{metric}: {v.value:.4g}")
        if v.failure:
            lines.append(f"{v.failure_kind}: {_fmt(v.failure.message)[:160]}")
        if v.early_stop:
            lines.append(_fmt(v.early_stop.get("message"))[:160])
        return "<br>".join(html.escape(s) for s in lines)

    fig = go.Figure()
    ok = [v for v in rows if v.value is not None]
    fig.add_trace(go.Scatter(
        name="feasible", mode="markers", x=[at[v.number][0] for v in ok], y=[at[v.number][1] for v in ok],
        text=[hover(v) for v in ok], hoverinfo="text",
        marker={"size": 11, "symbol": "circle", "color": [v.value for v in ok], "colorscale": "Viridis",
                "showscale": bool(ok), "colorbar": {"title": {"text": metric}}, "line": {"width": 1, "color": "#333"}}))
    stopped = [v for v in rows if v.outcome == "stopped"]
    if stopped:
        fig.add_trace(go.Scatter(
            name="stopped early", mode="markers", x=[at[v.number][0] for v in stopped],
            y=[at[v.number][1] for v in stopped], text=[hover(v) for v in stopped], hoverinfo="text",
            marker={"size": 11, "symbol": "circle-open", "line": {"width": 2}}))
    by_kind: dict[str, list[TrialRecord]] = {}
    for v in rows:
        if v.value is None and v.outcome != "stopped":
            by_kind.setdefault(v.failure_kind or v.outcome, []).append(v)
    for kind, members in sorted(by_kind.items()):
        fig.add_trace(go.Scatter(
            name=f"infeasible: {kind}", mode="markers", x=[at[v.number][0] for v in members],
            y=[at[v.number][1] for v in members], text=[hover(v) for v in members], hoverinfo="text",
            marker={"size": 12, "symbol": "x", "line": {"width": 1}}))
    fig.update_layout(title="Feasibility: " + (f"{x_name} x {y_name}" if y_name else x_name),
                      xaxis_title=x_name, yaxis_title=y_name or "", legend={"orientation": "h", "y": -0.2})
    if y_name is None:
        fig.update_yaxes(visible=False)
    return fig


def _parallel(sub: optuna.Study | None, metric: str) -> Any:
    from optuna.visualization import plot_parallel_coordinate

    if sub is None:
        return None
    if len(sub.directions) > 1:  # coloured by the first objective
        return _quiet(lambda: plot_parallel_coordinate(sub, target=lambda t: t.values[0], target_name=metric))
    return _quiet(lambda: plot_parallel_coordinate(sub, target_name=metric))


def _ablation_figure(doc: Mapping[str, Any]) -> tuple[Any, str] | None:
    import plotly.graph_objects as go

    rows = [r for r in doc.get("parameters") or [] if isinstance(r, Mapping) and finite_number(r.get("share")) is not None]
    if not rows:
        return None
    lo = [finite_number(r.get("share_low")) for r in rows]
    hi = [finite_number(r.get("share_high")) for r in rows]
    shares = [float(r["share"]) for r in rows]
    bar = go.Bar(x=[str(r.get("parameter")) for r in rows], y=shares, hovertemplate="%{x}: %{y:.2f}<extra></extra>")
    if all(x is not None for x in lo + hi):
        bar.error_y = {"type": "data", "symmetric": False,
                       "array": [max(0.0, h - s) for h, s in zip(hi, shares)],  # type: ignore[operator]
                       "arrayminus": [max(0.0, s - low) for low, s in zip(lo, shares)]}  # type: ignore[operator]
    fig = go.Figure(bar)
    fig.update_layout(title="Ablation: share of the gain lost when the parameter is reverted",
                      yaxis_title="share of the gain", xaxis_title="parameter reverted to the baseline")
    return fig, "each parameter's share of the best trial's gain over the baseline, with its interval"


def _figure_html(name: str, fig: Any) -> str:
    import plotly.io as pio

    fig.update_layout(height=FIGURE_HEIGHT, margin={"l": 70, "r": 30, "t": 60, "b": 60})
    return pio.to_html(fig, full_html=False, include_plotlyjs=False, div_id=f"fig-{name}",
                       config={"displaylogo": False, "responsive": True})


# -- sections ---------------------------------------------------------------------------------
def _table(headers: list[str], rows: Iterable[Iterable[Any]]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


_RULE_COLUMNS = ("when", "fails with", "failed of covered", "other failures", "trials explained", "p-value",
                 "not told apart from", "or as surely")


def _rules_html(rules: list[Mapping[str, Any]], doc: Mapping[str, Any]) -> str:
    out = ""
    if not rules:
        out += "<p>No crash rule: no parameter value or range explains the failures.</p>"
    else:
        out += _table(list(_RULE_COLUMNS), ([r["condition"], r["kind"], f"{r['support']['failed']} of {r['support']['covered']}",
                                             r["other_failures"], r["trials"], r["p_value"], r["confounded_with"],
                                             r["as_sure"]]
                                            for r in rules))
        derived = {k: v for r in rules for k, v in (r.get("derived") or {}).items()}
        out += "".join(f"<p class=note>{_e(k)}: {_e(v)}.</p>" for k, v in derived.items())
    unexplained = doc["unexplained_failures"]
    if unexplained["count"]:
        kinds = unexplained["kinds"]
        out += (f"<p>{_e(counted(unexplained['count'], 'failure'))} explained by no rule"
                + (f" ({_e(', '.join(f'{k} x{n}' for k, n in kinds.items()))})" if kinds else "")
                + f": trials {_e(unexplained['trials'])}.</p>")
        for local in unexplained["at_one_configuration"]:
            out += f"<p>{_e(local['text'])}: trials {_e(local['trials'])}.</p>"
    settings = doc["rule_settings"]
    out += f"<p class=note>Rule settings: {_e(', '.join(f'{k}={_fmt(v)}' for k, v in settings.items()))}.</p>"
    return out


def _importance_html(imps: list[dict[str, Any]], verdict: str | None) -> str:
    out = f"<p>{_e(verdict)}.</p>" if verdict else ""
    if not imps:
        return out
    return out + _table(["parameter", "share", "low", "high", "verdict"],
                        ([r["parameter"], r["importance"], r["low"], r["high"], r["verdict"]] for r in imps))


def _ablation_html(study_name: str, doc: Any) -> str:
    if not doc:
        return f"<p>No ablation run yet (<code>autotune study ablate {_e(study_name)}</code>).</p>"
    if not isinstance(doc, Mapping):
        return f"<pre>{_e(json.dumps(doc, indent=2, default=str, ensure_ascii=False))}</pre>"
    summary = []
    if "best_trial" in doc or "baseline_trial" in doc:
        summary.append(f"best trial {_e(doc.get('best_trial'))} (mean {_e(doc.get('best_mean'))}, n={_e(doc.get('best_n'))}) "
                       f"vs the baseline trial {_e(doc.get('baseline_trial'))} (mean {_e(doc.get('baseline_mean'))}, "
                       f"n={_e(doc.get('baseline_n'))}): gain {_e(doc.get('gain'))}")
    if doc.get("run") or doc.get("date"):
        summary.append(f"run {_e(doc.get('run'))}, {_e(doc.get('date'))}")
    out = "".join(f"<p>{s}</p>" for s in summary)
    rows = [r for r in doc.get("parameters") or [] if isinstance(r, Mapping)]
    if rows:
        level = finite_number(doc.get("interval"))
        ci = f"interval ({level:.0%})" if level else "interval"
        out += _table(["parameter", "best", "baseline", "mean reverted", "share of the gain", ci, "measured", "failed"],
                      ([r.get("parameter"), r.get("best"), r.get("baseline"), r.get("mean"), r.get("share"),
                        "" if r.get("share_low") is None else f"{_fmt(r.get('share_low'))} .. {_fmt(r.get('share_high'))}",
                        r.get("measured"), ", ".join(map(str, r.get("failed") or []))] for r in rows))
        out += "<p class=note>Shares need not add up to 1: parameters interact.</p>"
    rest = {k: v for k, v in doc.items() if k not in {"parameters", "best_trial", "baseline_trial", "best_mean", "best_n",
                                                        "baseline_mean", "baseline_n", "gain", "run", "date", "interval"}}
    if rest:
        out += f"<details><summary>the rest of the ablation</summary><pre>{_e(json.dumps(rest, indent=2, default=str, ensure_ascii=False))}</pre></details>"
    return out


def _profile_html(study: optuna.Study, storage: str, best: TrialRecord | None, metric: str) -> str:
    """The profile ``autotune export`` writes for the best trial, as its ``sh`` format (``yaml``
    when an env name is not a shell name)."""
    if best is None:
        return "<p>No feasible trial yet: no profile to export.</p>"
    from autotune.profiles.export import from_study, render

    prof, _ = from_study(study, storage)
    fmt = "sh"
    try:
        text = render("sh", prof)
    except UsageError:  # an env name that is not a shell name: the data format instead
        fmt, text = "yaml", render("yaml", prof)
    cmd = f"autotune export {study.study_name} --format {fmt} -o profile.{fmt}"
    return (f"<p>Trial {_e(prof['trial'])}: {_e(metric)} = {_e(prof['value'])}. "
            f"Export it with <code>{_e(cmd)}</code>.</p><pre class=profile>{_e(text)}</pre>")


def _trials_html(views: list[TrialRecord], best: TrialRecord | None) -> str:
    rows = []
    for v in views:
        msg = _fmt(v.failure.message if v.failure else (v.early_stop or {}).get("message"))
        rows.append([f"{v.number}" + (" (baseline)" if v.baseline else "") + (" (best)" if best and v.number == best.number else ""),
                     v.outcome, v.state, v.value, v.failure_kind or "", msg if len(msg) <= 200 else msg[:199] + "…",
                     " ".join(f"{k}={_fmt(p)}" for k, p in v.params.items()),
                     "" if v.duration_s is None else f"{v.duration_s:.1f}s"])
    return _table(["#", "outcome", "state", "value", "failure", "message", "parameters as applied", "time"], rows)


_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:2em auto;max-width:1200px;padding:0 1em;color:#222}
h1{font-size:1.6em}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:2em}
table{border-collapse:collapse;font-size:.9em;margin:.5em 0}th,td{border:1px solid #ddd;padding:.25em .5em;text-align:left;vertical-align:top}
th{background:#f4f4f4}code,pre{font-family:ui-monospace,Menlo,Consolas,monospace}pre{background:#f7f7f7;padding:.8em;overflow-x:auto;font-size:.85em}
.note{color:#666;font-size:.9em}.autotune-figure{margin:1em 0;min-height:""" + str(FIGURE_HEIGHT) + "px}"


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
    objective = study.user_attrs.get("objective") or {}
    metric = str(objective.get("metric") or "value")
    goals = objectives(study)
    direction = goals[0].direction
    best = best_view(study)
    chosen = pick(study, views) if len(goals) > 1 else None
    problem = ""
    if analysis is None:
        from autotune.analysis.explain import explain

        try:
            analysis = explain(study)
        except Exception as exc:  # noqa: BLE001 - the rest of the report is still worth having
            analysis, problem = {}, f"{type(exc).__name__}: {exc}"
    doc: Mapping[str, Any] = analysis
    failed = "<p>No analysis: it failed (above).</p>"
    sets = importance_sets(doc)
    imps = [r for st in sets for r in st["rows"]]
    rules: list[Mapping[str, Any]] = doc.get("failure_rules", [])
    sub = _feasible_study(study)

    figures: dict[str, str] = {}

    def figure(name: str, make: Callable[[], Any], caption: str = "") -> str:
        """The chart ``make()`` returns (a figure, or ``(figure, caption)``), or a line saying
        why there is none."""
        try:
            fig = make()
            if isinstance(fig, tuple):
                fig, caption = fig
            if fig is None:
                return f"<p class=note>{_e(caption)}</p>" if caption else ""
            figures[name] = _figure_html(name, fig)
        except Exception as exc:  # noqa: BLE001 - one chart that cannot be drawn is said so, not fatal
            return f"<p class=note>This chart could not be drawn: {_e(type(exc).__name__)}: {_e(str(exc))}</p>"
        cap = f"<p class=note>{_e(caption)}</p>" if caption else ""
        return f'<div class="{FIGURE_CLASS}" data-figure="{_e(name)}">{figures[name]}</div>{cap}'

    outcomes = Counter(str(v.outcome) for v in views)
    kinds = Counter(str(v.failure_kind) for v in views if v.failure_kind)
    blames = Counter(f"{v.failure_kind} ({v.blame})" for v in views if v.failure_kind)
    parts: list[str] = []
    parts.append(f"<h1>autotune report: {_e(study.study_name)}</h1>")
    if chosen is not None and best is not None:
        summary = (f"{len(views)} trials; objectives: " + ", ".join(f"{g.direction} {g.metric}" for g in goals)
                   + f"; Pareto front: trials {', '.join(map(str, chosen.front))}; chosen: trial {best.number} ("
                   + ", ".join(f"{g.metric} = {_fmt(x)}" for g, x in zip(goals, best.values or [])) + ") by the rule "
                   + chosen.text)
    elif len(goals) > 1:
        summary = (f"{len(views)} trials; objectives: " + ", ".join(f"{g.direction} {g.metric}" for g in goals)
                   + "; no feasible trial yet")
    else:
        figure_of = "" if best is None or best.measured is None else f" ({backing_text(best.measured)})"
        summary = (f"{counts_text(views)}; objective: {direction} {metric}"
                   + (f"; best: trial {best.number}, {metric} = {with_unit(best.value, metric)}{figure_of}"
                      if best else "; no feasible trial yet"))
    parts.append(f"<p>{_e(summary)}</p>")
    parts.append(_table(["outcome", "trials"], sorted(outcomes.items())))
    if kinds:
        parts.append(_table(["failure kind (blamed on)", "trials"], blames.most_common()))
    if problem:
        parts.append(f"<p class=note>The analysis (<code>autotune study explain</code>) failed: {_e(problem)}</p>")

    if len(goals) > 1:
        parts.append("<h2 id=pareto>Pareto front</h2>")
        parts.append(figure("pareto", lambda: _pareto(sub, goals),
                            "every measured trial; the front's trials are not beaten on every objective at once"
                            if sub is not None else "no feasible trial yet"))
    parts.append("<h2 id=history>Optimization history</h2>")
    parts.append(figure("history", lambda: _history(sub, metric, best),
                        "every measured trial's objective and the best single run so far; the dashed line is the best "
                        "as study best chooses it (a configuration measured again is judged on its runs after the "
                        "first); infeasible trials are not measured, and trials stopped early have no final value"
                        + (f" (the first objective, {metric})" if len(goals) > 1 else "")))

    parts.append("<h2 id=importance>Parameter importances</h2>")
    titles = {"objective": f"What moves {metric} (over the feasible trials)",
              "feasibility": "What decides whether a trial is feasible (over the finished trials)"}
    if problem:
        parts.append(failed)
    for st in sets:
        name = "importance" if st["target"] == "objective" else f"importance-{st['target']}"
        title = titles.get(st["target"]) or f"What moves {st.get('metric', metric)} (over the feasible trials)"
        parts.append(f"<h3>{_e(title)}</h3>")
        if _measured(st["rows"]):
            parts.append(figure(name, lambda st=st, title=title: _importance_figure(st["rows"], title), st["method"]))
        parts.append(_importance_html(st["rows"], st["verdict"]))

    pair = top_parameters(imps, rules, views)
    parts.append("<h2 id=feasibility>Feasibility map</h2>")
    if pair:
        rated = {r["parameter"] for r in imps if r["importance"] is not None}
        over = ("the two most important parameters" if all(p in rated for p in pair) else
                f"{' and '.join(pair)} (importance not rated yet: the parameters the crash rules name, then "
                "those the trials varied, in their order)")
        parts.append(figure("feasibility", lambda: _feasibility_figure(views, pair, metric),
                            f"each trial over {over}: circles were measured (colour: "
                            f"{metric}), crosses failed (one colour per failure kind)"))
    else:
        parts.append("<p>No parameter to map.</p>")

    parts.append("<h2 id=parallel>Parallel coordinates</h2>")
    parts.append(figure("parallel", lambda: _parallel(sub, metric),
                        "feasible trials only" if sub is not None else "no feasible trial yet"))

    parts.append("<h2 id=rules>Crash rules</h2>")
    parts.append(failed if problem else _rules_html(rules, doc))

    parts.append("<h2 id=ablation>Ablation</h2>")
    ablation = study.user_attrs.get("ablation")
    if isinstance(ablation, Mapping):
        parts.append(figure("ablation", lambda: _ablation_figure(ablation)))
    parts.append(_ablation_html(study.study_name, ablation))

    parts.append("<h2 id=profile>Best profile</h2>")
    parts.append(_profile_html(study, storage, best, metric))

    parts.append("<h2 id=trials>Trials</h2>")
    parts.append(_trials_html(views, best))
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    parts.append(f"<p class=note>Written by <code>autotune report</code> at {_e(now)}.</p>")

    plotly_js = plotly.offline.get_plotlyjs()
    return ("<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8>"
            f"<title>autotune report: {_e(study.study_name)}</title>"
            '<meta name=viewport content="width=device-width, initial-scale=1">'
            f"<style>{_CSS}</style>"
            f'<script type="text/javascript">{plotly_js}</script></head><body>\n'
            + "\n".join(parts) + "\n</body></html>\n")
