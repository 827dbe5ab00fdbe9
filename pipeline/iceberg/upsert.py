"""Upserts by copy-on-write: a table with a ``primary_key`` keeps the latest row per key.

Why copy-on-write: Iceberg offers equality deletes for this, but pyiceberg here cannot read
them, so neither could ``icefloe query``'s embedded engine nor the dedup window. Instead
every commit to a keyed table *rewrites* the data files that hold a key the run replaces
or deletes, without those rows, and adds the run's new rows, in ONE overwrite snapshot.
Readers never see a key twice nor a key missing, and the table stays plain Iceberg data
files that any engine reads.

Which row wins: within a run, the last by ``(_shard, _sequence, row position)`` — the
manifest shard, the entry's sequence in it, the record's place in the entry's batch file
(the order in which its ingestor accepted it). Runs commit in manifest order, so a later
run always wins over an earlier one. With several manifest shards the shard number orders
entries of one run, not arrival: send a key's updates to one shard (or one stream) when
their order matters. A ``tombstone_field`` that is true makes the key's latest row a
delete: the key leaves the table and nothing is written for it.

Exactly once: :class:`CopyOnWrite` is the ``append`` hook of
:func:`pipeline.iceberg.commit.commit_rows`, so the overwrite carries ``icefloe.sequence``
(``icefloe.sequences``), ``icefloe.epoch`` and the sources exactly like an append, and a
replayed entry is dropped by the sequence check before the hook runs. Each attempt
re-reads the table and plans again, and the overwrite is refused if anyone committed in
between (``commit.retry.num-retries=0``), so a stale plan never lands.

Cost: every commit reads the key columns of the files the keys' column bounds (and the
table's partitions) cannot rule out, and rewrites each file that holds a replaced key.
Keys that arrive roughly in order (ids, timestamps) touch few files; random keys over a
large table touch most of them on every commit (``bench/upsert_bench.py``).
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.exceptions import CommitFailedException, ValidationException
from pyiceberg.expressions import (
    AlwaysTrue,
    And,
    BooleanExpression,
    GreaterThanOrEqual,
    In,
    LessThanOrEqual,
)

from icefloe.streams.cdc import POSITION_COLUMN
from icefloe.streams.evolution import EXTRA_FIELD
from icefloe.streams.model import StreamConfig
from pipeline.columns import TIMESTAMP, dead_letter_arrow_schema
from pipeline.iceberg.cdc_apply import applicable_changes
from pipeline.iceberg.data_files import (
    DataFileRef,
    TableFiles,
    TableTarget,
    delete_files,
    replace_files,
)

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.manifest import DataFile
    from pyiceberg.table import FileScanTask, Table

log = logging.getLogger("icefloe.upsert")

MISSING_KEY = "missing_key"
"""Dead-letter reason of a row without a value in a key column (``missing_key:<column>``)."""
_IN_LIMIT = 200
"""Up to this many distinct values a key column prunes files with ``In`` (pyiceberg's
metrics evaluator gives up on larger sets); beyond, with the values' range."""
_RANK = "__icefloe_rank"


def latest_per_key(rows: pa.Table, key: Sequence[str], position: str | None = None
                   ) -> pa.Table:
    """The last row of each key by ``(_shard, _sequence, row position)`` (module doc);
    with ``position`` (a change stream's source position, sortable text), by it first:
    the source's order overrides the accepted order."""
    n = rows.num_rows
    if n == 0:
        return rows
    seq = _int_column(rows, "_sequence")
    shard = _int_column(rows, "_shard")
    sort_keys = [np.arange(n), seq, shard]
    if position is not None:  # a dense rank: equal texts, equal ranks
        texts = pc.fill_null(rows.column(position).combine_chunks(), "")
        sort_keys.append(pc.rank(texts, tiebreaker="dense").to_numpy().astype(np.int64))
    order = np.lexsort(sort_keys)  # the last key sorts first
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n, dtype=np.int64)
    ranked = rows.select(list(key)).append_column(_RANK, pa.array(rank))
    best = ranked.group_by(list(key), use_threads=False).aggregate([(_RANK, "max")])
    if best.num_rows == n:
        return rows
    keep = np.sort(order[best.column(f"{_RANK}_max").to_numpy()])
    return rows.take(pa.array(keep))


