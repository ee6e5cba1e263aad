"""``autotune report NAME -o report.html``: one self-contained HTML page about a study.

Sections: outcomes, optimization history, parameter importances (with intervals when the
analysis gives them), a feasibility map over the two most important parameters, parallel
coordinates, the crash rules, the ablation, the best profile and every trial in one table.

Contracts:

- One document, no network: plotly.js is embedded inline once; every chart is a plotly figure
  (Optuna's ``optuna.visualization`` where one fits, else ``plotly.graph_objects``) drawn by it
  in the browser. Each chart is a ``<div id="fig-...">`` with class :data:`FIGURE_CLASS`.
- All user data (names, values, failure messages, the profile) is HTML-escaped in the page; in
  the figures' JSON ``<`` is escaped by plotly, so nothing in a value can end a script.
- The analysis (:func:`autotune.analysis.explain`) is read defensively: its rules and
  importances are shown whatever their shape (strings, numbers or records); a failing analysis
  is reported in the page rather than losing the rest of it.
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

from autotune.errors import UsageError
from autotune.study_view import TrialView, best_view, trial_views

FIGURE_CLASS = "autotune-figure"
"""Class of the element wrapping each chart (its plotly div is ``id="fig-<name>"``)."""
FIGURE_HEIGHT = 460

_IMPORTANCE_KEYS = ("importance", "mean", "value", "median", "estimate", "score")
_LOW_KEYS = ("low", "lo", "lower", "ci_low", "importance_low", "min", "q05", "p05")
_HIGH_KEYS = ("high", "hi", "upper", "ci_high", "importance_high", "max", "q95", "p95")
_PAIR_KEYS = ("interval", "ci", "range", "bounds")
_NAME_KEYS = ("parameter", "param", "name", "key")
_KNOWN_EXPLAIN_KEYS = {"study", "trials", "finished", "outcomes", "failure_kinds", "failure_rules", "rules",
                       "crash_rules", "unexplained_failures", "rule_settings", "metric", "importances", "importance",
                       "param_importances", "importance_intervals"}


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


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    f = float(value)
    return None if math.isnan(f) or math.isinf(f) else f


# -- reading the analysis ---------------------------------------------------------------------
def importance_rows(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The analysis' importances as ``[{"parameter", "importance", "low", "high", "verdict"}]``
    (low/high None when it gives no interval; importance None for a parameter it only gives a
    verdict for, e.g. "not varied"), most important first, whatever shape they come in: a
    mapping name -> number, name -> record, or a list of records."""
    raw = next((doc[k] for k in ("importances", "param_importances", "params") if doc.get(k)), None)
    items: list[tuple[Any, Any]] = []
    if isinstance(raw, Mapping):
        items = list(raw.items())
    elif isinstance(raw, (list, tuple)):
        items = [(None, r) for r in raw]
    extra = doc.get("importance_intervals") if isinstance(doc.get("importance_intervals"), Mapping) else {}
    rows = []
    for key, val in items:
        name, imp, lo, hi, verdict = key, None, None, None, None
        if isinstance(val, Mapping):
            name = next((val[k] for k in _NAME_KEYS if val.get(k) is not None), key)
            imp = next((_number(val[k]) for k in _IMPORTANCE_KEYS if _number(val.get(k)) is not None), None)
            lo = next((_number(val[k]) for k in _LOW_KEYS if _number(val.get(k)) is not None), None)
            hi = next((_number(val[k]) for k in _HIGH_KEYS if _number(val.get(k)) is not None), None)
            pair = next((val[k] for k in _PAIR_KEYS if isinstance(val.get(k), (list, tuple)) and len(val[k]) == 2), None)
            if pair is not None and lo is None and hi is None:
                lo, hi = _number(pair[0]), _number(pair[1])
            verdict = val.get("verdict")
        elif isinstance(val, (list, tuple)) and len(val) == 3 and key is not None:  # name: [imp, lo, hi]
            imp, lo, hi = (_number(x) for x in val)
        else:
            imp = _number(val)
        if name is None or (imp is None and verdict is None):
            continue
        pair = extra.get(name) if isinstance(extra, Mapping) else None
        if isinstance(pair, (list, tuple)) and len(pair) == 2 and lo is None and hi is None:
            lo, hi = _number(pair[0]), _number(pair[1])
        rows.append({"parameter": str(name), "importance": imp, "low": lo, "high": hi,
                     "verdict": None if verdict is None else str(verdict)})
    rows.sort(key=lambda r: (r["importance"] is None, -(r["importance"] or 0.0)))
    return rows


