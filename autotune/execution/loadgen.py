"""Async load generator for OpenAI-compatible and SGLang streaming endpoints.

:func:`run_load` sends a :class:`~autotune.execution.workload.Workload`'s synthetic prompts to a
running server, streams every response (:mod:`autotune.execution.load_client`), and returns a
:class:`~autotune.execution.workload.LoadResult`: throughput and latency with the definitions of
``sglang.bench_serving`` (stated there). Warm-up requests are sent and awaited first and are not
counted; the measured run then sends its requests at once (closed loop) or as a Poisson process,
at most ``concurrency`` in flight. A failed request counts in ``failed`` with its error text in
``errors``: failures never abort the run. Progress
(:class:`~autotune.execution.workload.LoadProgress`) goes to ``on_progress`` while it runs, and
``should_stop`` can end it early with what was measured so far.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiohttp
import numpy as np

from autotune.execution.load_client import Client, Record, Tally, first_model
from autotune.execution.prompts import PromptError, PromptSet, make_prompts
from autotune.execution.workload import LoadProgress, LoadResult, Workload

__all__ = ["LoadError", "run_load", "run_load_sync"]

_MAX_ERRORS = 5
_STOP_POLL_S = 0.1
_PROGRESS_EVERY_S = 0.1


class LoadError(RuntimeError):
    """The load cannot be run at all (``base_url`` is not an ``http(s)://`` URL, the tokenizer the
    workload names does not load, its dataset cannot be read).

    Problems of the server under test (refused connections, HTTP errors, timeouts, a crash) never
    raise: they are counted as failed requests in the :class:`LoadResult`.
    """


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

    The prompts (:mod:`autotune.execution.prompts`) are made before the warm-up, with the tokenizer
    of ``workload.tokenizer``, else of the served model (``workload.model``, else vLLM's ``root`` or
    the ``id`` of ``GET /v1/models``, else ``workload.tokenizer_hint``); the first time a process
    makes them without a tokenizer, it says so on stderr (:attr:`LoadResult.prompts` always says
    how they were made).

    Raises:
        LoadError: ``base_url`` is not an ``http://`` or ``https://`` URL; the prompts cannot be
            made (:class:`~autotune.execution.prompts.PromptError`).
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
        model, root = workload.model, None
        if workload.api == "openai" and model is None:
            model, root, problem = await first_model(session, base, min(10.0, workload.request_timeout_s))
            if problem:
                errors.append(problem)
        try:
            names = (workload.model, root, model, workload.tokenizer_hint)
            prompts = await asyncio.to_thread(make_prompts, workload, names)
        except PromptError as exc:
            raise LoadError(str(exc)) from None
        _say_once(prompts)
        client = Client(session, base, workload, model, prompts)
        stop = _Stop(should_stop)
        if workload.warmup_prompts:
            warmup = _Run(client, workload.warmup_prompts, min(workload.warmup_prompts, workload.concurrency),
                          None, stop, None, namespace=1)
            await warmup.execute()
        if stop.stopped:
            return _summarize(workload, _RunOutcome([], 0.0), errors, prompts.note)
        measured = _Run(client, workload.num_prompts, workload.concurrency, workload.request_rate, stop,
                        on_progress, namespace=0)
        outcome = await measured.execute()
    return _summarize(workload, outcome, errors, prompts.note)


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

_SAID: set[str] = set()


def _say_once(prompts: PromptSet) -> None:
    """Say on stderr, once per process and note, that a load's prompt lengths are approximate."""
    if not prompts.exact and prompts.note not in _SAID:
        _SAID.add(prompts.note)
        print(f"autotune: {prompts.note}", file=sys.stderr)



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
    records: list[Record]
    duration_s: float
    cancelled: int = 0


class _Run:
    """Sends ``total`` requests with at most ``concurrency`` in flight, closed loop or Poisson."""

    def __init__(
        self,
        client: Client,
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
        self.records: list[Record] = []
        self.in_flight = 0
        self.finished = asyncio.Event()
        self.last_progress = 0.0
        self.start = 0.0
        self.tally = Tally()
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
            output_tokens_total=float(c.prompts.output_total),
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
            prompt = self.client.prompt(self.namespace, index)
            body = self.client.payload(prompt)
            self.in_flight += 1
            try:
                record = await self.client.send(body, self.tally, prompt.input_len)
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


def _summarize(workload: Workload, outcome: _RunOutcome, errors: list[str], prompts: str) -> LoadResult:
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
                      cancelled=outcome.cancelled, prompts=prompts)
