"""Tests of the load generator against a real streaming HTTP server (tests/streaming_server.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
import json
import math
from pathlib import Path
import statistics
import subprocess
import sys
import time
from typing import Any, Literal
import urllib.request

import pytest

from autotune.util.net import free_port
from autotune.execution.loadgen import LoadError, run_load_sync
from autotune.execution.workload import Dataset, LoadProgress, Workload
from autotune.execution.load_client import Client as _Client
from autotune.execution.prompts import make_prompts
from tests.needs import require_modules

SERVER = Path(__file__).resolve().parents[1] / "streaming_server.py"
TTFT = 0.02  # the server's defaults, seconds
DELAY = 0.005

StartServer = Callable[..., str]
Api = Literal["openai", "sglang"]


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


@pytest.fixture
def start_server() -> Iterator[StartServer]:
    """Starts ``streaming_server.py`` with the given flags; returns its base URL once it answers."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(*flags: str) -> str:
        port = free_port()
        proc = subprocess.Popen([sys.executable, str(SERVER), "--port", str(port), *flags],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 15
        while True:
            try:
                _get(url + "/stats")
                return url
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"test server did not start (exit code {proc.poll()})") from None
                time.sleep(0.05)

    yield start
    for proc in procs:
        proc.kill()
        proc.wait(timeout=10)


