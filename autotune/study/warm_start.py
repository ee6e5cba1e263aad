"""A warm start: what earlier studies found about a host, an engine and a model, carried into a
new study's search (``warm_start:`` in the config, ``study start --warm-start-from``).

What carries over, by kind of knowledge (:func:`plan`):

- facts of the host: ``nccl-error`` failures, when the host is the same (:func:`fingerprint`: GPU
  model and count, driver and NCCL versions; the interconnect for a simulated host);
- facts of the engine: values the engine refused (``invalid-argument``), when the engine and its
  version are the same (:func:`same_version`);
- with a host's or engine's failure, the move it shows (:class:`~autotune.search.prior.Move`)
  where a configuration of the source that ran differs from the failed one in one parameter
  alone: the sampler avoids that value as it does after its own failed probe;
- facts of the model: every other failure (memory above all), and the runs beside the failures,
  only when host, engine and model are the same: across models the memory boundary moves with
  weights and KV size, and no stated reason scales it here, so it is not carried;
- hints the new study confirms by measuring them (:class:`~autotune.search.prior.Hint`): the
  source's best configuration (for another model, without its memory settings, which belong to
  the memory boundary), then its NCCL settings alone (same host), each proposed once on the best
  configuration measured here.

A source on another host or engine is refused (:class:`WarmStartError`) unless ``force``: then it
is carried as if the same, the difference stated. Nothing is silent: :attr:`WarmStart.lines` name
each source, what matched and what was carried from which trials; the snapshot (:data:`ATTR`)
keeps it with the study: a resume, `study show` and the sampler read it without the source.
The study's own trials win over the prior (:mod:`autotune.search.prior`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import optuna

from autotune.config.space import SearchSpace
from autotune.config.study import StudyConfig, WarmStartFrom
from autotune.errors import UsageError
from autotune.outcome.failures import MEMORY_KINDS
from autotune.search.prior import Hint, Move, Prior
from autotune.store.record import Outcome, TrialRecord, failure_from_attrs, read_all
from autotune.store.study_view import WARM_START_ATTR, best_view, load_study
from autotune.study.identity import HOST_FACTS

ATTR = WARM_START_ATTR
"""Study user attr: the warm start's sources, carried records, hints and lines (:func:`plan`)."""
HOST_KINDS = ("nccl-error",)
"""Failure kinds that are facts of the host."""
ENGINE_KINDS = ("invalid-argument",)
"""Failure kinds that are facts of the engine (a value it refuses)."""
MESSAGE_CHARS = 400
"""Characters of a carried failure's message kept in the snapshot."""


class WarmStartError(UsageError):
    """A warm start's source cannot be used (missing, empty, or another host or engine)."""


@dataclass(frozen=True)
class Fingerprint:
    """What a study ran on, in words: ``host`` (None: unknown), ``engine``, ``model``."""

    host: str | None
    engine: str
    model: str | None


@dataclass
class WarmStart:
    """What a study starts from: the sampler's :class:`~autotune.search.prior.Prior`, the lines
    that say it, and the JSON snapshot kept with the study."""

    prior: Prior = field(default_factory=Prior)
    lines: list[str] = field(default_factory=list)
    record: dict[str, Any] = field(default_factory=dict)


def fingerprint(config: Mapping[str, Any], facts: Mapping[str, Mapping[str, Any]]) -> Fingerprint:
    """The host, engine and model of a study's stored ``config`` with its hosts' ``facts``
    (:data:`~autotune.study.identity.HOST_FACTS`)."""
    target = config.get("target") or {}
    engine = str(target.get("engine") or "?")
    if engine == "sim":
        from autotune.sim.scenario import ScenarioError, load_scenario

        try:
            sc = load_scenario(str(target.get("scenario") or "rtx6000-pcie-glm5"))
        except (ScenarioError, OSError, ValueError):
            return Fingerprint(None, engine, None)
        link = sc.interconnect.kind + ("" if sc.interconnect.kind != "pcie" else " P2P" if sc.interconnect.p2p
                                       else " without P2P")
        return Fingerprint(f"{sc.gpu.count}x {sc.gpu.name}, {link}", engine, sc.model.name)
    hosts = sorted({", ".join(x for x in (f.get("gpu") or "no GPU", f.get("driver") and f"driver {f['driver']}",
                                          f.get("nccl") and f"NCCL {f['nccl']}") if x) for f in facts.values()})
    versions = sorted({str(f["engine_version"]) for f in facts.values() if f.get("engine_version")})
    return Fingerprint(" + ".join(hosts) or None, f"{engine} {versions[0]}" if versions else engine,
                       target.get("model"))


