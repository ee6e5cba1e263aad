"""Read-only views of a stored study: trial rows for show/best/export, in the JSON shapes that
``study show --json`` and ``study best --json`` print. Nothing here writes to the storage.

A multi-objective study (:mod:`autotune.config.pareto`) is read the same way: a trial's ``value`` is its
first objective's, ``values`` all of them; its "best" is the Pareto front's trial that the
study's choice rule picks (:func:`pick`), and the JSON documents add ``objectives`` (and, for
``study best``, the front and the rule) to the single-objective shapes."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import optuna


from autotune.util.text import counted
from autotune.util.stats import mean_interval, t95
from autotune.errors import StudyNotFoundError
from autotune.config.pareto import Choice, ChoiceRule, Goal, choose
from autotune.store.record import TrialRecord, objective_metric, read_all
from autotune.store.storage import has_studies, open_storage
from autotune.util.units import with_unit


def proposal_text(why: dict[str, Any] | None) -> str | None:
    """Why a trial was proposed, in words (:data:`autotune.store.record.PROPOSED_ATTR`); None where it does not say."""
    if not why:
        return None
    by = why.get("by")
    if by == "raise":
        if why.get("signal") == "queued":
            seen = f"{why.get('waiting')} requests waiting while {why.get('in_flight')} ran"
        else:
            seen = f"{why.get('in_flight')} requests running at once"
        return (f"{why.get('param')} raised from {why.get('from')} to {why.get('to')}: the scheduler log of "
                f"trial {why.get('after')} (the best so far) showed {seen}")
    if by == "probe":
        text = f"{why.get('param')} moved alone from trial {why.get('around')} (the best so far), the rest kept"
        return text + " (the screen of the baseline: one change at a time)" if why.get("screen") else text
    if by == "warm-start":
        return (f"study {why.get('study')} trial {why.get('trial')}'s {why.get('part')} (a warm start) on trial "
                f"{why.get('around')} (the best so far), except what this study's own failures speak for: "
                "measured here to confirm it")
    if by == "back-off":
        return ("the baseline with the parameters the space declares monotone for its failure moved to the "
                "safe side of the failures so far (a back-off)")
    return None


def load_text(signals: dict[str, int] | None) -> str | None:
    """What the engine's scheduler log showed of a trial's load, in words; None where it showed nothing."""
    if not signals or not signals.get("lines"):
        return None
    text = f"at most {signals.get('in_flight_max')} requests running at once"
    if signals.get("queued_at_max"):
        text += f", with {signals['queued_at_max']} waiting"
    elif signals.get("queued_max"):
        text += f"; at most {signals['queued_max']} waiting"
    return f"{text} ({signals['lines']} scheduler lines)"


@dataclass(frozen=True)
class Measured:
    """Every feasible measurement of one configuration: the trials whose applied parameters are
    equal (a study measures a configuration again to confirm it, see :mod:`autotune.study.confirmation`).

    The configuration's figure (:attr:`mean`, :attr:`interval95`) is the mean of the measurements
    after its first when it has any (:attr:`backing`), else its one measurement. The first run is
    the one that made the configuration a candidate: among many configurations, the one ranked
    top on a single noisy run is also the one whose run read high (the winner's curse), so its
    first run is kept (:attr:`values`) but not averaged in. The runs after it were taken because
    the configuration was a candidate, whatever they read: their mean is not biased that way.

    Its interval uses the study's pooled run-to-run noise (:attr:`noise`, :func:`pooled_noise`)
    when it was measured again: two runs alone give a t-interval with one degree of freedom, 12.7
    standard errors either side.
    """

    params: dict[str, Any]
    values: tuple[float, ...]
    trials: tuple[int, ...]
    noise: Noise | None = field(default=None, compare=False)
    """The study's run-to-run noise (:func:`measured_configs` sets it), None when unknown."""
    simpler: Simpler | None = field(default=None, compare=False)
    """Set where :func:`best_of` chose this configuration over one with a better figure within the
    noise, for its fewer changes from the baseline."""

    @property
    def count(self) -> int:
        """Every measurement, the first included."""
        return len(self.values)

    @property
    def backing(self) -> tuple[float, ...]:
        """The measurements the figure is the mean of: those after the first, or the only one."""
        return self.values[1:] if len(self.values) > 1 else self.values

    @property
    def backing_trials(self) -> tuple[int, ...]:
        """The trials of :attr:`backing`."""
        return self.trials[1:] if len(self.trials) > 1 else self.trials

    @property
    def first_excluded(self) -> bool:
        """Whether the first measurement is left out of the figure (measured again)."""
        return len(self.values) > 1

    @property
    def mean(self) -> float:
        """The configuration's figure: the mean of :attr:`backing`."""
        return mean_interval(self.backing)[0]

    @property
    def pooled(self) -> Noise | None:
        """The pooled noise :attr:`interval95` uses: :attr:`noise` when the configuration was
        measured again (the pool then holds all its runs, so it has more degrees of freedom than
        its runs after the first alone), else None."""
        return self.noise if self.first_excluded else None

    @property
    def interval95(self) -> tuple[float, float] | None:
        """The 95% t-interval of :attr:`mean`: from the pooled :attr:`noise` when the
        configuration was measured again, else from its own runs (None for one measurement)."""
        noise = self.pooled
        if noise is not None:
            mean = self.mean
            half = t95(noise.df) * noise.sd * abs(mean) / math.sqrt(len(self.backing))
            return mean - half, mean + half
        return mean_interval(self.backing)[2]

    def to_json(self) -> dict[str, Any]:
        """``count``/``mean``/``interval95``: the figure and how many measurements back it;
        ``values``/``trials``: exactly those measurements; ``excluded``: the first run,
        ``{"trial", "value"}``, left out of the figure (None when the configuration was measured
        once); ``noise``: the pooled noise the interval used (None when it used the runs' own
        spread, or has none); ``simpler``: why a configuration with a better figure was passed over
        (:class:`Simpler`), None where none was."""
        interval, noise = self.interval95, self.pooled
        return {"count": len(self.backing), "mean": self.mean, "interval95": None if interval is None else list(interval),
                "values": list(self.backing), "trials": list(self.backing_trials),
                "excluded": {"trial": self.trials[0], "value": self.values[0]} if self.first_excluded else None,
                "noise": None if noise is None else noise.to_json(),
                "simpler": None if self.simpler is None else self.simpler.to_json()}


@dataclass(frozen=True)
class Simpler:
    """The best is not the configuration with the best figure (trial ``over``, figure
    ``over_value``, ``over_changes`` parameters changed from the baseline) but one within the
    study's measured noise of it (``within``: the 95% half-width of the difference) with fewer
    changes (``changes``): the one a person would pick, where the data cannot tell them apart."""

    over: int
    over_value: float
    over_changes: int
    changes: int
    within: float

    @property
    def text(self) -> str:
        return (f"chosen over trial {self.over} ({self.over_value:.4g}, {counted(self.over_changes, 'change')} from "
                f"the baseline): within the measured noise of it (+/-{self.within:.3g}), with "
                f"{counted(self.changes, 'change')}")

    def to_json(self) -> dict[str, Any]:
        return {"over": self.over, "over_value": self.over_value, "over_changes": self.over_changes,
                "changes": self.changes, "within": self.within, "text": self.text}


@dataclass(frozen=True)
class Noise:
    """Run-to-run noise pooled over a study's configurations: the relative standard deviation of
    a measurement around its configuration's mean, with its degrees of freedom."""

    sd: float
    """Relative: 0.02 is 2% of the configuration's mean."""
    df: int
    configs: int
    """How many configurations' repeats it pools."""

    def to_json(self) -> dict[str, Any]:
        return {"relative_sd": self.sd, "df": self.df, "configs": self.configs}

    def __str__(self) -> str:
        return f"run-to-run noise {self.sd:.1%}, pooled over {counted(self.configs, 'configuration')} measured again"


def pooled_noise(configs: Sequence[Measured]) -> Noise | None:
    """The relative run-to-run noise pooled over every configuration measured again: the squared
    relative deviations of its runs, the first included, from their own mean, summed, over their
    degrees of freedom (the runs of a configuration count ``n - 1``). None when no configuration
    was measured again.

    The first runs count here, though not in a figure: a study that could measure its candidates
    again only once each (a budget nearly spent) has no other evidence of its noise, and an
    interval from the runs after the first alone then has one degree of freedom or none. A first
    run is the selected one, so it reads high and makes the pooled noise larger, not smaller: the
    interval errs wide. In a Monte Carlo of the confirmation (``python bench/winners_curse.py``)
    the 95% interval held the true value in 97-98% of studies, and was 6-7% either side where the
    best had 2 runs after its first and its rivals 1 (15% with the first runs left out).

    It assumes a configuration's noise is a share of its throughput, alike across the
    configurations a study measures again (the best few, close to one another).
    """
    squares, df, n_configs = 0.0, 0, 0
    for m in configs:
        runs = m.values
        if not m.first_excluded:
            continue
        mean = sum(runs) / len(runs)
        if mean == 0:
            continue
        squares += sum((v / mean - 1) ** 2 for v in runs)
        df += len(runs) - 1
        n_configs += 1
    return Noise(math.sqrt(squares / df), df, n_configs) if df else None


def backing_text(m: Measured) -> str:
    """What backs a configuration's figure, in words: ``mean of 2 measurements after the first
    (trials 40, 45), 95% interval [a, b] (run-to-run noise 2.1%, pooled over 3 configurations
    measured again)``."""
    n = len(m.backing)
    after = " after the first" if m.first_excluded else ""
    what = f"mean of {n} measurements{after}" if n > 1 else f"1 measurement{after}"
    which = f"trial{'s' if n != 1 else ''} {', '.join(map(str, m.backing_trials))}"
    if m.interval95 is None:
        return f"{what} ({which}), no interval" + ("" if m.simpler is None else f"; {m.simpler.text}")
    lo, hi = m.interval95
    pool = "" if m.pooled is None else f" ({m.pooled})"
    simpler = "" if m.simpler is None else f"; {m.simpler.text}"
    return f"{what} ({which}), 95% interval [{lo:.4g}, {hi:.4g}]{pool}{simpler}"


def config_key(params: dict[str, Any]) -> str:
    """A configuration's identity: its applied parameters, in a canonical text form."""
    return json.dumps(params, sort_keys=True, default=str)


def measured_configs(views: Sequence[TrialRecord]) -> list[Measured]:
    """The measured configurations of ``views`` (feasible trials grouped by applied parameters),
    in the order of their first measurement, each with the noise pooled over them all
    (:func:`pooled_noise`)."""
    groups: dict[str, list[TrialRecord]] = {}
    for v in views:
        if v.value is not None:
            groups.setdefault(config_key(v.params), []).append(v)
    configs = [Measured(dict(rows[0].params), tuple(float(r.value) for r in rows),  # type: ignore[arg-type]
                        tuple(r.number for r in rows)) for rows in groups.values()]
    noise = pooled_noise(configs)
    return configs if noise is None else [dataclasses.replace(m, noise=noise) for m in configs]


def load_study(name: str, storage: str) -> optuna.Study:
    """Load a study by name.

    Nothing is created: a SQLite file that does not exist holds no study.

    Raises:
        StudyNotFoundError: no study of that name in the storage (the message lists the ones
            that exist).
        UsageError: the storage URL or file is invalid (see :mod:`autotune.store.storage`).
    """
    if not has_studies(storage):  # a missing SQLite file is not created just to look in it
        raise StudyNotFoundError(f"no study named '{name}' in {storage} (studies: none)")
    rdb = open_storage(storage)
    names = [s.study_name for s in optuna.get_all_study_summaries(storage=rdb, include_best_trial=False)]
    if name not in names:
        known = ", ".join(names) if names else "none"
        raise StudyNotFoundError(f"no study named '{name}' in {storage} (studies: {known})")
    return optuna.load_study(study_name=name, storage=rdb)


def trial_views(study: optuna.Study) -> list[TrialRecord]:
    return read_all(study)


def is_multi_objective(study: optuna.Study) -> bool:
    return len(study.directions) > 1


def objectives(study: optuna.Study) -> list[Goal]:
    """The study's objectives in order, each a metric and a direction (the metric names the
    driver stored; ``value`` / ``value N`` for a study autotune did not record)."""
    stored = study.user_attrs.get("objective") or {}
    directions = [d.name.lower() for d in study.directions]
    listed = stored.get("objectives")
    if isinstance(listed, list) and len(listed) == len(directions):
        names = [str((g or {}).get("metric") or f"value {i}") for i, g in enumerate(listed)]
    elif len(directions) == 1:
        names = [str(stored.get("metric") or "value")]
    else:
        names = [f"value {i}" for i in range(len(directions))]
    return [Goal(n, d) for n, d in zip(names, directions)]  # type: ignore[arg-type]


def choice_rule(study: optuna.Study) -> ChoiceRule:
    """The rule the study's objective states for picking from its Pareto front (the default when
    it stated none)."""
    return ChoiceRule.from_json((study.user_attrs.get("objective") or {}).get("choose"))


def pick(study: optuna.Study, views: list[TrialRecord] | None = None, rule: ChoiceRule | None = None) -> Choice | None:
    """The Pareto front of a multi-objective study's measured trials and the one ``rule`` (default:
    the study's) picks; None when no trial was measured."""
    rows = [v for v in (trial_views(study) if views is None else views) if v.values is not None]
    if not rows:
        return None
    return choose([(v.number, v.values) for v in rows if v.values is not None], objectives(study),
                  rule or choice_rule(study))


WARM_START_ATTR = "warm_start"
"""Study user attr: what a warm start carried (written by :mod:`autotune.study.warm_start`)."""
LUCK_SDS = 2.0
"""How many run-to-run standard deviations a single run must beat the best confirmed figure by to
be the best (:func:`best_of`): about the luck of the best of a few dozen near-equal runs."""


def best_view(study: optuna.Study) -> TrialRecord | None:
    """The best configuration by its figure (:attr:`Measured.mean`), or None when nothing is
    feasible; in a multi-objective study the trial :func:`pick` picks from the Pareto front.

    Returned as the view of its first measured trial, with ``value`` the figure of the
    configuration (trials with the same applied parameters: the mean of the runs after its first
    when it was measured again) and ``measured`` its measurements: a configuration measured again
    is judged on the runs that confirmed it, not on the lucky run that made it a candidate; and a
    configuration measured once beats a confirmed one only by more than the noise (:func:`best_of`);
    among configurations within the measured noise of the best figure, the one with the fewest
    changes from the baseline (:func:`simplest_within_noise`). Exact ties go to the configuration
    measured first.
    """
    if is_multi_objective(study):
        views = trial_views(study)
        chosen = pick(study, views)
        return None if chosen is None else next(v for v in views if v.number == chosen.number)
    return best_of(trial_views(study), study.direction == optuna.study.StudyDirection.MAXIMIZE)


def best_of(views: Sequence[TrialRecord], maximize: bool) -> TrialRecord | None:
    """:func:`best_view` over ``views``.

    A configuration measured once does not displace a confirmed one (measured again, its figure
    the mean of the runs after its first) unless its one run beats the best confirmed figure by
    more than :data:`LUCK_SDS` run-to-run standard deviations (:func:`pooled_noise`). Among many
    near-equal configurations the best single run reads high by about that much (the winner's
    curse), while the confirmed figure does not: compared as they are, the lucky run wins, and
    the study reports one unconfirmed measurement though it confirmed its candidates. Then
    :func:`simplest_within_noise` may prefer a simpler configuration.
    """
    configs = measured_configs(views)
    if not configs:
        return None
    sign = 1.0 if maximize else -1.0
    best = max(configs, key=lambda m: sign * m.mean)
    confirmed = [m for m in configs if m.first_excluded]
    if confirmed and not best.first_excluded:
        rival = max(confirmed, key=lambda m: sign * m.mean)
        noise = rival.noise
        if noise is not None and sign * (best.mean - rival.mean) <= LUCK_SDS * noise.sd * abs(rival.mean):
            best = rival
    baseline = next((v for v in views if v.baseline and v.value is not None), None)
    if baseline is not None:
        best = simplest_within_noise(best, configs, baseline.params, maximize)
    first = next(v for v in views if v.number == best.trials[0])
    return dataclasses.replace(first, value=best.mean, measured=best,
                               metrics=_mean_metrics([v for v in views if v.number in best.backing_trials]))


def changes(params: dict[str, Any], baseline: dict[str, Any]) -> int:
    """How many parameters ``params`` sets otherwise than ``baseline`` (one left out counts)."""
    return sum(params.get(k) != baseline.get(k) for k in set(params) | set(baseline))


def simplest_within_noise(best: Measured, configs: Sequence[Measured], baseline: dict[str, Any],
                          maximize: bool) -> Measured:
    """``best``, or the configuration with the fewest :func:`changes` from ``baseline`` among those
    whose figure is within the measured noise of ``best``'s (then the better figure), with
    :attr:`Measured.simpler` saying why.

    Within the noise: the figures differ by at most the 95% half-width of their difference,
    ``t95(df) x sd x |best| x sqrt(1/n_best + 1/n)`` with the study's pooled run-to-run noise
    (:func:`pooled_noise`; none measured: ``best``) and ``n`` the runs behind each figure. Where
    ``best`` was measured again, only configurations measured again are candidates, so that a
    single lucky-or-unlucky run never replaces a confirmed figure.
    """
    noise = best.noise
    if noise is None or noise.df < 1:
        return best
    sign = 1.0 if maximize else -1.0
    mine = changes(best.params, baseline)

    def within(m: Measured) -> float:
        return t95(noise.df) * noise.sd * abs(best.mean) * math.sqrt(1 / len(best.backing) + 1 / len(m.backing))

    tied = [m for m in configs if (m.first_excluded or not best.first_excluded)
            and sign * (best.mean - m.mean) <= within(m)]
    pick = min(tied, key=lambda m: (changes(m.params, baseline), -sign * m.mean), default=best)
    if pick is best or changes(pick.params, baseline) >= mine:
        return best
    return dataclasses.replace(pick, simpler=Simpler(best.trials[0], best.mean, mine, changes(pick.params, baseline),
                                                     within(pick)))


def _mean_metrics(views: Sequence[TrialRecord]) -> dict[str, float]:
    """Each metric every one of ``views`` has, averaged over them: the metrics of a figure that is
    the mean of several runs (its objective's metric equals the figure)."""
    keys = set.intersection(*(set(v.metrics) for v in views)) if views else set()
    return {k: sum(float(v.metrics[k]) for v in views) / len(views) for k in sorted(keys)}


def show_json(study: optuna.Study) -> dict[str, Any]:
    """``study show --json`` (a multi-objective study: ``direction``/``metric`` are the first
    objective's, ``objectives`` lists them all and each trial has ``values``)."""
    goals = objectives(study)
    views = trial_views(study)
    doc: dict[str, Any] = {
        "study": study.study_name,
        "direction": goals[0].direction,
        "metric": objective_metric(study),
        "trials": [v.to_json() for v in views],
    }
    if len(goals) > 1:
        doc["objectives"] = [g.to_json() for g in goals]
        doc["trials"] = [{**row, "values": v.values} for row, v in zip(doc["trials"], views)]
    warm = study.user_attrs.get(WARM_START_ATTR)
    if isinstance(warm, dict):  # what it started from, without the carried records themselves
        doc["warm_start"] = {k: warm.get(k) for k in ("sources", "hints", "lines")}
        doc["warm_start"]["carried"] = {k: len(warm.get(k) or []) for k in ("failures", "runs")}
    return doc


def best_moved(before: TrialRecord | None, after: TrialRecord | None, metric: str | None) -> str | None:
    """Why the best moved from ``before`` to ``after`` (as :func:`best_view` chose each), in
    words; None where it did not move. A best can go down: a configuration measured again is
    judged on its runs after the first, which read lower than the lucky first one."""
    if after is None or after.value is None:
        return None
    shown = with_unit(after.value, metric)
    runs = after.measured
    backing = "" if runs is None else f" ({backing_text(runs)})"
    if before is None or before.value is None:
        return f"best {shown}: trial {after.number}{backing}"
    if before.number == after.number:
        if abs(before.value - after.value) <= 1e-9 * max(1.0, abs(before.value)):
            return None
        return (f"best {with_unit(before.value, metric)} -> {shown}: trial {after.number}'s configuration measured "
                f"again{backing}")
    if before.measured is not None and after.measured is not None and before.number in after.measured.trials:
        return None
    return (f"best {with_unit(before.value, metric)} -> {shown}: now trial {after.number}{backing}"
            + ("; the former best measured again read lower" if _lower_now(before, after) else ""))


def _lower_now(before: TrialRecord, after: TrialRecord) -> bool:
    """Whether ``after`` took the lead at no better figure than ``before`` had: ``before``'s
    configuration fell when it was measured again."""
    return after.value is not None and before.value is not None and abs(after.value) <= abs(before.value)


def best_json(v: TrialRecord) -> dict[str, Any]:
    """``study best --json``: ``value`` is the configuration's figure and ``metrics`` the mean of
    the same runs' metrics (:attr:`Measured.backing`), so the objective's metric there is the value."""
    out = {"number": v.number, "params": v.params, "value": v.value, "metrics": v.metrics,
           "env": v.env, "argv": v.argv}
    if v.measured is not None:
        out["measurements"] = v.measured.to_json()
    return out


def front_json(study: optuna.Study, views: list[TrialRecord], chosen: Choice) -> dict[str, Any]:
    """What ``study best --json`` adds for a multi-objective study: the chosen trial's ``values``,
    the ``objectives``, the ``choice`` (rule, its text, the trial, the front's numbers) and the
    ``pareto_front`` (each trial on it: number, params, values, metrics)."""
    by_number = {v.number: v for v in views}
    return {"values": by_number[chosen.number].values, "objectives": [g.to_json() for g in objectives(study)],
            "choice": chosen.to_json(),
            "pareto_front": [{"number": n, "params": by_number[n].params, "values": by_number[n].values,
                              "metrics": by_number[n].metrics} for n in chosen.front]}
