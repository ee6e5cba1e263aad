"""Bad input, table-driven: every case is one line on stderr naming the problem, exit code 2, no
traceback, and nothing written: no storage file created, an existing one byte-identical, no
artifacts folder.

Each case writes its files into a fresh folder (``{tmp}`` in a file or an argument is that
folder), runs the real command line in-process (``autotune.cli.app.main`` with ``sys.argv`` set; a
few through ``python -m autotune`` to prove the real entry point), and compares every file under
the folder before and after. ``db=True`` starts the case with an existing storage ``t.db`` that
holds studies (see :func:`seeded_db`).
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import stat
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import optuna
import pytest

from tests.helpers.cli import run_in_process

# -- building blocks ----------------------------------------------------------------------------
SPACE = """\
name: tiny
parameters:
  mfs: {type: float, low: 0.5, high: 0.95, step: 0.01, flag: --mem-fraction-static, default: 0.85}
"""

CONFIG = """\
name: t1
target: {engine: sim, scenario: rtx6000-pcie-glm5, hosts: [local], ready_timeout_s: 30}
space: space.yaml
objective: quick
baseline: {mfs: 0.9}
budget: {trials: 1}
storage: sqlite:///{tmp}/t.db
"""

OBJECTIVE = """\
name: obj
metric: output_throughput
direction: maximize
load: {concurrency: 4, num_prompts: 8, input_len: 16, output_len: 4}
"""

BENCH_OBJECTIVE = """\
name: bench
metric: tok_per_s
benchmark: {command: "{python} -c pass --port {port} --out {result_file}", parse: json}
"""

WEIGHTED = OBJECTIVE.replace("metric: output_throughput", "metric: mix") + """\
weighted:
  mix:
    - {metric: p99_ttft_ms, weight: 3}
    - {metric: output_throughput, weight: 1}
"""

MULTI = """\
name: obj
objectives:
  - {metric: output_throughput, direction: maximize}
  - {metric: p99_ttft_ms, direction: minimize}
load: {concurrency: 4, num_prompts: 8, input_len: 16, output_len: 4}
"""

COLLECTIVES = """\
name: coll
metric: mix
direction: minimize
weighted:
  mix:
    - {metric: latency_us@all_reduce@43008, weight: 100}
    - {metric: latency_us@all_reduce@4194304, weight: 4}
