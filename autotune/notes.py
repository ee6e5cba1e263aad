"""What the dashboard shows of a trial: its Note, written like ``autotune study show``.

optuna-dashboard shows a trial's state (an infeasible trial told PRUNED reads "Pruned"), its
user attributes (one long dump of argv, env and template) and its Note, and not the values set
with ``set_constraint``. So each finished trial gets a Markdown Note (:func:`trial_note`): the
outcome in words, the failure kind and message, the key lines of the log excerpt, the metrics,
the parameters as applied, slot/host, duration, the log artifact's id and the constraints; and
:func:`mirror_constraints` copies the constraints into user attributes ``constraint_<key>``.

- :func:`mirror_constraints` runs on a live trial after its constraints are set and before it
  is told (Optuna refuses user attributes on a finished trial).
- :func:`write_trial_note` runs after a trial is told; :func:`write_notes` fills in the notes
  of a study recorded before (``autotune dashboard`` calls it before serving).
- A note a person edited in the dashboard is never overwritten: the hash of each note autotune
  writes is kept in the study's system attrs (``autotune:note:<trial_id>``), and a note whose
  text no longer has that hash is the person's.
"""

from __future__ import annotations

import hashlib
import math
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial, TrialState

from autotune._text import one_line
from autotune.failures import COMMON_PATTERNS, NOTABLE
from autotune.study_view import TrialView, load_text, objectives, proposal_text, view

NOTE_HASH_PREFIX = "autotune:note:"
"""Study system attr ``autotune:note:<trial_id>``: sha256 of the note autotune last wrote."""
CONSTRAINT_ATTR_PREFIX = "constraint_"
"""Trial user attrs ``constraint_<key>``: the trial's constraint values (``failure``: 1.0 when
the configuration failed, -1.0 when it did not; ``slo:<bound>``: > 0 when violated)."""
KEY_LINES = 12
WRAP = 100
"""Widest line of a code block in a note (the dashboard does not wrap code)."""
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)

_OUTCOME_WORDS = {
    "ok": "ok: measured",
    "stopped": "stopped: measured until it could not beat the best trials so far (not infeasible)",
    "infeasible": "infeasible: the configuration failed",
    "fault": "fault: the infrastructure failed (not the configuration's fault; run again)",
    "skipped": "skipped: not launched, an earlier failure implies this configuration fails the same way",
}
_STATE_WORDS = {
    "PRUNED": "Optuna records an infeasible trial as *Pruned*: it was not stopped early, the configuration failed.",
    "FAIL": "Optuna records a fault as *Fail*: it teaches the sampler nothing and the parameters are run again.",
}


