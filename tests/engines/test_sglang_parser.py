"""The sglang_nccl space against SGLang's own server-argument parser (issue 8, item 8).

Every flag and companion the space can emit is rendered as a trial renders it (the space's
``to_launch`` after the sglang preset's command) and handed to ``prepare_server_args``, the
function ``python -m sglang.launch_server`` calls on its argv: the argparse parser that
``ServerArgs.add_cli_args`` builds, then ``ServerArgs.from_cli_args``. A rejected flag or value
ends that parser with SystemExit. A flag must also be one of the parser's own option strings:
argparse takes any unambiguous prefix of an option, so a flag that SGLang dropped could otherwise
still be read as a longer one.

Resolution (``ServerArgs.resolve_once``) is not run. With ``--model-path dummy`` it stops before
the memory, speculative and CUDA-graph checks. Even that import chain needs a torchvision built
for the installed torch, and no CPU build of it can be installed here.

SGLang is imported in a child process. Importing it patches transformers and sets cache env
vars, and ``prepare_server_args`` reconfigures the root logger, so none of that reaches the other
tests. SGLang installs on the CPU machine without its GPU dependencies (see SGLANG_INSTALL).
The test is skipped without it, but not under CI (env var CI set), where it is installed and
its absence is a failure.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import optuna
import pytest

from autotune.engines import get_preset
from autotune.config.space import UNSET, Parameter, ParamValue, SearchSpace
from tests.needs import unavailable

pytestmark = pytest.mark.engine

SPACE = "sglang_nccl"
# What `python -m sglang.launch_server` needs to build its parser on a CPU-only machine: the
# package without its GPU dependencies, then the modules its import reaches.
SGLANG_INSTALL = ("pip install --no-deps 'sglang==0.5.23' && pip install 'torch==2.13.0' triton orjson pybase64 "
                  "msgspec pyzmq ipython pillow starlette tqdm packaging")
PROBE_TIMEOUT_S = 180

# Runs in the child: builds SGLang's parser once, then parses each argv with prepare_server_args.
_PROBE = r"""
import argparse, contextlib, io, json, sys
from sglang.srt.server_args import ServerArgs, prepare_server_args
import sglang

request = json.load(sys.stdin)
parser = argparse.ArgumentParser()
ServerArgs.add_cli_args(parser)
options = {opt: action.dest for action in parser._actions for opt in action.option_strings}
dests = sorted(set(options.values()))
results = []
for argv in request["argvs"]:
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            args = prepare_server_args(list(argv))
    except SystemExit as exc:
        results.append({"ok": False, "error": out.getvalue().strip().splitlines()[-1:], "code": str(exc.code)})
        continue
    results.append({"ok": True, "values": {d: getattr(args, d) for d in dests if hasattr(args, d)}})
with open(request["out"], "w") as f:
    json.dump({"version": sglang.__version__, "options": options, "results": results}, f, default=repr)
"""


def _require_sglang(why: str) -> None:
    unavailable(why)


# -- argv rendering with the project's own code ------------------------------------------------
_space = SearchSpace.load(SPACE)
_preset = get_preset("sglang")


def _server_argv(launch_args: list[str]) -> list[str]:
    """The argv `python -m sglang.launch_server` receives for a trial: the preset's words after
    the module name, then the trial's flags, as the runner appends them."""
    words = _preset.argv(port=30000, fields={"model": "dummy"}) + list(launch_args)
    assert words[1:3] == ["-m", "sglang.launch_server"], f"the sglang preset no longer runs the launcher: {words}"
    return words[3:]


_BASE_ARGV = _server_argv([])


def _values(p: Parameter) -> list[ParamValue]:
    """Values to try for one parameter: its range's ends, its default, a value inside the range,
    every choice (``unset`` and the ones that turn companions on)."""
    if p.type == "bool":
        return [False, True]
    if p.type == "categorical":
        assert p.choices is not None
        return list(p.choices)
    assert p.low is not None and p.high is not None
    lo, hi = p.low, p.high
    if p.log:
        mid = (lo * hi) ** 0.5
    else:
        mid = lo + (hi - lo) / 3
    if p.step is not None and not p.log:
        mid = lo + round((mid - lo) / p.step) * p.step
    values = [lo, hi, mid] + ([p.default] if p.default is not None else [])
    out: list[ParamValue] = []
    for v in values:
        nv = p.normalise(round(v) if p.type == "int" else v)
        if p.out_of_range(nv) is None and nv not in out:
            out.append(nv)
    return out


