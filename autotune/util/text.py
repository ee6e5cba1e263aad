"""Text for people: what must stay on one line (profile headers, notes, error messages), and
counts with their nouns."""

from __future__ import annotations

import shlex

import unicodedata

__all__ = ["counted", "one_line"]

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


def counted(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural unless ``n`` is 1 (``1 failure``, ``2 failures``; nouns with a
    regular plural)."""
    return f"{n} {noun if n == 1 else noun + 's'}"


def shell_path(path: str) -> str:
    """``path`` as one shell word; a leading ``~`` is the (remote) user's home."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)
