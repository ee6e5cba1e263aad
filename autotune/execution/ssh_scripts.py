"""The shell texts an SSH host runs on its host: GPU memory, signals to a server, its log's tail.

Every word that comes from a trial or a tag is quoted (:func:`shlex.quote`) or checked to be a
tag (hex digits) before it is put into a script; scripts are POSIX ``sh`` and need ``/proc``,
GNU ``tail --pid`` and ``grep -z``. A server's files live in :data:`LOG_DIR` under its working
directory: ``TAG.log`` (its output) and ``TAG.exit`` (its exit status, from its wrapper shell).
"""

from __future__ import annotations

import re
import shlex

from autotune.execution.hosts import TAG_ENV

__all__ = ["GPU_QUERY", "LOG_DIR", "exit_code", "gpu_memory", "signal_script", "stream_command"]

LOG_DIR = ".autotune"
"""The folder, under the remote working directory, of the servers' logs and exit-status files."""

GPU_QUERY = ("command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits "
             "2>/dev/null | sed 's/^/gpu-mib /'")
"""Prints ``gpu-mib N`` for each GPU (used MiB), nothing where there is no ``nvidia-smi``."""


def gpu_memory(stdout: str) -> list[int] | None:
    """The GPUs' used MiB from :data:`GPU_QUERY`'s output; None where there was none."""
    found = [int(float(v)) for v in re.findall(r"^gpu-mib ([0-9.]+)\s*$", stdout, re.M)]
    return found or None



def exit_code(status: int) -> int:
    """A server's exit code from its wrapper shell's ``$?`` (a signal's as its negative number)."""
    return -(status - 128) if 128 < status < 128 + 65 else status  # sh reports a signal as 128+N


def signal_script(tag: str, pgid: int | None, sig: str, wait_s: float = 0.0, then: str = "") -> str:
    """Send ``sig`` (TERM, KILL, or 0 to send nothing) to group ``pgid`` and to every process
    whose environment carries ``TAG_ENV=tag``, wait up to ``wait_s`` for all of them to be gone,
    print ``alive N`` (zombies do not count), then run ``then`` (shell text)."""
    assert sig in ("TERM", "KILL", "0") and re.fullmatch(r"[0-9a-f]+", tag)
    group = str(pgid) if pgid else ""
    rounds = max(0, int(wait_s / 0.1))
    return f"""T={tag}; G={group}
tagged() {{ grep -l -s -z -x -F "{TAG_ENV}=$T" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3 | tr '\n' ' '; }}
alive() {{
  t=" $(tagged) "; n=0
  for d in /proc/[0-9]*; do
    {{ read -r s < $d/stat; }} 2>/dev/null || continue
    set -- ${{s##*) }}
    [ "$1" = Z ] && continue
    if [ "$3" = "$G" ]; then n=$((n+1)); else case "$t" in *" ${{d#/proc/}} "*) n=$((n+1));; esac; fi
  done
  echo $n
}}
if [ {sig} != 0 ]; then
  [ -n "$G" ] && kill -{sig} -$G 2>/dev/null
  for p in $(tagged); do kill -{sig} $p 2>/dev/null; done
fi
i=0; n=$(alive)
while [ "$n" -gt 0 ] && [ $i -lt {rounds} ]; do sleep 0.1; i=$((i+1)); n=$(alive); done
echo "alive $n"
{then}"""


def stream_command(tag: str, pgid: int, folder: str) -> str:
    """The command that streams server ``tag``'s log from its start while group ``pgid`` lives,
    then prints its exit status (if there is one) on stderr. ``folder``: a shell word."""
    log, status = f"{LOG_DIR}/{tag}.log", f"{LOG_DIR}/{tag}.exit"
    # Bounded by the server's life (--pid), not by a timeout: it ends at teardown.
    script = (f"cd {folder} || exit 90; tail -c +1 -s 0.2 --pid={pgid} -F {log} 2>/dev/null; "
              f"if [ -f {status} ]; then cat {status} 1>&2; fi; exit 0")
    return f"sh -c {shlex.quote(script)}"
