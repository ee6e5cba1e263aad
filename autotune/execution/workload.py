"""A load's shape and its results: :class:`Workload` (what to send), :class:`LoadProgress` (how far
a run is) and :class:`LoadResult` (what it measured, with the definitions of its metrics).

:func:`autotune.execution.loadgen.run_load` drives a workload against a server.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from autotune.config.objective import LoadSpec

__all__ = ["Dataset", "LoadProgress", "LoadResult", "Workload", "workload_of"]


@dataclass(frozen=True)
class Dataset:
    """A file of prompts instead of random ones: ``kind="sharegpt"``, a ShareGPT JSON file (a list of
    ``{"conversations": [{"value": ...}, ...]}``) as ``vllm bench serve --dataset-name sharegpt``
    reads it; ``output_len`` replaces each answer's length when given."""

    path: str
    kind: Literal["sharegpt"] = "sharegpt"
    output_len: int | None = None


@dataclass(frozen=True)
class Workload:
    """What to send: prompt shape, how many, how concurrently, and how fast.

    ``api="openai"`` streams ``POST /v1/completions`` with a text prompt; ``api="sglang"`` streams
    SGLang's ``POST /generate`` with token ids (text with a ``dataset``). The prompts
    (:mod:`autotune.execution.prompts`) are ``input_len`` tokens of the model's tokenizer, made as
    ``vllm bench serve --dataset-name random`` makes them (``tokenizer``: where to load it from,
    an error where it does not load; None: the served model's, else ``tokenizer_hint``'s, e.g. the
    target's model path), or, with a ``dataset``, its conversations; without a tokenizer,
    ``input_len`` random words. Each request asks for exactly ``output_len`` tokens (a dataset's
    own lengths) with ``ignore_eos``. ``request_rate=None`` sends all
    requests at once, at most ``concurrency`` in flight (closed loop); otherwise requests arrive as
    a Poisson process of that rate (per second), still capped at ``concurrency`` in flight.
    ``warmup_prompts`` requests are sent and awaited before the measured run and are not counted.
    ``model=None`` (OpenAI only) takes the first id listed by ``GET /v1/models``. Prompts are
    deterministic given ``seed``.

    Raises:
        ValueError: a field is out of range (one-line message naming it).
    """

    api: Literal["openai", "sglang"] = "openai"
    num_prompts: int = 256
    concurrency: int = 64
    input_len: int = 256
    output_len: int = 128
    warmup_prompts: int = 8
    request_rate: float | None = None
    model: str | None = None
    request_timeout_s: float = 300.0
    seed: int = 0
    tokenizer: str | None = None
    tokenizer_hint: str | None = None
    dataset: Dataset | None = None

    def __post_init__(self) -> None:
        if self.api not in ("openai", "sglang"):
            raise ValueError(f"workload api must be 'openai' or 'sglang', got {self.api!r}")
        for name in ("num_prompts", "concurrency", "input_len", "output_len"):
            _check_int(name, getattr(self, name), minimum=1)
        _check_int("warmup_prompts", self.warmup_prompts, minimum=0)
        _check_int("seed", self.seed, minimum=0)
        if self.request_rate is not None and not _positive_number(self.request_rate):
            raise ValueError(f"workload request_rate must be a positive number or None, got {self.request_rate!r}")
        if not _positive_number(self.request_timeout_s):
            raise ValueError(f"workload request_timeout_s must be a positive number, got {self.request_timeout_s!r}")
        for name in ("model", "tokenizer"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise ValueError(f"workload {name} must be a non-empty string or None, got {value!r}")
        if self.dataset is not None and self.dataset.output_len is not None:
            _check_int("dataset output_len", self.dataset.output_len, minimum=1)


def workload_of(load: LoadSpec, *, api: Literal["openai", "sglang"], model: str | None,
                tokenizer_hint: str | None = None) -> Workload:
    """The workload of an objective's load (:class:`~autotune.config.objective.LoadSpec`), every
    field of it, for ``api`` and the served ``model`` (None: the server's first); ``tokenizer_hint``:
    one more place to find the tokenizer (the target's model path)."""
    ds = load.dataset
    return Workload(api=api, num_prompts=load.num_prompts, concurrency=load.concurrency, input_len=load.input_len,
                    output_len=load.output_len, warmup_prompts=load.warmup_prompts, request_rate=load.request_rate,
                    model=model, request_timeout_s=load.request_timeout_s, tokenizer=load.tokenizer,
                    tokenizer_hint=tokenizer_hint,
                    dataset=None if ds is None else Dataset(ds.path, ds.kind, ds.output_len))


@dataclass(frozen=True)
class LoadProgress:
    """How far the measured run is, ``elapsed_s`` after it began.

    Counted token by token as the streams deliver, requests in flight included, so that a caller
    can judge a run before it ends (early stopping, :mod:`autotune.execution.early_stop`): SGLang
    reports the cumulative token count with every chunk; for OpenAI, whose streams carry no count
    until the end, a request in flight counts its generation chunks times the tokens per chunk of
    the requests completed so far (warm-up included; 1 before any completed). A failed request's
    tokens leave the count. The final metrics do not depend on it.

    ``completed`` and ``failed`` count finished requests of ``total``; ``output_tokens`` and
    ``input_tokens`` are what the server has delivered so far (in flight included; a request's
    prompt counts once its first token came); ``output_tokens_total`` and ``input_tokens_total``
    what the whole run delivers if every request completes (the prompts' output lengths; the
    prompts as counted so far, the rest at the mean prompt length seen, else the planned mean).
    """

    elapsed_s: float
    completed: int
    failed: int
    total: int
    output_tokens: float
    input_tokens: float
    output_tokens_total: float
    input_tokens_total: float

    @property
    def done(self) -> int:
        """Finished requests, completed or failed."""
        return self.completed + self.failed


@dataclass
class LoadResult:
    """What a run measured, with the definitions of ``sglang.bench_serving``.

    ``metrics`` holds ``completed``, ``failed``, ``input_tokens``, ``output_tokens``,
    ``max_concurrency``, ``duration_s`` and:

    - ``output_throughput`` = sum(output tokens) / duration, ``total_throughput`` =
      (input + output tokens) / duration, ``request_throughput`` = completed / duration, the
      duration from the start of the measured run (after warm-up) to the end of its last request;
    - ``ttft_ms``: time to the first chunk that carries output text (``sglang.bench_serving``'s
      "first chunk with content", for both APIs). A stream in which no chunk carried text (every
      token decoded to nothing, as a random-weight model's tokens can) takes the time of its first
      chunk that delivered tokens: OpenAI, its first chunk with a ``choices`` entry, which is
      ``vllm bench serve``'s TTFT for every stream, text or not; SGLang, its first chunk whose
      ``meta_info.completion_tokens`` grew. A stream that delivered neither has no TTFT
      (``sglang.bench_serving`` records 0 there, which would pull the statistics down);
    - ``e2e_latency_ms``: time to the end of the stream;
    - ``tpot_ms``: (latency - TTFT) / (output tokens - 1) per request with more than one output
      token and a TTFT;
    - ``itl_ms``: the gaps between consecutive chunks that carried text. For the SGLang API, which
      reports the cumulative token count with every chunk, a gap that delivered ``k`` tokens
      counts as ``k`` gaps of ``gap / k`` (as ``sglang.bench_serving`` does); for OpenAI each
      chunk gap counts once. A request with fewer than two text chunks adds no gap;
    - each latency as ``mean_X``, ``median_X`` and ``p99_X`` (milliseconds), over completed
      requests that have the quantity. Latency statistics are left out when there is no data for
      them (no request completed, or none delivered two tokens), so that an SLO on them reads as
      broken.

    Output tokens of a request are the server's count when it gives one (OpenAI ``usage`` with
    ``stream_options.include_usage``, which is requested; SGLang ``meta_info.completion_tokens``),
    else the number of chunks that carried text. Input tokens likewise (``prompt_tokens``), else
    the prompt's planned length (:class:`~autotune.execution.prompts.Prompt`). ``prompts`` says
    how the prompts were made (tokens of which tokenizer, or the approximation without one).

    ``completed`` and ``failed`` count measured requests only (requests cancelled by
    ``should_stop`` count as failed, and in ``cancelled`` too; requests never sent count in
    neither). ``errors`` holds the first few distinct error texts, one line each.
    """

    metrics: dict[str, float]
    completed: int
    failed: int
    errors: list[str] = field(default_factory=list)
    duration_s: float = 0.0
    cancelled: int = 0
    prompts: str = ""


def _check_int(name: str, value: Any, *, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise ValueError(f"workload {name} must be {kind}, got {value!r}")


def _positive_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
