"""The transformers preset without the engine: its command and how it classifies the engine's texts.

The log lines are the ones transformers 5.17 and 5.24 printed for deliberately bad values (see
docs/engines.md); the real engine runs in test_transformers_serve.py.
"""

from __future__ import annotations

import sys

import pytest

from autotune.engines import get_preset
from autotune.outcome.failures import classify
from autotune.testing.tiny_model import parameter_count

PRESET = get_preset("transformers")


def test_command_pins_the_model_and_turns_continuous_batching_on() -> None:
    argv = PRESET.argv(port=8123, fields={"model": "/models/tiny llama"})
    assert argv == [sys.executable, "-m", "transformers.cli.transformers", "serve", "/models/tiny llama",
                    "--host", "127.0.0.1", "--port", "8123", "--continuous-batching"]
    assert PRESET.api == "openai" and PRESET.ready_path == "/health" and PRESET.default_port == 8000


@pytest.mark.parametrize(
    ("log", "kind", "phase"),
    [
        # 5.24: raised in the request handler (HTTP 500), traceback in the log.
        ("Traceback (most recent call last):\n  File \"x.py\"\n"
         "ValueError: page_size must be at least 4 but got cb_config.page_size = 0", "invalid-argument", "launching"),
        # 5.17: the continuous-batching worker thread dies.
        ("2026-11-30 21:07:45,405 - ContinuousBatchingLogger - ERROR - Error in generation loop: "
         "Block size must be at least 4, but got 0\nValueError: Block size must be at least 4, but got 0",
         "invalid-argument", "launching"),
        ("ContinuousBatchingLogger - ERROR - Error in generation loop: Invalid values: max_batch_tokens = -1, "
         "num_sectors = 9899", "invalid-argument", "launching"),
        ("ValueError: Invalid values: max_batch_tokens = 8192, num_sectors = -20", "not-enough-memory", "launching"),
        ("ValueError: Invalid values: max_batch_tokens = 16384, num_blocks = 0", "not-enough-memory", "launching"),
        ("ValueError: No real solution (discriminant = -21872759111.680004)", "not-enough-memory", "launching"),
        ("RuntimeError: [enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
         "you tried to allocate 35987128320 bytes. Error code 12 (Cannot allocate memory)", "oom", "launching"),
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 40.00 GiB.", "oom", "launching"),
        ("ValueError: Unsupported attention implementation: 'bogus'. Must be one of {'sdpa'}", "invalid-argument",
         "launching"),
        ("Usage: transformers serve [OPTIONS] [FORCE_MODEL]\nTry 'transformers serve --help' for help.\n\n"
         "Error: No such option '--cb-nonsense'.", "invalid-argument", "launching"),
        ("Error: Invalid value for '--cb-block-size': 'abc' is not a valid integer.", "invalid-argument", "launching"),
        ("ContinuousBatchingLogger - ERROR - Error in generation loop: something new", "crash", "launching"),
    ],
)
def test_engine_texts_are_classified(log: str, kind: str, phase: str) -> None:
    failure = classify(log, phase=phase, exit_code=None, patterns=PRESET.patterns)
    assert failure.kind == kind, failure
    assert failure.message  # the engine's own line


def test_an_error_under_load_keeps_the_engine_kind_with_the_phase() -> None:
    failure = classify("ValueError: Block size must be at least 4, but got 2", phase="measuring", exit_code=None,
                       patterns=PRESET.patterns)
    assert (failure.kind, failure.phase) == ("invalid-argument", "load")
    assert "Block size must be at least 4" in failure.message


def test_ordinary_startup_lines_are_not_failures() -> None:
    log = """[transformers] Loading /tmp/tiny
INFO:     Started server process [8873]
INFO:     Uvicorn running on http://127.0.0.1:18001 (Press CTRL+C to quit)
[transformers] Ignoring unsupported fields in the request: {'stream_options'}
2026-11-30 20:53:39,491 - ContinuousBatchingLogger - WARNING - `eos_token_id` not set in GenerationConfig. Setting to -1 (disabled).
2026-11-30 20:55:32,776 - ContinuousBatchingLogger - WARNING - cb_config.use_cuda_graph = True but no graph backend is available: turning off accelerator graphs.
INFO:     127.0.0.1:41568 - "POST /v1/completions HTTP/1.1" 200 OK"""
    from autotune.outcome.failures import find_error

    assert find_error(log, PRESET.patterns) is None


def test_parameter_count_of_the_benchmark_shapes() -> None:
    assert parameter_count(hidden_size=64, layers=2, vocab=1024) == 237_888
    assert 2.9e9 < parameter_count(hidden_size=3072, layers=28, vocab=32000) < 3.1e9
    with pytest.raises(ValueError):
        parameter_count(hidden_size=100, layers=2, vocab=1024, heads=3)
