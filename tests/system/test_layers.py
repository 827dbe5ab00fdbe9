"""The layers, by reading the code: which package may import which, and no import circles.

Every product module is parsed with :mod:`ast`; every ``import`` counts, the ones inside
functions and ``TYPE_CHECKING`` blocks too (a function-local import hides a dependency, it
does not remove it). The rules (issue #24):

- ``icefloe`` is the core: it imports no other package of the project (the one exemption is
  ``icefloe/__main__.py``, the shim behind ``python -m icefloe``);
- ``icefloe_app`` is the composition root: only that shim imports it;
- ``ingestor`` imports neither ``collector`` nor ``pipeline``; ``collector`` not ``ingestor``;
- ``pipeline/iceberg`` imports neither ``pyspark`` nor ``pipeline/load``;
- nothing outside ``tests/`` and ``bench/`` imports ``testing``;
- product code imports no other module's private (``_name``) symbol; a private module of
  the importer's own package (the compiled ``icefloe.formats._speedups``) is its own business;
- no import circles between modules (strongly connected components of the import graph);
- every import of a project module names one that exists.

What the code does not satisfy yet is listed below, edge by edge, each with the step of #24
that removes it. A check fails on a violation that is not listed *and* on a listed one that
is gone, so these lists only shrink.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("icefloe", "ingestor", "collector", "pipeline", "icefloe_app")
PROJECT = (*PRODUCT, "testing")
SHIM = "icefloe.__main__"
HEAVY = ("pyarrow", "numpy", "pyspark", "pyiceberg", "pandas")

LATER = "moves in a later #24 step"

# --- what is left, each entry one import edge (importer, imported) -----------------------

ALLOWED_UPWARD: dict[tuple[str, str], str] = {}
ALLOWED_SIDEWAYS: dict[tuple[str, str], str] = {}
ALLOWED_TESTING: dict[tuple[str, str], str] = {}
ALLOWED_PRIVATE: dict[tuple[str, str], str] = {}
ALLOWED_CIRCLE_EDGES: dict[tuple[str, str], str] = {}
ALLOWED_UNRESOLVED: dict[tuple[str, str], str] = {}


# --- reading the code ----------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Import:
    """One imported module (``target``) and, for ``from X import name``, the name."""

    importer: str
    target: str
    name: str | None


def module_name(path: Path) -> str:
    """``icefloe/manifest/model.py`` -> ``icefloe.manifest.model`` (a package's
    ``__init__`` is the package itself)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def product_files() -> dict[str, Path]:
    """Every module of the shipped packages and of ``testing``: ``.py`` sources, and the
    ``.pyx`` of a compiled module (so importing it resolves to a module, not a symbol)."""
    out: dict[str, Path] = {}
    for package in PROJECT:
        for path in sorted((ROOT / package).rglob("*.py*")):
            if path.suffix in (".py", ".pyx") and "__pycache__" not in path.parts:
                out[module_name(path)] = path
    return out


MODULES = product_files()


def _absolute(importer: str, node: ast.ImportFrom) -> str:
    """The absolute module a (possibly relative) ``from`` import names."""
    if not node.level:
        return node.module or ""
    is_package = MODULES[importer].stem == "__init__"
    base = importer.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def imports_of(importer: str) -> Iterator[Import]:
    """Every import in one module, wherever it is written."""
    path = MODULES[importer]
    if path.suffix != ".py":
        return
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(importer, alias.name, None)
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(importer, node)
            for alias in node.names:
                yield Import(importer, source, alias.name)


def top(module: str) -> str:
    return module.split(".")[0]


def resolved(imp: Import) -> str:
    """The project module an import loads: ``from p import m`` is module ``p.m`` when that
    is a module, else ``p`` itself."""
    if imp.name and f"{imp.target}.{imp.name}" in MODULES:
        return f"{imp.target}.{imp.name}"
    return imp.target


def project_edges() -> set[tuple[str, str]]:
    """(importer, imported) for every import of one project module by another."""
    edges: set[tuple[str, str]] = set()
    for importer in MODULES:
        for imp in imports_of(importer):
            target = resolved(imp)
            if top(target) in PROJECT and target != importer:
                edges.add((importer, _nearest_module(target)))
    return edges


def _nearest_module(name: str) -> str:
    """The nearest existing module for an import of one that does not exist (reported by
    :func:`unresolved_imports`), so the graph stays made of real modules."""
    while name not in MODULES and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


