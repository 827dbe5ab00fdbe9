"""The data files of one Iceberg table: write them with the table's own settings, add
them with ``add_files``, delete them when they never land.

Why one module: both writers of Parquet files use it — the cluster output path, whose
executors write each run's rows (:mod:`pipeline.load.cluster`), and the embedded path's
:class:`~pipeline.iceberg.file_append.WriteThenAdd`, which writes on the driver. Either way
the files get the table's field ids, partition layout, writer settings and location
provider (:class:`TableFiles`), and are committed by :class:`AddFiles` *through*
:func:`pipeline.iceberg.commit.commit_rows` — one fast append carrying ``icefloe.sequence``
and ``icefloe.epoch``, with identical fencing, replay checks and unknown-outcome handling.
Files that never make it into a table are deleted when it is certain they are not
referenced (:meth:`AddFiles.cleanup`); a crash leaves them to the maintenance orphan sweep
(:func:`pipeline.iceberg.maintenance.delete_unreachable_files`).

Plain data (:class:`TableTarget`, :class:`DataFileRef`) describes a table and its files
without a catalog connection, so it can travel to Spark executors as JSON.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import decimal
import logging
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.io import load_file_io
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import TableProperties
from pyiceberg.table.locations import load_location_provider
from pyiceberg.table.sorting import NullOrder, SortDirection, SortOrder
from pyiceberg.transforms import IdentityTransform
from pyiceberg.typedef import Record

from pipeline.iceberg.commit import EPOCH_PROP, committed_state
from pipeline.iceberg.partition_split import split_partitions

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.io import FileIO
    from pyiceberg.table import Table
    from pyiceberg.table.snapshots import Snapshot

log = logging.getLogger("icefloe.cluster")


@dataclass(frozen=True, slots=True)
class DataFileRef:
    """One Parquet file an executor wrote for ``stream``: under partition spec ``spec_id``,
    in the partition whose record values are ``partition`` (:func:`encode_partition`), sorted
    by sort order ``sort_order_id`` (None: unsorted).

    Why the partition travels with the file instead of being read back from its column
    bounds (what ``add_files`` does): bounds cannot give a ``bucket`` value, and a string's
    bound is cut to 16 characters, so ``identity`` of a long string would come out wrong."""

    stream: str
    path: str
    rows: int
    size: int
    spec_id: int = 0
    partition: tuple[Any, ...] = ()
    sort_order_id: int | None = None

    def to_json(self) -> list[Any]:
        return [self.stream, self.path, self.rows, self.size, self.spec_id,
                list(self.partition), self.sort_order_id]

    @classmethod
    def from_json(cls, item: Sequence[Any]) -> DataFileRef:
        stream, path, rows, size, spec_id, partition, order = item
        return cls(stream, path, int(rows), int(size), int(spec_id), tuple(partition), order)


def encode_partition(values: Sequence[Any]) -> tuple[Any, ...]:
    """Partition record values as JSON values (bytes, decimals and uuids tagged)."""
    out: list[Any] = []
    for value in values:
        if isinstance(value, bytes):
            out.append({"b64": base64.b64encode(value).decode()})
        elif isinstance(value, decimal.Decimal):
            out.append({"dec": str(value)})
        elif isinstance(value, uuid.UUID):
            out.append({"b64": base64.b64encode(value.bytes).decode()})
        else:
            out.append(value)
    return tuple(out)


def decode_partition(values: Sequence[Any]) -> list[Any]:
    out: list[Any] = []
    for value in values:
        if isinstance(value, dict) and "b64" in value:
            out.append(base64.b64decode(value["b64"]))
        elif isinstance(value, dict) and "dec" in value:
            out.append(decimal.Decimal(value["dec"]))
        else:
            out.append(value)
    return out


@dataclass(frozen=True, slots=True)
class FileSet:
    """The files written for one table in one attempt."""

    files: tuple[DataFileRef, ...] = ()

    @property
    def paths(self) -> list[str]:
        return [f.path for f in self.files]

    @property
    def rows(self) -> int:
        return sum(f.rows for f in self.files)

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)


class TableTarget(msgspec.Struct, frozen=True):
    """What an executor needs to write one table's files, as plain (JSON) data.

    Why not the pyiceberg ``Table``: executors get only string options, and a table object
    drags the catalog (and its connection) along. Schema and spec travel as Iceberg JSON,
    so files get the table's field ids and its partition layout.
    """

    stream: str
    location: str
    properties: dict[str, str]
    io_properties: dict[str, str]
    schema_json: str
    spec_json: str
    columns: tuple[tuple[str, str], ...]
    """(column in the wide frame, or "" for nulls; column in the table)."""
    sort_json: str = ""

    @classmethod
    def of(cls, stream: str, table: Table, columns: Sequence[tuple[str, str]]) -> TableTarget:
        return cls(stream=stream, location=table.location(), properties=dict(table.properties),
                   io_properties=_io_properties(table.io.properties),
                   schema_json=table.schema().model_dump_json(),
                   spec_json=table.spec().model_dump_json(), columns=tuple(columns),
                   sort_json=table.sort_order().model_dump_json())


_IO_PREFIXES = ("s3.", "client.", "gcs.", "adls.", "hdfs.", "oss.", "py-io-impl", "pyarrow.")


def _io_properties(properties: dict[str, str]) -> dict[str, str]:
    """The FileIO settings only: a SQL catalog's FileIO also carries the catalog ``uri``
    (possibly with a database password), which executors must not receive."""
    return {k: v for k, v in properties.items() if k.startswith(_IO_PREFIXES)}


class TableFiles:
    """Open Parquet writers of one table in one task: one file per partition value (more
    when ``write.target-file-size-bytes`` is set and a partition outgrows it), each sorted
    by the table's sort order when it has one."""

    def __init__(self, target: TableTarget, attempt: str, task: str, *,
                 threads: int = 1) -> None:
        """``threads``: files of one :meth:`add` written at once (the embedded path, whose
        driver is otherwise idle while it commits; executors keep one, a core each)."""
        from pyiceberg.io.pyarrow import (  # lazy: pandas
            _get_parquet_writer_kwargs,
            schema_to_pyarrow,
        )

        self.target = target
        self.prefix = f"{attempt}-{task}"
        self.schema = Schema.model_validate_json(target.schema_json)
        self.spec = PartitionSpec.model_validate_json(target.spec_json)
        self.io = load_file_io(target.io_properties, target.location)
        self.locations = load_location_provider(target.location, target.properties)
        self.kwargs = _get_parquet_writer_kwargs(target.properties)
        full = schema_to_pyarrow(self.schema)  # carries PARQUET:field_id per column
        self.file_schema = pa.schema([_small(full.field(name)) for _, name in target.columns])
        self.kwargs.update(uuid_statistics(self.file_schema, target.properties))
        self.sort_order_id, self.sort_keys = sort_keys_of(target.sort_json, self.schema)
        target_size = target.properties.get("write.target-file-size-bytes")
        self.target_bytes = int(target_size) if target_size else None
        self.open: dict[str, _OpenFile] = {}
        self.keys: dict[str, Any] = {}
        self.pending: dict[str, list[pa.Table]] = {}  # rows held back to be sorted
        self.done: list[DataFileRef] = []
        self.count = 0
        self.threads = threads

    def add(self, rows: pa.Table) -> None:
        """Append rows (wide-frame columns) to the files of their partitions."""
        rows = pa.Table.from_arrays(
            [rows.column(src) if src else  # "": a column the source does not decode
             pa.nulls(rows.num_rows, self.file_schema.field(name).type)
             for src, name in self.target.columns],
            names=[name for _, name in self.target.columns]).cast(self.file_schema)
        if self.spec.is_unpartitioned():
            self._put(None, rows)
            return
        parts = split_partitions(self.spec, self.schema, rows)
        if parts is not None:  # zero-copy slices (the usual case: one or a few values)
            if not self._write_at_once(parts):
                for key, part in parts:
                    self._put(key, part)
            return
        from pyiceberg.io.pyarrow import _determine_partitions  # lazy: pandas

        for part in _determine_partitions(self.spec, self.schema, rows):
            self._put(part.partition_key, part.arrow_table_partition)

    def _write_at_once(self, parts: list[tuple[Any, pa.Table]]) -> bool:
        """Write several partitions' rows on ``threads`` threads (Arrow's Parquet writer
        releases the GIL); False when there is nothing to gain or the rows must wait (sorted
        files) or be cut by size, which :meth:`_put` does. Why: an OTLP table partitioned by
        a bucket of the service name gets a file per bucket in most runs, and encoding them
        one after another kept the other cores idle during the commit. Files are opened
        here in order, so their names are what the sequential path gives them."""
        if self.threads <= 1 or len(parts) < 2 or self.sort_keys or self.target_bytes:
            return False
        writes = []
        for key, rows in parts:
            slot = key.to_path()
            self.keys[slot] = key
            writes.append((self._file(slot), rows))
        with ThreadPoolExecutor(min(self.threads, len(writes)),
                                thread_name_prefix="icefloe-write") as pool:
            futures = [pool.submit(file.write, rows) for file, rows in writes]
            for future in futures:
                future.result()  # the first failure, once every write has ended
        return True

    def _put(self, key: Any, rows: pa.Table) -> None:
        slot = key.to_path() if key is not None else ""
        self.keys[slot] = key
        if self.sort_keys:  # sorted files: hold the rows until the partition is complete
            self.pending.setdefault(slot, []).append(rows)
        else:
            self._write(slot, rows)

    def _write(self, slot: str, rows: pa.Table) -> None:
        if self.target_bytes is None:
            self._file(slot).write(rows)
            return
        # A row group per slice, so the file's size is known as it grows: about the
        # target's worth of Arrow bytes (larger than on disk), within sane row counts.
        per_row = max(1, rows.nbytes // max(1, rows.num_rows))
        step = min(65_536, max(256, self.target_bytes // per_row))
        for start in range(0, rows.num_rows, step):
            file = self._file(slot)
            file.write(rows.slice(start, step))
            if file.size() >= self.target_bytes:
                self._finish(slot)

    def _file(self, slot: str) -> _OpenFile:
        if slot not in self.open:
            key = self.keys[slot]
            name = f"{self.prefix}-{self.count:03d}-{uuid.uuid4().hex[:8]}.parquet"
            self.count += 1
            path = self.locations.new_data_location(name, key)
            self.open[slot] = _OpenFile(path, self.io, self.file_schema, self.kwargs)
        return self.open[slot]

    def _finish(self, slot: str) -> None:
        file = self.open.pop(slot)
        size = file.close()
        key = self.keys[slot]
        values = encode_partition(list(key.partition)) if key is not None else ()
        self.done.append(DataFileRef(self.target.stream, file.path, file.rows, size,
                                     self.spec.spec_id, values,
                                     self.sort_order_id if self.sort_keys else None))

    def close(self) -> list[DataFileRef]:
        for slot, parts in list(self.pending.items()):
            self._write(slot, sort_rows(pa.concat_tables(parts), self.sort_keys))
        self.pending.clear()
        for slot in list(self.open):
            self._finish(slot)
        return self.done

    def discard(self) -> None:
        """Best effort: close and delete everything this task wrote for the table."""
        paths = [ref.path for ref in self.done]
        for file in self.open.values():
            paths.append(file.path)
            with contextlib.suppress(Exception):  # the file is deleted next anyway
                file.close()
        self.open.clear()
        self.pending.clear()
        delete_files(self.io, paths)


def sort_keys_of(sort_json: str, schema: Any) -> tuple[int | None, list[tuple[str, bool, bool]]]:
    """(sort order id, [(column, descending, nulls first)]) of the table's sort order; the
    identity fields up to the first other transform (icefloe sets identity ones only)."""
    if not sort_json:
        return None, []

    order = SortOrder.model_validate_json(sort_json)
    keys: list[tuple[str, bool, bool]] = []
    for sort_field in order.fields:
        name = schema.find_column_name(sort_field.source_id)
        if not isinstance(sort_field.transform, IdentityTransform) or name is None:
            break
        keys.append((name, sort_field.direction == SortDirection.DESC,
                     sort_field.null_order == NullOrder.NULLS_FIRST))
    return (order.order_id if keys else None), keys


def sort_rows(rows: pa.Table, keys: Sequence[tuple[str, bool, bool]]) -> pa.Table:
    """``rows`` in the sort order ``keys`` (column, descending, nulls first), each key with
    its own null placement (Arrow's sort has one for all keys: a null flag per key does it)."""
    if not keys or rows.num_rows < 2:
        return rows
    order: list[tuple[str, str]] = []
    flags = rows
    for i, (name, descending, nulls_first) in enumerate(keys):
        flag = f"__null_{i}"
        flags = flags.append_column(flag, pc.is_null(rows.column(name)))
        order.append((flag, "descending" if nulls_first else "ascending"))
        order.append((name, "descending" if descending else "ascending"))
    return rows.take(pc.sort_indices(flags, sort_keys=order))


def uuid_statistics(schema: pa.Schema, properties: Mapping[str, str]) -> dict[str, Any]:
    """``ParquetWriter`` arguments that leave the row-group statistics and the dictionary
    encoding of every uuid column (at any depth) out of the file, unless the table's
    ``icefloe.uuid-bounds`` is ``write``.

    Why, beside the manifests' bounds (``pipeline.iceberg.tables.uuid_metrics_plan``): Java
    Iceberg 1.10 also prunes *row groups*, by their Parquet min/max (the same signed uuid
    comparison) and by their dictionary pages (which miss a uuid that is there), so Spark's
    ``WHERE uid = '…'`` still skipped the row with either one in the file
    (``tests/pipeline/test_other_readers.py``, slow). The other columns keep both (the
    writer takes the column paths to keep them for, read from the Parquet schema)."""
    from icefloe.streams.layout import UUID_BOUNDS_PROP  # lazy: sqlglot

    if properties.get(UUID_BOUNDS_PROP) == "write" or not any(
            _has_uuid(field.type) for field in schema):
        return {}
    import pyarrow.parquet as pq  # lazy: pyarrow.parquet

    sink = pa.BufferOutputStream()
    pq.write_table(pa.Table.from_batches([], schema=schema), sink)
    parquet = pq.read_metadata(pa.BufferReader(sink.getvalue())).schema
    keep = [parquet.column(i).path for i in range(len(parquet))
            if parquet.column(i).logical_type.type != "UUID"]
    return {"write_statistics": keep, "use_dictionary": keep}


def _has_uuid(kind: pa.DataType) -> bool:
    if isinstance(kind, pa.BaseExtensionType):
        return kind.extension_name == "arrow.uuid"
    if pa.types.is_struct(kind):
        return any(_has_uuid(kind.field(i).type) for i in range(kind.num_fields))
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return _has_uuid(kind.value_type)
    if pa.types.is_map(kind):
        return _has_uuid(kind.key_type) or _has_uuid(kind.item_type)
    return False


def _small(field: pa.Field) -> pa.Field:
    """``large_string`` → ``string`` (and binary): the types the embedded path's files carry,
    so both paths read back with identical Arrow schemas (Parquet stores them alike)."""
    small = {pa.large_string(): pa.string(), pa.large_binary(): pa.binary()}
    return field.with_type(small.get(field.type, field.type))


class _OpenFile:
    """One Parquet file being written through the table's FileIO (local, S3, ...)."""

    def __init__(self, path: str, io: FileIO, schema: pa.Schema, kwargs: dict[str, Any]
                 ) -> None:
        import pyarrow.parquet as pq  # lazy: pyarrow.parquet

        self.path = path
        self.rows = 0
        self.stream = io.new_output(path).create(overwrite=True)
        try:
            self.writer = pq.ParquetWriter(self.stream, schema, **kwargs)
        except BaseException:
            self.stream.close()
            raise

    def write(self, rows: pa.Table) -> None:
        if rows.num_rows:
            self.writer.write_table(rows)
            self.rows += rows.num_rows

    def size(self) -> int:
        """Bytes written so far (whole row groups)."""
        return int(self.stream.tell())

    def close(self) -> int:
        """Finish the file; returns its size in bytes."""
        self.writer.close()
        size = self.stream.tell()
        self.stream.close()
        return int(size)


def delete_files(io: FileIO, paths: Sequence[str]) -> int:
    """Delete ``paths`` (best effort; missing files count as deleted). Returns deletions."""
    deleted = 0
    for path in paths:
        try:
            io.delete(path)
            deleted += 1
        except FileNotFoundError:
            deleted += 1
        except Exception as exc:
            log.warning("cannot delete %s (the orphan sweep will): %s", path, exc)
    return deleted


class StaleFilesError(CommitFailedException):
    """The table moved on after the files were written: they hold rows it now has.

    A ``CommitFailedException`` so :func:`~pipeline.iceberg.commit.commit_rows` re-reads the
    table at once (as for any lost race) instead of backing off; the run fails and is retried.
    """


class AddFiles:
    """The ``append`` hook of :func:`~pipeline.iceberg.commit.commit_rows` for written files.

    ``commit_rows`` passes the rows still to be committed after its own re-check; they must
    be exactly the rows in the files, or the files are stale (never committed). The hook
    records what happened so :meth:`cleanup` knows whether the files may be in the table.
    """

    def __init__(self, files: FileSet) -> None:
        self.files = files
        self.attempted = False  # add_files was called at least once
        self.uncertain = False  # ... and at least once its outcome is unknown
        self.landed = False

    def __call__(self, table: Table, rows: pa.Table, props: dict[str, str]) -> None:
        if rows.num_rows != self.files.rows:
            raise StaleFilesError(f"{rows.num_rows} rows to commit but the written files "
                                  f"hold {self.files.rows}")
        spec_id = table.spec().spec_id
        if any(ref.spec_id != spec_id for ref in self.files.files):
            raise StaleFilesError(f"the files were written for partition spec "
                                  f"{self.files.files[0].spec_id}; the table's is now {spec_id}")
        self.attempted = True
        try:
            append_files(table, self.files.files, props)
        except CommitFailedException:
            raise  # rejected by the catalog: certainly not committed
        except Exception:
            self.uncertain = True
            raise
        self.landed = True

    def cleanup(self, catalog: Catalog, identifier: str, *, sequence: int, epoch: int) -> int:
        """Delete the files unless they may be in the table. Returns files deleted.

        Certain cases: add_files never ran, or every call was rejected → delete; it
        succeeded → keep. An unknown outcome is settled by the snapshot log: if a snapshot
        with our sequence and epoch added these files, ours landed (keep); if such a
        snapshot added other files (a later try of the same commit landed), these are
        garbage (delete); if a newer epoch committed since, we cannot tell cheaply and
        leave the files to the orphan sweep.
        """
        if self.landed or not self.files.files:
            return 0
        try:
            table = catalog.load_table(identifier)
        except Exception as exc:
            log.warning("cannot load %s to clean up %d written files (the orphan sweep "
                        "will): %s", identifier, len(self.files.files), exc)
            return 0
        if self.uncertain and (committed_state(table).epoch > epoch
                               or _may_reference(table, sequence, epoch, self.files.paths)):
            return 0
        deleted = delete_files(table.io, self.files.paths)
        log.info("deleted %d uncommitted files of %s", deleted, identifier)
        return deleted


class ReplaceFiles(AddFiles):
    """The ``append`` hook of the cluster path's upserts: in one snapshot, remove the
    existing files that held a replaced or deleted key and add the files the executors
    wrote (the run's latest rows and those files' rewrites).

    The plan was made on snapshot ``snapshot_id`` for ``rows`` rows still to commit; if
    the table moved on, or ``commit_rows`` finds another number of rows to commit, the
    plan is stale (:class:`StaleFilesError`): never committed, the run is retried and
    plans again. Cleanup is :meth:`AddFiles.cleanup`'s (the snapshot log settles an
    unknown outcome by the files ours added).
    """

    def __init__(self, files: FileSet, replaced: Sequence[Any], snapshot_id: int | None,
                 rows: int, noops: Mapping[str, int] | None = None) -> None:
        super().__init__(files)
        self.replaced = list(replaced)
        self.snapshot_id = snapshot_id
        self.rows = rows
        self.noops = dict(noops or {})
        """A change stream's changes the plan found to do nothing, by reason (reported
        with the commit, as :attr:`pipeline.iceberg.upsert.CopyOnWrite.noops`)."""

    def __call__(self, table: Table, rows: pa.Table, props: dict[str, str]) -> None:
        current = table.current_snapshot()
        if (current.snapshot_id if current else None) != self.snapshot_id:
            raise StaleFilesError("the table changed after the upsert was planned")
        if rows.num_rows != self.rows:
            raise StaleFilesError(f"{rows.num_rows} rows to commit but the upsert was "
                                  f"planned for {self.rows}")
        spec_id = table.spec().spec_id
        if any(ref.spec_id != spec_id for ref in self.files.files):
            raise StaleFilesError("the files were written for another partition spec")
        self.attempted = True
        try:
            replace_files(table, self.replaced, self.files.files, props)
        except CommitFailedException:
            raise
        except Exception:
            self.uncertain = True
            raise
        self.landed = True


def replace_files(table: Table, replaced: Sequence[Any], refs: Sequence[DataFileRef],
                  props: dict[str, str]) -> None:
    """One snapshot: an overwrite deleting ``replaced`` when there are any, else a fast
    append (also with no files: the snapshot still records the run's sequence)."""
    with table.transaction() as tx:
        if refs and tx.table_metadata.name_mapping() is None:
            tx.set_properties({TableProperties.DEFAULT_NAME_MAPPING:
                               tx.table_metadata.schema().name_mapping.model_dump_json()})
        update = tx.update_snapshot(snapshot_properties=props)
        producer: Any = update.overwrite() if replaced else update.fast_append()
        with producer as snapshot:
            for data_file in replaced:
                snapshot.delete_data_file(data_file)
            for ref in refs:
                snapshot.append_data_file(data_file_entry(table, ref))


def append_files(table: Table, refs: Sequence[DataFileRef], props: dict[str, str]) -> None:
    """Commit ``refs`` in one append, each with the partition it was written for.

    Like ``add_files`` (statistics from each file's footer, the name mapping set once, a
    fast or merge append as the table says), minus the duplicate check (the paths are
    unique and fresh; the check scans the table) and with partition values that are known
    rather than guessed from column bounds (see :class:`DataFileRef`)."""
    with table.transaction() as tx:
        if tx.table_metadata.name_mapping() is None:
            tx.set_properties({TableProperties.DEFAULT_NAME_MAPPING:
                               tx.table_metadata.schema().name_mapping.model_dump_json()})
        with tx._append_snapshot_producer(props) as append:
            for ref in refs:
                append.append_data_file(data_file_entry(table, ref))


def data_file_entry(table: Table, ref: DataFileRef) -> Any:
    """The manifest entry (pyiceberg ``DataFile``) of a file written for ``table``, its
    statistics read from the file's footer as ``add_files`` does."""
    import pyarrow.parquet as pq  # lazy: pyarrow.parquet
    from pyiceberg.io.pyarrow import (
        MetricModeTypes,
        MetricsMode,
        compute_statistics_plan,
        data_file_statistics_from_parquet_metadata,
        parquet_path_to_id_mapping,
    )  # lazy: pandas

    schema = table.schema()
    input_file = table.io.new_input(ref.path)
    with input_file.open() as stream:
        footer = pq.read_metadata(stream)
    mapping = parquet_path_to_id_mapping(schema)
    plan = compute_statistics_plan(schema, table.metadata.properties)
    # Columns written without statistics (uuids, see uuid_statistics): value counts from
    # the footer here, rather than pyiceberg's warning per file and column.
    unset = {mapping[c.path_in_schema]: c.path_in_schema for c in
             (footer.row_group(0).column(i) for i in range(footer.num_columns))
             if not c.is_stats_set} if footer.num_row_groups else {}
    none = MetricsMode(MetricModeTypes.NONE)
    unset = {k: v for k, v in unset.items() if k in plan and plan[k].mode != none}
    for field_id in unset:
        plan[field_id] = dataclasses.replace(plan[field_id], mode=none)
    stats = data_file_statistics_from_parquet_metadata(
        parquet_metadata=footer, stats_columns=plan, parquet_column_mapping=mapping)
    for field_id, path in unset.items():
        stats.value_counts[field_id] = sum(
            footer.row_group(g).column(i).num_values for g in range(footer.num_row_groups)
            for i in range(footer.num_columns)
            if footer.row_group(g).column(i).path_in_schema == path)
    return DataFile.from_args(
        content=DataFileContent.DATA, file_path=ref.path, file_format=FileFormat.PARQUET,
        partition=Record(*decode_partition(ref.partition)), file_size_in_bytes=ref.size,
        sort_order_id=ref.sort_order_id, spec_id=ref.spec_id, equality_ids=None,
        key_metadata=None, **stats.to_serialized_dict())


def _may_reference(table: Table, sequence: int, epoch: int, paths: Sequence[str]) -> bool:
    """Whether a snapshot of ours (``sequence``, ``epoch``) may hold ``paths``.

    Reads the data files those snapshots added (a manifest or two); when they cannot be
    read, the answer is "maybe", which keeps the files.
    """
    want = (str(sequence), str(epoch))
    ours = set(paths)
    for snapshot in table.snapshots():
        props = snapshot.summary.additional_properties if snapshot.summary else {}
        if props.get(EPOCH_PROP) != want[1]:
            continue  # any snapshot of our epoch (with shards, the run's sequence alone
            # does not name the snapshot: a run without shard-0 entries carries shard 0's)
        try:
            if ours & _added_files(table, snapshot):
                return True
        except Exception as exc:
            log.warning("cannot read the files snapshot %d of %s added: %s",
                        snapshot.snapshot_id, table.name(), exc)
            return True
    return False


def _added_files(table: Table, snapshot: Snapshot) -> set[str]:
    return {entry.data_file.file_path
            for manifest in snapshot.manifests(table.io)
            if manifest.added_snapshot_id == snapshot.snapshot_id
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=False)
            if entry.snapshot_id == snapshot.snapshot_id}
