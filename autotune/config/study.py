"""The study config: a typed, validated view of the user's YAML file.

Example::

    name: glm5-tp8
    target:
      engine: sim                 # sim | sglang | vllm | transformers | custom
      scenario: rtx6000-pcie-glm5 # sim only
      command: null               # optional template override; {port} is filled in
      env: {NCCL_IB_DISABLE: "1"} # fixed env
      hosts: [local]              # or ["ssh://user@gpu1:22"] (see docs/distributed.md)
      ssh: {key_filename: ~/.ssh/id_ed25519, workdir: /srv/tune, setup: "source /opt/venv/bin/activate"}
      gpus_per_trial: 4           # optional: a trial's GPUs (its TP size) ...
      host_gpus: 8                # ... and each host's: two trials at once per host (opt-in)
      ready_timeout_s: 600
    executor: serial              # serial | ray (one trial per slot at once)
    ray: {address: auto}          # the Ray cluster (default: start a local one)
    space: sglang_nccl            # a built-in name or a path
    objective: throughput         # a built-in name or a path
    baseline: {mem_fraction_static: 0.92, NCCL_MIN_NCHANNELS: 8}
    budget: {trials: 40, hours: 8}   # the last trials re-measure the best 3 (confirm: {candidates: 3, measurements: 3})
    storage: sqlite:///autotune.db

Every problem is reported as a :class:`~autotune.errors.ConfigError` whose message is one line
naming the file and the key. Types are strict, nothing is coerced: an integer key takes an integer
(``trials: 1``, not ``true``, ``'1'`` or ``1.0``), a flag ``true``/``false``, a text key text; a
number key takes an integer too (``ready_timeout_s: 30``).
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from autotune.config.ssh_url import parse_ssh_url
from autotune.util.template import TARGET_FIELDS, template_fields
from autotune.util.yaml_files import load_yaml_mapping, one_line
from autotune.errors import ConfigError

DEFAULT_STORAGE = "sqlite:///autotune.db"
MAX_SEED = 2**32 - 1  # numpy's RandomState, which Optuna's samplers seed, takes 0 .. 2**32 - 1
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_FLAG_NAME = re.compile(r"--?[A-Za-z0-9][\w.-]*")
Engine = Literal["sim", "sglang", "vllm", "transformers", "custom", "none"]


class SSHConfig(BaseModel):
    """How SSH hosts (``ssh://...`` in ``target.hosts``) are reached and used.

    ``key_filename`` and ``known_hosts`` default to the usual places (the agent, ``~/.ssh``); a
    given file must exist (``known_hosts`` may be missing only when unknown keys are accepted: it
    is created). ``workdir`` is the remote folder servers start in (``~`` is the remote home),
    ``setup`` a shell line run before each server (e.g. ``source /opt/venv/bin/activate``),
    ``python`` the remote interpreter that fills ``{python}``.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)

    key_filename: str | None = None
    known_hosts: str | None = None
    accept_unknown_host_key: bool = False
    workdir: str = Field(default="~", min_length=1)
    setup: str = ""
    python: str = Field(default="python3", min_length=1)
    connect_timeout_s: float = Field(default=10.0, ge=1, le=600)
    command_timeout_s: float = Field(default=60.0, ge=5, le=3600)

    @field_validator("key_filename")
    @classmethod
    def _key_exists(cls, path: str | None) -> str | None:
        if path is not None and not Path(path).expanduser().is_file():
            raise ValueError(f"key file '{path}' does not exist")
        return path

    @field_validator("workdir", "setup", "python")
    @classmethod
    def _one_line(cls, value: str) -> str:
        if "\x00" in value or "\n" in value or "\r" in value:
            raise ValueError("must be one line of text (no NUL, no line break)")
        return value

    @field_validator("python")
    @classmethod
    def _one_word(cls, value: str) -> str:
        if len(value.split()) != 1:
            raise ValueError(f"'{value}' is not one word (the remote interpreter's name or path)")
        return value

    @model_validator(mode="after")
    def _known_hosts_exists(self) -> SSHConfig:
        if self.known_hosts is not None:
            path = Path(self.known_hosts).expanduser()
            if path.is_dir() or not (path.is_file() or self.accept_unknown_host_key):
                raise ValueError(f"known_hosts file '{self.known_hosts}' does not exist (or set "
                                 "accept_unknown_host_key: true to create it)")
        return self


