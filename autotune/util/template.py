"""Checking a command template (``target.command``, an objective's ``benchmark.command``) at load
time, so that a typo fails with one line before anything runs instead of in every trial.

A template is split into words like a shell would (``shlex.split``, no shell ever runs it) and
each word is filled with ``str.format``; see ``EnginePreset.argv`` and ``TrialRunner._benchmark``.
"""

from __future__ import annotations

import shlex
import string

__all__ = ["TARGET_FIELDS", "BENCHMARK_FIELDS", "template_fields"]

TARGET_FIELDS = frozenset({"python", "port", "host", "model", "scenario"})
"""The placeholders of ``target.command`` (``EnginePreset.argv``)."""

BENCHMARK_FIELDS = frozenset({"python", "host", "port", "base_url", "model", "result_file"})
"""The placeholders of ``benchmark.command`` (``TrialRunner._benchmark``)."""


def template_fields(template: str, known: frozenset[str]) -> set[str]:
    """The placeholder names used by ``template``.

    Raises:
        ValueError: a one-line reason: an unbalanced quote, an unbalanced ``{`` or ``}``, an empty
            or positional placeholder (``{}``, ``{0}``), a placeholder that is not one of
            ``known`` (or that reaches into one, like ``{port.real}``), or no word at all.
    """
    if "\x00" in template:
        raise ValueError("contains a NUL character")
    try:
        words = shlex.split(template)
    except ValueError as exc:
        raise ValueError(f"cannot split into words: {str(exc).lower()} (an unbalanced quote?)") from None
    if not words:
        raise ValueError("is empty")
    names = ", ".join("{" + k + "}" for k in sorted(known))
    used: set[str] = set()
    for word in words:
        try:
            parts = list(string.Formatter().parse(word))
        except ValueError as exc:
            raise ValueError(f"word '{word}': {exc} (write {{{{ and }}}} for literal braces)") from None
        for _, field, _, _ in parts:
            if field is None:
                continue
            if field not in known:
                shown = "{" + field + "}"
                raise ValueError(f"unknown placeholder {shown} in '{word}' (known: {names})")
            used.add(field)
        try:  # the values are text at run time: a conversion or format spec must take text
            word.format(**{k: "x" for k in known})
        except (ValueError, KeyError, IndexError, AttributeError, TypeError) as exc:
            raise ValueError(f"word '{word}': {exc}") from None
    return used
