"""The study config: a typed, validated view of the user's YAML file.

Example::

    name: glm5-tp8
    target:
      engine: sim                 # sim | sglang | vllm | transformers | custom
      scenario: rtx6000-pcie-glm5 # sim only
      command: null               # optional template override; {port} is filled in
      env: {NCCL_IB_DISABLE: "1"} # fixed env
      hosts: [local]
      ready_timeout_s: 600
    space: sglang_nccl            # a built-in name or a path
    objective: throughput         # a built-in name or a path
    baseline: {mem_fraction_static: 0.92, NCCL_MIN_NCHANNELS: 8}
    budget: {trials: 40, hours: 8}
    storage: sqlite:///autotune.db

Every problem is reported as a :class:`~autotune.errors.ConfigError` whose message is one line
naming the file and the key.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from autotune._yaml import load_yaml_mapping, one_line
from autotune.errors import ConfigError

DEFAULT_STORAGE = "sqlite:///autotune.db"
Engine = Literal["sim", "sglang", "vllm", "transformers", "custom", "none"]


class TargetConfig(BaseModel):
    """What a trial launches and where."""

    model_config = ConfigDict(extra="forbid")

    engine: Engine = "sim"
    scenario: str | None = None
    model: str | None = None
    command: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    hosts: list[str] = Field(default_factory=lambda: ["local"], min_length=1)
    ready_timeout_s: float = Field(default=600.0, gt=0)
    ready_path: str | None = None
    api: Literal["openai", "sglang"] | None = None
    port: int | None = Field(default=None, ge=1024, le=65535)

    @field_validator("env", mode="before")
    @classmethod
    def _env_as_text(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {str(k): ("1" if v is True else "0" if v is False else str(v)) for k, v in value.items()}
        return value

    @field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, str]) -> dict[str, str]:
        for k in env:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k):
                raise ValueError(f"'{k}' is not a valid environment variable name")
        return env

    @field_validator("hosts")
    @classmethod
    def _known_hosts(cls, hosts: list[str]) -> list[str]:
        for h in hosts:
            if h != "local":
                raise ValueError(f"host '{h}': only 'local' is supported in this version (ssh:// hosts are planned)")
        return hosts

    @model_validator(mode="after")
    def _engine_needs(self) -> TargetConfig:
        if self.engine == "sim" and not self.scenario:
            raise ValueError("engine 'sim' needs a 'scenario' (see `autotune sim scenarios`)")
        if self.engine != "sim" and self.scenario:
            raise ValueError("'scenario' is only for engine 'sim'")
        if self.engine == "custom" and not self.command:
            raise ValueError("engine 'custom' needs a 'command' template with {port}")
        if self.engine in ("sglang", "vllm", "transformers") and not (self.model or self.command):
            raise ValueError(f"engine '{self.engine}' needs a 'model' (or a full 'command')")
        if self.engine == "none" and self.command:
            raise ValueError("engine 'none' runs the objective's benchmark command; it takes no 'command'")
        if self.command is not None and "{port}" not in self.command:
            raise ValueError("'command' must contain {port}")
        return self


class BudgetConfig(BaseModel):
    """When a study stops: after ``trials`` finished trials or ``hours`` of trial time, in total."""

    model_config = ConfigDict(extra="forbid")

    trials: int | None = Field(default=40, gt=0)
    hours: float | None = Field(default=None, gt=0)


class BaselineFrom(BaseModel):
    """Take the baseline from the best trial of another study (e.g. an NCCL-only study)."""

    model_config = ConfigDict(extra="forbid")

    study: str = Field(min_length=1)
    storage: str | None = None


class StudyConfig(BaseModel):
    """A whole study: target, space, objective, baseline, budget and storage."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][\w.@+-]*$")
    target: TargetConfig
    space: str = "sglang_nccl"
    objective: str = "throughput"
    objective_overrides: dict[str, Any] = Field(default_factory=dict)
    baseline: dict[str, Any] = Field(default_factory=dict)
    baseline_from: BaselineFrom | None = None
    budget: BudgetConfig = Field(default_factory=BudgetConfig)
    storage: str = DEFAULT_STORAGE
    sampler: Literal["tpe", "gp", "random"] = "tpe"
    seed: int | None = None
    max_fault_retries: int = Field(default=2, ge=0)

    @classmethod
    def load(cls, path: str | Path) -> StudyConfig:
        """Read and validate a study config file.

        Raises:
            ConfigError: the file is missing, not YAML, or any key is invalid.
        """
        p = Path(path)
        return cls.from_mapping(load_yaml_mapping(p, "study config"), source=str(p))

    @classmethod
    def from_mapping(cls, data: dict[str, Any], source: str = "<config>") -> StudyConfig:
        try:
            return cls.model_validate(data)
        except pydantic.ValidationError as exc:
            raise ConfigError(one_line(exc, f"study config {source}")) from None