benchmark: {command: "{python} -m autotune.benchmarks.collectives --backend gloo --ops all_reduce --sizes 42KB --json {result_file}", parse: collectives}
"""

NONE_CONFIG = """\
name: n1
target: {engine: none}
space: space.yaml
objective: obj.yaml
budget: {trials: 1}
storage: sqlite:///{tmp}/t.db
"""


def cfg(**changes: str | None) -> dict[str, str]:
    """The good config (and its space) with top-level keys replaced (None: removed); values are
    YAML text. The result is the ``files`` of a case."""
    lines = {line.split(":", 1)[0]: line for line in CONFIG.splitlines()}
    for key, value in changes.items():
        if value is None:
            lines.pop(key, None)
        else:
            lines[key] = f"{key}: {value}"
    return {"study.yaml": "\n".join(lines.values()) + "\n", "space.yaml": SPACE}


def target(**changes: str) -> dict[str, str]:
    """The good config with ``target`` keys replaced (YAML flow values)."""
    base = {"engine": "sim", "scenario": "rtx6000-pcie-glm5", "ready_timeout_s": "30"}
    base.update(changes)
    body = ", ".join(f"{k}: {v}" for k, v in base.items() if v != "DROP")
    return cfg(target="{" + body + "}")


def space(params: str, extra: str = "") -> dict[str, str]:
    """The good config with a space holding ``params`` (YAML under ``parameters:``), baseline-free."""
    files = cfg(baseline="{}")
    files["space.yaml"] = "name: s\nparameters:\n" + params + extra
    return files


def objective(text: str) -> dict[str, str]:
    """The good config with ``objective: obj.yaml`` holding ``text``."""
    files = cfg(objective="obj.yaml")
    files["obj.yaml"] = text
    return files


FIFO = b"<a FIFO: made by os.mkfifo>"
"""A file of a case that is made a FIFO (reading one would wait for a writer for ever)."""


@dataclass(frozen=True)
class Case:
    """One bad input: files to write, the command line, and a fragment of the one-line message."""

    id: str
    argv: list[str]
    fragment: str
    files: dict[str, str | bytes] = field(default_factory=dict)
    db: bool = False
    subprocess: bool = False


START = ["study", "start", "study.yaml"]
DEMO = ["study", "start", "--demo", "--storage", "sqlite:///{tmp}/t.db"]
STORE = ["--storage", "sqlite:///{tmp}/t.db"]

CASES: list[Case] = [
    # -- command line usage -------------------------------------------------------------------
    Case("cli-show-no-name", ["study", "show"], "Missing argument 'NAME'", subprocess=True),
    Case("cli-best-no-name", ["study", "best"], "Missing argument 'NAME'"),
    Case("cli-explain-no-name", ["study", "explain"], "usage: autotune study explain"),
    Case("cli-resume-no-name", ["study", "resume"], "Missing argument 'NAME'"),
    Case("cli-unknown-command", ["bogus"], "No such command 'bogus'", subprocess=True),
    Case("cli-unknown-study-command", ["study", "bogus"], "No such command 'bogus'"),
    Case("cli-unknown-option", ["study", "show", "x", "--bogus"], "No such option: --bogus"),
    Case("cli-extra-argument", ["study", "show", "a", "b", *STORE], "unexpected extra argument"),
    Case("cli-trials-negative", [*DEMO, "--trials", "-1"], "'--trials'", subprocess=True),
    Case("cli-trials-zero", [*DEMO, "--trials", "0"], "'--trials'"),
    Case("cli-trials-not-a-number", [*DEMO, "--trials", "many"], "'--trials'"),
    Case("cli-trials-no-value", [*DEMO, "--trials"], "'--trials' requires an argument"),
    Case("cli-seed-not-a-number", [*DEMO, "--seed", "abc"], "'--seed'"),
    Case("cli-seed-negative", [*DEMO, "--seed", "-1"], "seed"),
    Case("cli-seed-too-big", [*DEMO, "--seed", "99999999999"], "seed"),
    Case("cli-config-and-demo", [*START, "--demo"], "give a CONFIG file or --demo", cfg()),
    Case("cli-neither-config-nor-demo", ["study", "start"], "give a CONFIG file or --demo"),
    Case("cli-executor-unknown", [*DEMO, "--executor", "dask"], "executor: Input should be 'serial' or 'ray'"),
    Case("cli-address-without-ray", [*DEMO, "--address", "auto"], "--address is for the Ray executor"),
    Case("cli-address-empty", [*DEMO, "--executor", "ray", "--address", ""], "ray.address"),
    Case("cli-name-empty", [*DEMO, "--name", ""], "name"),
    Case("cli-name-slash", [*DEMO, "--name", "a/b"], "name"),
    Case("cli-name-too-long", [*DEMO, "--name", "x" * 300], "name"),
    Case("cli-baseline-from-no-study", [*START, "--baseline-from", "@x"], "--baseline-from", cfg()),
    Case("cli-baseline-from-empty", [*START, "--baseline-from", ""], "--baseline-from", cfg()),
    Case("cli-baseline-from-no-feasible", [*START, "--baseline-from", "foreign@sqlite:///{tmp}/t.db"],
         "study 'foreign' has no feasible trial", cfg(), db=True),
    Case("cli-baseline-from-missing-study", [*START, "--baseline-from", "ghost"], "no study named 'ghost'", cfg()),
    Case("cli-baseline-from-missing-study-db", [*START, "--baseline-from", "ghost"], "no study named 'ghost'", cfg(), db=True),
    Case("cli-baseline-from-bad-storage", [*START, "--baseline-from", "x@foo://y"], "unknown scheme 'foo'", cfg()),
    Case("cli-dashboard-port-too-big", ["dashboard", *STORE, "--port", "70000"], "--port 70000"),
    Case("cli-dashboard-port-zero", ["dashboard", *STORE, "--port", "0"], "--port 0"),
    Case("cli-dashboard-port-not-a-number", ["dashboard", "--port", "http"], "'--port'"),
    Case("cli-dashboard-empty-host", ["dashboard", *STORE, "--host", ""], "--host"),
    Case("cli-dashboard-bad-storage", ["dashboard", "--storage", "foo://x"], "unknown scheme 'foo'"),
    Case("cli-sim-predict-no-scenario", ["sim", "predict"], "Missing option '--scenario'"),
    Case("cli-sim-predict-unknown-scenario", ["sim", "predict", "--scenario", "nope"], "scenario nope"),
    Case("cli-sim-predict-concurrency-zero", ["sim", "predict", "-s", "rtx6000-pcie-glm5", "--concurrency", "0"], "concurrency"),
    Case("cli-sim-predict-set-no-equals", ["sim", "predict", "-s", "rtx6000-pcie-glm5", "--set", "NCCL_ALGO"], "KEY=VALUE"),
    Case("cli-sim-predict-unknown-flag", ["sim", "predict", "-s", "rtx6000-pcie-glm5", "--set", "--bogus=1"], "unknown server flag"),
    Case("cli-export-bad-format", ["export", "x", "--format", "toml", *STORE], "--format toml"),
    # -- storage ------------------------------------------------------------------------------
    Case("storage-unknown-scheme", [*DEMO, "--storage", "foo://x"], "unknown scheme 'foo'", subprocess=True),
    Case("storage-not-a-url", [*DEMO, "--storage", "autotune.db"], "not a database URL"),
    Case("storage-empty", [*DEMO, "--storage", ""], "not a database URL"),
    Case("storage-in-memory", [*DEMO, "--storage", "sqlite://"], "in-memory"),
    Case("storage-driver-missing", [*DEMO, "--storage", "mssql+pymssql://u@h/db"], "driver"),
    Case("storage-folder-missing", [*DEMO, "--storage", "sqlite:///{tmp}/nope/t.db"], "folder {tmp}/nope does not exist"),
    Case("storage-is-a-folder", [*DEMO, "--storage", "sqlite:///{tmp}/sub"], "is a folder", {"sub/keep": ""}),
    Case("storage-text-file", [*DEMO, "--storage", "sqlite:///{tmp}/notes.txt"], "is not a SQLite database",
         {"notes.txt": "not a database\n" * 4}),
    Case("storage-short-file", [*DEMO, "--storage", "sqlite:///{tmp}/x.db"], "is not a SQLite database", {"x.db": "SQL"}),
    Case("storage-other-program", [*DEMO, "--storage", "sqlite:///{tmp}/other.db"], "another program"),
    Case("storage-show-text-file", ["study", "show", "x", "--storage", "sqlite:///{tmp}/notes.txt"],
         "is not a SQLite database", {"notes.txt": "hello\n" * 10}, subprocess=True),
    Case("storage-list-text-file", ["study", "list", "--storage", "sqlite:///{tmp}/notes.txt"],
         "is not a SQLite database", {"notes.txt": "hello\n" * 10}),
    Case("storage-list-unknown-scheme", ["study", "list", "--storage", "foo://x"], "unknown scheme"),
    Case("storage-config-unknown-scheme", START, "unknown scheme 'bar'", cfg(storage="bar://x")),
    Case("storage-config-folder-missing", START, "does not exist", cfg(storage="sqlite:///{tmp}/a/b/t.db")),
    # -- studies that do not exist ------------------------------------------------------------
    Case("study-show-missing-no-db", ["study", "show", "ghost", *STORE], "no study named 'ghost'"),
    Case("study-best-missing", ["study", "best", "ghost", *STORE], "no study named 'ghost'", db=True),
    Case("study-explain-missing", ["study", "explain", "ghost", *STORE], "(studies: seeded, foreign, stale)", db=True),
    Case("study-resume-missing", ["study", "resume", "ghost", *STORE], "no study named 'ghost'", db=True),
    Case("study-resume-missing-no-db", ["study", "resume", "ghost", *STORE], "no study named 'ghost'"),
    Case("study-resume-not-autotune", ["study", "resume", "foreign", *STORE], "not started by autotune", db=True),
    Case("study-resume-stale-config", ["study", "resume", "stale", *STORE], "scenario 'gone'", db=True),
    Case("study-best-no-feasible", ["study", "best", "foreign", *STORE], "no feasible trial", db=True),
    # -- the study config file ----------------------------------------------------------------
    Case("config-missing", ["study", "start", "nope.yaml"], "not found"),
    Case("config-endless-device", ["study", "start", "/dev/zero"], "/dev/zero: is a character device, not a regular file"),
    Case("config-is-a-folder", ["study", "start", "sub"], "is a folder", {"sub/keep": ""}),
    Case("config-not-utf8", START, "not UTF-8", {"study.yaml": b"name: \xff\xfe t1\n"}),
    Case("config-empty", START, "is empty", {"study.yaml": ""}),
    Case("config-only-comments", START, "is empty", {"study.yaml": "# nothing\n"}),
    Case("config-a-list", START, "got a list", {"study.yaml": "- name: t1\n"}),
    Case("config-a-string", START, "got a string", {"study.yaml": "hello\n"}),
    Case("config-malformed", START, "malformed YAML", {"study.yaml": "name: x\ntarget: {engine: sim\n  scenario: [\n"}),
    Case("config-python-tag", START, "malformed YAML", {"study.yaml": "name: !!python/object:os.system x\n"}),
    Case("config-duplicate-key", START, "duplicate key 'budget'", {**cfg(), "study.yaml": cfg()["study.yaml"] + "budget: {trials: 9}\n"}),
    Case("config-unknown-key", START, "colour: unknown key", cfg(colour="blue")),
    Case("config-nul", START, "NUL", cfg(name='"t\\0x"')),
    Case("config-name-missing", START, "name: Field required", cfg(name=None)),
    Case("config-name-slash", START, "name: String should match pattern", cfg(name="a/b")),
    Case("config-name-number", START, "name: Input should be a valid string", cfg(name="12")),
    Case("config-target-missing", START, "target: Field required", cfg(target=None)),
    Case("config-target-a-list", START, "target: Input should be a valid dictionary", cfg(target="[sim]")),
    Case("config-engine-unknown", START, "target.engine", target(engine="tgi")),
    Case("config-sim-no-scenario", START, "needs a 'scenario'", target(scenario="DROP")),
    Case("config-sim-unknown-scenario", START, "scenario 'nope'", target(scenario="nope"), subprocess=True),
    Case("config-sim-bad-scenario-file", START, "scenario bad.yaml", {**target(scenario="bad.yaml"), "bad.yaml": "gpu: 1\n"}),
    Case("config-scenario-not-sim", START, "only for engine 'sim'", target(engine="vllm", model="m")),
    Case("config-custom-no-command", START, "needs a 'command'", target(engine="custom", scenario="DROP")),
    Case("config-command-unknown-placeholder", START, "target.command: unknown placeholder {foo}",
         target(command="'{python} -m autotune.sim serve --scenario {scenario} --port {port} --x {foo}'")),
    Case("config-command-open-brace", START, "target.command: word '--x={'",
         target(command="'{python} -m autotune.sim serve --port {port} --x={'")),
    Case("config-command-close-brace", START, "Single '}'", target(command="'{python} serve --port {port} }'")),
    Case("config-command-unbalanced-quote", START, "unbalanced quote", target(command="'{python} serve --port {port} \"x'")),
    Case("config-command-no-port", START, "must contain {port}", target(command="'{python} -m autotune.sim serve'")),
    Case("config-command-escaped-port", START, "must contain {port}", target(command="'{python} serve --port {{port}}'")),
    Case("config-command-positional", START, "unknown placeholder {}", target(command="'{python} serve --port {port} {}'")),
    Case("config-command-attribute", START, "unknown placeholder {port.real}", target(command="'serve --port {port.real}'")),
    Case("config-command-empty", START, "target.command", target(engine="custom", scenario="DROP", command="''")),
    Case("config-ready-timeout-negative", START, "target.ready_timeout_s", target(ready_timeout_s="-5")),
    Case("config-ready-timeout-nan", START, "target.ready_timeout_s", target(ready_timeout_s=".nan")),
    Case("config-ready-timeout-inf", START, "target.ready_timeout_s", target(ready_timeout_s=".inf")),
    Case("config-ready-timeout-text", START, "target.ready_timeout_s", target(ready_timeout_s="soon")),
    Case("config-port-low", START, "target.port", target(port="80")),
    Case("config-port-high", START, "target.port", target(port="70000")),
    Case("config-env-bad-name", START, "'1X' is not a valid environment variable name", target(env="{1X: a}")),
    Case("config-env-null", START, "target.env", target(env="{NCCL_ALGO: null}")),
    Case("config-env-list", START, "target.env", target(env="{NCCL_ALGO: [Ring]}")),
    Case("config-env-a-list", START, "target.env", target(env="[NCCL_ALGO]")),
    Case("config-hosts-unknown", START, "host 'gpu1': expected 'local' or ssh://", target(hosts="[gpu1]")),
    Case("config-hosts-ssh-empty", START, "host 'ssh://' is not ssh://[user@]host[:port]", target(hosts="['ssh://']")),
    Case("config-hosts-ssh-path", START, "is not ssh://[user@]host[:port]", target(hosts="['ssh://a@b/x y']")),
    Case("config-hosts-ssh-port", START, "port 99999 is not between 1 and 65535", target(hosts="['ssh://a@b:99999']"),
         subprocess=True),
    Case("config-hosts-ssh-port-text", START, "is not ssh://", target(hosts="['ssh://a@b:ssh']")),
    Case("config-ssh-key-missing", START, "target.ssh.key_filename: key file '{tmp}/nope.key' does not exist",
         target(hosts="['ssh://root@127.0.0.1:22']", ssh="{key_filename: '{tmp}/nope.key'}")),
    Case("config-ssh-known-hosts-missing", START, "known_hosts file '{tmp}/kh' does not exist",
         target(hosts="['ssh://root@127.0.0.1:22']", ssh="{known_hosts: '{tmp}/kh'}")),
    Case("config-ssh-unknown-key", START, "target.ssh.colour: unknown key", target(ssh="{colour: blue}")),
    Case("config-ssh-python-two-words", START, "target.ssh.python", target(ssh="{python: 'python3 -u'}")),
    Case("config-ssh-timeout-zero", START, "target.ssh.connect_timeout_s", target(ssh="{connect_timeout_s: 0}")),
    Case("config-host-gpus-alone", START, "host_gpus needs gpus_per_trial", target(host_gpus="8")),
    Case("config-gpus-per-trial-too-many", START, "gpus_per_trial 16 is more than host_gpus 8",
         target(host_gpus="8", gpus_per_trial="16")),
    Case("config-gpus-per-trial-zero", START, "target.gpus_per_trial", target(gpus_per_trial="0")),
    Case("config-executor-unknown", START, "executor: Input should be 'serial' or 'ray'", cfg(executor="threads")),
    Case("config-ray-unknown-key", START, "ray.adress: unknown key", cfg(executor="ray", ray="{adress: auto}")),
    Case("config-ray-timeout-zero", START, "ray.schedule_timeout_s", cfg(ray="{schedule_timeout_s: 0}")),
    Case("config-quarantine-zero", START, "quarantine_after", cfg(quarantine_after="0")),
    Case("config-none-over-ssh", START, "hosts must be [local]",
         {**objective(BENCH_OBJECTIVE), "study.yaml": NONE_CONFIG.replace("target: {engine: none}",
                                                                         "target: {engine: none, hosts: ['ssh://root@127.0.0.1:22']}")}),
    Case("config-hosts-empty", START, "target.hosts", target(hosts="[]")),
    Case("config-ready-path", START, "target.ready_path", target(ready_path="health")),
    Case("config-secrets-bad", START, "target.secrets", target(secrets="['has space']")),
    Case("config-secrets-not-a-list", START, "target.secrets", target(secrets="HF_TOKEN")),
    Case("config-budget-trials-zero", START, "budget.trials", cfg(budget="{trials: 0}")),
    Case("config-budget-hours-negative", START, "budget.hours", cfg(budget="{hours: -1}")),
    Case("config-budget-hours-inf", START, "budget.hours", cfg(budget="{hours: .inf}")),
    Case("config-sampler-unknown", START, "sampler", cfg(sampler="cmaes")),
    Case("config-seed-text", START, "seed", cfg(seed="abc")),
    Case("config-seed-float", START, "seed", cfg(seed="1.5")),
    Case("config-max-fault-retries-negative", START, "max_fault_retries", cfg(max_fault_retries="-1")),
    Case("config-baseline-unknown-param", START, "unknown parameter 'nope'", cfg(baseline="{nope: 1}")),
    Case("config-baseline-outside", START, "mfs=0.99 is outside [0.5, 0.95]", cfg(baseline="{mfs: 0.99}")),
    Case("config-baseline-nan", START, "mfs=nan", cfg(baseline="{mfs: .nan}")),
    Case("config-baseline-off-grid", START, "not on the grid", cfg(baseline="{mfs: 0.905}")),
    Case("config-baseline-a-list", START, "baseline", cfg(baseline="[0.9]")),
    Case("config-baseline-from-empty", START, "baseline_from.study", cfg(baseline_from="{study: ''}")),
    Case("config-overrides-unknown-key", START, "objective quick: colour: unknown key", cfg(objective_overrides="{colour: 1}")),
    Case("config-overrides-bad-value", START, "load.concurrency", cfg(objective_overrides="{load: {concurrency: 0}}")),
    Case("config-objective-unknown", START, "unknown objective 'nope'", cfg(objective="nope")),
    Case("config-space-unknown", START, "unknown search space 'nope'", cfg(space="nope")),
    Case("config-space-missing-file", START, "not found", cfg(space="gone.yaml")),
    Case("config-space-a-folder", START, "is a folder", {**cfg(space="sub/"), "sub/keep": ""}),
    Case("config-engine-none-no-benchmark", START, "needs a 'benchmark' command",
         {"study.yaml": NONE_CONFIG, "space.yaml": SPACE, "obj.yaml": OBJECTIVE}),
    Case("config-existing-db-untouched", START, "target.command", target(command="'x {port} {bad}'"), db=True),
    # -- search space files -------------------------------------------------------------------
    Case("space-not-utf8", START, "not UTF-8", {**cfg(), "space.yaml": b"name: \xe9t\xe9\nparameters: {}\n"}),
    Case("space-empty", START, "is empty", {**cfg(), "space.yaml": ""}),
    Case("space-a-list", START, "got a list", {**cfg(), "space.yaml": "- mfs\n"}),
    Case("space-no-parameters", START, "at least one parameter", {**cfg(), "space.yaml": "name: s\nparameters: {}\n"}),
    Case("space-parameters-a-list", START, "parameters", {**cfg(), "space.yaml": "parameters: [a, b]\n"}),
    Case("space-duplicate-key", START, "duplicate key 'x'", space("  x: {type: bool, env: A}\n  x: {type: bool, env: B}\n")),
    Case("space-unknown-type", START, "parameters.x.type", space("  x: {type: decimal, low: 0, high: 1, env: X}\n")),
    Case("space-inverted-range", START, "inverted range", space("  x: {type: int, low: 5, high: 1, env: X}\n")),
    Case("space-raise-when-categorical", START, "'raise_when' needs a numeric parameter",
         space("  x: {type: categorical, choices: [a, b], raise_when: queued, env: X}\n")),
    Case("space-raise-when-unknown", START, "parameters.x.raise_when",
         space("  x: {type: int, low: 1, high: 8, raise_when: always, env: X}\n")),
    Case("space-float-step-not-dividing", START, "parameters.x: step 0.1 does not divide the range [0.5, 0.95]",
         space("  x: {type: float, low: 0.5, high: 0.95, step: 0.1, flag: --x}\n"), subprocess=True),
    Case("space-int-step-not-dividing", START, "parameters.x: step 4 does not divide the range [1, 10]",
         space("  x: {type: int, low: 1, high: 10, step: 4, env: X}\n")),
    Case("space-step-negative", START, "'step' must be > 0", space("  x: {type: float, low: 0, high: 1, step: -0.5, env: X}\n")),
    Case("space-int-float-bounds", START, "needs an integer 'high'", space("  x: {type: int, low: 0, high: 2.5, env: X}\n")),
    Case("space-log-with-step", START, "'step' cannot be combined with log scale",
         space("  x: {type: float, low: 0.1, high: 1, log: true, step: 1, env: X}\n")),
    Case("space-step-too-fine", START, "more than 1e+12 values", space("  x: {type: float, low: 0, high: 1000, step: 1.0e-12, env: X}\n")),
    Case("space-float-huge-bounds", START, "float needs bounds within", space("  x: {type: float, low: 0, high: 1.0e+300, env: X}\n")),
    Case("space-name-with-space", START, "name 'a b' must be", space("  a b: {type: bool, env: X}\n")),
    Case("space-log-zero", START, "log scale needs low > 0", space("  x: {type: float, low: 0, high: 1, log: true, env: X}\n")),
    Case("space-low-nan", START, "parameters.x.low", space("  x: {type: float, low: .nan, high: 1, env: X}\n")),
    Case("space-high-inf", START, "parameters.x.high", space("  x: {type: float, low: 0, high: .inf, env: X}\n")),
    Case("space-int-huge", START, "bounds within", space("  x: {type: int, low: 0, high: 1e30, env: X}\n")),
    Case("space-no-range", START, "needs 'low' and 'high'", space("  x: {type: int, env: X}\n")),
    Case("space-choices-empty", START, "non-empty 'choices'", space("  x: {type: categorical, choices: [], env: X}\n")),
    Case("space-choices-duplicate", START, "duplicates", space("  x: {type: categorical, choices: [a, a], env: X}\n")),
    Case("space-choice-nan", START, "not a finite number", space("  x: {type: categorical, choices: [1, .nan], env: X}\n")),
    Case("space-choice-null", START, "choice 2 None", space("  x: {type: categorical, choices: [a, null], env: X}\n")),
    Case("space-choice-nul", START, "NUL", space('  x: {type: categorical, choices: [a, "b\\0"], env: X}\n')),
    Case("space-env-and-flag", START, "exactly one of 'env'", space("  x: {type: bool, env: X, flag: --x}\n")),
    Case("space-flag-no-dash", START, "must start with '-'", space("  x: {type: bool, flag: x}\n")),
    Case("space-env-bad-name", START, "not a valid environment variable name", space("  x: {type: bool, env: 'A-B'}\n")),
    Case("space-default-outside", START, "default 7 is outside", space("  x: {type: int, low: 1, high: 4, env: X, default: 7}\n")),
    Case("space-default-inf", START, "default", space("  x: {type: float, low: 0, high: 1, env: X, default: .inf}\n")),
    Case("space-same-target", START, "applies X like x", space("  x: {type: bool, env: X}\n  y: {type: bool, env: X}\n")),
    Case("space-rule-unknown", START, "unknown parameter 'z'", space("  x: {type: int, low: 1, high: 4, env: X}\n", "rules: ['x <= z']\n")),
    Case("space-rule-malformed", START, "expected 'A <= B'", space("  x: {type: int, low: 1, high: 4, env: X}\n", "rules: ['x << 3']\n")),
    Case("space-rule-never-holds", START, "can never hold", space(
        "  x: {type: int, low: 5, high: 9, env: X}\n  y: {type: int, low: 1, high: 4, env: Y}\n", "rules: ['x <= y']\n")),
    Case("space-companion-both", START, "exactly one of 'flag' or 'env'", space(
        "  x: {type: int, low: 1, high: 4, flag: --x, companions: [{flag: --y, env: Y}]}\n")),
    # -- objective files ----------------------------------------------------------------------
    Case("objective-not-utf8", START, "not UTF-8", {**cfg(objective="obj.yaml"), "obj.yaml": b"\x80metric: x\n"}),
    Case("objective-a-list", START, "got a list", objective("- metric\n")),
    Case("objective-bench-unknown-placeholder", START, "benchmark.command: unknown placeholder {prot}",
         objective(BENCH_OBJECTIVE.replace("{port}", "{prot}"))),
    Case("objective-bench-unbalanced-quote", START, "benchmark.command: cannot split",
         objective(BENCH_OBJECTIVE.replace("-c pass", "-c 'pass"))),
    Case("objective-bench-unbalanced-brace", START, "benchmark.command: word '{result_file'",
         objective(BENCH_OBJECTIVE.replace("{result_file}", "{result_file"))),
    Case("objective-bench-scenario-placeholder", START, "unknown placeholder {scenario}",
         objective(BENCH_OBJECTIVE.replace("{port}", "{scenario}"))),
    Case("objective-bench-parse-unknown", START, "benchmark.parse", objective(BENCH_OBJECTIVE.replace("parse: json", "parse: csv"))),
    Case("objective-bench-json-path-nccl", START, "json_path does not apply",
         objective(BENCH_OBJECTIVE.replace("parse: json", "parse: nccl-tests, json_path: a.b"))),
    Case("objective-bench-timeout-negative", START, "benchmark.timeout_s",
         objective(BENCH_OBJECTIVE.replace("parse: json", "parse: json, timeout_s: -1"))),
    Case("objective-constraint-malformed", START, "constraint 'p99_ttft_ms < 5'", objective(OBJECTIVE + "constraints: ['p99_ttft_ms < 5']\n")),
    Case("objective-constraint-two-dots", START, "constraint 'p99_ttft_ms <= 1.2.3'", objective(OBJECTIVE + "constraints: ['p99_ttft_ms <= 1.2.3']\n")),
    Case("objective-constraint-infinite", START, "constraint 'p99_ttft_ms <= 1e999'", objective(OBJECTIVE + "constraints: ['p99_ttft_ms <= 1e999']\n")),
    Case("objective-constraint-unknown-metric", START, "measures no 'p99_ttf_ms'", objective(OBJECTIVE + "constraints: ['p99_ttf_ms <= 5']\n")),
    Case("objective-metric-unknown", START, "metric: the load generator measures no 'throughput'",
         objective(OBJECTIVE.replace("output_throughput", "throughput"))),
    Case("objective-direction", START, "direction", objective(OBJECTIVE.replace("maximize", "up"))),
    Case("objective-concurrency-zero", START, "load.concurrency", objective(OBJECTIVE.replace("concurrency: 4", "concurrency: 0"))),
    Case("objective-concurrency-huge", START, "load.concurrency", objective(OBJECTIVE.replace("concurrency: 4", "concurrency: 1000000000000"))),
    Case("objective-request-rate-nan", START, "load.request_rate", objective(OBJECTIVE.replace("output_len: 4", "output_len: 4, request_rate: .nan"))),
    Case("objective-failed-fraction", START, "load.max_failed_fraction", objective(OBJECTIVE.replace("output_len: 4", "output_len: 4, max_failed_fraction: 2"))),
    # -- weighted metrics, several loads, several objectives ---------------------------------------
    Case("objective-weighted-negative-weight", START, "weighted.mix.0.weight: Input should be greater than 0",
         objective(WEIGHTED.replace("weight: 3", "weight: -3"))),
    Case("objective-weighted-zero-weight", START, "weighted.mix.1.weight: Input should be greater than 0",
         objective(WEIGHTED.replace("weight: 1}", "weight: 0}"))),
    Case("objective-weighted-no-terms", START, "'mix' has no terms", objective(OBJECTIVE.replace(
        "metric: output_throughput", "metric: mix\nweighted: {mix: []}"))),
    Case("objective-weighted-unknown-metric", START, "weighted: 'mix': the load generator measures no 'p99_tft_ms'",
         objective(WEIGHTED.replace("metric: p99_ttft_ms", "metric: p99_tft_ms"))),
    Case("objective-weighted-term-twice", START, "'mix' lists p99_ttft_ms twice",
         objective(WEIGHTED.replace("output_throughput, weight: 1", "p99_ttft_ms, weight: 1"))),
    Case("objective-weighted-shadows-a-metric", START, "'output_throughput' is a metric the load generator measures",
         objective(OBJECTIVE + "weighted: {output_throughput: [{metric: p99_ttft_ms, weight: 1}]}\n")),
    Case("objective-weighted-of-weighted", START, "term 'mix' is a weighted metric itself",
         objective(WEIGHTED + "  mix2: [{metric: mix, weight: 1}]\n")),
    Case("objective-weighted-bad-name", START, "'a b' is not a metric name",
         objective(OBJECTIVE + "weighted: {'a b': [{metric: p99_ttft_ms, weight: 1}]}\n")),
    Case("objective-collectives-size-not-measured", START,
         "the collectives benchmark (ops all_reduce, sizes 43008 B) measures no 'latency_us@all_reduce@4194304'",
         objective(COLLECTIVES)),
    Case("objective-loads-empty", START, "loads: List should have at least 1 item", objective(OBJECTIVE.replace(
        "load: {concurrency: 4, num_prompts: 8, input_len: 16, output_len: 4}", "loads: []"))),
    Case("objective-loads-and-load", START, "give either load or loads, not both",
         objective(OBJECTIVE + "loads: [{name: a}]\n")),
    Case("objective-loads-name-twice", START, "loads: the name a is used twice", objective(OBJECTIVE.replace(
        "load: {concurrency: 4, num_prompts: 8, input_len: 16, output_len: 4}", "loads: [{name: a}, {name: a}]"))),
    Case("objective-loads-negative-weight", START, "loads.0.weight: Input should be greater than 0",
         objective(OBJECTIVE.replace("load: {concurrency: 4, num_prompts: 8, input_len: 16, output_len: 4}",
                                     "loads: [{name: a, weight: -1}]"))),
    Case("objective-loads-unknown-load", START, "measures no 'b/p99_ttft_ms'", objective(OBJECTIVE.replace(
        "load: {concurrency: 4, num_prompts: 8, input_len: 16, output_len: 4}",
        "loads: [{name: a}]\nconstraints: ['b/p99_ttft_ms <= 100']"))),
    Case("objective-loads-with-benchmark", START, "loads: are run by the built-in load generator",
         objective(BENCH_OBJECTIVE + "loads: [{name: a}]\n")),
    Case("objective-objectives-one", START, "objectives: List should have at least 2 items",
         objective("objectives: [{metric: output_throughput, direction: maximize}]\n")),
    Case("objective-objectives-and-metric", START, "give either objectives or metric, not both",
         objective(MULTI + "metric: output_throughput\n")),
    Case("objective-objectives-twice", START, "objectives: output_throughput is listed twice",
         objective(MULTI.replace("p99_ttft_ms, direction: minimize", "output_throughput, direction: minimize"))),
    Case("objective-objectives-unknown-metric", START, "objectives.1.metric: the load generator measures no 'p99_ttf_ms'",
         objective(MULTI.replace("p99_ttft_ms", "p99_ttf_ms"))),
    Case("objective-objectives-no-direction", START, "objectives.1.direction: Field required",
         objective(MULTI.replace(", direction: minimize", ""))),
    Case("objective-choose-single", START, "choose: applies to a multi-objective study",
         objective(OBJECTIVE + "choose: {rule: knee}\n")),
    Case("objective-choose-unknown-rule", START, "choose.rule", objective(MULTI + "choose: {rule: best}\n")),
    Case("objective-choose-bound-on-first", START, "choose.bounds: 'output_throughput' is not one of the objectives after the first",
         objective(MULTI + "choose: {bounds: {output_throughput: 100}}\n")),
    Case("objective-choose-negative-tolerance", START, "choose.tolerance", objective(MULTI + "choose: {tolerance: -0.1}\n")),
    Case("export-choose-unknown-rule", ["export", "seeded", "--format", "sh", "--choose", "best", *STORE],
         "--choose: unknown rule 'best'", db=True),
    Case("export-choose-bad-tolerance", ["export", "seeded", "--format", "sh", "--choose", "bound:x", *STORE],
         "the tolerance 'x' is not a number", db=True),
    Case("export-choose-single-objective", ["export", "seeded", "--format", "sh", "--choose", "knee", *STORE],
         "--choose picks from a multi-objective study's Pareto front; study 'seeded' has one objective", db=True),
    Case("export-choose-and-trial", ["export", "seeded", "--format", "sh", "--choose", "knee", "--trial", "0", *STORE],
         "give --choose or --trial, not both", db=True),
    Case("export-trial-not-measured", ["export", "seeded", "--format", "sh", "--trial", "7", *STORE],
         "--trial 7: study 'seeded' has no measured trial 7 (measured: 0)", db=True),
    Case("bench-tuner-multi-objective", ["bench", "tuner", "--objective", "obj.yaml", "--trials", "2", "--seeds", "1"],
         "objective obj has 2 objectives: the tuner benchmark compares strategies on one objective",
         {"obj.yaml": MULTI.replace("p99_ttft_ms", "mean_ttft_ms")}),
    # -- files that are not regular files, and where -o writes (autotune.util.files) --------------
    Case("config-fifo", START, "study.yaml: is a FIFO, not a regular file", {**cfg(), "study.yaml": FIFO}),
    Case("space-fifo", START, "space.yaml: is a FIFO", {**cfg(), "space.yaml": FIFO}),
    Case("objective-fifo", START, "obj.yaml: is a FIFO", {**cfg(objective="obj.yaml"), "obj.yaml": FIFO}),
    Case("storage-fifo", [*DEMO[:-2], "--storage", "sqlite:///{tmp}/q.db"], "q.db is a FIFO, not a database file",
         {"q.db": FIFO}),
    Case("verify-endless-device", ["verify", "/dev/zero"], "profile /dev/zero: is a character device, not a regular file"),
    Case("verify-fifo", ["verify", "p.sh"], "profile p.sh: is a FIFO, not a regular file", {"p.sh": FIFO}),
    Case("verify-too-large", ["verify", "big.json"], "too large (at most 4 MiB)", {"big.json": "{}" + " " * (4 << 20)}),
    Case("export-o-device", ["export", "seeded", "--format", "sh", "-o", "/dev/full", *STORE],
         "-o /dev/full: is a character device; only a regular file is written", db=True),
    Case("report-o-device", ["report", "seeded", "-o", "/dev/null", *STORE], "-o /dev/null: is a character device",
         db=True),
    Case("export-o-fifo", ["export", "seeded", "--format", "env", "-o", "out.env", *STORE], "-o out.env: is a FIFO",
         {"out.env": FIFO}, db=True),
    Case("report-o-fifo", ["report", "seeded", "-o", "r.html", *STORE], "-o r.html: is a FIFO", {"r.html": FIFO},
         db=True),
    Case("export-o-trailing-slash", ["export", "seeded", "--format", "sh", "-o", "newdir/", *STORE],
         "-o newdir/: names a folder; give a file name", db=True),
    Case("report-o-trailing-slash-existing", ["report", "seeded", "-o", "sub/", *STORE], "-o sub/: names a folder",
         {"sub/keep": ""}, db=True),
    Case("report-o-folder", ["report", "seeded", "-o", "sub", *STORE], "-o sub: is a folder", {"sub/keep": ""}, db=True),
    Case("export-o-folder-missing", ["export", "seeded", "--format", "sh", "-o", "nope/p.sh", *STORE],
         "folder nope does not exist", db=True),
    # -- strict types: nothing coerced ----------------------------------------------------------
    Case("config-budget-trials-true", START, "budget.trials: Input should be a valid integer", cfg(budget="{trials: true}")),
    Case("config-budget-trials-text", START, "budget.trials: Input should be a valid integer", cfg(budget="{trials: '1'}")),
    Case("config-budget-trials-float", START, "budget.trials: Input should be a valid integer", cfg(budget="{trials: 1.0}")),
    Case("config-seed-true", START, "seed: Input should be a valid integer", cfg(seed="true")),
    Case("config-load-concurrency-true", START, "load.concurrency: Input should be a valid integer",
         cfg(objective_overrides="{load: {concurrency: true}}")),
    Case("config-load-prompts-text", START, "load.num_prompts: Input should be a valid integer",
         cfg(objective_overrides="{load: {num_prompts: '8'}}")),
    Case("config-seed-quoted-number", START, "seed: Input should be a valid integer", cfg(seed="'7'")),
    Case("config-retries-false", START, "max_fault_retries: Input should be a valid integer", cfg(max_fault_retries="false")),
    Case("config-port-text", START, "target.port: Input should be a valid integer", target(port="'8000'")),
    Case("config-timeout-true", START, "target.ready_timeout_s: Input should be a valid number", target(ready_timeout_s="true")),
    Case("config-accept-key-text", START, "target.ssh.accept_unknown_host_key: Input should be a valid boolean",
         target(ssh="{accept_unknown_host_key: 'yes'}")),
    Case("config-confirm-float", START, "budget.confirm.candidates", cfg(budget="{trials: 2, confirm: {candidates: 2.0}}")),
    # -- categorical choices equal as values ------------------------------------------------------
    Case("space-choices-int-and-true", START, "'choices' 1 and true are equal as values",
         space("  x: {type: categorical, choices: [1, true], env: X}\n")),
    Case("space-choices-int-and-float", START, "'choices' 1 and 1.0 are equal as values",
         space("  x: {type: categorical, choices: [1, 1.0], env: X}\n")),
    Case("space-choices-zero-and-false", START, "'choices' false and 0 are equal",
         space("  x: {type: categorical, choices: [false, 2, 0], env: X}\n")),
    # -- SQLite URLs with options -------------------------------------------------------------------
    Case("storage-sqlite-query", [*DEMO[:-2], "--storage", "sqlite:///{tmp}/t.db?mode=ro"],
         "SQLite URL options (?mode=ro) are not taken"),
    Case("storage-sqlite-uri", [*DEMO[:-2], "--storage", "sqlite:///file:{tmp}/t.db?mode=ro&uri=true"],
         "SQLite URL options (?mode=ro&uri=true) are not taken"),
    Case("storage-config-sqlite-query", START, "SQLite URL options (?timeout=5)", cfg(storage="'sqlite:///{tmp}/t.db?timeout=5'"),
         db=True),
    # -- the dashboard's address ----------------------------------------------------------------------
    Case("cli-dashboard-host-unknown", ["dashboard", *STORE, "--host", "no-such-host.invalid"],
         "--host no-such-host.invalid: not a name or address to listen on"),
    Case("cli-dashboard-host-not-mine", ["dashboard", *STORE, "--host", "192.0.2.1"],
         "--host 192.0.2.1: cannot listen there"),
]


# -- the seeded storage -----------------------------------------------------------------------
@pytest.fixture(scope="session")
def seeded_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A storage holding ``seeded`` (an autotune study with one trial), ``foreign`` (made by plain
    Optuna: no stored config) and ``stale`` (a stored config this version rejects)."""
    path = tmp_path_factory.mktemp("seed") / "t.db"
    storage = optuna.storages.RDBStorage(f"sqlite:///{path}")
    seeded = optuna.create_study(study_name="seeded", storage=storage, direction="maximize")
    seeded.set_user_attr("config", {"name": "seeded", "target": {"engine": "sim", "scenario": "rtx6000-pcie-glm5"}})
    seeded.set_user_attr("objective", {"name": "quick", "metric": "output_throughput"})
    seeded.add_trial(optuna.trial.create_trial(
        params={"mfs": 0.9}, distributions={"mfs": optuna.distributions.FloatDistribution(0.5, 0.95, step=0.01)},
        value=100.0, user_attrs={"outcome": "ok", "feasible": True, "applied": {"mfs": 0.9}}))
    optuna.create_study(study_name="foreign", storage=storage)
    stale = optuna.create_study(study_name="stale", storage=storage)
    stale.set_user_attr("config", {"name": "stale", "target": {"engine": "sim", "scenario": "gone"}})
    storage.engine.dispose()
    return path


