"""Early stopping inside a trial: a load whose optimistic bound cannot beat the best trials so far stops.

A trial's benchmark load costs GPU time after the start-up; a configuration that is clearly
worse than the best trials so far need not finish its load to show it. The runner (a real load,
:mod:`autotune.execution.loadgen`) and the model executor (the simulator's timeline,
:mod:`autotune.bench.model_executor`) feed the same :class:`StopRule` with the load's progress
(:class:`~autotune.execution.workload.LoadProgress`) and the value to beat (the driver's choice, in
the trial's spec: :func:`value_to_beat`), and stop the load when it says so; the trial is then
recorded as ``stopped``: measured, not infeasible, never the best.

- Which objectives (:func:`applies`): one load of the built-in generator, a throughput of
  :data:`BOUNDED_METRICS`, maximised; latencies, external benchmarks and minimised metrics are
  never stopped.
- The rule (:class:`StopRule`): stop when an optimistic bound on the final value
  (:func:`optimistic_bound`: the hard bound ``W / t``, or the rest of the work at ``1 + MARGIN``
  times the peak rate seen) is below the value to beat less :data:`NOISE`, with evidence that the
  server serves (:data:`EVIDENCE_SHARE`, :data:`MIN_SHARE`), never before the objective's least
  load (completed requests and seconds: ``early_stop: {min_requests, min_seconds}``) and not
  after :data:`LAST_SHARE`.
- The value to beat (:func:`value_to_beat`): the ``k``-th best measured value, ``k`` the size of
  TPE's good group, so that TPE proposes what it would have without early stopping, less
  :data:`NOISE_SDS` times the study's measured run-to-run noise: a run that reads low by noise is
  not stopped for it.
- Intermediate values: the projected value at each tenth of the work, for ``trial.report``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from autotune.execution.workload import LoadProgress
from autotune.config.objective import STOP_MIN_REQUESTS, STOP_MIN_SECONDS, Objective

__all__ = ["BOUNDED_METRICS", "EVIDENCE_SHARE", "EarlyStop", "GOOD_MAX", "GOOD_SHARE", "LAST_SHARE", "MARGIN",
           "MIN_SHARE", "NOISE", "NOISE_SDS", "PEAK_SPAN", "STEPS", "StopRule", "applies", "optimistic_bound",
           "value_to_beat", "work"]

BOUNDED_METRICS: dict[str, str] = {
    "output_throughput": "output tokens",
    "total_throughput": "input and output tokens",
    "request_throughput": "completed requests",
}
"""The metrics a trial may be stopped on, with the work each one counts."""
MIN_SHARE = 0.25
"""Share of the load's work delivered before the extrapolated bound may stop a trial."""
LAST_SHARE = 0.9
"""Share of the load's work after which a trial runs to its end."""
EVIDENCE_SHARE = 0.05
"""Share of the work delivered before even the hard bound may stop a trial: a server that has
delivered nothing may be hanging, and that is for the request timeouts to decide (infeasible)."""
MARGIN = 0.15
"""How much faster than its peak rate the rest of a load is allowed to run."""
PEAK_SPAN = 0.10
"""The peak rate is the fastest the trial delivered any span of this share of the work."""
NOISE = 0.02
"""A trial stops only when its bound is below the value to beat by more than this share."""
NOISE_SDS = 3.0
"""The value to beat is lowered by this many run-to-run standard deviations of the study's
measured noise (:func:`value_to_beat`): about two for the stopped run reading low and the run
that set the value reading high, with a margin."""
STEPS = 10
"""Intermediate values are recorded at each 1/STEPS of the work (as percent done)."""
GOOD_SHARE = 0.1
GOOD_MAX = 25
"""TPE's good trials: the best ``ceil(GOOD_SHARE x finished)``, at most ``GOOD_MAX`` (Optuna's
``default_gamma``)."""


