"""Objectives: the workload a trial is measured under, the metric(s), direction(s), and SLOs.

An objective file looks like::

    name: throughput_slo
    metric: output_throughput       # a metric of the load generator (or the benchmark's parser)
    direction: maximize
    load: {concurrency: 256, num_prompts: 1024, input_len: 256, output_len: 128, warmup_prompts: 16}
    constraints: ["p99_ttft_ms <= 2000"]   # a trial breaking one is infeasible (slo-violated)
    early_stop: true                # stop a load that cannot beat the best (autotune.execution.early_stop);
                                    # or {min_requests: 16, min_seconds: 1}: not before that much load

or, instead of the built-in load generator, an external benchmark whose output is parsed::

    benchmark: {command: "python -m sglang.bench_serving --port {port} --output-file {result_file}",
                parse: sglang-bench-serving}

The objective can be the whole workload rather than one measurement:

- ``weighted``: metrics defined as weighted sums of measured ones (:class:`WeightedMetric`);
- ``loads``: several loads run one after another on the same server (:class:`NamedLoad`);
- ``objectives`` (instead of ``metric``/``direction``): a multi-objective study, with ``choose``
  the rule that picks its exported trial from the Pareto front (:class:`Objective`).

A metric named anywhere must be one the trial measures (the load generator's, per load, the
collectives benchmark's ops and sizes, or a weighted one): a typo is a :class:`ConfigError` at
load, not a study of infeasible trials.
"""

from __future__ import annotations

import argparse
import math
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from autotune.util import resources as _resources
from autotune.util.template import BENCHMARK_FIELDS, template_fields
from autotune.util.yaml_files import load_yaml_mapping, one_line
from autotune.errors import ConfigError
from autotune.config.pareto import DEFAULT_TOLERANCE, ChoiceRule, Goal
from autotune.outcome.results import COLLECTIVES_STATS, COLLECTIVES_TOTALS

_CONSTRAINT = re.compile(r"^\s*([A-Za-z_][\w@./-]*)\s*(<=|>=)\s*(-?[\d.]+(?:e-?\d+)?)\s*$")
_METRIC_NAME = re.compile(r"^[A-Za-z_][\w@./-]*$")
LOAD_SEPARATOR = "/"
"""Between a load's name and a metric: ``chat/p99_ttft_ms`` (objectives with several ``loads``)."""

LOADGEN_METRICS = frozenset(
    ["completed", "failed", "input_tokens", "output_tokens", "max_concurrency", "duration_s",
     "request_throughput", "output_throughput", "total_throughput"]
    + [f"{stat}_{name}_ms" for stat in ("mean", "median", "p99") for name in ("ttft", "tpot", "itl", "e2e_latency")]
)
"""The metrics of the built-in load generator: an objective without a benchmark uses these."""


class DatasetSpec(BaseModel):
    """A load's prompts from a file: ``{kind: sharegpt, path: FILE}`` (ShareGPT JSON, as ``vllm bench
    serve --dataset-name sharegpt`` reads it), ``output_len`` to replace each answer's length."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)

    kind: Literal["sharegpt"]
    path: str = Field(min_length=1)
    output_len: int | None = Field(default=None, gt=0, le=10_000_000)


class LoadSpec(BaseModel):
    """The built-in load generator's workload (see :class:`autotune.execution.workload.Workload`):
    ``input_len`` and ``output_len`` are tokens of the model's tokenizer (``tokenizer``: a local
    folder or cached hub id to load it from; default the served model's), or ``dataset`` gives the
    prompts."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)

    api: Literal["openai", "sglang"] | None = None
    concurrency: int = Field(default=64, gt=0, le=1_000_000)
    num_prompts: int = Field(default=256, gt=0, le=10_000_000)
    input_len: int = Field(default=256, gt=0, le=10_000_000)
    output_len: int = Field(default=128, gt=0, le=10_000_000)
    warmup_prompts: int = Field(default=8, ge=0, le=10_000_000)
    request_rate: float | None = Field(default=None, gt=0)
    request_timeout_s: float = Field(default=300.0, gt=0)
    max_failed_fraction: float = Field(default=0.02, ge=0, le=1)
    tokenizer: str | None = Field(default=None, min_length=1)
    dataset: DatasetSpec | None = None