def _expected_latency(output_len: int, chunk_tokens: int = 1) -> float:
    """The test server's request latency: first token after TTFT, then chunks on a fixed schedule."""
    chunks_after_first = -(-(output_len - 1) // chunk_tokens)
    return TTFT + chunks_after_first * chunk_tokens * DELAY


SLACK_MS = 0.1


class _Served:
    """The schedule as the test server ran it (its ``/stats`` timings), in milliseconds.

    On a loaded machine the server's timers fire late, and the client may wait for a core before it
    reads a chunk, so its numbers are checked against what the server did: from below exactly (the
    client stamps a request before the server sees it and a chunk after the server wrote it, so
    each of its times is at least the server's, less ``SLACK_MS`` for two clocks), from above loosely
    enough for a stalled client yet tightly enough to catch a wrong quantity (or exactly: see the
    duration's check in ``test_counts_throughput_and_latency``).
    """

    def __init__(self, stats: dict[str, Any], output_len: int, skip: int = 0) -> None:
        rows = stats["timings"][skip:]
        self.count = len(rows)
        self.ttft_ms = statistics.median((first - arrival) * 1000 for arrival, first, _ in rows)
        self.e2e_ms = statistics.median((last - arrival) * 1000 for arrival, _, last in rows)
        self.tpot_ms = statistics.median((last - first) * 1000 / (output_len - 1) for _, first, last in rows)
        self.span_s = max(last for _, _, last in rows) - min(arrival for arrival, _, _ in rows)


@pytest.mark.parametrize("api", ["openai", "sglang"])
def test_counts_throughput_and_latency(start_server: StartServer, api: Api) -> None:
    url = start_server()
    progress: list[LoadProgress] = []
    w = Workload(api=api, num_prompts=32, concurrency=8, input_len=64, output_len=40, warmup_prompts=4)
    result = run_load_sync(url, w, on_progress=progress.append)
    stats = _get(url + "/stats")

    assert (result.completed, result.failed, result.errors) == (32, 0, [])
    m = result.metrics
    # Token counts are exact, and warm-up requests (sent: the server saw them) are not counted.
    assert stats["requests"] == 36 and stats["max_tokens"] == [40]
    assert m["output_tokens"] == 32 * 40 and m["input_tokens"] == 32 * 64
    assert m["completed"] == 32 and m["failed"] == 0 and m["max_concurrency"] == 8
    # Concurrency respected and reached.
    assert stats["max_in_flight"] == 8
    # 32 requests, 8 at a time: 4 waves of at least one request latency each. The duration covers
    # the server's span of the 32 measured requests (the 4 warm-up ones came first), and not the
    # span from the first warm-up request: the client starts its clock only once the warm-up's
    # last chunk has reached it, a request latency after that one arrived at the server.
    served, whole = _Served(stats, 40, skip=4), _Served(stats, 40)
    latency = _expected_latency(40)
    assert served.count == 32 and whole.count == 36 and served.span_s >= 0.99 * 4 * latency
    assert served.span_s - SLACK_MS / 1000 <= result.duration_s < whole.span_s
    assert m["output_throughput"] == pytest.approx(32 * 40 / result.duration_s, rel=1e-9)
    assert m["total_throughput"] == pytest.approx(32 * (40 + 64) / result.duration_s, rel=1e-9)
    assert m["request_throughput"] == pytest.approx(32 / result.duration_s, rel=1e-9)
    # TTFT is the first token's time, far from the request's whole latency.
    assert TTFT * 1000 <= served.ttft_ms - SLACK_MS <= m["median_ttft_ms"] < served.e2e_ms / 2
    assert m["p99_ttft_ms"] >= m["median_ttft_ms"]
    # Per token, one token per chunk: TPOT and ITL are the server's time per token.
    assert m["median_tpot_ms"] == pytest.approx(served.tpot_ms, rel=0.5)
    assert m["median_itl_ms"] == pytest.approx(served.tpot_ms, rel=0.5)
    assert 0.99 * latency * 1000 <= served.e2e_ms - SLACK_MS <= m["median_e2e_latency_ms"] <= 1.5 * served.e2e_ms
    # Progress: monotone, ends at (total, total) with every token, warm-up not reported; tokens of
    # requests in flight count as they stream (not only when their request completes).
    last = progress[-1]
    assert (last.done, last.total, last.completed) == (32, 32, 32)
    assert (last.output_tokens, last.input_tokens) == (32 * 40, 32 * 64)
    assert (last.output_tokens_total, last.input_tokens_total) == (32 * 40, 32 * 64)
    for key in ("done", "elapsed_s", "output_tokens"):
        values = [getattr(p, key) for p in progress]
        assert values == sorted(values), key
    assert all(p.total == 32 for p in progress)
    assert any(p.output_tokens > 40 * p.completed for p in progress)


@pytest.mark.parametrize(("api", "itl_tokens"), [("openai", 4), ("sglang", 1)])
def test_coalesced_chunks(start_server: StartServer, api: Api, itl_tokens: int) -> None:
    """Chunks of 4 tokens: counts from the server are exact; SGLang's ITL is per token, OpenAI's per chunk."""
    url = start_server("--chunk-tokens", "4")
    w = Workload(api=api, num_prompts=8, concurrency=8, input_len=16, output_len=41, warmup_prompts=0)
    result = run_load_sync(url, w)
    m = result.metrics
    served = _Served(_get(url + "/stats"), 41)
    assert result.completed == 8 and m["output_tokens"] == 8 * 41
    # 41 tokens = 1 + 10 chunks of 4, one every 4 * DELAY (or later, on a loaded machine): TPOT is
    # the server's time per token, ITL that per token (SGLang) or per chunk of 4 (OpenAI).
    assert m["median_tpot_ms"] == pytest.approx(served.tpot_ms, rel=0.5)
    assert m["median_itl_ms"] == pytest.approx(itl_tokens * served.tpot_ms, rel=0.5)
    expected_ms = _expected_latency(41, 4) * 1000
    assert 0.99 * expected_ms <= served.e2e_ms - SLACK_MS <= m["median_e2e_latency_ms"] <= 1.5 * served.e2e_ms


def test_tokens_counted_from_chunks_without_usage(start_server: StartServer) -> None:
    url = start_server("--no-usage")
    result = run_load_sync(url, Workload(num_prompts=8, concurrency=4, input_len=16, output_len=25, warmup_prompts=0))
    assert result.completed == 8 and result.metrics["output_tokens"] == 8 * 25
    # Without a usage chunk the prompt size is the workload's.
    assert result.metrics["input_tokens"] == 8 * 16


def test_model_lookup_and_wrong_model(start_server: StartServer) -> None:
    url = start_server("--model", "served-name")
    assert run_load_sync(url, Workload(num_prompts=4, concurrency=4, output_len=4, warmup_prompts=0)).completed == 4
    result = run_load_sync(url, Workload(num_prompts=4, concurrency=4, output_len=4, warmup_prompts=0, model="other"))
    assert (result.completed, result.failed) == (0, 4)
    assert len(result.errors) == 1 and result.errors[0].startswith("HTTP 404:")
    assert "mean_ttft_ms" not in result.metrics and result.metrics["output_throughput"] == 0


def test_http_errors_and_truncated_streams_are_failures(start_server: StartServer) -> None:
    url = start_server("--fail-every", "4")
    result = run_load_sync(url, Workload(api="sglang", num_prompts=16, concurrency=4, output_len=10, warmup_prompts=0))
    assert (result.completed, result.failed) == (12, 4)
    assert result.errors == ["HTTP 500: injected failure"]
    assert result.metrics["output_tokens"] == 12 * 10

    url = start_server("--truncate-every", "4")
    result = run_load_sync(url, Workload(num_prompts=16, concurrency=4, output_len=10, warmup_prompts=0))
    assert (result.completed, result.failed) == (12, 4)
    assert len(result.errors) == 1 and "without data: [DONE]" in result.errors[0]


def _finite_latencies(metrics: dict[str, float]) -> dict[str, float]:
    """The latency statistics of ``metrics``, each checked to be a finite number >= 0."""
    latencies = {k: v for k, v in metrics.items() if k.endswith("_ms")}
    assert all(math.isfinite(v) and v >= 0 for v in latencies.values()), latencies
    return latencies


@pytest.mark.parametrize("api", ["openai", "sglang"])
def test_streams_without_text_complete_with_the_servers_token_count(start_server: StartServer, api: Api) -> None:
    """Every 4th stream carries only empty-text chunks (a random model's tokens can decode to
    nothing) but a right usage / meta_info count and [DONE]: it is a completed request, as in
    vllm bench serve and sglang.bench_serving, and its tokens count."""
    url = start_server("--empty-every", "4")
    w = Workload(api=api, num_prompts=16, concurrency=4, input_len=16, output_len=10, warmup_prompts=0)
    result = run_load_sync(url, w)
    assert (result.completed, result.failed, result.errors) == (16, 0, [])
    assert result.metrics["output_tokens"] == 16 * 10
    assert result.metrics["input_tokens"] == 16 * 16
    latencies = _finite_latencies(result.metrics)
    for name in ("ttft", "tpot", "itl", "e2e_latency"):
        assert {f"mean_{name}_ms", f"median_{name}_ms", f"p99_{name}_ms"} <= set(latencies)


def test_streams_without_text_or_usage_complete_with_zero_tokens(start_server: StartServer) -> None:
    """No usage chunk: output tokens are the chunks that carried text, so an empty stream
    completes with 0 tokens, and the zero-token requests leave TPOT/ITL statistics intact."""
    url = start_server("--empty-every", "4", "--no-usage")
    w = Workload(num_prompts=16, concurrency=4, input_len=16, output_len=10, warmup_prompts=0)
    result = run_load_sync(url, w)
    assert (result.completed, result.failed) == (16, 0)
    assert result.metrics["output_tokens"] == 12 * 10
    assert "mean_tpot_ms" in _finite_latencies(result.metrics)

    url = start_server("--empty-every", "1", "--no-usage")
    result = run_load_sync(url, Workload(num_prompts=8, concurrency=4, output_len=10, warmup_prompts=0))
    assert (result.completed, result.failed) == (8, 0)
    assert result.metrics["output_tokens"] == 0 and result.metrics["output_throughput"] == 0
    latencies = _finite_latencies(result.metrics)
    # TTFT of a stream without text: its first chunk with a choice (vllm bench serve's TTFT);
    # no request delivered two tokens, so there is no TPOT and no ITL (absent, not NaN or 0).
    assert "median_ttft_ms" in latencies and "median_e2e_latency_ms" in latencies
    assert not any(k.endswith(("_tpot_ms", "_itl_ms")) for k in latencies)


@pytest.mark.parametrize("api", ["openai", "sglang"])
def test_an_empty_stream_without_done_is_still_a_failure(start_server: StartServer, api: Api) -> None:
    url = start_server("--empty-every", "1", "--truncate-every", "2")
    result = run_load_sync(url, Workload(api=api, num_prompts=8, concurrency=4, output_len=6, warmup_prompts=0))
    assert (result.completed, result.failed) == (4, 4)
    assert len(result.errors) == 1 and result.errors[0].startswith("IncompleteStream:")
    assert result.metrics["output_tokens"] == 4 * 6


@pytest.mark.parametrize(("api", "empty"), [("openai", "0"), ("openai", "1"), ("sglang", "1")])
def test_an_error_event_is_a_failure(start_server: StartServer, api: Api, empty: str) -> None:
    """A stream that carries an error event fails, though it ends with [DONE] and HTTP 200."""
    url = start_server("--error-every", "2", "--empty-every", empty)
    result = run_load_sync(url, Workload(api=api, num_prompts=8, concurrency=4, output_len=6, warmup_prompts=0))
    assert (result.completed, result.failed) == (4, 4)
    assert len(result.errors) == 1 and result.errors[0].startswith("StreamError:")
    assert "injected error event" in result.errors[0]


def test_a_stream_ended_by_finish_and_usage_completes_without_done(start_server: StartServer) -> None:
    """transformers serve sends no [DONE]: a last chunk with finish_reason and a usage chunk end
    the stream, also when its chunks carried no text; without the usage it is incomplete."""
    url = start_server("--no-done", "--empty-every", "2")
    result = run_load_sync(url, Workload(num_prompts=8, concurrency=4, output_len=6, warmup_prompts=0))
    assert (result.completed, result.failed, result.errors) == (8, 0, [])
    assert result.metrics["output_tokens"] == 8 * 6

    url = start_server("--no-done", "--no-usage")
    result = run_load_sync(url, Workload(num_prompts=4, concurrency=4, output_len=6, warmup_prompts=0))
    assert (result.completed, result.failed) == (0, 4)
    assert result.errors[0].startswith("IncompleteStream:")


@pytest.mark.parametrize("field", ["ignore_eos", "stream_options"])
def test_a_refused_optional_field_is_left_out(start_server: StartServer, field: str) -> None:
    """A server answering HTTP 422 to a field outside its schema: the request is sent again
    without it, and so are the later ones; without stream_options, tokens come from the chunks."""
    url = start_server("--reject-field", field)
    result = run_load_sync(url, Workload(num_prompts=8, concurrency=1, output_len=6, warmup_prompts=0))
    stats = _get(url + "/stats")
    assert (result.completed, result.failed, result.errors) == (8, 0, [])
    assert result.metrics["output_tokens"] == 8 * 6
    assert stats["requests"] == 8 + 1  # one refused request, then none


@pytest.mark.parametrize("rate", [None, 20.0])
def test_server_exit_mid_run_ends_promptly(start_server: StartServer, rate: float | None) -> None:
    url = start_server("--exit-after", "10", "--exit-delay", "0.1")
    w = Workload(num_prompts=200, concurrency=8, output_len=100, warmup_prompts=0, request_rate=rate)
    result = run_load_sync(url, w)
    # Promptly: the requests after the crash are refused at once (connection errors), none waits
    # out its timeout (no wall-clock bound: CI's machine is loaded).
    assert result.completed < 10 and result.completed + result.failed == 200
    assert not any(e.startswith("TimeoutError") for e in result.errors)
    assert any("ClientConnectorError" in e for e in result.errors)
    assert result.metrics["output_tokens"] == result.completed * 100


def test_should_stop_cancels_in_flight(start_server: StartServer) -> None:
    url = start_server("--token-delay", "0.05")
    w = Workload(num_prompts=64, concurrency=4, output_len=100, warmup_prompts=0)  # 5 s per request
    started = time.monotonic()
    result = run_load_sync(url, w, should_stop=lambda: time.monotonic() - started > 0.3)
    # Each request would take 5 s: none completed, the 4 in flight were cancelled.
    assert (result.completed, result.failed) == (0, 4)
    assert result.duration_s >= 0.3
    assert any(e.startswith("Cancelled:") for e in result.errors)


def test_request_timeout(start_server: StartServer) -> None:
    url = start_server("--ttft", "3")
    result = run_load_sync(url, Workload(num_prompts=4, concurrency=4, warmup_prompts=0, request_timeout_s=0.3))
    assert (result.completed, result.failed) == (0, 4)
    assert result.errors == ["TimeoutError: no complete response within 0.3 s"]


def test_poisson_arrivals(start_server: StartServer) -> None:
    url = start_server()
    w = Workload(num_prompts=40, concurrency=40, output_len=5, warmup_prompts=0, request_rate=40.0)
    result = run_load_sync(url, w)
    stats = _get(url + "/stats")
    assert result.completed == 40
    # 40 arrivals at 40/s span about a second (closed loop would take one latency, ~0.04 s), and
    # requests of ~0.04 s then rarely overlap (closed loop would put all 40 in flight).
    assert result.duration_s > 0.5
    assert stats["max_in_flight"] < 40


def test_a_raising_progress_callback_is_raised(start_server: StartServer) -> None:
    """A bug in the caller's callback ends the run with that exception: never swallowed, never a hang."""
    url = start_server()

    def broken(p: LoadProgress) -> None:
        raise RuntimeError(f"progress display broke at {p.done}/{p.total}")

    w = Workload(num_prompts=8, concurrency=4, output_len=5, warmup_prompts=0, request_timeout_s=30)
    with pytest.raises(RuntimeError, match="progress display broke at"):
        run_load_sync(url, w, on_progress=broken)


def test_dead_server_fails_fast() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    result = run_load_sync(url, Workload(num_prompts=50, concurrency=8))
    assert (result.completed, result.failed) == (0, 50)
    assert result.errors[0].startswith("GET /v1/models: ClientConnectorError")


def test_prompts_are_deterministic_and_sized() -> None:
    w = Workload(input_len=100, output_len=7)
    prompts = make_prompts(w, ("m",))  # no tokenizer named "m" here: the approximation, in words
    assert not prompts.exact and "not tokens" in prompts.note and "'m'" in prompts.note
    client = _Client(None, "http://x", w, "m", prompts)  # type: ignore[arg-type]
    body = client.payload(client.prompt(0, 3))
    assert body == client.payload(client.prompt(0, 3)) and body != client.payload(client.prompt(0, 4))
    assert len(body["prompt"].split()) == 100 and body["max_tokens"] == 7 and body["ignore_eos"] is True
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    other = make_prompts(Workload(input_len=100, seed=1), ("m",))
    assert other.measured[3].text != body["prompt"]
    sg = Workload(api="sglang", input_len=100)
    ids = _Client(None, "http://x", sg, None, make_prompts(sg)).payload(make_prompts(sg).measured[0])["input_ids"]  # type: ignore[arg-type]
    assert len(ids) == 100 and all(isinstance(i, int) and i > 0 for i in ids)


def _sharegpt_file(path: Path) -> Path:
    """A ShareGPT file: five usable conversations, one too short, one of a single turn."""
    rows = [{"conversations": [{"from": "human", "value": f"question {i} " + "word " * (5 + i)},
                               {"from": "gpt", "value": "answer " * (4 + 2 * i)}]} for i in range(5)]
    rows += [{"conversations": [{"from": "human", "value": "too short"}, {"from": "gpt", "value": "a b c d e"}]},
             {"conversations": [{"from": "human", "value": "one turn only here ok"}]}]
    path.write_text(json.dumps(rows))
    return path


def test_sharegpt_prompts_are_the_first_turns_and_the_answers_lengths(start_server: StartServer,
                                                                      tmp_path: Path) -> None:
    url = start_server()
    data = _sharegpt_file(tmp_path / "sharegpt.json")
    w = Workload(num_prompts=8, concurrency=4, warmup_prompts=0, dataset=Dataset(str(data)))
    prompts = make_prompts(w, ("test-model",))  # the names run_load tries: the test server's model
    # Without a tokenizer the lengths are words (the test server counts a word as a token).
    assert not prompts.exact and "ShareGPT" in prompts.note and "words" in prompts.note
    assert {p.text.split()[1] for p in prompts.measured if p.text} <= {"0", "1", "2", "3", "4"}
    for p in prompts.measured:
        i = int(p.text.split()[1])  # type: ignore[union-attr]
        assert (p.input_len, p.output_len) == (7 + i, 4 + 2 * i)
    result = run_load_sync(url, w)
    assert result.completed == 8 and result.prompts == prompts.note
    assert result.metrics["output_tokens"] == sum(p.output_len for p in prompts.measured)
    assert result.metrics["input_tokens"] == sum(p.input_len for p in prompts.measured)
    # The dataset's output_len replaces the answers' lengths; the shuffle follows the seed.
    fixed = make_prompts(Workload(num_prompts=8, dataset=Dataset(str(data), output_len=3)))
    assert {p.output_len for p in fixed.measured} == {3}
    assert [p.text for p in make_prompts(Workload(num_prompts=5, dataset=Dataset(str(data)), seed=1)).measured] != \
        [p.text for p in make_prompts(Workload(num_prompts=5, dataset=Dataset(str(data)))).measured]


def test_unreadable_dataset_or_tokenizer_is_a_load_error(start_server: StartServer, tmp_path: Path) -> None:
    url = start_server()
    (tmp_path / "bad.json").write_text("{not json")
    for w in (Workload(num_prompts=2, dataset=Dataset(str(tmp_path / "missing.json"))),
              Workload(num_prompts=2, dataset=Dataset(str(tmp_path / "bad.json"))),
              Workload(num_prompts=2, tokenizer=str(tmp_path / "no-such-model"))):
        with pytest.raises(LoadError) as info:
            run_load_sync(url, w)
        assert "\n" not in str(info.value)


def test_random_prompts_are_tokens_of_the_models_tokenizer(tmp_path: Path) -> None:
    """vLLM's random dataset: each prompt re-encodes to exactly its tokens (the tiny model's
    tokenizer adds no special token); the SGLang API gets the ids themselves."""
    require_modules(("torch", "transformers", "tokenizers"), "a tokenizer", "pip install torch transformers")
    from autotune.testing import make_tiny_llama
    from transformers import AutoTokenizer

    model = make_tiny_llama(tmp_path / "tiny", hidden_size=64, layers=2, vocab=1024)
    tok = AutoTokenizer.from_pretrained(str(model))
    w = Workload(num_prompts=16, input_len=32, output_len=5, warmup_prompts=2)
    prompts = make_prompts(w, (None, str(model)))
    assert prompts.exact and prompts.tokenizer == str(model) and "32 tokens" in prompts.note
    assert len(prompts.measured) == 16 and len(prompts.warmup) == 2
    for p in prompts.measured + prompts.warmup:
        assert p.input_len == 32 and len(tok(p.text).input_ids) == 32, p.text
    assert make_prompts(w, (str(model),)) == prompts  # deterministic
    sg = make_prompts(Workload(api="sglang", num_prompts=4, input_len=20), (str(model),))
    assert all(p.ids is not None and len(p.ids) == 20 and max(p.ids) < 1024 for p in sg.measured)
    # ShareGPT with the tokenizer: lengths are its token counts, as vllm bench serve counts them.
    data = _sharegpt_file(tmp_path / "sharegpt.json")
    shared = make_prompts(Workload(num_prompts=6, dataset=Dataset(str(data))), (str(model),))
    assert shared.exact and "tokens of" in shared.note
    for p in shared.measured:
        i = int(p.text.split()[1])  # type: ignore[union-attr]
        assert (p.input_len, p.output_len) == (len(tok(p.text).input_ids), len(tok("answer " * (4 + 2 * i)).input_ids))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"api": "grpc"},
        {"num_prompts": 0},
        {"concurrency": -1},
        {"input_len": 1.5},
        {"output_len": True},
        {"warmup_prompts": -1},
        {"request_rate": 0},
        {"request_rate": float("inf")},
        {"request_timeout_s": 0},
        {"model": ""},
        {"tokenizer": ""},
    ],
)
def test_bad_workload(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError) as info:
        Workload(**kwargs)
    message = str(info.value)
    assert "\n" not in message and next(iter(kwargs)) in message


def test_bad_base_url() -> None:
    with pytest.raises(LoadError):
        run_load_sync("localhost:8000", Workload())
