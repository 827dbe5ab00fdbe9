"""Load a table and pin a snapshot: what both query engines need, without Spark.

Why a module of its own: :mod:`pipeline.read.iceberg_source` imports pyspark, and the
embedded engine of ``icefloe query`` must not pay that import (nor does the planning step
that runs before the engine is chosen).
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path
from typing import TYPE_CHECKING

from icefloe.config import CatalogSection
from icefloe.errors import CatalogError, NamespaceNotFoundError
from pipeline.read.local_table import LocalTable, Unusual

if TYPE_CHECKING:
    from pyiceberg.table import Table

    from pipeline.read.local_table import LocalTable
    from pipeline.read.versions import SnapshotHistory


def load_table(catalog: CatalogSection, identifier: str) -> Table:
    """Open the catalog and load ``identifier``; a missing table names what does exist."""
    from pipeline.iceberg.catalog import catalog_label, open_catalog  # lazy: pyiceberg
    from pipeline.iceberg.errors import iceberg_errors, load_table_or_none  # lazy: pyiceberg

    opened = open_catalog(catalog)
    table = load_table_or_none(opened, identifier)
    if table is not None:
        return table
    namespace = identifier.rsplit(".", 1)[0] if "." in identifier else ""
    try:
        with iceberg_errors(NamespaceNotFoundError):
            existing = sorted(".".join(t) for t in opened.list_tables(namespace)) \
                if namespace else []
    except NamespaceNotFoundError:
        existing = []
    hint = (f"tables in namespace {namespace!r}: {', '.join(existing)}" if existing
            else f"namespace {namespace!r} has no tables" if namespace
            else "give the name as namespace.table")
    raise CatalogError(f"table {identifier!r} does not exist in {catalog_label(catalog)} "
                       f"({hint})")


def load_table_to_read(catalog: CatalogSection, identifier: str) -> Table:
    """:func:`load_table` for a reader; cheaper when the catalog is a local SQLite file.

    Why: pyiceberg's SQL catalog imports SQLAlchemy (~0.35 s) and the table's FileIO for a
    local warehouse imports pyarrow's dataset module and pandas (~0.7 s); a one-second
    ``icefloe query`` pays neither. For a SQLite catalog whose table metadata is local, the
    metadata location is read from the catalog's ``iceberg_tables`` row (read-only, as
    pyiceberg's ``SqlCatalog.load_table`` reads it) and the table reads through
    :class:`~pipeline.read.local_io.LocalReadFileIO`. The table can scan and plan, never
    commit. Anything else (another catalog, S3 metadata, no such row, a ``py-io-impl``
    setting) takes :func:`load_table`, with its errors.
    """
    return _load_from_sqlite(catalog, identifier) or load_table(catalog, identifier)


def _load_from_sqlite(catalog: CatalogSection, identifier: str) -> Table | None:
    """The table read straight from a local SQLite catalog, or None (see the caller)."""
    location = _metadata_location(catalog, identifier)
    if location is None:
        return None
    return table_at(catalog, identifier, location)


def table_at(catalog: CatalogSection, identifier: str, location: str) -> Table | None:
    """pyiceberg's table as of the local metadata file ``location``, read through
    :class:`~pipeline.read.local_io.LocalReadFileIO`; None where that IO cannot serve it
    (not local, a ``py-io-impl`` setting)."""
    from pipeline.read.local_io import LocalReadFileIO, local_path  # lazy: pyiceberg

    if local_path(location) is None:
        return None
    properties = {**catalog.properties, "uri": catalog.uri, "warehouse": catalog.warehouse}
    if "py-io-impl" in properties:
        return None
    from pyiceberg.catalog.noop import NoopCatalog  # lazy: pyiceberg
    from pyiceberg.serializers import FromInputFile  # lazy: pyiceberg
    from pyiceberg.table import Table  # lazy: pyiceberg

    metadata = FromInputFile.table_metadata(LocalReadFileIO(properties).new_input(location))
    properties = {**properties, **metadata.properties}
    if "py-io-impl" in properties:
        return None
    namespace, _, name = identifier.rpartition(".")
    return Table(identifier=(*namespace.split("."), name), metadata=metadata,
                 metadata_location=location, io=LocalReadFileIO(properties),
                 catalog=NoopCatalog(catalog.name))


def load_table_to_query(catalog: CatalogSection, identifier: str) -> Table | LocalTable:
    """:func:`load_table_to_read` for ``icefloe query``: a plain local table comes back as
    a :class:`~pipeline.read.local_table.LocalTable`, read without importing pyiceberg
    (its table layer is most of a cold query's time); any other as pyiceberg's table."""
    location = _metadata_location(catalog, identifier)
    if location is not None:
        try:
            return LocalTable.read(catalog, identifier, location)
        except Unusual:
            pass
    return load_table_to_read(catalog, identifier)


def as_pyiceberg(table: Table | LocalTable) -> Table:
    """pyiceberg's table for ``table``: itself, or for a :class:`LocalTable` the table
    pyiceberg reads from the same metadata file (so the same snapshots)."""
    if not isinstance(table, LocalTable):
        return table
    full = table_at(table.catalog, table.identifier, table.metadata_location)
    if full is None:  # LocalTable.read refused what table_at refuses: not reached
        raise CatalogError(f"table {table.identifier!r}: {table.metadata_location} is not "
                           "readable here")
    return full


def _metadata_location(catalog: CatalogSection, identifier: str) -> str | None:
    """The table's current metadata file per a local SQLite catalog, read-only; else None."""
    if catalog.type != "sql" or not catalog.uri.startswith("sqlite:///") or \
            "?" in catalog.uri or "." not in identifier:
        return None
    path = Path(catalog.uri.split(":///", 1)[1])
    if not path.is_file():
        return None
    namespace, _, name = identifier.rpartition(".")
    try:
        with closing(sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True)) as db:
            cursor = db.execute("SELECT * FROM iceberg_tables WHERE catalog_name = ? AND "
                                "table_namespace = ? AND table_name = ?",
                                (catalog.name, namespace, name))
            names = [column[0] for column in cursor.description]
            rows = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
    except sqlite3.Error:
        return None
    # pyiceberg's schema v1 also lists views; a row without the column is a table
    tables = [r for r in rows if r.get("iceberg_type") in (None, "TABLE")]
    if len(tables) != 1:
        return None
    return tables[0]["metadata_location"] or None


def resolve_snapshot(table: SnapshotHistory, identifier: str, snapshot_id: int | None
                     ) -> int | None:
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