ResultFormat = Literal["sglang-bench-serving", "vllm-bench", "nccl-tests", "json", "collectives"]


class BenchmarkSpec(BaseModel):
    """An external benchmark command whose output is parsed into metrics.

    ``command`` words may hold ``{python}``, ``{host}``, ``{port}``, ``{base_url}``, ``{model}``
    and ``{result_file}`` (any other placeholder, an unbalanced brace or quote is a
    :class:`ConfigError` at load); the result is read from ``{result_file}`` when the command names it,
    else from the command's output. With ``engine: none`` (no server) the trial's env applies to
    the command and the trial's flags are appended to it.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)

    command: str = Field(min_length=1)
    parse: ResultFormat
    json_path: str | None = Field(default=None, min_length=1)
    timeout_s: float = Field(default=600.0, gt=0)

    @field_validator("command")
    @classmethod
    def _command_template(cls, command: str) -> str:
        template_fields(command, BENCHMARK_FIELDS)
        return command

    @model_validator(mode="after")
    def _json_path_applies(self) -> BenchmarkSpec:
        if self.json_path is not None and self.parse == "nccl-tests":
            raise ValueError("json_path does not apply to parse: nccl-tests (its output is not JSON)")
        return self


@dataclass(frozen=True)
class Constraint:
    """``metric <= bound`` or ``metric >= bound``; :meth:`violation` > 0 means broken."""

    metric: str
    op: str
    bound: float

    def __str__(self) -> str:
        return f"{self.metric} {self.op} {self.bound:g}"

    def violation(self, metrics: dict[str, float]) -> float:
        value = metrics.get(self.metric)
        if value is None:
            return float("inf")
        return value - self.bound if self.op == "<=" else self.bound - value


class _LoadEntry(LoadSpec):
    """One of several loads: a load with a name (the prefix of its metrics) and a weight."""

    name: str = Field(pattern=r"^[A-Za-z_][\w-]*$", max_length=64)
    weight: float = Field(default=1.0, gt=0)


class _Term(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)

    metric: str = Field(min_length=1)
    weight: float = Field(gt=0)


STOP_MIN_REQUESTS = 16
"""Completed requests of a load before it may stop early (default of ``early_stop.min_requests``)."""
STOP_MIN_SECONDS = 1.0
"""Seconds of a load before it may stop early (default of ``early_stop.min_seconds``)."""


class EarlyStopSpec(BaseModel):
    """``early_stop: {min_requests: N, min_seconds: S}``: early stopping on, and no load stops before
    ``N`` completed requests and ``S`` seconds of its measured run (a stop then saves little, and a
    short stretch of a load is mostly noise)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)

    min_requests: int = Field(default=STOP_MIN_REQUESTS, ge=0, le=10_000_000)
    min_seconds: float = Field(default=STOP_MIN_SECONDS, ge=0)


class _GoalEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)

    metric: str = Field(min_length=1)
    direction: Literal["maximize", "minimize"]


class _ChoiceEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)

    rule: Literal["bound", "knee", "first"] = "bound"
    tolerance: float = Field(default=DEFAULT_TOLERANCE, ge=0, le=10)
    bounds: dict[str, float] = Field(default_factory=dict)


