"""Change streams (#42) on a keyed table: which of a run's changes still apply.

Why a step before the copy-on-write (:class:`pipeline.iceberg.upsert.CopyOnWrite`), and
not a second upsert: the table already keeps each row's source position in
:data:`~icefloe.streams.cdc.POSITION_COLUMN`. A key's latest change in the run (by
position, :func:`~pipeline.iceberg.upsert.latest_per_key`) that is not newer than the
position its row holds is a late change (a connector re-delivering after a restart,
beyond the dedup window, or a producer out of order): a no-op, counted as ``stale``. A
delete of a key the table does not hold and the run never wrote is counted as
``unknown_delete`` (nothing to do). What is left goes to the ordinary copy-on-write, so
both the write and exactly-once stay the upsert's.

Runs on the freshly loaded table of each commit attempt, so a plan never outlives the
snapshot it read (the overwrite is refused if anyone committed in between).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

if TYPE_CHECKING:
    from pyiceberg.expressions import BooleanExpression
    from pyiceberg.table import Table

STALE = "stale"
UNKNOWN_DELETE = "unknown_delete"
_INDEX = "__icefloe_change"
_STORED = "__icefloe_stored"
_PRESENT = "__icefloe_present"


def applicable_changes(table: Table, rows: pa.Table, latest: pa.Table, key: Sequence[str],
                       tombstone: str, position: str, row_filter: BooleanExpression,
                       *, keep_deletes: bool = False) -> tuple[pa.Table, dict[str, int]]:
    """Of ``latest`` (each key's latest change among ``rows``, by position), those that
    still apply to ``table``, and how many changes were no-ops by reason (:data:`STALE`,
    :data:`UNKNOWN_DELETE`; never the latter with ``keep_deletes``: a kept delete of an
    unknown key is written). ``row_filter`` prunes the files that may hold the keys."""
    if latest.num_rows == 0:
        return latest, {}
    stored = _stored(table, row_filter, latest.schema, key, position)
    index = latest.select(list(key)).append_column(_INDEX, pa.array(np.arange(latest.num_rows)))
    joined = index.join(stored, keys=list(key), join_type="left outer", use_threads=False)
    order = joined.column(_INDEX).to_numpy()
    incoming = latest.column(position).take(pa.array(order))
    held = joined.column(_STORED)
    stale = pc.fill_null(pc.less_equal(incoming, held), False)
    present = pc.fill_null(joined.column(_PRESENT), False)
    deleted = pc.fill_null(latest.column(tombstone).take(pa.array(order)), False)
    written = _keys_written(rows, key, tombstone)
    in_run = pc.is_in(_key_tuple(joined, key), value_set=_key_tuple(written, key)) \
        if written.num_rows else pa.array([False] * joined.num_rows)
    unknown = pc.and_(deleted, pc.invert(pc.or_(present, in_run)))  # a kept delete's row
    # is present: a second delete of its key is newer (its position moves) or stale
    if keep_deletes:
        unknown = pc.and_(unknown, pa.scalar(False))
    drop = pc.or_(stale, unknown)
    noops = {}
    if pc.any(stale).as_py():
        stale_keys = joined.filter(stale).select(list(key))
        noops[STALE] = _changes_of(rows, stale_keys, key)
    if pc.any(unknown).as_py():
        noops[UNKNOWN_DELETE] = _changes_of(rows, joined.filter(unknown).select(list(key)), key)
    if not noops:
        return latest, noops
    keep = np.sort(order[pc.invert(drop).to_numpy(zero_copy_only=False)])
    return latest.take(pa.array(keep)), noops


def _stored(table: Table, row_filter: BooleanExpression, schema: pa.Schema,
            key: Sequence[str], position: str) -> pa.Table:
    """The table's key columns and stored position of the rows ``row_filter`` keeps, in
    the run's Arrow types (``schema``), with a ``present`` flag (an empty table before the
    first commit)."""
    fields = [schema.field(name) for name in key]
    schema = pa.schema([*fields, pa.field(_STORED, pa.string()), pa.field(_PRESENT, pa.bool_())])
    if table.current_snapshot() is None:
        return schema.empty_table()
    found = table.scan(row_filter=row_filter,
                       selected_fields=(*key, position)).to_arrow()
    if found.num_rows == 0:
        return schema.empty_table()
    columns = [found.column(name).cast(f.type) for name, f in zip(key, fields, strict=True)]
    return pa.Table.from_arrays(
        [*columns, found.column(position).cast(pa.string()),
         pa.array(np.ones(found.num_rows, dtype=bool))], schema=schema)


def _keys_written(rows: pa.Table, key: Sequence[str], tombstone: str) -> pa.Table:
    """The keys some change of the run creates or updates (not only deletes)."""
    deleted = pc.fill_null(rows.column(tombstone), False)
    return rows.filter(pc.invert(deleted)).select(list(key))


def _key_tuple(rows: pa.Table, key: Sequence[str]) -> pa.Array:
    """One comparable value per row for a (possibly composite) key: the single column, or
    the columns' JSON text joined (only compared with values built the same way)."""
    if len(key) == 1:
        return rows.column(key[0]).combine_chunks()
    parts = [pc.cast(rows.column(name), pa.string()) for name in key]
    return pc.binary_join_element_wise(*[pc.fill_null(p, "\x00") for p in parts], "\x1f")


def _changes_of(rows: pa.Table, keys: pa.Table, key: Sequence[str]) -> int:
    """How many of the run's changes belong to ``keys``."""
    return int(pc.sum(pc.is_in(_key_tuple(rows, key), value_set=_key_tuple(keys, key)))
               .as_py() or 0)