def applies(objective: Objective) -> bool:
    """Whether trials of ``objective`` may stop early: ``early_stop`` on, the built-in load
    generator with one load, one objective, a metric of :data:`BOUNDED_METRICS`, maximised.
    A multi-objective study has no single value to beat, and several loads no single bound.

    Only throughputs, :data:`BOUNDED_METRICS`, maximised: the metric is the work ``W`` of the whole
    load (output tokens; input and output tokens; requests) over its duration ``D``, and ``W`` is
    known before the load ends (every request asks for exactly ``output_len`` tokens), so a bound on
    ``D`` is a bound on the value. Not bounded, and never stopped:

    - latencies (TTFT, TPOT, ITL, end-to-end; means and percentiles): they are statistics over the
      requests, and the requests done first are not a sample of them -- the first wave queues behind
      every prefill at once, the last drains at a small batch, a percentile is decided by the tail
      that comes last. The one valid bound (a request in flight has waited at least its age so far)
      is too weak to stop anything before the load is nearly over;
    - a metric of an external benchmark command (it reports nothing until it ends), and any
      minimised metric;
    - an objective with ``early_stop: false``.
    """
    return (objective.early_stop and objective.benchmark is None and objective.metric in BOUNDED_METRICS
            and objective.direction == "maximize" and not objective.multi and not objective.loads)


def work(metric: str, p: LoadProgress) -> tuple[float, float]:
    """``(done, total)``: the work of ``metric`` (:data:`BOUNDED_METRICS`) delivered so far and
    that of the whole load.

    Raises:
        KeyError: ``metric`` is not bounded.
    """
    if metric == "output_throughput":
        return float(p.output_tokens), float(p.output_tokens_total)
    if metric == "total_throughput":
        return float(p.input_tokens + p.output_tokens), float(p.input_tokens_total + p.output_tokens_total)
    if metric == "request_throughput":
        return float(p.completed), float(p.total)
    raise KeyError(f"no early-stopping bound for metric '{metric}' (bounded: {', '.join(BOUNDED_METRICS)})")


def value_to_beat(measured: Sequence[float], budget: int | None, *, maximize: bool = True,
                  noise_sd: float | None = None) -> tuple[float | None, str]:
    """The value the next trial must be able to beat to go on, and why: from
    the values of the trials measured so far and the study's budget in trials (None: a budget in
    hours, :data:`GOOD_MAX` good trials). None: nothing is stopped (fewer measured trials than
    TPE's good ones). ``noise_sd``: the study's relative run-to-run noise where it measured it
    (the pooled noise of its configurations measured again); the value is then lowered by
    :data:`NOISE_SDS` of it, so that a trial whose run reads low by noise, or whose rival's read
    high, goes on.

    Not the best so far: :func:`value_to_beat` is the value a trial must beat to be, at any point
    of the study, one of the *good* trials of Optuna's TPE -- the ``k``-th best measured value, ``k``
    TPE's good share of the study's whole budget (:data:`GOOD_SHARE` of its trials, at most
    :data:`GOOD_MAX`: Optuna's ``default_gamma`` at the last trial, the largest it gets; 6 for 60
    trials). TPE splits the finished trials into good and poor by rank and models each group from
    its members' parameters alone, and it ranks a PRUNED trial below *every* complete one, whatever
    its intermediate values. A trial stopped below that value would have been one of the poor
    trials measured to its end too, then and at every later trial (the ``k``-th best only rises):
    TPE proposes exactly what it would have without early stopping (given the same measurements),
    and the study is the same search, cheaper. Against the best itself, the trials between the best
    and the ``k``-th best would be stopped too, and TPE's good group filled with the study's poorer
    measured trials instead (measured: docs/BENCHMARKS.md, early stopping).
    With fewer measured trials than ``k`` nothing is stopped. (Other samplers: the random and grid
    samplers ignore values; GP is told a stopped trial COMPLETE at its projected value.)
    """
    k = GOOD_MAX if budget is None else max(1, min(math.ceil(GOOD_SHARE * budget), GOOD_MAX))
    ranked = sorted(measured, reverse=maximize)
    if len(ranked) < k:
        return None, ""
    why = "the best so far" if k == 1 else f"the {_ordinal(k)} best so far (TPE's good trials: the best {k})"
    value = ranked[k - 1]
    if noise_sd is not None and noise_sd > 0:
        value *= max(0.0, 1.0 - NOISE_SDS * noise_sd)
        why += f" less {NOISE_SDS:g} x the measured run-to-run noise {noise_sd:.1%}"
    return value, why


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 11 <= n % 100 <= 13 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def optimistic_bound(elapsed_s: float, done: float, total: float, peak_rate: float | None) -> float:
    """The most the metric can end at: ``total / elapsed_s`` (the hard bound) before
    :data:`MIN_SHARE` of the work or without a peak rate, else the extrapolated bound
    (:class:`StopRule`). ``elapsed_s`` > 0."""
    if peak_rate is None or peak_rate <= 0 or done < MIN_SHARE * total:
        return total / elapsed_s
    return total / (elapsed_s + max(0.0, total - done) / ((1.0 + MARGIN) * peak_rate))


