"""Locate built-in data files (search spaces, objectives) in a wheel or a source checkout."""

from __future__ import annotations

from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parents[1]  # autotune/


def data_dir(kind: str) -> Path:
    """Return the folder holding built-in files of ``kind`` ("search_spaces" or "objectives").

    In an installed wheel they live in ``autotune/_data/<kind>``; in a source checkout (editable
    install) they are the top-level ``<kind>/`` folder next to the package.
    """
    for candidate in (_PACKAGE_DIR / "_data" / kind, _PACKAGE_DIR.parent / kind):
        if candidate.is_dir():
            return candidate
    return _PACKAGE_DIR / "_data" / kind


def builtin_names(kind: str) -> list[str]:
    """Names (file stems) of the built-in YAML files of ``kind``."""
    return sorted(p.stem for p in data_dir(kind).glob("*.yaml"))


def resolve(kind: str, name_or_path: str) -> Path:
    """Resolve a built-in name or a file path to an existing file.

    Raises:
        FileNotFoundError: neither a built-in of that name nor an existing file (or a folder).
    """
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or "/" in name_or_path:
        if path.is_file():
            return path
        if path.is_dir():
            raise FileNotFoundError(f"{kind.rstrip('s').replace('_', ' ')} {name_or_path}: is a folder, not a file")
        if path.exists():  # a FIFO, a device: the loader refuses it by what it is, unread
            return path
        raise FileNotFoundError(f"{kind.rstrip('s').replace('_', ' ')} file not found: {name_or_path}")
    builtin = data_dir(kind) / f"{name_or_path}.yaml"
    if builtin.is_file():
        return builtin
    known = ", ".join(builtin_names(kind)) or "none"
    raise FileNotFoundError(
        f"unknown {kind.rstrip('s').replace('_', ' ')} '{name_or_path}' (built-in: {known}; or give a path)"
    )
