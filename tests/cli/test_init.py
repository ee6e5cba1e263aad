"""``autotune init`` writes a config that runs as written; ``study start --dry-run`` shows the
baseline's launch and creates nothing; the preflight's new checks stop a study in one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest
import yaml

from autotune.config.starter import STARTERS
from autotune.config.study import StudyConfig
from autotune.study import build
from tests.helpers.cli import run_in_process

Cli = Callable[..., "subprocess.CompletedProcess[str]"]


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Cli:
    """``cli(*ARGS, cwd=DIR)``: the real ``autotune ARGS`` (its ``main()``), in this process, in ``DIR``;
    with ``check`` (default), a non-zero exit is an AssertionError showing both outputs."""

    def run(*args: str, cwd: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
        monkeypatch.chdir(cwd)
        code, out, err = run_in_process(list(args), capsys, monkeypatch)
        proc = subprocess.CompletedProcess(["autotune", *args], int(code or 0), out, err)  # type: ignore[call-overload]
        if check and proc.returncode != 0:
            raise AssertionError(f"autotune {' '.join(args)} exited {proc.returncode}\n{out}\n{err}")
        return proc

    return run


def _one_error(proc: subprocess.CompletedProcess[str], *fragments: str) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("autotune: error:"), proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize(("engine", "device"), sorted(STARTERS))
@pytest.mark.parametrize("tp", [1, 4])
def test_every_written_config_loads_with_its_space_and_objective(cli: Cli, tmp_path: Path, engine: str, device: str,
                                                                 tp: int) -> None:
    if tp > 1 and STARTERS[(engine, device)].tp_flag is None:
        proc = cli("init", "--engine", engine, "--device", device, "--model", "m", "--tp", str(tp),
                        cwd=tmp_path, check=False)
        _one_error(proc, f"--tp {tp}", "no tensor parallelism")
        assert list(tmp_path.iterdir()) == []
        return
    cli("init", "--engine", engine, "--device", device, "--model", "org/My Model_v1", "--tp", str(tp),
             "--input-tokens", "100", "--concurrency", "3", cwd=tmp_path)
    path = tmp_path / "My-Model_v1.yaml"
    text = path.read_text()
    assert text.startswith("# autotune study:") and "--dry-run" in text
    p = build.plan(StudyConfig.load(path))  # in tmp_path, as the space beside it is named from there
    assert p.config.target.engine == engine and p.config.target.model == "org/My Model_v1"
    assert p.objective.load.input_len == 100 and p.objective.load.concurrency == 3
    flag = STARTERS[(engine, device)].tp_flag
    assert (f"{flag} {tp}" in (p.config.target.command or "")) == (tp > 1)
    nccl = [k for k in p.space.parameters if k.startswith("NCCL_")]
    builtin = yaml.safe_load((Path(build.__file__).parents[2] / "search_spaces" / f"{STARTERS[(engine, device)].space}.yaml")
                             .read_text())["parameters"]
    if tp == 1 and device == "gpu":  # one GPU: nothing for NCCL to do, left out of a copy of the space
        assert nccl == []
        assert (tmp_path / "My-Model_v1.space.yaml").is_file() == any(k.startswith("NCCL_") for k in builtin)
    else:
        assert nccl == [k for k in builtin if k.startswith("NCCL_")]
    assert "speculative_num_draft_tokens" not in p.space.parameters  # no --draft-model


def test_a_draft_model_keeps_speculation_in_the_sglang_space(cli: Cli, tmp_path: Path) -> None:
    cli("init", "--engine", "sglang", "--model", "/m/big", "--tp", "8", "--draft-model", "/m/eagle it",
             "--name", "big", cwd=tmp_path)
    cfg = StudyConfig.load(tmp_path / "big.yaml")
    assert cfg.space == "sglang_nccl"  # nothing left out: the built-in itself
    assert cfg.target.command is not None and "--speculative-draft-model-path '/m/eagle it'" in cfg.target.command


def test_init_refuses_to_replace_a_file_and_bad_answers(cli: Cli, tmp_path: Path) -> None:
    (tmp_path / "x.yaml").write_text("mine\n")
    _one_error(cli("init", "--engine", "vllm", "--model", "m", "--name", "x", "--device", "cpu", cwd=tmp_path,
                        check=False), "x.yaml exists", "--force")
    assert (tmp_path / "x.yaml").read_text() == "mine\n"
    cli("init", "--engine", "vllm", "--model", "m", "--name", "x", "--device", "cpu", "--force", cwd=tmp_path)
    assert StudyConfig.load(tmp_path / "x.yaml").space == "vllm_cpu"
    _one_error(cli("init", "--engine", "tgi", "--model", "m", cwd=tmp_path, check=False), "--engine tgi")
    _one_error(cli("init", "--engine", "sglang", "--model", "m", "--device", "cpu", cwd=tmp_path, check=False),
               "engine sglang on cpu")
    _one_error(cli("init", "--engine", "vllm", "--model", "m", "--host", "gpu1", cwd=tmp_path, check=False),
               "--host gpu1")
    _one_error(cli("init", "--engine", "vllm", cwd=tmp_path, check=False), "missing --model")
    _one_error(cli("init", "--engine", "vllm", "--model", "m", "-o", "no/such/x.yaml", cwd=tmp_path,
                        check=False), "does not exist")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.yaml"]


def test_an_ssh_host_gets_its_interpreter_in_the_ssh_section(cli: Cli, tmp_path: Path) -> None:
    cli("init", "--engine", "sglang", "--model", "/m", "--tp", "2", "--host", "ssh://root@gpu1:2222",
             "--python", "/opt/venv/bin/python", "--name", "remote", cwd=tmp_path)
    cfg = StudyConfig.load(tmp_path / "remote.yaml")
    assert cfg.target.hosts == ["ssh://root@gpu1:2222"] and cfg.target.ssh is not None
    assert cfg.target.ssh.python == "/opt/venv/bin/python"
    assert cfg.target.command is not None and cfg.target.command.startswith("{python} ")


def test_dry_run_prints_the_baseline_launch_and_creates_nothing(cli: Cli, tmp_path: Path) -> None:
    proc = cli("study", "start", "--demo", "--dry-run", "--trials", "1", cwd=tmp_path)
    out = proc.stdout
    assert "the baseline (the first trial) on local" in out
    assert "-m autotune.sim serve --scenario rtx6000-pcie-glm5" in out and "--mem-fraction-static 0.92" in out
    assert "NCCL_IB_DISABLE=1" in out and "budget: 1 trial;" in out
    assert "load: 192 requests of 64 tokens in, 16 out, 192 in flight" in out
    assert out.rstrip().endswith("dry run: nothing launched, nothing recorded")
    assert list(tmp_path.iterdir()) == []  # no storage, no artifacts


def test_dry_run_shows_secrets_as_references(cli: Cli, tmp_path: Path) -> None:
    cfg = {"name": "sec", "target": {"engine": "sim", "scenario": "rtx6000-pcie-glm5",
                                     "command": "{python} -m autotune.sim serve --scenario {scenario} --host {host} "
                                                "--port {port} --api-key s3cr3t-value-123",
                                     "env": {"HF_TOKEN": "hf_abcdefghijklmnop"}},
           "objective": "quick", "storage": f"sqlite:///{tmp_path}/s.db"}
    (tmp_path / "sec.yaml").write_text(yaml.safe_dump(cfg))
    out = cli("study", "start", "sec.yaml", "--dry-run", cwd=tmp_path).stdout
    assert "s3cr3t-value-123" not in out and "hf_abcdefghijklmnop" not in out
    assert "--api-key '${API_KEY}'" in out and "HF_TOKEN='${HF_TOKEN}'" in out
    assert not (tmp_path / "s.db").exists()


def test_a_gp_sampler_without_torch_stops_before_any_trial(cli: Cli, tmp_path: Path) -> None:
    cfg = {"name": "gp", "target": {"engine": "sim", "scenario": "rtx6000-pcie-glm5"}, "objective": "quick",
           "sampler": "gp", "storage": f"sqlite:///{tmp_path}/s.db"}
    (tmp_path / "gp.yaml").write_text(yaml.safe_dump(cfg))
    # torch not importable in the Python running autotune (None in sys.modules: `import torch` fails)
    code = "import sys; sys.modules['torch'] = None; from autotune.cli.app import main; main()"
    proc = subprocess.run([sys.executable, "-c", code, "study", "start", "gp.yaml"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    _one_error(proc, "sampler gp needs torch", "sampler: tpe")
    assert not (tmp_path / "s.db").exists()


def test_a_fixed_port_in_use_stops_before_any_trial(cli: Cli, tmp_path: Path) -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        cfg = {"name": "port", "target": {"engine": "sim", "scenario": "rtx6000-pcie-glm5", "port": port},
               "objective": "quick", "storage": f"sqlite:///{tmp_path}/s.db"}
        (tmp_path / "port.yaml").write_text(yaml.safe_dump(cfg))
        _one_error(cli("study", "start", "port.yaml", cwd=tmp_path, check=False),
                   f"target.port {port} is in use on local")
    assert not (tmp_path / "s.db").exists()


def test_the_readmes_configs_are_what_init_writes(cli: Cli, tmp_path: Path) -> None:
    import re
    import shlex

    readme = (Path(__file__).parents[2] / "README.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", readme, re.S)
    commands = ["autotune init --engine vllm --model meta-llama/Llama-3.1-8B-Instruct --tp 2",
                " ".join(re.search(r"\(`(autotune init --engine sglang[^`]*)`\)", readme, re.S).group(1).split())]
    assert commands[0] in readme
    for command, block in zip(commands, blocks[:2]):
        args = shlex.split(command)[1:]
        cli(*args, "--force", cwd=tmp_path)
        name = args[args.index("--model") + 1].rstrip("/").split("/")[-1]
        assert yaml.safe_load((tmp_path / f"{name}.yaml").read_text()) == yaml.safe_load(block), command


def test_an_nccl_objective_without_gpus_stops_before_any_trial(cli: Cli, tmp_path: Path) -> None:
    """`objective: nccl` runs its benchmark with --backend nccl; on a machine where torch sees no GPU
    (this one, and CI's) every trial would fail alike: the preflight says so once, exit 2."""
    from tests.needs import require_modules

    require_modules(["torch"], "the nccl objective's benchmark", "pip install torch")
    import torch

    if torch.cuda.device_count() > 0:
        pytest.skip("torch sees a GPU here")
    cfg = {"name": "nccl", "target": {"engine": "none"}, "space": "nccl_only", "objective": "nccl",
           "storage": f"sqlite:///{tmp_path}/s.db"}
    (tmp_path / "nccl.yaml").write_text(yaml.safe_dump(cfg))
    _one_error(cli("study", "start", "nccl.yaml", cwd=tmp_path, check=False),
               "objective nccl (--backend nccl) needs a CUDA GPU and sees none", "nccl_cpu")
    assert not (tmp_path / "s.db").exists()
