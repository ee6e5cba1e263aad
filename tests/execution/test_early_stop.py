"""The early-stopping rule (autotune.execution.early_stop) on load profiles whose final value is known exactly:
it stops clearly worse loads, and never one that would have become the best."""

from __future__ import annotations

from typing import Callable

import pytest

from autotune.execution.early_stop import (
    EVIDENCE_SHARE,
    GOOD_MAX,
    LAST_SHARE,
    MARGIN,
    MIN_SHARE,
    NOISE,
    NOISE_SDS,
    EarlyStop,
    StopRule,
    applies,
    optimistic_bound,
    value_to_beat,
    work,
)
from autotune.execution.workload import LoadProgress
from autotune.config.objective import STOP_MIN_REQUESTS, STOP_MIN_SECONDS, Objective
from autotune.errors import ConfigError

TOKENS = 10_000.0  # output tokens of the whole load
DT = 0.05  # seconds between progress reports


def _progress(t: float, tokens: float, *, completed: int = 0) -> LoadProgress:
    return LoadProgress(elapsed_s=t, completed=completed, failed=0, total=100, output_tokens=tokens,
                        input_tokens=0.0, output_tokens_total=TOKENS, input_tokens_total=0.0)


def _phases(*phases: tuple[float, float]) -> Callable[[float], float]:
    """Tokens delivered by time t for a load that runs each ``(seconds, tokens per second)`` phase
    in turn (the last one lasts until the load is done)."""
    def tokens(t: float) -> float:
        done, start = 0.0, 0.0
        for i, (seconds, rate) in enumerate(phases):
            last = i == len(phases) - 1
            span = t - start if last else min(t - start, seconds)
            if span <= 0:
                break
            done += span * rate
            start += seconds
        return min(TOKENS, done)
    return tokens


def _duration(tokens: Callable[[float], float]) -> float:
    lo, hi = 0.0, 1.0
    while tokens(hi) < TOKENS:
        hi *= 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if tokens(mid) < TOKENS else (lo, mid)
    return hi


def _run(tokens: Callable[[float], float], beat: float | None) -> tuple[StopRule, EarlyStop | None, float]:
    """Feed the rule the load's progress every DT until it stops or the load ends; the rule, the
    stop and the load's final value (tokens over duration). No least load: these check the bounds."""
    rule = StopRule("output_throughput", beat, min_requests=0, min_seconds=0.0)
    duration = _duration(tokens)
    t = DT
    while t < duration:
        stop = rule.observe(_progress(t, tokens(t)))
        if stop is not None:
            return rule, stop, TOKENS / duration
        t += DT
    return rule, rule.observe(_progress(duration, TOKENS)), TOKENS / duration


def test_a_steady_load_at_60_percent_of_the_value_to_beat_stops_at_the_minimum_share() -> None:
    rule, stop, final = _run(_phases((1.0, 500.0)), beat=500.0 / 0.6)
    assert stop is not None
    assert MIN_SHARE <= stop.share < MIN_SHARE + 0.01  # not before the rate is judged, and at once then
    assert stop.bound < stop.beat * (1 - NOISE) and stop.bound > final
    assert stop.rate == pytest.approx(500.0, rel=0.01) and stop.projected == pytest.approx(500.0, rel=0.01)
    assert rule.observe(_progress(100.0, TOKENS)) is stop  # a stop stands


@pytest.mark.parametrize("profile", [
    # a prefill phase that delivers no token for 40% of the load's time, then a steady decode
    ((8.0, 0.0), (1.0, 833.4)),
    # a slow start (first wave, cold caches) at a fifth of the later rate
    ((3.0, 100.0), (1.0, 600.0)),
    # waves: prefill pauses between decode bursts
    ((1.0, 0.0), (2.0, 700.0), (1.0, 0.0), (2.0, 700.0), (1.0, 0.0), (1.0, 700.0)),
    # most of the load 14% faster than its first quarter (within the 15% margin)
    ((1.0, 0.0), (4.0, 700.0), (1.0, 700.0 * 1.14)),
], ids=["long-prefill", "slow-start", "waves", "faster-later"])
def test_a_load_that_would_have_beaten_the_value_is_never_stopped(profile: tuple[tuple[float, float], ...]) -> None:
    tokens = _phases(*profile)
    final = TOKENS / _duration(tokens)
    # Early on, each of these runs below the value by its mean rate (a naive rule would stop it).
    early = _duration(tokens) * 0.3
    assert tokens(early) / early < final * 0.9
    _, stop, _ = _run(tokens, beat=final * 0.999)
    assert stop is None


