"""Replace rows of a table in ONE snapshot: every icefloe commit is one state readers see.

Why not pyiceberg's ``overwrite``/``upsert``: inside one transaction they still commit a
snapshot per step (a ``delete``, maybe an ``overwrite`` rewriting files, then an ``append``,
for an upsert a second ``append``). The catalog swaps them in at once, so a reader of the
current table never sees the middle, but time travel does: each snapshot has its own
version and timestamp, and ``AT (VERSION => n)`` between them reads an empty table or one
missing the rows being replaced. Here the removal and the new rows are one snapshot
producer: an ``overwrite`` snapshot when files are removed, an ``append`` otherwise (also
with nothing to add: the snapshot still records the commit's summary properties).

Copy-on-write, as pyiceberg's delete does: a file holding a row that ``where`` matches is
rewritten without those rows, in the same snapshot. Files are written with the
transaction's metadata, so a schema change staged in the same transaction applies to the
rewritten rows and the new ones alike.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyiceberg.expressions import AlwaysFalse, AlwaysTrue, BooleanExpression

if TYPE_CHECKING:
    from pyiceberg.manifest import DataFile
    from pyiceberg.table import Transaction

DUPLICATE_KEYS = "Duplicate rows found in source dataset based on the key columns"
"""pyiceberg's words for a merge whose rows repeat a key (callers match on them)."""


def replace_rows(tx: Transaction, rows: pa.Table, where: BooleanExpression,
                 properties: dict[str, str]) -> None:
    """Stage ONE snapshot in ``tx`` that removes the rows matching ``where`` and adds
    ``rows``, with ``properties`` in its summary (``AlwaysTrue()``: replace everything,
    ``AlwaysFalse()``: a plain append).

    Raises:
        ValueError: ``rows`` do not fit the table's schema (pyiceberg's check and words).
    """
    from pyiceberg.io.pyarrow import _dataframe_to_data_files  # lazy: pandas

    _check_fits(tx, rows)
    removed, kept = _affected(tx, where)
    update = tx.update_snapshot(snapshot_properties=properties)
    producer: Any = (update.overwrite() if removed
                     else tx._append_snapshot_producer(properties))
    counter = itertools.count(0)
    with producer as snapshot:
        if removed:
            # The predicate makes the producer open every manifest that may list a removed
            # file (without one, an unpartitioned table's manifests are kept unread).
            snapshot.delete_by_predicate(where)
        for data_file in removed:
            snapshot.delete_data_file(data_file)
        for part in (*kept, rows):
            if part.num_rows == 0:
                continue
            for data_file in _dataframe_to_data_files(
                    table_metadata=tx.table_metadata, write_uuid=snapshot.commit_uuid,
                    df=part, io=tx._table.io, counter=counter):
                snapshot.append_data_file(data_file)


def merge_rows(tx: Transaction, rows: pa.Table, key: Sequence[str],
               properties: dict[str, str]) -> tuple[int, int]:
    """Upsert ``rows`` by ``key`` in ONE snapshot staged in ``tx``: rows whose key exists
    with other values replace it, new keys are added, unchanged rows are left alone (what
    pyiceberg's ``upsert`` decides, committed as one snapshot). Returns ``(updated,
    inserted)``.

    Raises:
        ValueError: ``rows`` repeat a key, or do not fit the table's schema.
    """
    from pyiceberg.table import upsert_util  # lazy: pyiceberg.table

    from pipeline.iceberg.upsert import without_keys  # lazy: pyiceberg

    key = list(key)
    if upsert_util.has_duplicate_rows(rows, key):
        raise ValueError(f"{DUPLICATE_KEYS}. No upsert executed")
    _check_fits(tx, rows)
    matched = _scan(tx, upsert_util.create_match_filter(rows, key)) \
        if rows.num_rows and tx.table_metadata.current_snapshot() is not None else None
    if matched is None or matched.num_rows == 0:
        replace_rows(tx, rows, AlwaysFalse(), properties)
        return 0, rows.num_rows
    updated = upsert_util.get_rows_to_update(rows, matched, key)
    inserted = without_keys(rows, matched.select(key), key)
    where = upsert_util.create_match_filter(updated, key) if updated.num_rows \
        else AlwaysFalse()
    replace_rows(tx, pa.concat_tables([updated, inserted]), where, properties)
    return updated.num_rows, inserted.num_rows


def _check_fits(tx: Transaction, rows: pa.Table) -> None:
    """pyiceberg's own check that ``rows`` can be written to the table's schema."""
    from pyiceberg.io.pyarrow import _check_pyarrow_schema_compatible  # lazy: pandas

    _check_pyarrow_schema_compatible(tx.table_metadata.schema(), provided_schema=rows.schema,
                                     format_version=tx.table_metadata.format_version)


def _scan(tx: Transaction, where: BooleanExpression) -> pa.Table:
    """The rows matching ``where`` in the transaction's current state."""
    from pyiceberg.table import DataScan  # lazy: pyiceberg.table

    return DataScan(table_metadata=tx.table_metadata, io=tx._table.io,
                    row_filter=where).to_arrow()


def _affected(tx: Transaction, where: BooleanExpression
              ) -> tuple[list[DataFile], list[pa.Table]]:
    """``(files to remove, rows of theirs to keep)``: every live file holding a row that
    ``where`` matches, and each one's other rows (none read when ``where`` is always
    true)."""
    from pyiceberg.expressions.visitors import bind  # lazy: pyiceberg.expressions.visitors
    from pyiceberg.io.pyarrow import ArrowScan, _expression_to_complementary_pyarrow  # lazy: pandas
    from pyiceberg.table import DataScan  # lazy: pyiceberg.table

    metadata = tx.table_metadata
    if metadata.current_snapshot() is None or where == AlwaysFalse():
        return [], []
    io = tx._table.io
    tasks = DataScan(table_metadata=metadata, io=io, row_filter=where).plan_files()
    if where == AlwaysTrue():
        return [task.file for task in tasks], []
    schema = metadata.schema()
    keep = _expression_to_complementary_pyarrow(bind(schema, where, case_sensitive=True),
                                                schema)
    reader = ArrowScan(table_metadata=metadata, io=io, projected_schema=schema,
                       row_filter=AlwaysTrue())
    removed: list[DataFile] = []
    kept: list[pa.Table] = []
    for task in tasks:
        data = reader.to_table(tasks=[task])
        left = data.filter(keep)
        if left.num_rows == data.num_rows:
            continue  # its bounds overlap ``where``, its rows do not
        removed.append(task.file)
        if left.num_rows:
            kept.append(left)
    return removed, kept
