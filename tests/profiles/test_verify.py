"""`autotune verify PROFILE`, for real: a study on the simulated host, its best trial exported as
json and sh, each launched again on this machine under the study's load and compared with what
the study recorded. No wall-clock asserts: a noisy machine moves the ratio, so only that the
exit code agrees with the ratio and the tolerance is asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.sim_study import MFS, MIN_CH, SCENARIO, write_study

TOLERANCE = 0.10


def cli(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "autotune", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def verify(path: Path, *extra: str, env: dict[str, str] | None = None) -> tuple[int, dict[str, Any], str]:
    # TMPDIR: where verify keeps the server logs of a run that failed or was worse (here: the test's)
    proc = cli("verify", str(path), "--json", "--timeout", "120", *extra, cwd=path.parent,
               env={"TMPDIR": str(path.parent), **(env or {})})
    doc = json.loads(proc.stdout) if proc.stdout.strip() else {}
    return proc.returncode, doc, proc.stderr


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-trial study on the simulated host, exported as p.json and p.sh."""
    tmp = tmp_path_factory.mktemp("verify")
    cfg = write_study(tmp, "ver", {"mem_fraction_static": MFS, "NCCL_MIN_NCHANNELS": MIN_CH}, trials=2)
    proc = cli("study", "start", str(cfg), cwd=tmp)
    assert proc.returncode == 0, proc.stderr
    storage = f"sqlite:///{tmp}/studies.db"
    for fmt in ("json", "sh"):
        proc = cli("export", "ver", "--format", fmt, "-o", f"p.{fmt}", "--storage", storage, cwd=tmp)
        assert proc.returncode == 0, proc.stderr
    return tmp


def test_the_profile_carries_provenance_and_no_tuner_path(exported: Path) -> None:
    prof = json.loads((exported / "p.json").read_text())
    script = (exported / "p.sh").read_text()
    for text in (script, (exported / "p.json").read_text()):
        assert sys.executable not in text and os.path.realpath(sys.executable) not in text
        assert sys.prefix not in text
    prov = prof["provenance"]
    assert prov["engine"] == "sim" and prov["engine_version"] == "0.5.5-sim"
    assert "(simulated)" in prov["gpu"] and prov["study"] == "ver" and prov["trial"] == prof["trial"]
    assert prov["measured_at"] and prov["exported_at"].endswith("+00:00")
    # measured, not assumed: the simulated GPU from the trial's server log, the version from its info path
    assert prov["sources"]["gpu"] == "server log" and prov["sources"]["engine_version"] == "server info", prov
    assert prof["measured"]["count"] >= 1 and prof["measured"]["mean"] > 0
    assert [m["parameter"] for m in prof["memory"]] == ["mem_fraction_static"]
    # what verify needs to run it as the study's runner did
    v = prof["verify"]
    assert (v["engine"], v["scenario"], v["model"], v["secrets"]) == ("sim", SCENARIO, None, [])
    # the command as the user configured it, the interpreter the serving host's
    assert prof["command"][0] == "python3" and prof["command_template"][0] == "{python}"
    assert prof["command"][1:4] == ["-m", "autotune.sim", "serve"]
    assert ["--scenario", SCENARIO] == prof["command"][4:6] and "127.0.0.1" in prof["command"]
    assert 'PYTHON="${PYTHON:-python3}"' in script and 'exec "$PYTHON" -m autotune.sim serve' in script
    assert "# engine: sim (version 0.5.5-sim); GPU: " in script and "# measured: " in script
    assert "# memory: mem_fraction_static " in script and "\n# autotune-profile: {" in script


@pytest.mark.parametrize("name", ["p.json", "p.sh"])
def test_verify_measures_the_profile_again(exported: Path, name: str) -> None:
    # json: --python; sh: PYTHON in the environment, as a person runs the script
    extra = ("--python", sys.executable) if name.endswith("json") else ()
    code, doc, err = verify(exported / name, *extra, env={"PYTHON": sys.executable} if not extra else None)
    assert code in (0, 1), err
    assert doc["failure"] is None, doc
    assert doc["runs"] == 1 and doc["measured"] > 0 and doc["recorded"] > 0
    assert (code == 0) == (doc["ratio"] >= 1 - TOLERANCE) == doc["ok"]


def test_a_profile_recorded_ten_times_faster_fails(exported: Path) -> None:
    prof = json.loads((exported / "p.json").read_text())
    prof["measured"]["mean"] *= 10
    edited = exported / "faster.json"
    edited.write_text(json.dumps(prof))
    code, doc, err = verify(edited, "--python", sys.executable)
    assert code == 1, err
    assert doc["ok"] is False and doc["ratio"] < 0.5 and doc["failure"] is None
    assert Path(doc["log_dir"]).parent == exported and list(Path(doc["log_dir"]).glob("trial-*.log"))