# -- Markdown helpers ------------------------------------------------------------------------
def _code(value: Any) -> str:
    """``value`` as one inline code span, safe in a table cell: one line, ``|`` escaped, fenced
    with more backticks than it holds."""
    text = one_line(value if isinstance(value, str) else _fmt(value)).replace("|", "\\|")
    if not text:
        return "` `"
    ticks = "`" * (max((len(m) for m in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def _text(value: Any) -> str:
    """``value`` as plain Markdown text on one line: Markdown's punctuation escaped."""
    return re.sub(r"([\\`*_\[\]<>|~&])", r"\\\1", one_line(value if isinstance(value, str) else _fmt(value)))


def _block(text: str) -> str:
    """``text`` as a fenced code block that nothing in it can close."""
    fence = "`" * max(3, max((len(m) for m in re.findall(r"`{3,}", text)), default=0) + 1)
    return f"{fence}text\n{text}\n{fence}"


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.6g}"
    return str(value)


def _is_key(line: str) -> bool:
    """A line that carries a failure, as the failure classifier reads logs: one of its failure
    patterns (OOM, NCCL errors, ...) or an error, warning, traceback or killed-process line."""
    return bool(NOTABLE.search(line)) or any(p.regex.search(line) for p in COMMON_PATTERNS)


def key_lines(excerpt: str, message: str | None = None, limit: int = KEY_LINES) -> list[str]:
    """The lines of a log excerpt that say what failed: the failure's own line and the error
    lines, in log order (at most ``limit``); the excerpt's last lines if none stands out."""
    lines = [ln.rstrip() for ln in excerpt.splitlines() if ln.strip()]
    msg = (message or "").strip()
    keep = [i for i, ln in enumerate(lines) if (msg and msg in ln) or _is_key(ln)]
    if not keep:
        return lines[-min(limit, 8):]
    if len(keep) > limit:  # the failure's own line first, then the last error lines
        own = [i for i in keep if msg and msg in lines[i]][:1]
        keep = sorted(set(own + keep[-(limit - len(own)):]))
    return [lines[i] for i in keep]


def _wrap(lines: list[str], width: int = WRAP) -> list[str]:
    """Lines of at most ``width`` characters (a long log line goes on, indented, on the next):
    the dashboard does not wrap code, and one long line widens the whole page."""
    out = []
    for line in lines:
        out.append(line[:width])
        out += ["    " + line[i:i + width - 4] for i in range(width, len(line), width - 4)]
    return out


def _command(argv: list[str], width: int = WRAP) -> str:
    """The command for a shell, continued with ``\\`` before ``width`` characters."""
    lines, cur = [], ""
    for word in (shlex.quote(w) for w in argv):
        if cur and len(cur) + 1 + len(word) > width - 2:
            lines.append(cur + " \\")
            cur = "    " + word
        else:
            cur = f"{cur} {word}" if cur else word
    return "\n".join([*lines, cur])


# -- the note --------------------------------------------------------------------------------
def trial_note(v: TrialView, *, metric: str | None = None, constraints: Mapping[str, float] | None = None,
               log_artifact: str | None = None, host: str | None = None, extra: Mapping[str, Any] | None = None,
               objectives: Sequence[str] = ()) -> str:
    """One trial as Markdown, as ``autotune study show`` tells it.

    ``metric``: the objective's metric (shown first); ``constraints``: the trial's constraint
    values; ``log_artifact``: the id of its server log artifact; ``host``: where it ran;
    ``extra``: other facts to list (``baseline``, ``retry_of``, ``ablation``...); ``objectives``:
    a multi-objective study's metrics, each value shown in the outcome line.
    """
    out: list[str] = []
    head = f"Trial {v.number}: {v.outcome}"
    if v.failure_kind:
        head += f" ({v.failure_kind})"
    if v.baseline:
        head += ", the baseline"
    out.append("### " + _text(head))
    words = _OUTCOME_WORDS.get(v.outcome, v.outcome)
    value = f"; {_code(metric or 'value')} = **{_fmt(v.value)}**" if v.value is not None else ""
    if len(objectives) > 1 and v.values is not None:
        value = "; " + ", ".join(f"{_code(m)} = **{_fmt(x)}**" for m, x in zip(objectives, v.values))
    out.append(f"**Outcome:** {_text(words)}{value}. Optuna state: {_code(v.state)}.")
    if v.state in _STATE_WORDS and v.outcome in ("infeasible", "fault", "skipped"):
        out.append(_STATE_WORDS[v.state])
    why, load = proposal_text(v.proposed), load_text(v.load_signals)
    if why:
        out += ["", f"**Proposed:** {_text(why)}."]
    if load:
        out += ["", f"**Load in the engine's log:** {_text(load)}."]
    if v.outcome == "stopped":
        out.append("")
        out.append(f"**Stopped early** {_text((v.early_stop or {}).get('message') or '')}.")
        out.append(f"Optuna records it as *{_text(v.state.capitalize())}* with its projected values as intermediate "
                   "values; it is not infeasible (constraint `failure` = -1) and never the best.")
    if v.failure:
        out.append("")
        out.append(f"**Failure:** {_code(v.failure_kind)}: {_text(v.failure.get('message') or '')}")
        if v.failure.get("cause"):
            out.append(f"(cause: {_code(v.failure['cause'])})")
        lines = key_lines(str(v.failure.get("excerpt") or ""), v.failure.get("message"))
        if lines:
            out.append("")
            out.append("Key lines of the server log:")
            out.append("")
            out.append(_block("\n".join(_wrap(lines))))
    if v.metrics:
        # A stopped load's metrics count only the requests done before the stop (often none, so
        # a throughput of 0): the bound above is what it measured, and no metric is its figure.
        head = "metric (requests done before the stop)" if v.outcome == "stopped" else "metric"
        out += ["", f"| {head} | value |", "|---|---|"]
        shown: set[str | None] = set() if v.outcome == "stopped" else set(objectives) or {metric}
        order = sorted(v.metrics, key=lambda k: (k not in shown, k))
        out += [f"| {'**' + _text(k) + '**' if k in shown else _text(k)} | {_code(v.metrics[k])} |" for k in order]
    if v.params:
        out += ["", "| parameter (as applied) | value |", "|---|---|"]
        out += [f"| {_text(k)} | {_code(p)} |" for k, p in v.params.items()]
    if constraints:
        out += ["", "| constraint | value | |", "|---|---|---|"]
        out += [f"| {_text(k)} | {_code(c)} | {'violated' if c > 0 else 'met'} |" for k, c in constraints.items()]
    facts: list[str] = []
    if v.slot:
        facts.append(f"slot {_code(v.slot)}")
    if host:
        facts.append(f"host {_code(host)}")
    if isinstance(v.duration_s, (int, float)):
        facts.append(f"duration {v.duration_s:.1f} s")
    if isinstance(v.startup_s, (int, float)):
        facts.append(f"startup {v.startup_s:.1f} s")
    for k, val in (extra or {}).items():
        if val not in (None, False, "", {}, []):
            facts.append(f"{_text(k)} {_code(val)}")
    if facts:
        out += ["", " · ".join(facts)]
    if log_artifact:
        out += ["", f"Server log: artifact {_code(log_artifact)} (the Artifacts section of this trial)."]
    if v.argv:
        out += ["", "Command (as launched):", "", _block(_command(v.argv))]
    return "\n".join(out) + "\n"


def _constraints(t: FrozenTrial) -> dict[str, float]:
    try:
        return dict(t.constraints)
    except (AttributeError, TypeError, ValueError):  # an Optuna without per-key constraints
        return {}


def note_for(study: optuna.Study, t: FrozenTrial) -> str:
    """The note of the stored trial ``t`` of ``study``."""
    ua = t.user_attrs
    extra = {"retry of trial": ua.get("retry_of"), "fault retries": ua.get("fault_retries"),
             "implied by trial": ua.get("implied_by"), "measures again trial": ua.get("confirms")}
    tag = ua.get("ablation")
    if isinstance(tag, Mapping):
        extra["ablation"] = f"{tag.get('label')} (run {tag.get('run')})"
    goals = objectives(study)
    return trial_note(view(t), metric=(study.user_attrs.get("objective") or {}).get("metric"),
                      constraints=_constraints(t), log_artifact=ua.get("log_artifact"), host=ua.get("host"), extra=extra,
                      objectives=[g.metric for g in goals] if len(goals) > 1 else ())


# -- writing ---------------------------------------------------------------------------------
@dataclass
class _NoteTarget:
    """What ``optuna_dashboard.save_note``/``get_note`` read of a trial (a stored trial has no
    live ``optuna.Trial``; building one would run the sampler)."""

    storage: BaseStorage
    study: optuna.Study
    _trial_id: int


def _hash(body: str) -> str:
    return hashlib.sha256(body.encode("utf-8", errors="surrogateescape")).hexdigest()


def _save(study: optuna.Study, t: FrozenTrial, body: str, *, overwrite: bool, system_attrs: Mapping[str, Any]) -> bool:
    """Save ``body`` as ``t``'s note unless a person wrote it (or it is unchanged); True if saved."""
    from optuna_dashboard import get_note, save_note

    target = _NoteTarget(study._storage, study, t._trial_id)
    key = f"{NOTE_HASH_PREFIX}{t._trial_id}"
    try:  # from the system attrs already read (get_note reads them all again, for each trial)
        from optuna_dashboard._note import get_note_from_system_attrs

        current = get_note_from_system_attrs(dict(system_attrs), t._trial_id)["body"]
    except (ImportError, KeyError, TypeError, ValueError):
        current = get_note(target)  # type: ignore[arg-type]
    if current == body:
        return False
    if current and not overwrite and system_attrs.get(key) != _hash(current):
        return False  # the person's note
    save_note(target, body)  # type: ignore[arg-type]
    study._storage.set_study_system_attr(study._study_id, key, _hash(body))
    return True


def _frozen(study: optuna.Study, trial: int | optuna.Trial | FrozenTrial) -> FrozenTrial:
    if isinstance(trial, FrozenTrial):
        return trial
    if isinstance(trial, optuna.Trial):
        return study._storage.get_trial(trial._trial_id)
    trial_id = study._storage.get_trial_id_from_study_id_trial_number(study._study_id, int(trial))
    return study._storage.get_trial(trial_id)


def write_trial_note(study: optuna.Study, trial: int | optuna.Trial | FrozenTrial, *, overwrite: bool = False) -> str:
    """Write the note of one trial (its number, the live trial or a stored one) and return it.

    Call it after the trial is told, so the note has its final state. A note a person edited
    is kept unless ``overwrite``.
    """
    t = _frozen(study, trial)
    body = note_for(study, t)
    _save(study, t, body, overwrite=overwrite, system_attrs=study._storage.get_study_system_attrs(study._study_id))
    return body


def write_notes(study: optuna.Study, *, overwrite: bool = False) -> int:
    """Write (or refresh) the notes of every finished trial of ``study``; returns how many were
    written. Notes a person edited are kept unless ``overwrite``."""
    system_attrs = study._storage.get_study_system_attrs(study._study_id)
    written = 0
    for t in study.get_trials(deepcopy=False, states=FINISHED):
        written += _save(study, t, note_for(study, t), overwrite=overwrite, system_attrs=system_attrs)
    return written


def write_all_notes(storage: BaseStorage) -> int:
    """:func:`write_notes` for every autotune study in ``storage`` (``autotune dashboard`` before
    serving); studies autotune did not record (no stored config or objective) are left alone."""
    total = 0
    for s in optuna.get_all_study_summaries(storage=storage, include_best_trial=False):
        if "config" in s.user_attrs or "objective" in s.user_attrs:
            total += write_notes(optuna.load_study(study_name=s.study_name, storage=storage))
    return total


def mirror_constraints(trial: optuna.Trial) -> dict[str, float]:
    """Copy the constraints set on the live ``trial`` into user attrs ``constraint_<key>`` (the
    dashboard shows user attrs, not constraints); returns them. Call it after the last
    ``set_constraint`` and before the trial is told."""
    frozen = trial.storage.get_trial(trial._trial_id)
    values = _constraints(frozen)
    for k, c in values.items():
        trial.set_user_attr(f"{CONSTRAINT_ATTR_PREFIX}{k}", c)
    return values
