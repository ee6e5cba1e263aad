"""SSH hosts for real: Debian's openssh-server on 127.0.0.1 with generated host and user keys,
the simulated host as the server behind it, and faults injected for real (an unknown or changed
host key, a connection dropped mid-trial, the whole sshd gone and back).

The "remote" host is this machine, so the tests can look at what runs there directly
(``/proc``, :func:`autotune.execution.hosts.tagged_pids`). The sshd is :mod:`tests.helpers.sshd`'s (the
``sshd`` fixture of tests/conftest.py, or one of a test's own). Without ``/usr/sbin/sshd`` the tests
skip, except under CI (env var ``CI``), where that is a failure: .ci/run installs openssh-server.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import optuna
import pytest
import yaml

from autotune.util.net import free_port
from autotune.execution.hosts import TAG_ENV, HostFault, LocalHost, tagged_pids
from autotune.execution.ssh_options import SSHOptions
from autotune.execution.sshhost import SSHHost
from tests.helpers.cli import autotune, show
from tests.helpers.sshd import PYTHON, SETUP, Sshd, descendants, keygen, new_sshd, ssh_section

SCENARIO = "rtx6000-pcie-glm5"
LOAD = {"load": {"concurrency": 16, "num_prompts": 32, "input_len": 32, "output_len": 8, "warmup_prompts": 1}}
MFS = {"type": "float", "low": 0.85, "high": 0.93, "step": 0.01, "flag": "--mem-fraction-static", "default": 0.92}
MIN_CH = {"type": "int", "low": 1, "high": 32, "env": "NCCL_MIN_NCHANNELS", "default": 8}
SIM_COMMAND = ("{python} -m autotune.sim serve --scenario {scenario} --host {host} --port {port}"
               " --max-running-requests 128")


@pytest.fixture
def own_sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    """An sshd of the test's own, to drop and kill."""
    server = new_sshd(tmp_path_factory.mktemp("own-sshd"))
    yield server
    server.stop()


@pytest.fixture
def launched() -> Iterator[list[str]]:
    """Tags of servers a test launched: whatever a failing test left of them is killed after it
    (the "remote" host is this machine)."""
    tags: list[str] = []
    yield tags
    for tag in tags:
        LocalHost().kill_tagged(tag)


# -- helpers --------------------------------------------------------------------------------------
def write_study(tmp: Path, name: str, sshd: Sshd, *, parameters: dict[str, Any] | None = None, trials: int = 1,
                ssh: dict[str, Any] | None = None, target: dict[str, Any] | None = None,
                load: dict[str, Any] | None = None) -> Path:
    space = tmp / f"{name}-space.yaml"
    space.write_text(yaml.safe_dump({"name": f"{name}-space", "parameters": parameters or {"mem_fraction_static": MFS}}))
    cfg = tmp / f"{name}.yaml"
    cfg.write_text(yaml.safe_dump({
        "name": name,
        "target": {"engine": "sim", "scenario": SCENARIO, "ready_timeout_s": 60, "command": SIM_COMMAND,
                   "env": {"NCCL_IB_DISABLE": "1"}, "hosts": [sshd.url],
                   "ssh": ssh if ssh is not None else ssh_section(sshd, tmp), **(target or {})},
        "space": str(space),
        "objective": "quick",
        "objective_overrides": load or LOAD,
        "budget": {"trials": trials},
        "storage": f"sqlite:///{tmp}/studies.db",
        "seed": 1,
    }))
    return cfg


def load(tmp: Path, name: str) -> optuna.Study:
    return optuna.load_study(study_name=name, storage=f"sqlite:///{tmp}/studies.db")


def wait_for(what: str, check: Callable[[], Any], timeout: float = 120) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def running_tag(tmp: Path, name: str) -> str | None:
    """The server tag of the study's RUNNING trial, once it launched."""
    try:
        study = load(tmp, name)
    except KeyError:
        return None
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        if t.user_attrs.get("server_tag"):
            return str(t.user_attrs["server_tag"])
    return None


def assert_gone(tag: str, port: int) -> None:
    """Nothing of a launch is left on the (remote = this) machine, and its port is free."""
    wait_for(f"the processes tagged {tag} to be gone", lambda: not tagged_pids(tag), timeout=20)
    assert LocalHost().port_free(port)


