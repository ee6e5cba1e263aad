"""Properties of search spaces over arbitrary input (hypothesis).

- Any mapping, junk included, either loads as a :class:`SearchSpace` or raises
  :class:`ConfigError`: never another exception (which the command line would show as a traceback).
- For a valid space, the defaults complete a baseline, and any values drawn from the parameters'
  ranges launch as text only: env values are ``str``, argv items are ``str``, and a flag's value
  is exactly the one argv item after it (it reads back as the applied value).
"""

from __future__ import annotations

import math
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autotune.errors import ConfigError
from autotune.config.space import UNSET, SearchSpace

# -- arbitrary (mostly invalid) mappings ------------------------------------------------------
junk = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=6), st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
numbers = st.one_of(st.integers(-(2**70), 2**70), st.floats(allow_nan=True, allow_infinity=True),
                    st.floats(-100, 100), st.integers(-5, 40), junk)
names = st.one_of(st.from_regex(r"[A-Z_][A-Z0-9_]{0,6}", fullmatch=True), st.text(max_size=6))
flags = st.one_of(st.from_regex(r"--[a-z][a-z-]{0,6}", fullmatch=True), st.text(max_size=6))
scalars = st.one_of(st.text(max_size=6), st.integers(-10, 10), st.floats(allow_nan=True, allow_infinity=True),
                    st.booleans(), st.just(UNSET), st.just("[/x]"), st.just("a\x00b"))
companion = st.fixed_dictionaries({}, optional={"flag": flags, "env": names, "value": scalars | junk, "offset": numbers})
parameter = st.fixed_dictionaries(
    {"type": st.one_of(st.sampled_from(["int", "float", "categorical", "bool"]), junk)},
    optional={
        "low": numbers, "high": numbers, "step": numbers, "log": st.one_of(st.booleans(), junk),
        "choices": st.one_of(st.lists(scalars, max_size=5), junk), "env": names | junk, "flag": flags | junk,
        "flag_false": flags | junk, "default": scalars | numbers, "companions": st.lists(companion, max_size=2) | junk,
        "help": st.text(max_size=5) | junk,
    },
)
edge_numbers = st.one_of(st.sampled_from([0, 1, -1, 0.5, 1e308, -1e308, 2**53, 2**64, float("inf"), float("-inf"), float("nan")]),
                        st.integers(-3, 3))
near_valid_parameter = st.one_of(
    st.fixed_dictionaries(
        {"type": st.sampled_from(["int", "float"]), "env": st.just("X"), "low": edge_numbers, "high": edge_numbers},
        optional={"step": edge_numbers, "log": st.booleans(), "default": st.one_of(edge_numbers, scalars)}),
    st.fixed_dictionaries(
        {"type": st.sampled_from(["categorical", "bool"]), "env": st.just("X")},
        optional={"default": st.one_of(edge_numbers, scalars), "choices": st.lists(st.one_of(edge_numbers, scalars), max_size=3)}),
)
rules = st.lists(st.one_of(st.text(max_size=12), st.from_regex(r"[a-d] ?(<=|<|>=|>) ?[a-d]", fullmatch=True), junk), max_size=3)
space_mappings = st.fixed_dictionaries(
    {"parameters": st.one_of(st.dictionaries(st.sampled_from(["a", "b", "c", "d"]) | st.text(max_size=4), parameter, max_size=4), junk)},
    optional={"name": st.text(max_size=5) | junk, "description": junk, "rules": rules | junk, "extra": junk},
)


def _loads_or_config_error(data: Any) -> None:
    try:
        space = SearchSpace.from_mapping(data)
    except ConfigError as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    assert space.parameters
    for p in space.parameters.values():  # what loads is usable: Optuna accepts its distribution
        p.distribution()


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(space_mappings)
def test_any_mapping_loads_or_raises_config_error(data: dict[str, Any]) -> None:
    _loads_or_config_error(data)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(near_valid_parameter)
def test_any_parameter_loads_or_raises_config_error(param: dict[str, Any]) -> None:
    _loads_or_config_error({"parameters": {"x": param}})


@settings(max_examples=100, deadline=None)
@given(st.one_of(junk, st.lists(junk, max_size=3)))
def test_a_non_mapping_raises_config_error(data: Any) -> None:
    try:
        SearchSpace.from_mapping(data)
    except ConfigError:
        return
    raise AssertionError(f"{data!r} loaded as a space")