def importance_sets(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each importance the analysis gives: ``[{"target", "rows", "verdict", "method"}]``.

    ``target`` is ``objective`` (over the feasible trials) or ``feasibility`` (over the finished
    ones) when the analysis gives both (``importance: {objective: {params, verdict}, feasibility:
    ...}``); a flat ``importances`` is the objective's. ``verdict``: the analysis' word on the
    whole target (e.g. ``not enough trials (4, need 20)``), None when it gives none.
    """
    nested = doc.get("importance")
    out: list[dict[str, Any]] = []
    if isinstance(nested, Mapping) and any(isinstance(nested.get(t), Mapping) for t in ("objective", "feasibility")):
        for target in ("objective", "feasibility"):
            sub = nested.get(target)
            if isinstance(sub, Mapping):
                verdict = sub.get("verdict")
                out.append({"target": target, "rows": importance_rows(sub),
                            "verdict": None if verdict in (None, "ok") else str(verdict),
                            "method": nested.get("method")})
        return out
    return [{"target": "objective", "rows": importance_rows(doc), "verdict": None, "method": None}]


def _with_interval(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r["importance"] is not None and r["low"] is not None and r["high"] is not None]


def rule_items(doc: Mapping[str, Any]) -> list[Any]:
    """The analysis' crash rules: strings or records, as given."""
    raw = next((doc[k] for k in ("failure_rules", "rules", "crash_rules") if doc.get(k)), None)
    if isinstance(raw, Mapping):
        return [{"rule": k, **v} if isinstance(v, Mapping) else f"{k}: {_fmt(v)}" for k, v in raw.items()]
    return list(raw) if isinstance(raw, (list, tuple)) else []


def _rule_parameter(rule: Any, names: Iterable[str]) -> str | None:
    known = set(names)
    if isinstance(rule, Mapping):
        for k in ("parameter", "param", "name"):
            if rule.get(k) in known:
                return str(rule[k])
        for cond in rule.get("conditions") or []:
            if isinstance(cond, Mapping) and cond.get("param") in known:
                return str(cond["param"])
        text = str(rule.get("condition") or rule.get("rule") or "")
    else:
        text = str(rule)
    words = text.replace("=", " ").replace("<", " ").replace(">", " ").replace(":", " ").split()
    return next((w for w in words if w in known), None)


def top_parameters(imps: list[dict[str, Any]], rules: list[Any], views: list[TrialView], n: int = 2) -> list[str]:
    """The ``n`` parameters for the feasibility map: the most important first (``imps``: rows of
    one or more importances; a parameter ranks by its largest share in any), then those the
    crash rules name, then the rest in the order trials list them."""
    names: list[str] = []
    for v in views:
        for k in v.params:
            if k not in names:
                names.append(k)
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
    feasible = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if t.user_attrs.get("feasible")]
    if not feasible:
        return None
    sub = optuna.create_study(direction=study.direction)
    sub.add_trials(feasible)
    return sub


def _history(study: optuna.Study, metric: str) -> Any:
    from optuna.visualization import plot_optimization_history

    return _quiet(lambda: plot_optimization_history(study, target_name=metric))


def _importance_figure(rows: list[dict[str, Any]], title: str) -> Any:
    """Importances with their intervals as error bars (None when none has an interval)."""
    import plotly.graph_objects as go

    rows = list(reversed(_with_interval(rows)))  # plotly draws the first bar at the bottom
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


