"""Memory back-off: a profile's memory parameters kept away from the failures the study saw.

Contracts:

- A memory parameter (:func:`memory_parameter`) sizes what an engine takes of the memory:
  higher asks for more.
- When the study saw a memory failure (:func:`memory_failure`) at a value at or above the best's,
  anywhere in the study (whatever the trial's other parameters), the exported value is at least
  ``margin`` below the nearest such value: absolute for a fraction (a parameter within [0, 1]),
  else relative; on the space's grid, one step at least; never below the space's low bound nor
  onto a value that failed for too little memory.
- Each memory parameter gets a note saying what changed, from what, and which trial's failure it
  keeps away from (or why nothing changed); a back-off the trial's command cannot take is not
  applied, and its note says so.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from typing import Any

from autotune.profiles.command import PORT_FIELD
from autotune.profiles.measurement import is_number, show_value
from autotune.store.record import TrialRecord

DEFAULT_MEMORY_MARGIN = 0.02
"""``autotune export --memory-margin``'s default."""
MEMORY_NAMES = frozenset({
    "mem_fraction_static", "--mem-fraction-static",             # SGLang (and the simulated host)
    "gpu_memory_utilization", "--gpu-memory-utilization",       # vLLM
    "VLLM_CPU_KVCACHE_SPACE",                                   # vLLM on CPU (GiB)
    "kv_cache_memory_bytes", "--kv-cache-memory-bytes",         # vLLM
    "cb_max_memory_percent", "--cb-max-memory-percent",         # transformers serve
    "max_total_tokens", "--max-total-tokens",                   # SGLang's KV pool, in tokens
})
"""Parameters (by name, flag or env var) that size what an engine takes of the memory: higher
asks for more, so a memory failure at a higher value bounds them."""
_MEMORY_WORDS = re.compile(r"mem(ory)?[_-]?(fraction|utili[sz]ation|percent)|kv[_-]?cache[_-]?(space|memory)", re.I)
MEMORY_FAILURES = frozenset({"oom", "not-enough-memory"})
"""Failure kinds the runner stores for a server that ran out of memory (or had too little)."""
_NCCL_OOM = re.compile(r"out of memory|CUDA calloc|Cuda failure", re.I)


def memory_parameter(name: str, param: Any = None) -> bool:
    """Whether a parameter sizes the engine's memory: its name, flag or env var is one of
    :data:`MEMORY_NAMES` or reads like one (``..._memory_fraction``, ``kv_cache_space``)."""
    keys = [name] + [k for k in (getattr(param, "flag", None), getattr(param, "env", None)) if k]
    return any(k in MEMORY_NAMES or _MEMORY_WORDS.search(k) for k in keys)


def memory_failure(v: TrialRecord) -> str | None:
    """The memory failure kind of a trial: ``oom``, ``not-enough-memory``, ``oom under load``
    (an OOM under load; in studies recorded before, a crash under load whose log said OOM),
    ``nccl-oom`` (NCCL could not allocate); else None."""
    f = v.failure
    if f is None:
        return None
    if f.kind in MEMORY_FAILURES:
        return "oom under load" if f.kind == "oom" and f.phase == "load" else str(f.kind)
    if f.kind == "crash-under-load" and f.cause in ("oom", "not-enough-memory"):
        return "oom under load"
    if f.kind == "nccl-error" and _NCCL_OOM.search(f.message):
        return "nccl-oom"
    return None


def backoff_value(param: Any, best: Any, nearest: float, margin: float) -> tuple[Any, float]:
    """The value at least ``margin`` below ``nearest`` (absolute for a fraction, a parameter
    within [0, 1]; else relative to ``nearest``), on ``param``'s grid (one step at least), not
    above ``best`` and not below the low bound. Returns (value, the margin applied)."""
    if param.type == "categorical":
        fraction = all(0 <= c <= 1 for c in param.choices if is_number(c))
        gap = margin if fraction else margin * abs(nearest)
        below = sorted(c for c in param.choices if is_number(c) and c < nearest and c <= nearest - gap)
        value = below[-1] if below else best
        return (min(value, best) if below else best), gap
    low = float(param.low)
    fraction = low >= 0 and float(param.high) <= 1
    gap = margin if fraction else margin * abs(nearest)
    step = param.step or (1 if param.type == "int" else None)
    if step:
        gap = max(gap, float(step))
        k = math.floor((nearest - gap - low) / step + 1e-6)
        value: float = low + k * step
    else:
        value = nearest - gap
    value = max(value, low)
    value = min(value, best)
    return param.normalise(value), gap


