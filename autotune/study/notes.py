"""What the dashboard shows of a study and its trials: Notes written like ``autotune study show``.

optuna-dashboard shows a trial's state, its user attributes (one long dump) and its Note. So each
finished trial gets a Markdown Note (:func:`trial_note`): the outcome in words, the failure kind,
its blame and phase, the key lines of the log excerpt, the metrics, the parameters as applied,
slot/host, duration, the log artifact's id and the constraints; and the study gets one
(:func:`study_note`): the counts and the best as ``study best`` chooses it, and, where the
dashboard's own "Best Trial" card shows another trial (the highest single run), why that one is
not the best (its note says so too).

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
from typing import Any

import optuna
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial, TrialState

from autotune.util.text import one_line
from autotune.outcome.failures import NOTABLE, SERVER_PATTERNS
from autotune.store import record
from autotune.store.record import Outcome, TrialRecord, counts_text, objective_metric, read, read_all
from autotune.store.study_view import backing_text, best_view, load_text, objectives, proposal_text
from autotune.util.units import unit_of

NOTE_HASH_PREFIX = "autotune:note:"
"""Study system attr ``autotune:note:<trial_id>``: sha256 of the note autotune last wrote."""
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
    "COMPLETE": ("Optuna records an infeasible trial as *Complete* with its constraint `failure` > 0 (the dashboard's "
                 "plots show it as *Infeasible*); its value is a placeholder just below every value measured before it, not a measurement."),
    "PRUNED": "Optuna records an infeasible trial of an earlier version as *Pruned*: it was not stopped early.",
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
    return bool(NOTABLE.search(line)) or any(p.regex.search(line) for p in SERVER_PATTERNS)


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
def trial_note(v: TrialRecord, *, metric: str | None = None, constraints: Mapping[str, float] | None = None,
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
        out.append(f"**Failure:** {_code(v.failure_kind)}: {_text(v.failure.message)}")
        out.append(f"Blamed on the {_text(v.failure.blame)}" + (f", in {_text(v.failure.phase)}" if v.failure.phase else "")
                   + (f" (cause: {_code(v.failure.cause)})" if v.failure.cause else "") + ".")
        lines = key_lines(v.failure.excerpt, v.failure.message)
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


def note_for(study: optuna.Study, t: FrozenTrial) -> str:
    """The note of the stored trial ``t`` of ``study``."""
    r = read(t)
    extra: dict[str, Any] = {"retry of trial": r.retry_of, "fault retries": t.user_attrs.get("fault_retries"),
                             "implied by trial": r.implied_by, "measures again trial": r.confirms}
    if r.ablation:
        extra["ablation"] = f"{r.ablation.get('label')} (run {r.ablation.get('run')})"
    goals = objectives(study)
    return trial_note(r, metric=objective_metric(study), constraints=r.constraints, log_artifact=r.log_artifact,
                      host=r.host, extra=extra, objectives=[g.metric for g in goals] if len(goals) > 1 else ())


# -- the study's note: the chosen best, and why the dashboard's best card may differ -----------
def study_note(study: optuna.Study, records: Sequence[TrialRecord] | None = None) -> str:
    """The study's note: the outcome counts, the best as ``study best`` chooses it, and where
    the dashboard's own "Best Trial" card (the highest single value, whatever measured it again)
    shows a trial outside the runs the best's figure is the mean of (another configuration, or the
    first run of the best's own), which one and why."""
    records = read_all(study) if records is None else list(records)
    metric = objective_metric(study) or "value"
    unit = unit_of(metric)
    out = ["### " + _text(f"Study {study.study_name}"), "", _text(counts_text(records)) + "."]
    best = best_view(study)
    if best is None:
        out += ["", "**Best:** none: no trial was measured."]
        return "\n".join(out) + "\n"
    shown = " ".join(f"{k}={p}" for k, p in best.params.items())
    if best.measured is not None:
        out += ["", f"**Best (as `autotune study best` chooses it):** trial {best.number}, {_code(metric)} = "
                    f"**{_fmt(best.value)} {_text(unit)}**, {_text(backing_text(best.measured))}.",
                "", f"Its configuration: {_code(shown)}"]
    else:  # a multi-objective study: the rule's pick from the front
        out += ["", f"**Chosen from the Pareto front:** trial {best.number}: {_code(shown)}"]
    card = _dashboard_best(study)
    if card is not None and best.measured is not None and card.number not in best.measured.backing_trials:
        out += ["", f"The dashboard's *Best Trial* card shows trial {card.number} ({_fmt(card.value)} {_text(unit)}): "
                    "the highest single run; " + _text(_why_not_best(card, best)) + "."]
    return "\n".join(out) + "\n"


def _dashboard_best(study: optuna.Study) -> FrozenTrial | None:
    """The trial optuna-dashboard's best-trial card shows (the storage's best value of a
    single-objective study), or None."""
    if len(study.directions) > 1:
        return None
    try:
        return record.storage(study).get_best_trial(record.study_id(study))
    except ValueError:
        return None