# -- 1: a study over SSH runs, exports and resumes like a local one ----------------------------------
def test_a_study_over_ssh_runs_exports_and_resumes(sshd: Sshd, tmp_path: Path) -> None:
    cfg = write_study(tmp_path, "remote", sshd, parameters={"mem_fraction_static": MFS, "NCCL_MIN_NCHANNELS": MIN_CH})
    autotune("study", "start", str(cfg), cwd=tmp_path)
    storage = f"sqlite:///{tmp_path}/studies.db"
    autotune("study", "resume", "remote", "--storage", storage, "--trials", "2", cwd=tmp_path)
    every = show(tmp_path, "remote")["trials"]
    # A fault of the connection (seen once, on a machine running two test suites at once) is the
    # host's, not the configuration's: the driver runs the configuration again at once, and the
    # study still ends with its 2 trials.
    trials = [t for t in every if t["state"] != "FAIL"]
    assert len(trials) == 2 and trials[0]["baseline"], every
    retried = {t.user_attrs["retry_of"]: t.params for t in load(tmp_path, "remote").trials
               if "retry_of" in t.user_attrs}
    for fault in (t for t in every if t["state"] == "FAIL"):
        assert fault["outcome"] == "fault" and retried.get(fault["number"]) == fault["params"], every
    ok = [t for t in trials if t["outcome"] == "ok"]
    assert ok and all(t["value"] > 0 and t["metrics"]["completed"] == 32 for t in ok)
    for t in load(tmp_path, "remote").trials:
        attrs = t.user_attrs
        assert attrs["host"] == sshd.url
        assert attrs["argv"][0] == PYTHON and "127.0.0.1" in attrs["argv"]  # {python} and {host} of the remote
        assert attrs["env"]["NCCL_IB_DISABLE"] == "1" and attrs["log_artifact"]
        log = (tmp_path / "autotune-artifacts" / "logs" / "remote" / f"trial-{t.number:04d}.log").read_text()
        assert "fired up" in log or attrs["outcome"] != "ok"  # streamed back
        assert_gone(attrs["server_tag"], attrs["port"])
    assert not list((tmp_path / "remote work" / ".autotune").glob("*.log"))  # remote logs cleaned up
    out = autotune("study", "resume", "remote", "--storage", storage, cwd=tmp_path)
    assert "budget reached" in out.stderr
    autotune("export", "remote", "--format", "sh", "-o", "p.sh", "--storage", storage, cwd=tmp_path)
    script = (tmp_path / "p.sh").read_text()
    assert "--mem-fraction-static" in script and "NCCL_MIN_NCHANNELS" in script
    best = json.loads(autotune("study", "best", "remote", "--json", "--storage", storage, cwd=tmp_path).stdout)
    assert best["value"] > 0


def test_ray_workers_reach_an_ssh_host_s_gpu_slots_in_parallel(sshd: Sshd, tmp_path: Path) -> None:
    """The second Ray layout: tasks on a (local) Ray cluster reach the host over SSH; the host
    declares 2 GPUs and a trial takes 1, so two trials run on it at once, each with its GPU."""
    cfg = write_study(tmp_path, "rayssh", sshd, trials=3, target={"host_gpus": 2, "gpus_per_trial": 1},
                      parameters={"mem_fraction_static": MFS, "NCCL_MIN_NCHANNELS": MIN_CH})
    autotune("study", "start", str(cfg), "--executor", "ray", cwd=tmp_path, timeout=400)
    trials = load(tmp_path, "rayssh").trials
    assert len(trials) == 3 and all(t.state.name in ("COMPLETE", "PRUNED") for t in trials), \
        [(t.state.name, t.user_attrs.get("failure_message")) for t in trials]
    slots = {t.user_attrs["slot"]: t.user_attrs["env"]["CUDA_VISIBLE_DEVICES"] for t in trials}
    assert slots == {f"{sshd.url}[gpu 0]": "0", f"{sshd.url}[gpu 1]": "1"}
    # Side by side: the runners' own spans (told minus duration; datetime_start is the ask) overlap.
    spans = sorted((t.datetime_complete.timestamp() - t.user_attrs["duration_s"], t.datetime_complete.timestamp())
                   for t in trials)
    assert any(later[0] < earlier[1] for earlier, later in zip(spans, spans[1:], strict=False)), spans
    for t in trials:
        assert t.user_attrs["host"] == sshd.url and t.user_attrs["log_artifact"]
        log = (tmp_path / "autotune-artifacts" / "logs" / "rayssh" / f"trial-{t.number:04d}.log").read_text()
        assert "fired up" in log or t.user_attrs["outcome"] != "ok"
        assert_gone(t.user_attrs["server_tag"], t.user_attrs["port"])


