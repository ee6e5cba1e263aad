"""A small streaming LLM-like HTTP server with known timing, for the load generator's tests.

Run as ``python tests/streaming_server.py --port P [options]``. It serves

- ``GET /v1/models``: one model, ``--model``;
- ``POST /v1/completions`` (OpenAI schema, ``stream: true``): text chunks, a final usage chunk when
  ``stream_options.include_usage`` is set (unless ``--no-usage``), then ``data: [DONE]``;
- ``POST /generate`` (SGLang schema, ``stream: true``): cumulative text with
  ``meta_info.completion_tokens``, then ``data: [DONE]``;
- ``GET /stats``: ``{"requests", "max_in_flight", "in_flight", "prompt_tokens", "max_tokens", "timings"}``
  (``max_tokens`` is the set of the requested output lengths; ``timings`` holds, for each stream
  that sent all its tokens, in order of arrival, ``[arrival, first, last]``: the ``time.monotonic()``
  seconds when its handler started, and when its first and its last token chunk were written. They
  are the schedule as it ran, late timers included, for tests to compare the client's clock with);
- ``POST /stats/reset``: zeroes the counters.

Timing of one generation request of ``n`` output tokens: the first chunk (one token) is sent
``--ttft`` seconds after the request arrived; after it, chunks of ``--chunk-tokens`` tokens follow,
one every ``chunk_tokens * --token-delay`` seconds, on a fixed schedule (no drift). Each token's
text is ``" tok"``. A request whose prompt does not have the expected shape is answered with 400.

Failure injection: ``--fail-every K`` answers every K-th generation request with HTTP 500;
``--truncate-every K`` ends every K-th stream without ``[DONE]`` (and without a usage chunk);
``--error-every K`` sends, after the first chunk of every K-th stream, an error event
``data: {"error": {...}}`` and then ``data: [DONE]`` with HTTP 200 (as vLLM ends a stream that failed
mid-way); ``--exit-after K`` kills the process (``os._exit``) ``--exit-delay`` seconds after the K-th
generation request arrived.

Server behaviours that are not failures: ``--empty-every K`` makes every K-th stream carry only
chunks with empty text (a random-weight model's tokens can decode to nothing) while its token
counts stay right (the usage chunk, SGLang's ``meta_info.completion_tokens``) and it still ends
with ``[DONE]``; ``--no-done`` never sends ``[DONE]`` (the stream ends after the last chunk, which
carries ``finish_reason``, and the usage chunk, as transformers serve does); ``--reject-field NAME``
(repeatable, OpenAI API) answers a request whose body holds the field NAME with HTTP 422
``Unexpected fields in the request: {'NAME'}`` (transformers serve's answer to ``ignore_eos``), and
then no longer requires ``ignore_eos``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from typing import Any

from aiohttp import web

TOKEN_TEXT = " tok"


class _State:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.requests = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.prompt_tokens = 0
        self.max_tokens: set[int] = set()
        self.timings: list[tuple[float, float, float]] = []

    def reset(self) -> None:
        self.requests = 0
        self.max_in_flight = self.in_flight
        self.prompt_tokens = 0
        self.max_tokens = set()
        self.timings = []


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


async def _stream(request: web.Request, n_tokens: int, prompt_tokens: int, api: str) -> web.StreamResponse:
    state: _State = request.app["state"]
    args = state.args
    number = state.requests
    if args.exit_after and number == args.exit_after:
        asyncio.get_running_loop().call_later(args.exit_delay, os._exit, 1)
    if args.fail_every and number % args.fail_every == 0:
        return web.Response(status=500, text="injected failure")
    truncate = bool(args.truncate_every and number % args.truncate_every == 0)
    empty = bool(args.empty_every and number % args.empty_every == 0)
    error = bool(args.error_every and number % args.error_every == 0)

    state.in_flight += 1
    state.max_in_flight = max(state.max_in_flight, state.in_flight)
    try:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        loop = asyncio.get_running_loop()
        start = loop.time()
        first = start
        sent = 0
        k = 0
        while sent < n_tokens:
            due = start + args.ttft + k * args.chunk_tokens * args.token_delay
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            step = 1 if k == 0 else min(args.chunk_tokens, n_tokens - sent)
            sent += step
            k += 1
            if api == "openai":
                finish = "length" if sent == n_tokens else None
                text = "" if empty else TOKEN_TEXT * step
                chunk = {"id": "cmpl-1", "object": "text_completion", "model": args.model,
                         "choices": [{"index": 0, "text": text, "finish_reason": finish}]}
            else:
                chunk = {"text": "" if empty else TOKEN_TEXT * sent,
                         "meta_info": {"prompt_tokens": prompt_tokens, "completion_tokens": sent}}
            await resp.write(_sse(chunk))
            if k == 1:
                first = loop.time()
            if sent == n_tokens:
                state.timings.append((request["arrival"], first, loop.time()))
            if error:
                await resp.write(_sse({"error": {"message": "injected error event", "type": "InternalServerError",
                                                 "param": None, "code": 500}}))
                break
        if truncate:
            return resp
        if api == "openai" and request["include_usage"] and not args.no_usage and not error:
            usage = {"prompt_tokens": prompt_tokens, "completion_tokens": n_tokens,
                     "total_tokens": prompt_tokens + n_tokens}
            await resp.write(_sse({"id": "cmpl-1", "object": "text_completion", "choices": [], "usage": usage}))
        if not args.no_done:
            await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp
    finally:
        state.in_flight -= 1


async def completions(request: web.Request) -> web.StreamResponse:
    request["arrival"] = asyncio.get_running_loop().time()
    state: _State = request.app["state"]
    body = await request.json()
    state.requests += 1
    if body.get("model") != state.args.model:
        return web.json_response({"error": f"model {body.get('model')!r} not found"}, status=404)
    rejected = {name for name in state.args.reject_field if name in body}
    if rejected:
        return web.json_response({"error": f"Unexpected fields in the request: {rejected}"}, status=422)
    prompt = body.get("prompt")
    needs_ignore_eos = "ignore_eos" not in state.args.reject_field
    if not isinstance(prompt, str) or not body.get("stream") or (needs_ignore_eos and body.get("ignore_eos") is not True):
        return web.json_response({"error": "expected a text prompt, stream and ignore_eos"}, status=400)
    n = int(body["max_tokens"])
    words = len(prompt.split())
    state.prompt_tokens += words
    state.max_tokens.add(n)
    request["include_usage"] = bool((body.get("stream_options") or {}).get("include_usage"))
    return await _stream(request, n, words, "openai")


async def generate(request: web.Request) -> web.StreamResponse:
    request["arrival"] = asyncio.get_running_loop().time()
    state: _State = request.app["state"]
    body = await request.json()
    state.requests += 1
    ids = body.get("input_ids")
    params = body.get("sampling_params") or {}
    if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids) or not body.get("stream") \
            or params.get("ignore_eos") is not True:
        return web.json_response({"error": "expected input_ids, stream and ignore_eos"}, status=400)
    n = int(params["max_new_tokens"])
    state.prompt_tokens += len(ids)
    state.max_tokens.add(n)
    return await _stream(request, n, len(ids), "sglang")


async def models(request: web.Request) -> web.Response:
    model = request.app["state"].args.model
    return web.json_response({"object": "list", "data": [{"id": model, "object": "model"}]})


async def stats(request: web.Request) -> web.Response:
    s: _State = request.app["state"]
    return web.json_response({"requests": s.requests, "max_in_flight": s.max_in_flight, "in_flight": s.in_flight,
                              "prompt_tokens": s.prompt_tokens, "max_tokens": sorted(s.max_tokens),
                              "timings": sorted(s.timings)})


async def reset(request: web.Request) -> web.Response:
    request.app["state"].reset()
    return web.json_response({"ok": True})


def make_app(args: argparse.Namespace) -> web.Application:
    app = web.Application()
    app["state"] = _State(args)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/generate", generate)
    app.router.add_get("/stats", stats)
    app.router.add_post("/stats/reset", reset)
    return app


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--model", default="test-model")
    p.add_argument("--ttft", type=float, default=0.02, help="seconds to the first token")
    p.add_argument("--token-delay", type=float, default=0.005, help="seconds per output token after the first")
    p.add_argument("--chunk-tokens", type=int, default=1, help="tokens per chunk after the first")
    p.add_argument("--no-usage", action="store_true", help="never send a usage chunk")
    p.add_argument("--fail-every", type=int, default=0)
    p.add_argument("--truncate-every", type=int, default=0)
    p.add_argument("--error-every", type=int, default=0, help="an error event in every K-th stream")
    p.add_argument("--empty-every", type=int, default=0, help="every K-th stream's chunks carry no text")
    p.add_argument("--no-done", action="store_true", help="never send data: [DONE]")
    p.add_argument("--reject-field", action="append", default=[], metavar="NAME",
                   help="answer 422 to an OpenAI request whose body holds this field")
    p.add_argument("--exit-after", type=int, default=0)
    p.add_argument("--exit-delay", type=float, default=0.1)
    args = p.parse_args()
    web.run_app(make_app(args), host="127.0.0.1", port=args.port, print=None, backlog=1024,
                access_log=None)


if __name__ == "__main__":
    main()
