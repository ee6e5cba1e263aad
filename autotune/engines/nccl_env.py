"""NCCL's environment variables as NCCL reads them: the buffer sizes per connection and the
``NCCL_ALGO``/``NCCL_PROTO`` list syntax (``reference/engine-facts.md``).

One home for what both the simulated host (:mod:`autotune.sim.nccl`) and the crash rules'
derived quantities (:mod:`autotune.config.derived`) need to read a launch's NCCL settings.
"""

from __future__ import annotations

from collections.abc import Mapping

MIB = 1024 * 1024
LL_BUFFER_MIB = 0.5
"""The LL protocol's buffer per connection: 8 lines per thread x 512 threads x 8 steps x 16 bytes."""
LL128_BUFFER_MIB = 4.7
"""The LL128 protocol's buffer per connection (about 4.7 MiB)."""
DEFAULT_BUFFSIZE = 4 * MIB
"""``NCCL_BUFFSIZE``'s default: the Simple protocol's buffer per connection."""
PROTOCOLS = {"ll": "LL", "ll128": "LL128", "simple": "Simple"}
"""``NCCL_PROTO``'s names (any case) -> the protocol."""


def parse_set(raw: str, names: Mapping[str, str], universe: frozenset[str]) -> tuple[frozenset[str], str | None]:
    """The members an ``NCCL_ALGO``/``NCCL_PROTO`` value enables, and the first token NCCL does not
    know (None when all are known; the set is then empty). ``^`` excludes the listed members from
    ``universe``; the per-collective syntax (``allreduce:tree``) applies to all here."""
    text = raw.strip()
    exclude = text.startswith("^")
    if exclude:
        text = text[1:]
    chosen: set[str] = set()
    for token in (t.strip() for t in text.split(",")):
        if not token:
            continue
        if ":" in token:
            token = token.split(":", 1)[1]
        name = names.get(token.lower())
        if name is None:
            return frozenset(), token
        chosen.add(name)
    return (frozenset(universe - chosen) if exclude else frozenset(chosen)), None


def connection_buffer_mib(protocols: frozenset[str], buffsize: int) -> float:
    """One connection's receive buffers, MiB: each enabled protocol's (Simple's is ``buffsize``)."""
    return ((LL_BUFFER_MIB if "LL" in protocols else 0.0) + (LL128_BUFFER_MIB if "LL128" in protocols else 0.0)
            + (buffsize / MIB if "Simple" in protocols else 0.0))


__all__ = ["DEFAULT_BUFFSIZE", "LL128_BUFFER_MIB", "LL_BUFFER_MIB", "MIB", "PROTOCOLS", "connection_buffer_mib",
           "parse_set"]
