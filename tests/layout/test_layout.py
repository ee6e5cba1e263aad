"""The package's layout shows its layers: each folder imports only from the folders below it.

Read from the source (every import, at module level or inside a function), not from a running
process, so a lazy import that runs up a layer fails here as an eager one would.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "autotune"

# Bottom to top. A module may import from its own folder and from any folder listed before it.
LAYERS: list[tuple[str, ...]] = [
    ("errors",),
    ("util",),
    ("outcome", "benchmarks"),
    ("engines",),
    ("sim",),
    ("config",),
    ("execution",),
    ("store",),
    ("analysis",),
    ("search",),
    ("study",),
    ("profiles",),
    ("testing",),
    ("bench",),
    ("cli",),
]
RANK = {folder: rank for rank, folders in enumerate(LAYERS) for folder in folders}
TOP = {"__init__", "__main__"}  # the public API and `python -m autotune` sit above every layer
MAX_LINES = 600
MAX_DOCSTRING_LINES = 30


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "_data" not in p.parts)


def _folder(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _imported_folders(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names] if node.module == "autotune" else [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "autotune" and len(parts) > 1:
                found.add(parts[1])
    return found


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _imported_modules(path: Path, known: set[str]) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                found.add(full if full in known else node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if m in known}


def test_no_import_cycle_between_modules() -> None:
    paths = {_module_name(p): p for p in _modules()}
    known = set(paths)
    graph = {name: _imported_modules(path, known) - {name} for name, path in paths.items()}
    # A package's __init__ that imports its own modules is not a cycle with them.
    graph = {name: {m for m in deps if not (name.startswith(m + ".") or m.startswith(name + ".") and
                                            paths[name].name == "__init__.py")}
             for name, deps in graph.items()}
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(name: str, stack: list[str]) -> None:
        state[name] = 1
        for dep in sorted(graph[name]):
            if state.get(dep) == 1:
                cycles.append(stack[stack.index(dep):] + [dep] if dep in stack else [name, dep])
            elif dep not in state:
                visit(dep, stack + [dep])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not cycles, f"import cycles: {cycles}"


def test_every_folder_has_a_layer() -> None:
    folders = {_folder(p) for p in _modules()} - TOP
    assert folders <= set(RANK), f"folders with no layer: {sorted(folders - set(RANK))}"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_import_runs_up_a_layer(path: Path) -> None:
    here = _folder(path)
    if here in TOP:
        return
    upward = sorted(f for f in _imported_folders(path) if f != here and RANK.get(f, -1) >= RANK[here])
    assert not upward, f"{path.relative_to(PACKAGE)} ({here}) imports from {upward}, not below it"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_modules_are_small_with_short_docstrings(path: Path) -> None:
    text = path.read_text()
    assert len(text.splitlines()) <= MAX_LINES, f"{len(text.splitlines())} lines"
    doc = ast.get_docstring(ast.parse(text), clean=False) or ""
    assert len(doc.splitlines()) <= MAX_DOCSTRING_LINES, f"module docstring of {len(doc.splitlines())} lines"
