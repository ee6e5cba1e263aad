"""The report's charts: plotly figures of a study, each drawn by plotly.js in the page.

Contracts:

- Each function returns a plotly figure, or None when there is nothing to draw (no feasible
  trial, no parameter varied); Optuna's ``optuna.visualization`` where one fits.
- Text in hover labels is HTML-escaped (plotly reads it as HTML); in the figures' JSON ``<`` is
  escaped by plotly, so nothing in a value can end a script.
- :func:`figure_html` gives the figure's ``<div id="fig-NAME">`` without plotly.js (the page
  embeds it once).
"""

from __future__ import annotations

import html
import json
import math
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import optuna
from optuna.trial import TrialState

from autotune.outcome.results import finite_number
from autotune.store.record import TrialRecord, is_feasible_measurement
from autotune.store.study_view import is_multi_objective
from autotune.util.units import unit_of, with_unit

FIGURE_HEIGHT = 460
"""Height of every chart, in pixels (the page reserves it before plotly.js draws)."""


def text_of(value: Any) -> str:
    """``value`` as the report shows it: None as "", numbers to 4 significant digits, lists
    joined with ", ", mappings as JSON."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(text_of(v) for v in value)
    if isinstance(value, dict):
        return json.dumps(value, default=str, ensure_ascii=False)
    return str(value)


def _quiet(make: Callable[[], Any]) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return make()


def feasible_study(study: optuna.Study) -> optuna.Study | None:
    """An in-memory copy of ``study`` with only its feasible trials (None if there are none)."""
    feasible = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if is_feasible_measurement(t)]
    if not feasible:
        return None
    sub = optuna.create_study(directions=study.directions)
    sub.add_trials(feasible)
    return sub


def history(sub: optuna.Study | None, metric: str, best: TrialRecord | None) -> Any:
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


def pareto(sub: optuna.Study | None, goals: list[Any]) -> Any:
    from optuna.visualization import plot_pareto_front

    if sub is None:
        return None
    return _quiet(lambda: plot_pareto_front(sub, target_names=[g.metric for g in goals]))


def importance(rows: list[dict[str, Any]], title: str) -> Any:
    """Importances with their intervals as error bars (None when no parameter was varied)."""
    import plotly.graph_objects as go

    rows = [r for r in reversed(rows) if r["importance"] is not None]  # plotly draws the first bar at the bottom
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
    return [text_of(v) for v in values]


def _positions(values: list[Any]) -> tuple[list[float], dict[str, Any]]:
    """One plot axis: numbers as they are; text (or a mix) as positions 0, 1, ... in the order
    the values first appear, with the axis settings that label them."""
    shown = _axis_values(values)
    if all(finite_number(v) is not None for v in shown):
        return [float(v) for v in shown], {}
    order = list(dict.fromkeys(shown))
    return [float(order.index(v)) for v in shown], {"tickmode": "array", "tickvals": list(range(len(order))),
                                                     "ticktext": order}


def _spread(xs: list[float]) -> float:
    """A small step on an axis: 1.5% of its span (1.5% of the value, or 0.03, when it has one)."""
    span = (max(xs) - min(xs)) if xs else 0.0
    return 0.015 * (span or abs(xs[0]) or 2.0) if xs else 0.0


def feasibility(views: list[TrialRecord], params: list[str], metric: str) -> Any:
    """Every measured trial over the two parameters: feasible ones coloured by the objective,
    stopped ones (load stopped early) as open circles, infeasible ones as crosses, one trace per
    failure kind. Trials at the same point of one trace are one marker, sized by their count;
    traces sharing a point are set side by side, so none hides another."""
    import plotly.graph_objects as go

    rows = [v for v in views if v.outcome in ("ok", "stopped", "infeasible")
            and all(v.params.get(p) is not None for p in params)]
    x_name = params[0]
    y_name = params[1] if len(params) > 1 else None
    xs, x_axis = _positions([v.params[x_name] for v in rows])
    ys, y_axis = _positions([v.params[y_name] for v in rows]) if y_name else ([0.0] * len(rows), {})
    at = {v.number: (x, y) for v, x, y in zip(rows, xs, ys)}

    def hover(v: TrialRecord) -> str:
        lines = [f"trial {v.number}" + (" (baseline)" if v.baseline else ""), f"outcome: {v.outcome}"]
        if v.value is not None:
            lines.append(f"{metric}: {v.value:.4g}")
        if v.failure:
            lines.append(f"{v.failure_kind}: {text_of(v.failure.message)[:160]}")
        if v.early_stop:
            lines.append(text_of(v.early_stop.get("message"))[:160])
        return "<br>".join(html.escape(s) for s in lines)

    traces: list[tuple[str, list[TrialRecord], dict[str, Any]]] = []
    ok = [v for v in rows if v.value is not None]
    traces.append(("feasible", ok, {"symbol": "circle", "colorscale": "Viridis", "showscale": bool(ok),
                                    "colorbar": {"title": {"text": metric}}, "line": {"width": 1, "color": "#333"}}))
    stopped = [v for v in rows if v.outcome == "stopped"]
    if stopped:
        traces.append(("stopped early", stopped, {"symbol": "circle-open", "line": {"width": 2}}))
    by_kind: dict[str, list[TrialRecord]] = {}
    for v in rows:
        if v.value is None and v.outcome != "stopped":
            by_kind.setdefault(v.failure_kind or v.outcome, []).append(v)
    traces += [(f"infeasible: {kind}", members, {"symbol": "x", "line": {"width": 1}})
               for kind, members in sorted(by_kind.items())]
    points = {name: {at[v.number] for v in members} for name, members, _ in traces}
    dx = _spread(xs)
    fig = go.Figure()
    for name, members, marker in traces:
        groups: dict[tuple[float, float], list[TrialRecord]] = {}
        for v in members:
            groups.setdefault(at[v.number], []).append(v)
        px, py, size, text, colour = [], [], [], [], []
        for (x, y), group in groups.items():
            sharing = [n for n, pts in points.items() if (x, y) in pts]
            k = sharing.index(name) - (len(sharing) - 1) / 2  # side by side where traces share the point
            px.append(x + k * dx)
            py.append(y)
            size.append(10 + 5 * math.sqrt(len(group) - 1))
            text.append((f"{len(group)} trials here<br>" if len(group) > 1 else "")
                        + "<br>---<br>".join(hover(v) for v in group[:6]) + ("<br>..." if len(group) > 6 else ""))
            colour.append(sum(float(v.value or 0.0) for v in group) / len(group) if name == "feasible" else None)
        style = {**marker, "size": size}
        if name == "feasible":
            style["color"] = colour
        fig.add_trace(go.Scatter(name=name, mode="markers", x=px, y=py, text=text, hoverinfo="text", marker=style))
    fig.update_layout(title="Feasibility: " + (f"{x_name} x {y_name}" if y_name else x_name),
                      xaxis_title=x_name, yaxis_title=y_name or "", legend={"orientation": "h", "y": -0.2})
    fig.update_xaxes(**x_axis)
    if y_name is None:
        fig.update_yaxes(visible=False)
    else:
        fig.update_yaxes(**y_axis)
    return fig


def parallel(sub: optuna.Study | None, metric: str) -> Any:
    """Optuna's parallel coordinates of the feasible trials, with each axis' full name (Optuna
    cuts names of 20 characters or more), slanted so that neighbours do not overlap."""
    from optuna.visualization import plot_parallel_coordinate

    if sub is None:
        return None
    if len(sub.directions) > 1:  # coloured by the first objective
        fig = _quiet(lambda: plot_parallel_coordinate(sub, target=lambda t: t.values[0], target_name=metric))
    else:
        fig = _quiet(lambda: plot_parallel_coordinate(sub, target_name=metric))
    names = {f"{n[:17]}...": n for t in sub.trials for n in t.params if len(n) >= 20}
    ticks = fig.layout.xaxis.ticktext
    if ticks:  # Optuna draws the axes as an x axis whose tick labels are the names
        fig.update_xaxes(ticktext=[names.get(str(t), str(t)) for t in ticks], tickangle=30)
    for trace in fig.data:  # its legend tells feasible from infeasible trials: here all are feasible
        if trace.name in ("Feasible", "Infeasible"):
            trace.showlegend = False
    fig.update_layout(margin={"b": 150, "r": 90})
    return fig


def ablation(doc: Mapping[str, Any]) -> tuple[Any, str] | None:
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


def figure_html(name: str, fig: Any) -> str:
    import plotly.io as pio

    margin = {"l": 70, "r": 30, "t": 60, "b": 60, **{k: v for k, v in (fig.layout.margin.to_plotly_json() or {}).items()
                                                        if v is not None}}
    fig.update_layout(height=FIGURE_HEIGHT, margin=margin)
    return pio.to_html(fig, full_html=False, include_plotlyjs=False, div_id=f"fig-{name}",
                       config={"displaylogo": False, "responsive": True})