def _why_not_best(card: FrozenTrial, best: TrialRecord) -> str:
    """Why the trial of the dashboard's best card is not the chosen best."""
    r = read(card)
    if r.outcome is not Outcome.OK:
        return f"it is {r.outcome}, not measured"
    m = best.measured
    if m is not None and m.first_excluded and card.number == m.trials[0]:
        return ("it is the first run of the chosen configuration, which made it a candidate and reads high "
                "(the winner's curse); the figure is the mean of the runs after it")
    return ("it was measured once, and beats the confirmed best by less than the run-to-run noise; "
            "a configuration measured again is judged on the runs that confirmed it")


def trial_note_extra(study: optuna.Study, t: FrozenTrial, best: TrialRecord | None) -> str:
    """What a trial's note adds when the dashboard's best card shows it but it is not the best."""
    card = _dashboard_best(study)
    if best is None or best.measured is None or card is None or card.number != t.number \
            or t.number in best.measured.backing_trials:
        return ""
    return (f"\n**Not the best:** the dashboard's Best Trial card shows this trial, but {_text(_why_not_best(card, best))}; "
            f"the best is trial {best.number} (the study's note says why).\n")


# -- writing ---------------------------------------------------------------------------------
def _hash(body: str) -> str:
    return hashlib.sha256(body.encode("utf-8", errors="surrogateescape")).hexdigest()


def _save(study: optuna.Study, t: FrozenTrial, body: str, *, overwrite: bool, system_attrs: Mapping[str, Any]) -> bool:
    """Save ``body`` as ``t``'s note unless a person wrote it (or it is unchanged); True if saved."""
    key = f"{NOTE_HASH_PREFIX}{record.trial_id(t)}"
    try:  # from the system attrs already read (reading the note reads them all again, for each trial)
        current = record.dashboard_note(system_attrs, t)
    except (ImportError, KeyError, TypeError, ValueError):
        current = record.read_trial_note(study, t)
    if current == body:
        return False
    if current and not overwrite and system_attrs.get(key) != _hash(current):
        return False  # the person's note
    record.save_trial_note(study, t, body)
    record.set_study_system_attr(study, key, _hash(body))
    return True


def _save_study_note(study: optuna.Study, body: str, *, overwrite: bool, system_attrs: Mapping[str, Any]) -> bool:
    """Save ``body`` as the study's note unless a person wrote it (or it is unchanged)."""
    from optuna_dashboard import save_note

    current = record.dashboard_note(system_attrs, None)
    key = f"{NOTE_HASH_PREFIX}study"
    if current == body or (current and not overwrite and system_attrs.get(key) != _hash(current)):
        return False
    save_note(study, body)
    record.set_study_system_attr(study, key, _hash(body))
    return True


def _full_note(study: optuna.Study, t: FrozenTrial, best: TrialRecord | None) -> str:
    return note_for(study, t) + trial_note_extra(study, t, best)


def write_trial_note(study: optuna.Study, trial: int | optuna.Trial | FrozenTrial, *, overwrite: bool = False) -> str:
    """Write the note of one trial (its number, the live trial or a stored one), refresh the
    study's note, and return the trial's.

    Call it after the trial is told, so the note has its final state. A note a person edited
    is kept unless ``overwrite``.
    """
    t = record.frozen(study, trial)
    best = best_view(study)
    body = _full_note(study, t, best)
    attrs = record.study_system_attrs(study)
    _save(study, t, body, overwrite=overwrite, system_attrs=attrs)
    _save_study_note(study, study_note(study), overwrite=overwrite, system_attrs=attrs)
    card = _dashboard_best(study)
    if card is not None and card.number != t.number:  # the card's trial says why it is not the best
        _save(study, card, _full_note(study, card, best), overwrite=overwrite, system_attrs=attrs)
    return body


def write_notes(study: optuna.Study, *, overwrite: bool = False) -> int:
    """Write (or refresh) the notes of every finished trial of ``study`` and the study's own;
    returns how many trial notes were written. Notes a person edited are kept unless ``overwrite``."""
    system_attrs = record.study_system_attrs(study)
    best = best_view(study)
    written = 0
    for t in study.get_trials(deepcopy=False, states=FINISHED):
        written += _save(study, t, _full_note(study, t, best), overwrite=overwrite, system_attrs=system_attrs)
    _save_study_note(study, study_note(study), overwrite=overwrite, system_attrs=system_attrs)
    return written


def write_all_notes(storage: BaseStorage) -> int:
    """:func:`write_notes` for every autotune study in ``storage`` (``autotune dashboard`` before
    serving); studies autotune did not record (no stored config or objective) are left alone."""
    total = 0
    for s in optuna.get_all_study_summaries(storage=storage, include_best_trial=False):
        if "config" in s.user_attrs or "objective" in s.user_attrs:
            total += write_notes(optuna.load_study(study_name=s.study_name, storage=storage))
    return total