# -- valid spaces -----------------------------------------------------------------------------
@st.composite
def valid_parameter(draw: st.DrawFn, index: int) -> dict[str, Any]:
    """A valid parameter (with a default) applied as env ``P<index>`` or flag ``--p<index>``."""
    kind = draw(st.sampled_from(["int", "float", "categorical", "bool"]))
    target = {"env": f"P{index}"} if draw(st.booleans()) else {"flag": f"--p{index}"}
    p: dict[str, Any] = {"type": kind, **target}
    if kind == "int":
        low = draw(st.integers(-50, 50))
        step = draw(st.integers(1, 5))
        high = low + step * draw(st.integers(0, 20))
        log = low > 0 and step == 1 and draw(st.booleans())
        p.update(low=low, high=high, log=log, **({} if log else {"step": step}))
        p["default"] = low if log else low + step * draw(st.integers(0, (high - low) // step))
    elif kind == "float":
        low = draw(st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False))
        width = draw(st.floats(0, 1e3, allow_nan=False, allow_infinity=False))
        if draw(st.booleans()):
            step = draw(st.sampled_from([0.01, 0.05, 0.25, 1.0, 2.5]))
            low = round(low, 2)
            high = round(low + step * draw(st.integers(0, 50)), 10)
            p.update(low=low, high=high, step=step, default=low)
        else:
            p.update(low=low, high=low + width, default=low + width / 2)
    elif kind == "categorical":
        choices = draw(st.lists(st.one_of(st.text(min_size=0, max_size=6).filter(lambda s: "\x00" not in s),
                                          st.integers(-5, 5), st.booleans(), st.just(UNSET), st.just("[/x]"),
                                          st.floats(-10, 10, allow_nan=False)),
                                min_size=1, max_size=5, unique_by=_as_value))
        p.update(choices=choices, default=draw(st.sampled_from(choices)))
    else:
        p["default"] = draw(st.booleans())
        if "flag" in p and draw(st.booleans()):
            p["flag_false"] = f"--no-p{index}"
    if draw(st.booleans()):
        comp = {"flag": f"--c{index}"} if draw(st.booleans()) else {"env": f"C{index}"}
        how = draw(st.sampled_from(["value", "offset", "same"]))
        if how == "value":
            comp["value"] = draw(st.one_of(st.text(max_size=4).filter(lambda s: "\x00" not in s), st.integers(-3, 3), st.booleans()))
        elif how == "offset":
            comp["offset"] = draw(st.integers(-3, 3))
        p["companions"] = [comp]
    return p



def _as_value(choice: Any) -> Any:
    """A choice as Python compares it: 1, 1.0 and True are one value (a valid space lists it once)."""
    return choice if isinstance(choice, str) else ("number", float(choice))


@st.composite
def valid_space(draw: st.DrawFn) -> tuple[SearchSpace, dict[str, Any]]:
    n = draw(st.integers(1, 5))
    params = {f"x{i}": draw(valid_parameter(i)) for i in range(n)}
    space = SearchSpace.from_mapping({"name": "prop", "parameters": params})
    values: dict[str, Any] = {}
    for name, p in space.parameters.items():
        if p.type == "int":
            assert p.low is not None and p.high is not None
            step = int(p.step or 1)
            values[name] = int(p.low) + step * draw(st.integers(0, int(p.high - p.low) // step))
        elif p.type == "float":
            assert p.low is not None and p.high is not None
            if p.step:
                values[name] = p.low + p.step * draw(st.integers(0, round((p.high - p.low) / p.step)))
            else:
                values[name] = draw(st.floats(p.low, p.high, allow_nan=False))
        elif p.type == "categorical":
            assert p.choices is not None
            values[name] = draw(st.sampled_from(p.choices))
        else:
            values[name] = draw(st.booleans())
    return space, values


def _check_launch(space: SearchSpace, values: dict[str, Any]) -> None:
    launch = space.to_launch(values)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in launch.env.items())
    assert all(isinstance(a, str) for a in launch.args)
    for name, p in space.parameters.items():
        v = launch.applied[name]
        if p.flag is None:
            if v != UNSET:
                assert p.env in launch.env
            continue
        if p.type == "bool":
            assert (p.flag in launch.args) == (v is True)
            continue
        if v == UNSET:
            assert p.flag not in launch.args
            continue
        i = launch.args.index(p.flag)
        assert i + 1 < len(launch.args), launch.args
        item = launch.args[i + 1]
        if isinstance(v, bool):
            assert item == ("true" if v else "false")
        elif isinstance(v, (int, float)):
            assert math.isclose(float(item), float(v), rel_tol=1e-9, abs_tol=1e-9), (item, v)
        else:
            assert item == v


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_space())
def test_valid_space_launches_text_only(drawn: tuple[SearchSpace, dict[str, Any]]) -> None:
    space, values = drawn
    defaults = space.complete({})
    _check_launch(space, defaults)
    _check_launch(space, values)
