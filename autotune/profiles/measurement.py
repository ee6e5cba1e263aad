"""The measurement a profile records, and how a profile shows numbers and values.

Contracts:

- :func:`measurement`: mean, count and 95% interval (Student t, or one given) of repeated
  measurements of one configuration, with a ``text`` for a person; dates in UTC.
- :func:`pooled`: a configuration's measurement as ``study best`` figures it (trials with
  identical parameters pooled; a configuration measured again is the mean of its runs after the
  first, which is named in ``excluded``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from autotune.store.record import TrialRecord
from autotune.store.study_view import measured_configs
from autotune.util.stats import mean_interval
from autotune.util.text import counted


def show_value(value: Any) -> str:
    """A parameter's value in a note or header: text as a JSON string (quoted, escaped), else ``str``."""
    return json.dumps(value, ensure_ascii=False) if isinstance(value, str) else str(value)


def show_number(x: Any) -> str:
    """A measured number for a person: a float to 4 significant digits."""
    return f"{x:.4g}" if isinstance(x, float) else str(x)


def is_number(x: Any) -> bool:
    """Whether ``x`` is a finite int or float (a bool is not)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


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
        text = f"{show_number(mean)}, 1 measurement, no interval{which}{when}"
    else:
        lo, hi = out["interval95"]
        text = f"mean {show_number(mean)}, 95% interval [{show_number(lo)}, {show_number(hi)}], {counted(n, 'measurement')}{which}{when}"
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
        first = (f"the first run (trial {m.trials[0]}: {show_number(m.values[0])}) is not averaged in: it made the "
                 "configuration a candidate, and the top of many single runs reads high")
        note = f"{first}; {note}" if note else first
    out = measurement(m.backing, m.backing_trials, at=at, note=note, interval=m.interval95)
    out["excluded"] = {"trial": m.trials[0], "value": m.values[0]} if m.first_excluded else None
    out["noise"] = None if m.pooled is None else m.pooled.to_json()
    if m.pooled is not None:
        out["text"] += f"; interval from the {m.pooled}"
    return out
