"""Launch profiles: the best trial's env and command as a person would run them on the serving
host, with the provenance of the measurement, memory parameters backed off from the failure
boundary the study measured, and what :func:`verify` needs to measure it again.

Formats: ``sh`` (a runnable bash script, every value quoted), ``env`` (``KEY=value`` lines for
``set -a; source FILE`` in bash, every value quoted), ``yaml`` and ``json`` (the whole profile as
data).

Contracts:

- Run by bash, an ``sh`` profile execs exactly the trial's argv (the port filled in, the
  interpreter replaced: below) with exactly its env, less any memory back-off the header states;
  sourced by bash, an ``env`` profile sets exactly that env. Any value is allowed (quotes, ``$``,
  backticks, newlines, unicode); only NUL cannot occur in env or argv.
- No path of the tuner's own environment: where the launch template had ``{python}`` (or a word
  is the tuner's own interpreter), the profile has the interpreter of the serving host: ``sh``
  runs ``"$PYTHON"`` (``PYTHON`` from the environment, default ``python3`` or the ``--python`` given
  at export); the data formats hold ``python`` and the command with it filled in. The host bind
  address, the model and every other word stay as the user configured them.
- Provenance (header comments for ``sh``/``env``, ``provenance``/``measured``/``memory`` objects
  in the data): engine and version, GPU, driver, NCCL, study, trial, the measured mean with its
  95% interval and count (trials with identical parameters pooled), dates (UTC).
- Memory parameters (:func:`memory_parameter`): when the study saw a memory failure
  (:func:`memory_failure`) at a value at or above the best's, anywhere in the study, the exported
  value is at least ``margin`` below the nearest such value (on the space's grid, one step at
  least, never below the space's low bound nor onto a value that failed for too little memory);
  the header says what changed, from what, and which trial's failure it keeps away from.
- Secrets (see :mod:`autotune.config.secrets`) are stored as references ``${NAME}`` and are exported
  as references to be supplied at launch: ``sh`` refuses to start without them, ``env`` takes
  them from the environment, ``yaml``/``json`` list them under ``secrets``. A user's literal
  ``${X}`` text is exported as literal text.
- Comment lines are safe against any text: control, line-separator and bidi characters in a
  value are shown escaped, so nothing in a value can end a comment. ``sh`` and ``env`` carry the
  whole profile as one JSON comment line, ``# autotune-profile: {...}``, for :func:`verify`.
- :func:`write_profile` writes a file whole or not at all, mode 0600 (0700 for ``sh``).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import re
import shlex
import shutil
import string
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from autotune.util.stats import mean_interval
from autotune.util.text import counted, one_line
from autotune.errors import UsageError
from autotune.config.pareto import ChoiceRule, dominates
from autotune.config.secrets import reference, reference_name
from autotune.util.units import unit_of
from autotune.store.study_view import best_of, measured_configs
from autotune.store.record import TrialRecord

FORMATS = ("sh", "env", "yaml", "json")
PORT_FIELD = "{port}"
PYTHON_FIELD = "{python}"
DEFAULT_PYTHON = "python3"
DEFAULT_MEMORY_MARGIN = 0.02
PROFILE_VERSION = 1
PROFILE_LINE = "# autotune-profile: "
FILE_MODE = 0o600
SH_MODE = 0o700
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PLAIN_WORD = re.compile(r"[A-Za-z0-9_./+@%:=,-]+")


# -- secrets in the profile ------------------------------------------------------------------
def secret_env(env: Mapping[str, str], keys: Iterable[str]) -> dict[str, str]:
    """Env key -> secret name, for the ``keys`` (a trial's ``secret_env``) whose value is a
    reference; a key listed but holding other text is exported as that literal text."""
    out: dict[str, str] = {}
    for k in keys:
        name = reference_name(env.get(k, ""))
        if name is not None:
            out[k] = name
    return out


def _secret_word(word: str, name: str | None) -> tuple[str, str] | None:
    """``(prefix, name)`` when ``word`` is the reference to ``name`` (``${NAME}``) or ends with
    it after ``=`` (``--flag=${NAME}``); None for literal text."""
    if name is None:
        return None
    ref = reference(name)
    if word == ref:
        return "", name
    if word.endswith("=" + ref):
        return word[: -len(ref)], name
    return None


def secret_names(env: Mapping[str, str], template: list[str], keys: Iterable[str],
                 args: Mapping[int, str]) -> list[str]:
    """The names a launch of this profile must supply, sorted, without repeats."""
    names = set(secret_env(env, keys).values())
    for i, word in enumerate(template):
        hit = _secret_word(word, args.get(i))
        if hit is not None:
            names.add(hit[1])
    return sorted(names)


def _missing(name: str) -> str:
    """A bash expansion of the secret ``name`` that stops the script with a clear message when
    it is unset or empty (for use inside double quotes)."""
    return f"${{{name}:?set {name} in the environment: a secret, not stored in this profile}}"


# -- the interpreter ---------------------------------------------------------------------------
def _python_regex(word: str) -> re.Pattern[str] | None:
    """A regex matching ``word`` of a launch template once formatted, with the ``{python}``
    field as group ``py`` (any other field matches any text); None if it has no ``{python}``."""
    parts: list[str] = []
    seen = False
    try:
        parsed = list(string.Formatter().parse(word))
    except ValueError:
        return None
    for literal, field, _, _ in parsed:
        parts.append(re.escape(literal))
        if field is None:
            continue
        if field == "python":
            parts.append("(?P=py)" if seen else "(?P<py>.+?)")
            seen = True
        else:
            parts.append(".*?")
    return re.compile("".join(parts), re.S) if seen else None


def tuner_interpreters() -> set[str]:
    """This process's interpreter, as it was given and resolved: never to appear in a profile."""
    return {p for p in (sys.executable, os.path.realpath(sys.executable)) if p}


def interpreter_spans(argv_template: Sequence[str], launch_template: str | None = None,
                      interpreters: Iterable[str] = ()) -> dict[int, tuple[int, int]]:
    """Where the interpreter is in a trial's ``argv_template``: word index -> (start, end).

    ``launch_template``: the command template the trial was launched from (``target.command`` or
    the engine preset's): the text its ``{python}`` fields became. Also any whole word that is
    one of ``interpreters`` or the tuner's own interpreter (:func:`tuner_interpreters`)."""
    spans: dict[int, tuple[int, int]] = {}
    if launch_template:
        try:
            words = shlex.split(launch_template)
        except ValueError:
            words = []
        for i, w in enumerate(words[: len(argv_template)]):
            regex = _python_regex(w)
            m = regex.fullmatch(argv_template[i]) if regex is not None else None
            if m is not None and m.end("py") > m.start("py"):
                spans[i] = m.span("py")
    whole = tuner_interpreters() | {p for p in interpreters if p}
    for i, w in enumerate(argv_template):
        if i not in spans and w in whole:
            spans[i] = (0, len(w))
    return spans


def command_template(argv_template: Sequence[str], spans: Mapping[int, tuple[int, int]]) -> list[str]:
    """``argv_template`` with each interpreter span replaced by ``{python}``."""
    out = list(argv_template)
    for i, (s, e) in spans.items():
        out[i] = out[i][:s] + PYTHON_FIELD + out[i][e:]
    return out


def fill(template: Sequence[str], python_words: Iterable[int], *, port: int | str, python: str) -> list[str]:
    """The argv of a command template: ``{port}`` everywhere, ``{python}`` in ``python_words``."""
    at = set(python_words)
    return [(w.replace(PYTHON_FIELD, python) if i in at else w).replace(PORT_FIELD, str(port))
            for i, w in enumerate(template)]


def _sh_words(template: list[str], args: Mapping[int, str], python_words: Iterable[int] = ()) -> list[str]:
    """Each word of ``template`` as one bash word: literal text single-quoted, a secret as
    ``"${NAME:?...}"``, each ``{port}`` field as ``"$PORT"`` and, in ``python_words``, each
    ``{python}`` field as ``"$PYTHON"``."""
    at = set(python_words)

    def port_part(text: str) -> str:
        return '"$PORT"'.join(shlex.quote(p) if p else "" for p in text.split(PORT_FIELD))

    words: list[str] = []
    for i, w in enumerate(template):
        hit = _secret_word(w, args.get(i))
        if hit is not None:
            prefix, name = hit
            words.append((shlex.quote(prefix) if prefix else "") + f'"{_missing(name)}"')
        elif i in at:
            words.append('"$PYTHON"'.join(port_part(p) for p in w.split(PYTHON_FIELD)) or "''")
        else:
            words.append(port_part(w) or "''")
    return words


def _display_words(argv: list[str], args: Mapping[int, str]) -> str:
    """The command line as shown to a person: shell-quoted, secrets as ``"${NAME}"``."""
    out = []
    for i, w in enumerate(argv):
        hit = _secret_word(w, args.get(i))
        out.append(shlex.quote(w) if hit is None else (shlex.quote(hit[0]) if hit[0] else "") + f'"{reference(hit[1])}"')
    return " ".join(out)


# -- safe comments ---------------------------------------------------------------------------
def _show(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False) if isinstance(value, str) else str(value)


def _num(x: Any) -> str:
    return f"{x:.4g}" if isinstance(x, float) else str(x)


def _header(prof: Mapping[str, Any], fmt: str) -> list[str]:
    measured = prof.get("measured") or {}
    prov = prof.get("provenance") or {}
    lines = [f"autotune launch profile: study {prof['study']}, trial {prof['trial']}"]
    if prof.get("objectives"):
        lines.append(", ".join(f"{g['metric']} = {g['value']} ({g['direction']})" for g in prof["objectives"])
                     + f", exported {prof['exported_at']}")
    else:
        unit = f" {prof['unit']}" if prof.get("unit") else ""
        lines.append(f"{prof['metric']} = {_num(prof['value'])}{unit} ({prof['direction']}), exported {prof['exported_at']}")
    if prof.get("choice"):
        lines.append(f"chosen: {prof['choice']['text']}")
    if measured.get("text"):
        lines.append(f"measured: {measured['text']}")
    if prov:
        lines.append(f"engine: {prov.get('engine', 'unknown')} (version {prov.get('engine_version', 'unknown')}); "
                     f"GPU: {prov.get('gpu', 'unknown')}; driver: {prov.get('driver', 'unknown')}; "
                     f"NCCL: {prov.get('nccl', 'unknown')}")
    for m in prof.get("memory") or []:
        lines.append(f"memory: {m['text']}")
    lines.append("params: " + " ".join(f"{k}={_show(v)}" for k, v in prof["params"].items()))
    if prof.get("secrets"):
        lines.append("secrets, not stored here (set them in the environment): " + " ".join(prof["secrets"]))
    if prof.get("python_words") and fmt == "sh":
        lines.append(f"interpreter: $PYTHON, default {prof['python']} (the serving host's Python with the engine); "
                     "to use another: PYTHON=/opt/venv/bin/python bash THIS_FILE")
    elif prof.get("python_words"):
        lines.append(f"interpreter: {prof['python']} (the serving host's Python with the engine; "
                     "put another in its place in the command)")
    for w in prof.get("warnings") or []:
        lines.append(f"warning: {w}")
    out = [f"# {one_line(h)}" for h in lines]
    out.append(PROFILE_LINE + one_line(json.dumps(prof, ensure_ascii=True, separators=(",", ":"))))
    return out


# -- measurements ----------------------------------------------------------------------------
def measurement(values: Sequence[float], trials: Sequence[int] = (), *, at: str | None = None,
                note: str = "", interval: tuple[float, float] | None = None) -> dict[str, Any]:
    """Mean, count and 95% t-interval of repeated measurements of one configuration
    (``interval``: one worked out elsewhere, e.g. from pooled noise, instead of the t-interval)."""
    n = len(values)
    mean, sd, own = mean_interval(values) if n else (None, None, None)
    interval = interval or own
    out: dict[str, Any] = {"mean": mean, "count": n, "interval95": None if interval is None else list(interval),
                           "sd": sd, "values": list(values), "trials": list(trials), "last_at": at}
    which = f" (trial{'s' if len(trials) != 1 else ''} {', '.join(map(str, trials))})" if trials else ""
    when = f", last {at}" if at else ""
    if mean is None:
        text = "no measurement"
    elif out["interval95"] is None:
        text = f"{_num(mean)}, 1 measurement, no interval{which}{when}"
    else:
        lo, hi = out["interval95"]
        text = f"mean {_num(mean)}, 95% interval [{_num(lo)}, {_num(hi)}], {counted(n, 'measurement')}{which}{when}"
    out["text"] = text + (f"; {note}" if note else "")
    if note:
        out["note"] = note
    return out


def pooled(views: Iterable[TrialRecord], params: Mapping[str, Any], dates: Mapping[int, str] | None = None,
           note: str = "") -> dict[str, Any] | None:
    """The measurement of the configuration ``params`` as ``study best`` figures it
    (:class:`~autotune.store.study_view.Measured`: a configuration measured again is the mean of the
    runs after its first, which is named in ``excluded`` with its value and left out); None when
    no trial measured it."""
    rows = sorted(views, key=lambda v: v.number)
    m = next((c for c in measured_configs(rows) if c.params == dict(params)), None)
    if m is None:
        return None
    at = max((dates or {}).get(n, "") for n in m.trials) or None
    if m.first_excluded:
        first = (f"the first run (trial {m.trials[0]}: {_num(m.values[0])}) is not averaged in: it made the "
                 "configuration a candidate, and the top of many single runs reads high")
        note = f"{first}; {note}" if note else first
    out = measurement(m.backing, m.backing_trials, at=at, note=note, interval=m.interval95)
    out["excluded"] = {"trial": m.trials[0], "value": m.values[0]} if m.first_excluded else None
    out["noise"] = None if m.pooled is None else m.pooled.to_json()
    if m.pooled is not None:
        out["text"] += f"; interval from the {m.pooled}"
    return out


# -- memory back-off ---------------------------------------------------------------------------
MEMORY_NAMES = frozenset({
    "mem_fraction_static", "--mem-fraction-static",             # SGLang (and the simulated host)
    "gpu_memory_utilization", "--gpu-memory-utilization",       # vLLM
    "VLLM_CPU_KVCACHE_SPACE",                                   # vLLM on CPU (GiB)
    "kv_cache_memory_bytes", "--kv-cache-memory-bytes",         # vLLM
    "cb_max_memory_percent", "--cb-max-memory-percent",         # transformers serve
    "max_total_tokens", "--max-total-tokens",                   # SGLang's KV pool, in tokens
})
"""Parameters (by name, flag or env var) that size what an engine takes of the memory: higher
asks for more, so a memory failure at a higher value bounds them."""
_MEMORY_WORDS = re.compile(r"mem(ory)?[_-]?(fraction|utili[sz]ation|percent)|kv[_-]?cache[_-]?(space|memory)", re.I)
MEMORY_FAILURES = frozenset({"oom", "not-enough-memory"})
"""Failure kinds the runner stores for a server that ran out of memory (or had too little)."""
_NCCL_OOM = re.compile(r"out of memory|CUDA calloc|Cuda failure", re.I)


def memory_parameter(name: str, param: Any = None) -> bool:
    """Whether a parameter sizes the engine's memory: its name, flag or env var is one of
    :data:`MEMORY_NAMES` or reads like one (``..._memory_fraction``, ``kv_cache_space``)."""
    keys = [name] + [k for k in (getattr(param, "flag", None), getattr(param, "env", None)) if k]
    return any(k in MEMORY_NAMES or _MEMORY_WORDS.search(k) for k in keys)


def memory_failure(v: TrialRecord) -> str | None:
    """The memory failure kind of a trial: ``oom``, ``not-enough-memory``, ``oom under load``
    (an OOM under load; in studies recorded before, a crash under load whose log said OOM),
    ``nccl-oom`` (NCCL could not allocate); else None."""
    f = v.failure
    if f is None:
        return None
    if f.kind in MEMORY_FAILURES:
        return "oom under load" if f.kind == "oom" and f.phase == "load" else str(f.kind)
    if f.kind == "crash-under-load" and f.cause in ("oom", "not-enough-memory"):
        return "oom under load"
    if f.kind == "nccl-error" and _NCCL_OOM.search(f.message):
        return "nccl-oom"
    return None


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def backoff_value(param: Any, best: Any, nearest: float, margin: float) -> tuple[Any, float]:
    """The value at least ``margin`` below ``nearest`` (absolute for a fraction, a parameter
    within [0, 1]; else relative to ``nearest``), on ``param``'s grid (one step at least), not
    above ``best`` and not below the low bound. Returns (value, the margin applied)."""
    if param.type == "categorical":
        fraction = all(0 <= c <= 1 for c in param.choices if _is_number(c))
        gap = margin if fraction else margin * abs(nearest)
        below = sorted(c for c in param.choices if _is_number(c) and c < nearest and c <= nearest - gap)
        value = below[-1] if below else best
        return (min(value, best) if below else best), gap
    low = float(param.low)
    fraction = low >= 0 and float(param.high) <= 1
    gap = margin if fraction else margin * abs(nearest)
    step = param.step or (1 if param.type == "int" else None)
    if step:
        gap = max(gap, float(step))
        k = math.floor((nearest - gap - low) / step + 1e-6)
        value: float = low + k * step
    else:
        value = nearest - gap
    value = max(value, low)
    value = min(value, best)
    return param.normalise(value), gap


def memory_backoff(best: TrialRecord, views: Sequence[TrialRecord], space: Any, margin: float,
                   no_space: str = "the study's search space could not be read",
                   ) -> tuple[TrialRecord, list[dict[str, Any]]]:
    """``best`` with its memory parameters backed off (see the module docstring), and one note
    per memory parameter: ``{"parameter", "measured", "exported", "margin", "boundary", "text"}``.

    The rule: the memory failures considered are those of every trial of the study (whatever its
    other parameters) at a value at or above the best's; the nearest of them is the boundary.
    ``space``: the study's :class:`~autotune.config.space.SearchSpace` (None: nothing is changed and
    the note says why: ``no_space``).
    """
    notes: list[dict[str, Any]] = []
    if space is None:
        names = [n for n in best.params if memory_parameter(n)]
        for n in names:
            notes.append({"parameter": n, "measured": best.params[n], "exported": best.params[n], "margin": None,
                          "boundary": None, "text": f"{n} {_show(best.params[n])} kept: {no_space}, no back-off applied"})
        return best, notes
    params = dict(best.params)
    for name, p in space.parameters.items():
        if name not in params or not memory_parameter(name, p) or p.type not in ("int", "float", "categorical"):
            continue
        b = params[name]
        note: dict[str, Any] = {"parameter": name, "measured": b, "exported": b, "margin": None, "boundary": None}
        notes.append(note)
        if not _is_number(b):
            note["text"] = f"{name} {_show(b)} kept: not a number (the engine sizes it), no back-off"
            continue
        failed = [(v.params.get(name), v.number, memory_failure(v)) for v in views if memory_failure(v)]
        failed = [(x, n, k) for x, n, k in failed if _is_number(x)]
        above = sorted((x, n, k) for x, n, k in failed if x >= b)
        # below the best (which ran): only "too little memory" bounds it from below; an OOM there
        # was caused by the trial's other parameters
        below = sorted((x, n, k) for x, n, k in failed if x < b and k == "not-enough-memory")
        tried = [v.params.get(name) for v in views if _is_number(v.params.get(name))]
        if not above:
            top = max(tried) if tried else b
            bound = " (the space's high bound)" if p.type != "categorical" and top >= p.high else ""
            note["text"] = (f"{name} {_show(b)} kept: no memory failure (OOM) seen up to {_show(top)}{bound}, "
                            "the highest value tried; no failure boundary measured")
            continue
        nearest, trial_no, kind = above[0]
        note["boundary"] = {"value": nearest, "trial": trial_no, "kind": kind}
        new, gap = backoff_value(p, b, nearest, margin)
        note["margin"] = gap
        why = f"trial {trial_no} failed ({kind}) at {_show(nearest)}"
        if below and _is_number(new) and new <= below[-1][0]:
            x, n, k = below[-1]
            note["text"] = (f"{name} {_show(b)} kept, only {_show(round(nearest - b, 10))} from the failure boundary: "
                            f"{why}, and trial {n} failed ({k}) at {_show(x)} below it: no safe value between them")
            continue
        if new == b:
            if nearest - b >= gap - 1e-9:
                note["text"] = f"{name} {_show(b)} kept: {why}, at least the margin {_show(gap)} above it"
            else:
                note["text"] = (f"{name} {_show(b)} kept, though {why} (margin {_show(gap)}): nothing lower in the "
                                "space")
            continue
        trial_params = {**params, name: new}
        note["exported"] = new
        params = trial_params
        low_note = " (the space's low bound)" if p.type != "categorical" and new <= p.low else ""
        distance = round(nearest - new, 10)
        short = " (as far as the space goes)" if distance < gap - 1e-9 else ""
        note["text"] = (f"{name} {_show(b)} -> {_show(new)}{low_note}: {why}; exported {_show(distance)} below "
                        f"it{short}, margin {_show(round(gap, 10))}")
    if params == best.params:
        return best, notes
    changed = _relaunch(best, space, params)
    if changed is None:
        for note in notes:
            if note["exported"] != note["measured"]:
                note["text"] += ("; NOT APPLIED: the trial's command does not end with the flags the space "
                                 f"gives, so the exported value stays {_show(note['measured'])}")
                note["exported"] = note["measured"]
        return best, notes
    return changed, notes


def _relaunch(best: TrialRecord, space: Any, params: dict[str, Any]) -> TrialRecord | None:
    """``best`` with the env and flags of ``params`` in place of its own; None when the trial's
    command does not end with its flags as the space applies them (or the rules change more)."""
    old, new = space.to_launch(best.params), space.to_launch(params)
    if new.applied != params or len(new.args) != len(old.args):
        return None
    tmpl = list(best.argv_template or best.argv)
    start = len(tmpl) - len(old.args)
    if start < 0 or tmpl[start:] != old.args or any(i >= start for i in best.secret_args):
        return None
    env = dict(best.env)
    for k in old.env:
        if k not in new.env:
            env.pop(k, None)
    env.update(new.env)
    argv_template = tmpl[:start] + list(new.args)
    return dataclasses.replace(best, params=params, env=env, argv_template=argv_template,
                               argv=[w.replace(PORT_FIELD, str(best.port or 0)) for w in argv_template])


# -- profile and formats ---------------------------------------------------------------------
def profile(study_name: str, metric: str | None, direction: str, best: TrialRecord, port: int, *,
            python: str = DEFAULT_PYTHON, launch_template: str | None = None, interpreters: Iterable[str] = (),
            measured: dict[str, Any] | None = None, provenance: dict[str, Any] | None = None,
            memory: list[dict[str, Any]] | None = None, verify: dict[str, Any] | None = None,
            warnings: Iterable[str] = (), exported_at: str | None = None) -> dict[str, Any]:
    """The launch profile as data (the ``json``/``yaml`` formats).

    ``env`` and ``command`` hold secrets as references ``${NAME}``; ``secrets`` names them;
    ``command_line`` is the command for a shell (secrets as ``"${NAME}"``). ``command`` has the
    interpreter ``python`` where the trial ran the tuner host's (``launch_template``'s ``{python}``
    fields, ``interpreters``, or the tuner's own); ``command_template`` has ``{port}`` and
    ``{python}`` there instead (``python_words``: the words holding ``{python}``).
    ``exported_at``: the date of the export (default: now, UTC).
    """
    raw = list(best.argv_template or best.argv)
    spans = interpreter_spans(raw, launch_template, interpreters)
    template = command_template(raw, spans)
    python_words = sorted(spans)
    argv = fill(template, python_words, port=port, python=python)
    value = best.value
    prof: dict[str, Any] = {
        "autotune_profile": PROFILE_VERSION,
        "study": study_name,
        "trial": best.number,
        "metric": metric,
        "unit": unit_of(metric),
        "direction": direction,
        "value": value,
        "measured": measured or measurement([float(value)] if value is not None else [], [best.number]),
        "provenance": provenance or {},
        "memory": list(memory or []),
        "params": best.params,
        "python": python,
        "command_line": _display_words(argv, best.secret_args),
        "command": argv,
        "env": best.env,
        "port": port,
        "secrets": secret_names(best.env, template, best.secret_env, best.secret_args),
        "metrics": best.metrics,
        "exported_at": exported_at or _now(),
        "command_template": template,
        "python_words": python_words,
        "secret_env": secret_env(best.env, best.secret_env),
        "secret_args": {str(i): n for i, n in sorted(best.secret_args.items())},
        "verify": verify or {},
        "warnings": list(warnings),
    }
    prof["warnings"] += _tuner_paths(prof)
    return prof


def _tuner_paths(prof: Mapping[str, Any]) -> list[str]:
    """Where the profile still names the tuner's own virtual environment (a word the user wrote
    into the target's command or env, kept as written): one warning each."""
    if sys.prefix == sys.base_prefix:  # not a virtual environment: its prefix is the system's
        return []
    roots = {sys.prefix, os.path.realpath(sys.prefix)}
    found = [f"command word {i + 1}" for i, w in enumerate(prof["command_template"]) if any(r in w for r in roots)]
    found += [f"env {k}" for k, v in prof["env"].items() if any(r in v for r in roots)]
    return [f"{where} names the tuner's virtual environment {sys.prefix} (as the study's config has it): "
            "it may not exist on the serving host" for where in found]


def render(fmt: str, prof: dict[str, Any]) -> str:
    """Render a profile (:func:`profile`) in ``fmt`` (one of :data:`FORMATS`).

    The command is the profile's ``command_template`` (``{port}`` fields and, in its
    ``python_words``, ``{python}`` fields; the ``sh`` format reads ``$PORT`` and ``$PYTHON``);
    its secrets are the profile's ``secret_env`` and ``secret_args``.

    Raises:
        UsageError: an env name is not a shell identifier (``sh``/``env`` formats).
    """
    if fmt == "json":
        return json.dumps(prof, indent=2) + "\n"
    if fmt == "yaml":
        return yaml.safe_dump(prof, sort_keys=False)
    template = list(prof["command_template"])
    env: dict[str, str] = prof["env"]
    for k in env:
        if not _ENV_NAME.fullmatch(k):
            raise UsageError(f"env var name {json.dumps(k)} is not a shell name and cannot be exported as {fmt}")
    secrets = secret_env(env, prof.get("secret_env") or {})
    args = {int(i): n for i, n in (prof.get("secret_args") or {}).items()}
    python_words = prof.get("python_words") or []
    if fmt == "env":
        lines = _header(prof, fmt) + [f"# command: {one_line(prof['command_line'])}",
                                      "# for bash: set -a; source THIS_FILE; set +a"]
        for k, v in env.items():
            if k in secrets:
                lines.append(f"# {k}: a secret, not stored here: export it before sourcing this file")
                lines.append(f"{k}={reference(secrets[k])}")
            else:
                lines.append(f"{k}={shlex.quote(v)}")
        return "\n".join(lines) + "\n"
    if fmt != "sh":
        raise ValueError(f"unknown format {fmt!r}")
    lines = ["#!/usr/bin/env bash"] + _header(prof, fmt) + [
        "set -euo pipefail",
        f'PORT="${{PORT:-{int(prof["port"])}}}"',
    ]
    if python_words:
        py = prof.get("python") or DEFAULT_PYTHON
        if _PLAIN_WORD.fullmatch(py):
            lines.append(f'PYTHON="${{PYTHON:-{py}}}"')
        else:
            lines.append(f'if [ -z "${{PYTHON:-}}" ]; then PYTHON={shlex.quote(py)}; fi')
    for k, v in env.items():
        lines.append(f'export {k}="{_missing(secrets[k])}"' if k in secrets else f"export {k}={shlex.quote(v)}")
    words = _sh_words(template, args, python_words)
    lines.append('echo "starting server on port $PORT" >&2')
    if words:
        lines.append("exec " + " ".join(words))
    return "\n".join(lines) + "\n"


# -- a profile from a stored study -------------------------------------------------------------
def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _utc(when: Any) -> str | None:
    if not isinstance(when, datetime.datetime):
        return None
    return when.astimezone(datetime.timezone.utc).isoformat(timespec="seconds")


def _objective_data(config: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The study's objective as data (load, metric, benchmark, constraints), for verify."""
    from autotune.config.objective import Objective

    name = config.get("objective") or "throughput"
    overrides = config.get("objective_overrides") or {}
    try:
        o = Objective.load_file(str(name), overrides)
    except UsageError as exc:
        return ({"name": str(name), "overrides": overrides},
                [f"the study's objective could not be read here ({exc}); verify reads it again by name"])
    return o.to_json(), []


def _study_space(study: Any, config: Mapping[str, Any]) -> tuple[Any, list[str]]:
    """The study's search space, or None with the reason (missing, changed since)."""
    import optuna

    from autotune.config.space import SearchSpace

    name = config.get("space")
    if not name:
        return None, ["the study records no search space"]
    try:
        space = SearchSpace.load(str(name))
    except UsageError as exc:
        return None, [f"search space {name} could not be read ({exc})"]
    stored = study.user_attrs.get("space_distributions")
    if isinstance(stored, dict):
        now = {n: optuna.distributions.distribution_to_json(d) for n, d in space.distributions().items()}
        if now != stored:
            return None, [f"search space {name} has changed since the study ran"]
    return space, []


def _read_log(storage: str, study_name: str, trial: Any) -> str:
    """The trial's server log (its artifact, else the study's log folder), at most 8 MiB."""
    from autotune.store.storage import artifact_dir

    root = artifact_dir(storage)
    candidates = []
    if trial.user_attrs.get("log_artifact"):
        candidates.append(root / str(trial.user_attrs["log_artifact"]))
    candidates.append(root / "logs" / study_name / f"trial-{trial.number:04d}.log")
    for path in candidates:
        try:
            with open(path, "rb") as f:
                return f.read(8 * 1024 * 1024).decode("utf-8", errors="replace")
        except (OSError, ValueError):
            continue
    return ""


def chosen_trial(study: Any, views: Sequence[TrialRecord], *, rule: ChoiceRule | None = None,
                 number: int | None = None) -> tuple[TrialRecord, dict[str, Any] | None]:
    """The trial to export and, when it was not simply the best of a single-objective study, how
    it was chosen: ``{"rule", ..., "text", "trial", "front"}`` (:meth:`autotune.config.pareto.Choice.to_json`;
    ``rule`` is ``trial`` for one given by number).

    A multi-objective study: the trial ``rule`` (default: the study's) picks from the Pareto front.
    ``number``: that trial, which must have been measured.

    Raises:
        UsageError: no feasible trial; trial ``number`` was not measured; ``rule`` given for a
            single-objective study.
    """
    from autotune.store.study_view import is_multi_objective, objectives, pick

    name = study.study_name
    feasible = [v for v in views if v.value is not None]
    if not feasible:
        raise UsageError(f"study '{name}' has no feasible trial to export")
    multi = is_multi_objective(study)
    if rule is not None and not multi:
        raise UsageError(f"--choose picks from a multi-objective study's Pareto front; study '{name}' has one "
                         "objective (--trial N exports another trial)")
    if not multi:  # as `study best` chooses: the best configuration by its figure, not the luckiest run
        best = best_of(feasible, study.direction.name == "MAXIMIZE")
        assert best is not None
    chosen = pick(study, list(views), rule) if multi else None
    if number is None:
        if chosen is None:
            return best, None
        return next(v for v in feasible if v.number == chosen.number), chosen.to_json()
    given = next((v for v in feasible if v.number == number), None)
    if given is None:
        shown = ", ".join(str(v.number) for v in sorted(feasible, key=lambda v: v.number)[:20])
        raise UsageError(f"--trial {number}: study '{name}' has no measured trial {number} (measured: {shown}"
                         f"{', ...' if len(feasible) > 20 else ''})")
    if chosen is None:
        why = "the best" if given.params == best.params else f"the best is trial {best.number}"
        return given, {"rule": "trial", "text": f"trial {number}, given with --trial ({why})", "trial": number,
                       "front": []}
    goals = objectives(study)
    beaten = [v.number for v in feasible if v.values is not None and given.values is not None
              and dominates(v.values, given.values, goals)]
    where = ("on the Pareto front" if not beaten else
             f"not on the Pareto front: trial {beaten[0]} is at least as good on every objective")
    return given, {"rule": "trial", "text": f"trial {number}, given with --trial ({where}; the rule would pick "
                                            f"trial {chosen.number})", "trial": number, "front": list(chosen.front)}


def from_study(study: Any, storage: str, *, port: int | None = None, python: str | None = None,
               memory_margin: float = DEFAULT_MEMORY_MARGIN, rule: ChoiceRule | None = None,
               number: int | None = None) -> tuple[dict[str, Any], TrialRecord]:
    """The launch profile of a stored study's best feasible trial, and the trial as exported
    (memory parameters backed off). A multi-objective study exports the Pareto front's trial that
    ``rule`` (default: the rule its objective states) picks; ``number`` exports that trial instead
    (:func:`chosen_trial`). The profile then says how it was chosen (``choice``, and a header line).

    Raises:
        UsageError: the study has no feasible trial; as :func:`chosen_trial`.
    """
    from autotune.engines.registry import PRESETS
    from autotune.execution.provenance import engine_version, provenance, select_host_facts
    from autotune.store.study_view import objectives
    from autotune.store.record import objective_metric, read

    name = study.study_name
    frozen = {t.number: t for t in study.get_trials(deepcopy=False)}
    views = [read(t) for t in frozen.values()]
    best, choice = chosen_trial(study, views, rule=rule, number=number)
    config = study.user_attrs.get("config") or {}
    target = config.get("target") or {}
    engine = str(target.get("engine", "sim"))
    preset = PRESETS.get(engine)
    chosen_port = port if port is not None else (preset.default_port if preset is not None else 30000)
    metric = objective_metric(study)
    dates = {n: d for n, t in frozen.items() if (d := _utc(t.datetime_complete))}

    space, why = _study_space(study, config)
    exported, memory = memory_backoff(best, views, space, memory_margin, *why)
    if exported is best:
        measured = pooled(views, best.params, dates)
    else:
        changes = ", ".join(f"{m['parameter']} {_show(m['measured'])} -> {_show(m['exported'])}"
                            for m in memory if m["exported"] != m["measured"])
        measured = pooled(views, exported.params, dates, note=f"measured at the backed-off values ({changes})")
        if measured is None:
            measured = pooled(views, best.params, dates, note=f"measured before the memory back-off ({changes}); "
                                                              "the exported values were not measured")

    # provenance: the best trial's own sources first, then the other trials of its host
    trial = frozen[best.number]
    host = trial.user_attrs.get("host")
    same_host = [trial] + [t for t in frozen.values() if t.user_attrs.get("host") == host and t is not trial]
    infos = [t.user_attrs.get("server_info") for t in same_host]
    info = next((i for i in infos if engine_version(i)), infos[0])
    excerpts = [text for t in same_host for k in ("failure_message", "failure_excerpt")
                if (text := str(t.user_attrs.get(k) or ""))]
    exported_at = _now()
    prov = provenance(engine=engine, server_info=info, log_text=_read_log(storage, name, trial),
                      facts=select_host_facts(study.user_attrs.get("host_facts"), host), extra_logs=excerpts)
    prov.update(study=name, trial=best.number, host=host, measured_at=dates.get(best.number), exported_at=exported_at)

    ssh = target.get("ssh") or {}
    remote = isinstance(host, str) and host.startswith("ssh://")
    chosen_python = python or (str(ssh.get("python")) if remote and ssh.get("python") else DEFAULT_PYTHON)
    interpreters = [str(ssh["python"])] if remote and ssh.get("python") else []
    objective, warnings = _objective_data(config)
    # what verify needs to run it as the study's runner did (autotune.execution.executors.make_runner):
    # the target's fields (runner_fields) and the config's extra secret names
    verify_data = {"engine": engine, "model": target.get("model"), "scenario": target.get("scenario"),
                   "secrets": [str(s) for s in target.get("secrets") or []], "objective": objective,
                   "ready_path": target.get("ready_path"), "api": target.get("api"),
                   "ready_timeout_s": target.get("ready_timeout_s")}
    launch_template = target.get("command") or (preset.template if preset is not None else None)
    goals = objectives(study)
    prof = profile(name, metric, goals[0].direction, exported, chosen_port, python=chosen_python,
                   launch_template=launch_template, interpreters=interpreters, measured=measured, provenance=prov,
                   memory=memory, verify=verify_data, warnings=warnings, exported_at=exported_at)
    if exported is not best:
        prof["measured_params"] = best.params
    if len(goals) > 1:
        prof["objectives"] = [{**g.to_json(), "value": v} for g, v in zip(goals, best.values or [])]
    if choice is not None:
        prof["choice"] = choice
    return prof, exported


# -- verify: launch a profile once and measure it again ----------------------------------------
@dataclasses.dataclass
class LoadedProfile:
    """A profile read back: its data, and the ``sh`` script to run when it is one."""

    path: Path
    data: dict[str, Any]
    script: bool


def load_profile(path: Path) -> LoadedProfile:
    """Read a profile of any format (``sh``/``env`` by their ``# autotune-profile:`` line).

    Raises:
        UsageError: one line: the file cannot be read, or is not an autotune launch profile.
    """
    shown = one_line(str(path))
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"{shown}: no such file") from None
    except IsADirectoryError:
        raise UsageError(f"{shown}: is a folder; give a profile file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{shown}: cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    data: Any = None
    line = next((ln for ln in text.splitlines() if ln.startswith(PROFILE_LINE)), None)
    script = False
    try:
        if line is not None:
            data = json.loads(line[len(PROFILE_LINE):])
            script = text.startswith("#!") and "\nexec " in text
        else:
            try:
                data = json.loads(text)
            except ValueError:
                data = yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise UsageError(f"{shown}: not an autotune launch profile: cannot parse it "
                         f"({one_line(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)})") from None
    problem = _profile_problem(data)
    if problem:
        raise UsageError(f"{shown}: not an autotune launch profile: {problem}")
    return LoadedProfile(path, data, script)


def _profile_problem(data: Any) -> str:
    """Why ``data`` cannot be verified, or ""."""
    if not isinstance(data, dict) or "autotune_profile" not in data:
        return "no autotune_profile data (export it again with this version of autotune)"
    if data["autotune_profile"] != PROFILE_VERSION:
        return f"profile version {data['autotune_profile']!r}, this autotune reads {PROFILE_VERSION}"
    tmpl = data.get("command_template")
    if not isinstance(tmpl, list) or not tmpl or not all(isinstance(w, str) for w in tmpl):
        return "command_template: expected a non-empty list of words"
    env = data.get("env")
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        return "env: expected a mapping of text to text"
    if not isinstance(data.get("python_words"), list) or not all(isinstance(i, int) for i in data["python_words"]):
        return "python_words: expected a list of word numbers"
    if data.get("direction") not in ("maximize", "minimize"):
        return "direction: expected maximize or minimize"
    measured = data.get("measured")
    mean = measured.get("mean") if isinstance(measured, dict) else None
    if not _is_number(mean) or mean <= 0:  # type: ignore[operator]
        return "measured.mean: expected a positive number (the recorded measurement)"
    v = data.get("verify")
    if not isinstance(v, dict) or not isinstance(v.get("objective"), dict):
        return "verify.objective: missing (what load to measure it under)"
    from autotune.engines.registry import PRESETS

    if v.get("engine") not in PRESETS:
        return f"verify.engine: unknown engine {v.get('engine')!r}"
    if PRESETS[v["engine"]].serverless:
        return f"engine {v['engine']} runs no server: there is nothing to launch"
    for key in ("model", "scenario"):
        if not isinstance(v.get(key) or "", str):
            return f"verify.{key}: expected text"
    if not isinstance(v.get("secrets") or [], list) or not all(isinstance(s, str) for s in v.get("secrets") or []):
        return "verify.secrets: expected a list of env names and flags"
    for key in ("secret_env", "secret_args"):
        if not isinstance(data.get(key, {}), dict):
            return f"{key}: expected a mapping"
    return ""


def _objective(data: Mapping[str, Any]) -> Any:
    from autotune.config.objective import Objective

    o = data["verify"]["objective"]
    if "metric" not in o:  # recorded by name only
        return Objective.load_file(str(o.get("name")), o.get("overrides") or {})
    keys = ("name", "metric", "direction", "objectives", "choose", "load", "loads", "weighted", "benchmark",
            "constraints")
    return Objective.from_mapping({k: o[k] for k in keys if o.get(k) is not None}, "the profile's objective")


def _escape(word: str, fields: Iterable[str]) -> str:
    """``word`` as a launch template word: braces doubled except in the given ``{field}``\\ s."""
    parts = [word]
    for f in fields:
        parts = [q for p in parts for q in _split_keep(p, f)]
    return "".join(p if p in fields else p.replace("{", "{{").replace("}", "}}") for p in parts)


def _split_keep(text: str, sep: str) -> list[str]:
    pieces = text.split(sep)
    out: list[str] = []
    for i, p in enumerate(pieces):
        if i:
            out.append(sep)
        out.append(p)
    return out


def _expand_secrets(data: Mapping[str, Any], environ: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """The profile's env and command template with its secrets taken from ``environ``.

    Raises:
        UsageError: a secret is not set (named).
    """
    def value(name: str) -> str:
        v = environ.get(name)
        if not v:
            raise UsageError(f"the profile refers to the secret {name}, which it does not store: "
                             f"set {name} in the environment")
        return v

    env = dict(data["env"])
    for k, name in (data.get("secret_env") or {}).items():
        if env.get(k) == reference(name):
            env[k] = value(name)
    words = list(data["command_template"])
    for i, name in (data.get("secret_args") or {}).items():
        idx = int(i)
        hit = _secret_word(words[idx], name) if 0 <= idx < len(words) else None
        if hit is not None:
            words[idx] = hit[0] + value(name)
    return env, words


def verify(path: Path, *, repeats: int = 1, timeout_s: float | None = None, python: str | None = None,
           tolerance: float = 0.10, child_umask: int | None = None,
           say: Callable[[str], None] = lambda line: None, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Launch the profile at ``path`` on this machine ``repeats`` times under the study's
    objective load, measure each run with the project's runner, tear it down, and compare the
    mean with the recorded one.

    An ``sh`` profile runs as a person runs it (``bash PROFILE``, ``PORT`` set); the others run
    their command and env. The interpreter: ``python``, else ``$PYTHON``, else the profile's.

    Returns ``{"ok", "code", "ratio", "measured", "recorded", ...}``: ``code`` 0 when the mean is
    not worse than the recorded one by more than ``tolerance`` (slower for a maximised metric,
    higher for a minimised one), 1 when it is or a run failed (``failure`` says how).

    Raises:
        UsageError: the profile cannot be read or verified (a missing secret, a bad objective).
    """
    from autotune.config.study import TargetConfig
    from autotune.engines.registry import PRESETS
    from autotune.execution.executors import runner_fields
    from autotune.execution.hosts import LocalHost
    from autotune.execution.runner import TrialRunner, TrialSpec

    environ = os.environ if environ is None else environ
    loaded = load_profile(path)
    data = loaded.data
    objective = _objective(data)
    metric = data.get("metric") or objective.metric
    v = data["verify"]
    preset = PRESETS[v["engine"]]
    host = LocalHost(child_umask=child_umask)
    chosen_python = python or environ.get("PYTHON") or data.get("python") or DEFAULT_PYTHON
    if loaded.script:
        port: int | None = host.free_port()
        template = "bash " + shlex.quote(_escape(str(path.resolve()), ()))
        env = {"PORT": str(port), **({"PYTHON": python} if python else {})}
        how = f"bash {path}"
    else:
        port = None
        env, words = _expand_secrets(data, environ)
        python_words = set(data["python_words"])
        template = " ".join(shlex.quote(_escape(w, (PORT_FIELD, PYTHON_FIELD) if i in python_words else (PORT_FIELD,)))
                            for i, w in enumerate(words))
        how = "its command"
    # the fields and secrets of the study's runner (autotune.execution.executors.make_runner), from the target
    target = TargetConfig.model_construct(engine=v["engine"], model=v.get("model"), scenario=v.get("scenario"))
    log_dir = Path(tempfile.mkdtemp(prefix="autotune-verify-"))  # after every check: nothing left on bad input
    runner = TrialRunner(host, preset, objective, log_dir=log_dir, template=template,
                         fields={**runner_fields(target), "python": chosen_python},
                         fixed_env=env, ready_timeout_s=float(timeout_s or v.get("ready_timeout_s") or 600.0),
                         log_stall_s=None, ready_path=v.get("ready_path"), api=v.get("api"), port=port,
                         secrets=v.get("secrets") or [])
    recorded = data["measured"]
    values: list[float] = []
    failure: dict[str, Any] | None = None
    for i in range(repeats):
        say(f"run {i + 1}/{repeats}: launching {how} (interpreter {chosen_python}) under objective "
            f"{objective.name}, then measuring {metric}")
        result = runner.run(TrialSpec(number=i + 1, env={}, args=[]))
        got = result.metrics.get(metric)
        if result.outcome != "ok" or got is None:
            f = result.failure
            failure = {"run": i + 1, "kind": f.kind if f else "metric-missing",
                       "message": f.message if f else f"{metric} not in the results",
                       "excerpt": f.excerpt if f else "",
                       "log": result.log_path if Path(result.log_path).is_file() else None}
            break
        values.append(float(got))
        say(f"run {i + 1}/{repeats}: {metric} = {_num(float(got))}")
    doc: dict[str, Any] = {"profile": str(path), "study": data.get("study"), "trial": data.get("trial"),
                           "metric": metric, "direction": data["direction"], "recorded": recorded.get("mean"),
                           "recorded_count": recorded.get("count"), "tolerance": tolerance, "runs": len(values),
                           "values": values, "measured": None, "ratio": None, "failure": failure}
    if failure is not None or not values:
        doc.update(ok=False, code=1)
        keep_logs = failure is not None and failure["log"] is not None
    else:
        mean = sum(values) / len(values)
        ratio = mean / float(recorded["mean"])
        worse = ratio < 1 - tolerance if data["direction"] == "maximize" else ratio > 1 + tolerance
        doc.update(measured=mean, ratio=ratio, ok=not worse, code=1 if worse else 0)
        keep_logs = worse
    if keep_logs:  # for the person to read why
        doc["log_dir"] = str(log_dir)
    else:
        shutil.rmtree(log_dir, ignore_errors=True)
    return doc


def verify_lines(doc: Mapping[str, Any]) -> list[str]:
    """A verify result for a person."""
    rec = f"{_num(doc['recorded'])} recorded ({counted(doc['recorded_count'], 'measurement')})"
    where = f"study {doc['study']} trial {doc['trial']}"
    if doc.get("failure"):
        f = doc["failure"]
        lines = [f"FAILED: run {f['run']} of the profile ({where}) did not measure: {f['kind']}: {one_line(str(f['message']))}"]
        if f.get("log"):
            lines.append(f"server log: {f['log']}")
        return lines
    better = "higher" if doc["direction"] == "maximize" else "lower"
    verdict = "ok" if doc["ok"] else f"WORSE than recorded by more than {100 * doc['tolerance']:.0f}%"
    runs = counted(doc['runs'], 'run')
    line = (f"{doc['metric']}: {_num(doc['measured'])} measured ({runs}) vs {rec}, {where}: ratio {doc['ratio']:.3f} "
            f"({better} is better, tolerance {100 * doc['tolerance']:.0f}%): {verdict}")
    return [line] + ([f"server logs: {doc['log_dir']}"] if doc.get("log_dir") else [])


# -- writing ---------------------------------------------------------------------------------
def check_output(path: Path) -> None:
    """Check that a profile can be written at ``path`` (before anything is computed).

    Raises:
        UsageError: ``path`` is a folder, or its folder does not exist or is not a folder.
    """
    shown = one_line(str(path))
    if path.is_dir():
        raise UsageError(f"-o {shown}: is a folder; give a file name")
    parent = path.parent
    if not parent.exists():
        raise UsageError(f"-o {shown}: folder {one_line(str(parent))} does not exist")
    if not parent.is_dir():
        raise UsageError(f"-o {shown}: {one_line(str(parent))} is not a folder")


def write_profile(path: Path, text: str, mode: int) -> None:
    """Write ``text`` to ``path`` with exactly ``mode`` (whatever the umask), whole or not at all:
    a private temporary file in the same folder, renamed over ``path`` (a symlink at ``path`` is
    replaced, not followed).

    Raises:
        UsageError: as :func:`check_output`, or the folder is not writable (nothing is left
            behind).
    """
    check_output(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise UsageError(f"-o {one_line(str(path))}: cannot write: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), mode)
            f.write(text.encode("utf-8", errors="surrogateescape"))
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise UsageError(f"-o {one_line(str(path))}: cannot write: {exc.strerror}") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