class _ObjectiveFile(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)

    name: str | None = None
    description: str | None = None
    metric: str = Field(default="output_throughput", min_length=1)
    direction: Literal["maximize", "minimize"] = "maximize"
    objectives: list[_GoalEntry] | None = Field(default=None, min_length=2)
    choose: _ChoiceEntry | None = None
    load: LoadSpec = Field(default_factory=LoadSpec)
    loads: list[_LoadEntry] | None = Field(default=None, min_length=1)
    weighted: dict[str, list[_Term]] = Field(default_factory=dict)
    benchmark: BenchmarkSpec | None = None
    constraints: list[str] = Field(default_factory=list)
    early_stop: bool | EarlyStopSpec = True

    @field_validator("early_stop", mode="before")
    @classmethod
    def _early_stop_mapping(cls, value: Any) -> Any:
        """A mapping is an :class:`EarlyStopSpec`, its first error named by its key (not a union's two errors)."""
        if not isinstance(value, Mapping):
            return value
        try:
            return EarlyStopSpec.model_validate(value)
        except pydantic.ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(x) for x in first["loc"])
            raise ValueError(f"{where}: {first['msg']}" if where else first["msg"]) from None

    @field_validator("weighted")
    @classmethod
    def _weighted_terms(cls, weighted: dict[str, list[_Term]]) -> dict[str, list[_Term]]:
        for name, terms in weighted.items():
            if not _METRIC_NAME.match(name):
                raise ValueError(f"'{name}' is not a metric name (letters, digits and _ @ . / -)")
            if not terms:
                raise ValueError(f"'{name}' has no terms (a list of {{metric, weight}})")
            seen = [t.metric for t in terms]
            twice = sorted({m for m in seen if seen.count(m) > 1})
            if twice:
                raise ValueError(f"'{name}' lists {twice[0]} twice")
        return weighted


def _one_way_each(parsed: _ObjectiveFile, where: str) -> None:
    """The keys that exclude each other: ``objectives`` or ``metric``/``direction``; ``load`` or
    ``loads``; ``loads`` or a ``benchmark``; ``choose`` with ``objectives`` only; names once each.

    Raises:
        ConfigError: one line naming the clash.
    """
    given = parsed.model_fields_set
    problem = ""
    if parsed.objectives is not None:
        both = sorted(given & {"metric", "direction"})
        metrics = [g.metric for g in parsed.objectives]
        twice = sorted({m for m in metrics if metrics.count(m) > 1})
        if both:
            problem = f"give either objectives or {' and '.join(both)}, not both"
        elif twice:
            problem = f"objectives: {twice[0]} is listed twice"
    elif parsed.choose is not None:
        problem = "choose: applies to a multi-objective study (objectives: two or more)"
    if not problem and parsed.loads is not None:
        names = [entry.name for entry in parsed.loads]
        twice = sorted({n for n in names if names.count(n) > 1})
        if "load" in given:
            problem = "give either load or loads, not both"
        elif parsed.benchmark is not None:
            problem = "loads: are run by the built-in load generator; a benchmark command runs its own load"
        elif twice:
            problem = f"loads: the name {twice[0]} is used twice"
        elif len({entry.api for entry in parsed.loads}) > 1:
            problem = "loads: every load runs against the same server: give one api for all of them"
    if problem:
        raise ConfigError(f"{where}: {problem}")


