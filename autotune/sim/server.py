"""The simulated SGLang server: a real aiohttp process with SGLang's endpoints, logs and failures.

Start-up and failure times are the scenario's real seconds divided by the time scale
(``--time-scale`` or ``AUTOTUNE_SIM_TIME_SCALE``, default :data:`DEFAULT_TIME_SCALE`). Token
generation is not compressed: a continuous-batching scheduler on a virtual clock paces forwards
against wall time at the rate the model predicts. Tokens are coalesced so each stream gets at
most one event per ``AUTOTUNE_SIM_STREAM_MS`` (default 40 ms); token counts stay exact.

Prompt length: ``input_ids`` length for ``/generate``; otherwise the number of
whitespace-separated words of the text (chat: of all message contents), at least 1. The
simulated model never emits EOS: every request generates exactly its ``max_new_tokens``
(SGLang default 128) or ``max_tokens`` (OpenAI default 16).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import uuid
from typing import Any, Callable, Sequence

from aiohttp import web

from autotune.sim.args import parse_server_args
from autotune.sim.engine import EngineConfig, InvalidArgument, configure, noise_factor, startup_seconds
from autotune.sim.scenario import Scenario, ScenarioError, load_scenario
from autotune.sim.scheduler import Forward, Scheduler, SimRequest
from autotune.sim.texts import failure_lines, oom_under_load_lines, stamp

__all__ = ["DEFAULT_TIME_SCALE", "SimServer", "main"]

DEFAULT_TIME_SCALE = 150.0
DECODE_LOG_INTERVAL = 40
_WORDS = (" the", " model", " token", " of", " a", " sim", " and", " GPU", " to", " is", " in", " it",
          " that", " for", " on", " we")


class _Text:
    """Deterministic generated text: token i is ``_WORDS[i % 16]``; cumulative slices are cheap."""

    def __init__(self, n: int = 1 << 16) -> None:
        parts = [_WORDS[i % len(_WORDS)] for i in range(n)]
        self.text = "".join(parts)
        self.offsets = [0]
        for p in parts:
            self.offsets.append(self.offsets[-1] + len(p))

    def upto(self, n: int) -> str:
        if n < len(self.offsets):
            return self.text[: self.offsets[n]]
        cycle = self.text[: self.offsets[len(_WORDS)]]
        reps, rem = divmod(n, len(_WORDS))
        return cycle * reps + self.text[: self.offsets[rem]]

    def span(self, a: int, b: int) -> str:
        if b < len(self.offsets):
            return self.text[self.offsets[a]: self.offsets[b]]
        return self.upto(b)[len(self.upto(a)):]


_TEXT = _Text()


def log(line: str) -> None:
    """Print one log line and flush (the runner tails the log file)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _die(code: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class _Live:
    """Per-request state the HTTP handler waits on."""

    __slots__ = ("event", "aborted")

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.aborted = False


class SimServer:
    """One simulated engine: start-up sequence, scheduler loop and HTTP endpoints."""

    def __init__(self, scenario: Scenario, cfg: EngineConfig, *, time_scale: float, seed: int | None,
                 stream_interval_s: float) -> None:
        self.scenario = scenario
        self.cfg = cfg
        self.time_scale = time_scale
        self.seed = seed
        self.speed = noise_factor(cfg, seed)
        self.stream_interval_s = stream_interval_s
        self.ready = False
        self.sched = Scheduler(cfg, self.speed)
        self._arrival = asyncio.Event()
        self._next_rid = 0
        self._times = startup_seconds(cfg)
        self._decode_log_at = 0.0
        self._decode_log_tokens = 0

    # -- start-up -------------------------------------------------------------------------
    async def _sleep_real(self, seconds: float) -> None:
        await asyncio.sleep(max(seconds, 0.0) / self.time_scale)

    def _fail(self, stage: str, detail: str = "") -> None:
        for line in failure_lines(self.cfg, stage, detail):
            log(line)
        _die(1)

    async def startup(self) -> None:
        """Print SGLang's start-up log at compressed real times; fail where the model says."""
        cfg, m, t = self.cfg, self.cfg.memory, self._times
        a = cfg.args
        shown = {k: v for k, v in vars(a).items() if k != "extra"}
        shown.update(tp_size=cfg.tp, mem_fraction_static=cfg.mem_fraction_static,
                     chunked_prefill_size=cfg.chunked_prefill_size, disable_cuda_graph=not cfg.cuda_graph,
                     cuda_graph_max_bs=cfg.cuda_graph_max_bs, model_path=a.model_path or self.scenario.model.name)
        log(f"{stamp()} server_args=ServerArgs({', '.join(f'{k}={v!r}' for k, v in shown.items())})")
        log(f"{stamp()} Simulated host: scenario={self.scenario.name} ({self.scenario.gpu.count}x "
            f"{self.scenario.gpu.name}), time_scale={self.time_scale:g}, noise_factor={self.speed:.4f}")
        for w in cfg.nccl_config.warnings:
            log(f"{os.uname().nodename}:{os.getpid()}:{os.getpid()} [0] {w}")
        log(f"{stamp()} TP0 Init torch distributed begin.")
        await self._sleep_real(t["init"])
        log(f"{stamp()} TP0 Init torch distributed ends. mem usage={self.scenario.gpu.reserved_gb:.2f} GB")
        log(f"{stamp()} TP0 Load weight begin. avail mem={m.free_before_weights:.2f} GB")
        await self._sleep_real(t["weights"] - t["init"])
        log(f"{stamp()} TP0 Load weight end. type=SimulatedForCausalLM, dtype=torch.bfloat16, "
            f"avail mem={m.free_after_weights:.2f} GB, mem usage={m.weights:.2f} GB.")
        if m.stage == "kv":
            await self._sleep_real(0.5)
            self._fail("kv")
        await self._sleep_real(t["kv"] - t["weights"])
        log(f"{stamp()} TP0 KV Cache is allocated. #tokens: {m.kv_tokens}, KV size: {m.kv_pool:.2f} GB")
        log(f"{stamp()} TP0 Memory pool end. avail mem={m.headroom - m.request_tables:.2f} GB")
        if m.stage == "init":
            self._fail("init")
        if cfg.cuda_graph:
            avail = m.headroom - m.request_tables - m.workspace - m.prefill_activations - m.draft
            log(f"{stamp()} TP0 Capture cuda graph begin. This can take up to several minutes. avail mem={avail:.2f} GB")
            await self._first_collective()
            if m.stage == "graph":
                await self._sleep_real(0.15 * (t["capture"] - t["kv"]))
                self._fail("graph")
            await self._sleep_real(t["capture"] - t["kv"])
            log(f"{stamp()} TP0 Capture cuda graph end. Time elapsed: {t['capture'] - t['kv']:.2f} s. "
                f"mem usage={m.cuda_graph:.2f} GB. avail mem={m.free_at_ready:.2f} GB.")
        log(f"{stamp()} TP0 max_total_num_tokens={m.kv_tokens}, chunked_prefill_size={cfg.chunked_prefill_size}, "
            f"max_prefill_tokens=16384, max_running_requests={cfg.max_running_requests}, "
            f"context_len={cfg.context_len}, available_gpu_mem={m.free_at_ready:.2f} GB")
        log(f"{stamp()} INFO:     Started server process [{os.getpid()}]")
        log(f"{stamp()} INFO:     Waiting for application startup.")
        log(f"{stamp()} INFO:     Application startup complete.")
        log(f"{stamp()} INFO:     Uvicorn running on http://{cfg.args.host}:{cfg.args.port} (Press CTRL+C to quit)")
        if not cfg.cuda_graph:
            await self._first_collective()
        await self._sleep_real(t["ready"] - t["capture"])
        log(f'{stamp()} INFO:     127.0.0.1:0 - "GET /get_model_info HTTP/1.1" 200 OK')
        log(f"{stamp()} Prefill batch. #new-seq: 1, #new-token: 7, #cached-token: 0, token usage: 0.00, "
            f"#running-req: 0, #queue-req: 0,")
        log(f'{stamp()} INFO:     127.0.0.1:0 - "POST /generate HTTP/1.1" 200 OK')
        log(f"{stamp()} The server is fired up and ready to roll!")
        self.ready = True

    async def _first_collective(self) -> None:
        """NCCL connects (and allocates its buffers) at the first collective."""
        await self._sleep_real(1.0)
        if self.cfg.nccl_problem is not None:
            self._fail("nccl-usage", self.cfg.nccl_problem)
        if self.cfg.memory.stage == "nccl":
            self._fail("nccl")

    # -- scheduling -----------------------------------------------------------------------
    async def run_scheduler(self) -> None:
        """Run forwards back to back on a virtual clock paced against wall time."""
        loop = asyncio.get_running_loop()
        vclock = loop.time()
        self._decode_log_at = vclock
        while True:
            fwd = self.sched.plan()
            if fwd is None:
                self._arrival.clear()
                await self._arrival.wait()
                vclock = max(vclock, loop.time())
                continue
            if fwd.oom_gb > 0:
                self._die_under_load(fwd)
            end = vclock + fwd.duration
            delay = end - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            elif delay < -1.0:  # fell far behind (machine stalled): do not burst to catch up
                end = loop.time()
            vclock = end
            running_before = len(self.sched.running)
            gained, finished = self.sched.apply(fwd, end)
            interval = self.stream_interval_s
            for r in gained:
                if r.finished_at is not None or end - r.notified_at >= interval:
                    r.notified_at = end
                    r.user.event.set()
            self._log_forward(fwd, end, running_before)

    def _die_under_load(self, fwd: Forward) -> None:
        for line in oom_under_load_lines(self.cfg, fwd.oom_gb):
            log(line)
        _die(1)

    def _log_forward(self, fwd: Forward, now: float, running_before: int) -> None:
        """Log a forward as SGLang does: every prefill batch (``#running-req`` is the running
        batch its new sequences join), every :data:`DECODE_LOG_INTERVAL`-th decode batch."""
        s = self.sched
        if fwd.kind == "prefill":
            log(f"{stamp()} Prefill batch. #new-seq: {fwd.batch}, #new-token: {fwd.tokens}, #cached-token: 0, "
                f"token usage: {s.token_usage():.2f}, #running-req: {running_before}, #queue-req: {len(s.waiting)},")
            return
        if s.decode_forwards % DECODE_LOG_INTERVAL:
            return
        elapsed = max(now - self._decode_log_at, 1e-9)
        rate = (s.generated_total - self._decode_log_tokens) / elapsed
        self._decode_log_at, self._decode_log_tokens = now, s.generated_total
        graph = self.cfg.cuda_graph and fwd.batch <= self.cfg.cuda_graph_max_bs
        log(f"{stamp()} Decode batch. #running-req: {len(s.running)}, #token: {s.ctx_sum}, "
            f"token usage: {s.token_usage():.2f}, cuda graph: {graph}, gen throughput (token/s): {rate:.2f}, "
            f"#queue-req: {len(s.waiting)},")

    # -- HTTP -----------------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/health", self.health)
        app.router.add_get("/health_generate", self.health)
        app.router.add_get("/get_server_info", self.server_info)
        app.router.add_get("/server_info", self.server_info)
        app.router.add_get("/get_model_info", self.model_info)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/generate", self.generate)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        return app

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.ready else 503)

    async def server_info(self, request: web.Request) -> web.Response:
        cfg = self.cfg
        args = {k: v for k, v in vars(cfg.args).items() if k != "extra"}
        args.update(model_path=cfg.args.model_path or self.scenario.model.name, tp_size=cfg.tp, mem_fraction_static=cfg.mem_fraction_static,
                    max_running_requests=cfg.max_running_requests, chunked_prefill_size=cfg.chunked_prefill_size,
                    cuda_graph_max_bs=cfg.cuda_graph_max_bs, disable_cuda_graph=not cfg.cuda_graph)
        body = {
            **args,
            "version": "0.5.5-sim",
            "scenario": self.scenario.name,
            "max_total_num_tokens": cfg.memory.kv_tokens,
            "memory_gb": cfg.memory.breakdown(),
            "nccl": {"channels": cfg.nccl.channels, "transport": "P2P" if cfg.nccl.p2p else "SHM",
                     "env": {k: v for k, v in cfg.env.items() if k.startswith("NCCL_")}},
            "speculative_accept_length": cfg.spec_accept_len if cfg.speculative else None,
            "startup_s_uncompressed": round(self._times["ready"], 3),
            "time_scale": self.time_scale,
            "noise_factor": round(self.speed, 5),
            "ready": self.ready,
        }
        return web.json_response(body)

    async def model_info(self, request: web.Request) -> web.Response:
        name = self.cfg.args.model_path or self.scenario.model.name
        return web.json_response({"model_path": name, "tokenizer_path": name, "is_generation": True})

    async def models(self, request: web.Request) -> web.Response:
        name = self.cfg.served_model_name
        return web.json_response({"object": "list", "data": [
            {"id": name, "object": "model", "created": int(time.time()), "owned_by": "sglang", "root": name,
             "max_model_len": self.cfg.context_len}]})

    # request handling
    @staticmethod
    def _error(status: int, message: str, kind: str = "BadRequestError") -> web.Response:
        return web.json_response({"object": "error", "message": message, "type": kind, "param": None,
                                  "code": status, "error": {"message": message, "type": kind}}, status=status)

    async def _body(self, request: web.Request) -> dict[str, Any] | web.Response:
        if not self.ready:
            return self._error(503, "The server is not ready yet.", "ServiceUnavailable")
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return self._error(400, "Request body is not valid JSON.")
        if not isinstance(body, dict):
            return self._error(400, "Request body must be a JSON object.")
        return body

    def _submit(self, prompt_len: int, max_new: int) -> SimRequest | web.Response:
        if max_new < 1:
            return self._error(400, f"max_new_tokens must be at least 1, got {max_new}.")
        total = prompt_len + max_new
        if total > self.cfg.context_len:
            return self._error(400, f"Requested token count exceeds the model's maximum context length of "
                                    f"{self.cfg.context_len} tokens. You requested a total of {total} tokens: "
                                    f"{prompt_len} tokens from the input messages and {max_new} tokens for the completion.")
        if total > self.cfg.memory.kv_tokens:
            return self._error(400, f"The request needs {total} tokens of KV cache but the pool holds "
                                    f"{self.cfg.memory.kv_tokens} (max_total_num_tokens).")
        loop = asyncio.get_running_loop()
        r = SimRequest(self._next_rid, prompt_len, max_new, loop.time(), _Live())
        self._next_rid += 1
        self.sched.add(r)
        self._arrival.set()
        return r

    def _abort(self, r: SimRequest) -> None:
        r.user.aborted = True
        self.sched.abort(r)

    @staticmethod
    def _word_count(text: Any) -> int:
        if isinstance(text, str):
            return max(1, len(text.split()))
        return 0

    @staticmethod
    def _int_param(value: Any, default: int, name: str) -> int:
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value:
            raise ValueError(f"{name} must be an integer, got {value!r}")
        return int(value)

    async def generate(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        if isinstance(body, web.Response):
            return body
        ids = body.get("input_ids")
        text = body.get("text")
        if ids is not None:
            if not isinstance(ids, list) or (ids and isinstance(ids[0], list)):
                return self._error(400, "input_ids must be one list of token ids (batches are not simulated).")
            prompt_len = max(1, len(ids))
        elif isinstance(text, str):
            prompt_len = self._word_count(text)
        else:
            return self._error(400, "Either text (a string) or input_ids must be provided.")
        sp = body.get("sampling_params") or {}
        try:
            max_new = self._int_param(sp.get("max_new_tokens"), 128, "max_new_tokens")
        except ValueError as exc:
            return self._error(400, str(exc))
        r = self._submit(prompt_len, max_new)
        if isinstance(r, web.Response):
            return r
        rid = uuid.uuid4().hex
        start = time.monotonic()

        def meta(n: int, final: bool) -> dict[str, Any]:
            info: dict[str, Any] = {"id": rid, "finish_reason": {"type": "length", "length": n} if final else None,
                                    "prompt_tokens": prompt_len, "completion_tokens": n, "cached_tokens": 0}
            if final:
                info["e2e_latency"] = round(time.monotonic() - start, 4)
            return info

        if not body.get("stream"):
            await self._until_finished(r)
            return web.json_response({"text": _TEXT.upto(r.generated), "meta_info": meta(r.generated, True)})
        return await self._stream(request, r, lambda sent, n, done: {"text": _TEXT.upto(n), "meta_info": meta(n, done)})

    async def _until_finished(self, r: SimRequest) -> None:
        """Wait until ``r`` has generated its last token; a cancelled handler (the client went
        away) aborts it."""
        try:
            while not r.finished:
                await r.user.event.wait()
                r.user.event.clear()
        except asyncio.CancelledError:
            self._abort(r)
            raise

    async def _stream(self, request: web.Request, r: SimRequest,
                      event: Callable[[int, int, bool], dict[str, Any]],
                      last: Callable[[int], list[dict[str, Any]]] = lambda sent: []) -> web.StreamResponse:
        """Stream ``r`` as server-sent events: ``event(sent, n, done)`` each time tokens
        ``sent..n`` are new or the request is done, then the events of ``last(tokens sent)`` and
        ``[DONE]``. A client gone (or a cancelled handler) aborts ``r``."""
        resp = await self._open_stream(request)
        sent = 0
        try:
            while True:
                await r.user.event.wait()
                r.user.event.clear()
                n = r.generated
                done = r.finished
                if n > sent or done:
                    data = event(sent, n, done)
                    sent = n
                    await resp.write(b"data: " + json.dumps(data).encode() + b"\n\n")
                if done:
                    break
            for data in last(sent):
                await resp.write(b"data: " + json.dumps(data).encode() + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
        except (ConnectionResetError, asyncio.CancelledError):
            self._abort(r)
            raise
        return resp

    @staticmethod
    async def _open_stream(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        return resp

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._openai(request, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._openai(request, chat=True)

    async def _openai(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        body = await self._body(request)
        if isinstance(body, web.Response):
            return body
        if chat:
            msgs = body.get("messages")
            if not isinstance(msgs, list) or not msgs:
                return self._error(400, "messages must be a non-empty list.")
            prompt_len = max(1, sum(self._word_count(m.get("content")) if isinstance(m, dict) else 0 for m in msgs))
            default_max = 128
        else:
            prompt = body.get("prompt")
            if isinstance(prompt, list) and prompt and all(isinstance(x, int) for x in prompt):
                prompt_len = len(prompt)
            elif isinstance(prompt, str):
                prompt_len = self._word_count(prompt)
            else:
                return self._error(400, "prompt must be a string or a list of token ids (batches are not simulated).")
            default_max = 16
        try:
            key = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
            max_new = self._int_param(body.get(key), default_max, key)
        except ValueError as exc:
            return self._error(400, str(exc))
        r = self._submit(prompt_len, max_new)
        if isinstance(r, web.Response):
            return r
        model = body.get("model") or self.cfg.served_model_name
        cid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        created = int(time.time())
        obj = "chat.completion" if chat else "text_completion"

        def usage(n: int) -> dict[str, int]:
            return {"prompt_tokens": prompt_len, "completion_tokens": n, "total_tokens": prompt_len + n}

        if not body.get("stream"):
            await self._until_finished(r)
            text = _TEXT.upto(r.generated)
            choice: dict[str, Any] = {"index": 0, "finish_reason": "length", "logprobs": None}
            if chat:
                choice["message"] = {"role": "assistant", "content": text}
            else:
                choice["text"] = text
            return web.json_response({"id": cid, "object": obj, "created": created, "model": model,
                                      "choices": [choice], "usage": usage(r.generated)})
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        chunk_obj = "chat.completion.chunk" if chat else "text_completion"

        def chunk(sent: int, n: int, done: bool) -> dict[str, Any]:
            delta = _TEXT.span(sent, n)
            if chat:
                d: dict[str, Any] = {"content": delta}
                if sent == 0:
                    d["role"] = "assistant"
                choice = {"index": 0, "delta": d, "finish_reason": "length" if done else None, "logprobs": None}
            else:
                choice = {"index": 0, "text": delta, "finish_reason": "length" if done else None, "logprobs": None}
            return {"id": cid, "object": chunk_obj, "created": created, "model": model, "choices": [choice]}

        def usage_chunk(sent: int) -> list[dict[str, Any]]:
            return [{"id": cid, "object": chunk_obj, "created": created, "model": model, "choices": [],
                     "usage": usage(sent)}] if include_usage else []

        return await self._stream(request, r, chunk, usage_chunk)


def resolve_time_scale(flag: float | None) -> float:
    """``--time-scale``, else ``AUTOTUNE_SIM_TIME_SCALE``, else the default; must be > 0."""
    if flag is not None:
        value = flag
    else:
        raw = os.environ.get("AUTOTUNE_SIM_TIME_SCALE", "").strip()
        try:
            value = float(raw) if raw else DEFAULT_TIME_SCALE
        except ValueError:
            raise ValueError(f"AUTOTUNE_SIM_TIME_SCALE must be a number, got {raw!r}") from None
    if not value > 0:
        raise ValueError(f"time scale must be > 0, got {value:g}")
    return value


def resolve_seed() -> int | None:
    raw = os.environ.get("AUTOTUNE_SIM_SEED", "").strip()
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"AUTOTUNE_SIM_SEED must be an integer, got {raw!r}") from None


async def _serve(server: SimServer, host: str, port: int) -> None:
    runner = web.AppRunner(server.app(), access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_address=True)
    try:
        await site.start()
    except OSError as exc:
        log(f"ERROR:    [Errno {exc.errno}] error while attempting to bind on address ({host!r}, {port}): "
            f"{(exc.strerror or str(exc)).lower()}")
        _die(1)
    scheduler = asyncio.create_task(server.run_scheduler())
    await server.startup()
    await scheduler


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m autotune.sim serve ...``: parse flags like SGLang, then serve until killed."""
    argv = list(sys.argv[1:] if argv is None else argv)
    ns, args = parse_server_args(argv)
    prog = "python -m autotune.sim serve"
    try:
        scenario = load_scenario(ns.scenario)
        time_scale = resolve_time_scale(ns.time_scale)
        seed = resolve_seed()
    except (ScenarioError, ValueError) as exc:
        sys.stderr.write(f"usage: {prog} --scenario NAME|FILE [SGLang flags]\n{prog}: error: {exc}\n")
        return 2
    try:
        cfg = configure(scenario, args, os.environ)
    except InvalidArgument as exc:
        log(f"{stamp()} server_args={args!r}")
        log("Traceback (most recent call last):")
        log('  File "/sgl-workspace/sglang/python/sglang/srt/server_args.py", line 612, in __post_init__')
        log(f"ValueError: {exc}")
        return 1
    stream_ms = float(os.environ.get("AUTOTUNE_SIM_STREAM_MS", "40") or 40)
    server = SimServer(scenario, cfg, time_scale=time_scale, seed=seed, stream_interval_s=stream_ms / 1000.0)
    try:
        asyncio.run(_serve(server, args.host, args.port))
    except KeyboardInterrupt:
        return 0
    return 0

