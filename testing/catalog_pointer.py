"""A table's metadata pointer in a SQLite Iceberg catalog, read and overwritten directly:
how the bulkhead tests, the simulator's ``parked-table`` family and ``bench/bulkhead_bench.py``
break a table (point it at a metadata file that is not there) and restore it, as a bad
restore or another tool's mistake would. Test tooling only."""

from __future__ import annotations

import sqlite3
from pathlib import Path


def metadata_pointer(catalog_db: Path | str, table: str,
                     location: str | None = None) -> str | None:
    """``table``'s ``metadata_location`` (None: no such table); with ``location``, set it
    first. ``catalog_db`` is the SQLite file (a ``sqlite:///`` URI is accepted too)."""
    path = str(catalog_db).removeprefix("sqlite:///")
    namespace, name = table.rsplit(".", 1)
    db = sqlite3.connect(path)
    try:
        if location is not None:
            db.execute("UPDATE iceberg_tables SET metadata_location = ? WHERE "
                       "table_namespace = ? AND table_name = ?", (location, namespace, name))
            db.commit()
        row = db.execute("SELECT metadata_location FROM iceberg_tables WHERE "
                         "table_namespace = ? AND table_name = ?", (namespace, name)).fetchone()
        return None if row is None else str(row[0])
    finally:
        db.close()


def lost(location: str) -> str:
    """A metadata location next to ``location`` that does not exist."""
    return location.replace(".metadata.json", "-lost.json")
