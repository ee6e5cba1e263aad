from __future__ import annotations

import optuna
import pytest

from autotune.errors import ConfigError
from autotune.config.space import SearchSpace


def _space(params: dict, rules: list[str] | None = None) -> SearchSpace:
    return SearchSpace.from_mapping({"name": "t", "parameters": params, "rules": rules or []})


def test_builtin_sglang_nccl_has_the_issue_parameters() -> None:
    space = SearchSpace.load("sglang_nccl")
    applied_as = {p.env or p.flag for p in space.parameters.values()}
    for key in ("NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS", "NCCL_BUFFSIZE", "NCCL_ALGO", "NCCL_PROTO",
                "--mem-fraction-static", "--num-continuous-decode-steps", "--speculative-num-draft-tokens",
                "--max-running-requests", "--cuda-graph-max-bs-decode"):
        assert key in applied_as


def test_baseline_is_completed_with_defaults_and_launch_is_built() -> None:
    space = SearchSpace.load("sglang_nccl")
    base = space.complete({"mem_fraction_static": 0.92, "NCCL_MIN_NCHANNELS": 8})
    launch = space.to_launch(base)
    assert launch.env["NCCL_MIN_NCHANNELS"] == "8"
    assert "NCCL_ALGO" not in launch.env  # 'unset' leaves it out
    i = launch.args.index("--mem-fraction-static")
    assert launch.args[i + 1] == "0.92"
    assert "--speculative-algorithm" not in launch.args


def test_companions_follow_their_parameter() -> None:
    space = SearchSpace.load("sglang_nccl")
    base = space.complete({"speculative_num_draft_tokens": 4})
    args = space.to_launch(base).args
    assert args[args.index("--speculative-num-draft-tokens") + 1] == "4"
    assert args[args.index("--speculative-num-steps") + 1] == "3"
    assert args[args.index("--speculative-algorithm") + 1] == "EAGLE3"


def test_rule_is_repaired_and_joint_space_kept() -> None:
    space = _space(
        {"lo": {"type": "int", "low": 1, "high": 32, "env": "A"}, "hi": {"type": "int", "low": 1, "high": 64, "env": "B"}},
        ["lo <= hi"],
    )
    launch = space.to_launch({"lo": 16, "hi": 4})
    assert launch.applied == {"lo": 16, "hi": 16}
    assert launch.env == {"A": "16", "B": "16"}
    # Every parameter is sampled over its full, fixed range: the sampler sees one joint space.
    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=1, n_startup_trials=3, multivariate=True))
    for _ in range(12):
        t = study.ask()
        values = space.suggest(t)
        applied = space.to_launch(values).applied
        assert applied["lo"] <= applied["hi"]
        study.tell(t, float(applied["hi"]))
    ss = optuna.search_space.intersection_search_space(study.get_trials())
    assert set(ss) == {"lo", "hi"}


@pytest.mark.parametrize(
    ("params", "rules", "fragment"),
    [
        ({"x": {"type": "enum", "choices": [1], "env": "X"}}, [], "parameters.x.type"),
        ({"x": {"type": "int", "low": 32, "high": 1, "env": "X"}}, [], "inverted range"),
        ({"x": {"type": "int", "low": 1, "high": 4}}, [], "exactly one of 'env'"),
        ({"x": {"type": "float", "low": 0, "high": 1, "log": True, "flag": "--x"}}, [], "log scale needs low > 0"),
        ({"x": {"type": "int", "low": 1, "high": 4, "env": "X"}}, ["x <= y"], "unknown parameter 'y'"),
        ({"x": {"type": "int", "low": 1, "high": 4, "env": "X", "colour": 1}}, [], "unknown key"),
    ],
)
def test_bad_spaces_give_one_line_errors(params: dict, rules: list[str], fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        _space(params, rules)
    assert fragment in str(info.value)
    assert "\n" not in str(info.value)


def test_baseline_outside_range_is_rejected() -> None:
    space = SearchSpace.load("sglang_nccl")
    with pytest.raises(ConfigError, match=r"mem_fraction_static=1.2 is outside \[0.5, 0.95\]"):
        space.complete({"mem_fraction_static": 1.2})
    with pytest.raises(ConfigError, match="unknown parameter 'mem_fraction'"):
        space.complete({"mem_fraction": 0.9})
    with pytest.raises(ConfigError, match="breaks the rule"):
        space.complete({"NCCL_MIN_NCHANNELS": 16, "NCCL_MAX_NCHANNELS": 8})


def test_unknown_builtin_space_lists_known_ones() -> None:
    with pytest.raises(ConfigError, match="sglang_nccl"):
        SearchSpace.load("nope")