def _int_column(rows: pa.Table, name: str) -> np.ndarray:
    """An int64 column as numpy, nulls (rows of tables before shards) as 0; zeros if absent."""
    if name not in rows.column_names:
        return np.zeros(rows.num_rows, dtype=np.int64)
    column = pc.fill_null(rows.column(name).combine_chunks(), 0)
    return column.to_numpy(zero_copy_only=False).astype(np.int64)


def split_missing_keys(rows: pa.Table, key: Sequence[str]) -> tuple[pa.Table, pa.Table]:
    """``(rows with every key column set, rows missing one)``."""
    if not key or rows.num_rows == 0:
        return rows, rows.slice(0, 0)
    missing = pc.is_null(rows.column(key[0]))
    for name in key[1:]:
        missing = pc.or_(missing, pc.is_null(rows.column(name)))
    if not pc.any(missing).as_py():
        return rows, rows.slice(0, 0)
    return rows.filter(pc.invert(missing)), rows.filter(missing)


def missing_key_dead_letters(bad: pa.Table, key: Sequence[str], stream: str,
                             locations: Mapping[int, str]) -> pa.Table:
    """Dead-letter rows for ``bad`` (rows missing a key value): the reason names the first
    empty key column (:func:`rows_as_dead_letters`)."""
    empty = [next(name for name in key if record.get(name) is None)
             for record in bad.select(list(key)).to_pylist()]
    return rows_as_dead_letters(bad, stream, locations,
                                [f"{MISSING_KEY}:{name}" for name in empty],
                                [f"primary key column {name!r} has no value" for name in empty])


def rows_as_dead_letters(rows: pa.Table, stream: str, locations: Mapping[int, str],
                         reasons: Sequence[str], messages: Sequence[str]) -> pa.Table:
    """Dead-letter rows for decoded ``rows`` (one reason and message each): ``raw`` holds
    the row as decoded (JSON, without icefloe's ``_`` columns), ``location`` the batch
    file of its entry (``locations``: run position → location), ``stream`` its source."""
    records = rows.to_pylist()
    sources = [r.pop("_source", None) or stream for r in records]
    raws = [msgspec.json.encode(_as_sent(record), enc_hook=str) for record in records]
    sequences = rows.column("_sequence").to_pylist()
    return pa.table({
        "stream": pa.array(sources, pa.string()),
        "sequence": pa.array(sequences, pa.int64()),
        "location": pa.array([locations.get(s, "") for s in sequences], pa.string()),
        "record_index": pa.array([None] * rows.num_rows, pa.int64()),
        "event_id": rows.column("_event_id").cast(pa.string()),
        "reason": pa.array(reasons, pa.string()),
        "message": pa.array(messages, pa.string()),
        "raw": pa.array(raws, pa.binary()),
        "received_at": rows.column("_received_at").cast(TIMESTAMP),
    }, schema=dead_letter_arrow_schema())


def _as_sent(record: dict[str, object]) -> dict[str, object]:
    """A decoded row as its producer sent it: its columns, and the undeclared fields an
    evolving stream keeps as JSON text (so a redrive gets them back), without icefloe's
    own ``_`` columns."""
    out = {k: v for k, v in record.items() if not k.startswith("_")}
    extra = record.get(EXTRA_FIELD)
    if isinstance(extra, str):
        with contextlib.suppress(msgspec.DecodeError):
            fields = msgspec.json.decode(extra)
            if isinstance(fields, dict):
                out = {**fields, **out}
    return out


