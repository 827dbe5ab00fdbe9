"""Habits that keep the shipped code readable, checked rather than hoped for.

- No function over 70 lines, outside declarations (a function that only declares, such as
  the metric classes' constructors, is a table, not logic; those are listed by name).
- Each function-local import says why in a word (``# lazy: pyspark``, ``# cycle``,
  ``# optional dep``): a local import is a cost paid on every call path that reaches it, or
  a cycle worked around, and the next reader should not have to guess which.

ruff enforces complexity and statement counts (``C901``, ``PLR0912``, ``PLR0915`` in
pyproject.toml); mypy the types (tests/system/test_types.py).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ("icefloe", "icefloe_app", "ingestor", "collector", "pipeline")
GENERATED = ("icefloe/v1",)
MAX_LINES = 70
DECLARATIONS: set[str] = set()
"""Functions that only declare (a table of metrics with their help texts, say), allowed to be
long by name; none today."""


def modules() -> Iterator[tuple[str, ast.Module, list[str]]]:
    for package in SHIPPED:
        for path in sorted((ROOT / package).rglob("*.py")):
            name = str(path.relative_to(ROOT))
            if name.startswith(GENERATED):
                continue
            source = path.read_text()
            yield name, ast.parse(source), source.splitlines()


def functions(tree: ast.Module) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every function with its qualified name (``Class.method``, ``outer.inner``)."""
    def walk(node: ast.AST, prefix: str) -> Iterator[tuple[str, ast.FunctionDef
                                                            | ast.AsyncFunctionDef]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                yield prefix + child.name, child
                yield from walk(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, f"{prefix}{child.name}.")
            else:
                yield from walk(child, prefix)
    return walk(tree, "")


def test_no_function_is_longer_than_70_lines() -> None:
    long = []
    for name, tree, _ in modules():
        for qualified, function in functions(tree):
            lines = (function.end_lineno or function.lineno) - function.lineno + 1
            where = f"{name}:{qualified}"
            if lines > MAX_LINES and where not in DECLARATIONS:
                long.append(f"{where} ({lines} lines)")
    assert long == [], "split these into named steps"


def test_declarations_listed_are_still_long() -> None:
    """An allowance nobody needs any more is removed, not kept for later."""
    long = {f"{name}:{q}" for name, tree, _ in modules() for q, f in functions(tree)
            if (f.end_lineno or f.lineno) - f.lineno + 1 > MAX_LINES}
    assert DECLARATIONS - long == set()


def test_every_function_local_import_says_why() -> None:
    silent = []
    for name, tree, lines in modules():
        for qualified, function in functions(tree):
            for node in ast.walk(function):
                if isinstance(node, ast.Import | ast.ImportFrom):
                    first = lines[node.lineno - 1]
                    end = lines[(node.end_lineno or node.lineno) - 1]
                    if "#" not in first and "#" not in end:
                        silent.append(f"{name}:{node.lineno} in {qualified}")
    assert sorted(set(silent)) == [], "add `# why` to these local imports (or move them up)"
