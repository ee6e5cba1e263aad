"""Launch profiles and secrets: what a profile runs is exactly what the trial ran, whatever the
values; secrets never reach a profile, the storage or a log; bad export arguments are one-line
errors that write nothing; exported files are private."""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
import sys
import unicodedata
from pathlib import Path
from typing import Any

import optuna
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from autotune.errors import UsageError
from autotune.export import FORMATS, one_line, profile, render
from autotune.secrets import (
    MIN_TEXT_SECRET,
    Redactor,
    expand_command,
    expand_env,
    is_secret_env,
    is_secret_flag,
    is_secret_name,
)
from autotune.study_view import TrialView

DUMP = "import json, os, sys; json.dump({'argv': sys.argv[1:], 'env': dict(os.environ)}, sys.stdout)"
"""The 'server' of a test profile: prints the argv and env it was started with."""

PORT = 41234
TRICKY = [
    "", " ", "$HOME", "${HOME}", "${HF_TOKEN}", "$(touch INJECTED)", "`touch INJECTED`", "'", '"', "\\", "\\'",
    "a'b\"c", "\n", "x\ntouch INJECTED\n", "\r\n: > INJECTED\r\n", "\t", "*", "~", "!!", "-n", "--x=$y", "{port}",
    "p{port}q", "é中文🙂", "\u2028touch INJECTED", "\x1b[2J", "\u202e", "#", "; exit 7", "\\\n",
]
"""Values that break naive quoting; ``INJECTED`` appears in each attempt to run a command."""

_chars = st.characters(exclude_categories=("Cs",), exclude_characters="\x00")
VALUES = st.one_of(st.text(_chars, max_size=24), st.sampled_from(TRICKY))
ENV_NAMES = st.from_regex(r"AT_[A-Za-z0-9_]{0,8}", fullmatch=True)


def trial(env: dict[str, str], args: list[str], params: dict[str, Any] | None = None, *,
          secret_env: list[str] | None = None, secret_args: dict[int, str] | None = None) -> TrialView:
    """A trial view whose server is the DUMP program with ``args`` (the port as ``{port}``)."""
    template = [sys.executable, "-c", DUMP, *args]
    return TrialView(number=3, state="COMPLETE", outcome="ok", params=params or {}, value=1.5, metrics={},
                     failure=None, duration_s=1.0, env=env, argv=[w.replace("{port}", "1") for w in template],
                     argv_template=template, secret_env=secret_env or [], secret_args=secret_args or {})


def rendered(fmt: str, best: TrialView, study: str = "s") -> str:
    prof = profile(study, "tok_s", "maximize", best, PORT)
    return render(fmt, prof, best.argv_template, secret_env_keys=best.secret_env, secret_args=best.secret_args)


def base_env(**extra: str) -> dict[str, str]:
    return {"PATH": os.environ["PATH"], "PYTHONUTF8": "1", **extra}


def run_sh(path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(path)], cwd=path.parent, env=env, capture_output=True, text=True, timeout=60)


