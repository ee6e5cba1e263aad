"""Async load generator for OpenAI-compatible and SGLang streaming endpoints.

It sends synthetic prompts to a running server, streams every response, and reports throughput
and latency with the definitions of ``sglang.bench_serving``:

- duration: from the start of the measured run (after warm-up) to the end of its last request;
- ``output_throughput`` = sum(output tokens) / duration, ``total_throughput`` =
  (input + output tokens) / duration, ``request_throughput`` = completed / duration;
- ``ttft_ms``: time to the first chunk that carries output text (``sglang.bench_serving``'s
  "first chunk with content", for both APIs). A stream in which no chunk carried text (every
  token decoded to nothing, as a random-weight model's tokens can) takes the time of its first
  chunk that delivered tokens: OpenAI, its first chunk with a ``choices`` entry, which is
  ``vllm bench serve``'s TTFT for every stream, text or not; SGLang, its first chunk whose
  ``meta_info.completion_tokens`` grew. A stream that delivered neither has no TTFT
  (``sglang.bench_serving`` records 0 there, which would pull the statistics down);
- ``e2e_latency_ms``: time to the end of the stream;
- ``tpot_ms``: (latency - TTFT) / (output tokens - 1) per request with more than one output token
  and a TTFT;
- ``itl_ms``: the gaps between consecutive chunks that carried text. For the SGLang API, which
  reports the cumulative token count with every chunk, a gap that delivered ``k`` tokens counts as
  ``k`` gaps of ``gap / k`` (as ``sglang.bench_serving`` does); for OpenAI each chunk gap counts
  once. A request with fewer than two text chunks adds no gap;
- each latency as ``mean_X``, ``median_X`` and ``p99_X`` (milliseconds), over completed requests
  that have the quantity.

Output tokens of a request are the server's count when it gives one (OpenAI ``usage`` with
``stream_options.include_usage``, which is requested; SGLang ``meta_info.completion_tokens``),
else the number of chunks that carried text. Input tokens likewise (``prompt_tokens``), else the
workload's ``input_len``.

A request completes when the server answered HTTP 200 with at least one generation chunk (OpenAI:
a chunk with a ``choices`` entry, ``vllm bench serve``'s rule; SGLang: any data event), whether or
not any chunk carried text: chunks without text are normal (special tokens, a token that completes
no character), and such a stream completes with the server's token count. Stricter than both
tools, which accept whatever arrived before the connection closed, the stream must also be
complete: ended by ``data: [DONE]``, or, from a server that sends no ``[DONE]`` (transformers
serve), by chunks carrying ``finish_reason`` and ``usage``. A request fails
(and counts in ``failed``, its error text in ``errors``) on a connection error, an HTTP status
>= 400, an error event in the stream, a timeout, or an incomplete stream. Failures never abort the
run. Latency statistics are left out of the metrics when there is no data for them (no request
completed, or none delivered two tokens), so that an SLO on them reads as broken.

Request fields that not every server accepts (``ignore_eos``, ``stream_options``) are sent until
a server answers an HTTP error naming one (transformers serve: HTTP 422 ``Unexpected fields in
the request: {'ignore_eos'}``); that request is sent again without the field, and so is every
later one of the run.

Progress (:class:`LoadProgress`, to ``on_progress``) is counted token by token as the streams
deliver, requests in flight included, so that a caller can judge a run before it ends (early
stopping, :mod:`autotune.execution.early_stop`): SGLang reports the cumulative token count with every chunk;
for OpenAI, whose streams carry no count until the end, a request in flight counts its generation
chunks times the tokens per chunk of the requests completed so far (warm-up included; 1 before
any completed). A failed request's tokens leave the count. The final metrics do not depend on it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
import json
import math
import time
from typing import Any, Literal
from urllib.parse import urlsplit

import aiohttp
import numpy as np

from autotune.util.words import COMMON_WORDS as _WORDS

__all__ = ["LoadError", "LoadProgress", "LoadResult", "Workload", "run_load", "run_load_sync"]

_MAX_ERRORS = 5
_STOP_POLL_S = 0.1
_PROGRESS_EVERY_S = 0.1
# SGLang prompts are random token ids from this range: above the special tokens of common
# tokenizers (which sit at the bottom or the top of the vocabulary) and below every common
# vocabulary size.
_TOKEN_ID_RANGE = (1000, 30000)
_decode_json = json.JSONDecoder().decode  # on str: skips json.loads' encoding sniffing per chunk
# Body fields of the OpenAI API that some servers refuse: ``ignore_eos`` is not an OpenAI field
# (transformers serve answers HTTP 422), ``stream_options`` is newer than some servers.
_OPTIONAL_FIELDS = ("ignore_eos", "stream_options")


class LoadError(RuntimeError):
    """The load cannot be run at all (e.g. ``base_url`` is not an ``http(s)://`` URL).

    Problems of the server under test (refused connections, HTTP errors, timeouts, a crash) never
    raise: they are counted as failed requests in the :class:`LoadResult`.
    """


@dataclass(frozen=True)
class Workload:
    """What to send: prompt shape, how many, how concurrently, and how fast.

    ``api="openai"`` streams ``POST /v1/completions`` with a text prompt of ``input_len`` random
    words; ``api="sglang"`` streams SGLang's ``POST /generate`` with ``input_len`` random token ids.
    Both ask for exactly ``output_len`` tokens (``ignore_eos``). ``request_rate=None`` sends all
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
        if self.model is not None and (not isinstance(self.model, str) or not self.model.strip()):
            raise ValueError(f"workload model must be a non-empty string or None, got {self.model!r}")


@dataclass(frozen=True)
class LoadProgress:
    """How far the measured run is, ``elapsed_s`` after it began (see the module docstring).

    ``completed`` and ``failed`` count finished requests of ``total``; ``output_tokens`` and
    ``input_tokens`` are what the server has delivered so far (in flight included; a request's
    prompt counts once its first token came); ``output_tokens_total`` and ``input_tokens_total``
    what the whole run delivers if every request completes (``num_prompts x output_len``; the
    prompts as counted so far, the rest at the mean prompt length seen, else ``input_len``).
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
    """What a run measured.

    ``metrics`` holds the names listed in the module docstring plus ``completed``, ``failed``,
    ``input_tokens``, ``output_tokens``, ``max_concurrency`` and ``duration_s``. ``completed`` and
    ``failed`` count measured requests only (requests cancelled by ``should_stop`` count as
    failed, and in ``cancelled`` too; requests never sent count in neither). ``errors`` holds the
    first few distinct error texts, one line each.
    """

    metrics: dict[str, float]
    completed: int
    failed: int
    errors: list[str] = field(default_factory=list)
    duration_s: float = 0.0
    cancelled: int = 0


async def run_load(
    base_url: str,
    workload: Workload,
    *,
    on_progress: Callable[[LoadProgress], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> LoadResult:
    """Drive ``workload`` against the server at ``base_url`` (e.g. ``http://127.0.0.1:30000``).

    ``on_progress(progress)`` (a :class:`LoadProgress`) is called about ten times a second while
    the measured run goes on, and when its last request finishes. ``should_stop()`` is polled
    about ten times a second, during warm-up too (in the measured run, right after each progress
    report); once it returns true, in-flight requests are cancelled, no more are sent, and what
    was measured so far is returned.

    Raises:
        LoadError: ``base_url`` is not an ``http://`` or ``https://`` URL.
        Exception: whatever ``on_progress`` or ``should_stop`` raised (the run ends there).
    """
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise LoadError(f"base_url must look like http://HOST:PORT, got {base_url!r}")
    base = base_url.rstrip("/")
    connector = aiohttp.TCPConnector(limit=workload.concurrency)
    timeout = aiohttp.ClientTimeout(total=workload.request_timeout_s)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        errors: list[str] = []
        model = workload.model
        if workload.api == "openai" and model is None:
            model, problem = await _first_model(session, base, min(10.0, workload.request_timeout_s))
            if problem:
                errors.append(problem)
        client = _Client(session, base, workload, model)
        stop = _Stop(should_stop)
        if workload.warmup_prompts:
            warmup = _Run(client, workload.warmup_prompts, min(workload.warmup_prompts, workload.concurrency),
                          None, stop, None, namespace=1)
            await warmup.execute()
        if stop.stopped:
            return _summarize(workload, _RunOutcome([], 0.0), errors)
        measured = _Run(client, workload.num_prompts, workload.concurrency, workload.request_rate, stop,
                        on_progress, namespace=0)
        outcome = await measured.execute()
    return _summarize(workload, outcome, errors)


def run_load_sync(
    base_url: str,
    workload: Workload,
    *,
    on_progress: Callable[[LoadProgress], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> LoadResult:
    """:func:`run_load` in a fresh event loop (``asyncio.run``); not callable from a running loop."""
    return asyncio.run(run_load(base_url, workload, on_progress=on_progress, should_stop=should_stop))


# -- implementation ----------------------------------------------------------------------------


def _check_int(name: str, value: Any, *, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise ValueError(f"workload {name} must be {kind}, got {value!r}")


def _positive_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def _one_line(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _describe(exc: BaseException) -> str:
    if isinstance(exc, _StreamError):
        return _one_line(str(exc))
    return _one_line(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)


async def _first_model(session: aiohttp.ClientSession, base: str, timeout_s: float) -> tuple[str | None, str | None]:
    """The first model id of ``GET /v1/models``, or ``(None, why not)``; requests then go without a model."""
    try:
        async with session.get(base + "/v1/models", timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            if resp.status >= 400:
                return None, _one_line(f"GET /v1/models: HTTP {resp.status}: {await resp.text()}")
            data = await resp.json(content_type=None)
        return str(data["data"][0]["id"]), None
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError, KeyError, IndexError, TypeError) as exc:
        return None, "GET /v1/models: " + _describe(exc)


class _Record:
    """One request's outcome. Times are ``perf_counter`` seconds; ``ttft`` is None for a completed
    stream that delivered no token chunk (see the module docstring)."""

    __slots__ = ("error", "ttft", "latency", "end", "output_tokens", "prompt_tokens", "gaps", "gap_tokens",
                 "streamed", "started")

    def __init__(self) -> None:
        self.error: str | None = None
        self.ttft: float | None = None
        self.latency = 0.0
        self.end = 0.0
        self.output_tokens = 0
        self.prompt_tokens = 0
        self.gaps: list[float] = []
        self.gap_tokens: list[int] | None = None
        self.streamed = 0  # tokens (SGLang) or generation chunks (OpenAI) delivered so far
        self.started = False  # the first token came


class _Tally:
    """What the requests in flight of one run have delivered so far (see :class:`_Record`)."""

    __slots__ = ("streamed", "started")

    def __init__(self) -> None:
        self.streamed = 0
        self.started = 0


class _StreamError(Exception):
    pass


class _Client:
    """Builds prompts and streams one request; all per-chunk work is here, kept minimal."""

    def __init__(self, session: aiohttp.ClientSession, base: str, workload: Workload, model: str | None) -> None:
        self.session = session
        self.workload = workload
        self.model = model
        self.url = base + ("/generate" if workload.api == "sglang" else "/v1/completions")
        self.refused = False  # set once the server refused a connection: it is gone
        # _OPTIONAL_FIELDS a server refused once (an HTTP error naming the field): left out since.
        self.dropped: set[str] = set()
        # Completed requests of every run so far: output tokens, generation chunks, prompt tokens.
        self.seen_requests = 0
        self.seen_tokens = 0
        self.seen_chunks = 0
        self.seen_prompt = 0

    def learn(self, rec: _Record) -> None:
        """Count a completed request into :meth:`tokens_per_chunk` and :meth:`prompt_len`."""
        self.seen_requests += 1
        self.seen_tokens += rec.output_tokens
        self.seen_chunks += rec.streamed
        self.seen_prompt += rec.prompt_tokens

    def tokens_per_chunk(self) -> float:
        """Tokens a chunk in flight stands for: 1 for SGLang (its chunks count tokens), else the
        completed requests' tokens per generation chunk (1 before any)."""
        if self.workload.api == "sglang" or not self.seen_chunks:
            return 1.0
        return self.seen_tokens / self.seen_chunks

    def prompt_len(self) -> float:
        """The mean prompt length of the completed requests (``input_len`` before any)."""
        return self.seen_prompt / self.seen_requests if self.seen_requests else float(self.workload.input_len)

    def payload(self, namespace: int, index: int) -> dict[str, Any]:
        w = self.workload
        rng = np.random.default_rng([w.seed, namespace, index])
        if w.api == "sglang":
            ids = rng.integers(*_TOKEN_ID_RANGE, size=w.input_len).tolist()
            return {
                "input_ids": ids,
                "sampling_params": {"temperature": 0.0, "max_new_tokens": w.output_len, "ignore_eos": True},
                "stream": True,
            }
        words = rng.integers(0, len(_WORDS), size=w.input_len)
        body: dict[str, Any] = {
            "prompt": " ".join([_WORDS[i] for i in words.tolist()]),
            "max_tokens": w.output_len,
            "temperature": 0.0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.model is not None:
            body["model"] = self.model
        body["ignore_eos"] = True
        for name in self.dropped:
            body.pop(name, None)
        return body

    async def send(self, body: dict[str, Any], tally: _Tally) -> _Record:
        rec = _Record()
        start = time.perf_counter()
        try:
            async with self.session.post(self.url, json=body) as resp:
                if resp.status >= 400:
                    text = await resp.text(errors="replace")
                    rec.error = _one_line(f"HTTP {resp.status}: {text or resp.reason}")
                else:
                    await self._read(resp, rec, start, tally)
            refused = self._refused_field(rec.error, body)
            if refused is not None:
                self.dropped.add(refused)
                del body[refused]
                return await self.send(body, tally)
        except asyncio.TimeoutError:
            rec.error = f"TimeoutError: no complete response within {self.workload.request_timeout_s:g} s"
        except aiohttp.ClientConnectorError as exc:
            if isinstance(exc.os_error, ConnectionRefusedError):
                self.refused = True
            rec.error = _describe(exc)
        except Exception as exc:  # noqa: BLE001 - any failure of one request is that request's outcome
            rec.error = _describe(exc)
        rec.end = time.perf_counter()
        if rec.error is None:
            rec.prompt_tokens = rec.prompt_tokens or self.workload.input_len
        return rec

    def _refused_field(self, error: str | None, body: dict[str, Any]) -> str | None:
        """The optional field of ``body`` that an HTTP error names, if any (OpenAI API only)."""
        if error is None or not error.startswith("HTTP ") or self.workload.api != "openai":
            return None
        return next((name for name in _OPTIONAL_FIELDS if name in body and name in error), None)

    async def _read(self, resp: aiohttp.ClientResponse, rec: _Record, start: float, tally: _Tally) -> None:
        """Read one stream into ``rec`` by the rules of the module docstring.

        Raises:
            _StreamError: an error event, or an incomplete stream.
            ValueError: a data line that is not JSON.
        """
        sglang = self.workload.api == "sglang"
        gap_tokens: list[int] = []
        if sglang:
            rec.gap_tokens = gap_tokens
        first = last = 0.0  # times of the first and the latest chunk that carried text
        first_token = 0.0  # time of the first chunk that delivered tokens, text or not
        text_chunks = 0  # chunks that carried (new) text
        server_tokens = 0  # usage.completion_tokens (OpenAI) or meta_info.completion_tokens (SGLang); 0 = unknown
        seen = 0  # SGLang: tokens delivered so far (the server's count, else one per text chunk)
        counted = 0  # SGLang: tokens delivered up to the latest text chunk
        text_len = 0  # SGLang: length of the cumulative text
        generated = done = False
        finish_seen = usage_seen = False  # a last chunk with both ends a stream that sends no [DONE]
        pending = b""
        async for data in resp.content.iter_any():
            now = time.perf_counter()
            if pending:
                data = pending + data
            lines = data.split(b"\n")
            pending = lines.pop()
            for line in lines:
                if not line.startswith(b"data:"):
                    continue
                raw = line[5:].strip()
                if raw == b"[DONE]":
                    done = True
                    continue
                obj = _decode_json(raw.decode())
                if "error" in obj or obj.get("object") == "error":
                    raise _StreamError(f"StreamError: {obj.get('error') or obj.get('message')}")
                if sglang:
                    generated = True
                    text = obj.get("text") or ""
                    meta = obj.get("meta_info") or {}
                    rec.prompt_tokens = meta.get("prompt_tokens") or rec.prompt_tokens
                    grew = len(text) > text_len
                    text_len = len(text)
                    text_chunks += int(grew)
                    tokens = meta.get("completion_tokens")
                    new = (tokens - seen) if isinstance(tokens, int) else int(grew)
                    if isinstance(tokens, int):
                        server_tokens = tokens
                    if new <= 0:
                        continue
                    seen += new
                    rec.streamed += new
                    tally.streamed += new
                    if not first_token:
                        first_token = now
                        rec.started = True
                        tally.started += 1
                    if not text:  # nothing decoded to text yet
                        continue
                    if first:
                        rec.gaps.append(now - last)
                        gap_tokens.append(seen - counted)
                    else:
                        first = now
                    counted = seen
                    last = now
                else:
                    usage = obj.get("usage")
                    if usage:
                        usage_seen = True
                        server_tokens = usage.get("completion_tokens") or server_tokens
                        rec.prompt_tokens = usage.get("prompt_tokens") or rec.prompt_tokens
                    choices = obj.get("choices")
                    if not choices:
                        continue
                    generated = True
                    rec.streamed += 1
                    tally.streamed += 1
                    if not first_token:
                        first_token = now
                        rec.started = True
                        tally.started += 1
                    if choices[0].get("finish_reason"):
                        finish_seen = True
                    if not choices[0].get("text"):
                        continue
                    text_chunks += 1
                    if first:
                        rec.gaps.append(now - last)
                    else:
                        first = now
                    last = now
        if not done and not (finish_seen and usage_seen):
            raise _StreamError("IncompleteStream: stream ended without data: [DONE]")
        if not generated:
            raise _StreamError("EmptyStream: no generation chunk before the end of the stream")
        end = time.perf_counter()
        ttft_at = first or first_token
        rec.ttft = ttft_at - start if ttft_at else None
        rec.latency = end - start
        rec.output_tokens = server_tokens or text_chunks


class _Stop:
    """Remembers a true answer of the caller's ``should_stop``."""

    def __init__(self, poll: Callable[[], bool] | None) -> None:
        self.poll = poll
        self.stopped = False

    def check(self) -> bool:
        if not self.stopped and self.poll is not None and self.poll():
            self.stopped = True
        return self.stopped


@dataclass
class _RunOutcome:
    records: list[_Record]
    duration_s: float
    cancelled: int = 0


class _Run:
    """Sends ``total`` requests with at most ``concurrency`` in flight, closed loop or Poisson."""

    def __init__(
        self,
        client: _Client,
        total: int,
        concurrency: int,
        rate: float | None,
        stop: _Stop,
        on_progress: Callable[[LoadProgress], None] | None,
        *,
        namespace: int,
    ) -> None:
        self.client = client
        self.total = total
        self.rate = rate
        self.stop = stop
        self.on_progress = on_progress
        self.namespace = namespace
        self.semaphore = asyncio.Semaphore(concurrency)
        self.records: list[_Record] = []
        self.in_flight = 0
        self.finished = asyncio.Event()
        self.last_progress = 0.0
        self.start = 0.0
        self.tally = _Tally()
        self.completed = self.failed = 0
        self.output_done = self.input_done = 0  # of the completed requests

    def progress(self) -> LoadProgress:
        """The run's progress now (see :class:`LoadProgress`)."""
        c = self.client
        prompt = c.prompt_len()
        return LoadProgress(
            elapsed_s=time.perf_counter() - self.start, completed=self.completed, failed=self.failed, total=self.total,
            output_tokens=self.output_done + self.tally.streamed * c.tokens_per_chunk(),
            input_tokens=self.input_done + self.tally.started * prompt,
            output_tokens_total=float(self.total * c.workload.output_len),
            input_tokens_total=self.input_done + (self.total - self.completed) * prompt)

    def _report(self, *, force: bool = False) -> None:
        if self.on_progress is None:
            return
        now = time.perf_counter()
        if force or now - self.last_progress >= _PROGRESS_EVERY_S:
            self.last_progress = now
            self.on_progress(self.progress())

    async def execute(self) -> _RunOutcome:
        start = self.start = time.perf_counter()
        tasks: list[asyncio.Task[None]] = []
        dispatcher = asyncio.create_task(self._dispatch(tasks))
        try:
            # Each request ends by its own timeout, so ``finished`` is set in bounded time, unless
            # a task died of an exception (a bug, or a raising ``on_progress``): that is checked
            # at every poll, and raised below, so the run never waits for a request that is gone.
            while True:
                self._report()
                if self.stop.check():
                    break
                try:
                    await asyncio.wait_for(self.finished.wait(), _STOP_POLL_S)
                    break
                except asyncio.TimeoutError:
                    if _first_error([dispatcher, *tasks]) is not None:
                        break
        finally:
            cancelled = self.in_flight if not self.finished.is_set() else 0
            dispatcher.cancel()
            for task in tasks:
                task.cancel()
            await asyncio.gather(dispatcher, *tasks, return_exceptions=True)
        error = _first_error([dispatcher, *tasks])
        if error is not None:
            raise error
        if self.stop.stopped and not self.finished.is_set():
            end = time.perf_counter()
        else:
            end = max((r.end for r in self.records), default=start)
        return _RunOutcome(self.records, end - start, cancelled)

    async def _dispatch(self, tasks: list[asyncio.Task[None]]) -> None:
        if self.rate is None:
            tasks.extend(asyncio.create_task(self._one(i)) for i in range(self.total))
            return
        loop = asyncio.get_running_loop()
        rng = np.random.default_rng([self.client.workload.seed, 2, self.namespace])
        arrivals = np.cumsum(rng.exponential(1.0 / self.rate, size=self.total)).tolist()
        origin = loop.time()
        for i, at in enumerate(arrivals):
            delay = origin + at - loop.time()
            if delay > 0 and not self.client.refused:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(self._one(i)))

    async def _one(self, index: int) -> None:
        async with self.semaphore:
            body = self.client.payload(self.namespace, index)
            self.in_flight += 1
            try:
                record = await self.client.send(body, self.tally)
            finally:
                self.in_flight -= 1
        self.tally.streamed -= record.streamed
        self.tally.started -= record.started
        if record.error is None:
            self.completed += 1
            self.output_done += record.output_tokens
            self.input_done += record.prompt_tokens
            self.client.learn(record)
        else:
            self.failed += 1
        self.records.append(record)
        done = len(self.records)
        if done == self.total:
            self.finished.set()
        self._report(force=done == self.total)


def _first_error(tasks: list[asyncio.Task[None]]) -> BaseException | None:
    """The exception of the first task that ended with one (cancelled tasks have none)."""
    for task in tasks:
        if task.done() and not task.cancelled() and task.exception() is not None:
            return task.exception()
    return None


def _stats(name: str, values: np.ndarray, metrics: dict[str, float]) -> None:
    if values.size:
        ms = values * 1000.0
        metrics[f"mean_{name}_ms"] = float(ms.mean())
        metrics[f"median_{name}_ms"] = float(np.median(ms))
        metrics[f"p99_{name}_ms"] = float(np.percentile(ms, 99))


def _summarize(workload: Workload, outcome: _RunOutcome, errors: list[str]) -> LoadResult:
    ok = [r for r in outcome.records if r.error is None]
    failed = len(outcome.records) - len(ok) + outcome.cancelled
    for r in outcome.records:
        if r.error is not None and r.error not in errors and len(errors) < _MAX_ERRORS:
            errors.append(r.error)
    if outcome.cancelled and len(errors) < _MAX_ERRORS:
        errors.append(f"Cancelled: {outcome.cancelled} in-flight requests stopped by should_stop")
    duration = outcome.duration_s
    input_tokens = sum(r.prompt_tokens for r in ok)
    output_tokens = sum(r.output_tokens for r in ok)
    per_s = 1.0 / duration if duration > 0 else 0.0
    metrics: dict[str, float] = {
        "completed": len(ok),
        "failed": failed,
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "max_concurrency": workload.concurrency,
        "duration_s": duration,
        "request_throughput": len(ok) * per_s,
        "output_throughput": output_tokens * per_s,
        "total_throughput": (input_tokens + output_tokens) * per_s,
    }
    _stats("ttft", np.array([r.ttft for r in ok if r.ttft is not None]), metrics)
    _stats("tpot", np.array([(r.latency - r.ttft) / (r.output_tokens - 1) for r in ok
                             if r.output_tokens > 1 and r.ttft is not None]), metrics)
    itl: list[np.ndarray] = []
    for r in ok:
        if r.gap_tokens is None:
            itl.append(np.asarray(r.gaps))
        elif r.gaps:
            counts = np.asarray(r.gap_tokens)
            itl.append(np.repeat(np.asarray(r.gaps) / counts, counts))
    _stats("itl", np.concatenate(itl) if itl else np.empty(0), metrics)
    _stats("e2e_latency", np.array([r.latency for r in ok]), metrics)
    return LoadResult(metrics=metrics, completed=len(ok), failed=failed, errors=errors, duration_s=duration,
                      cancelled=outcome.cancelled)
