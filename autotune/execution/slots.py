"""Slots: the shares of the hosts that trials occupy, one trial per slot at a time.

A slot is a whole host, or, when a host declares its GPUs (``target.host_gpus``) and a trial needs
fewer (``target.gpus_per_trial``, its TP size), a subset of them given to the server as
``CUDA_VISIBLE_DEVICES``. On a Ray cluster whose nodes launch locally, each node advertises the
custom resource ``autotune_slot:<node>`` with one unit per slot it can run (see
``ray_cluster.yaml``); a trial is a Ray task that needs one unit of its slot's resource.

:class:`SlotPool` keeps each slot's health. A slot is quarantined after ``quarantine_after``
faults in a row, or at once when the fault says the slot is gone (its Ray node died, or no node
offers its resource), and every slot of a host that refused us (its key, our login) at once; a
quarantined slot gets no further trial, and is reported.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

SLOT_RESOURCE_PREFIX = "autotune_slot:"
"""Ray custom resources named ``autotune_slot:<node>`` mark the nodes that run trials."""

SLOT_GONE_FAULTS = frozenset({"node-died", "slot-unavailable"})
"""Faults after which a slot is quarantined at once: what ran it is not there any more."""
HOST_REFUSED_FAULTS = frozenset({"host-key-unknown", "host-key-mismatch", "auth-failed"})
"""Faults no retry can mend (the host refused us): every slot of that host is quarantined at once."""


@dataclass(frozen=True)
class Slot:
    """One place a trial runs.

    ``host``: the host's config spelling (``local``: the machine that runs the trial, which under
    Ray is the node of ``resource``). ``gpus``: the GPU indices given to the server as
    ``CUDA_VISIBLE_DEVICES`` (None: all of the host's, nothing set). ``resource``: the Ray custom
    resource a task of this slot needs (None: any node).
    """

    name: str
    host: str
    gpus: tuple[int, ...] | None = None
    resource: str | None = None

    def env(self) -> dict[str, str]:
        """What the slot adds to a server's environment."""
        return {} if self.gpus is None else {"CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in self.gpus)}

    def describe(self) -> dict[str, Any]:
        """The slot as recorded with a trial and the study."""
        return {"name": self.name, "host": self.host, "gpus": None if self.gpus is None else list(self.gpus),
                "resource": self.resource}


def gpu_groups(count: int, gpus_per_trial: int | None) -> list[tuple[int, ...] | None]:
    """The GPU sets of ``count`` slots of one host: disjoint groups of ``gpus_per_trial``
    consecutive indices, or ``None`` each (every GPU, nothing set) when ``gpus_per_trial`` is None."""
    if gpus_per_trial is None:
        return [None] * count
    return [tuple(range(i * gpus_per_trial, (i + 1) * gpus_per_trial)) for i in range(count)]


def _slot_name(base: str, gpus: tuple[int, ...] | None, many: bool, index: int) -> str:
    if gpus is not None and many:
        return f"{base}[gpus {gpus[0]}-{gpus[-1]}]" if len(gpus) > 1 else f"{base}[gpu {gpus[0]}]"
    return f"{base}#{index}" if many else base


def host_slots(hosts: Iterable[str], *, host_gpus: int | None = None, gpus_per_trial: int | None = None,
               resource: str | None = None) -> list[Slot]:
    """The slots of the configured hosts: one per distinct host, or one per GPU group of each
    host when both ``host_gpus`` and ``gpus_per_trial`` are set."""
    out: list[Slot] = []
    for host in dict.fromkeys(hosts):
        many = host_gpus is not None and gpus_per_trial is not None
        groups = gpu_groups(host_gpus // gpus_per_trial, gpus_per_trial) if many else [None]  # type: ignore[operator]
        out += [Slot(_slot_name(host, g, len(groups) > 1, i), host, g, resource) for i, g in enumerate(groups)]
    return out


def ray_slots(resources: Mapping[str, float], *, gpus_per_trial: int | None = None) -> list[Slot]:
    """The slots a Ray cluster offers: ``int(count)`` slots for each ``autotune_slot:<node>``
    resource, launching locally on that node, each with its own GPU group when
    ``gpus_per_trial`` is set."""
    out: list[Slot] = []
    for key in sorted(resources):
        if not key.startswith(SLOT_RESOURCE_PREFIX):
            continue
        node = key.removeprefix(SLOT_RESOURCE_PREFIX)
        count = int(resources[key])
        groups = gpu_groups(count, gpus_per_trial)
        out += [Slot(_slot_name(node, g, len(groups) > 1, i), "local", g, key) for i, g in enumerate(groups)]
    return out


@dataclass
class SlotHealth:
    """A slot's record: faults in a row, and why it was quarantined (empty while healthy)."""

    slot: Slot
    faults_in_a_row: int = 0
    trials: int = 0
    quarantined: str = ""


@dataclass
class SlotPool:
    """The slots of a study, which of them run a trial, and their health.

    Contract: :meth:`free` lists healthy slots that run nothing, in the configured order;
    :meth:`take` and :meth:`release` mark a slot busy and free; :meth:`record` counts a trial's
    outcome and returns the quarantine reason when this outcome quarantined the slot.
    """

    slots: list[Slot]
    quarantine_after: int = 3
    health: dict[str, SlotHealth] = field(init=False)
    busy: set[str] = field(init=False, default_factory=set)

    def __post_init__(self) -> None:
        self.health = {s.name: SlotHealth(s) for s in self.slots}

    def free(self) -> list[Slot]:
        return [s for s in self.slots if s.name not in self.busy and not self.health[s.name].quarantined]

    def healthy(self) -> list[Slot]:
        return [s for s in self.slots if not self.health[s.name].quarantined]

    def take(self, slot: Slot) -> None:
        self.busy.add(slot.name)

    def release(self, slot: Slot) -> None:
        self.busy.discard(slot.name)

    def choose(self, avoid: str | None = None) -> Slot | None:
        """A free slot, other than ``avoid`` when another is free (a retry goes elsewhere)."""
        free = self.free()
        if not free:
            return None
        others = [s for s in free if s.name != avoid]
        return (others or free)[0]

    def record(self, slot: Slot, outcome: str, fault_kind: str | None, message: str = "") -> str:
        """Count one finished trial on ``slot``; returns the quarantine reason if this outcome
        quarantined it (and, for a refusing host, the host's other slots), else ""."""
        h = self.health[slot.name]
        h.trials += 1
        if outcome != "fault" or fault_kind == "interrupted":
            h.faults_in_a_row = 0
            return ""
        h.faults_in_a_row += 1
        what = f"{fault_kind or 'fault'}: {message}" if message else str(fault_kind or "fault")
        if fault_kind in HOST_REFUSED_FAULTS:
            for other in self.slots:
                if other.host == slot.host:
                    self.health[other.name].quarantined = what
        elif fault_kind in SLOT_GONE_FAULTS:
            h.quarantined = what
        elif h.faults_in_a_row >= self.quarantine_after:
            h.quarantined = f"{h.faults_in_a_row} infrastructure faults in a row ({what})"
        return h.quarantined

    def report(self) -> list[dict[str, Any]]:
        """Each slot with its health, as stored in the study's ``slots`` attribute."""
        return [{**h.slot.describe(), "health": "quarantined" if h.quarantined else "healthy",
                 "reason": h.quarantined, "trials": h.trials, "faults_in_a_row": h.faults_in_a_row,
                 "busy": h.slot.name in self.busy}
                for h in self.health.values()]