class CopyOnWrite:
    """``append`` hook of :func:`~pipeline.iceberg.commit.commit_rows` for a keyed table.

    Called with the rows still to commit (replays already dropped, ``_shard`` split out)
    once per attempt, each time on a freshly loaded table. Keeps what it wrote per attempt
    so :meth:`cleanup` deletes the files of attempts the catalog refused.
    """

    def __init__(self, key: Sequence[str], tombstone: str | None = None,
                 position: str | None = None, keep_deletes: bool = False) -> None:
        self.key = tuple(key)
        self.tombstone = tombstone
        self.position = position
        self.keep_deletes = keep_deletes
        """A change stream's ``deletes = "keep"``: a delete is written as its row (the
        tombstone column true) instead of removing the key."""
        """A change stream's position column: orders a key's changes, and a change not
        newer than its row's stored one is a no-op (:mod:`pipeline.iceberg.cdc_apply`)."""
        self.noops: dict[str, int] = {}
        """The last landed attempt's changes that did nothing, by reason."""
        self.refused: list[str] = []  # files of attempts certainly not committed
        self.files_rewritten = 0
        self.rows_removed = 0
        self.rows_copied = 0
        """What the last landed attempt did: files replaced, rows dropped from them (keys
        replaced or deleted), rows copied into their replacements (the copy-on-write cost)."""

    def __call__(self, table: Table, rows: pa.Table, props: dict[str, str]) -> None:
        noops: dict[str, int] = {}
        if self.position is not None and self.tombstone is not None:
            latest = latest_per_key(rows, self.key, self.position)
            rows, noops = applicable_changes(table, rows, latest, self.key, self.tombstone,
                                             self.position, key_filter(latest.select(self.key)),
                                             keep_deletes=self.keep_deletes)
        keys, write = survivors(rows, self.key, None if self.keep_deletes else self.tombstone,
                                self.position)
        written: list[DataFileRef] = []
        attempt = uuid.uuid4().hex
        try:
            replaced, removed, copied = self._rewrite(table, keys, written, attempt)
            if write.num_rows:
                written += _write(table, write, attempt, "new")
            replace_files(table, replaced, written, props)
        except (CommitFailedException, ValidationException):
            self.refused += [f.path for f in written]
            raise
        except BaseException:
            # Outcome unknown (or failed before the commit): the maintenance orphan sweep
            # deletes unreferenced files once they are old enough; never guess here.
            raise
        self.files_rewritten, self.rows_removed = len(replaced), removed
        self.rows_copied, self.noops = copied, noops

    def _rewrite(self, table: Table, keys: pa.Table, written: list[DataFileRef],
                 attempt: str) -> tuple[list[DataFile], int, int]:
        """Rewrite every file holding one of ``keys`` without those rows; returns the
        replaced files, the rows removed and the rows copied. New files join ``written``
        as soon as they exist."""
        if table.current_snapshot() is None:
            return [], 0, 0
        from pyiceberg.io.pyarrow import ArrowScan  # lazy: pandas

        full_scan = ArrowScan(table.metadata, table.io, table.schema(), AlwaysTrue())
        replaced: list[DataFile] = []
        removed = copied = 0
        for n, (task, wanted) in enumerate(affected_files(table, keys, self.key)):
            rows = full_scan.to_table([task])
            kept = without_keys(rows, wanted, self.key)
            replaced.append(task.file)
            removed += rows.num_rows - kept.num_rows
            copied += kept.num_rows
            if kept.num_rows:
                written += _write(table, kept, attempt, f"rewrite{n}")
        return replaced, removed, copied

    def cleanup(self, catalog: Catalog, identifier: str, *, sequence: int, epoch: int) -> int:
        """Delete the files of attempts the catalog refused (``sequence``/``epoch``: the
        signature :class:`~pipeline.iceberg.file_append.WriteThenAdd` has)."""
        del sequence, epoch
        if not self.refused:
            return 0
        try:
            table = catalog.load_table(identifier)
        except Exception as exc:
            log.warning("cannot load %s to delete %d refused files (the orphan sweep will): "
                        "%s", identifier, len(self.refused), exc)
            return 0
        deleted = delete_files(table.io, self.refused)
        self.refused = []
        return deleted


def upsert_hook(stream: StreamConfig) -> CopyOnWrite | None:
    """The commit hook of a keyed stream's table, None for an append-only one."""
    if not stream.primary_key:
        return None
    position = POSITION_COLUMN if stream.cdc is not None else None
    keep = stream.cdc is not None and stream.cdc.deletes == "keep"
    return CopyOnWrite(stream.primary_key, stream.tombstone_field, position, keep)


def survivors(rows: pa.Table, key: Sequence[str], tombstone: str | None,
              position: str | None = None) -> tuple[pa.Table, pa.Table]:
    """``(keys, write)`` of a run's rows still to commit: the key columns of each key's
    latest row (every key the run replaces or deletes) and the latest rows that are not
    tombstones (what the table gains). Both output paths decide here, so they agree."""
    latest = latest_per_key(rows, key, position)
    write = latest
    if tombstone is not None and tombstone in latest.column_names:
        deleted = pc.fill_null(latest.column(tombstone), False)
        write = latest.filter(pc.invert(deleted))
    return latest.select(list(key)), write


