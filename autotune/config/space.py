"""Search spaces: YAML -> Optuna suggestions -> the env vars and flags of one launch.

A space file looks like::

    name: sglang_nccl
    description: NCCL env vars and SGLang memory/scheduler flags
    parameters:
      NCCL_MIN_NCHANNELS: {type: int, low: 1, high: 32, log: true, env: NCCL_MIN_NCHANNELS, default: 1}
      NCCL_ALGO: {type: categorical, choices: [unset, Ring, Tree], env: NCCL_ALGO, default: unset}
      mem_fraction_static: {type: float, low: 0.5, high: 0.95, step: 0.01, flag: --mem-fraction-static}
    rules:
      - NCCL_MIN_NCHANNELS <= NCCL_MAX_NCHANNELS

Every parameter is sampled independently over its whole range, so the sampler keeps one joint
space (Optuna drops dependent ranges from the joint space). A rule ``A <= B`` is then enforced by
*repair*: when a sample violates it, ``B`` is raised to ``A`` (or, if ``B`` cannot reach it, ``A``
is lowered to ``B``). The objective is a deterministic function of the raw sample, so the sampler
still learns; the values actually launched are recorded as ``applied``.

The choice ``unset`` of a categorical parameter leaves the env var or flag out entirely.
``companions`` are further flags/env vars applied together with a parameter whenever it is set
(e.g. ``--speculative-algorithm EAGLE3`` with ``--speculative-num-draft-tokens``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union

import optuna
import pydantic
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from autotune.util import resources as _resources
from autotune.util.yaml_files import load_yaml_mapping, one_line
from autotune.errors import ConfigError
from autotune.outcome.failures import INFEASIBLE_KINDS
from autotune.outcome.load_signals import RaiseWhen

UNSET = "unset"
MAX_INT = 2**53  # int parameters travel through floats in the samplers
MAX_FLOAT = 1e15  # far beyond any launch value; keeps high - low and the samplers' arithmetic finite
MAX_GRID = 1e12  # values on a step grid (Optuna checks the grid with 28-digit decimals)
ParamValue = Union[int, float, str, bool]


class Companion(BaseModel):
    """A flag or env var applied together with a parameter when that parameter is set."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    flag: str | None = None
    env: str | None = None
    value: str | int | float | bool | None = None
    offset: int | None = Field(default=None, description="apply the parameter's value plus this")

    @field_validator("value", mode="before")
    @classmethod
    def _scalar_value(cls, value: Any) -> Any:
        return _scalar_or_none(value)

    @model_validator(mode="after")
    def _one_target(self) -> Companion:
        if (self.flag is None) == (self.env is None):
            raise ValueError("a companion needs exactly one of 'flag' or 'env'")
        if self.value is not None and self.offset is not None:
            raise ValueError("a companion takes 'value' or 'offset', not both")
        return self