def _optuna_importances(sub: optuna.Study | None, metric: str) -> Any:
    """Optuna's importance chart over the feasible trials: the fallback when the analysis gives
    importances without intervals."""
    if sub is None or len(sub.trials) < 2:
        return None
    from optuna.visualization import plot_param_importances

    return _quiet(lambda: plot_param_importances(sub, target_name=metric)), \
        "Optuna's fANOVA importances over the feasible trials (the analysis gave no intervals)"


def _axis_values(values: list[Any]) -> list[Any]:
    """Values for one plot axis: numbers stay numbers; anything else (or a mix) becomes text."""
    if all(_number(v) is not None for v in values):
        return values
    return [_fmt(v) for v in values]


def _feasibility_figure(views: list[TrialView], params: list[str], metric: str) -> Any:
    """Every measured trial over the two parameters: feasible ones coloured by the objective,
    infeasible ones as crosses, one trace per failure kind."""
    import plotly.graph_objects as go

    rows = [v for v in views if v.outcome in ("ok", "infeasible") and all(v.params.get(p) is not None for p in params)]
    x_name = params[0]
    y_name = params[1] if len(params) > 1 else None
    xs = _axis_values([v.params[x_name] for v in rows])
    ys = _axis_values([v.params[y_name] for v in rows]) if y_name else [0] * len(rows)
    at = {v.number: (x, y) for v, x, y in zip(rows, xs, ys)}

    def hover(v: TrialView) -> str:
        lines = [f"trial {v.number}" + (" (baseline)" if v.baseline else ""), f"outcome: {v.outcome}"]
        if v.value is not None:
            lines.append(f"{metric}: {v.value:.4g}")
        if v.failure:
            lines.append(f"{v.failure_kind}: {_fmt(v.failure.get('message'))[:160]}")
        return "<br>".join(html.escape(s) for s in lines)

    fig = go.Figure()
    ok = [v for v in rows if v.value is not None]
    fig.add_trace(go.Scatter(
        name="feasible", mode="markers", x=[at[v.number][0] for v in ok], y=[at[v.number][1] for v in ok],
        text=[hover(v) for v in ok], hoverinfo="text",
        marker={"size": 11, "symbol": "circle", "color": [v.value for v in ok], "colorscale": "Viridis",
                "showscale": bool(ok), "colorbar": {"title": {"text": metric}}, "line": {"width": 1, "color": "#333"}}))
    by_kind: dict[str, list[TrialView]] = {}
    for v in rows:
        if v.value is None:
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
    return _quiet(lambda: plot_parallel_coordinate(sub, target_name=metric))


def _ablation_figure(doc: Mapping[str, Any]) -> tuple[Any, str] | None:
    import plotly.graph_objects as go

    rows = [r for r in doc.get("parameters") or [] if isinstance(r, Mapping) and _number(r.get("share")) is not None]
    if not rows:
        return None
    lo = [_number(r.get("share_low")) for r in rows]
    hi = [_number(r.get("share_high")) for r in rows]
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


def _support(rule: Mapping[str, Any]) -> str:
    sup = rule.get("support")
    if isinstance(sup, Mapping) and "failed" in sup:
        return f"{_fmt(sup.get('failed'))} of {_fmt(sup.get('covered'))}"
    pair = rule.get("failed_of_covered")
    if isinstance(pair, (list, tuple)) and len(pair) == 2:
        return f"{_fmt(pair[0])} of {_fmt(pair[1])}"
    if "infeasible" in rule and "total" in rule:
        return f"{_fmt(rule['infeasible'])} of {_fmt(rule['total'])}"
    return _fmt(sup)


_RULE_COLUMNS = (("condition", "when"), ("kind", "fails with"), ("support", "failed of covered"),
                 ("other_failures", "other failures"), ("trials", "trials explained"), ("p_value", "p-value"))