def _finite(text: str) -> float | None:
    """``text`` as a finite float, or None (``1.2.3``, ``1e999``)."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


@dataclass(frozen=True)
class WeightedMetric:
    """A metric defined as ``sum(weight x metric)`` over measured metrics (its ``terms``).

    The objective file's entry:

    ``weighted``: metrics defined as weighted sums of measured ones, each usable as ``metric``, in
      an ``objectives`` entry or in a constraint::

          weighted:
            allreduce_us_per_step:     # the time a forward pass spends in all-reduce
              - {metric: latency_us@all_reduce@43008, weight: 109.8}
              - {metric: latency_us@all_reduce@33554432, weight: 3.66}
    """

    name: str
    terms: tuple[tuple[str, float], ...]

    def value(self, metrics: Mapping[str, float]) -> float | None:
        """The weighted sum, or None when a term was not measured."""
        if any(m not in metrics for m, _ in self.terms):
            return None
        return math.fsum(w * metrics[m] for m, w in self.terms)

    def __str__(self) -> str:
        return " + ".join(f"{w:g} x {m}" for m, w in self.terms)


@dataclass(frozen=True)
class NamedLoad:
    """One load of several: its metrics are recorded as ``{name}/{metric}``.

    The objective file's entry:

    ``loads``: several loads run one after another on the same server in one trial, each with a
      weight. Each load's metrics are recorded as ``LOAD/METRIC`` (``chat/p99_ttft_ms``), and each
      metric of the load generator under its own name is the weighted mean over the loads
      (``output_throughput`` = sum(weight x LOAD/output_throughput) / sum(weight))::

          loads:
            - {name: chat, weight: 3, concurrency: 32, input_len: 256, output_len: 256}
            - {name: batch, weight: 1, concurrency: 256, input_len: 1024, output_len: 64}
    """

    name: str
    weight: float
    spec: LoadSpec

    @property
    def prefix(self) -> str:
        return f"{self.name}{LOAD_SEPARATOR}"


@dataclass(frozen=True)
class Objective:
    """A validated objective.

    ``metric`` and ``direction`` are the first (for a single-objective study the only) of
    ``goals``; ``load`` is the first of ``loads`` when there are several. ``choice`` is the rule
    that picks a multi-objective study's exported trial from its Pareto front.

    The objective file's entry for several goals:

    ``objectives`` (instead of ``metric``/``direction``): two or more, each a metric and a
      direction, for a multi-objective study; ``choose`` states the rule that picks the exported
      trial from the Pareto front (:mod:`autotune.config.pareto`)::

          objectives:
            - {metric: output_throughput, direction: maximize}
            - {metric: p99_ttft_ms, direction: minimize}
          choose: {rule: bound, tolerance: 0.1}     # or {rule: bound, bounds: {p99_ttft_ms: 500}}, knee, first
    """

    name: str
    metric: str
    direction: Literal["maximize", "minimize"]
    load: LoadSpec
    constraints: tuple[Constraint, ...]
    benchmark: BenchmarkSpec | None = None
    goals: tuple[Goal, ...] = ()
    weighted: tuple[WeightedMetric, ...] = ()
    loads: tuple[NamedLoad, ...] = ()
    choice: ChoiceRule = field(default_factory=ChoiceRule)
    early_stop: bool = True
    """Whether a trial's load may stop early once it cannot beat the best so far (where the metric
    allows a bound: :func:`autotune.execution.early_stop.applies`)."""
    stop_after: EarlyStopSpec = field(default_factory=EarlyStopSpec)
    """The least load before an early stop (``early_stop: {min_requests, min_seconds}``)."""

    def __post_init__(self) -> None:
        if not self.goals:
            object.__setattr__(self, "goals", (Goal(self.metric, self.direction),))

    @property
    def multi(self) -> bool:
        """Whether the study is multi-objective (two or more goals)."""
        return len(self.goals) > 1

    @property
    def directions(self) -> list[str]:
        return [g.direction for g in self.goals]

    def derive(self, metrics: Mapping[str, float]) -> dict[str, float]:
        """``metrics`` with the metrics this objective defines added: with several loads each load
        generator metric measured under every load as their weighted mean, then each weighted
        metric whose terms were all measured."""
        out = dict(metrics)
        if self.loads:
            total = math.fsum(load.weight for load in self.loads)
            for name in sorted(LOADGEN_METRICS):
                per = [(load.weight, out.get(load.prefix + name)) for load in self.loads]
                if all(v is not None for _, v in per):
                    out[name] = math.fsum(w * v for w, v in per if v is not None) / total
        for wm in self.weighted:
            value = wm.value(out)
            if value is not None:
                out[wm.name] = value
        return out

    def values(self, metrics: Mapping[str, float]) -> list[float] | None:
        """The goals' values in order, or None when one is missing."""
        got = [metrics.get(g.metric) for g in self.goals]
        return None if any(v is None for v in got) else [float(v) for v in got]  # type: ignore[arg-type]

    def missing(self, metrics: Mapping[str, float]) -> str:
        """Why :meth:`values` is None, in one line (``""`` when nothing is missing)."""
        for g in self.goals:
            if g.metric in metrics:
                continue
            wm = next((w for w in self.weighted if w.name == g.metric), None)
            if wm is not None:
                absent = [m for m, _ in wm.terms if m not in metrics]
                return f"metric '{g.metric}' not in the results: its term{'s' if len(absent) > 1 else ''} " \
                       f"{', '.join(absent)} {'were' if len(absent) > 1 else 'was'} not measured"
            return f"metric '{g.metric}' not in the results"
        return ""

    def to_json(self) -> dict[str, Any]:
        """The objective as data (what ``from_mapping`` reads back), for a launch profile."""
        out: dict[str, Any] = {"name": self.name}
        if self.multi:
            out["objectives"] = [g.to_json() for g in self.goals]
            out["choose"] = self.choice.to_json()
        else:
            out.update(metric=self.metric, direction=self.direction)
        if self.loads:
            out["loads"] = [{"name": x.name, "weight": x.weight, **x.spec.model_dump(mode="json")} for x in self.loads]
        else:
            out["load"] = self.load.model_dump(mode="json")
        if self.weighted:
            out["weighted"] = {w.name: [{"metric": m, "weight": x} for m, x in w.terms] for w in self.weighted}
        out["benchmark"] = self.benchmark.model_dump(mode="json") if self.benchmark else None
        out["constraints"] = [str(c) for c in self.constraints]
        return out

    @classmethod
    def load_file(cls, name_or_path: str, overrides: dict[str, Any] | None = None) -> Objective:
        """Load a built-in objective by name or an objective file by path.

        ``overrides`` (e.g. ``{"load": {"concurrency": 32}}``) are merged over the file first.

        Raises:
            ConfigError: missing file, malformed YAML, or invalid keys/constraints.
        """
        try:
            path = _resources.resolve("objectives", name_or_path)
        except FileNotFoundError as exc:
            raise ConfigError(str(exc)) from None
        data = load_yaml_mapping(path, "objective")
        for key, value in (overrides or {}).items():
            if isinstance(value, dict) and isinstance(data.get(key), dict):
                data[key] = {**data[key], **value}
            else:
                data[key] = value
        return cls.from_mapping(data, source=name_or_path)

    @classmethod
    def from_mapping(cls, data: dict[str, Any], source: str = "<objective>") -> Objective:
        try:
            parsed = _ObjectiveFile.model_validate(data)
        except pydantic.ValidationError as exc:
            raise ConfigError(one_line(exc, f"objective {source}")) from None
        where = f"objective {source}"
        _one_way_each(parsed, where)
        constraints = []
        for text in parsed.constraints:
            m = _CONSTRAINT.match(text)
            bound = _finite(m.group(3)) if m else None
            if m is None or bound is None:
                raise ConfigError(f"{where}: constraint '{text}': expected 'metric <= number' or 'metric >= number'")
            constraints.append(Constraint(m.group(1), m.group(2), bound))
        loads = tuple(NamedLoad(e.name, e.weight, LoadSpec.model_validate(e.model_dump(exclude={"name", "weight"})))
                      for e in parsed.loads or [])
        goals = tuple(Goal(g.metric, g.direction) for g in parsed.objectives or []) or (
            Goal(parsed.metric, parsed.direction),)
        measured = _measured_names(parsed.benchmark, loads, where)
        weighted = tuple(WeightedMetric(name, tuple((t.metric, t.weight) for t in terms))
                         for name, terms in parsed.weighted.items())
        defined = {w.name for w in weighted}
        if measured is not None:
            what, names = measured
            for w in weighted:
                if w.name in names:
                    raise ConfigError(f"{where}: weighted: '{w.name}' is a metric {what} measures already: "
                                      "give the weighted metric another name")
                for metric, _ in w.terms:
                    if metric in defined:
                        raise ConfigError(f"{where}: weighted: '{w.name}': term '{metric}' is a weighted metric "
                                          "itself: list measured metrics only")
                    if metric not in names:
                        raise ConfigError(f"{where}: weighted: '{w.name}': {_unknown(what, names, metric)}")
            keys = ([("metric", g.metric) for g in goals] if parsed.objectives is None else
                    [(f"objectives.{i}.metric", g.metric) for i, g in enumerate(goals)])
            for key, metric in keys + [(f"constraint '{c}'", c.metric) for c in constraints]:
                if metric not in names and metric not in defined:
                    raise ConfigError(f"{where}: {key}: {_unknown(what, names, metric, defined)}")
        else:
            for w in weighted:
                for metric, _ in w.terms:
                    if metric in defined:
                        raise ConfigError(f"{where}: weighted: '{w.name}': term '{metric}' is a weighted metric "
                                          "itself: list measured metrics only")
        choice = ChoiceRule()
        if parsed.choose is not None:
            others = [g.metric for g in goals[1:]]
            for metric in parsed.choose.bounds:
                if metric not in others:
                    raise ConfigError(f"{where}: choose.bounds: '{metric}' is not one of the objectives after the "
                                      f"first ({', '.join(others)}): a bound applies to those")
            choice = ChoiceRule(parsed.choose.rule, parsed.choose.tolerance, dict(parsed.choose.bounds))
        name = parsed.name or source.rsplit("/", 1)[-1].removesuffix(".yaml")
        load = loads[0].spec if loads else parsed.load
        return cls(name, goals[0].metric, goals[0].direction, load, tuple(constraints), parsed.benchmark,
                   goals=goals, weighted=weighted, loads=loads, choice=choice,
                   early_stop=parsed.early_stop is not False,
                   stop_after=parsed.early_stop if isinstance(parsed.early_stop, EarlyStopSpec) else EarlyStopSpec())


