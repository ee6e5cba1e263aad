"""What the engine's own scheduler log says about the load it served, and which cap it calls to raise.

An engine logs its scheduler's state as it serves: SGLang a line per prefill batch (``Prefill
batch. #new-seq: 128, ... #running-req: 0, #queue-req: 64,``) and one every
``--decode-log-interval`` decode batches (``Decode batch. #running-req: 128, ... #queue-req:
64,``); vLLM every few seconds (``... Running: 128 reqs, Waiting: 64 reqs, ...``). An operator
reads two things off them, and so does the sampler (:mod:`autotune.search.samplers`):

- **Requests waited while the running cap was full.** ``--max-running-requests 64`` under 1024
  concurrent clients runs 64 at a time and queues the rest; the field report this project comes
  from raised it to 1024 (with FlashInfer's MoE autotune turned on in the same step) and took
  total throughput from about 880 to 3,740 tok/s. A parameter the
  space declares ``raise_when: queued`` is raised to the demand the log showed.
- **More requests ran at once than the parameter's value.** SGLang captures CUDA graphs for
  decode batches up to ``--cuda-graph-max-bs``; a larger batch runs without one (its decode line
  says ``cuda graph: False``). A parameter declared ``raise_when: running-above`` is raised to
  the most requests seen running at once.

:class:`LoadSignals` accumulates the lines of one trial (the runner feeds it the server's log as
it reads it); the simulated host's model computes the same figures from its scheduler
(:mod:`autotune.bench.model_executor`). :func:`raises_called_for` turns them into proposals.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

RaiseWhen = Literal["queued", "running-above"]
"""The signals a parameter's ``raise_when`` may name (module docstring)."""

ATTR = "load_signals"
"""The trial user attribute the driver stores a trial's signals under."""

_SGLANG = re.compile(r"(?P<kind>Prefill|Decode) batch\b.*?#running-req: (?P<running>\d+).*?#queue-req: (?P<queued>\d+)")
_NEW_SEQ = re.compile(r"#new-seq: (?P<new>\d+)")
_VLLM = re.compile(r"Running: (?P<running>\d+) reqs,.*?(?:Waiting|Pending): (?P<queued>\d+) reqs")


@dataclass
class LoadSignals:
    """The scheduler's busiest moments in one trial's log.

    ``in_flight_max``: the most requests being served at once (SGLang's prefill line counts the
    batch's new sequences besides ``#running-req``, which it logs before they join);
    ``queued_max``: the most waiting; ``demand_max``: the most in flight plus waiting on one line;
    ``full_queued``: whether some line showed requests waiting while ``in_flight_max`` were served
    (the cap was full, not the memory); ``lines``: the scheduler lines read.
    """

    in_flight_max: int = 0
    queued_max: int = 0
    demand_max: int = 0
    queued_at_max: int = 0
    """The most requests waiting on a line that showed ``in_flight_max`` served."""
    lines: int = 0

    def observe(self, line: str) -> None:
        """Take one log line (any line: those that are not a scheduler's are ignored)."""
        if "unning" not in line:  # the cheap test first: most lines are not the scheduler's
            return
        m = _SGLANG.search(line)
        if m is not None:
            in_flight = int(m["running"])
            if m["kind"] == "Prefill":
                new = _NEW_SEQ.search(line)
                in_flight += int(new["new"]) if new else 0
            self.seen(in_flight, int(m["queued"]))
            return
        m = _VLLM.search(line)
        if m is not None:
            self.seen(int(m["running"]), int(m["queued"]))

    def seen(self, in_flight: int, queued: int) -> None:
        """One moment of the scheduler: ``in_flight`` served, ``queued`` waiting."""
        self.lines += 1
        if in_flight > self.in_flight_max:
            self.in_flight_max, self.queued_at_max = in_flight, queued
        elif in_flight == self.in_flight_max:
            self.queued_at_max = max(self.queued_at_max, queued)
        self.queued_max = max(self.queued_max, queued)
        self.demand_max = max(self.demand_max, in_flight + queued)

    def to_attr(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def from_attr(cls, attr: Any) -> LoadSignals | None:
        """The signals a trial stored (:data:`ATTR`), or None where it has none (or not in this form)."""
        if not isinstance(attr, Mapping):
            return None
        try:
            return cls(**{k: int(attr[k]) for k in cls.__dataclass_fields__})
        except (KeyError, TypeError, ValueError):
            return None


def raises_called_for(signals: LoadSignals | None, declared: Mapping[str, str], params: Mapping[str, Any],
                      concurrency: float | None = None) -> dict[str, float]:
    """The value each declared parameter should be raised to, by what ``signals`` saw when the
    trial ran with ``params``; a parameter whose signal did not show is left out.

    - ``queued``: requests waited while the scheduler served the parameter's value or more (the
      cap was full): raised to the demand seen, and to the load's ``concurrency`` (a closed-loop
      client's bound on requests in flight) where that is known and larger; the log shows only
      some moments, so the demand it shows may fall short of what the clients kept waiting.
    - ``running-above``: more requests ran at once than the parameter's value: raised to the
      most seen.

    Contract: every value returned is larger than the parameter's current value; a parameter not
    in ``params``, or not a number there, is left out. The caller snaps the value to the
    parameter's range.
    """
    if signals is None or signals.lines == 0:
        return {}
    out: dict[str, float] = {}
    for name, when in declared.items():
        value = params.get(name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            continue
        if when == "queued" and signals.queued_at_max > 0 and signals.in_flight_max >= value:
            target = float(max(signals.demand_max, concurrency or 0))
        elif when == "running-above":
            target = float(signals.in_flight_max)
        else:
            continue
        if target > value:
            out[name] = target
    return out


__all__ = ["ATTR", "LoadSignals", "RaiseWhen", "raises_called_for"]
