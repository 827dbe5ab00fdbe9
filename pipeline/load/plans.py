"""What the executors write for each table of a cluster-path run: planned on the driver.

The collector deduplicates on the keys; :func:`plan_write` turns a table's fresh keys into
a :class:`WritePlan` (which rows, replay-filtered by the table's committed sequences, in
which projection), :func:`plan_upsert` an upsert sink's into the rows to write and the
files to rewrite (:class:`UpsertPlan`). Both read the table through the catalog, on the
driver; the plans travel to the executors inside the write job.
"""


from __future__ import annotations

import pickle
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.table import FileScanTask

from icefloe.errors import CatalogError
from pipeline.columns import SHARD_COLUMN
from pipeline.iceberg.cdc_apply import applicable_changes
from pipeline.iceberg.commit import (
    SHARD_BITS,
    check_epoch,
    committed_state,
    covers,
    not_committed,
)
from pipeline.iceberg.upsert import affected_files, key_filter, latest_per_key, survivors
from pipeline.load.frame import ROW

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

_LOCAL = (1 << SHARD_BITS) - 1

INLINE_DROPS = 10_000


# --------------------------------------------------------------------------- driver side


@dataclass(frozen=True, slots=True)
class WritePlan:
    """Write ``stream``'s rows past ``after`` (per manifest shard, the table's committed
    or staged sequence: a row's run position names its shard; and of the entries in
    ``sequences`` — run positions — if given) except rows ``drop``, to ``table`` — or,
    with ``stage``, to that table's staging area.

    ``key`` names the target in the result (the table, for the collector; the stream by
    default). ``columns`` are the sink's (name, declared type): a source with several
    sinks writes each its own projection; None writes the stream's decoded columns.
    """

    stream: str
    table: Table | None
    after: dict[int, int]
    drop: pa.Array
    expected: int
    key: str = ""
    columns: tuple[tuple[str, str], ...] | None = None
    sequences: tuple[int, ...] | None = None
    stage: str | None = None
    rewrites: tuple[tuple[bytes, bytes], ...] = ()
    """Upserts: existing files to rewrite without the keys the run replaces or deletes,
    as (pickled scan task, the file's keys as Arrow IPC); ``upsert_key`` names the key."""
    upsert_key: tuple[str, ...] = ()
    where: str | None = None
    """The persisted run's boolean column of the sink's ``where`` (None: no predicate):
    only rows it marks are written."""
    named: str | None = None
    """A table template's table: the persisted run's column of the table each row names
    (:func:`~pipeline.load.named.table_columns`); only rows naming :attr:`target` are
    written."""

    @property
    def target(self) -> str:
        return self.key or self.stream


def plan_write(catalog: Catalog, identifier: str, stream: str, keys: pa.Table,
               fresh: pa.Table, *, sequences: Mapping[int, int], epoch: int, key: str = "",
               columns: tuple[tuple[str, str], ...] | None = None,
               entries: tuple[int, ...] | None = None,
               where: str | None = None, named: str | None = None) -> WritePlan | None:
    """What to write for one table, or None when nothing is new.

    Reads the table's committed sequences and epoch first: a fenced collector stops before
    writing a byte, and rows a previous attempt already committed (per manifest shard)
    are never rewritten. ``keys`` are the stream's rows of the run that go to this table
    (of the entries in ``entries``, run positions, if given; ``_sequence``: run
    positions), ``fresh`` those the dedup window kept; ``sequences`` the run's last
    sequence per shard; ``key``, ``columns``, ``where``, ``named``: see :class:`WritePlan` (rows
    of ``keys`` not in ``fresh`` are not written: duplicates, rows missing a key value).
    """
    found = _pending(catalog, identifier, fresh, sequences, epoch)
    if found is None:
        return None
    table, done, survivors = found
    # Rows the dedup window dropped; replayed ones are excluded by `_sequence > after`.
    drop = pa.array([], pa.int64())
    if fresh.num_rows < keys.num_rows:
        kept = pc.is_in(keys.column(ROW), value_set=fresh.column(ROW).combine_chunks())
        drop = keys.filter(pc.invert(kept)).column(ROW).combine_chunks()
    return WritePlan(stream, table, done, drop, survivors.num_rows, key=key,
                     columns=columns, sequences=entries, where=where, named=named)



@dataclass(frozen=True, slots=True)
class UpsertPlan:
    """What the executors write for an upsert table, and what its commit replaces.

    ``write`` writes the run's surviving rows and rewrites ``replaced`` (the existing files
    holding a key the run replaces or deletes); the commit
    (:class:`~pipeline.iceberg.data_files.ReplaceFiles`) is valid only on snapshot
    ``snapshot_id`` and for ``rows`` rows still to commit.
    """

    write: WritePlan
    replaced: tuple[Any, ...]
    snapshot_id: int | None
    rows: int
    noops: tuple[tuple[str, int], ...] = ()
    """A change stream's changes that do nothing, by reason (stale, unknown delete)."""