def _rules_html(rules: list[Any], doc: Mapping[str, Any]) -> str:
    out = ""
    texts = [r for r in rules if not isinstance(r, Mapping)]
    records = [r for r in rules if isinstance(r, Mapping)]
    if not rules:
        out += "<p>No crash rule: no parameter value or range explains the failures.</p>"
    if texts:
        out += "<ul>" + "".join(f"<li><code>{_e(str(r))}</code></li>" for r in texts) + "</ul>"
    if records:
        shown = [(k, title) for k, title in _RULE_COLUMNS
                 if any(k in r or (k == "condition" and "rule" in r) or (k == "support" and _support(r)) for r in records)]
        rest: list[str] = []
        for r in records:
            rest += [k for k in r if k not in rest and k not in {k for k, _ in _RULE_COLUMNS}
                     and k not in ("rule", "conditions", "failed_of_covered", "infeasible", "total")]
        out += _table([t for _, t in shown] + rest,
                      ([_support(r) if k == "support" else (r.get(k) if k != "condition" else r.get("condition") or r.get("rule"))
                        for k, _ in shown] + [r.get(k) for k in rest] for r in records))
    unexplained = doc.get("unexplained_failures")
    if isinstance(unexplained, Mapping) and unexplained.get("count"):
        kinds = unexplained.get("kinds") or {}
        out += (f"<p>{_e(unexplained.get('count'))} failures explained by no rule"
                + (f" ({_e(', '.join(f'{k} x{n}' for k, n in kinds.items()))})" if isinstance(kinds, Mapping) and kinds else "")
                + f": trials {_e(unexplained.get('trials'))}.</p>")
    settings = doc.get("rule_settings")
    if isinstance(settings, Mapping) and settings:
        out += f"<p class=note>Rule settings: {_e(', '.join(f'{k}={_fmt(v)}' for k, v in settings.items()))}.</p>"
    return out


def _importance_html(imps: list[dict[str, Any]], verdict: str | None) -> str:
    out = f"<p>{_e(verdict)}.</p>" if verdict else ""
    if not imps:
        return out or "<p>Importances: too few feasible trials.</p>"
    with_ci = any(r["low"] is not None or r["high"] is not None for r in imps)
    with_verdict = any(r["verdict"] for r in imps)
    headers = ["parameter", "share" if with_ci else "importance"] + (["low", "high"] if with_ci else []) \
        + (["verdict"] if with_verdict else [])
    return out + _table(headers, ([r["parameter"], r["importance"]] + ([r["low"], r["high"]] if with_ci else [])
                                  + ([r["verdict"]] if with_verdict else []) for r in imps))


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
        level = _number(doc.get("interval"))
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


def _profile_html(study: optuna.Study, best: TrialView | None, metric: str) -> str:
    if best is None:
        return "<p>No feasible trial yet: no profile to export.</p>"
    from autotune.export import profile, render

    try:
        from autotune.engines.registry import PRESETS

        engine = ((study.user_attrs.get("config") or {}).get("target") or {}).get("engine", "sim")
        port = PRESETS[engine].default_port if engine in PRESETS else 30000
    except ImportError:  # pragma: no cover - the registry ships with the package
        port = 30000
    prof = profile(study.study_name, metric, study.direction.name.lower(), best, port)
    fmt = "sh"
    try:
        text = render("sh", prof, best.argv_template or best.argv, secret_env_keys=best.secret_env,
                      secret_args=best.secret_args)
    except UsageError:  # an env name that is not a shell name: the data format instead
        fmt, text = "yaml", render("yaml", prof, best.argv_template or best.argv)
    cmd = f"autotune export {study.study_name} --format {fmt} -o profile.{fmt}"
    return (f"<p>Trial {_e(best.number)}: {_e(metric)} = {_e(best.value)}. Export it with <code>{_e(cmd)}</code>.</p>"
            f"<pre class=profile>{_e(text)}</pre>")


def _trials_html(views: list[TrialView], best: TrialView | None) -> str:
    rows = []
    for v in views:
        msg = _fmt((v.failure or {}).get("message"))
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


