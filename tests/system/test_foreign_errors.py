"""Foreign exceptions are translated at one boundary per library (issue #38, item 5).

icefloe's callers (the collector's loop, the CLI, the admin API, embedding code) decide on
icefloe's :class:`~icefloe.errors.IcefloeError` tree, never on pyiceberg's, botocore's,
grpc's or Spark's classes. Each library has one module that names its exception classes
and translates them (:data:`BOUNDARIES`); this test reads every shipped module with
:mod:`ast` and fails on an ``except`` clause or a ``contextlib.suppress`` that names a
foreign exception anywhere else. A catch that must stay where it is is listed in
:data:`ALLOWED` with its reason; the list only shrinks (a listed catch that is gone fails
too).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ("icefloe", "icefloe_app", "ingestor", "collector", "pipeline")

LIBRARIES: dict[str, tuple[str, ...]] = {
    "pyiceberg": ("pyiceberg",),
    "boto": ("botocore", "boto3", "aiobotocore", "aiohttp"),
    "grpc": ("grpc", "grpc_status"),
    "spark": ("pyspark", "py4j"),
}
"""Each library by the top-level packages its exception classes live in (``aiohttp`` is
aiobotocore's transport: its connection errors reach the S3 store)."""

BOUNDARIES: dict[str, str] = {
    "pyiceberg": "pipeline.iceberg.errors",
    "boto": "icefloe.store.s3",
    "grpc": "icefloe.client.grpc",
    "spark": "pipeline.read.query",
}
"""library -> the one module that catches and translates its exceptions:

- pyiceberg: ``iceberg_errors``/``load_table_or_none`` into ``CatalogError`` subclasses;
- boto: ``_translate`` into ``StoreError`` (``NotFound``, ``PreconditionFailed``,
  ``TransientStoreError``, ``PermanentStoreError``);
- grpc: the client's ``_rpc_rejected`` into ``IngestRejected``;
- Spark: ``spark_error``/``QueryError``; no module catches a Spark class by name (the run's
  bulkheads catch ``Exception`` and report it through ``spark_error``)."""

_WRITER = ("the Iceberg writer itself: a lost commit race (CommitFailedException) is "
           "re-read and retried in place, a missing table created, and nothing of it "
           "leaves pipeline/iceberg untranslated")
ALLOWED: dict[tuple[str, str], str] = {
    ("pipeline.iceberg.commit", "pyiceberg"): _WRITER,
    ("pipeline.iceberg.confirm", "pyiceberg"): _WRITER,
    ("pipeline.iceberg.data_files", "pyiceberg"): _WRITER,
    ("pipeline.iceberg.fence", "pyiceberg"): _WRITER,
    ("pipeline.iceberg.maintenance", "pyiceberg"): _WRITER,
    ("pipeline.iceberg.tables", "pyiceberg"): _WRITER,
    ("pipeline.iceberg.upsert", "pyiceberg"): _WRITER,
}
"""(module, library) -> why that module still catches the library's exceptions itself."""


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_names(tree: ast.AST) -> dict[str, str]:
    """Local name -> what it names (``bexc`` -> ``botocore.exceptions``), from every import
    of the module, function-local ones included."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    names[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    names[top] = top
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return names


def _dotted(node: ast.expr) -> str | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def _classes(node: ast.expr | None) -> Iterator[ast.expr]:
    """The class expressions of an ``except`` clause (a tuple, ``A | B``, or one)."""
    if node is None:
        return
    if isinstance(node, ast.Tuple):
        for element in node.elts:
            yield from _classes(element)
    elif isinstance(node, ast.BinOp):
        yield from _classes(node.left)
        yield from _classes(node.right)
    else:
        yield node


def _caught(tree: ast.AST) -> Iterator[tuple[int, ast.expr]]:
    """Every class an ``except`` clause or a ``suppress(...)`` names, with its line."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ExceptHandler):
            for cls in _classes(node.type):
                yield node.lineno, cls
        elif isinstance(node, ast.Call) and (_dotted(node.func) or "").endswith("suppress"):
            for arg in node.args:
                for cls in _classes(arg):
                    yield node.lineno, cls


def library_of(qualified: str) -> str | None:
    top = qualified.split(".")[0]
    return next((lib for lib, tops in LIBRARIES.items() if top in tops), None)


def foreign_catches(source: str) -> Iterator[tuple[int, str, str]]:
    """``(line, library, class)`` for each foreign exception class ``source`` catches."""
    tree = ast.parse(source)
    names = imported_names(tree)
    for line, cls in _caught(tree):
        dotted = _dotted(cls)
        if dotted is None:
            continue
        head, _, rest = dotted.partition(".")
        qualified = names.get(head, head) + (f".{rest}" if rest else "")
        library = library_of(qualified)
        if library is not None:
            yield line, library, qualified


def scan() -> dict[tuple[str, str], list[str]]:
    """(module, library) -> the catches found there (``line: class``)."""
    found: dict[tuple[str, str], list[str]] = {}
    for package in SHIPPED:
        for path in sorted((ROOT / package).rglob("*.py")):
            for line, library, qualified in foreign_catches(path.read_text()):
                found.setdefault((module_name(path), library), []).append(
                    f"{line}: {qualified}")
    return found


FOUND = scan()


@pytest.mark.parametrize("library", sorted(LIBRARIES))
def test_should_catch_each_librarys_exceptions_only_at_its_boundary(library):
    outside = {module: catches for (module, lib), catches in FOUND.items()
               if lib == library and module != BOUNDARIES[library]
               and (module, lib) not in ALLOWED}
    assert not outside, (
        f"{library} exceptions caught outside {BOUNDARIES[library]}: {outside}; catch the "
        f"translated IcefloeError there instead")


def test_should_list_only_catches_that_are_still_there():
    gone = sorted(key for key in ALLOWED if key not in FOUND)
    assert not gone, f"no longer caught there: remove from ALLOWED: {gone}"


def test_should_name_boundary_modules_that_exist():
    modules = {module_name(p) for package in SHIPPED for p in (ROOT / package).rglob("*.py")}
    assert set(BOUNDARIES.values()) <= modules
    assert set(BOUNDARIES) == set(LIBRARIES)
    assert ("icefloe.client.grpc", "grpc") in FOUND  # the scan sees a boundary's catches


def test_should_see_every_way_of_naming_a_foreign_class():
    source = (
        "import grpc\nimport botocore.exceptions as bexc\nimport contextlib\n"
        "from pyiceberg.exceptions import CommitFailedException as Lost\n"
        "def f():\n"
        "    from py4j.protocol import Py4JJavaError\n"
        "    try:\n        pass\n"
        "    except (grpc.RpcError, bexc.ClientError):\n        pass\n"
        "    except Lost | ValueError:\n        pass\n"
        "    except Py4JJavaError:\n        pass\n"
        "    with contextlib.suppress(Lost):\n        pass\n")
    assert sorted(foreign_catches(source)) == [
        (9, "boto", "botocore.exceptions.ClientError"),
        (9, "grpc", "grpc.RpcError"),
        (11, "pyiceberg", "pyiceberg.exceptions.CommitFailedException"),
        (13, "spark", "py4j.protocol.Py4JJavaError"),
        (15, "pyiceberg", "pyiceberg.exceptions.CommitFailedException"),
    ]
