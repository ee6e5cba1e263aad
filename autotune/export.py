"""Launch profiles: the best trial's exact env and command, with provenance.

Formats: ``sh`` (a runnable bash script, every value quoted), ``env`` (``KEY=value`` lines for
``set -a; source FILE`` in bash, every value quoted), ``yaml`` and ``json`` (the whole profile as
data).

Contracts:

- Run by bash, an ``sh`` profile execs exactly the trial's argv (the port filled in) with exactly
  its env; sourced by bash, an ``env`` profile sets exactly the trial's env. Any value is
  allowed (quotes, ``$``, backticks, newlines, unicode); only NUL cannot occur in env or argv.
- Secrets (see :mod:`autotune.secrets`) are stored as references ``${NAME}`` and are exported
  as references to be supplied at launch: ``sh`` refuses to start without them, ``env`` takes
  them from the environment, ``yaml``/``json`` list them under ``secrets``. A user's literal
  ``${X}`` text is exported as literal text.
- Comment lines are safe against any text: control, line-separator and bidi characters in a
  value are shown escaped, so nothing in a value can end a comment.
- :func:`write_profile` writes a file whole or not at all, mode 0600 (0700 for ``sh``).
"""

from __future__ import annotations

import datetime
import json
import os
import re
import shlex
import tempfile
import unicodedata
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from autotune.errors import UsageError
from autotune.secrets import reference, reference_name
from autotune.study_view import TrialView

FORMATS = ("sh", "env", "yaml", "json")
PORT_FIELD = "{port}"
FILE_MODE = 0o600
SH_MODE = 0o700
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


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


def _sh_words(template: list[str], args: Mapping[int, str]) -> list[str]:
    """Each word of ``template`` as one bash word: literal text single-quoted, a secret as
    ``"${NAME:?...}"``, and each ``{port}`` field as ``"$PORT"``."""
    words: list[str] = []
    for i, w in enumerate(template):
        hit = _secret_word(w, args.get(i))
        if hit is not None:
            prefix, name = hit
            words.append((shlex.quote(prefix) if prefix else "") + f'"{_missing(name)}"')
        else:
            words.append('"$PORT"'.join(shlex.quote(p) if p else "" for p in w.split(PORT_FIELD)) or "''")
    return words


def _display_words(argv: list[str], args: Mapping[int, str]) -> str:
    """The command line as shown to a person: shell-quoted, secrets as ``"${NAME}"``."""
    out = []
    for i, w in enumerate(argv):
        hit = _secret_word(w, args.get(i))
        out.append(shlex.quote(w) if hit is None else (shlex.quote(hit[0]) if hit[0] else "") + f'"{reference(hit[1])}"')
    return " ".join(out)


# -- safe comments ---------------------------------------------------------------------------
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def one_line(text: str) -> str:
    """``text`` safe to put after ``#``: every control (Cc), format (Cf: bidi overrides,
    zero-width), surrogate, private-use or unassigned character, and every line or paragraph
    separator, shown as an escape (``\\n``, ``\\x1b``, ``\\u2028``). Contract: the result has no
    character of those categories, so no newline of any kind."""
    out = []
    for ch in text:
        cat = unicodedata.category(ch)
        if cat[0] == "C" or cat in ("Zl", "Zp"):
            code = ord(ch)
            out.append(_NAMED.get(ch) or (f"\\x{code:02x}" if code < 0x100 else
                                          f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"))
        else:
            out.append(ch)
    return "".join(out)


def _show(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False) if isinstance(value, str) else str(value)


def _header(prof: Mapping[str, Any]) -> list[str]:
    lines = [
        f"autotune launch profile: study {prof['study']}, trial {prof['trial']}",
        f"{prof['metric']} = {prof['value']} ({prof['direction']}), exported {prof['exported_at']}",
        "params: " + " ".join(f"{k}={_show(v)}" for k, v in prof["params"].items()),
    ]
    if prof.get("secrets"):
        lines.append("secrets, not stored here (set them in the environment): " + " ".join(prof["secrets"]))
    return [f"# {one_line(h)}" for h in lines]


# -- profile and formats ---------------------------------------------------------------------
def profile(study_name: str, metric: str | None, direction: str, best: TrialView, port: int) -> dict[str, Any]:
    """The launch profile as data (the ``json``/``yaml`` formats).

    ``env`` and ``command`` hold secrets as references ``${NAME}``; ``secrets`` names them;
    ``command_line`` is the command for a shell (secrets as ``"${NAME}"``).
    """
    template = best.argv_template or best.argv
    argv = [w.replace(PORT_FIELD, str(port)) for w in template]
    return {
        "study": study_name,
        "trial": best.number,
        "metric": metric,
        "direction": direction,
        "value": best.value,
        "params": best.params,
        "env": best.env,
        "command": argv,
        "command_line": _display_words(argv, best.secret_args),
        "port": port,
        "secrets": secret_names(best.env, template, best.secret_env, best.secret_args),
        "metrics": best.metrics,
        "exported_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def render(fmt: str, prof: dict[str, Any], template: list[str], *, secret_env_keys: Iterable[str] = (),
           secret_args: Mapping[int, str] | None = None) -> str:
    """Render a profile in ``fmt`` (one of :data:`FORMATS`).

    ``template``: the argv with ``{port}`` fields (the ``sh`` format reads ``$PORT``).
    ``secret_env_keys``/``secret_args``: the trial's record of which env values and which
    ``template`` words are secret references (:class:`~autotune.secrets.RedactedLaunch`).

    Raises:
        UsageError: an env name is not a shell identifier (``sh``/``env`` formats).
    """
    if fmt == "json":
        return json.dumps(prof, indent=2) + "\n"
    if fmt == "yaml":
        return yaml.safe_dump(prof, sort_keys=False)
    env: dict[str, str] = prof["env"]
    for k in env:
        if not _ENV_NAME.fullmatch(k):
            raise UsageError(f"env var name {json.dumps(k)} is not a shell name and cannot be exported as {fmt}")
    secrets = secret_env(env, secret_env_keys)
    args = secret_args or {}
    if fmt == "env":
        lines = _header(prof) + [f"# command: {one_line(prof['command_line'])}",
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
    lines = ["#!/usr/bin/env bash"] + _header(prof) + [
        "set -euo pipefail",
        f'PORT="${{PORT:-{int(prof["port"])}}}"',
    ]
    for k, v in env.items():
        lines.append(f'export {k}="{_missing(secrets[k])}"' if k in secrets else f"export {k}={shlex.quote(v)}")
    words = _sh_words(template, args)
    lines.append('echo "starting server on port $PORT" >&2')
    if words:
        lines.append("exec " + " ".join(words))
    return "\n".join(lines) + "\n"


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