class TargetConfig(BaseModel):
    """What a trial launches and where.

    ``command`` may only hold the placeholders ``{python}``, ``{port}``, ``{host}``, ``{model}``
    and ``{scenario}`` (and must hold ``{port}``); ``secrets`` names further env vars or flags
    whose values are secret (never shown or exported in clear). ``hosts``: ``local`` or
    ``ssh://[user@]host[:port]``, with ``ssh`` saying how SSH hosts are used; the serial executor
    runs every trial on the first host.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)

    engine: Engine = "sim"
    scenario: str | None = None
    model: str | None = None
    command: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    hosts: list[str] = Field(default_factory=lambda: ["local"], min_length=1)
    ssh: SSHConfig | None = None
    gpus_per_trial: int | None = Field(default=None, ge=1, le=1024)
    host_gpus: int | None = Field(default=None, ge=1, le=1024)
    ready_timeout_s: float = Field(default=600.0, gt=0)
    startup_timeout_factor: float = Field(default=3.0, ge=1)
    startup_timeout_floor_s: float = Field(default=120.0, gt=0)
    log_stall_s: float | None = Field(default=300.0, gt=0)
    gpu_busy_wait_s: float = Field(default=60.0, ge=0, le=3600)
    """How long a launch waits for processes autotune did not start to release the trial's GPUs
    before a ``gpu-busy`` fault (:mod:`autotune.execution.gpu_check`)."""
    ready_path: str | None = None
    api: Literal["openai", "sglang"] | None = None
    port: int | None = Field(default=None, ge=1024, le=65535)
    secrets: list[str] = Field(default_factory=list)

    @field_validator("env", mode="before")
    @classmethod
    def _env_as_text(cls, value: Any) -> Any:
        if isinstance(value, dict):
            out = {}
            for k, v in value.items():
                if v is None or isinstance(v, (list, dict)) or (isinstance(v, float) and not math.isfinite(v)):
                    raise ValueError(f"{k}: expected a text or number value, got {'null' if v is None else v!r}")
                out[str(k)] = "1" if v is True else "0" if v is False else str(v)
            return out
        return value

    @field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, str]) -> dict[str, str]:
        for k in env:
            if not _ENV_NAME.fullmatch(k):
                raise ValueError(f"'{k}' is not a valid environment variable name")
        return env

    @field_validator("command")
    @classmethod
    def _command_template(cls, command: str | None) -> str | None:
        if command is None:
            return None
        if "port" not in template_fields(command, TARGET_FIELDS):
            raise ValueError("must contain {port} (the port the server listens on)")
        return command

    @field_validator("ready_path")
    @classmethod
    def _ready_path(cls, path: str | None) -> str | None:
        if path is not None and not re.fullmatch(r"/\S*", path):
            raise ValueError(f"'{path}' is not a URL path (e.g. /health)")
        return path

    @field_validator("secrets")
    @classmethod
    def _secret_names(cls, names: list[str]) -> list[str]:
        for n in names:
            if not (_ENV_NAME.fullmatch(n) or _FLAG_NAME.fullmatch(n)):
                raise ValueError(f"'{n}' is neither an environment variable name nor a flag starting with '-'")
        return names

    @field_validator("hosts")
    @classmethod
    def _known_hosts(cls, hosts: list[str]) -> list[str]:
        for h in hosts:
            if h == "local":
                continue
            if not h.startswith("ssh://"):
                raise ValueError(f"host '{h}': expected 'local' or ssh://[user@]host[:port]")
            parse_ssh_url(h)
        return hosts

    @model_validator(mode="after")
    def _engine_needs(self) -> TargetConfig:
        if self.engine == "sim" and not self.scenario:
            raise ValueError("engine 'sim' needs a 'scenario' (see `autotune sim scenarios`)")
        if self.engine == "sim" and self.scenario:
            _check_scenario(self.scenario)
        if self.engine != "sim" and self.scenario:
            raise ValueError("'scenario' is only for engine 'sim'")
        if self.engine == "custom" and not self.command:
            raise ValueError("engine 'custom' needs a 'command' template with {port}")
        if self.engine in ("sglang", "vllm", "transformers") and not (self.model or self.command):
            raise ValueError(f"engine '{self.engine}' needs a 'model' (or a full 'command')")
        if self.engine == "none" and self.command:
            raise ValueError("engine 'none' runs the objective's benchmark command; it takes no 'command'")
        if self.engine == "none" and any(h != "local" for h in self.hosts):
            raise ValueError("engine 'none' runs its benchmark command on this machine: hosts must be [local]")
        if self.host_gpus is not None and self.gpus_per_trial is None:
            raise ValueError("host_gpus needs gpus_per_trial (the GPUs one trial uses, its TP size)")
        if self.host_gpus is not None and self.gpus_per_trial is not None and self.gpus_per_trial > self.host_gpus:
            raise ValueError(f"gpus_per_trial {self.gpus_per_trial} is more than host_gpus {self.host_gpus}")
        return self


def _check_scenario(scenario: str) -> None:
    """A sim scenario must be a built-in name or a valid scenario file, else every trial crashes.

    Raises:
        ValueError: one line naming the scenario and the problem.
    """
    from autotune.sim.scenario import ScenarioError, list_scenarios, load_scenario

    if scenario not in list_scenarios() and not Path(scenario).expanduser().is_file():
        raise ValueError(f"scenario '{scenario}': no such built-in or file (built-ins: {', '.join(list_scenarios())})")
    try:
        load_scenario(scenario)
    except ScenarioError as exc:
        raise ValueError(str(exc)) from None


class RayConfig(BaseModel):
    """The Ray executor: which cluster, and how long a trial may wait for its slot.

    ``address``: a running cluster (``auto``, ``HOST:PORT``); None starts a local one whose only
    node offers the slots of ``target.hosts``. ``schedule_timeout_s``: a trial that has not
    started on its slot by then (no node offers the slot's resource any more) is a
    ``slot-unavailable`` fault and the slot is quarantined.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)

    address: str | None = Field(default=None, min_length=1)
    schedule_timeout_s: float = Field(default=120.0, gt=0)