def test_a_killed_driver_s_remote_server_is_killed_on_resume(sshd: Sshd, tmp_path: Path, launched: list[str]) -> None:
    cfg = write_study(tmp_path, "killed", sshd)
    driver = subprocess.Popen([sys.executable, "-m", "autotune", "study", "start", str(cfg)], cwd=tmp_path,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        tag = wait_for("a launched server", lambda: running_tag(tmp_path, "killed"))
        launched.append(tag)
    finally:
        driver.kill()
        driver.wait(10)
    assert tagged_pids(tag)  # the orphaned server still runs on the host...
    autotune("study", "resume", "killed", "--storage", f"sqlite:///{tmp_path}/studies.db", cwd=tmp_path)
    assert tagged_pids(tag) == []  # ...and the resume killed it there, by its tag, over SSH
    first, retry = show(tmp_path, "killed")["trials"]
    assert first["state"] == "FAIL" and first["failure"]["kind"] == "interrupted"
    assert retry["params"] == first["params"] and retry["outcome"] == "ok"


# -- 2: host keys ---------------------------------------------------------------------------------
@pytest.mark.parametrize("known", ["empty", "other-key"])
def test_an_unknown_or_changed_host_key_is_refused_before_anything_runs(sshd: Sshd, tmp_path: Path, known: str) -> None:
    other = tmp_path / "other"
    keygen(other)
    kind, key = (tmp_path / "other.pub").read_text().split()[:2]
    known_hosts = tmp_path / "kh"
    known_hosts.write_text("" if known == "empty" else f"[127.0.0.1]:{sshd.port} {kind} {key}\n")
    cfg = write_study(tmp_path, "keys", sshd, ssh=ssh_section(sshd, tmp_path, known_hosts=str(known_hosts)))
    proc = autotune("study", "start", str(cfg), cwd=tmp_path, check=False)
    assert proc.returncode == 1
    fault = "host-key-unknown" if known == "empty" else "host-key-mismatch"
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"stopped: {fault}: ") and "host key" in last and "refused" in last
    trial, retry = show(tmp_path, "keys")["trials"]  # the retry waits for a resume, once the key is fixed
    assert trial["state"] == "FAIL" and trial["outcome"] == "fault" and trial["failure"]["kind"] == fault
    assert retry["state"] == "WAITING"
    assert "server_tag" not in load(tmp_path, "keys").trials[0].user_attrs  # nothing launched
    assert known_hosts.read_text() == ("" if known == "empty" else f"[127.0.0.1]:{sshd.port} {kind} {key}\n")


def test_an_unknown_host_key_is_accepted_when_the_config_says_so(sshd: Sshd, tmp_path: Path) -> None:
    known_hosts = tmp_path / "new_known_hosts"  # missing: made on the first connection
    cfg = write_study(tmp_path, "tofu", sshd,
                      ssh=ssh_section(sshd, tmp_path, known_hosts=str(known_hosts), accept_unknown_host_key=True))
    autotune("study", "start", str(cfg), cwd=tmp_path)
    (trial,) = show(tmp_path, "tofu")["trials"]
    assert trial["outcome"] == "ok"
    assert known_hosts.read_text() == sshd.known_hosts_line()  # pinned: later connections check it


