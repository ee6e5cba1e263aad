"""Loading YAML files and turning pydantic errors into one-line messages."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pydantic
import yaml

from autotune.errors import ConfigError, UsageError
from autotune.util.files import check_input

MAX_FILE_BYTES = 4 * 1024 * 1024
"""A config, space or objective file is a few KiB; anything this big is not one."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that rejects a mapping holding the same key twice (PyYAML keeps the
    last one silently, so a typo'd second ``budget:`` would quietly replace the first)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
            except TypeError:  # an unhashable key: SafeLoader reports it below
                continue
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key '{key}'", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_yaml_mapping(path: Path, what: str) -> dict[str, Any]:
    """Read ``path`` as a YAML mapping.

    Raises:
        ConfigError: the file is missing, not a regular file (a folder, a FIFO, a device), larger
            than :data:`MAX_FILE_BYTES`, unreadable, not UTF-8 text, not YAML, empty, not a mapping,
            holds a key twice, or holds a NUL character.
    """
    try:
        check_input(path, what, MAX_FILE_BYTES)  # before it is opened: a FIFO would hang, a device never end
    except UsageError as exc:
        raise ConfigError(str(exc)) from None
    try:
        with open(path, "rb") as f:  # bounded: a device such as /dev/zero never ends
            raw = f.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError(f"{what} not found: {path}") from None
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise ConfigError(f"{what} {path}: larger than {MAX_FILE_BYTES // (1024 * 1024)} MiB, too large for a YAML file of this kind")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{what} {path}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start})") from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{what} {path}: malformed YAML at{where}: {problem}") from None
    except RecursionError:
        raise ConfigError(f"{what} {path}: nested too deeply") from None
    if data is None:
        raise ConfigError(f"{what} {path}: the file is empty (expected a mapping of keys)")
    if not isinstance(data, dict):
        raise ConfigError(f"{what} {path}: expected a mapping at the top level, got {_yaml_kind(data)}")
    where = _find_nul(data)
    if where is not None:
        raise ConfigError(f"{what} {path}: {where or '(top level)'}: contains a NUL character")
    return data


def _yaml_kind(value: Any) -> str:
    return {list: "a list", str: "a string", int: "a number", float: "a number", bool: "a boolean"}.get(
        type(value), type(value).__name__)


def _find_nul(value: Any, where: str = "") -> str | None:
    """The key path of the first text holding a NUL character (no argv or env can hold one)."""
    stack: list[tuple[Any, str]] = [(value, where)]
    seen: set[int] = set()
    while stack:
        item, at = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return at
        elif isinstance(item, (dict, list)):
            if id(item) in seen:  # YAML aliases share objects: visit each once
                continue
            seen.add(id(item))
            pairs = item.items() if isinstance(item, dict) else enumerate(item)
            for k, v in pairs:
                sub = f"{at}.{k}" if at else str(k)
                if isinstance(k, str) and "\x00" in k:
                    return sub
                stack.append((v, sub))
    return None


def _printable(key: str) -> str:
    """A key as written, or quoted with escapes when it holds a newline or another control."""
    return key if key.isprintable() and key.strip() == key else repr(key)


def one_line(exc: pydantic.ValidationError, prefix: str) -> str:
    """Format the first validation error as ``prefix: key.path: message``."""
    err = exc.errors()[0]
    loc = ".".join(_printable(str(part)) for part in err["loc"]) or "(top level)"
    msg = err["msg"]
    if err["type"] == "extra_forbidden":
        msg = "unknown key"
    elif err["type"] == "value_error":
        msg = str((err.get("ctx") or {}).get("error") or msg.removeprefix("Value error, "))
    extra = f" (and {len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
    return f"{prefix}: {loc}: {msg}{extra}"