def test_a_contender_within_the_noise_of_the_value_is_measured_to_the_end() -> None:
    _, stop, final = _run(_phases((1.0, 500.0)), beat=500.0 / (1 - NOISE / 2))
    assert stop is None and final < 500.0 / (1 - NOISE / 2)


def test_the_closer_to_the_value_the_later_the_stop_and_the_last_tenth_runs_to_its_end() -> None:
    _, far, _ = _run(_phases((1.0, 500.0)), beat=500.0 / 0.75)
    _, near, _ = _run(_phases((1.0, 500.0)), beat=500.0 / 0.95)
    _, nearer, _ = _run(_phases((1.0, 500.0)), beat=500.0 / 0.97)  # its bound falls below at 92%
    assert far is not None and near is not None and nearer is None
    assert far.share < near.share <= LAST_SHARE


def test_the_hard_bound_stops_a_very_slow_load_before_the_minimum_share() -> None:
    # At a tenth of the best's rate it has run longer than the best's whole load by 10% of its work.
    _, stop, _ = _run(_phases((1.0, 50.0)), beat=500.0)
    assert stop is not None
    assert EVIDENCE_SHARE <= stop.share < MIN_SHARE
    assert stop.bound == pytest.approx(TOKENS / stop.elapsed_s)


def test_a_server_that_delivers_nothing_is_left_to_the_request_timeouts() -> None:
    rule = StopRule("output_throughput", beat=500.0, min_requests=0, min_seconds=0.0)
    for i in range(1, 2000):  # 100 s without a token: far past the best's whole load
        assert rule.observe(_progress(i * DT, 0.0)) is None


def test_without_a_value_to_beat_nothing_stops_and_each_tenth_has_its_projected_value() -> None:
    rule, stop, final = _run(_phases((2.0, 0.0), (1.0, 400.0)), beat=None)
    assert stop is None
    assert sorted(rule.intermediate) == list(range(10, 101, 10))
    # From the first window past the prefill, the projection is the final value of a steady decode.
    assert rule.intermediate[30] == pytest.approx(TOKENS / (2.0 + TOKENS / 400.0), rel=0.02)
    assert rule.intermediate[100] == pytest.approx(final, rel=0.02)


def test_the_value_to_beat_is_the_last_of_tpes_good_trials_at_the_end_of_the_budget() -> None:
    measured = [float(v) for v in range(100, 0, -1)]  # 100 .. 1, in any order
    # TPE's good trials at the last trial: the best ceil(0.1 x budget), at most 25.
    assert value_to_beat(measured[:5], 10) == (100.0, "the best so far")  # 1 good trial in 10
    beat, why = value_to_beat(measured[::-1], 60)
    assert beat == 95.0 and why.startswith("the 6th best")
    assert value_to_beat(measured, 1000)[0] == value_to_beat(measured, None)[0] == 100.0 - (GOOD_MAX - 1)
    assert value_to_beat(measured[:5], 60) == (None, "")  # fewer measured than TPE's 6 good ones
    assert value_to_beat([], 1) == (None, "")
    assert value_to_beat([3.0, 1.0, 2.0], 20, maximize=False)[0] == 2.0