def same_version(a: str, b: str) -> bool:
    """Whether two engines (``"vllm 0.11.2"``) are the same engine and release line: the same
    major version, and minor too while the major is 0."""
    (na, _, va), (nb, _, vb) = a.partition(" "), b.partition(" ")
    if na != nb:
        return False
    pa, pb = va.split("."), vb.split(".")
    width = 2 if pa[:1] == ["0"] else 1
    return pa[:width] == pb[:width]


def prepare(study: optuna.Study, config: StudyConfig, space: SearchSpace, baseline: Mapping[str, Any],
            planned: WarmStart | None = None) -> WarmStart:
    """The study's warm start: read back from its snapshot, else ``planned`` (:func:`prepare_new`)
    or planned now from ``config.warm_start`` with the study's host facts, and stored. Empty
    without any. ``baseline``: the study's, raw.

    Raises:
        WarmStartError: as :func:`prepare_new`.
    """
    stored = study.user_attrs.get(ATTR)
    if isinstance(stored, dict):
        return restore(stored)
    if not config.warm_start:
        return WarmStart()
    warm = planned or prepare_new(config, space, baseline, study.user_attrs.get(HOST_FACTS) or {})
    study.set_user_attr(ATTR, warm.record)
    return warm


def prepare_new(config: StudyConfig, space: SearchSpace, baseline: Mapping[str, Any],
                facts: Mapping[str, Mapping[str, Any]]) -> WarmStart:
    """:func:`plan` for ``config``'s sources, on its target with its hosts' ``facts``
    (:data:`~autotune.study.identity.HOST_FACTS`), before anything is recorded.

    Raises:
        WarmStartError: a source is missing, has no finished trial, is this study, or ran on
            another host or engine without ``force``.
    """
    mine = fingerprint(config.model_dump(mode="json"), facts)
    sources = []
    for ref in config.warm_start:
        storage = ref.storage or config.storage
        if ref.study == config.name and storage == config.storage:
            raise WarmStartError(f"warm_start: study '{ref.study}' is this study")
        try:
            sources.append((ref, load_study(ref.study, storage)))
        except UsageError as exc:
            raise WarmStartError(f"warm_start: {exc}") from None
    return plan(sources, mine, space, baseline)


def plan(sources: Sequence[tuple[WarmStartFrom, optuna.Study]], mine: Fingerprint, space: SearchSpace,
         baseline: Mapping[str, Any]) -> WarmStart:
    """What each source carries into a study on ``mine`` with ``space`` and raw ``baseline``
    (module docstring), as a :class:`WarmStart` whose ``record`` is its snapshot."""
    record: dict[str, Any] = {"sources": [], "failures": [], "runs": [], "hints": [], "moves": []}
    lines: list[str] = []
    seen_hints: list[dict[str, Any]] = []
    for ref, source in sources:
        theirs = fingerprint(source.user_attrs.get("config") or {}, source.user_attrs.get(HOST_FACTS) or {})
        same_host = mine.host is not None and theirs.host == mine.host
        same_engine = same_version(theirs.engine, mine.engine)
        same_model = theirs.model == mine.model
        differs = [f"host: {theirs.host or 'unknown'}, now {mine.host or 'unknown'}"] if not same_host else []
        differs += [f"engine: {theirs.engine}, now {mine.engine}"] if not same_engine else []
        if differs and not ref.force:
            raise WarmStartError(f"warm_start: study '{source.study_name}' ran on another "
                                 f"{' and '.join(d.split(':')[0] for d in differs)} ({'; '.join(differs)}): "
                                 "its facts do not hold here (force: true, or --force, carries them anyway)")
        host_ok, engine_ok = same_host or ref.force, same_engine or ref.force
        model_ok = host_ok and engine_ok and same_model
        views = [v for v in read_all(source) if v.outcome.finished and not v.ablation]
        if not views:
            raise WarmStartError(f"warm_start: study '{source.study_name}' has no finished trial")
        carried: dict[str, list[int]] = {}
        left: dict[str, list[int]] = {}
        for v in views:
            params = _completed(v.params, space, baseline)
            if params is None:
                continue
            if v.outcome.measured:
                if model_ok:
                    record["runs"].append(_entry(source.study_name, v, params))
                continue
            kind = v.failure.kind if v.failure else "crash"
            ok = host_ok if kind in HOST_KINDS else engine_ok if kind in ENGINE_KINDS else model_ok
            (carried if ok else left).setdefault(kind, []).append(v.number)
            if ok:
                record["failures"].append(_entry(source.study_name, v, params))
                if kind in HOST_KINDS + ENGINE_KINDS:
                    record["moves"] += _moves(source.study_name, v, kind, views, space)
        moves = [m for m in record["moves"] if m["study"] == source.study_name]
        hints = _hints(source, space, baseline, host_ok, model_ok, seen_hints)
        record["hints"] += [{"values": h.values, "why": h.why} for h in hints]
        record["sources"].append({"study": source.study_name, "host": theirs.host, "engine": theirs.engine,
                                  "model": theirs.model, "differs": differs, "forced": bool(differs)})
        lines += _lines(source.study_name, theirs, mine, differs, carried, left, hints, moves)
    record["lines"] = lines
    return restore(record)