class ConfirmConfig(BaseModel):
    """The end of the budget measures the ``candidates`` best configurations again until each
    has ``measurements`` measurements (:mod:`autotune.study.confirmation`); ``candidates: 0`` turns
    it off."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)

    candidates: int = Field(default=3, ge=0, le=100)
    measurements: int = Field(default=3, ge=2, le=100)


class BudgetConfig(BaseModel):
    """When a study stops: after ``trials`` finished trials or ``hours`` of trial time, in total;
    the last of the ``trials`` confirm the best configurations (``confirm``)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)

    trials: int | None = Field(default=40, gt=0)
    hours: float | None = Field(default=None, gt=0)
    confirm: ConfirmConfig = Field(default_factory=ConfirmConfig)


class BaselineFrom(BaseModel):
    """Take the baseline from the best trial of another study (e.g. an NCCL-only study)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    study: str = Field(min_length=1)
    storage: str | None = None


class WarmStartFrom(BaselineFrom):
    """Start the search from what another study found (:mod:`autotune.study.warm_start`);
    ``force``: carry it over even where its host, engine or model differs (the difference stated)."""

    force: bool = False


class StudyConfig(BaseModel):
    """A whole study: target, space, objective, baseline, budget and storage."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)

    name: str = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9][\w.@+-]*$")
    target: TargetConfig
    space: str = "sglang_nccl"
    objective: str = "throughput"
    objective_overrides: dict[str, Any] = Field(default_factory=dict)
    baseline: dict[str, Any] = Field(default_factory=dict)
    baseline_from: BaselineFrom | None = None
    warm_start: list[WarmStartFrom] = Field(default_factory=list, max_length=20)
    budget: BudgetConfig = Field(default_factory=BudgetConfig)
    storage: str = DEFAULT_STORAGE
    sampler: Literal["tpe", "gp", "random"] = "tpe"
    seed: int | None = Field(default=None, ge=0, le=MAX_SEED)
    max_fault_retries: int = Field(default=2, ge=0, le=100)
    executor: Literal["serial", "ray"] = "serial"
    ray: RayConfig = Field(default_factory=RayConfig)
    quarantine_after: int = Field(default=3, ge=1, le=100)

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
