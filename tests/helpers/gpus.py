"""A stand-in ``nvidia-smi``: real processes find it first on PATH and ask it what
:mod:`autotune.execution.gpu_check` asks, and it answers from a JSON file the test rewrites."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

STAND_IN = """#!{python}
# A stand-in nvidia-smi: answers the queries of autotune.execution.gpu_check from gpus.json beside it
# ({{"gpus": [[index, uuid, total, used]], "apps": [[pid, name, used, uuid]]}}, or
# {{"if_exists": PATH, "then": STATE, "else": STATE}}) and notes each call in calls.log.
import json, sys
from pathlib import Path

here = Path(__file__).resolve().parent
args = sys.argv[1:]
with open(here / "calls.log", "a") as f:
    f.write(" ".join(args) + "\\n")
state = json.loads((here / "gpus.json").read_text())
if "if_exists" in state:
    state = state["then"] if Path(state["if_exists"]).exists() else state["else"]
if "--format=csv,noheader,nounits" not in args:
    sys.exit("stand-in nvidia-smi: unsupported format")
if "--query-gpu=index,uuid,memory.total,memory.used" in args:
    rows = state.get("gpus", [])
elif "--query-compute-apps=pid,process_name,used_memory,gpu_uuid" in args:
    rows = state.get("apps", [])
else:
    sys.exit("stand-in nvidia-smi: unsupported query " + " ".join(args))
for row in rows:
    print(", ".join(str(c) for c in row))
"""

UUID0, UUID1 = "GPU-7d0e0b53-0000-0000-0000-000000000000", "GPU-7d0e0b53-1111-1111-1111-111111111111"
TOTAL = 143771  # an H200's MiB
FREE: dict[str, Any] = {"gpus": [[0, UUID0, TOTAL, 0]], "apps": []}
BUSY: dict[str, Any] = {"gpus": [[0, UUID0, TOTAL, 139800]], "apps": [[2921, "python3", 139790, UUID0]]}
"""GPU 0 as seen on the H200: another process holds 136.5 GiB of it."""


class StandIn:
    """The stand-in ``nvidia-smi`` in ``folder``: :meth:`set` what it reports, :meth:`calls`."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        exe = folder / "nvidia-smi"
        exe.write_text(STAND_IN.format(python=sys.executable))
        exe.chmod(0o755)
        self.set(FREE)

    def set(self, state: dict[str, Any]) -> None:
        """Report ``state`` from now on (written whole: a reader never sees half of it)."""
        tmp = self.folder / "gpus.json.tmp"
        tmp.write_text(json.dumps(state))
        os.replace(tmp, self.folder / "gpus.json")

    def calls(self, query: str = "--query-gpu=index,") -> int:
        """How many times it was asked ``query``."""
        log = self.folder / "calls.log"
        return sum(query in line for line in log.read_text().splitlines()) if log.exists() else 0