# --- the rules -----------------------------------------------------------------------------

def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def upward_violations() -> set[tuple[str, str]]:
    """The core reaching above itself, and anything but the shim importing the root."""
    out = set()
    for importer, target in project_edges():
        if importer == SHIM:
            continue
        core_reaching_up = _in(importer, "icefloe") and top(target) != "icefloe"
        root_imported = _in(target, "icefloe_app") and not _in(importer, "icefloe_app")
        if core_reaching_up or root_imported:
            out.add((importer, target))
    return out


FORBIDDEN = {"ingestor": ("collector", "pipeline"), "collector": ("ingestor",),
             "pipeline.iceberg": ("pipeline.load",)}


def sideways_violations() -> set[tuple[str, str]]:
    """A role reaching into another role it must not know."""
    out = set()
    for importer, target in project_edges():
        for package, banned in FORBIDDEN.items():
            if _in(importer, package) and any(_in(target, b) for b in banned):
                out.add((importer, target))
    return out


def harness_violations() -> set[tuple[str, str]]:
    """Product code importing the test harness (tests/ and bench/ are not parsed here)."""
    return {(importer, target) for importer, target in project_edges()
            if top(target) == "testing" and top(importer) != "testing"}


def private_violations() -> set[tuple[str, str]]:
    """``from other import _name``: a private symbol (or a private module of another
    package) used from outside its module."""
    out = set()
    for importer in MODULES:
        if top(importer) == "testing":
            continue
        for imp in imports_of(importer):
            if top(imp.target) not in PROJECT:
                continue
            for name in _private_parts(imp):
                owner = name.rsplit(".", 1)[0]
                own_package = owner == _package_of(importer)
                if name in MODULES and own_package:
                    continue  # a package's own private (compiled) module
                if owner != importer:
                    out.add((importer, name))
    return out


def _private_parts(imp: Import) -> Iterator[str]:
    """The dotted names of the import's private components (``a._b``, ``a.b._c``)."""
    parts = imp.target.split(".") + ([imp.name] if imp.name else [])
    for i, part in enumerate(parts):
        if part.startswith("_") and not part.startswith("__") and part != "*":
            yield ".".join(parts[: i + 1])


def _package_of(module: str) -> str:
    return module if MODULES[module].stem == "__init__" else module.rsplit(".", 1)[0]


def unresolved_imports() -> set[tuple[str, str]]:
    """Imports of a project module that does not exist (a path a move forgot): caught
    here because a function-local import fails only when its function runs."""
    out = set()
    for importer in MODULES:
        for imp in imports_of(importer):
            if top(imp.target) in PROJECT and resolved(imp) not in MODULES \
                    and imp.target not in MODULES:
                out.add((importer, resolved(imp)))
    return out


def circle_edges() -> set[tuple[str, str]]:
    """The import edges that lie on a circle: both ends in one strongly connected
    component (Tarjan's algorithm, iterative so deep graphs do not hit the recursion
    limit)."""
    edges = project_edges()
    graph: dict[str, list[str]] = {m: [] for m in MODULES}
    for a, b in edges:
        graph[a].append(b)
    component = _components(graph)
    return {(a, b) for a, b in edges if component[a] == component[b]}


def _components(graph: dict[str, list[str]]) -> dict[str, int]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    component: dict[str, int] = {}
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component[member] = index[node]
                    if member == node:
                        break
    return component


# --- the checks ----------------------------------------------------------------------------

RULES = {
    "upward": (upward_violations, ALLOWED_UPWARD),
    "sideways": (sideways_violations, ALLOWED_SIDEWAYS),
    "testing": (harness_violations, ALLOWED_TESTING),
    "private": (private_violations, ALLOWED_PRIVATE),
    "circles": (circle_edges, ALLOWED_CIRCLE_EDGES),
    "unresolved": (unresolved_imports, ALLOWED_UNRESOLVED),
}


@pytest.mark.parametrize("rule", sorted(RULES))
def test_should_keep_every_layer_rule_or_list_the_exception(rule):
    check, allowed = RULES[rule]
    found = check()
    new = sorted(found - set(allowed))
    gone = sorted(set(allowed) - found)
    assert not new, f"{rule}: new violations (fix them; do not list them): {new}"
    assert not gone, (f"{rule}: fixed, so remove these from the ALLOWED list in "
                      f"tests/system/test_layers.py: {gone}")