def _flag_cases() -> list[tuple[str, ParamValue]]:
    return [(name, v) for name, p in _space.parameters.items() if p.flag is not None for v in _values(p)]


def _alone(name: str, value: ParamValue) -> list[str]:
    """The flags this parameter alone adds to a launch (with its companions), rendered by the
    space's own to_launch, and checked to be those of the full trial launch."""
    own = SearchSpace(_space.name, {name: _space.parameters[name]}, []).to_launch({name: value}).args
    full = _space.to_launch(_space.complete({name: value}, what="case")).args
    n = len(own)
    assert any(full[i:i + n] == own for i in range(len(full) - n + 1)), (own, full)
    return own


def _extreme(which: str) -> dict[str, ParamValue]:
    """Every parameter at one end: 'low' or 'high' of a range, the first or last choice."""
    out: dict[str, ParamValue] = {}
    for name, p in _space.parameters.items():
        if p.type == "categorical":
            assert p.choices is not None
            out[name] = p.choices[0] if which == "low" else p.choices[-1]
        elif p.type == "bool":
            out[name] = which == "high"
        else:
            out[name] = p.normalise(p.low if which == "low" else p.high)
    return out


def _whole_launches() -> dict[str, tuple[list[str], dict[str, ParamValue]]]:
    """Whole trial launches, as (argv, applied values): the defaults (what a baseline that names
    nothing runs), every parameter at its low end, at its high end, and trials Optuna samples."""
    values = {
        "defaults": _space.complete({}),
        "all-low": _space.complete(_extreme("low")),
        "all-high": _space.complete(_extreme("high")),
    }
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=8))
    for i in range(12):
        values[f"sampled-{i}"] = _space.suggest(study.ask())
    out = {}
    for case, v in values.items():
        launch = _space.to_launch(v)
        out[case] = (_server_argv(launch.args), launch.applied)
    return out


FLAG_CASES = _flag_cases()
CASE_ARGVS = {(name, value): _server_argv(_alone(name, value)) for name, value in FLAG_CASES}
WHOLE_LAUNCHES = _whole_launches()