def plan_upsert(catalog: Catalog, identifier: str, stream: str, keys: pa.Table,
                fresh: pa.Table, *, key: Sequence[str], tombstone: str | None,
                sequences: Mapping[int, int], epoch: int, target: str = "",
                columns: tuple[tuple[str, str], ...] | None = None,
                entries: tuple[int, ...] | None = None,
                where: str | None = None, position: str | None = None,
                keep_deletes: bool = False) -> UpsertPlan | None:
    """:func:`plan_write` for a table with a primary key, or None when nothing is new.

    ``keys`` (every row of the run for this table) and ``fresh`` (those the dedup window
    kept, each with a value in every ``key`` column) carry the key and ``tombstone``
    columns. The rows past the committed sequences are reduced to the latest per key by
    the embedded path's rule (:func:`~pipeline.iceberg.upsert.survivors`); the executors
    write those that are not tombstones (every other row of ``keys`` is dropped by
    ``_row``) and rewrite each existing file that holds one of the keys without it. Only
    key columns reach the driver: the rows themselves stay on the executors.

    A change stream (``position``: its source position column, in ``keys``): each key's
    latest change by position, dropped when the table's row holds a position as new
    (stale) or when it deletes a key nobody has (counted in :attr:`UpsertPlan.noops`), as
    the embedded path's :class:`~pipeline.iceberg.upsert.CopyOnWrite` decides
    (:func:`~pipeline.iceberg.cdc_apply.applicable_changes`); with ``keep_deletes`` a
    delete is written as the key's row.
    """
    found = _pending(catalog, identifier, fresh, sequences, epoch)
    if found is None:
        return None
    table, done, pending = found
    changes, noops = pending, dict[str, int]()
    if position is not None and tombstone is not None:
        pending = _as_text(pending, position)
        latest = latest_per_key(pending, key, position)
        changes, noops = applicable_changes(table, pending, latest, key, tombstone, position,
                                            key_filter(latest.select(list(key))),
                                            keep_deletes=keep_deletes)
    replaced_keys, write = survivors(changes, key, None if keep_deletes else tombstone,
                                     position)
    kept = pc.is_in(keys.column(ROW), value_set=write.column(ROW).combine_chunks())
    drop = keys.filter(pc.invert(kept)).column(ROW).combine_chunks()
    rewrites: list[tuple[bytes, bytes]] = []
    replaced = []
    for task, held in affected_files(table, replaced_keys, key):
        replaced.append(task.file)
        rewrites.append((pickle.dumps(FileScanTask(task.file, task.delete_files)),
                         _ipc(held)))
    current = table.current_snapshot()
    plan = WritePlan(stream, table, done, drop, write.num_rows, key=target, columns=columns,
                     sequences=entries, rewrites=tuple(rewrites), upsert_key=tuple(key),
                     where=where)
    return UpsertPlan(plan, tuple(replaced), current.snapshot_id if current else None,
                      pending.num_rows, tuple(sorted(noops.items())))


def _as_text(rows: pa.Table, column: str) -> pa.Table:
    """``rows`` with ``column`` as ``string`` (Spark may hand text back as
    ``large_string``; the stored positions it is compared with are ``string``)."""
    index = rows.column_names.index(column)
    if rows.schema.field(index).type == pa.string():
        return rows
    return rows.set_column(index, column, rows.column(index).cast(pa.string()))



def _pending(catalog: Catalog, identifier: str, fresh: pa.Table, sequences: Mapping[int, int],
             epoch: int) -> tuple[Table, dict[int, int], pa.Table] | None:
    """The table (epoch checked), its committed sequence per shard and the rows of
    ``fresh`` past it — or None when the run is committed already or nothing is new: the
    replay check :func:`plan_write` and :func:`plan_upsert` share."""
    table = _load(catalog, identifier)
    state = committed_state(table)
    check_epoch(identifier, state, epoch)
    done = state.sequences
    if covers(done, sequences) or fresh.num_rows == 0:
        return None
    pending = not_committed(fresh, "_sequence", done) if done else fresh
    if pending.num_rows == 0:
        return None
    _check_shards(table, identifier, pending)
    return table, done, pending

def _ipc(rows: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, rows.schema) as writer:
        writer.write_table(rows)
    return sink.getvalue().to_pybytes()


def _load(catalog: Catalog, identifier: str) -> Table:
    try:
        return catalog.load_table(identifier)
    except Exception as exc:
        raise CatalogError(f"cannot load table {identifier}: {exc}") from exc


def _check_shards(table: Table, identifier: str, rows: pa.Table) -> None:
    """Refuse rows of manifest shards above 0 for a table without the shard column."""
    if SHARD_COLUMN[0] not in table.schema().column_names and \
            pc.any(pc.greater(rows.column("_sequence"), _LOCAL)).as_py():
        raise CatalogError(f"table {identifier} has no {SHARD_COLUMN[0]} column for rows of "
                           "manifest shards above 0: it was not evolved")
