"""Reading the engine's scheduler log (autotune.outcome.load_signals): the lines as SGLang 0.5.23 and
vLLM print them, and what they call for."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from autotune.bench.setups import Setup
from autotune.study.driver import Driver
from autotune.outcome.load_signals import ATTR as SIGNALS_ATTR, LoadSignals, raises_called_for
from autotune.bench.model_executor import ModelExecutor
from autotune.study.notes import note_for
from autotune.study.progress import ConsoleReporter
from tests.helpers.cli import autotune

# SGLang 0.5.23 (sglang/srt/managers/scheduler_components/metrics_reporter.py): a prefill line's
# #running-req is the running batch its #new-seq join; a decode line's is the batch decoded
SGLANG = [
    "[2026-12-03 10:00:00 TP0] Prefill batch, #new-seq: 64, #new-token: 4096, #cached-token: 0, token usage: 0.05, "
    "#running-req: 0, #queue-req: 128, #pending-token: 0, ",
    "[2026-12-03 10:00:01 TP0] Decode batch, #running-req: 64, #token: 5000, token usage: 0.06, cuda graph: False, "
    "gen throughput (token/s): 812.40, #queue-req: 128",
    "[2026-12-03 10:00:02 TP0] Prefill batch [812], #new-seq: 10, #new-token: 640, #cached-token: 0, "
    "token usage: 0.05, #running-req: 54, #queue-req: 118, #pending-token: 0, ",
    "[2026-12-03 10:00:03 TP0] Decode batch, #running-req: 20, #token: 900, token usage: 0.01, cuda graph: True, "
    "gen throughput (token/s): 300.00, #queue-req: 0",
]
# vLLM V1 (vllm/v1/metrics/loggers.py, LoggingStatLogger)
VLLM = ["INFO 12-03 10:00:05 [loggers.py:123] Engine 000: Avg prompt throughput: 812.4 tokens/s, Avg generation "
        "throughput: 300.0 tokens/s, Running: 256 reqs, Waiting: 40 reqs, GPU KV cache usage: 31.2%, "
        "Prefix cache hit rate: 0.0%"]


def _read(lines: list[str]) -> LoadSignals:
    signals = LoadSignals()
    for line in lines:
        signals.observe(line)
    return signals


def test_sglang_lines_count_the_new_sequences_of_a_prefill_in_flight() -> None:
    s = _read(["INFO:     Uvicorn running on http://127.0.0.1:30000", *SGLANG, "The server is fired up"])
    assert (s.lines, s.in_flight_max, s.queued_at_max, s.queued_max, s.demand_max) == (4, 64, 128, 128, 192)


def test_vllm_lines() -> None:
    s = _read(VLLM)
    assert (s.lines, s.in_flight_max, s.queued_at_max, s.demand_max) == (1, 256, 40, 296)


def test_a_full_cap_is_raised_to_the_demand_or_the_clients() -> None:
    s = _read(SGLANG)
    assert raises_called_for(s, {"slots": "queued"}, {"slots": 64}) == {"slots": 192}
    assert raises_called_for(s, {"slots": "queued"}, {"slots": 64}, concurrency=256) == {"slots": 256}
    assert raises_called_for(s, {"graph": "running-above"}, {"graph": 32}) == {"graph": 64}
    # a cap the scheduler never filled (memory or a prefill's budget held it back), a limit not
    # outgrown, a value that is not a number, a parameter not in the trial: nothing
    assert raises_called_for(s, {"slots": "queued"}, {"slots": 100}, concurrency=256) == {}
    assert raises_called_for(s, {"graph": "running-above"}, {"graph": 64}) == {}
    assert raises_called_for(s, {"slots": "queued"}, {"slots": "unset"}) == {}
    assert raises_called_for(s, {"slots": "queued"}, {}) == {}
    assert raises_called_for(LoadSignals(), {"slots": "queued"}, {"slots": 1}) == {}
    assert raises_called_for(None, {"slots": "queued"}, {"slots": 1}) == {}


@pytest.mark.parametrize("attr", [None, "x", {"lines": 2}, {**LoadSignals().to_attr(), "lines": "many"}])
def test_a_stored_attribute_not_in_this_form_is_no_signal(attr: object) -> None:
    assert LoadSignals.from_attr(attr) is None
    assert LoadSignals.from_attr(_read(SGLANG).to_attr()) == _read(SGLANG)


def test_a_study_raises_the_baselines_full_cap_right_after_it(tmp_path: Path) -> None:
    """The real driver on the simulated GLM-5 host's model: the baseline runs 128 requests at a
    time under the load's 192 clients, its trial records what the scheduler showed, and the
    next trial is the baseline with ``--max-running-requests`` 192."""
    setup = Setup("rtx6000-pcie-glm5", "sglang_nccl", "quick", None)
    cfg = setup.config(name="raise", storage=f"sqlite:///{tmp_path}/s.db", sampler="tpe", seed=0, trials=2)
    executor = ModelExecutor.for_target(cfg, setup.objective, seed=0, scenario=setup.scenario)
    console = io.StringIO()
    reporter = ConsoleReporter(Console(file=console, width=200, force_terminal=False, color_system=None))
    study = Driver(cfg, setup.space, setup.objective, executor, reporter=reporter, trials=2).run().study
    base, raised = study.trials
    signals = LoadSignals.from_attr(base.user_attrs[SIGNALS_ATTR])
    assert signals is not None and signals.in_flight_max == 128 and signals.queued_at_max == 64
    assert raised.params == {**base.params, "max_running_requests": 192}
    assert raised.value > base.value * 1.2  # 0.59 -> 0.78 of the optimum (docs/BENCHMARKS.md)

    # what a person reads of it: study show, its JSON, the trial's Note in the dashboard
    why = ("max_running_requests raised from 128 to 192: the scheduler log of trial 0 (the best so far) "
           "showed 64 requests waiting while 128 ran")
    shown = autotune("study", "show", "raise", "--storage", f"sqlite:///{tmp_path}/s.db", "--no-excerpts", cwd=tmp_path)
    assert f"trial 1: {why}" in shown.stdout.replace("\n", " ")
    assert f"\n  {why}\n" in console.getvalue()  # the live console, as trial 1 starts
    doc = json.loads(autotune("study", "show", "raise", "--storage", f"sqlite:///{tmp_path}/s.db", "--json",
                              cwd=tmp_path).stdout)
    first, second = doc["trials"]
    assert first["proposed"] is None and first["load_signals"]["queued_at_max"] == 64
    assert second["proposed"] == {"by": "raise", "param": "max_running_requests", "from": 128, "to": 192, "after": 0,
                                  "signal": "queued", "in_flight": 128, "waiting": 64}
    assert f"**Proposed:** {why}.".replace("_", "\\_") in note_for(study, raised)  # Markdown-escaped
    assert "**Load in the engine's log:** at most 128 requests running at once, with 64 waiting" in note_for(study, base)