# -- running SGLang's parser -------------------------------------------------------------------
@pytest.fixture(scope="module")
def sglang_parser(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """SGLang's verdict on every argv of this module, from one child process:
    ``{"version", "options": {option string: dest}, "parsed": {argv tuple: result}}``."""
    if importlib.util.find_spec("sglang") is None:
        _require_sglang(f"sglang not installed: {SGLANG_INSTALL}")
    argvs = [_BASE_ARGV, *CASE_ARGVS.values(), *(argv for argv, _ in WHOLE_LAUNCHES.values())]
    out = tmp_path_factory.mktemp("sglang") / "verdicts.json"
    proc = subprocess.run([sys.executable, "-c", _PROBE], input=json.dumps({"argvs": argvs, "out": str(out)}),
                          capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    if proc.returncode != 0 or not out.exists():
        tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
        if "ModuleNotFoundError" in proc.stderr:
            _require_sglang(f"sglang is installed but its parser's imports are not ({tail.splitlines()[-1]}): "
                            f"{SGLANG_INSTALL}")
        pytest.fail(f"SGLang's parser did not run (exit {proc.returncode}):\n{tail}")
    doc: dict[str, Any] = json.loads(Path(out).read_text())
    doc["parsed"] = {tuple(a): r for a, r in zip(argvs, doc.pop("results"))}
    return doc


def _parse(sglang_parser: dict[str, Any], argv: list[str]) -> dict[str, Any]:
    """The parsed fields of ``argv``; fails with SGLang's own error when it rejects it."""
    result = sglang_parser["parsed"][tuple(argv)]
    assert result["ok"], (f"sglang {sglang_parser['version']} rejects {' '.join(argv)}: "
                          f"{' '.join(result['error'])} (exit {result['code']})")
    values: dict[str, Any] = result["values"]
    return values


def _dest(sglang_parser: dict[str, Any], flag: str) -> str:
    options: dict[str, str] = sglang_parser["options"]
    if flag not in options:
        near = sorted(o for o in options if o.startswith(flag) or flag.startswith(o))
        pytest.fail(f"{flag} is not an option of sglang {sglang_parser['version']}'s server parser"
                    + (f" (options it prefixes or extends: {', '.join(near)})" if near else ""))
    return options[flag]


def _expected(name: str, value: ParamValue) -> list[tuple[str, Any]]:
    """(flag, value) pairs that parsing this parameter's flags must yield."""
    p = _space.parameters[name]
    assert p.flag is not None
    pairs: list[tuple[str, Any]] = [(p.flag, value)]
    for c in p.companions:
        if c.flag is None:
            continue
        if c.offset is not None and isinstance(value, (int, float)) and not isinstance(value, bool):
            pairs.append((c.flag, value + c.offset))
        else:
            pairs.append((c.flag, value if c.value is None else c.value))
    return pairs


# -- the tests ---------------------------------------------------------------------------------
def test_every_flag_the_space_sets_is_an_sglang_option(sglang_parser: dict[str, Any]) -> None:
    """Each flag and companion flag, exactly (not as a prefix argparse would expand)."""
    flags = [n for n in _space.applied_names() if n.startswith("-")]
    assert flags, "the space sets no flags"
    missing = [f for f in flags if f not in sglang_parser["options"]]
    details = []
    for f in missing:
        near = sorted(o for o in sglang_parser["options"] if o.startswith(f))
        details.append(f + (f" (could match {', '.join(near)})" if near else ""))
    assert not missing, f"flags that sglang {sglang_parser['version']} does not define: {'; '.join(details)}"


def test_the_preset_alone_parses(sglang_parser: dict[str, Any]) -> None:
    parsed = _parse(sglang_parser, _BASE_ARGV)
    assert parsed["model_path"] == "dummy" and parsed["host"] == "127.0.0.1" and parsed["port"] == 30000


def _check_read_back(sglang_parser: dict[str, Any], argv: list[str], applied: dict[str, ParamValue]) -> None:
    """``argv`` parses, and every flag parameter (with its companions) reads back as the value
    the space applied; one that renders no flag leaves SGLang's default in place."""
    parsed = _parse(sglang_parser, argv)
    default = _parse(sglang_parser, _BASE_ARGV)
    for name, value in applied.items():
        if _space.parameters[name].flag is None:
            continue
        own = SearchSpace(_space.name, {name: _space.parameters[name]}, []).to_launch({name: value}).args
        for flag, want in _expected(name, value):
            dest = _dest(sglang_parser, flag)
            got = parsed[dest]
            if not own:  # unset (or a false bool flag without flag_false): left out with its companions
                assert got == default[dest], f"{' '.join(argv)}: {flag} is left out but parsed as {got!r}"
                continue
            assert got == want and isinstance(got, str) == isinstance(want, str), (
                f"{' '.join(argv)}: {flag} parsed as {got!r}, the space applies {want!r}")


@pytest.mark.parametrize(("name", "value"), FLAG_CASES, ids=[f"{n}={v}" for n, v in FLAG_CASES])
def test_each_flag_value_parses(sglang_parser: dict[str, Any], name: str, value: ParamValue) -> None:
    """One parameter's flag and companions alone after the preset's command."""
    argv = CASE_ARGVS[(name, value)]
    if value == UNSET:
        assert argv == _BASE_ARGV, "unset must leave the flag and its companions out"
    _check_read_back(sglang_parser, argv, {name: value})


@pytest.mark.parametrize("case", list(WHOLE_LAUNCHES))
def test_whole_launch_parses(sglang_parser: dict[str, Any], case: str) -> None:
    """A whole trial's flags together, each read back as the value the space applied."""
    argv, applied = WHOLE_LAUNCHES[case]
    _check_read_back(sglang_parser, argv, applied)