class Parameter(BaseModel):
    """One tunable parameter and how it is applied to a launch.

    Contract (checked at load): numbers are finite (int bounds within +-2**53, float bounds
    within +-1e15); a ``step`` divides ``high - low`` exactly (Optuna would otherwise silently
    lower ``high``) into at most 10**12 values; ``default`` is a valid value; Optuna accepts the
    distribution.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    type: Literal["int", "float", "categorical", "bool"]
    low: float | None = None
    high: float | None = None
    step: float | None = None
    log: bool = False
    choices: list[str | int | float | bool] | None = None
    env: str | None = None
    flag: str | None = None
    flag_false: str | None = Field(default=None, description="for a bool flag: the flag applied when false (e.g. --no-x)")
    default: str | int | float | bool | None = None
    companions: list[Companion] = Field(default_factory=list)
    monotone: dict[str, Literal["up", "down"]] = Field(default_factory=dict)
    """Failure kind -> direction: a trial that failed with that kind at value x implies the same
    failure at every value beyond x in that direction when the other parameters are the same
    (``mem_fraction_static: {oom: up, not-enough-memory: down}``); the driver skips such a
    configuration instead of launching it (:mod:`autotune.search.implied`)."""
    raise_when: RaiseWhen | None = None
    """The engine's scheduler log that calls for a larger value (:mod:`autotune.outcome.load_signals`):
    ``queued`` for a cap on the requests served at once (requests waited while it was full),
    ``running-above`` for a limit that more requests at once outgrow (CUDA graphs captured up to
    a batch size). The sampler then proposes the best configuration with it raised (of a
    categorical, to its smallest numeric choice that covers the log's figure; never from or to a
    choice that is not a number, such as ``unset``)."""
    help: str | None = None

    @field_validator("choices", mode="before")
    @classmethod
    def _scalar_choices(cls, value: Any) -> Any:
        if isinstance(value, list):
            for i, item in enumerate(value):
                problem = _not_scalar(item)
                if problem:
                    raise ValueError(f"choice {i + 1} {problem}")
        return value

    @field_validator("default", mode="before")
    @classmethod
    def _scalar_default(cls, value: Any) -> Any:
        return _scalar_or_none(value)

    @model_validator(mode="after")
    def _check(self) -> Parameter:
        if (self.env is None) == (self.flag is None):
            raise ValueError("needs exactly one of 'env' (an env var) or 'flag' (e.g. --mem-fraction-static)")
        if self.flag is not None and not self.flag.startswith("-"):
            raise ValueError(f"flag '{self.flag}' must start with '-'")
        if self.flag_false is not None and (self.type != "bool" or self.flag is None):
            raise ValueError("'flag_false' is only for a bool parameter applied as a flag")
        if self.env is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", self.env):
            raise ValueError(f"env '{self.env}' is not a valid environment variable name")
        if self.type in ("int", "float"):
            if self.low is None or self.high is None:
                raise ValueError(f"type {self.type} needs 'low' and 'high'")
            if self.choices is not None:
                raise ValueError(f"type {self.type} takes low/high, not choices")
            if self.low > self.high:
                raise ValueError(f"inverted range: low ({_fmt(self.low)}) > high ({_fmt(self.high)})")
            if self.log and self.low <= 0:
                raise ValueError("log scale needs low > 0")
            if self.log and self.step is not None and not (self.type == "int" and self.step == 1):
                raise ValueError("'step' cannot be combined with log scale")
            if self.type == "int":
                for name in ("low", "high", "step"):
                    value = getattr(self, name)
                    if value is not None and value != int(value):
                        raise ValueError(f"type int needs an integer '{name}', got {value}")
            if self.type == "int" and max(abs(self.low), abs(self.high)) > MAX_INT:
                raise ValueError(f"type int needs bounds within +-{MAX_INT} (2**53)")
            if self.type == "float" and max(abs(self.low), abs(self.high)) > MAX_FLOAT:
                raise ValueError(f"type float needs bounds within +-{MAX_FLOAT:g}")
            if self.step is not None and self.step <= 0:
                raise ValueError("'step' must be > 0")
            if self.type == "int" and self.step is not None and (int(self.high) - int(self.low)) % int(self.step):
                k = (int(self.high) - int(self.low)) // int(self.step)
                last = int(self.low) + k * int(self.step)
                raise ValueError(f"step {_fmt(self.step)} does not divide the range [{_fmt(self.low)}, {_fmt(self.high)}]: "
                                 f"the last value on the grid would be {last}; make high {last} or {last + int(self.step)}")
            if self.step is not None and not self.log:
                k = (self.high - self.low) / self.step
                if k > MAX_GRID:
                    raise ValueError(f"step {_fmt(self.step)} makes more than {MAX_GRID:g} values of [{_fmt(self.low)}, "
                                     f"{_fmt(self.high)}]: use a larger step or log scale")
                residual = abs((self.high - self.low) - round(k) * self.step)
                if residual > 1e-9 * max(abs(self.low), abs(self.high), self.high - self.low, 1e-9):
                    last = self.low + math.floor(k + 1e-9) * self.step
                    raise ValueError(f"step {_fmt(self.step)} does not divide the range [{_fmt(self.low)}, "
                                     f"{_fmt(self.high)}]: the last value on the grid would be {_fmt(round(last, 10))}; "
                                     f"make high {_fmt(round(last, 10))} or {_fmt(round(last + self.step, 10))}")
        elif self.type == "categorical":
            if not self.choices:
                raise ValueError("type categorical needs a non-empty 'choices' list")
            if len(set(map(repr, self.choices))) != len(self.choices):
                raise ValueError("'choices' has duplicates")
            for i, first in enumerate(self.choices):  # Optuna finds a choice by ==: 1, 1.0 and true are one
                same = next((c for c in self.choices[i + 1:] if c == first), None)
                if same is not None:
                    raise ValueError(f"'choices' {_yaml_word(first)} and {_yaml_word(same)} are equal as values "
                                     "(a study could not tell them apart); keep one, or quote them as text")
        else:
            if self.choices is not None or self.low is not None or self.high is not None:
                raise ValueError("type bool takes no range or choices")
        if self.monotone and not (self.type in ("int", "float") or (
                self.type == "categorical" and sum(_is_number(c) for c in self.choices or []) >= 2)):
            raise ValueError("'monotone' needs a numeric parameter (int, float, or categorical with numeric choices; "
                             "it holds among the numbers, a choice such as unset stands apart)")
        if self.raise_when is not None and not (self.type in ("int", "float") or (
                self.type == "categorical" and sum(_is_number(c) for c in self.choices or []) >= 2)):
            raise ValueError("'raise_when' needs a numeric parameter (int, float, or categorical with numeric choices)")
        unknown = sorted(set(self.monotone) - INFEASIBLE_KINDS)
        if unknown:
            raise ValueError(f"'monotone' names an unknown failure kind '{unknown[0]}' "
                             f"(kinds: {', '.join(sorted(INFEASIBLE_KINDS))})")
        if self.default is not None:
            problem = self.out_of_range(self.default)
            if problem:
                raise ValueError(f"default {problem}")
        try:  # what Optuna would reject at the first trial is rejected now
            self.distribution()
        except (ValueError, TypeError, ArithmeticError) as exc:
            raise ValueError(f"Optuna rejects this parameter: {exc}") from None
        return self

    def distribution(self) -> optuna.distributions.BaseDistribution:
        """The Optuna distribution that samples this parameter."""
        if self.type == "int":
            assert self.low is not None and self.high is not None
            return optuna.distributions.IntDistribution(
                int(self.low), int(self.high), log=self.log, step=int(self.step or 1)
            )
        if self.type == "float":
            assert self.low is not None and self.high is not None
            return optuna.distributions.FloatDistribution(self.low, self.high, log=self.log, step=self.step)
        if self.type == "bool":
            return optuna.distributions.CategoricalDistribution([False, True])
        assert self.choices is not None
        return optuna.distributions.CategoricalDistribution(self.choices)

    def out_of_range(self, value: Any) -> str | None:
        """A short description of why ``value`` is not a valid value, or None if it is."""
        if self.type == "bool":
            return None if isinstance(value, bool) else f"{value!r} is not true/false"
        if self.type == "categorical":
            assert self.choices is not None
            # `True in [1]` holds in Python; a bool is only a valid choice among bool choices.
            if any(c == value and isinstance(c, bool) == isinstance(value, bool) for c in self.choices):
                return None
            return f"{value!r} is not one of {self.choices}"
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"{value!r} is not a number"
        assert self.low is not None and self.high is not None
        if self.type == "int" and value != int(value):
            return f"{value!r} is not an integer"
        if not (self.low <= value <= self.high):
            return f"{_fmt(value)} is outside [{_fmt(self.low)}, {_fmt(self.high)}]"
        if self.step is not None and not self.log:
            k = (value - self.low) / self.step
            if abs(k - round(k)) > 1e-6:
                return f"{_fmt(value)} is not on the grid {_fmt(self.low)} + k*{_fmt(self.step)}"
        return None

    def normalise(self, value: Any) -> ParamValue:
        """Coerce a valid value to the type Optuna stores (int for int parameters, ...)."""
        if self.type == "int":
            return int(value)
        if self.type == "float":
            return round(float(value), 10)  # 0.8500000000000001 from a step grid reads 0.85
        return value  # type: ignore[no-any-return]


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


_PARAM_NAME = re.compile(r"[A-Za-z_][\w.-]*")
_RULE = re.compile(r"^\s*([A-Za-z_][\w.-]*)\s*(<=|<|>=|>)\s*([A-Za-z_][\w.-]*)\s*$")


@dataclass(frozen=True)
class Rule:
    """``lower <= upper`` (or strict ``<``) between two numeric parameters."""

    lower: str
    upper: str
    strict: bool = False

    def __str__(self) -> str:
        return f"{self.lower} {'<' if self.strict else '<='} {self.upper}"

    def holds(self, params: dict[str, Any]) -> bool:
        a, b = params[self.lower], params[self.upper]
        return bool(a < b) if self.strict else bool(a <= b)


@dataclass(frozen=True)
class Launch:
    """What a set of parameter values does to a launch: env vars set and flags appended."""

    env: dict[str, str] = field(default_factory=dict)
    args: list[str] = field(default_factory=list)
    applied: dict[str, ParamValue] = field(default_factory=dict)


class _SpaceFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str | None = None
    description: str | None = None
    parameters: dict[str, Parameter]
    rules: list[str] = Field(default_factory=list)


class SearchSpace:
    """A validated search space.

    Contract: :meth:`suggest` asks every parameter of a trial (enqueued values are respected);
    :meth:`repair` enforces the rules on a complete set of values; :meth:`to_launch` turns values
    into env vars and flags. Values never pass through a shell here: flags are argv items.
    """

    def __init__(self, name: str, parameters: dict[str, Parameter], rules: list[Rule], description: str = "") -> None:
        self.name = name
        self.parameters = parameters
        self.rules = rules
        self.description = description

    # -- loading ---------------------------------------------------------------------------
    @classmethod
    def load(cls, name_or_path: str) -> SearchSpace:
        """Load a built-in space by name or a space file by path.

        Raises:
            ConfigError: missing file, malformed YAML, or an invalid parameter/rule.
        """
        try:
            path = _resources.resolve("search_spaces", name_or_path)
        except FileNotFoundError as exc:
            raise ConfigError(str(exc)) from None
        return cls.from_mapping(load_yaml_mapping(path, "search space"), source=str(name_or_path))

    @classmethod
    def from_mapping(cls, data: dict[str, Any], source: str = "<space>") -> SearchSpace:
        """Build a space from its parsed YAML mapping (see the module docstring)."""
        try:
            parsed = _SpaceFile.model_validate(data)
        except pydantic.ValidationError as exc:
            raise ConfigError(one_line(exc, f"search space {source}")) from None
        params = parsed.parameters
        if not params:
            raise ConfigError(f"search space {source}: parameters: at least one parameter is needed")
        for pname in params:
            if not _PARAM_NAME.fullmatch(pname):
                raise ConfigError(f"search space {source}: parameters: name {pname!r} must be letters, digits, "
                                  "'_', '.' or '-', starting with a letter or '_'")
        targets: dict[str, str] = {}
        for pname, p in params.items():
            key = p.env or p.flag or ""
            if key in targets:
                raise ConfigError(f"search space {source}: parameters.{pname}: applies {key} like {targets[key]}")
            targets[key] = pname
        rules = []
        for text in parsed.rules:
            m = _RULE.match(text)
            if not m:
                raise ConfigError(f"search space {source}: rule '{text}': expected 'A <= B' between two parameters")
            a, op, b = m.groups()
            for n in (a, b):
                if n not in params:
                    raise ConfigError(f"search space {source}: rule '{text}': unknown parameter '{n}'")
                if params[n].type not in ("int", "float"):
                    raise ConfigError(f"search space {source}: rule '{text}': '{n}' is not numeric")
            lower, upper = (a, b) if op in ("<=", "<") else (b, a)
            rule = Rule(lower, upper, strict=op in ("<", ">"))
            lo, up = params[lower], params[upper]
            assert lo.low is not None and up.high is not None
            if not rule.holds({lower: lo.low, upper: up.high}):
                raise ConfigError(f"search space {source}: rule '{text}' can never hold with these ranges")
            rules.append(rule)
        return cls(parsed.name or Path(source).stem, params, rules, parsed.description or "")

    # -- sampling --------------------------------------------------------------------------
    def distributions(self) -> dict[str, optuna.distributions.BaseDistribution]:
        return {n: p.distribution() for n, p in self.parameters.items()}

    def suggest(self, trial: optuna.Trial) -> dict[str, ParamValue]:
        """Ask the trial for a value of every parameter (raw, before rule repair)."""
        values: dict[str, ParamValue] = {}
        for n, p in self.parameters.items():
            dist = p.distribution()
            if isinstance(dist, optuna.distributions.IntDistribution):
                values[n] = trial.suggest_int(n, dist.low, dist.high, step=dist.step, log=dist.log)
            elif isinstance(dist, optuna.distributions.FloatDistribution):
                values[n] = trial.suggest_float(n, dist.low, dist.high, step=dist.step, log=dist.log)
            else:
                assert isinstance(dist, optuna.distributions.CategoricalDistribution)
                values[n] = trial.suggest_categorical(n, dist.choices)  # type: ignore[arg-type]
        return values

    def complete(self, partial: dict[str, Any], what: str = "baseline") -> dict[str, ParamValue]:
        """Fill the parameters missing from ``partial`` with their defaults, validating everything.

        Raises:
            ConfigError: an unknown parameter, a value outside its range, or a missing parameter
                without a default.
        """
        out: dict[str, ParamValue] = {}
        for key, value in partial.items():
            if key not in self.parameters:
                raise ConfigError(f"{what}: unknown parameter '{key}' (space {self.name} has: {', '.join(self.parameters)})")
            problem = self.parameters[key].out_of_range(value)
            if problem:
                raise ConfigError(f"{what}: {key}={problem}")
            out[key] = self.parameters[key].normalise(value)
        for n, p in self.parameters.items():
            if n not in out:
                if p.default is None:
                    raise ConfigError(f"{what}: no value for '{n}' and the space gives it no default")
                out[n] = p.normalise(p.default)
        for rule in self.rules:
            if not rule.holds(out):
                raise ConfigError(f"{what}: breaks the rule {rule} ({rule.lower}={out[rule.lower]}, {rule.upper}={out[rule.upper]})")
        return {n: out[n] for n in self.parameters}

    def repair(self, values: dict[str, ParamValue]) -> dict[str, ParamValue]:
        """Enforce the rules: raise the upper side to the lower one, else lower the lower side."""
        fixed = dict(values)
        for rule in self.rules:
            if rule.holds(fixed):
                continue
            lo_p, up_p = self.parameters[rule.lower], self.parameters[rule.upper]
            assert up_p.high is not None and lo_p.low is not None
            a = fixed[rule.lower]
            target = _step(up_p, a, +1) if rule.strict else a
            if isinstance(target, (int, float)) and target <= up_p.high:
                fixed[rule.upper] = up_p.normalise(target)
            else:
                b = fixed[rule.upper]
                fixed[rule.lower] = lo_p.normalise(_step(lo_p, b, -1) if rule.strict else b)
        return fixed

    def monotone(self) -> dict[str, dict[str, str]]:
        """Each parameter's ``monotone`` declaration (failure kind -> direction), where it has one."""
        return {n: dict(p.monotone) for n, p in self.parameters.items() if p.monotone}

    def raise_when(self) -> dict[str, str]:
        """Each parameter's ``raise_when`` declaration, where it has one."""
        return {n: p.raise_when for n, p in self.parameters.items() if p.raise_when is not None}

    def applied_names(self) -> list[str]:
        """Every env var and flag this space sets (parameters and companions): these are tuning
        knobs, never secrets."""
        names = []
        for p in self.parameters.values():
            names += [n for n in (p.env, p.flag, p.flag_false) if n]
            names += [n for c in p.companions for n in (c.env, c.flag) if n]
        return names

    def applied(self, values: dict[str, ParamValue]) -> dict[str, ParamValue]:
        """The values a launch of ``values`` applies: the rules repaired, each value normalised."""
        return {n: self.parameters[n].normalise(v) for n, v in self.repair(values).items()}

    def to_launch(self, values: dict[str, ParamValue]) -> Launch:
        """The env vars and flags for one launch (rules repaired first)."""
        applied = self.applied(values)
        env: dict[str, str] = {}
        args: list[str] = []
        for n, p in self.parameters.items():
            v = applied[n]
            if p.type == "bool" and p.flag is not None and v is False:
                if p.flag_false:
                    args.append(p.flag_false)
                continue
            if v == UNSET:
                continue
            if p.env is not None:
                env[p.env] = _env_text(v)
            elif p.type == "bool":
                args.append(p.flag or "")
            else:
                args += [p.flag or "", _arg_text(v)]
            for c in p.companions:
                cv: Any = v
                if c.offset is not None and isinstance(v, (int, float)) and not isinstance(v, bool):
                    cv = v + c.offset
                elif c.value is not None:
                    cv = c.value
                if c.env is not None:
                    env[c.env] = _env_text(cv)
                elif cv is True:
                    args.append(c.flag or "")
                else:
                    args += [c.flag or "", _arg_text(cv)]
        return Launch(env=env, args=args, applied=applied)