SECRET = "s3cret-value-only-in-config"
BENCH = ("{python} -c 'import os, sys, json; print(\"auth:\", os.environ[\"MY_AUTH\"]); "
         "open(sys.argv[2], \"w\").write(json.dumps(dict(output_throughput=1.0 if sys.argv[1] == \"tiny-model\" "
         "else 0.0)))' {model} {result_file}")
"""A benchmark that measures 1.0 when it is given the target's model, and prints the secret."""


def test_verify_runs_the_benchmark_with_the_targets_fields_and_hides_the_configs_secrets(exported: Path) -> None:
    prof = json.loads((exported / "p.json").read_text())
    objective = prof["verify"]["objective"]
    objective.update(benchmark={"command": BENCH, "parse": "json"}, constraints=[])
    # a target with a model, and an env var secret only because the config says so
    prof["verify"].update(model="tiny-model", secrets=["MY_AUTH"])
    prof["env"]["MY_AUTH"] = SECRET
    prof["measured"]["mean"] = 10.0  # worse: the logs are kept, to be read here
    edited = exported / "bench.json"
    edited.write_text(json.dumps(prof))
    code, doc, err = verify(edited, "--python", sys.executable)
    assert code == 1 and doc["failure"] is None and doc["measured"] == 1.0, (doc, err)
    bench_log = (Path(doc["log_dir"]) / "trial-0001.bench.log").read_text()
    assert "auth: ${MY_AUTH}" in bench_log and SECRET not in bench_log, bench_log
    assert not any(SECRET in f.read_text(errors="replace") for f in Path(doc["log_dir"]).iterdir())


MEASURES_ONE = "{python} -c 'import sys, json; open(sys.argv[1], \"w\").write(json.dumps(dict(output_throughput=1.0)))' {result_file}"
"""A benchmark that measures 1.0."""


@pytest.mark.parametrize("interval, where", [([1.02, 1.08], "below"), ([0.95, 1.05], "inside")])
def test_verify_states_the_recorded_interval_and_whether_the_run_falls_inside_it(
        exported: Path, interval: list[float], where: str) -> None:
    """The benchmark measures 1.0 against a recorded 1.05: within the 10% tolerance either way,
    and below an interval [1.02, 1.08] (said, though it passes) or inside [0.95, 1.05]."""
    from autotune.profiles.verify import verify_lines

    prof = json.loads((exported / "p.json").read_text())
    prof["verify"]["objective"].update(benchmark={"command": MEASURES_ONE, "parse": "json"}, constraints=[])
    prof["measured"].update(mean=1.05, interval95=interval, count=3)
    edited = exported / f"interval-{where}.json"
    edited.write_text(json.dumps(prof))
    code, doc, err = verify(edited, "--python", sys.executable)
    assert code == 0 and doc["ok"] and doc["measured"] == 1.0, (doc, err)
    assert doc["recorded_interval95"] == interval and doc["inside_interval"] == where
    lines = verify_lines(doc)
    shown = f"recorded 95% interval [{interval[0]:.4g}, {interval[1]:.4g}]"
    if where == "inside":
        assert lines[1] == f"{shown}: the new run is inside it"
    else:
        assert lines[1].startswith(f"{shown}: the new run is OUTSIDE it (below it), though within the tolerance")
    # as the command prints it
    proc = cli("verify", str(edited), "--python", sys.executable, "--timeout", "120", cwd=exported,
               env={"TMPDIR": str(exported)})
    assert proc.returncode == 0 and shown in proc.stdout and ("OUTSIDE" in proc.stdout) == (where == "below"), proc


def test_a_profile_without_an_interval_says_so() -> None:
    from autotune.profiles.verify import verify_lines

    doc = {"recorded": 100.0, "recorded_count": 1, "study": "s", "trial": 3, "direction": "maximize", "ok": True,
           "tolerance": 0.1, "runs": 1, "metric": "output_throughput", "measured": 95.0, "ratio": 0.95,
           "recorded_interval95": None, "inside_interval": None}
    assert verify_lines(doc)[1] == "recorded interval: none (1 measurement recorded: no spread to judge by)"


@pytest.mark.parametrize("text, fragment", [
    ("garbage {\n", "not an autotune launch profile"),
    ('{"study": "x"}\n', "no autotune_profile data"),
    ("#!/usr/bin/env bash\n# autotune-profile: {not json\nexec true\n", "cannot parse"),
    (('{"autotune_profile": 1, "command_template": ["x"], "env": {}, "python_words": [], "direction": "maximize",'
      ' "measured": {"mean": "fast"}, "verify": {}}'), "measured.mean"),
])
def test_a_bad_profile_is_a_one_line_error(tmp_path: Path, text: str, fragment: str) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    code, _, err = verify(bad)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and fragment in lines[0] and "Traceback" not in err, err
    code, _, err = verify(tmp_path / "missing.json")
    assert code == 2 and "profile not found" in err and len(err.strip().splitlines()) == 1
