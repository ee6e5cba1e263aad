"""The generated family of hosts in `autotune bench tuner` (``--generated SEEDS``).

:func:`family_files` writes each seed's host (:func:`autotune.sim.family.generate`) as a scenario
file the studies load like any other; :func:`summarize_family` pools every run on the family's
hosts, each scored against its own host's optimum, into one strategy summary
(:func:`~autotune.bench.scores.summarize`), and :func:`halves` names the seeds of each half
(:data:`~autotune.sim.family.DEVELOPMENT`, :data:`~autotune.sim.family.HELD_BACK`).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Mapping, Sequence

from autotune.bench.scores import summarize
from autotune.bench.study_trace import StudyTrace
from autotune.errors import UsageError
from autotune.sim.family import DEVELOPMENT, HELD_BACK, generate, generate_sibling, to_yaml

__all__ = ["family_files", "halves", "summarize_family"]


def family_files(seeds: Sequence[int], folder: Path | None = None, *, sibling: bool = False) -> list[str]:
    """The scenario file of each seed's host (``sibling``: of another model on that host,
    :func:`~autotune.sim.family.generate_sibling`), written into ``folder`` (default:
    ``autotune-bench/family`` under the system temp folder), in the order of ``seeds``.

    Raises:
        UsageError: the folder cannot be written.
    """
    where = folder or Path(tempfile.gettempdir()) / "autotune-bench" / "family"
    out = []
    try:
        where.mkdir(parents=True, exist_ok=True)
        for seed in seeds:
            scenario = generate_sibling(seed) if sibling else generate(seed)
            path = where / f"{scenario.name}.yaml"
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(to_yaml(scenario), encoding="utf-8")
            tmp.replace(path)
            out.append(str(path))
    except OSError as exc:
        raise UsageError(f"cannot write the generated hosts into {where}: {exc.strerror}") from None
    return out


def halves(seeds: Sequence[int]) -> dict[str, list[int]]:
    """``seeds`` split into the development and the held-back half (and any outside both)."""
    return {"development": [s for s in seeds if s in DEVELOPMENT], "held_back": [s for s in seeds if s in HELD_BACK],
            "other": [s for s in seeds if s not in DEVELOPMENT and s not in HELD_BACK]}


def summarize_family(traces: Sequence[StudyTrace], strategies: Sequence[str], trials: int,
                     gpus: Mapping[str, int]) -> dict[str, Any]:
    """Each strategy's scores over every run on the family's hosts (``gpus``: host -> its GPUs;
    a run's ratios are over its own host's optimum, so runs on different hosts pool)."""
    return {s: summarize([t for t in traces if t.strategy == s and t.scenario in gpus], trials, dict(gpus))
            for s in strategies}