def load_space(name_or_path: str) -> SearchSpace:
    """Shorthand for :meth:`SearchSpace.load`."""
    return SearchSpace.load(name_or_path)


def _not_scalar(value: Any) -> str | None:
    """Why ``value`` cannot be a parameter value (text, a finite number or true/false), or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"{value!r} is not a finite number"
    if not isinstance(value, (str, int, float, bool)):
        return f"{value!r} is not text, a number or true/false"
    return None


def _scalar_or_none(value: Any) -> Any:
    """``value`` unchanged if it is None or a valid scalar (see :func:`_not_scalar`).

    Raises:
        ValueError: why it is not (pydantic reports it under the field's key).
    """
    problem = None if value is None else _not_scalar(value)
    if problem:
        raise ValueError(problem)
    return value


def _yaml_word(v: Any) -> str:
    """A choice as YAML writes it: ``true``, ``1.0``, ``'1'``."""
    if isinstance(v, bool):
        return "true" if v else "false"
    return repr(v)


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _arg_text(v: Any) -> str:
    """A value as a flag argument: booleans as true/false, floats without step-grid noise."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and v.is_integer() and abs(v) >= 1:
        return str(int(v))
    if isinstance(v, float):
        return repr(round(v, 10))
    return str(v)


def _env_text(v: Any) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    return _arg_text(v)


def _step(p: Parameter, x: float, direction: float) -> float:
    """The next value of ``p`` after ``x`` in ``direction`` (+1 or -1): for a strict rule."""
    if p.type == "int" or p.step is not None:
        return x + direction * (p.step or 1)
    return math.nextafter(float(x), direction * math.inf)
