"""One streamed request of a load: its body, its stream read chunk by chunk, its outcome.

A request completes when the server answered HTTP 200 with at least one generation chunk (OpenAI:
a chunk with a ``choices`` entry, ``vllm bench serve``'s rule; SGLang: any data event), whether or
not any chunk carried text: chunks without text are normal (special tokens, a token that completes
no character), and such a stream completes with the server's token count. Stricter than both
tools, which accept whatever arrived before the connection closed, the stream must also be
complete: ended by ``data: [DONE]``, or, from a server that sends no ``[DONE]`` (transformers
serve), by chunks carrying ``finish_reason`` and ``usage``. A request fails (its error text in
:attr:`Record.error`) on a connection error, an HTTP status >= 400, an error event in the stream,
a timeout, or an incomplete stream.

Request fields that not every server accepts (``ignore_eos``, ``stream_options``) are sent until
a server answers an HTTP error naming one (transformers serve: HTTP 422 ``Unexpected fields in
the request: {'ignore_eos'}``); that request is sent again without the field, and so is every
later one of the run.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp

from autotune.execution.prompts import Prompt, PromptSet
from autotune.execution.workload import Workload

__all__ = ["Client", "Record", "StreamError", "Tally", "describe", "first_model", "one_line"]

_decode_json = json.JSONDecoder().decode  # on str: skips json.loads' encoding sniffing per chunk
# Body fields of the OpenAI API that some servers refuse: ``ignore_eos`` is not an OpenAI field
# (transformers serve answers HTTP 422), ``stream_options`` is newer than some servers.
_OPTIONAL_FIELDS = ("ignore_eos", "stream_options")


def one_line(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def describe(exc: BaseException) -> str:
    if isinstance(exc, StreamError):
        return one_line(str(exc))
    return one_line(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)


async def first_model(session: aiohttp.ClientSession, base: str,
                      timeout_s: float) -> tuple[str | None, str | None, str | None]:
    """``(id, root, None)`` of the first model of ``GET /v1/models`` (``root``: where vLLM loaded it
    from, None where the server does not say), or ``(None, None, why not)``; requests then go
    without a model."""
    try:
        async with session.get(base + "/v1/models", timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            if resp.status >= 400:
                return None, None, one_line(f"GET /v1/models: HTTP {resp.status}: {await resp.text()}")
            data = await resp.json(content_type=None)
        first = data["data"][0]
        root = first.get("root")
        return str(first["id"]), root if isinstance(root, str) and root else None, None
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError, KeyError, IndexError, TypeError,
            AttributeError) as exc:
        return None, None, "GET /v1/models: " + describe(exc)


class Record:
    """One request's outcome. Times are ``perf_counter`` seconds; ``ttft`` is None for a completed
    stream that delivered no token chunk (see :class:`~autotune.execution.workload.LoadResult`)."""

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


class Tally:
    """What the requests in flight of one run have delivered so far (see :class:`Record`)."""

    __slots__ = ("streamed", "started")

    def __init__(self) -> None:
        self.streamed = 0
        self.started = 0


class StreamError(Exception):
    """An error event in a stream, or a stream that ended incomplete."""


class Client:
    """Makes request bodies of the prompts and streams one request; all per-chunk work is here, kept minimal."""

    def __init__(self, session: aiohttp.ClientSession, base: str, workload: Workload, model: str | None,
                 prompts: PromptSet) -> None:
        self.session = session
        self.workload = workload
        self.model = model
        self.prompts = prompts
        self.url = base + ("/generate" if workload.api == "sglang" else "/v1/completions")
        self.refused = False  # set once the server refused a connection: it is gone
        # _OPTIONAL_FIELDS a server refused once (an HTTP error naming the field): left out since.
        self.dropped: set[str] = set()
        # Completed requests of every run so far: output tokens, generation chunks, prompt tokens.
        self.seen_requests = 0
        self.seen_tokens = 0
        self.seen_chunks = 0
        self.seen_prompt = 0

    def learn(self, rec: Record) -> None:
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
        """The mean prompt length of the completed requests (the prompts' planned mean before any)."""
        return self.seen_prompt / self.seen_requests if self.seen_requests else self.prompts.mean_input

    def prompt(self, namespace: int, index: int) -> Prompt:
        """The ``index``-th prompt of the measured run (``namespace`` 0) or of the warm-up (1)."""
        return (self.prompts.measured if namespace == 0 else self.prompts.warmup)[index]

    def payload(self, prompt: Prompt) -> dict[str, Any]:
        if self.workload.api == "sglang":
            source: dict[str, Any] = {"text": prompt.text} if prompt.ids is None else {"input_ids": list(prompt.ids)}
            return {
                **source,
                "sampling_params": {"temperature": 0.0, "max_new_tokens": prompt.output_len, "ignore_eos": True},
                "stream": True,
            }
        body: dict[str, Any] = {
            "prompt": prompt.text,
            "max_tokens": prompt.output_len,
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

    async def send(self, body: dict[str, Any], tally: Tally, planned_input: int) -> Record:
        """Stream one request; a completed one without the server's prompt count takes ``planned_input``."""
        rec = Record()
        start = time.perf_counter()
        try:
            async with self.session.post(self.url, json=body) as resp:
                if resp.status >= 400:
                    text = await resp.text(errors="replace")
                    rec.error = one_line(f"HTTP {resp.status}: {text or resp.reason}")
                else:
                    await self._read(resp, rec, start, tally)
            refused = self._refused_field(rec.error, body)
            if refused is not None:
                self.dropped.add(refused)
                del body[refused]
                return await self.send(body, tally, planned_input)
        except asyncio.TimeoutError:
            rec.error = f"TimeoutError: no complete response within {self.workload.request_timeout_s:g} s"
        except aiohttp.ClientConnectorError as exc:
            if isinstance(exc.os_error, ConnectionRefusedError):
                self.refused = True
            rec.error = describe(exc)
        except Exception as exc:  # noqa: BLE001 - any failure of one request is that request's outcome
            rec.error = describe(exc)
        rec.end = time.perf_counter()
        if rec.error is None:
            rec.prompt_tokens = rec.prompt_tokens or planned_input
        return rec

    def _refused_field(self, error: str | None, body: dict[str, Any]) -> str | None:
        """The optional field of ``body`` that an HTTP error names, if any (OpenAI API only)."""
        if error is None or not error.startswith("HTTP ") or self.workload.api != "openai":
            return None
        return next((name for name in _OPTIONAL_FIELDS if name in body and name in error), None)

    async def _read(self, resp: aiohttp.ClientResponse, rec: Record, start: float, tally: Tally) -> None:
        """Read one stream into ``rec`` by the rules of the module docstring.

        Raises:
            StreamError: an error event, or an incomplete stream.
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
                    raise StreamError(f"StreamError: {obj.get('error') or obj.get('message')}")
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
            raise StreamError("IncompleteStream: stream ended without data: [DONE]")
        if not generated:
            raise StreamError("EmptyStream: no generation chunk before the end of the stream")
        end = time.perf_counter()
        ttft_at = first or first_token
        rec.ttft = ttft_at - start if ttft_at else None
        rec.latency = end - start
        rec.output_tokens = server_tokens or text_chunks
