"""Continuous batching on a virtual clock: the same scheduler drives ``predict`` and the server.

SGLang's policy, simplified: a prefill batch (up to ``chunked_prefill_size`` prompt tokens,
a long prompt split over several) runs before the decode batch whenever a waiting request can be
admitted; a request is admitted while fewer than ``max_running_requests`` run and the KV pool can
hold its prompt plus all its output tokens (full reservation, so no retraction). A decode
iteration gives every running request one token, or the expected accepted length under
speculative decoding (a per-request fractional accumulator keeps counts exact integers).
``--num-continuous-decode-steps`` is accepted and, as in SGLang 0.3.6..0.5.23, has no effect.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from autotune.sim.engine import EngineConfig

__all__ = ["Forward", "SimRequest", "Scheduler"]


class SimRequest:
    """One generation request as the scheduler tracks it."""

    __slots__ = ("rid", "prompt_len", "max_new", "prefilled", "generated", "acc", "arrival", "first_token_at",
                 "finished_at", "admitted", "notified_at", "user")

    def __init__(self, rid: int, prompt_len: int, max_new: int, arrival: float = 0.0, user: Any = None) -> None:
        self.rid = rid
        self.prompt_len = max(1, prompt_len)
        self.max_new = max(1, max_new)
        self.prefilled = 0
        self.generated = 0
        self.acc = 0.0
        self.arrival = arrival
        self.first_token_at: float | None = None
        self.finished_at: float | None = None
        self.admitted = False
        self.notified_at = -1.0
        self.user = user

    @property
    def finished(self) -> bool:
        return self.finished_at is not None


@dataclass
class Forward:
    """One planned forward pass: ``kind`` is ``prefill`` or ``decode``; ``duration`` in seconds."""

    kind: str
    duration: float
    batch: int
    tokens: int
    parts: list[tuple[SimRequest, int]] = field(default_factory=list)
    oom_gb: float = 0.0


class Scheduler:
    """Plans and applies forwards; knows nothing about wall time or HTTP.

    ``speed`` multiplies throughput (the run's noise factor): durations are divided by it.
    """

    def __init__(self, cfg: EngineConfig, speed: float = 1.0) -> None:
        self.cfg = cfg
        self.speed = speed
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.chunked: SimRequest | None = None
        self.kv_capacity = cfg.memory.kv_tokens
        self.kv_used = 0
        self.ctx_sum = 0
        self.max_running = cfg.max_running_requests
        self.decode_forwards = 0
        self.generated_total = 0
        self.rejected: list[SimRequest] = []

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.running or self.chunked)

    def add(self, req: SimRequest) -> None:
        """Queue a request; one that could never fit the KV pool is rejected (``rejected``)."""
        if req.prompt_len + req.max_new > self.kv_capacity or req.prompt_len + req.max_new > self.cfg.context_len:
            self.rejected.append(req)
            return
        self.waiting.append(req)

    def _occupancy(self) -> int:
        return len(self.running) + (1 if self.chunked is not None else 0)

    def plan(self) -> Forward | None:
        """The next forward, or ``None`` when idle."""
        fwd = self._plan_prefill()
        if fwd is None and self.running:
            b = len(self.running)
            ms = self.cfg.decode_ms(b, self.ctx_sum)
            fwd = Forward("decode", ms / 1000.0 / self.speed, b, b)
        if fwd is not None:
            fwd.oom_gb = self.cfg.load_shortfall_gb(fwd.kind, fwd.batch, fwd.tokens)
        return fwd

    def _plan_prefill(self) -> Forward | None:
        budget = self.cfg.chunked_prefill_size
        parts: list[tuple[SimRequest, int]] = []
        if self.chunked is not None:
            r = self.chunked
            take = min(r.prompt_len - r.prefilled, budget)
            parts.append((r, take))
            budget -= take
        count = self._occupancy()
        kv = self.kv_used
        for r in self.waiting:
            if budget <= 0 or count >= self.max_running:
                break
            need = r.prompt_len + r.max_new
            if kv + need > self.kv_capacity:
                break
            take = min(r.prompt_len, budget)
            parts.append((r, take))
            budget -= take
            kv += need
            count += 1
        if not parts:
            return None
        tokens = sum(t for _, t in parts)
        ctx = 0.0
        logits = 0
        for r, t in parts:
            ctx += t * (r.prefilled + t / 2.0)
            if r.prefilled + t >= r.prompt_len:
                logits += 1
        ms = self.cfg.forward_ms(tokens, ctx, logits, graph=False, prefill_tokens=tokens)
        return Forward("prefill", ms / 1000.0 / self.speed, len(parts), tokens, parts)

    def apply(self, fwd: Forward, now: float) -> tuple[list[SimRequest], list[SimRequest]]:
        """Apply a planned forward that ended at virtual time ``now``.

        Returns (requests that gained tokens, requests that finished).
        """
        gained: list[SimRequest] = []
        finished: list[SimRequest] = []
        if fwd.kind == "prefill":
            for r, take in fwd.parts:
                if r.finished_at is not None:  # aborted while the forward ran
                    continue
                if not r.admitted:
                    self.waiting.popleft() if self.waiting and self.waiting[0] is r else self.waiting.remove(r)
                    r.admitted = True
                    self.kv_used += r.prompt_len + r.max_new
                r.prefilled += take
                if r.prefilled < r.prompt_len:
                    self.chunked = r
                    continue
                if self.chunked is r:
                    self.chunked = None
                r.generated = 1
                r.first_token_at = now
                self.generated_total += 1
                gained.append(r)
                if r.generated >= r.max_new:
                    self._finish(r, now, finished)
                else:
                    self.running.append(r)
                    self.ctx_sum += r.prompt_len + 1
            return gained, finished
        self.decode_forwards += 1
        per = self.cfg.tokens_per_decode()
        spec = self.cfg.speculative
        still: list[SimRequest] = []
        total = 0
        for r in self.running:
            if spec:
                r.acc += per
                g = int(r.acc)
                r.acc -= g
            else:
                g = 1
            left = r.max_new - r.generated
            if g > left:
                g = left
            r.generated += g
            total += g
            gained.append(r)
            if r.generated >= r.max_new:
                self.ctx_sum -= r.prompt_len + r.generated - g
                self._finish(r, now, finished)
            else:
                self.ctx_sum += g
                still.append(r)
        self.running = still
        self.generated_total += total
        return gained, finished

    def abort(self, r: SimRequest) -> None:
        """Drop a request whose client went away, freeing its KV reservation."""
        if r.finished:
            return
        if not r.admitted:
            try:
                self.waiting.remove(r)
            except ValueError:
                pass
            r.finished_at = -1.0
            return
        if self.chunked is r:
            self.chunked = None
        elif r in self.running:
            self.running.remove(r)
            self.ctx_sum -= r.prompt_len + r.generated
        self.kv_used -= r.prompt_len + r.max_new
        r.finished_at = -1.0

    def _finish(self, r: SimRequest, now: float, finished: list[SimRequest]) -> None:
        r.finished_at = now
        self.kv_used -= r.prompt_len + r.max_new
        finished.append(r)

    def token_usage(self) -> float:
        """Share of the KV pool in use by running requests' tokens."""
        return self.ctx_sum / self.kv_capacity if self.kv_capacity else 0.0
