"""The derived quantities the crash rules read (autotune.config.derived): NCCL's buffers per peer."""

from __future__ import annotations

import pytest

from autotune.analysis.conditions import Condition
from autotune.config.derived import derived_values, enabled_protocols, nccl_buffers_mib

MIB = 1 << 20


@pytest.mark.parametrize(("text", "protocols"), [
    (None, {"LL", "LL128", "Simple"}),
    ("unset", {"LL", "LL128", "Simple"}),
    ("LL", {"LL"}),
    ("LL128,Simple", {"LL128", "Simple"}),
    ("^LL", {"LL128", "Simple"}),
    ("allreduce:simple", {"Simple"}),
    ("Bogus", None),
])
def test_the_protocols_nccl_proto_enables(text: str | None, protocols: set[str] | None) -> None:
    assert enabled_protocols(text) == (frozenset(protocols) if protocols is not None else None)


@pytest.mark.parametrize(("params", "mib"), [
    ({"NCCL_MIN_NCHANNELS": 8}, 73.6),                                        # 8 x (0.5 + 4.7 + 4)
    ({"NCCL_MIN_NCHANNELS": 8, "NCCL_BUFFSIZE": 16 * MIB}, 169.6),
    ({"NCCL_MIN_NCHANNELS": 20, "NCCL_MAX_NCHANNELS": 10}, 92.0),            # NCCL caps the floor
    ({"NCCL_MIN_NCHANNELS": 16, "NCCL_PROTO": "LL"}, 8.0),                    # LL's buffer alone
    ({"NCCL_MIN_NCHANNELS": 16, "NCCL_PROTO": "Simple", "NCCL_BUFFSIZE": "0x80000"}, 8.0),
    ({"NCCL_MIN_CTAS": 20, "NCCL_MAX_CTAS": 10}, 92.0),                      # the newer names (2.17+)
    ({"NCCL_MIN_NCHANNELS": "unset", "NCCL_BUFFSIZE": 16 * MIB}, None),       # the topology's count
    ({"NCCL_BUFFSIZE": 16 * MIB}, None),
    ({"NCCL_MIN_NCHANNELS": 8, "NCCL_PROTO": "Bogus"}, None),
])
def test_nccl_buffers_per_peer(params: dict[str, object], mib: float | None) -> None:
    assert nccl_buffers_mib(params) == mib


def test_a_quantity_is_derived_only_when_a_parameter_moves_it() -> None:
    """Settings fixed for the whole study (the launch's environment) fill in; a quantity of
    fixed settings alone varies with nothing."""
    env = {"NCCL_MIN_NCHANNELS": "16", "NCCL_BUFFSIZE": str(8 * MIB)}
    assert derived_values({"NCCL_PROTO": "LL128"}, env) == {"nccl_buffers_mib": 75.2}
    assert derived_values({"mem_fraction_static": 0.9}, env) == {}


def test_a_condition_on_a_derived_quantity_holds_on_the_parameters() -> None:
    """The sampler asks whether a proposal lies in a crash region from its parameters alone."""
    cond = Condition("nccl_buffers_mib", ">=", 100.0)
    assert cond.holds({"NCCL_MIN_NCHANNELS": 16, "NCCL_BUFFSIZE": 4 * MIB, "NCCL_PROTO": "unset"})  # 147.2
    assert not cond.holds({"NCCL_MIN_NCHANNELS": 16, "NCCL_BUFFSIZE": 4 * MIB, "NCCL_PROTO": "LL"})  # 8
    assert not cond.holds({"NCCL_BUFFSIZE": 16 * MIB})  # no floor on channels: unknown, not in the region
