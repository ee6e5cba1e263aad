"""A profile's command line: its secrets, its interpreter, its port, and their bash quoting.

Contracts:

- Any value is allowed in env and argv (quotes, ``$``, backticks, newlines, unicode); only NUL
  cannot occur. :func:`sh_words` quotes every word for bash: literal text single-quoted.
- No path of the tuner's own environment: where the launch template had ``{python}`` (or a word
  is the tuner's own interpreter, :func:`tuner_interpreters`), the command template has the
  ``{python}`` field (:func:`interpreter_spans`, :func:`command_template`), filled with the
  serving host's interpreter (:data:`DEFAULT_PYTHON` unless given). The host bind address, the
  model and every other word stay as the user configured them.
- Secrets (see :mod:`autotune.config.secrets`) are stored as references ``${NAME}``, whole words
  or after ``=`` (``--flag=${NAME}``), and stay references: bash reads them from the environment
  and stops with a clear message when one is unset (:func:`missing_secret`). A user's literal
  ``${X}`` text (not listed as a secret) is literal text.
"""

from __future__ import annotations

import os
import re
import shlex
import string
import sys
from collections.abc import Iterable, Mapping, Sequence

from autotune.config.secrets import reference, reference_name

PORT_FIELD = "{port}"
PYTHON_FIELD = "{python}"
DEFAULT_PYTHON = "python3"
"""The serving host's interpreter when the export names none (``sh``: ``$PYTHON`` overrides it)."""


def secret_env(env: Mapping[str, str], keys: Iterable[str]) -> dict[str, str]:
    """Env key -> secret name, for the ``keys`` (a trial's ``secret_env``) whose value is a
    reference; a key listed but holding other text is exported as that literal text."""
    out: dict[str, str] = {}
    for k in keys:
        name = reference_name(env.get(k, ""))
        if name is not None:
            out[k] = name
    return out


def secret_word(word: str, name: str | None) -> tuple[str, str] | None:
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
        hit = secret_word(word, args.get(i))
        if hit is not None:
            names.add(hit[1])
    return sorted(names)


def missing_secret(name: str) -> str:
    """A bash expansion of the secret ``name`` that stops the script with a clear message when
    it is unset or empty (for use inside double quotes)."""
    return f"${{{name}:?set {name} in the environment: a secret, not stored in this profile}}"


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


def sh_words(template: list[str], args: Mapping[int, str], python_words: Iterable[int] = ()) -> list[str]:
    """Each word of ``template`` as one bash word: literal text single-quoted, a secret as
    ``"${NAME:?...}"``, each ``{port}`` field as ``"$PORT"`` and, in ``python_words``, each
    ``{python}`` field as ``"$PYTHON"``."""
    at = set(python_words)

    def port_part(text: str) -> str:
        return '"$PORT"'.join(shlex.quote(p) if p else "" for p in text.split(PORT_FIELD))

    words: list[str] = []
    for i, w in enumerate(template):
        hit = secret_word(w, args.get(i))
        if hit is not None:
            prefix, name = hit
            words.append((shlex.quote(prefix) if prefix else "") + f'"{missing_secret(name)}"')
        elif i in at:
            words.append('"$PYTHON"'.join(port_part(p) for p in w.split(PYTHON_FIELD)) or "''")
        else:
            words.append(port_part(w) or "''")
    return words


def display_words(argv: list[str], args: Mapping[int, str]) -> str:
    """The command line as shown to a person: shell-quoted, secrets as ``"${NAME}"``."""
    out = []
    for i, w in enumerate(argv):
        hit = secret_word(w, args.get(i))
        out.append(shlex.quote(w) if hit is None else (shlex.quote(hit[0]) if hit[0] else "") + f'"{reference(hit[1])}"')
    return " ".join(out)
