"""The ``dynamic-tables`` family (#42): every seeded sink names its table by the event.

Source ``s<i>``'s sink writes ``dyn<i>.t_{tenant}``; each event carries a ``tenant`` drawn
from a few values that differ in case and punctuation (``Acme``, ``acme``, ``Glo-bex``,
``init``), so two values share a table and every name is sanitised. The active collector
dies right after it makes (or first prepares) a template's table, before its run commits
to it (:func:`at_prepare`, ``kills_at_create`` times), and another collector takes over
at once: the table exists and holds no sequence of that run. Clients resend committed
requests now and then (``retry_after_success`` at least 0.3), so a replacement that
forgot what a table it did not make holds commits those events twice.

The checker resolves each event's table itself (:func:`table_for`: lower case, every
character outside ``[a-z0-9_]`` an ``_``, written here again rather than imported, so a
broken sanitiser cannot agree with itself), requires every acknowledged event exactly
once in that table and no event in any other, and reads the tables a namespace holds from
the catalog (:func:`concrete_tables`).
"""

from __future__ import annotations

import re
from typing import Any

from icefloe.config import Column

TENANTS = ("Acme", "acme", "Glo-bex", "init")
"""The values events carry, by ``n``: four values, three tables."""
COLUMN = Column("tenant", "string")


def template(source: int) -> str:
    """The seeded sink's table template of source ``s<source>``."""
    return f"dyn{source}.t_{{tenant}}"


def tenant(n: int) -> str:
    return TENANTS[n % len(TENANTS)]


def table_for(table: str, uid: str) -> str:
    """The table event ``uid`` (``<source>/<n>``) lands in through a sink writing
    ``table`` (a template: the one its tenant names; a plain name: itself)."""
    if "{" not in table:
        return table
    namespace = table.split(".", 1)[0]
    value = re.sub(r"[^a-z0-9_]", "_", tenant(int(uid.rsplit("/", 1)[1])).lower())
    return f"{namespace}.t_{value}"


def concrete_tables(catalog: Any, templates: set[str]) -> list[str]:
    """The tables the namespaces of ``templates`` hold now."""
    out: list[str] = []
    for namespace in sorted({t.split(".", 1)[0] for t in templates}):
        try:
            out += [".".join(name) for name in catalog.list_tables(namespace)]
        except Exception:  # no table made there yet
            continue
    return sorted(out)


def at_prepare(world: Any, host: str, stage: str) -> None:
    """``after_prepare:<table>``: while kills are left, the active collector dies here (its
    run has made the table, committed nothing) and a collector takes over at once."""
    active = world.active()
    if world.kills_at_create <= 0 or active is None or active.name != host:
        return
    world.kills_at_create -= 1
    world.checker.note(f"{host} dies right after preparing {stage.split(':', 1)[1]}; "
                       "a collector takes over")
    world._start_collector(takeover=True)
    world.checker.crash(host, stage)
