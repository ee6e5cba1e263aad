"""Loading YAML files and turning pydantic errors into one-line messages."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pydantic
import yaml

from autotune.errors import ConfigError


def load_yaml_mapping(path: Path, what: str) -> dict[str, Any]:
    """Read ``path`` as a YAML mapping.

    Raises:
        ConfigError: the file is missing, unreadable, not YAML, or not a mapping.
    """
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"{what} not found: {path}") from None
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{what} {path}: malformed YAML at{where}: {problem}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{what} {path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def one_line(exc: pydantic.ValidationError, prefix: str) -> str:
    """Format the first validation error as ``prefix: key.path: message``."""
    err = exc.errors()[0]
    loc = ".".join(str(part) for part in err["loc"]) or "(top level)"
    msg = err["msg"]
    if err["type"] == "extra_forbidden":
        msg = "unknown key"
    extra = f" (and {len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
    return f"{prefix}: {loc}: {msg}{extra}"
