"""The data files of one Iceberg table: write them with the table's own settings, add
them with ``add_files``, delete them when they never land.

Why one module: both writers of Parquet files use it — the cluster output path, whose
executors write each run's rows (:mod:`pipeline.load.executors`), and the embedded path's
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

import contextlib
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.exceptions import CommitFailedException

from pipeline.iceberg.commit import EPOCH_PROP, committed_state

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.io import FileIO
    from pyiceberg.table import Table
    from pyiceberg.table.snapshots import Snapshot

log = logging.getLogger("icefloe.cluster")


@dataclass(frozen=True, slots=True)
class DataFileRef:
    """One Parquet file an executor wrote for ``stream``."""

    stream: str
    path: str
    rows: int
    size: int


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

    @classmethod
    def of(cls, stream: str, table: Table, columns: Sequence[tuple[str, str]]) -> TableTarget:
        return cls(stream=stream, location=table.location(), properties=dict(table.properties),
                   io_properties=_io_properties(table.io.properties),
                   schema_json=table.schema().model_dump_json(),
                   spec_json=table.spec().model_dump_json(), columns=tuple(columns))


_IO_PREFIXES = ("s3.", "client.", "gcs.", "adls.", "hdfs.", "oss.", "py-io-impl", "pyarrow.")


def _io_properties(properties: dict[str, str]) -> dict[str, str]:
    """The FileIO settings only: a SQL catalog's FileIO also carries the catalog ``uri``
    (possibly with a database password), which executors must not receive."""
    return {k: v for k, v in properties.items() if k.startswith(_IO_PREFIXES)}


class TableFiles:
    """Open Parquet writers of one table in one task: one file per partition value."""

    def __init__(self, target: TableTarget, attempt: str, task: str) -> None:
        from pyiceberg.io import load_file_io
        from pyiceberg.io.pyarrow import _get_parquet_writer_kwargs, schema_to_pyarrow
        from pyiceberg.partitioning import PartitionSpec
        from pyiceberg.schema import Schema
        from pyiceberg.table.locations import load_location_provider

        self.target = target
        self.prefix = f"{attempt}-{task}"
        self.schema = Schema.model_validate_json(target.schema_json)
        self.spec = PartitionSpec.model_validate_json(target.spec_json)
        self.io = load_file_io(target.io_properties, target.location)
        self.locations = load_location_provider(target.location, target.properties)
        self.kwargs = _get_parquet_writer_kwargs(target.properties)
        full = schema_to_pyarrow(self.schema)  # carries PARQUET:field_id per column
        self.file_schema = pa.schema([_small(full.field(name)) for _, name in target.columns])
        self.open: dict[str, _OpenFile] = {}
        self.done: list[DataFileRef] = []

    def add(self, rows: pa.Table) -> None:
        """Append rows (wide-frame columns) to the files of their partitions."""
        rows = pa.Table.from_arrays(
            [rows.column(src) if src else  # "": a column the source does not decode
             pa.nulls(rows.num_rows, self.file_schema.field(name).type)
             for src, name in self.target.columns],
            names=[name for _, name in self.target.columns]).cast(self.file_schema)
        if self.spec.is_unpartitioned():
            self._file(None).write(rows)
            return
        key = single_partition(self.spec, self.schema, rows)
        if key is not None:  # the usual case: a run's rows share one day (or hour)
            self._file(key).write(rows)
            return
        from pyiceberg.io.pyarrow import _determine_partitions

        # add_files derives a file's partition from its column bounds: one value per file.
        for part in _determine_partitions(self.spec, self.schema, rows):
            self._file(part.partition_key).write(part.arrow_table_partition)

    def _file(self, key: Any) -> _OpenFile:
        slot = key.to_path() if key is not None else ""
        if slot not in self.open:
            name = f"{self.prefix}-{len(self.open):03d}-{uuid.uuid4().hex[:8]}.parquet"
            path = self.locations.new_data_location(name, key)
            self.open[slot] = _OpenFile(path, self.io, self.file_schema, self.kwargs)
        return self.open[slot]

    def close(self) -> list[DataFileRef]:
        while self.open:
            _, file = self.open.popitem()
            size = file.close()
            self.done.append(DataFileRef(self.target.stream, file.path, file.rows, size))
        return self.done

    def discard(self) -> None:
        """Best effort: close and delete everything this task wrote for the table."""
        paths = [ref.path for ref in self.done]
        for file in self.open.values():
            paths.append(file.path)
            with contextlib.suppress(Exception):  # the file is deleted next anyway
                file.close()
        self.open.clear()
        delete_files(self.io, paths)


def single_partition(spec: Any, schema: Any, rows: pa.Table) -> Any:
    """The partition key shared by every row, or None when the rows span several values
    (or a null). Why: pyiceberg's general split filters and copies the whole table once
    per partition value — ~0.35 s for 1M rows even when there is only one value."""
    from pyiceberg.partitioning import PartitionFieldValue, PartitionKey

    values = []
    for part in spec.fields:
        source = schema.find_field(part.source_id)
        name = schema.find_column_name(part.source_id)
        if name is None or name not in rows.column_names:
            return None
        transformed = part.transform.pyarrow_transform(source.field_type)(rows.column(name))
        if transformed.null_count:
            return None
        bounds = pc.min_max(transformed)
        low, high = bounds["min"].as_py(), bounds["max"].as_py()
        if low != high:
            return None
        values.append(PartitionFieldValue(field=part, value=low))
    return PartitionKey(field_values=values, partition_spec=spec, schema=schema)


def _small(field: pa.Field) -> pa.Field:
    """``large_string`` → ``string`` (and binary): the types the embedded path's files carry,
    so both paths read back with identical Arrow schemas (Parquet stores them alike)."""
    small = {pa.large_string(): pa.string(), pa.large_binary(): pa.binary()}
    return field.with_type(small.get(field.type, field.type))


class _OpenFile:
    """One Parquet file being written through the table's FileIO (local, S3, ...)."""

    def __init__(self, path: str, io: FileIO, schema: pa.Schema, kwargs: dict[str, Any]
                 ) -> None:
        import pyarrow.parquet as pq

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
        self.attempted = True
        try:
            # Unique, freshly written paths: skip the duplicate check (it scans the table).
            table.add_files(self.files.paths, snapshot_properties=props,
                            check_duplicate_files=False)
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