def restore(record: Mapping[str, Any]) -> WarmStart:
    """The :class:`WarmStart` a snapshot (:data:`ATTR`) holds."""
    failures = tuple(_view(e, -(i + 1)) for i, e in enumerate(record.get("failures") or []))
    runs = tuple(_view(e, -(len(failures) + i + 1)) for i, e in enumerate(record.get("runs") or []))
    hints = tuple(Hint(dict(h["values"]), dict(h["why"])) for h in record.get("hints") or [])
    moves = tuple(Move(str(m["param"]), m["before"], m["after"], str(m["kind"])) for m in record.get("moves") or [])
    return WarmStart(Prior(failures, runs, hints, moves), [str(x) for x in record.get("lines") or []], dict(record))


def _moves(study: str, failed: TrialRecord, kind: str, views: Sequence[TrialRecord],
           space: SearchSpace) -> list[dict[str, Any]]:
    """The moves ``failed`` shows: for each measured trial of its study that differs from it in
    one parameter of the space alone, that parameter moved from the trial's value to its own."""
    out = []
    for ran in views:
        if not ran.outcome.measured:
            continue
        names = set(ran.params) | set(failed.params)
        differ = [n for n in names if ran.params.get(n) != failed.params.get(n)]
        if len(differ) == 1 and _inside(space, differ[0], failed.params.get(differ[0])):
            move = {"param": differ[0], "before": ran.params.get(differ[0]), "after": failed.params[differ[0]],
                    "kind": kind, "study": study, "trials": [ran.number, failed.number]}
            if not any(m["param"] == move["param"] and m["after"] == move["after"] for m in out):
                out.append(move)
    return out


def _completed(params: Mapping[str, Any], space: SearchSpace, baseline: Mapping[str, Any]) -> dict[str, Any] | None:
    """``params`` in ``space``: its shared parameters (each a valid value), the rest from
    ``baseline``; None when a shared value lies outside the space."""
    out = {}
    for name in space.parameters:
        value = params.get(name, baseline.get(name))
        if name in params and not _inside(space, name, value):
            return None
        out[name] = value
    return out


def _inside(space: SearchSpace, name: str, value: Any) -> bool:
    """Whether ``space`` has a parameter ``name`` and ``value`` is a valid value of it."""
    return name in space.parameters and space.parameters[name].out_of_range(value) is None


