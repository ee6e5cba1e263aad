"""Real ``python -m autotune.sim serve`` processes on loopback: API, logs, failures, pacing."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest
import requests

from autotune.outcome.load_signals import LoadSignals, raises_called_for
from autotune.sim import Workload, load_scenario, predict
from autotune.sim.args import args_from_mapping

TINY = str(Path(__file__).with_name("tiny_scenario.yaml"))

GLM_GOOD = ("--mem-fraction-static", "0.92", "--max-running-requests", "1024")
HTTP_TIMEOUT_S = 30  # every request of these tests has a deadline


def _sse(body: bytes) -> list:
    events = []
    for line in body.decode().splitlines():
        if line.startswith("data: "):
            raw = line[6:]
            events.append(raw if raw == "[DONE]" else json.loads(raw))
    return events


def _get(url: str) -> requests.Response:
    return requests.get(url, timeout=HTTP_TIMEOUT_S)


def _post(url: str, body: object) -> requests.Response:
    return requests.post(url, json=body, timeout=HTTP_TIMEOUT_S)


def test_health_503_while_starting_then_api(sim_server) -> None:
    sp = sim_server(TINY, "--served-model-name", "tiny", time_scale=20)  # ~4 s start-up
    codes = set()
    deadline = time.monotonic() + 60  # 15x the start-up: a deadline, not a timing assertion
    while time.monotonic() < deadline:
        try:
            r = requests.get(sp.url + "/health", timeout=1)
            codes.add(r.status_code)
            if r.status_code == 200:
                break
        except requests.RequestException:
            pass
        assert sp.proc.poll() is None, sp.log()
        time.sleep(0.05)
    assert 200 in codes, f"not ready within the deadline:\n{sp.log()}"
    assert 503 in codes
    log = sp.log()
    for text in ("Load weight end", "avail mem=", "KV Cache is allocated. #tokens: ", "Capture cuda graph begin",
                 "Capture cuda graph end", "max_total_num_tokens=", "The server is fired up and ready to roll!"):
        assert text in log, text
    info = _get(sp.url + "/get_server_info").json()
    assert info["scenario"] == "tiny-host" and info["time_scale"] == 20
    assert info["max_total_num_tokens"] > 0 and info["startup_s_uncompressed"] == pytest.approx(85.0)
    assert set(info["memory_gb"]) >= {"weights", "kv_pool", "nccl", "cuda_graph"}
    assert _get(sp.url + "/v1/models").json()["data"][0]["id"] == "tiny"
    assert _get(sp.url + "/get_model_info").json()["is_generation"] is True

    # SGLang /generate, streamed: cumulative text, exact completion_tokens, [DONE]
    r = _post(sp.url + "/generate", {"input_ids": list(range(40)), "stream": True,
                                     "sampling_params": {"max_new_tokens": 50, "ignore_eos": True}})
    events = _sse(r.content)
    assert events[-1] == "[DONE]"
    last = events[-2]
    assert last["meta_info"]["completion_tokens"] == 50 and last["meta_info"]["prompt_tokens"] == 40
    assert len(last["text"].split()) == 50
    counts = [e["meta_info"]["completion_tokens"] for e in events[:-1]]
    assert counts == sorted(counts) and counts[0] >= 1

    # not streamed; prompt tokens of a text = its words
    r = _post(sp.url + "/generate", {"text": "one two three four", "sampling_params": {"max_new_tokens": 7}})
    assert r.json()["meta_info"] == {**r.json()["meta_info"], "prompt_tokens": 4, "completion_tokens": 7}

    # OpenAI completions with a usage chunk
    r = _post(sp.url + "/v1/completions", {"model": "tiny", "prompt": "a b c", "max_tokens": 20,
                                           "stream": True, "stream_options": {"include_usage": True}})
    events = _sse(r.content)
    assert events[-1] == "[DONE]"
    assert events[-2]["choices"] == [] and events[-2]["usage"] == {"prompt_tokens": 3, "completion_tokens": 20,
                                                                    "total_tokens": 23}
    assert len("".join(e["choices"][0]["text"] for e in events[:-2]).split()) == 20
    r = _post(sp.url + "/v1/completions", {"prompt": "x", "max_tokens": 3})
    assert r.json()["usage"]["completion_tokens"] == 3 and r.json()["choices"][0]["finish_reason"] == "length"
    r = _post(sp.url + "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    assert r.json()["choices"][0]["message"]["content"].split() == r.json()["choices"][0]["message"]["content"].split()[:4]
    assert _post(sp.url + "/generate", {"text": 3}).status_code == 400


async def _load(url: str, n: int, conc: int, inp: int, out: int) -> tuple[float, list[int]]:
    """Send ``n`` streamed /generate requests, ``conc`` at a time: (seconds, tokens of each request)."""
    sem = asyncio.Semaphore(conc)
    counts: list[int] = []

    async def one(session: aiohttp.ClientSession) -> None:
        async with sem:
            body = {"input_ids": [1] * inp, "sampling_params": {"max_new_tokens": out, "ignore_eos": True}, "stream": True}
            async with session.post(url + "/generate", json=body) as resp:
                last = 0
                async for line in resp.content:
                    if line.startswith(b"data: {"):
                        last = json.loads(line[6:])["meta_info"]["completion_tokens"]
                counts.append(last)

    loop = asyncio.get_running_loop()
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=conc), timeout=timeout) as session:
        t0 = loop.time()
        await asyncio.gather(*(one(session) for _ in range(n)))
        return loop.time() - t0, counts


DECODE_LINE = re.compile(r"Decode batch\. #running-req: (\d+), .*"
                         r"gen throughput \(token/s\): ([\d.]+), #queue-req: (\d+),")


def test_served_throughput_is_paced_by_the_model(sim_server) -> None:
    """Exact token counts and SGLang's decode log under load, and a one-sided bound on throughput.

    The server paces every forward against the model's virtual clock, so it can be slower than
    ``predict`` (a loaded machine, a client slower than the ideal one) but never faster. How
    closely the two agree on an idle machine is a benchmark, not a test:
    ``python bench/sim_agreement.py`` measures it for this case too (docs/BENCHMARKS.md).
    """
    sp = sim_server(TINY, seed=5)
    assert sp.wait_ready()
    n, conc, inp, out = 256, 64, 64, 64
    duration, counts = asyncio.run(_load(sp.url, n, conc, inp, out))
    assert counts == [out] * n  # every request streamed exactly its max_new_tokens
    measured = sum(counts) / duration
    predicted = predict(load_scenario(TINY), args_from_mapping({}), {}, Workload(conc, n, inp, out), seed=5)
    assert predicted.outcome == "ok" and predicted.details["completed"] == n
    assert 0 < measured <= predicted.output_throughput * 1.05
    decodes = [(int(a), float(b), int(c)) for a, b, c in DECODE_LINE.findall(sp.log())]
    assert decodes, sp.log()
    for running, rate, queued in decodes:  # never more in the server than the client sent
        assert 0 < running <= conc and running + queued <= conc and rate > 0


FAILURES = [
    pytest.param("rtx6000-pcie-glm5", GLM_GOOD, {"NCCL_MIN_NCHANNELS": "8", "NCCL_ALGO": "Tree"},
                 ["torch.distributed.DistBackendError: NCCL error in: ", "invalid usage",
                  "No algorithm/protocol available for function AllGather with datatype ncclInt8. NCCL_ALGO was set to Tree."],
                 id="nccl-invalid-usage"),
    pytest.param("rtx6000-pcie-glm5", GLM_GOOD, {"NCCL_MIN_NCHANNELS": "8", "NCCL_BUFFSIZE": "8388608"},
                 ["NCCL WARN Failed to CUDA calloc ", "NCCL error in: ", "unhandled cuda error"], id="nccl-calloc"),
    pytest.param("rtx6000-pcie-glm5", ("--mem-fraction-static", "0.5"), {},
                 ["RuntimeError: Not enough memory. Please try to increase --mem-fraction-static."], id="not-enough-memory"),
    pytest.param("rtx6000-pcie-kimi-eagle3", ("--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "2",
                                              "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "3"),
                 {"NCCL_MIN_NCHANNELS": "1", "NCCL_MAX_NCHANNELS": "2", "NCCL_BUFFSIZE": "131072"},
                 ["Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate ",
                  "set --mem-fraction-static to a smaller value", "set --cuda-graph-max-bs-decode to a smaller value"], id="graph-oom"),
]


@pytest.mark.parametrize(("scenario", "flags", "env", "texts"), FAILURES)
def test_startup_failures(sim_server, scenario, flags, env, texts) -> None:
    sp = sim_server(scenario, *flags, env=env, time_scale=2000)
    assert sp.wait_ready() is False
    assert sp.wait_exit() == 1
    log = sp.log()
    for text in texts:
        assert text in log, log
    assert "The server is fired up" not in log


def test_crash_under_load_drops_connections(sim_server) -> None:
    sp = sim_server(TINY, "--mem-fraction-static", "0.97", "--disable-cuda-graph")
    assert sp.wait_ready()
    _, counts = asyncio.run(_load(sp.url, 8, 8, 16, 16))  # light load: fine
    assert counts == [16] * 8

    async def heavy() -> list:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=200),
                                         timeout=aiohttp.ClientTimeout(total=120)) as s:
            async def one() -> object:
                try:
                    async with s.post(sp.url + "/generate", json={"input_ids": [1] * 16, "stream": True,
                                                                  "sampling_params": {"max_new_tokens": 64}}) as r:
                        return (await r.read()).decode()
                except aiohttp.ClientError as exc:
                    return exc
            return await asyncio.gather(*(one() for _ in range(160)))

    results = asyncio.run(heavy())
    assert sp.wait_exit() == 1
    assert any(isinstance(r, Exception) or "[DONE]" not in r for r in results)
    log = sp.log()
    assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate " in log
    assert "Rank 0 scheduler is dead." in log


def test_bad_flag_is_argparse_error() -> None:
    out = subprocess.run([sys.executable, "-m", "autotune.sim", "serve", "--scenario", "rtx6000-pcie-glm5",
                          "--mem-fraction-static", "x"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 2
    assert "error: argument --mem-fraction-static: invalid float value: 'x'" in out.stderr


def test_invalid_value_exits_with_value_error(sim_server) -> None:
    sp = sim_server(TINY, "--mem-fraction-static", "1.5")
    assert sp.wait_exit() == 1
    assert "ValueError: mem_fraction_static=1.5 must be in (0, 1)" in sp.log()


def test_builtin_glm5_serves(sim_server) -> None:
    sp = sim_server("rtx6000-pcie-glm5", *GLM_GOOD, env={"NCCL_MIN_NCHANNELS": "8"}, time_scale=150)
    assert sp.wait_ready()
    r = _post(sp.url + "/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 2}})
    assert r.json()["meta_info"]["completion_tokens"] == 2


@pytest.mark.parametrize(("cap", "full"), [(16, True), (256, False)], ids=["cap-full", "cap-room"])
def test_the_scheduler_log_shows_a_full_running_cap_as_the_model_does(sim_server, cap: int, full: bool) -> None:
    """The runner's reading of SGLang's scheduler lines (:class:`LoadSignals`) finds the same
    thing in the server's log as the model's scheduler: with ``--max-running-requests 16`` under
    48 clients, 16 in flight and requests waiting; with room for them all, all 48 in flight and
    none waiting then."""
    sp = sim_server(TINY, "--max-running-requests", str(cap), seed=3)
    assert sp.wait_ready()
    n, conc, inp, out = 96, 48, 32, 16
    asyncio.run(_load(sp.url, n, conc, inp, out))
    served = LoadSignals()
    for line in sp.log().splitlines():
        served.observe(line)
    modelled = predict(load_scenario(TINY), args_from_mapping({"max_running_requests": cap}), {},
                       Workload(conc, n, inp, out), seed=3).signals
    assert served.lines > 0 and modelled.lines > 0, sp.log()
    for signals in (served, modelled):
        if full:
            assert signals.in_flight_max == cap and signals.queued_at_max > 0
            assert raises_called_for(signals, {"cap": "queued"}, {"cap": cap}, conc) == {"cap": conc}
        else:  # the clients' 48 never fill 256 slots: none waits once they are all in (some wait
            # for a prefill's token budget before), nothing to raise
            assert signals.in_flight_max == conc and signals.queued_at_max == 0
            assert raises_called_for(signals, {"cap": "queued"}, {"cap": cap}, conc) == {}
        assert signals.demand_max <= conc
    assert modelled.demand_max == conc  # the model's ideal clients all arrive at once
