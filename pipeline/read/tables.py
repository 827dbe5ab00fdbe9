"""Load a table and pin a snapshot: what both query engines need, without Spark.

Why a module of its own: :mod:`pipeline.read.iceberg_source` imports pyspark, and the
embedded engine of ``icefloe query`` must not pay that import (nor does the planning step
that runs before the engine is chosen).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from icefloe.config import CatalogSection
from icefloe.errors import CatalogError

if TYPE_CHECKING:
    from pyiceberg.table import Table


def load_table(catalog: CatalogSection, identifier: str) -> Table:
    """Open the catalog and load ``identifier``; a missing table names what does exist."""
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

    from pipeline.iceberg.catalog import catalog_label, open_catalog

    opened = open_catalog(catalog)
    try:
        return opened.load_table(identifier)
    except NoSuchTableError:
        pass
    namespace = identifier.rsplit(".", 1)[0] if "." in identifier else ""
    try:
        existing = sorted(".".join(t) for t in opened.list_tables(namespace)) if namespace else []
    except NoSuchNamespaceError:
        existing = []
    hint = (f"tables in namespace {namespace!r}: {', '.join(existing)}" if existing
            else f"namespace {namespace!r} has no tables" if namespace
            else "give the name as namespace.table")
    raise CatalogError(f"table {identifier!r} does not exist in {catalog_label(catalog)} "
                       f"({hint})")


def resolve_snapshot(table: Table, identifier: str, snapshot_id: int | None) -> int | None:
    """The snapshot to read: the one asked for (which must exist) or the current one.

    ``None`` means the table has no snapshot yet (created, never written): it reads empty.
    """
    if snapshot_id is None:
        current = table.current_snapshot()
        return None if current is None else current.snapshot_id
    if table.snapshot_by_id(snapshot_id) is None:
        known = [s.snapshot_id for s in table.snapshots()][-5:]
        raise CatalogError(f"table {identifier!r} has no snapshot {snapshot_id} (expired or "
                           f"never existed); latest snapshots: {known or 'none'}")
    return snapshot_id