def _write(tmp: Path, files: dict[str, str | bytes]) -> None:
    for rel, content in files.items():
        dest = tmp / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        if content is FIFO:
            os.mkfifo(dest)
        elif isinstance(content, bytes):
            dest.write_bytes(content)
        else:
            dest.write_text(content.replace("{tmp}", str(tmp)))


def _snapshot(tmp: Path) -> dict[str, bytes]:
    def content(p: Path) -> bytes:
        if p.is_file():
            return p.read_bytes()
        return b"<fifo>" if stat.S_ISFIFO(p.lstat().st_mode) else b"<dir>"

    return {str(p.relative_to(tmp)): content(p) for p in sorted(tmp.rglob("*"))}


def _prepare(case: Case, tmp: Path, seeded_db: Path) -> list[str]:
    _write(tmp, case.files)
    if case.db:
        shutil.copy(seeded_db, tmp / "t.db")
    if case.id == "storage-other-program":
        with sqlite3.connect(tmp / "other.db") as conn:
            conn.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL)")
        conn.close()
    return [a.replace("{tmp}", str(tmp)) for a in case.argv]


def _check(case: Case, tmp: Path, code: object, stderr: str, before: dict[str, bytes]) -> None:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert code == 2, f"exit {code!r}, stderr:\n{stderr}"
    assert "Traceback" not in stderr
    assert len(lines) == 1, f"expected one line, got:\n{stderr}"
    assert lines[0].startswith(("autotune: error: ", "autotune sim: error: ")), lines[0]
    assert case.fragment.replace("{tmp}", str(tmp)) in lines[0], lines[0]
    after = _snapshot(tmp)
    assert sorted(after) == sorted(before), f"files created or removed: {set(after) ^ set(before)}"
    changed = [k for k in after if after[k] != before[k]]
    assert not changed, f"files changed: {changed}"
    assert not (tmp / "autotune-artifacts").exists()
    for device in ("/dev/full", "/dev/null", "/dev/zero"):  # never replaced by a regular file
        assert stat.S_ISCHR(os.stat(device).st_mode), device