def affected_files(table: Table, keys: pa.Table, key: Sequence[str]
                   ) -> Iterator[tuple[FileScanTask, pa.Table]]:
    """The scan tasks of the current snapshot whose files hold one of ``keys``, each with
    the keys it holds (in the scan's Arrow types).

    Reads only the key columns of the files the keys' bounds cannot rule out. The tasks
    carry the files' delete files (other engines' position deletes), so a rewrite of a
    task never brings back a row someone deleted."""
    if table.current_snapshot() is None or keys.num_rows == 0:
        return
    from pyiceberg.io.pyarrow import ArrowScan  # lazy: pandas

    key_scan = ArrowScan(table.metadata, table.io, table.schema().select(*key), AlwaysTrue())
    for task in table.scan(row_filter=key_filter(keys)).plan_files():
        present = key_scan.to_table([task])
        wanted = _aligned(keys, present.schema)
        if not _any_match(present, wanted, key):
            continue  # its bounds overlap, its keys do not: left alone
        yield task, wanted.join(present.select(list(key)), keys=list(key),
                                join_type="left semi", use_threads=False)


def without_keys(rows: pa.Table, keys: pa.Table, key: Sequence[str]) -> pa.Table:
    """``rows`` without those whose key is one of ``keys`` (a file's rewrite)."""
    if rows.num_rows == 0 or keys.num_rows == 0:
        return rows
    # Only the key columns and a row index go through the hash join: Arrow's join refuses
    # nested types (struct, list, map) in its non-key columns, and a keyed table may have
    # them. The surviving indexes then take the whole rows.
    index = rows.select(list(key)).append_column(_RANK, pa.array(np.arange(rows.num_rows)))
    kept = index.join(_aligned(keys, rows.schema), keys=list(key), join_type="left anti",
                      use_threads=False)
    if kept.num_rows == rows.num_rows:
        return rows
    return rows.take(pa.array(np.sort(kept.column(_RANK).to_numpy())))


def key_filter(keys: pa.Table) -> BooleanExpression:
    """A row filter that keeps every file whose column bounds may hold one of ``keys``:
    per key column ``In`` for a few values, else the values' range; types whose Python
    values pyiceberg's literals do not take (uuid, decimal, time) filter nothing."""
    expr: BooleanExpression = AlwaysTrue()
    for name in keys.column_names:
        column = pc.unique(keys.column(name).combine_chunks())
        values = column.to_pylist()
        if not values or not all(isinstance(v, (str, int)) for v in values):
            continue
        if isinstance(values[0], bool):
            continue
        if len(values) <= _IN_LIMIT:
            part: BooleanExpression = In(name, set(values))
        else:
            bounds = pc.min_max(column)
            part = And(GreaterThanOrEqual(name, bounds["min"].as_py()),
                       LessThanOrEqual(name, bounds["max"].as_py()))
        expr = part if isinstance(expr, AlwaysTrue) else And(expr, part)
    return expr


def _aligned(keys: pa.Table, schema: pa.Schema) -> pa.Table:
    """``keys`` in the Arrow types a scan gave (``large_string`` or ``string``): joins
    need equal types on both sides."""
    return keys.cast(pa.schema([schema.field(name) for name in keys.column_names]))


def _any_match(present: pa.Table, keys: pa.Table, key: Sequence[str]) -> bool:
    if present.num_rows == 0:
        return False
    if len(key) == 1:
        return bool(pc.any(pc.is_in(present.column(key[0]),
                                    value_set=keys.column(key[0]).combine_chunks())).as_py())
    return present.join(keys, keys=list(key), join_type="left semi",
                        use_threads=False).num_rows > 0


def _write(table: Table, rows: pa.Table, attempt: str, task: str) -> list[DataFileRef]:
    """Data files of ``rows`` with the table's settings, partitions, field ids and sort
    order: the append path's writer (:class:`~pipeline.iceberg.data_files.TableFiles`), so
    a keyed sink's ``sort_by`` holds in the files its upserts write, as in its appends."""
    from pyiceberg.io.pyarrow import _check_pyarrow_schema_compatible  # lazy: pandas

    _check_pyarrow_schema_compatible(table.schema(), rows.schema,
                                     format_version=table.metadata.format_version)
    names = [f.name for f in table.schema().fields]
    columns = [(n if n in rows.column_names else "", n) for n in names]
    files = TableFiles(TableTarget.of("upsert", table, columns), attempt, task)
    try:
        files.add(rows)
        return files.close()
    except BaseException:
        files.discard()
        raise
