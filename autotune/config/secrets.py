"""Secrets in launch configs: which env vars and flags hold one, and keeping their values out of
the study storage, the console, logs and launch profiles.

A secret value is replaced by a *reference* ``${NAME}``: for an env var its own name
(``HF_TOKEN=${HF_TOKEN}``), for a flag a name derived from the flag (``--api-key ${API_KEY}``,
``--api-key=${API_KEY}``). The value is supplied again from the environment when a profile is
launched or a stored config is resumed (:func:`expand_env`, :func:`expand_command`).

What is secret:

- an env name containing ``TOKEN``, ``KEY``, ``SECRET``, ``PASSWORD`` or ``PASSWD``
  (case-insensitive), e.g. ``HF_TOKEN``, ``OPENAI_API_KEY``, ``PGPASSWORD``;
- a flag ``--api-key`` (or containing ``api-key``/``api_key``/``apikey``), or containing
  ``token``, ``secret``, ``password`` or ``passwd``, e.g. ``--hf-token``;
- any env name or flag in the config's extra list (``target.secrets``).

The words ``TOKENS``, ``TOKENIZER`` and ``PKEY`` do not count (``--max-total-tokens``,
``--cb-max-batch-tokens``, ``TOKENIZERS_PARALLELISM`` and ``NCCL_IB_PKEY`` are tuning knobs, not
secrets); names given as ``public`` to :class:`Redactor` (the search space's own env names and
flags) are never secret. An empty value is never redacted (there is nothing to hide).

A redaction is recorded by position (:class:`RedactedLaunch`: which env keys, which argv
indices) so that a renderer can tell a reference from a user's literal ``${X}`` text.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.errors import UsageError

MIN_TEXT_SECRET = 4
"""Values shorter than this are redacted in env and argv but not searched for in free text
(replacing every ``1`` of a log would hide nothing and wreck the log)."""

_ENV_WORDS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD")
_FLAG_WORDS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "API-KEY", "API_KEY", "APIKEY")
_NOT_SECRET = re.compile(r"TOKENS|TOKENIZER|PKEY")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def _mentions(name: str, words: Sequence[str]) -> bool:
    bare = _NOT_SECRET.sub(" ", name.upper())
    return any(w in bare for w in words)


def _split_extra(extra: Iterable[str]) -> tuple[set[str], set[str]]:
    """The extra list as (env names, flags): an entry starting with ``-`` is a flag."""
    names: set[str] = set()
    flags: set[str] = set()
    for item in extra:
        (flags if item.startswith("-") else names).add(item)
    return names, flags


def is_secret_env(name: str, extra: Iterable[str] = ()) -> bool:
    """Whether the env var ``name`` holds a secret (see the module docstring for the rule)."""
    names, _ = _split_extra(extra)
    return name in names or _mentions(name, _ENV_WORDS)


def is_secret_flag(flag: str, extra: Iterable[str] = ()) -> bool:
    """Whether the value of ``flag`` (``--name``, without ``=value``) is a secret."""
    _, flags = _split_extra(extra)
    return flag.startswith("-") and (flag in flags or _mentions(flag, _FLAG_WORDS))


def flag_name(flag: str) -> str:
    """The reference name of a secret flag: ``--api-key`` -> ``API_KEY``, ``--hf-token`` ->
    ``HF_TOKEN``; always a valid shell identifier."""
    name = re.sub(r"[^A-Za-z0-9]+", "_", flag.lstrip("-")).strip("_").upper()
    if not name:
        return "SECRET"
    return f"_{name}" if name[0].isdigit() else name


def is_secret_name(name: str, extra: Iterable[str] = ()) -> bool:
    """Whether ``${name}`` may be a reference made by a :class:`Redactor` with this extra list:
    a secret env name, or the name of a secret flag of the extra list (with or without a
    ``_2``, ``_3``... suffix given to a second value under the same name)."""
    if not _NAME.fullmatch(name):
        return False
    names, flags = _split_extra(extra)
    base = re.sub(r"_[0-9]+$", "", name)
    derived = {flag_name(f) for f in flags}
    return any(is_secret_env(n, names) or n in derived for n in (name, base))


def reference(name: str) -> str:
    """The reference text that stands for the secret ``name``: ``${name}``."""
    return "${" + name + "}"


def reference_name(text: str) -> str | None:
    """``NAME`` when ``text`` is exactly a reference ``${NAME}``, else None."""
    m = _REFERENCE.fullmatch(text)
    return m.group(1) if m else None


@dataclass(frozen=True)
class RedactedLaunch:
    """An env and argv with every secret value replaced by its reference.

    ``secret_env``: the env keys whose value is a reference (``env[k] == "${k}"``).
    ``secret_args``: argv index -> reference name, for each word that is a reference
    (``argv[i] == "${NAME}"``) or ends with one after ``=`` (``argv[i] == "--flag=${NAME}"``).
    Any other ``${X}`` text in ``env``/``argv`` is the user's literal text.
    """

    env: dict[str, str]
    argv: list[str]
    secret_env: list[str] = field(default_factory=list)
    secret_args: dict[int, str] = field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        """Every reference name, sorted, without repeats: what a launch must supply."""
        return sorted(set(self.secret_env) | set(self.secret_args.values()))

    def attrs(self) -> dict[str, Any]:
        """The redaction record as JSON-safe trial user attrs (``secret_env``, ``secret_args``
        with the indices as strings); :func:`secret_args_from_attr` reads the latter back."""
        return {"secret_env": list(self.secret_env),
                "secret_args": {str(i): n for i, n in sorted(self.secret_args.items())}}


def secret_args_from_attr(raw: Any) -> dict[int, str]:
    """``secret_args`` as stored by :meth:`RedactedLaunch.attrs` (JSON: string keys) -> index ->
    name; anything malformed (an old study, a hand-edited attr) is skipped."""
    out: dict[int, str] = {}
    if isinstance(raw, Mapping):
        for k, v in raw.items():
            try:
                out[int(k)] = str(v)
            except (TypeError, ValueError):
                continue
    return out


class Redactor:
    """Finds the secrets of one launch and hides them from whatever is stored or shown.

    Built from the launch's real env and argv (and optionally the process environment the server
    inherits, for :meth:`text` only), it learns each secret value and its reference name. Env
    secrets are named after their key; flag secrets after the flag (:func:`flag_name`); when two
    different values would get the same name the later one gets ``NAME_2``, ``NAME_3``...
    Redacting another env/argv (e.g. the port template of the same command) reuses the names
    learnt and learns new secrets it finds.

    Contract: the outputs of :meth:`env`, :meth:`argv`, :meth:`launch`, :meth:`text` and
    :meth:`command` contain no secret value that was learnt and is at least
    :data:`MIN_TEXT_SECRET` characters long (:meth:`env`/:meth:`argv` hide shorter ones too, at
    their positions). The inputs are never modified.
    """

    def __init__(self, env: Mapping[str, str], argv: Sequence[str] = (), extra: Iterable[str] = (), *,
                 public: Iterable[str] = (), environ: Mapping[str, str] | None = None) -> None:
        """``extra``: the config's ``target.secrets`` (env names and flags). ``public``: env names
        and flags never to treat as secret (the search space's parameters). ``environ``: the
        environment the server inherits; its secret-named values are hidden from :meth:`text`.
        """
        self.extra = tuple(extra)
        self.public = frozenset(public)
        self._value_of: dict[str, str] = {}  # reference name -> value
        self._env_keys: set[str] = set(env)
        self._ambient = {k: v for k, v in (environ or {}).items() if v and k not in env and self._secret_env(k)}
        self.env(env)
        self.argv(argv)

    # -- what is secret -------------------------------------------------------------------------
    def _secret_env(self, name: str) -> bool:
        return name not in self.public and is_secret_env(name, self.extra)

    def _secret_flag(self, flag: str) -> bool:
        return flag not in self.public and is_secret_flag(flag, self.extra)

    def _name_for(self, base: str, value: str, *, own: bool = False) -> str:
        """The reference name for ``value``: ``base`` if free or already ``value``'s, else the
        first free ``base_N``. ``own``: ``base`` is an env key, which always names its value."""
        if own:
            self._value_of[base] = value
            return base
        candidates = [base] + [f"{base}_{n}" for n in range(2, 10_000)]
        for name in candidates:
            held = self._value_of.get(name)
            if held == value or (held is None and name not in self._env_keys):
                self._value_of[name] = value
                return name
        raise RuntimeError(f"too many secrets named {base}")  # pragma: no cover

    @property
    def names(self) -> list[str]:
        """The reference names learnt so far, sorted (no values)."""
        return sorted(self._value_of)

    def __bool__(self) -> bool:
        """Whether any secret was found (in the launch or, for :meth:`text`, the environment)."""
        return bool(self._value_of or self._ambient)

    # -- redaction ------------------------------------------------------------------------------
    def env(self, env: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
        """``(redacted env, keys redacted)``: each secret key's non-empty value becomes
        ``${KEY}``; other values are kept as they are."""
        out: dict[str, str] = {}
        keys: list[str] = []
        for k, v in env.items():
            if v and self._secret_env(k):
                self._env_keys.add(k)
                out[k] = reference(self._name_for(k, v, own=True))
                keys.append(k)
            else:
                out[k] = v
        return out, keys

    def argv(self, argv: Sequence[str]) -> tuple[list[str], dict[int, str]]:
        """``(redacted argv, index -> name)``: the word after a secret flag (``--api-key VALUE``)
        becomes ``${API_KEY}``, and ``--api-key=VALUE`` becomes ``--api-key=${API_KEY}``. A word
        starting with ``--`` after a secret flag is taken for the next flag, not a value (a
        boolean flag such as ``--return-tokens-as-token-ids``)."""
        out = list(argv)
        where: dict[int, str] = {}
        i = 0
        while i < len(argv):
            word = argv[i]
            flag, eq, value = word.partition("=")
            if word.startswith("-") and self._secret_flag(flag):
                if eq and value:
                    where[i] = self._name_for(flag_name(flag), value)
                    out[i] = f"{flag}={reference(where[i])}"
                elif not eq and i + 1 < len(argv) and argv[i + 1] and not argv[i + 1].startswith("--"):
                    i += 1
                    where[i] = self._name_for(flag_name(flag), argv[i])
                    out[i] = reference(where[i])
            i += 1
        return out, where

    def launch(self, env: Mapping[str, str], argv: Sequence[str]) -> RedactedLaunch:
        """:meth:`env` and :meth:`argv` together, with the record of what was redacted."""
        r_env, keys = self.env(env)
        r_argv, where = self.argv(argv)
        return RedactedLaunch(r_env, r_argv, keys, where)

    def text(self, text: str) -> str:
        """``text`` with every occurrence of a learnt secret value (of at least
        :data:`MIN_TEXT_SECRET` characters) replaced by its reference, longest values first."""
        named = {**self._ambient, **self._value_of}
        values = {v: n for n, v in sorted(named.items(), reverse=True) if len(v) >= MIN_TEXT_SECRET}
        if not values or not text:
            return text
        pattern = re.compile("|".join(re.escape(v) for v in sorted(values, key=len, reverse=True)))
        return pattern.sub(lambda m: reference(values[m.group(0)]), text)

    def replacements(self) -> dict[str, str]:
        """Each learnt value of at least :data:`MIN_TEXT_SECRET` characters -> its reference
        text, as :meth:`text` replaces them (for :class:`StreamRedactor`)."""
        named = {**self._ambient, **self._value_of}
        return {v: reference(n) for n, v in sorted(named.items(), reverse=True) if len(v) >= MIN_TEXT_SECRET}

    def file(self, path: str | os.PathLike[str]) -> None:
        """Redact a file (a trial log) in place with :meth:`text`, leaving it mode 0600. Bytes
        that are not UTF-8 are kept as they are. A missing file is left missing."""
        p = Path(path)
        try:
            data = p.read_bytes()
        except FileNotFoundError:
            return
        text = data.decode("utf-8", errors="surrogateescape")
        clean = self.text(text)
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o600)
            f.write(clean.encode("utf-8", errors="surrogateescape"))

    def command(self, command: str) -> str:
        """A command template string (``target.command``) with its secret words redacted as in
        :meth:`argv`, and any other learnt value as in :meth:`text`; re-quoted with
        :func:`shlex.join`, so ``shlex.split`` of the result gives the redacted words."""
        words, _ = self.argv(shlex.split(command))
        return shlex.join(self.text(w) for w in words)


class StreamRedactor:
    """Redacts a byte stream that arrives in chunks (a server's output on its way to its log), as
    :meth:`Redactor.text` would redact the whole of it.

    Contract: the concatenation of every :meth:`feed` result and :meth:`end` equals the whole
    stream with each value of :meth:`Redactor.replacements` replaced, whatever the chunking; no
    result holds a value or the start of one cut by a chunk's end (such a tail is held back, and
    only such a tail: text without secrets passes at once).
    """

    def __init__(self, redactor: Redactor) -> None:
        self._swap = {v.encode("utf-8", errors="surrogateescape"): r.encode() for v, r in redactor.replacements().items()}
        values = sorted(self._swap, key=len, reverse=True)
        self._pattern = re.compile(b"|".join(re.escape(v) for v in values)) if values else None
        self._held = b""

    def _sub(self, data: bytes) -> bytes:
        assert self._pattern is not None
        return self._pattern.sub(lambda m: self._swap[m.group(0)], data)

    def _open_tail(self, data: bytes) -> int:
        """The length of the longest end of ``data`` that starts a value without holding all of it."""
        longest = max(len(v) for v in self._swap) - 1
        for n in range(min(longest, len(data)), 0, -1):
            tail = data[-n:]
            if any(len(v) > n and v.startswith(tail) for v in self._swap):
                return n
        return 0

    def feed(self, chunk: bytes) -> bytes:
        """What of the stream so far can be written now, redacted."""
        if self._pattern is None:
            return chunk
        data = self._held + chunk
        cut = len(data) - self._open_tail(data)
        for m in self._pattern.finditer(data):  # never cut through a whole value
            if m.start() >= cut:
                break
            if m.end() > cut:
                cut = m.start()
                break
        self._held = data[cut:]
        return self._sub(data[:cut])

    def end(self) -> bytes:
        """The rest of the stream (it has ended), redacted."""
        data, self._held = self._held, b""
        return self._sub(data) if self._pattern is not None and data else data


# -- references back to values ---------------------------------------------------------------
def _lookup(name: str, environ: Mapping[str, str], where: str) -> str:
    value = environ.get(name)
    if not value:
        raise UsageError(f"{where} refers to the secret {name}, which is not stored: set {name} in the environment")
    return value


def expand_env(env: Mapping[str, str], extra: Iterable[str] = (), environ: Mapping[str, str] | None = None,
               *, where: str = "the stored config") -> dict[str, str]:
    """A stored env with each redacted secret (a secret key ``K`` whose value is exactly its own
    reference ``${K}``, as :meth:`Redactor.env` leaves it) replaced by ``environ[K]`` (default:
    ``os.environ``); every other value, including ``${X}`` text under another key, is kept.

    Raises:
        UsageError: naming NAME, when ``environ`` lacks it (or holds it empty).
    """
    source = os.environ if environ is None else environ
    extra = tuple(extra)
    out: dict[str, str] = {}
    for k, v in env.items():
        out[k] = _lookup(k, source, where) if v == reference(k) and is_secret_env(k, extra) else v
    return out


def expand_argv(argv: Sequence[str], extra: Iterable[str] = (), environ: Mapping[str, str] | None = None,
                *, where: str = "the stored config") -> list[str]:
    """Each ``${NAME}`` inside a word, with NAME a secret name (:func:`is_secret_name`), replaced
    by the value of NAME from ``environ`` (default: ``os.environ``): the inverse of
    :meth:`Redactor.argv` (``${API_KEY}``, ``--api-key=${API_KEY}``) and of :meth:`Redactor.text`
    inside a word. Any other text is kept.

    Raises:
        UsageError: naming NAME, when ``environ`` lacks it.
    """
    source = os.environ if environ is None else environ
    extra = tuple(extra)

    def one(m: re.Match[str]) -> str:
        name = m.group(1)
        return _lookup(name, source, where) if is_secret_name(name, extra) else m.group(0)

    return [_REFERENCE.sub(one, word) for word in argv]


def expand_command(command: str, extra: Iterable[str] = (), environ: Mapping[str, str] | None = None,
                   *, where: str = "the stored config") -> str:
    """The inverse of :meth:`Redactor.command` for a stored ``target.command``: split, expand
    with :func:`expand_argv`, re-join with :func:`shlex.join`.

    Raises:
        UsageError: naming NAME, when ``environ`` lacks it.
    """
    return shlex.join(expand_argv(shlex.split(command), extra, environ, where=where))