def test_no_stop_before_the_least_load_of_requests_and_seconds() -> None:
    """A load far below the value (a tenth of its rate) is stopped only once it has completed
    ``min_requests`` requests and run ``min_seconds``, whichever comes last."""
    def run(min_requests: int, min_seconds: float) -> EarlyStop | None:
        rule = StopRule("output_throughput", 500.0, min_requests=min_requests, min_seconds=min_seconds)
        t = DT
        while t < 200.0:
            tokens = 50.0 * t
            stop = rule.observe(_progress(t, tokens, completed=int(100 * tokens / TOKENS)))
            if stop is not None:
                return stop
            t += DT
        return None

    free = run(0, 0.0)  # the hard bound: past the best's whole load (20 s) and its noise
    assert free is not None and free.elapsed_s < 21.0
    by_seconds = run(0, 30.0)
    assert by_seconds is not None and 30.0 <= by_seconds.elapsed_s < 30.0 + 2 * DT
    by_requests = run(30, 0.0)  # 30 of 100 requests done at 60 s
    assert by_requests is not None and 60.0 - DT <= by_requests.elapsed_s < 60.0 + 2 * DT
    assert run(95, 0.0) is None  # the last tenth runs to its end: never stopped


def test_the_objective_states_the_least_load() -> None:
    default = Objective.from_mapping({"metric": "output_throughput"})
    rule = StopRule.for_objective(default, 1.0)
    assert (rule.min_requests, rule.min_seconds) == (STOP_MIN_REQUESTS, STOP_MIN_SECONDS) and applies(default)
    stated = Objective.from_mapping({"metric": "output_throughput", "early_stop": {"min_requests": 8, "min_seconds": 2.5}})
    assert applies(stated)
    rule = StopRule.for_objective(stated, 1.0, "why")
    assert (rule.metric, rule.beat, rule.why, rule.min_requests, rule.min_seconds) == ("output_throughput", 1.0, "why", 8, 2.5)
    with pytest.raises(ConfigError, match="min_seconds"):
        Objective.from_mapping({"early_stop": {"min_seconds": -1}})
    with pytest.raises(ConfigError, match="min_request"):
        Objective.from_mapping({"early_stop": {"min_request": 3}})


def test_the_value_to_beat_is_lowered_by_the_measured_noise() -> None:
    measured = [100.0, 90.0, 80.0]
    assert value_to_beat(measured, 10, noise_sd=None) == (100.0, "the best so far")
    beat, why = value_to_beat(measured, 10, noise_sd=0.05)
    assert beat == pytest.approx(100.0 * (1 - NOISE_SDS * 0.05)) and "5.0%" in why
    assert value_to_beat(measured, 10, noise_sd=0.0)[0] == 100.0


def test_optimistic_bound() -> None:
    assert optimistic_bound(10.0, 1000.0, 10_000.0, peak_rate=200.0) == 1000.0  # before MIN_SHARE: hard
    assert optimistic_bound(10.0, 5000.0, 10_000.0, peak_rate=None) == 1000.0
    rest = 5000.0 / (200.0 * (1 + MARGIN))
    assert optimistic_bound(10.0, 5000.0, 10_000.0, peak_rate=200.0) == pytest.approx(10_000.0 / (10.0 + rest))


def test_work_of_each_bounded_metric() -> None:
    p = LoadProgress(elapsed_s=1.0, completed=3, failed=1, total=10, output_tokens=50.0, input_tokens=200.0,
                     output_tokens_total=160.0, input_tokens_total=640.0)
    assert work("output_throughput", p) == (50.0, 160.0)
    assert work("total_throughput", p) == (250.0, 800.0)
    assert work("request_throughput", p) == (3.0, 10.0)
    with pytest.raises(KeyError, match="p99_ttft_ms"):
        work("p99_ttft_ms", p)
    with pytest.raises(KeyError, match="mean_e2e_latency_ms"):
        StopRule("mean_e2e_latency_ms", 1.0)


@pytest.mark.parametrize(("data", "expected"), [
    ({"metric": "output_throughput"}, True),
    ({"metric": "request_throughput"}, True),
    ({"metric": "output_throughput", "early_stop": False}, False),
    ({"metric": "p99_ttft_ms", "direction": "minimize"}, False),
    ({"metric": "output_throughput", "direction": "minimize"}, False),
    ({"metric": "output_throughput", "benchmark": {"command": "bench --port {port}", "parse": "sglang-bench-serving"}},
     False),
], ids=["output", "requests", "turned-off", "latency", "minimised", "benchmark-command"])
def test_which_objectives_stop_early(data: dict[str, object], expected: bool) -> None:
    assert applies(Objective.from_mapping(data)) is expected