def test_corpus_is_large_and_ids_unique() -> None:
    assert len(CASES) >= 90
    assert len({c.id for c in CASES}) == len(CASES)
    assert 4 <= sum(c.subprocess for c in CASES) <= 8


@pytest.mark.parametrize("case", [c for c in CASES if not c.subprocess], ids=lambda c: c.id)
def test_bad_input_in_process(case: Case, tmp_path: Path, seeded_db: Path, capsys: pytest.CaptureFixture[str],
                              monkeypatch: pytest.MonkeyPatch) -> None:
    argv = _prepare(case, tmp_path, seeded_db)
    before = _snapshot(tmp_path)
    monkeypatch.chdir(tmp_path)
    code, _, err = run_in_process(argv, capsys, monkeypatch)
    _check(case, tmp_path, code, err, before)


@pytest.mark.parametrize("case", [c for c in CASES if c.subprocess], ids=lambda c: c.id)
def test_bad_input_real_entry_point(case: Case, tmp_path: Path, seeded_db: Path) -> None:
    argv = _prepare(case, tmp_path, seeded_db)
    before = _snapshot(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "autotune", *argv], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    _check(case, tmp_path, proc.returncode, proc.stderr, before)


# -- what is not an error ---------------------------------------------------------------------
@pytest.mark.parametrize("argv", [["--help"], ["study", "--help"], ["study", "show", "--help"]])
def test_help_exits_0(argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, err = run_in_process(argv, capsys, monkeypatch)
    assert code == 0 and "Usage" in out and not err


@pytest.mark.parametrize("argv", [[], ["study"], ["sim"]])
def test_bare_group_prints_help(argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, err = run_in_process(argv, capsys, monkeypatch)
    assert code == 0 and "Usage" in out and "Traceback" not in err


def test_show_of_a_missing_storage_creates_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = run_in_process(["study", "list", "--json"], capsys, monkeypatch)
    assert code == 0 and out.strip() == "[]", err
    assert list(tmp_path.iterdir()) == []


def test_markup_in_values_is_shown_as_written(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Values such as ``[/x]`` or ``[bold]`` are user data, never rich markup (which would raise)."""
    url = f"sqlite:///{tmp_path}/m.db"
    study = optuna.create_study(study_name="[bold]m", storage=url, direction="maximize")
    dist = optuna.distributions.CategoricalDistribution(["[/x]", "[bold]"])
    study.set_user_attr("objective", {"metric": "[red]tput"})
    study.add_trial(optuna.trial.create_trial(
        params={"p": "[/x]"}, distributions={"p": dist}, value=3.0,
        user_attrs={"outcome": "ok", "feasible": True, "applied": {"p": "[/x]"}, "baseline": True}))
    study.add_trial(optuna.trial.create_trial(
        params={"p": "[bold]"}, distributions={"p": dist}, state=optuna.trial.TrialState.PRUNED,
        user_attrs={"outcome": "infeasible", "feasible": False, "applied": {"p": "[bold]"},
                    "failure_kind": "[/crash]", "failure_message": "[/y] died", "failure_excerpt": "[/z]"}))
    for argv in (["study", "show", "[bold]m"], ["study", "best", "[bold]m"], ["study", "list"], ["study", "explain", "[bold]m"]):
        code, out, err = run_in_process([*argv, "--storage", url], capsys, monkeypatch)
        assert code == 0, err
        assert "[bold]m" in out or argv[1] in ("show", "best"), out
    code, out, err = run_in_process(["study", "show", "[bold]m", "--storage", url], capsys, monkeypatch)
    for text in ("p=[/x]", "p=[bold]", "[/crash]", "[/y] died", "[/z]"):
        assert text in out, out


@pytest.mark.parametrize("terminal", [False, True])
def test_progress_shows_markup_as_written(tmp_path: Path, terminal: bool) -> None:
    """The live reporter of ``study start`` prints names, values and messages as text."""
    import io

    from rich.console import Console

    from autotune.outcome.failures import Failure
    from autotune.study.progress import ConsoleReporter
    from autotune.execution.trial import TrialResult

    buf = io.StringIO()
    reporter = ConsoleReporter(Console(file=buf, force_terminal=terminal, width=200), metric="[red]m")
    study = optuna.create_study(study_name="s", storage=f"sqlite:///{tmp_path}/p.db", direction="maximize")
    reporter.study_started("[bold]s", 0, 2)
    reporter.trial_started(0, {"p": "[/x]", "q": "[bold]"}, True)
    reporter.phase(0, "[/phase]", "[/detail]")
    reporter.trial_finished(TrialResult(0, "ok", metrics={"m": 1.0}, duration_s=1.0), 1.0, 1.0)
    reporter.trial_started(1, {"p": "[bold]"}, False)
    failure = Failure("crash", "[/kind] [/message] x", "[/excerpt]")
    reporter.trial_finished(TrialResult(1, "infeasible", failure=failure, duration_s=1.0), None, 1.0)
    reporter.study_finished(study, "[/reason] stopped")
    text = buf.getvalue()
    for shown in ("study [bold]s", "p=[/x] q=[bold]", "[/kind]", "[/message] x", "[/reason] stopped"):
        assert shown in text, text


def test_study_start_with_markup_choices(tmp_path: Path) -> None:
    """End to end on the simulated host: a categorical choice ``[/x]`` runs, shows and lists."""
    (tmp_path / "space.yaml").write_text(SPACE + '  NCCL_X: {type: categorical, choices: ["[/x]", "[bold]"], '
                                         'env: NCCL_DEBUG_SUBSYS, default: "[/x]"}\n')
    (tmp_path / "study.yaml").write_text(CONFIG.replace("{tmp}", str(tmp_path)).replace("name: t1", "name: m"))
    proc = subprocess.run([sys.executable, "-m", "autotune", "study", "start", "study.yaml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "NCCL_X=[/x]" in proc.stdout + proc.stderr
    show = subprocess.run([sys.executable, "-m", "autotune", "study", "show", "m", "--storage", f"sqlite:///{tmp_path}/t.db"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert show.returncode == 0 and "NCCL_X=[/x]" in show.stdout, show.stderr


def test_dashboard_serves_a_new_storage(tmp_path: Path) -> None:
    """optuna-dashboard opens a URL without creating tables; ``autotune dashboard`` hands it an
    opened storage, so a storage that does not exist yet is served (it used to crash)."""
    import socket
    import time
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "autotune", "dashboard", "--port", str(port),
                             "--storage", f"sqlite:///{tmp_path}/new.db"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        status = None
        for _ in range(300):  # a bound on the wait, not a timing assertion
            if proc.poll() is not None:
                break
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies", timeout=2) as resp:
                    status = resp.status
                break
            except OSError:
                time.sleep(0.2)
        assert status == 200, proc.stdout.read() if proc.poll() is not None else "no answer"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_dashboard_on_a_port_in_use_is_one_line_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A port another process listens on is the machine's state, not bad input: one line, exit 1,
    and nothing created (no storage, no artifact folder)."""
    import socket

    monkeypatch.chdir(tmp_path)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        code, _, err = run_in_process(["dashboard", "--port", str(port), *STORE[:1], f"sqlite:///{tmp_path}/d.db"],
                                      capsys, monkeypatch)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 1 and len(lines) == 1, err
    assert lines[0] == f"autotune: error: --port {port}: already in use on 127.0.0.1 (another process listens there); give another --port"
    assert list(tmp_path.iterdir()) == []


def test_a_resumed_study_keeps_the_trials_of_its_start(tmp_path: Path) -> None:
    """``study start --trials 1`` is stored with the study: a ``resume`` without --trials stops at
    once (budget reached), not at the config's budget; ``resume --trials 2`` runs one more."""
    from tests.helpers.cli import autotune

    url = f"sqlite:///{tmp_path}/t.db"
    autotune("study", "start", "--demo", "--trials", "1", "--storage", url, cwd=tmp_path)
    again = autotune("study", "resume", "demo", "--storage", url, cwd=tmp_path)
    assert "budget reached: 1 trial" in again.stderr, again.stderr
    study = optuna.load_study(study_name="demo", storage=url)
    assert study.user_attrs["config"]["budget"]["trials"] == 1
    assert len(study.trials) == 1
    autotune("study", "resume", "demo", "--trials", "2", "--storage", url, cwd=tmp_path)
    assert len(optuna.load_study(study_name="demo", storage=url).trials) == 2
