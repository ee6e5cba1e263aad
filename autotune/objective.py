"""Objectives: the workload a trial is measured under, the metric, its direction, and SLOs.

An objective file looks like::

    name: throughput_slo
    metric: output_throughput       # a metric of the load generator (or the benchmark's parser)
    direction: maximize
    load: {concurrency: 256, num_prompts: 1024, input_len: 256, output_len: 128, warmup_prompts: 16}
    constraints: ["p99_ttft_ms <= 2000"]   # a trial breaking one is infeasible (slo-violated)
    early_stop: true                # stop a load that cannot beat the best (autotune.early_stop)

or, instead of the built-in load generator, an external benchmark whose output is parsed::

    benchmark: {command: "python -m sglang.bench_serving --port {port} --output-file {result_file}",
                parse: sglang-bench-serving}
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from autotune import _resources
from autotune._template import BENCHMARK_FIELDS, template_fields
from autotune._yaml import load_yaml_mapping, one_line
from autotune.errors import ConfigError

_CONSTRAINT = re.compile(r"^\s*([A-Za-z_][\w@.-]*)\s*(<=|>=)\s*(-?[\d.]+(?:e-?\d+)?)\s*$")

LOADGEN_METRICS = frozenset(
    ["completed", "failed", "input_tokens", "output_tokens", "max_concurrency", "duration_s",
     "request_throughput", "output_throughput", "total_throughput"]
    + [f"{stat}_{name}_ms" for stat in ("mean", "median", "p99") for name in ("ttft", "tpot", "itl", "e2e_latency")]
)
"""The metrics of the built-in load generator: an objective without a benchmark uses these."""


class LoadSpec(BaseModel):
    """The built-in load generator's workload (see :class:`autotune.loadgen.Workload`)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    api: Literal["openai", "sglang"] | None = None
    concurrency: int = Field(default=64, gt=0, le=1_000_000)
    num_prompts: int = Field(default=256, gt=0, le=10_000_000)
    input_len: int = Field(default=256, gt=0, le=10_000_000)
    output_len: int = Field(default=128, gt=0, le=10_000_000)
    warmup_prompts: int = Field(default=8, ge=0, le=10_000_000)
    request_rate: float | None = Field(default=None, gt=0)
    request_timeout_s: float = Field(default=300.0, gt=0)
    max_failed_fraction: float = Field(default=0.02, ge=0, le=1)


ResultFormat = Literal["sglang-bench-serving", "vllm-bench", "nccl-tests", "json", "collectives"]


class BenchmarkSpec(BaseModel):
    """An external benchmark command whose output is parsed into metrics.

    ``command`` words may hold ``{python}``, ``{host}``, ``{port}``, ``{base_url}``, ``{model}``
    and ``{result_file}`` (any other placeholder, an unbalanced brace or quote is a
    :class:`ConfigError` at load); the result is read from ``{result_file}`` when the command names it,
    else from the command's output. With ``engine: none`` (no server) the trial's env applies to
    the command and the trial's flags are appended to it.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

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


class _ObjectiveFile(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str | None = None
    description: str | None = None
    metric: str = Field(default="output_throughput", min_length=1)
    direction: Literal["maximize", "minimize"] = "maximize"
    load: LoadSpec = Field(default_factory=LoadSpec)
    benchmark: BenchmarkSpec | None = None
    constraints: list[str] = Field(default_factory=list)
    early_stop: bool = True


def _finite(text: str) -> float | None:
    """``text`` as a finite float, or None (``1.2.3``, ``1e999``)."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


@dataclass(frozen=True)
class Objective:
    """A validated objective."""

    name: str
    metric: str
    direction: Literal["maximize", "minimize"]
    load: LoadSpec
    constraints: tuple[Constraint, ...]
    benchmark: BenchmarkSpec | None = None
    early_stop: bool = True
    """Whether a trial's load may stop early once it cannot beat the best so far (where the metric
    allows a bound: :func:`autotune.early_stop.applies`)."""

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
        constraints = []
        for text in parsed.constraints:
            m = _CONSTRAINT.match(text)
            bound = _finite(m.group(3)) if m else None
            if m is None or bound is None:
                raise ConfigError(f"objective {source}: constraint '{text}': expected 'metric <= number' or 'metric >= number'")
            constraints.append(Constraint(m.group(1), m.group(2), bound))
        if parsed.benchmark is None:  # the built-in load generator: its metric names are known
            for key, metric in [("metric", parsed.metric)] + [(f"constraint '{c}'", c.metric) for c in constraints]:
                if metric not in LOADGEN_METRICS:
                    raise ConfigError(f"objective {source}: {key}: the load generator measures no '{metric}' "
                                      f"(it measures: {', '.join(sorted(LOADGEN_METRICS))})")
        name = parsed.name or source.rsplit("/", 1)[-1].removesuffix(".yaml")
        return cls(name, parsed.metric, parsed.direction, parsed.load, tuple(constraints), parsed.benchmark,
                   early_stop=parsed.early_stop)
