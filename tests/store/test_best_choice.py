"""The best choice of a study (autotune.store.study_view.best_of): among configurations within the
measured noise of the best figure, the one with the fewest changes from the baseline."""

from __future__ import annotations

from typing import Any

from autotune.store.record import TrialRecord
from autotune.store.study_view import backing_text, best_json, best_of, changes

BASE = {"a": 1, "b": 1, "c": 1}


def _runs(start: int, params: dict[str, Any], values: list[float], *, baseline: bool = False) -> list[TrialRecord]:
    return [TrialRecord(start + i, "COMPLETE", "ok", dict(params), v, {"output_throughput": v}, None, 1.0,
                        baseline=baseline) for i, v in enumerate(values)]


def _study(near: list[float], far: list[float]) -> list[TrialRecord]:
    """The baseline (1000 +/- 1%), a one-change configuration and a three-change one, each measured
    three times (the noise is ~1%)."""
    return (_runs(0, BASE, [1000.0, 1010.0, 990.0], baseline=True)
            + _runs(10, {**BASE, "a": 2}, near)
            + _runs(20, {"a": 3, "b": 2, "c": 2}, far))


def test_a_better_figure_within_the_noise_goes_to_the_configuration_with_fewer_changes() -> None:
    views = _study(near=[1100.0, 1095.0, 1105.0], far=[1110.0, 1102.0, 1108.0])  # 1100 vs 1105: noise
    best = best_of(views, maximize=True)
    assert best is not None and best.params == {**BASE, "a": 2} and best.value == 1100.0
    simpler = best.measured.simpler
    assert simpler is not None and (simpler.over, simpler.over_changes, simpler.changes) == (20, 3, 1)
    assert simpler.over_value == 1105.0 and 5.0 <= simpler.within
    # Every surface says so: the console's text and the JSON of `study best`.
    assert "chosen over trial 20 (1105, 3 changes from the baseline): within the measured noise" in \
        backing_text(best.measured)
    assert best_json(best)["measurements"]["simpler"]["over"] == 20


def test_a_difference_beyond_the_noise_keeps_the_best_figure() -> None:
    views = _study(near=[1100.0, 1095.0, 1105.0], far=[1200.0, 1195.0, 1205.0])
    best = best_of(views, maximize=True)
    assert best is not None and best.params == {"a": 3, "b": 2, "c": 2} and best.measured.simpler is None
    assert "chosen over" not in backing_text(best.measured)


def test_the_baseline_itself_wins_a_tie_and_minimised_metrics_tie_too() -> None:
    views = _study(near=[1003.0, 1004.0, 1002.0], far=[980.0, 985.0, 975.0])
    best = best_of(views, maximize=True)
    assert best is not None and best.params == BASE and best.measured.simpler.over == 10
    low = _study(near=[998.0, 997.0, 996.0], far=[1000.0, 1001.0, 999.0])  # latencies: lower is better
    best = best_of(low, maximize=False)
    assert best is not None and best.params == BASE


def test_without_measured_noise_or_a_baseline_the_best_figure_stands() -> None:
    once = _runs(0, BASE, [1000.0], baseline=True) + _runs(1, {**BASE, "a": 2}, [1001.0])
    best = best_of(once, maximize=True)  # nothing measured again: no noise to judge a tie by
    assert best is not None and best.params == {**BASE, "a": 2} and best.measured.simpler is None
    no_baseline = [*_runs(10, {**BASE, "a": 2}, [1100.0, 1095.0, 1105.0]),
                   *_runs(20, {"a": 3, "b": 2, "c": 2}, [1110.0, 1102.0, 1108.0])]
    best = best_of(no_baseline, maximize=True)
    assert best is not None and best.params == {"a": 3, "b": 2, "c": 2}


def test_a_single_run_never_replaces_a_confirmed_figure() -> None:
    views = _study(near=[1100.0, 1095.0, 1105.0], far=[1110.0, 1102.0, 1108.0])
    views += _runs(30, {**BASE, "b": 5}, [1099.0])  # one change, measured once, within the noise
    best = best_of(views, maximize=True)
    assert best is not None and best.params == {**BASE, "a": 2}


def test_changes_count_every_parameter_set_otherwise() -> None:
    assert changes(BASE, BASE) == 0
    assert changes({"a": 2, "b": 1}, BASE) == 2  # a changed, c left out