def memory_backoff(best: TrialRecord, views: Sequence[TrialRecord], space: Any, margin: float,
                   no_space: str = "the study's search space could not be read",
                   ) -> tuple[TrialRecord, list[dict[str, Any]]]:
    """``best`` with its memory parameters backed off (see the module docstring), and one note
    per memory parameter: ``{"parameter", "measured", "exported", "margin", "boundary", "text"}``.

    The rule: the memory failures considered are those of every trial of the study (whatever its
    other parameters) at a value at or above the best's; the nearest of them is the boundary.
    ``space``: the study's :class:`~autotune.config.space.SearchSpace` (None: nothing is changed and
    the note says why: ``no_space``).
    """
    notes: list[dict[str, Any]] = []
    if space is None:
        names = [n for n in best.params if memory_parameter(n)]
        for n in names:
            notes.append({"parameter": n, "measured": best.params[n], "exported": best.params[n], "margin": None,
                          "boundary": None, "text": f"{n} {show_value(best.params[n])} kept: {no_space}, no back-off applied"})
        return best, notes
    params = dict(best.params)
    for name, p in space.parameters.items():
        if name not in params or not memory_parameter(name, p) or p.type not in ("int", "float", "categorical"):
            continue
        b = params[name]
        note: dict[str, Any] = {"parameter": name, "measured": b, "exported": b, "margin": None, "boundary": None}
        notes.append(note)
        if not is_number(b):
            note["text"] = f"{name} {show_value(b)} kept: not a number (the engine sizes it), no back-off"
            continue
        failed = [(v.params.get(name), v.number, memory_failure(v)) for v in views if memory_failure(v)]
        failed = [(x, n, k) for x, n, k in failed if is_number(x)]
        above = sorted((x, n, k) for x, n, k in failed if x >= b)
        # below the best (which ran): only "too little memory" bounds it from below; an OOM there
        # was caused by the trial's other parameters
        below = sorted((x, n, k) for x, n, k in failed if x < b and k == "not-enough-memory")
        tried = [v.params.get(name) for v in views if is_number(v.params.get(name))]
        if not above:
            top = max(tried) if tried else b
            bound = " (the space's high bound)" if p.type != "categorical" and top >= p.high else ""
            note["text"] = (f"{name} {show_value(b)} kept: no memory failure (OOM) seen up to {show_value(top)}{bound}, "
                            "the highest value tried; no failure boundary measured")
            continue
        nearest, trial_no, kind = above[0]
        note["boundary"] = {"value": nearest, "trial": trial_no, "kind": kind}
        new, gap = backoff_value(p, b, nearest, margin)
        note["margin"] = gap
        why = f"trial {trial_no} failed ({kind}) at {show_value(nearest)}"
        if below and is_number(new) and new <= below[-1][0]:
            x, n, k = below[-1]
            note["text"] = (f"{name} {show_value(b)} kept, only {show_value(round(nearest - b, 10))} from the failure boundary: "
                            f"{why}, and trial {n} failed ({k}) at {show_value(x)} below it: no safe value between them")
            continue
        if new == b:
            if nearest - b >= gap - 1e-9:
                note["text"] = f"{name} {show_value(b)} kept: {why}, at least the margin {show_value(gap)} above it"
            else:
                note["text"] = (f"{name} {show_value(b)} kept, though {why} (margin {show_value(gap)}): nothing lower in the "
                                "space")
            continue
        trial_params = {**params, name: new}
        note["exported"] = new
        params = trial_params
        low_note = " (the space's low bound)" if p.type != "categorical" and new <= p.low else ""
        distance = round(nearest - new, 10)
        short = " (as far as the space goes)" if distance < gap - 1e-9 else ""
        note["text"] = (f"{name} {show_value(b)} -> {show_value(new)}{low_note}: {why}; exported {show_value(distance)} below "
                        f"it{short}, margin {show_value(round(gap, 10))}")
    if params == best.params:
        return best, notes
    changed = _relaunch(best, space, params)
    if changed is None:
        for note in notes:
            if note["exported"] != note["measured"]:
                note["text"] += ("; NOT APPLIED: the trial's command does not end with the flags the space "
                                 f"gives, so the exported value stays {show_value(note['measured'])}")
                note["exported"] = note["measured"]
        return best, notes
    return changed, notes


def _relaunch(best: TrialRecord, space: Any, params: dict[str, Any]) -> TrialRecord | None:
    """``best`` with the env and flags of ``params`` in place of its own; None when the trial's
    command does not end with its flags as the space applies them (or the rules change more)."""
    old, new = space.to_launch(best.params), space.to_launch(params)
    if new.applied != params or len(new.args) != len(old.args):
        return None
    tmpl = list(best.argv_template or best.argv)
    start = len(tmpl) - len(old.args)
    if start < 0 or tmpl[start:] != old.args or any(i >= start for i in best.secret_args):
        return None
    env = dict(best.env)
    for k in old.env:
        if k not in new.env:
            env.pop(k, None)
    env.update(new.env)
    argv_template = tmpl[:start] + list(new.args)
    return dataclasses.replace(best, params=params, env=env, argv_template=argv_template,
                               argv=[w.replace(PORT_FIELD, str(best.port or 0)) for w in argv_template])