def build_report(study: optuna.Study, *, analysis: Mapping[str, Any] | None = None) -> str:
    """The report of ``study`` as one HTML document.

    ``analysis``: the document of :func:`autotune.analysis.explain` (computed when None).

    Raises:
        UsageError: the study has no trials.
    """
    import plotly.offline

    views = trial_views(study)
    if not views:
        raise UsageError(f"study '{study.study_name}' has no trials yet: nothing to report")
    objective = study.user_attrs.get("objective") or {}
    metric = str(objective.get("metric") or "value")
    direction = study.direction.name.lower()
    best = best_view(study)
    problem = ""
    if analysis is None:
        from autotune.analysis import explain

        try:
            analysis = explain(study)
        except Exception as exc:  # noqa: BLE001 - the rest of the report is still worth having
            analysis, problem = {}, f"{type(exc).__name__}: {exc}"
    doc: Mapping[str, Any] = analysis if isinstance(analysis, Mapping) else {}
    sets = importance_sets(doc)
    imps = [r for st in sets for r in st["rows"]]
    rules = rule_items(doc)
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

    outcomes = Counter(v.outcome for v in views)
    kinds = Counter(v.failure_kind for v in views if v.failure_kind)
    parts: list[str] = []
    parts.append(f"<h1>autotune report: {_e(study.study_name)}</h1>")
    summary = (f"{len(views)} trials; objective: {direction} {metric}"
               + (f"; best: trial {best.number}, {metric} = {_fmt(best.value)}" if best else "; no feasible trial yet"))
    parts.append(f"<p>{_e(summary)}</p>")
    parts.append(_table(["outcome", "trials"], sorted(outcomes.items())))
    if kinds:
        parts.append(_table(["failure kind", "trials"], kinds.most_common()))
    if problem:
        parts.append(f"<p class=note>The analysis (<code>autotune study explain</code>) failed: {_e(problem)}</p>")

    parts.append("<h2 id=history>Optimization history</h2>")
    parts.append(figure("history", lambda: _history(study, metric),
                        "every measured trial's objective and the best so far; infeasible trials are not measured"))

    parts.append("<h2 id=importance>Parameter importances</h2>")
    titles = {"objective": f"What moves {metric} (over the feasible trials)",
              "feasibility": "What decides whether a trial is feasible (over the finished trials)"}
    for st in sets:
        name = "importance" if st["target"] == "objective" else f"importance-{st['target']}"
        title = titles.get(st["target"], st["target"])
        if len(sets) > 1:
            parts.append(f"<h3>{_e(title)}</h3>")
        if _with_interval(st["rows"]):
            parts.append(figure(name, lambda st=st, title=title: _importance_figure(st["rows"], title),
                                str(st.get("method") or "the share with its interval")))
        elif st["target"] == "objective" and st["verdict"] is None and st["rows"]:
            parts.append(figure(name, lambda: _optuna_importances(sub, metric)))
        parts.append(_importance_html(st["rows"], st["verdict"]))

    pair = top_parameters(imps, rules, views)
    parts.append("<h2 id=feasibility>Feasibility map</h2>")
    if pair:
        parts.append(figure("feasibility", lambda: _feasibility_figure(views, pair, metric),
                            "each trial over the two most important parameters: circles were measured (colour: "
                            f"{metric}), crosses failed (one colour per failure kind)"))
    else:
        parts.append("<p>No parameter to map.</p>")

    parts.append("<h2 id=parallel>Parallel coordinates</h2>")
    parts.append(figure("parallel", lambda: _parallel(sub, metric),
                        "feasible trials only" if sub is not None else "no feasible trial yet"))

    parts.append("<h2 id=rules>Crash rules</h2>")
    parts.append(_rules_html(rules, doc))
    others = {k: v for k, v in doc.items() if k not in _KNOWN_EXPLAIN_KEYS}
    if others:
        parts.append("<details><summary>more from <code>autotune study explain</code></summary>"
                     f"<pre>{_e(json.dumps(others, indent=2, default=str, ensure_ascii=False))}</pre></details>")

    parts.append("<h2 id=ablation>Ablation</h2>")
    ablation = study.user_attrs.get("ablation")
    if isinstance(ablation, Mapping):
        parts.append(figure("ablation", lambda: _ablation_figure(ablation)))
    parts.append(_ablation_html(study.study_name, ablation))

    parts.append("<h2 id=profile>Best profile</h2>")
    parts.append(_profile_html(study, best, metric))

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