def test_should_read_the_modules_the_rules_are_about():
    """The checks see what they claim to: the core, the root, function-local imports."""
    assert {"icefloe.config", "icefloe_app.cli", "icefloe_app.api.server",
            "ingestor.server", "collector.service", "pipeline.iceberg.commit",
            "icefloe.formats._speedups"} <= set(MODULES)
    edges = project_edges()
    assert (SHIM, "icefloe_app.cli") in edges
    # build_parser imports its command modules inside the function
    assert ("icefloe_app.cli", "icefloe_app.cli.up_cmd") in edges


def test_should_find_a_circle_and_a_private_import_where_there_is_one():
    """The two subtle checks, on a graph and an import made up for the purpose."""
    component = _components({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]})
    assert component["a"] == component["b"] == component["c"] != component["d"]
    parts = list(_private_parts(Import("x", "ingestor.http.app", "_parse")))
    assert parts == ["ingestor.http.app._parse"]


def test_should_keep_pyspark_out_of_the_iceberg_package():
    """``pipeline/iceberg`` (its ``pipeline/load`` imports are the ``sideways`` rule's)."""
    iceberg = [m for m in MODULES if _in(m, "pipeline.iceberg")]
    assert "pipeline.iceberg.data_files" in iceberg
    for importer in iceberg:
        assert not any(top(imp.target) == "pyspark" for imp in imports_of(importer)), (
            f"{importer} imports pyspark")


def test_should_import_the_core_and_the_ingestor_without_heavy_modules():
    """Every module of ``icefloe`` and ``ingestor`` imported in a fresh interpreter loads
    no pyarrow, numpy, pyspark, pyiceberg or pandas (the light client and the slim
    ingestor image depend on it)."""
    names = [m for m in MODULES if top(m) in ("icefloe", "ingestor")
             and MODULES[m].suffix == ".py" and m != SHIM]
    probe = ("import importlib, json, sys\n"
             f"for name in {names!r}:\n    importlib.import_module(name)\n"
             "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True,
                         text=True, check=True, timeout=120)
    loaded = set(json.loads(out.stdout.splitlines()[-1]))
    assert not loaded & set(HEAVY), sorted(loaded & set(HEAVY))


# --- the collector/pipeline boundary (issue #38 item 3) ------------------------------------

PIPELINE_FACES = {"pipeline.load", "pipeline.iceberg", "pipeline.models"}
"""What ``collector/`` may import of ``pipeline/``: its public faces (``__all__``)."""
MAX_FACES = 4
MAX_CROSSINGS = 4


def collector_pipeline_imports() -> set[str]:
    """Every distinct ``pipeline`` module imported anywhere in ``collector/`` (function-local
    and ``TYPE_CHECKING`` imports included)."""
    return {_nearest_module(resolved(imp)) for importer in MODULES if _in(importer, "collector")
            for imp in imports_of(importer) if top(imp.target) == "pipeline"}


def test_should_import_pipeline_only_through_its_faces():
    used = collector_pipeline_imports()
    assert len(used) <= MAX_FACES, sorted(used)
    assert used <= PIPELINE_FACES, f"past the faces: {sorted(used - PIPELINE_FACES)}"


def test_should_export_from_each_face_what_it_lists():
    """Each face's ``__all__`` names resolve (loaded on first use), and every name
    ``collector/`` imports from a face is in its ``__all__``."""
    import importlib

    for face in PIPELINE_FACES:
        module = importlib.import_module(face)
        for name in module.__all__:
            assert getattr(module, name) is not None, (face, name)
    for importer in MODULES:
        if not _in(importer, "collector"):
            continue
        for imp in imports_of(importer):
            if imp.target in PIPELINE_FACES and imp.name is not None:
                assert imp.name in importlib.import_module(imp.target).__all__, (importer, imp)


def test_one_embedded_run_crosses_the_collector_pipeline_line_at_most_4_times():
    """``scripts/trace_boundary.py`` (its docstring defines a crossing) over one named test
    that runs one embedded collector run: its commit calls into ``pipeline`` once per table
    (plus the catalog-version callback), not once per step."""
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "trace_boundary.py")],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["crossings"], "the traced test ran no commit_run"
    assert max(report["crossings"]) <= MAX_CROSSINGS, report["path"]