def _unknown(what: str, names: frozenset[str], metric: str, defined: set[str] | None = None) -> str:
    """``{what} measures no '{metric}' (it measures: ...)``, the list kept short."""
    listed = sorted(n for n in names if LOAD_SEPARATOR not in n)
    shown = ", ".join(listed[:40]) + (", ..." if len(listed) > 40 else "")
    per_load = "; per load: LOAD/METRIC" if any(LOAD_SEPARATOR in n for n in names) else ""
    also = f"; weighted: {', '.join(sorted(defined))}" if defined else ""
    return f"{what} measures no '{metric}' (it measures: {shown}{per_load}{also})"


def _measured_names(benchmark: BenchmarkSpec | None, loads: tuple[NamedLoad, ...],
                    where: str) -> tuple[str, frozenset[str]] | None:
    """(what measures, the metric names it records), or None when they cannot be known here (an
    external benchmark whose output names its own metrics)."""
    if benchmark is None:
        names = set(LOADGEN_METRICS)
        for load in loads:
            names |= {load.prefix + m for m in LOADGEN_METRICS}
        return "the load generator", frozenset(names)
    if benchmark.parse == "collectives":
        return _collectives_names(benchmark.command, where)
    return None


def _collectives_names(command: str, where: str) -> tuple[str, frozenset[str]] | None:
    """The metric names ``python -m autotune.benchmarks.collectives`` records for the ops, sizes
    and dtype its command gives (None: another program, or arguments not read here). An
    all_gather / reduce_scatter size is rounded to a multiple of the world size, which depends on
    the host: their names are checked against the sizes for worlds of 1 to 16 ranks."""
    from autotune.benchmarks import collectives

    words = shlex.split(command)
    if collectives.__name__ not in words:
        return None
    parser = collectives.build_parser()
    parser.exit_on_error = False
    try:
        args, _ = parser.parse_known_args(words[words.index(collectives.__name__) + 1:])
    except (argparse.ArgumentError, SystemExit):
        return None
    elem = collectives.DTYPES[args.dtype][1]
    names = set(COLLECTIVES_TOTALS)
    for op in args.ops:
        for size in args.sizes:
            for world in range(1, 17) if op in ("all_gather", "reduce_scatter") else (1,):
                _, nbytes = collectives.op_shape(op, size, elem, world)
                names |= {f"{stat}@{op}@{nbytes}" for stat in COLLECTIVES_STATS}
    sizes = ",".join(str(s) for s in args.sizes)
    return f"the collectives benchmark (ops {','.join(args.ops)}, sizes {sizes} B)", frozenset(names)