# -- 3: a dropped connection is a fault, and its server is torn down ------------------------------------
def test_a_connection_dropped_mid_trial_is_a_fault_and_the_trial_runs_again(own_sshd: Sshd, tmp_path: Path,
                                                                           launched: list[str]) -> None:
    cfg = write_study(tmp_path, "drop", own_sshd)
    driver = subprocess.Popen([sys.executable, "-m", "autotune", "study", "start", str(cfg)], cwd=tmp_path,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        tag = wait_for("a launched server", lambda: running_tag(tmp_path, "drop"))
        launched.append(tag)
        own_sshd.drop_connections()  # sshd's per-connection processes die: the connection drops
        _, err = driver.communicate(timeout=240)
    finally:
        driver.kill()
    assert driver.returncode == 0, err
    first, retry = show(tmp_path, "drop")["trials"]
    assert first["state"] == "FAIL" and first["outcome"] == "fault" and first["failure"]["kind"] == "connection-lost"
    assert retry["params"] == first["params"] and retry["outcome"] == "ok"
    # The host answered again at teardown (the listener lived): the server was killed then.
    assert_gone(tag, load(tmp_path, "drop").trials[0].user_attrs["port"])
    assert not load(tmp_path, "drop").user_attrs.get("servers_left")


def test_a_server_left_by_a_lost_host_is_killed_when_a_resume_reaches_it(own_sshd: Sshd, tmp_path: Path,
                                                                        launched: list[str]) -> None:
    cfg = write_study(tmp_path, "gone", own_sshd, ssh=ssh_section(own_sshd, tmp_path, connect_timeout_s=2))
    driver = subprocess.Popen([sys.executable, "-m", "autotune", "study", "start", str(cfg)], cwd=tmp_path,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        tag = wait_for("a launched server", lambda: running_tag(tmp_path, "gone"))
        launched.append(tag)
        own_sshd.stop()  # the host is unreachable: teardown cannot kill the server
        _, err = driver.communicate(timeout=240)
    finally:
        driver.kill()
    assert driver.returncode == 1 and "infrastructure faults in a row (host-unreachable" in err, err
    trials = show(tmp_path, "gone")["trials"]
    assert trials[0]["failure"]["kind"] == "connection-lost"
    assert all(t["state"] == "FAIL" and t["outcome"] == "fault" for t in trials)
    assert [t["failure"]["kind"] for t in trials[1:]] == ["host-unreachable", "host-unreachable"]
    assert tagged_pids(tag), "the server was expected to outlive its unreachable host's teardown"
    assert [e["tag"] for e in load(tmp_path, "gone").user_attrs["servers_left"]] == [tag]
    own_sshd.start()  # the host is back
    autotune("study", "resume", "gone", "--storage", f"sqlite:///{tmp_path}/studies.db", cwd=tmp_path)
    assert_gone(tag, load(tmp_path, "gone").trials[0].user_attrs["port"])
    assert load(tmp_path, "gone").user_attrs["servers_left"] == []
    assert show(tmp_path, "gone")["trials"][-1]["outcome"] in ("ok", "infeasible")


# -- 4: trial values reach the remote server exactly ------------------------------------------------
ECHO_SERVER = """
import json, os, sys
print("ARGV " + json.dumps(sys.argv[1:]), flush=True)
print("ENV " + json.dumps({k: v for k, v in os.environ.items() if k.startswith("WEIRD")}), flush=True)
print("CWD " + os.getcwd(), flush=True)
os.execv(sys.executable, [sys.executable, "-m", "autotune.sim", "serve", "--scenario", sys.argv[1],
                          "--port", sys.argv[2], "--max-running-requests", "128"])
"""
NASTY = ["it's \"quoted\"", "$HOME and ${PATH}", "`id` $(id)", "a; touch /tmp/pwned-autotune", "two  spaces\ttab",
         "* ? [a]", "new\nline", "-x", "back\\slash", "|& > /dev/null <"]


def test_values_with_shell_metacharacters_reach_the_remote_server_exactly(sshd: Sshd, tmp_path: Path) -> None:
    (tmp_path / "echo_server.py").write_text(ECHO_SERVER)
    params = {f"p{i}": {"type": "categorical", "choices": [v], "flag": f"--weird-{i}", "default": v}
              for i, v in enumerate(NASTY)}
    params |= {f"e{i}": {"type": "categorical", "choices": [v], "env": f"WEIRD_E{i}", "default": v}
               for i, v in enumerate(NASTY)}
    cfg = write_study(tmp_path, "quote", sshd, parameters=params, target={
        "engine": "custom", "scenario": None,
        "command": f"{{python}} {tmp_path}/echo_server.py {SCENARIO} {{port}} 'fixed $arg; `x`'",
        "env": {"WEIRD_FIXED": "a'b\"c $d `e` ;f"}})
    autotune("study", "start", str(cfg), cwd=tmp_path)
    (trial,) = load(tmp_path, "quote").trials
    assert trial.user_attrs["outcome"] == "ok", trial.user_attrs
    log = (tmp_path / "autotune-artifacts" / "logs" / "quote" / "trial-0000.log").read_text()
    lines = {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in log.splitlines()
             if line.split(" ", 1)[0] in ("ARGV", "ENV", "CWD")}
    argv = json.loads(lines["ARGV"])
    assert argv[:3] == [SCENARIO, str(trial.user_attrs["port"]), "fixed $arg; `x`"]
    assert argv == trial.user_attrs["argv"][2:]  # exactly what was recorded, after python and the script
    flags = dict(zip(argv[3::2], argv[4::2]))
    assert flags == {f"--weird-{i}": v for i, v in enumerate(NASTY)}
    assert json.loads(lines["ENV"]) == {"WEIRD_FIXED": "a'b\"c $d `e` ;f", **{f"WEIRD_E{i}": v for i, v in enumerate(NASTY)}}
    assert lines["CWD"] == str(tmp_path / "remote work")
    assert not Path("/tmp/pwned-autotune").exists()


# -- 5: the host object itself ---------------------------------------------------------------------
STUBBORN = """
import os, signal, socket, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
subprocess.Popen([sys.executable, "-c", "import os, time; os.setsid(); time.sleep(300)"])
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen()
print("listening", flush=True)
time.sleep(300)
"""


@pytest.fixture
def host(sshd: Sshd, tmp_path: Path) -> Iterator[SSHHost]:
    (tmp_path / "stubborn.py").write_text(STUBBORN)
    h = SSHHost(sshd.url, SSHOptions(**ssh_section(sshd, tmp_path)))
    yield h
    h.close()


def test_teardown_leaves_no_tagged_process_and_the_port_free(host: SSHHost, tmp_path: Path, launched: list[str]) -> None:
    port = host.free_port()
    assert host.port_free(port)
    log = tmp_path / "local" / "server.log"
    proc = host.launch([PYTHON, str(tmp_path / "stubborn.py"), str(port)], {"X": "1"}, log, port=port)
    launched.append(proc.tag)
    wait_for("the server to listen", lambda: "listening" in (log.read_text() if log.exists() else ""), timeout=30)
    assert proc.poll() is None and not host.port_free(port)
    pids = tagged_pids(proc.tag)
    assert proc.pgid in pids and len(pids) == 3  # the wrapper shell, the server, its child in a session of its own
    environ = Path(f"/proc/{proc.pgid}/environ").read_bytes().split(b"\0")
    assert f"{TAG_ENV}={proc.tag}".encode() in environ and b"X=1" in environ
    proc.stop(grace_s=0.5)  # ignores SIGTERM: teardown must escalate
    assert tagged_pids(proc.tag) == [] and host.port_free(port) and LocalHost().port_free(port)
    assert not (tmp_path / "remote work" / ".autotune" / f"{proc.tag}.log").exists()


def test_an_exited_server_s_status_and_a_killed_driver_s_server(host: SSHHost, tmp_path: Path,
                                                               launched: list[str]) -> None:
    proc = host.launch([PYTHON, "-c", "import sys; print('bye', flush=True); sys.exit(3)"], {}, tmp_path / "a.log")
    assert wait_for("the exit status", proc.poll, timeout=30) == 3
    assert "bye" in (tmp_path / "a.log").read_text()
    proc.stop()
    port = host.free_port()
    left = host.launch([PYTHON, str(tmp_path / "stubborn.py"), str(port)], {}, tmp_path / "b.log", port=port)
    launched.append(left.tag)
    wait_for("the server to listen", lambda: "listening" in (tmp_path / "b.log").read_text(), timeout=30)
    other = SSHHost(host.name, host.options)  # another driver: knows only the tag
    assert other.kill_tagged(left.tag) and tagged_pids(left.tag) == []
    assert not other.kill_tagged(left.tag)
    other.close()
    left.stop()


def test_a_secret_the_remote_server_prints_never_reaches_the_local_log(host: SSHHost, tmp_path: Path,
                                                                       launched: list[str]) -> None:
    """The local copy of a remote server's log is redacted as it streams in (as a local server's
    is): while the server runs, and after, the file holds ``${HF_TOKEN}``, never the value."""
    from autotune.config.secrets import Redactor, StreamRedactor

    secret = "hf_remote_secret_0123456789"
    env = {"HF_TOKEN": secret}
    script = ("import os, sys, time\n"
              "print('token', os.environ['HF_TOKEN'], flush=True)\n"
              "for c in os.environ['HF_TOKEN']:\n"  # a byte at a time: every chunking of the value
              "    sys.stdout.write(c); sys.stdout.flush(); time.sleep(0.01)\n"
              "print(' printed', flush=True)\ntime.sleep(60)\n")
    log = tmp_path / "secret.log"
    proc = host.launch([PYTHON, "-c", script], env, log, redact=StreamRedactor(Redactor(env, [])))
    launched.append(proc.tag)
    wait_for("the server's output", lambda: log.exists() and "printed" in log.read_text(), timeout=30)
    text = log.read_text()
    assert secret not in text and "token ${HF_TOKEN}" in text and "${HF_TOKEN} printed" in text, text
    proc.stop(grace_s=0.5)
    assert secret not in log.read_text()


def test_the_server_s_niceness_is_read_at_launch(sshd: Sshd, tmp_path: Path, launched: list[str]) -> None:
    """The server inherits the remote shell's niceness after the setup line (here raised by it):
    the host reports what the server itself reads."""
    h = SSHHost(sshd.url, SSHOptions(**ssh_section(sshd, tmp_path, setup=f"{SETUP}; renice -n 7 -p $$ >/dev/null")))
    log = tmp_path / "n.log"
    proc = h.launch([PYTHON, "-c", "import os, time; print('nice', os.nice(0), flush=True); time.sleep(60)"], {}, log)
    launched.append(proc.tag)
    line = wait_for("the server's niceness", lambda: re.search(r"^nice (-?\d+)$", log.read_text(), re.M), timeout=30)
    assert proc.niceness() == int(line.group(1)) and proc.niceness() > os.getpriority(os.PRIO_PROCESS, 0)
    proc.stop(grace_s=0.5)
    h.close()


def test_a_niced_remote_server_is_recorded_and_said(sshd: Sshd, tmp_path: Path) -> None:
    cfg = write_study(tmp_path, "nicessh", sshd, ssh=ssh_section(sshd, tmp_path, setup=f"{SETUP}; renice -n 7 -p $$ >/dev/null"))
    out = autotune("study", "start", str(cfg), cwd=tmp_path)
    (trial,) = load(tmp_path, "nicessh").trials
    niceness = trial.user_attrs["niceness"]
    assert isinstance(niceness, int) and niceness > 0, trial.user_attrs
    assert f"the server runs at CPU niceness {niceness} on {sshd.url}" in " ".join(out.stderr.split()), out.stderr


@pytest.mark.parametrize(("change", "kind", "text"), [
    ({"workdir": "/nonexistent/autotune"}, "log-unwritable", "does not exist"),
    ({"setup": "false"}, "setup-failed", "setup line failed"),
    ({"python": "no-such-python-autotune"}, "launch-failed", "command not found"),
])
def test_host_problems_are_faults_before_launch(sshd: Sshd, tmp_path: Path, change: dict[str, str], kind: str,
                                                text: str) -> None:
    h = SSHHost(sshd.url, SSHOptions(**{**ssh_section(sshd, tmp_path), **change}))
    try:
        with pytest.raises(HostFault) as raised:
            h.check_launch(tmp_path / "x.log")
            h.launch([h.python, "-c", "pass"], {}, tmp_path / "x.log")
        assert raised.value.kind == kind and text in str(raised.value)
    finally:
        h.close()


def test_an_unreachable_host_is_a_fault(tmp_path: Path) -> None:
    h = SSHHost(f"ssh://nobody@127.0.0.1:{free_port()}", SSHOptions(connect_timeout_s=2))
    with pytest.raises(HostFault) as raised:
        h.check_launch(tmp_path / "x.log")
    assert raised.value.kind == "host-unreachable" and "cannot connect" in str(raised.value)


# -- 6: a dropped session is the environment's fault, whenever it drops -----------------------------
def drop_sessions(sshd: Sshd) -> list[int]:
    """SIGKILL only the per-connection sshd processes of ``sshd`` (the network dropping): what
    the sessions started (shells, the log tail, the server in its own session) is left alone."""
    assert sshd.proc is not None
    killed = []
    for pid in descendants(sshd.proc.pid):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() != "sshd":
                continue
            os.kill(pid, signal.SIGKILL)
        except (OSError, ProcessLookupError):
            continue
        killed.append(pid)
    assert killed, "no sshd session to drop"
    return killed


def running_phase(tmp: Path, name: str) -> tuple[str, str] | None:
    """The study's RUNNING trial's (server tag, phase), once it launched."""
    try:
        study = load(tmp, name)
    except KeyError:
        return None
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        if t.user_attrs.get("server_tag"):
            return str(t.user_attrs["server_tag"]), str(t.user_attrs.get("phase", ""))
    return None


# A load that lasts a few seconds on the simulated host (requests arrive at 4 a second), so that
# the session can be dropped while it runs.
PACED = {"load": {"concurrency": 4, "num_prompts": 16, "input_len": 32, "output_len": 8, "warmup_prompts": 1,
                  "request_rate": 4.0}}


@pytest.mark.parametrize("during", ["launching", "measuring"])
def test_a_session_dropped_mid_trial_is_a_fault_retried_never_the_configuration_s(
        own_sshd: Sshd, tmp_path: Path, launched: list[str], during: str) -> None:
    """Only the SSH session dies (its sshd processes), during start-up or while the load runs;
    the server on the host runs on. The exit status is unknown: the host is asked again, says
    the server still runs, and the trial is a connection-lost fault, run again, its server killed."""
    name = f"session-{during}"
    cfg = write_study(tmp_path, name, own_sshd, load=PACED if during == "measuring" else LOAD)
    driver = subprocess.Popen([sys.executable, "-m", "autotune", "study", "start", str(cfg)], cwd=tmp_path,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        tag, _ = wait_for(f"a trial in phase {during}",
                          lambda: (found := running_phase(tmp_path, name)) and found[1] == during and found)
        launched.append(tag)
        drop_sessions(own_sshd)
        _, err = driver.communicate(timeout=240)
    finally:
        driver.kill()
    assert driver.returncode == 0, err
    trials = show(tmp_path, name)["trials"]
    assert not [t for t in trials if t["outcome"] == "infeasible"], trials
    first, retry = trials
    assert first["state"] == "FAIL" and first["outcome"] == "fault", first
    assert first["failure"]["kind"] == "connection-lost" and "still runs" in first["failure"]["message"], first
    assert retry["params"] == first["params"] and retry["outcome"] == "ok", trials
    attrs = load(tmp_path, name).trials[0].user_attrs
    assert (attrs.get("startup_s") is None) == (during == "launching"), attrs  # before ready, or after it
    assert attrs["server_tag"] == tag
    assert_gone(tag, attrs["port"])  # the teardown reached the host again and killed the server there
    assert not load(tmp_path, name).user_attrs.get("servers_left")
    assert "(baseline: infeasible)" not in err


WAITER = """
import os, sys, time
print("waiting", flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
print("exiting", flush=True)
sys.exit(3)
"""


def test_an_exit_status_is_trusted_only_when_known(own_sshd: Sshd, tmp_path: Path, launched: list[str]) -> None:
    """The session drops; the host, asked again, tells the real status of a server that exited
    meanwhile, and a fault (later polls too) for one that still runs; teardown then kills it."""
    (tmp_path / "waiter.py").write_text(WAITER)
    h = SSHHost(own_sshd.url, SSHOptions(**ssh_section(own_sshd, tmp_path)))
    try:
        procs = []
        for name in ("exits", "runs"):
            proc = h.launch([PYTHON, str(tmp_path / "waiter.py"), str(tmp_path / f"{name}.go")], {},
                            tmp_path / f"{name}.log")
            launched.append(proc.tag)
            wait_for("the server to start", lambda p=proc: "waiting" in p.log_path.read_text(), timeout=30)
            procs.append(proc)
        exits, runs = procs
        assert exits.poll() is None and runs.poll() is None
        drop_sessions(own_sshd)
        (tmp_path / "exits.go").touch()  # exits with 3 while nobody watches
        wait_for("the first server to exit", lambda: not tagged_pids(exits.tag), timeout=30)
        assert wait_for("its exit status", exits.poll, timeout=30) == 3
        with pytest.raises(HostFault) as raised:
            wait_for("the second server's state", runs.poll, timeout=30)
        assert raised.value.kind == "connection-lost" and "still runs" in str(raised.value)
        with pytest.raises(HostFault) as again:
            runs.poll()
        assert again.value.kind == "connection-lost"
        assert tagged_pids(runs.tag)  # only the session dropped: the server runs on
        for proc in procs:
            proc.stop(grace_s=0.5)
        assert tagged_pids(runs.tag) == []
        assert "exiting" in exits.log_path.read_text()  # the rest of its log, fetched at teardown
    finally:
        h.close()