@dataclass(frozen=True)
class EarlyStop:
    """Why a load was stopped: at ``share`` of its work and ``elapsed_s`` into the measured run,
    ``metric`` could end at most at ``bound``, below ``beat`` (the value to beat; ``why``: which
    one it is). ``rate``: the metric so far (work delivered over the time); ``projected``: the
    final value if the rest ran at the peak rate (the last intermediate value's kind)."""

    metric: str
    beat: float
    bound: float
    projected: float
    rate: float
    share: float
    elapsed_s: float
    why: str = ""

    @property
    def message(self) -> str:
        return (f"at {self.share:.0%} of the load ({self.elapsed_s:.1f}s): {self.metric} could reach at most "
                f"{self.bound:.4g} (so far {self.rate:.4g}, projected {self.projected:.4g}), below "
                f"{self.beat:.4g}, {self.why or 'the value to beat'}")

    def to_json(self) -> dict[str, Any]:
        return {"metric": self.metric, "beat": round(self.beat, 4), "why": self.why, "bound": round(self.bound, 4),
                "projected": round(self.projected, 4), "rate": round(self.rate, 4), "share": round(self.share, 4),
                "elapsed_s": round(self.elapsed_s, 3), "message": self.message}


@dataclass
class StopRule:
    """The early-stopping rule for one load: feed it the progress as it comes
    (:meth:`observe`, elapsed times increasing); it says when to stop.

    With ``t`` the time since the measured run began and ``w`` the work delivered so far (requests
    in flight included, token by token):

    - *hard bound*: ``D >= t``, so the value is at most ``W / t``: a trial that has already run longer
      than a whole load at the value to beat cannot beat it, whatever it does next;
    - *extrapolated bound*: the rest of the load, ``W - w``, runs at most at ``(1 + MARGIN)`` times
      the *peak* rate seen so far (the fastest the trial delivered any :data:`PEAK_SPAN` of the
      work), so ``D >= t + (W - w) / ((1 + MARGIN) * peak)``. The peak, not the mean, is the rate of
      the rest: a prefill phase (no output tokens yet), the first wave of a closed loop and a slow
      warm-up only lower the mean, and they cannot lower the peak. Later on a real server the rate
      does not rise much above its peak (a closed loop's last wave drains slower, not faster), and
      ``MARGIN`` covers the run-to-run noise (about 2%) many times over.

    The trial stops when the bound is below the value to beat less :data:`NOISE` (a contender within
    the noise of it is measured to the end), never before ``min_requests`` completed requests and
    ``min_seconds`` of the measured run (the objective's ``early_stop``; :meth:`for_objective`),
    and only with evidence that the server serves: at least
    :data:`EVIDENCE_SHARE` of the work delivered for the hard bound, and :data:`MIN_SHARE` for the
    extrapolated one (before that the rate is not yet representative); and not after
    :data:`LAST_SHARE` of it, when the rest saves little and the value is worth more measured. With
    these shares, a trial that would have beaten the value is never stopped unless the rest of its
    load would run more than ``MARGIN`` faster than anything it had shown.

    Intermediate values:
    At each tenth of the work (:data:`STEPS`), the rule records the *projected* value -- the final
    value if the rest ran at the peak rate, without margin -- keyed by the percent done; the driver
    reports them to Optuna (``trial.report``), whose TPE ranks a PRUNED trial with no constraint
    violated below every complete trial, by its last step and then its last intermediate value.

    ``beat`` is the value of ``metric`` to beat (None: nothing to beat, never stops); ``why``
    says which it is.
    Contract: once :meth:`observe` returned an :class:`EarlyStop` it returns the same one;
    :attr:`intermediate` holds the projected value at each tenth of the work reached.
    """

    metric: str
    beat: float | None
    why: str = ""
    min_requests: int = STOP_MIN_REQUESTS
    min_seconds: float = STOP_MIN_SECONDS
    intermediate: dict[int, float] = field(default_factory=dict)
    stop: EarlyStop | None = None
    peak: float | None = None
    """The peak rate so far (work per second over a span of :data:`PEAK_SPAN` of the work)."""
    _samples: list[tuple[float, float]] = field(default_factory=lambda: [(0.0, 0.0)])
    _first: int = 0

    def __post_init__(self) -> None:
        if self.metric not in BOUNDED_METRICS:
            raise KeyError(f"no early-stopping bound for metric '{self.metric}' (bounded: {', '.join(BOUNDED_METRICS)})")

    @classmethod
    def for_objective(cls, objective: Objective, beat: float | None, why: str = "") -> StopRule:
        """The rule for ``objective``'s metric and least load (``early_stop: {min_requests, min_seconds}``)."""
        return cls(objective.metric, beat, why, objective.stop_after.min_requests, objective.stop_after.min_seconds)

    def observe(self, p: LoadProgress) -> EarlyStop | None:
        """Take one progress report; the reason to stop now, or None to go on."""
        if self.stop is not None:
            return self.stop
        done, total = work(self.metric, p)
        t = p.elapsed_s
        if total <= 0 or t <= 0:
            return None
        self._update_peak(t, done, total)
        share = min(1.0, done / total)
        projected = self._projected(t, done, total)
        step = int(share * STEPS + 1e-9) * (100 // STEPS)
        if step and step not in self.intermediate:
            self.intermediate[step] = projected
        if self.beat is None or not EVIDENCE_SHARE <= share <= LAST_SHARE:
            return None
        if p.completed < self.min_requests or t < self.min_seconds:
            return None
        bound = optimistic_bound(t, done, total, self.peak)
        if bound < self.beat * (1.0 - NOISE):
            self.stop = EarlyStop(self.metric, self.beat, bound, projected, done / t, share, t, self.why)
        return self.stop

    def _projected(self, t: float, done: float, total: float) -> float:
        if self.peak is None or self.peak <= 0:
            return done / t
        return total / (t + max(0.0, total - done) / self.peak)

    def _update_peak(self, t: float, done: float, total: float) -> None:
        """The fastest rate over a span of at least ``PEAK_SPAN * total`` of work that ends now:
        from the latest earlier sample that far back (amortised O(1) per sample)."""
        span = PEAK_SPAN * total
        samples = self._samples
        if t <= samples[-1][0]:
            return
        samples.append((t, done))
        i = self._first
        while i + 1 < len(samples) - 1 and done - samples[i + 1][1] >= span:
            i += 1
        if i > 4096:  # samples before the window's start are never needed again
            del samples[:i]
            i = 0
        self._first = i
        t0, w0 = samples[i]
        if done - w0 >= span and t > t0:
            rate = (done - w0) / (t - t0)
            if self.peak is None or rate > self.peak:
                self.peak = rate
