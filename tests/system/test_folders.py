"""No import loop between the core's folders (issue #38, item 4).

``tests/system/test_layers.py`` finds circles between *modules*; a loop between two folders
of the core (``icefloe/config`` importing ``icefloe/manifest`` while ``icefloe/manifest``
imports ``icefloe/config``) has no module circle in it, yet it means neither folder can be
read, moved or tested without the other. The manifest's settings once made that loop; they
live in ``icefloe/config`` now, and this check keeps every folder loop of the core out.
"""

from __future__ import annotations

from test_layers import MODULES, _components, project_edges, top


def folder(module: str) -> str:
    """``icefloe.config.model`` -> ``icefloe.config``; a top-level module is its own."""
    return ".".join(module.split(".")[:2])


def folder_loops(package: str = "icefloe") -> list[list[str]]:
    """The groups of ``package``'s folders that import each other in a loop."""
    graph: dict[str, set[str]] = {}
    for importer, target in project_edges():
        if top(importer) == top(target) == package:
            a, b = folder(importer), folder(target)
            graph.setdefault(a, set())
            graph.setdefault(b, set())
            if a != b:
                graph[a].add(b)
    component = _components({name: sorted(targets) for name, targets in graph.items()})
    groups: dict[int, list[str]] = {}
    for name, group in component.items():
        groups.setdefault(group, []).append(name)
    return sorted(sorted(names) for names in groups.values() if len(names) > 1)


def test_should_have_no_import_loop_between_the_cores_folders():
    assert "icefloe.config.manifest" in MODULES
    assert folder_loops() == []


def test_should_see_a_folder_loop_where_there_is_one():
    component = _components({"icefloe.config": ["icefloe.manifest"],
                             "icefloe.manifest": ["icefloe.config"], "icefloe.store": []})
    assert component["icefloe.config"] == component["icefloe.manifest"] \
        != component["icefloe.store"]