def _hints(source: optuna.Study, space: SearchSpace, baseline: Mapping[str, Any], host_ok: bool, model_ok: bool,
           seen: list[dict[str, Any]]) -> list[Hint]:
    """The source best's values where they differ from ``baseline``: all of them (another model,
    not ``model_ok``: but its memory settings, the server parameters the space declares monotone
    for a memory failure), then its NCCL settings alone (``host_ok``); each unless one in ``seen``
    (which they join) has them."""
    best = best_view(source)
    if best is None:
        return []
    raw = next((t.params for t in source.get_trials(deepcopy=False) if t.number == best.number), {})
    shared = {n: v for n, v in raw.items() if _inside(space, n, v) and baseline.get(n) != v}
    host = {n: v for n, v in shared.items() if (space.parameters[n].env or "").startswith("NCCL_")}
    memory = [] if model_ok else [n for n in shared
                                  if n not in host and set(MEMORY_KINDS).intersection(space.parameters[n].monotone)]
    whole = (("whole configuration", shared) if not memory else
             (f"configuration but its memory settings ({', '.join(memory)}: another model)",
              {n: v for n, v in shared.items() if n not in memory}))
    out = []
    for part, values in (whole, ("NCCL settings", host if host_ok else {})):
        if values and values not in seen:
            seen.append(values)
            out.append(Hint(values, {"by": "warm-start", "study": source.study_name, "trial": best.number,
                                     "part": part}))
    return out


def _entry(study: str, v: TrialRecord, params: dict[str, Any]) -> dict[str, Any]:
    """A carried record in the snapshot."""
    entry: dict[str, Any] = {"study": study, "trial": v.number, "outcome": v.outcome.value, "params": params,
                             "env": {k: x for k, x in v.env.items() if k.startswith("NCCL_")},
                             "duration_s": v.duration_s}
    if v.failure:
        entry["failure"] = {"failure_kind": str(v.failure.kind), "failure_message": v.failure.message[:MESSAGE_CHARS],
                            "failure_phase": str(v.failure.phase) if v.failure.phase else None,
                            "failure_cause": v.failure.cause}
    return entry


def _view(entry: Mapping[str, Any], number: int) -> TrialRecord:
    """A carried record as the sampler reads it, numbered ``number`` (below 0)."""
    return TrialRecord(number=number, state="COMPLETE", outcome=Outcome(str(entry["outcome"])),
                       params=dict(entry["params"]), value=None, metrics={},
                       failure=failure_from_attrs(entry.get("failure") or {}), duration_s=entry.get("duration_s"),
                       env=dict(entry.get("env") or {}))


def _lines(name: str, theirs: Fingerprint, mine: Fingerprint, differs: list[str], carried: Mapping[str, list[int]],
           left: Mapping[str, list[int]], hints: Sequence[Hint], moves: Sequence[Mapping[str, Any]]) -> list[str]:
    """What one source carries, in words."""
    if differs:
        head = f"warm start from study {name}, forced: {'; '.join(differs)}"
    else:
        head = f"warm start from study {name}: same host ({mine.host}), same engine ({mine.engine})"
    head += ", same model" if theirs.model == mine.model else f", another model ({theirs.model})"
    out = [head]
    if carried:
        out.append("  carried as facts: " + "; ".join(f"{k} (trials {_numbers(n)})" for k, n in sorted(carried.items())))
    for m in moves:
        out.append(f"  avoided: {m['param']}={m['after']} ({m['kind']} in trial {m['trials'][1]}, where trial "
                   f"{m['trials'][0]} ran with {m['before']}: the one change)")
    if left:  # only a model's facts are left behind: a source on another host or engine is refused or forced
        why = "another model: the memory boundary moves with weights and KV size"
        out.append("  not carried: " + "; ".join(f"{k} (trials {_numbers(n)})" for k, n in sorted(left.items()))
                   + f" ({why})")
    for hint in hints:
        out.append(f"  to confirm: trial {hint.why['trial']}'s {hint.why['part']} "
                   f"({' '.join(f'{k}={v}' for k, v in hint.values.items())}), on the best measured here")
    if not carried and not hints:
        out.append("  nothing to carry: no failure it may carry, and its best is this study's baseline")
    return out


def _numbers(numbers: Sequence[int]) -> str:
    shown = ", ".join(str(n) for n in numbers[:8])
    return shown + (f" and {len(numbers) - 8} more" if len(numbers) > 8 else "")


__all__ = ["ATTR", "Fingerprint", "WarmStart", "WarmStartError", "fingerprint", "plan", "prepare", "prepare_new", "restore",
           "same_version"]