def source_env(path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    script = 'set -a; source "$0"; set +a; exec "$@"'
    return subprocess.run(["bash", "-c", script, str(path), sys.executable, "-c", DUMP], cwd=path.parent, env=env,
                          capture_output=True, text=True, timeout=60)


# -- what a profile runs ---------------------------------------------------------------------
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(env=st.dictionaries(ENV_NAMES, VALUES, max_size=5), args=st.lists(VALUES, max_size=6),
       params=st.dictionaries(st.one_of(st.text(_chars, max_size=8), st.sampled_from(TRICKY)), VALUES, max_size=3),
       study=st.sampled_from(["s", "a\ntouch INJECTED", "x\r\u2028y"]))
def test_profiles_run_exactly_the_recorded_env_and_argv(tmp_path_factory: pytest.TempPathFactory, env: dict[str, str],
                                                        args: list[str], params: dict[str, Any], study: str) -> None:
    work = tmp_path_factory.mktemp("p")
    best = trial(env, args, params)
    sh, envf = work / "p.sh", work / "p.env"
    sh.write_text(rendered("sh", best, study))
    envf.write_text(rendered("env", best, study))
    # comments stay comments: every line before the code starts with "#"
    head = sh.read_text().split("\nset -euo pipefail\n")[0].splitlines()
    assert len(head) >= 4 and all(line.startswith("#") for line in head)
    head = envf.read_text().split("\n# for bash: set -a; source THIS_FILE; set +a\n")[0].splitlines()
    assert len(head) >= 4 and all(line.startswith("#") for line in head)

    proc = run_sh(sh, base_env(PORT=str(PORT)))
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["argv"] == [a.replace("{port}", str(PORT)) for a in args]
    assert {k: v for k, v in got["env"].items() if k.startswith("AT_")} == env

    proc = source_env(envf, base_env())
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert {k: v for k, v in got["env"].items() if k.startswith("AT_")} == env
    assert sorted(p.name for p in work.iterdir()) == ["p.env", "p.sh"]  # nothing else ran


@settings(max_examples=300, deadline=None)
@given(st.text(st.characters(exclude_characters="\x00"), max_size=40))
def test_a_comment_line_is_one_line_whatever_the_text(text: str) -> None:
    safe = one_line(text)
    assert len(safe.splitlines()) <= 1 and "\n" not in safe and "\r" not in safe and "\u2028" not in safe
    assert all(unicodedata.category(ch)[0] != "C" and unicodedata.category(ch) not in ("Zl", "Zp") for ch in safe)


def test_header_values_are_shown_escaped() -> None:
    best = trial({"AT_X": "1"}, [], {"choice": "a\nrm -rf ~\n", "n": 8})
    for fmt in ("sh", "env"):
        text = rendered(fmt, best)
        assert '# params: choice="a\\nrm -rf ~\\n" n=8' in text
        assert "\nrm -rf" not in text


def test_an_env_name_that_is_not_a_shell_name_is_refused() -> None:
    best = trial({"A;touch INJECTED": "1"}, [])
    for fmt in ("sh", "env"):
        with pytest.raises(UsageError, match="not a shell name"):
            rendered(fmt, best)


# -- secrets ---------------------------------------------------------------------------------
HF = "hf_Secret'Value$(touch INJECTED)\n"
KEY = "sk-abc`touch INJECTED`123"
PASS = "p@ss word"


def secret_trial() -> tuple[TrialView, list[str]]:
    """A trial whose env and argv were redacted by the real Redactor, as the driver stores it."""
    env = {"HF_TOKEN": HF, "AT_PLAIN": "${HF_TOKEN}", "TOKENIZERS_PARALLELISM": "false"}
    args = ["--api-key", KEY, "--db-password=" + PASS, "--max-total-tokens", "4096", "--note", "${API_KEY}",
            "--port", "{port}"]
    template = [sys.executable, "-c", DUMP, *args]
    redactor = Redactor(env, template)
    launch = redactor.launch(env, template)
    best = TrialView(number=1, state="COMPLETE", outcome="ok", params={}, value=2.0, metrics={}, failure=None,
                     duration_s=1.0, env=launch.env, argv=launch.argv, argv_template=launch.argv,
                     secret_env=launch.secret_env, secret_args=launch.secret_args)
    return best, args


def test_a_profile_holds_no_secret_and_runs_with_the_secrets_supplied(tmp_path: Path) -> None:
    best, args = secret_trial()
    assert best.env["TOKENIZERS_PARALLELISM"] == "false" and "4096" in best.argv_template
    for fmt in FORMATS:
        text = rendered(fmt, best)
        for value in (HF, KEY, PASS, "hf_Secret", "sk-abc"):
            assert value not in text, (fmt, value)
    prof = json.loads(rendered("json", best))
    assert prof["secrets"] == ["API_KEY", "DB_PASSWORD", "HF_TOKEN"]
    assert prof["env"]["HF_TOKEN"] == "${HF_TOKEN}" and "--db-password=${DB_PASSWORD}" in prof["command"]

    sh = tmp_path / "p.sh"
    sh.write_text(rendered("sh", best))
    proc = run_sh(sh, base_env(PORT=str(PORT), HF_TOKEN=HF, API_KEY=KEY, DB_PASSWORD=PASS))
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["argv"] == [a.replace("{port}", str(PORT)) for a in args]
    # the user's literal "${HF_TOKEN}" / "${API_KEY}" texts stay literal
    assert got["env"]["HF_TOKEN"] == HF and got["env"]["AT_PLAIN"] == "${HF_TOKEN}" and "${API_KEY}" in got["argv"]

    envf = tmp_path / "p.env"
    envf.write_text(rendered("env", best))
    proc = source_env(envf, base_env(HF_TOKEN=HF))
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["env"]["HF_TOKEN"] == HF and got["env"]["AT_PLAIN"] == "${HF_TOKEN}"
    assert not (tmp_path / "INJECTED").exists()


@pytest.mark.parametrize("missing", ["HF_TOKEN", "API_KEY", "DB_PASSWORD"])
def test_a_profile_refuses_to_start_without_a_secret(tmp_path: Path, missing: str) -> None:
    best, _ = secret_trial()
    sh = tmp_path / "p.sh"
    sh.write_text(rendered("sh", best))
    supplied = {"HF_TOKEN": HF, "API_KEY": KEY, "DB_PASSWORD": PASS}
    del supplied[missing]
    proc = run_sh(sh, base_env(PORT=str(PORT), **supplied))
    assert proc.returncode != 0 and proc.stdout == ""
    assert f"set {missing} in the environment" in proc.stderr


def test_what_is_secret() -> None:
    for name in ("HF_TOKEN", "OPENAI_API_KEY", "aws_secret_access_key", "PGPASSWORD", "HUGGING_FACE_HUB_TOKEN"):
        assert is_secret_env(name), name
    for name in ("NCCL_MIN_NCHANNELS", "TOKENIZERS_PARALLELISM", "NCCL_IB_PKEY", "SGLANG_MAX_TOKENS", "PATH"):
        assert not is_secret_env(name), name
    assert is_secret_env("AUTH", ["AUTH"]) and not is_secret_env("AUTH", ["--auth"])
    for flag in ("--api-key", "--hf-token", "--client-secret", "--ssl-keyfile-password", "--openai-api-key"):
        assert is_secret_flag(flag), flag
    for flag in ("--max-total-tokens", "--cb-max-batch-tokens", "--tokenizer-path", "--key-cache", "--port"):
        assert not is_secret_flag(flag), flag
    assert is_secret_flag("--auth", ["--auth"]) and is_secret_name("AUTH_2", ["--auth"]) and not is_secret_name("AUTH")


def test_redaction_of_a_launch_records_what_it_replaced() -> None:
    env = {"HF_TOKEN": "hf_one", "NCCL_IB_PKEY": "0x8001", "EMPTY_TOKEN": ""}
    argv = ["srv", "--api-key", "k1", "--hf-token", "hf_two", "--auth=pw", "--api-key", "--port", "8", "--note", "${X}"]
    r = Redactor(env, argv, ["--auth"], public=["NCCL_IB_PKEY"])
    launch = r.launch(env, argv)
    assert launch.env == {"HF_TOKEN": "${HF_TOKEN}", "NCCL_IB_PKEY": "0x8001", "EMPTY_TOKEN": ""}
    assert launch.argv == ["srv", "--api-key", "${API_KEY}", "--hf-token", "${HF_TOKEN_2}", "--auth=${AUTH}",
                           "--api-key", "--port", "8", "--note", "${X}"]
    assert launch.secret_env == ["HF_TOKEN"] and launch.secret_args == {2: "API_KEY", 4: "HF_TOKEN_2", 5: "AUTH"}
    assert launch.attrs()["secret_args"] == {"2": "API_KEY", "4": "HF_TOKEN_2", "5": "AUTH"}
    assert launch.names == ["API_KEY", "AUTH", "HF_TOKEN", "HF_TOKEN_2"]


def test_text_and_log_files_are_redacted(tmp_path: Path) -> None:
    r = Redactor({"HF_TOKEN": "hf_abcdef"}, ["srv", "--api-key", "sk-12345", "--hf-token", "abc"],
                 environ={"WANDB_API_KEY": "wandb-xyz", "HOME": "/home/u"})
    assert r.text("args: --api-key sk-12345, token hf_abcdef, wandb-xyz, abc, /home/u") == \
        "args: --api-key ${API_KEY}, token ${HF_TOKEN}, ${WANDB_API_KEY}, abc, /home/u"  # "abc": too short
    log = tmp_path / "trial-0001.log"
    log.write_bytes(b"start sk-12345\n\xff\xfe binary hf_abcdef end\n")
    log.chmod(0o644)
    r.file(log)
    assert log.read_bytes() == b"start ${API_KEY}\n\xff\xfe binary ${HF_TOKEN} end\n"
    assert stat.S_IMODE(log.stat().st_mode) == 0o600


SECRET_VALUES = st.text(_chars, min_size=MIN_TEXT_SECRET, max_size=20).filter(lambda v: "$" not in v and "{" not in v)


@settings(max_examples=100, deadline=None)
@given(hf=SECRET_VALUES, key=SECRET_VALUES, noise=st.lists(VALUES, max_size=4))
def test_redaction_hides_every_value_and_expansion_restores_it(hf: str, key: str, noise: list[str]) -> None:
    # a value inside the launch's other words (or inside a reference's text) is not what is tested here
    assume(all(v not in w for v in (hf, key) for w in noise + ["srv", "--api-key", "--x", "log", "${HF_TOKEN}${API_KEY}"]))
    env = {"HF_TOKEN": hf, "NCCL_X": "8"}
    argv = ["srv", *noise, "--x", "--api-key", key]
    r = Redactor(env, argv)
    launch = r.launch(env, argv)
    stored = [*launch.env.values(), *launch.argv, r.text(f"log {hf} {key} {' '.join(noise)}")]
    assert not any(v in s for v in (hf, key) for s in stored)
    supplied = {"HF_TOKEN": hf, "API_KEY": key}
    assert expand_env(launch.env, environ=supplied) == env
    command = r.command(" ".join(shlex.quote(w) for w in argv))
    assert key not in command
    if not any("${" in w for w in noise):  # a literal "${HF_TOKEN}" in a command would be expanded too
        assert shlex.split(expand_command(command, environ=supplied)) == argv


def test_expansion_names_the_missing_secret() -> None:
    with pytest.raises(UsageError, match="set HF_TOKEN in the environment"):
        expand_env({"HF_TOKEN": "${HF_TOKEN}"}, environ={})
    # only a secret key's own reference was made by redaction; any other "${X}" is the user's text
    literal = {"A": "${HOME}", "B": "x${HF_TOKEN}", "AT_PLAIN": "${HF_TOKEN}", "HF_TOKEN": "${API_KEY}"}
    assert expand_env(literal, environ={}) == literal
    assert expand_env({"MY_AUTH": "${MY_AUTH}"}, ["MY_AUTH"], environ={"MY_AUTH": "v"}) == {"MY_AUTH": "v"}


# -- the export command on a stored study ------------------------------------------------------
def stored_study(tmp: Path, *, secrets: bool = False) -> str:
    """A study stored as the driver stores one: one COMPLETE trial with autotune's user attrs."""
    storage = f"sqlite:///{tmp}/studies.db"
    study = optuna.create_study(study_name="exp", storage=storage, direction="maximize")
    study.set_user_attr("objective", {"metric": "output_throughput", "direction": "maximize"})
    study.set_user_attr("config", {"name": "exp", "target": {"engine": "sim", "env": {"NCCL_IB_DISABLE": "1"}}})
    env = {"NCCL_IB_DISABLE": "1", "NCCL_MIN_NCHANNELS": "8"}
    template = [sys.executable, "-c", DUMP, "--port", "{port}", "--mem-fraction-static", "0.92"]
    if secrets:
        env["HF_TOKEN"] = "hf_real_value"
        template += ["--api-key", "sk-real-value"]
    launch = Redactor(env, template).launch(env, template)
    attrs: dict[str, Any] = {
        "outcome": "ok", "feasible": True, "failure_kind": None, "metrics": {"output_throughput": 123.4},
        "applied": {"mem_fraction_static": 0.92, "NCCL_MIN_NCHANNELS": 8}, "env": launch.env,
        "argv": [w.replace("{port}", "30001") for w in launch.argv], "argv_template": launch.argv, "port": 30001,
        "host": "local", "startup_s": 1.0, "duration_s": 2.0, **launch.attrs(),
    }
    study.add_trial(optuna.trial.create_trial(value=123.4, user_attrs=attrs))
    return storage


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "autotune", *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def listing(root: Path) -> dict[str, tuple[int, bytes]]:
    return {str(p.relative_to(root)): (p.stat().st_mode, p.read_bytes() if p.is_file() else b"")
            for p in sorted(root.rglob("*"))}


@pytest.mark.parametrize("bad, fragment", [
    (["-o", "missing/p.sh"], "does not exist"),
    (["-o", "folder"], "is a folder"),
    (["-o", "folder/"], "is a folder"),
    (["-o", "p.sh", "--port", "0"], "--port 0"),
    (["-o", "p.sh", "--port", "99999"], "--port 99999"),
    (["-o", "p.sh", "--port", "-1"], "--port -1"),
    (["--port", "65536"], "--port 65536"),
])
def test_bad_export_arguments_are_one_line_errors_that_write_nothing(tmp_path: Path, bad: list[str],
                                                                     fragment: str) -> None:
    storage = stored_study(tmp_path)
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "keep.txt").write_text("keep")
    before = listing(tmp_path)
    proc = cli("export", "exp", "--format", "sh", "--storage", storage, *bad, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr and fragment in lines[0], proc.stderr
    assert proc.stdout == ""
    assert listing(tmp_path) == before


def test_exported_files_are_private_and_replace_an_existing_file(tmp_path: Path) -> None:
    storage = stored_study(tmp_path)
    for fmt in FORMATS:
        out = tmp_path / f"profile.{fmt}"
        out.write_text("old")
        out.chmod(0o666)
        proc = cli("export", "exp", "--format", fmt, "-o", out.name, "--storage", storage, "--port", "65535",
                   cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert stat.S_IMODE(out.stat().st_mode) == (0o700 if fmt == "sh" else 0o600), fmt
        assert "NCCL_MIN_NCHANNELS" in out.read_text() and "65535" in out.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["profile.env", "profile.json", "profile.sh",
                                                          "profile.yaml", "studies.db"]


def test_a_stored_trial_with_secrets_exports_references(tmp_path: Path) -> None:
    storage = stored_study(tmp_path, secrets=True)
    for fmt in FORMATS:
        out = cli("export", "exp", "--format", fmt, "--storage", storage, cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        assert "hf_real_value" not in out.stdout and "sk-real-value" not in out.stdout
    prof = json.loads(cli("export", "exp", "--format", "json", "--storage", storage, cwd=tmp_path).stdout)
    assert prof["secrets"] == ["API_KEY", "HF_TOKEN"] and prof["env"]["HF_TOKEN"] == "${HF_TOKEN}"
    proc = cli("export", "exp", "--format", "sh", "-o", "p.sh", "--storage", storage, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(run_sh(tmp_path / "p.sh", base_env(PORT=str(PORT), HF_TOKEN="hf_x", API_KEY="sk_y")).stdout)
    assert got["env"]["HF_TOKEN"] == "hf_x" and got["env"]["NCCL_MIN_NCHANNELS"] == "8"
    assert got["argv"] == ["--port", str(PORT), "--mem-fraction-static", "0.92", "--api-key", "sk_y"]
    refused = run_sh(tmp_path / "p.sh", base_env(PORT=str(PORT), API_KEY="sk_y"))
    assert refused.returncode != 0 and "set HF_TOKEN in the environment" in refused.stderr
