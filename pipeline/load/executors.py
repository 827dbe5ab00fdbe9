"""The cluster output path: rows stay on the executors, only event ids visit the driver.

Why: the embedded path (:func:`pipeline.load.run.run_spark`) collects every row to the driver with
``toArrow`` and appends it there — simple and fast on one machine, but on a Spark cluster the
driver becomes the bottleneck (all bytes cross the network to it, and it must hold a whole
run in memory). Here a run works in three steps, and the driver only ever holds the small
*keys* table (``_row``, ``_event_id``, ``_received_at``, ``_sequence``) plus dead letters:

1. :func:`run_cluster` reads the run through the ``icefloe`` data source, tags each row with
   a stable ``_row`` id, persists the frame on the executors and collects the keys;
2. the collector deduplicates and replay-filters on the keys (the same
   :class:`~collector.dedup.DedupWindow` and committed-sequence logic as the embedded path)
   and :meth:`ClusterRunOutput.write` has the executors write the surviving rows as Parquet
   files into each table's data location, through the ``icefloe-parquet`` Python data
   source writer (:class:`ParquetSinkWriter`); the driver-side ``commit()`` of that writer
   receives the file list from the successful tasks' commit messages;
3. :class:`AddFiles` commits those files with ``Table.add_files`` *through*
   :func:`pipeline.iceberg.commit.commit_rows` — one fast append carrying ``icefloe.sequence`` and
   ``icefloe.epoch``, with identical fencing, replay checks and unknown-outcome handling.

Why ``_row`` and not the event id to drop duplicates: the dedup window keeps the *first* of
repeated ids within a run, so it must be able to name one row among equals.
``monotonically_increasing_id`` is (partition index, position) and the data source is
deterministic, so the id is stable even if a persisted block is recomputed — and its order
is exactly the order ``toArrow`` gives the embedded path, so both paths keep the same rows.

Files that never make it into a table are deleted: a failing task deletes its own, a failed
job's ``abort()`` deletes the successful tasks' files, and :meth:`AddFiles.cleanup` deletes
the files of a commit that was refused or not attempted (only when it is certain they are
not referenced). A crash leaves them behind; the maintenance orphan sweep
(:func:`pipeline.iceberg.maintenance.delete_unreachable_files`) removes them once old enough.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.exceptions import CommitFailedException
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType
from ulid import ULID

from pipeline.iceberg.commit import NO_SEQUENCE, check_epoch, committed_state
from pipeline.load.decode import DeadLetters
from pipeline.load.schema import dead_letter_arrow_schema
from pipeline.load.source import DEAD, ENVELOPE, STREAM, struct_column
from pipeline.load.spec import RunSpec

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.io import FileIO
    from pyiceberg.table import Table
    from pyiceberg.table.snapshots import Snapshot
    from pyspark.sql import DataFrame, SparkSession

SINK_FORMAT = "icefloe-parquet"
ROW = "_row"
KEY_COLUMNS = (ROW, "_event_id", "_received_at", "_sequence")
_INLINE_DROPS = 10_000

log = logging.getLogger("icefloe.cluster")


# --------------------------------------------------------------------------- plain data


@dataclass(frozen=True, slots=True)
class DataFileRef:
    """One Parquet file an executor wrote for ``stream``."""

    stream: str
    path: str
    rows: int
    size: int


@dataclass(slots=True)
class WrittenFiles(WriterCommitMessage):
    """A task's commit message: the files it wrote (pickled back to the driver)."""

    files: list[DataFileRef] = field(default_factory=list)


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
    columns: tuple[tuple[str, str], ...]  # (column in the wide frame, column in the table)

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


class SinkJob(msgspec.Struct, frozen=True):
    """The ``job`` option of one write: a unique attempt id, targets, and the receipt path.

    ``receipt`` is a local file the driver-side ``commit()`` writes the file list to: that
    method runs in a Python worker the Spark driver starts on the driver host, not in the
    collector's own interpreter, so a file is the way back.
    """

    attempt: str
    receipt: str
    targets: tuple[TableTarget, ...]

    def encode(self) -> str:
        return msgspec.json.encode(self).decode()

    @classmethod
    def decode(cls, text: str) -> SinkJob:
        return msgspec.json.decode(text, type=cls)


# --------------------------------------------------------------------------- executor side


class _TableFiles:
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
        rows = pa.Table.from_arrays([rows.column(src) for src, _ in self.target.columns],
                                    names=[name for _, name in self.target.columns]
                                    ).cast(self.file_schema)
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


class ParquetSinkWriter(DataSourceArrowWriter):
    """Writes wide-frame rows as Parquet files of their stream's table; commits nothing.

    The Iceberg commit is the collector's: this writer only reports the files (``commit``
    writes the receipt) and deletes them when the job fails (``abort``).
    """

    def __init__(self, job: SinkJob) -> None:
        self.job = job

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WrittenFiles:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        task = f"{ctx.partitionId():05d}-{ctx.attemptNumber()}" if ctx else "00000-0"
        tables = {t.stream: _TableFiles(t, self.job.attempt, task) for t in self.job.targets}
        try:
            for batch in iterator:
                if batch.num_rows == 0:
                    continue
                rows = pa.Table.from_batches([batch])
                streams = rows.column(STREAM)
                for name, files in tables.items():
                    part = rows.filter(pc.equal(streams, name)) if len(tables) > 1 else rows
                    if part.num_rows:
                        files.add(part)
            return WrittenFiles([ref for files in tables.values() for ref in files.close()])
        except BaseException:
            for files in tables.values():
                files.discard()
            raise

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        refs = [ref for m in messages if isinstance(m, WrittenFiles) for ref in m.files]
        body = json.dumps([[r.stream, r.path, r.rows, r.size] for r in refs])
        tmp = f"{self.job.receipt}.tmp"
        with open(tmp, "w", encoding="utf-8") as out:
            out.write(body)
        os.replace(tmp, self.job.receipt)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        refs = [ref for m in messages if isinstance(m, WrittenFiles) for ref in m.files]
        _delete_refs(self.job, refs)


class ParquetSink(DataSource):
    """``df.write.format("icefloe-parquet").option("job", SinkJob.encode()).save()``."""

    def __init__(self, options: Any) -> None:
        super().__init__(options)
        self.job = SinkJob.decode(options["job"])

    @classmethod
    def name(cls) -> str:
        return SINK_FORMAT

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise ValueError(f"{SINK_FORMAT} only appends files; use mode('append')")
        return ParquetSinkWriter(self.job)


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


def _delete_refs(job: SinkJob, refs: Sequence[DataFileRef]) -> None:
    from pyiceberg.io import load_file_io

    for target in job.targets:
        paths = [r.path for r in refs if r.stream == target.stream]
        if paths:
            delete_files(load_file_io(target.io_properties, target.location), paths)


# --------------------------------------------------------------------------- driver side


@dataclass(frozen=True, slots=True)
class WritePlan:
    """Write ``stream``'s rows with ``_sequence > after`` except rows ``drop`` to ``table``."""

    stream: str
    table: Table
    after: int
    drop: pa.Array
    expected: int


@dataclass(slots=True)
class ClusterRunOutput:
    """One run, kept on the executors: per-stream keys and dead letters on the driver.

    ``keys[stream]`` has :data:`KEY_COLUMNS` in row order; call :meth:`release` when done.
    """

    spark: SparkSession | None = None
    frame: DataFrame | None = None
    spec: RunSpec | None = None
    keys: dict[str, pa.Table] = field(default_factory=dict)
    dead: pa.Table = field(default_factory=lambda: dead_letter_arrow_schema().empty_table())

    @property
    def rows(self) -> int:
        return sum(t.num_rows for t in self.keys.values())

    def write(self, plans: Sequence[WritePlan]) -> dict[str, FileSet]:
        """Have the executors write the planned rows; return the files per stream.

        One Spark job for all tables. If the job fails, every file it wrote is deleted
        (tasks clean up after themselves, ``abort`` after the successful ones).
        """
        plans = [p for p in plans if p.expected > 0]
        if not plans:
            return {}
        from pyspark.sql import functions as F

        assert self.spark is not None
        assert self.frame is not None
        assert self.spec is not None
        index = {s.name: i for i, s in enumerate(self.spec.streams)}
        condition = None
        targets = []
        wanted = [STREAM]
        for plan in plans:
            i = index[plan.stream]
            columns = [(f"{struct_column(i)}__{name}", name)
                       for name, _ in self.spec.streams[i].columns]
            columns += [(name, name) for name, _ in ENVELOPE]
            targets.append(TableTarget.of(plan.stream, plan.table, columns))
            wanted += [src for src, _ in columns if src not in wanted]
            term = (F.col(STREAM) == plan.stream) & (F.col("_sequence") > plan.after)
            condition = term if condition is None else condition | term
        frame = self.frame.where(condition)
        drops = pa.concat_arrays([p.drop for p in plans if len(p.drop)] or
                                 [pa.array([], pa.int64())])
        if 0 < len(drops) <= _INLINE_DROPS:  # a literal list: no extra job
            frame = frame.where(~F.col(ROW).isin(drops.to_pylist()))
        elif len(drops):  # many retried ids: a broadcast anti-join scales better
            dropped = self.spark.createDataFrame(pa.table({ROW: drops}))
            frame = frame.join(F.broadcast(dropped), on=ROW, how="left_anti")
        fd, receipt = tempfile.mkstemp(prefix="icefloe-receipt-", suffix=".json")
        os.close(fd)
        os.unlink(receipt)
        job = SinkJob(attempt=str(ULID()), receipt=receipt, targets=tuple(targets))
        _activate(self.spark)
        started = time.monotonic()
        try:
            frame.select(*wanted).write.format(SINK_FORMAT).option("job", job.encode()) \
                .mode("append").save()
            refs = _read_receipt(receipt)
        except BaseException:
            if os.path.exists(receipt):  # committed, yet the call failed: nobody owns them
                with contextlib.suppress(Exception):
                    _delete_refs(job, _read_receipt(receipt))
            raise
        finally:
            for path in (receipt, f"{receipt}.tmp"):
                if os.path.exists(path):
                    os.unlink(path)
        log.debug("cluster write: %d files, %d rows in %.3fs", len(refs),
                  sum(r.rows for r in refs), time.monotonic() - started)
        out = {p.stream: FileSet(tuple(r for r in refs if r.stream == p.stream)) for p in plans}
        for plan in plans:
            if out[plan.stream].rows != plan.expected:
                for files in out.values():
                    delete_files(plan.table.io, files.paths)
                raise RuntimeError(f"cluster write of {plan.stream} produced "
                                   f"{out[plan.stream].rows} rows, expected {plan.expected}")
        return out

    def release(self) -> None:
        """Drop the persisted run from the executors."""
        if self.frame is not None:
            self.frame.unpersist(blocking=False)
            self.frame = None


def _activate(spark: SparkSession) -> None:
    """Make ``spark`` the JVM thread's active session before a write.

    Why: the writer looks Python data sources up in the *active* session (a JVM thread
    local), unlike the reader; the collector writes from a worker thread (``to_thread``),
    whose JVM thread has none, so ``icefloe-parquet`` would not be found. PySpark does the
    same in ``createDataFrame``.
    """
    from pyspark.sql import SparkSession as PySparkSession

    jvm = spark._jvm  # type: ignore[attr-defined]
    PySparkSession._get_j_spark_session_class(jvm).setActiveSession(
        spark._jsparkSession)  # type: ignore[attr-defined]


def _read_receipt(path: str) -> list[DataFileRef]:
    with open(path, encoding="utf-8") as f:
        return [DataFileRef(s, p, int(n), int(b)) for s, p, n, b in json.load(f)]


def register(spark: SparkSession) -> None:
    """Make ``icefloe-parquet`` available to ``df.write.format``."""
    spark.dataSource.register(ParquetSink)


def run_cluster(spark: SparkSession, spec: RunSpec) -> ClusterRunOutput:
    """Read the run on the executors, persist it there, return its keys and dead letters."""
    if not spec.batches:
        return ClusterRunOutput()
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    from pipeline.load.run import read_frame

    started = time.monotonic()
    frame = read_frame(spark, spec).withColumn(ROW, F.monotonically_increasing_id())
    frame = frame.persist(StorageLevel.MEMORY_AND_DISK)
    out = ClusterRunOutput(spark, frame, spec)
    try:
        keys = frame.select(STREAM, *KEY_COLUMNS, DEAD).toArrow()
    except BaseException:
        out.release()
        raise
    log.debug("cluster keys: %d rows in %.3fs", keys.num_rows, time.monotonic() - started)
    # Sequence order first (see DedupWindow.filter_in_sequence_order), row id within it.
    keys = keys.sort_by([("_sequence", "ascending"), (ROW, "ascending")])
    streams = keys.column(STREAM)
    for stream in spec.streams:
        rows = keys.filter(pc.equal(streams, stream.name))
        if rows.num_rows:
            out.keys[stream.name] = rows.select(list(KEY_COLUMNS)).combine_chunks()
    dead = keys.filter(pc.is_null(streams))
    if dead.num_rows:
        out.dead = DeadLetters.decode_rows(dead.column(DEAD).to_pylist()).to_arrow()
    return out


def plan_write(catalog: Catalog, identifier: str, stream: str, keys: pa.Table,
               fresh: pa.Table, *, sequence: int, epoch: int) -> WritePlan | None:
    """What to write for one table, or None when nothing is new.

    Reads the table's committed sequence and epoch first: a fenced collector stops before
    writing a byte, and rows a previous attempt already committed are never rewritten.
    ``keys`` are all the stream's rows of the run, ``fresh`` those the dedup window kept.
    """
    from icefloe.errors import CatalogError

    try:
        table = catalog.load_table(identifier)
    except Exception as exc:
        raise CatalogError(f"cannot load table {identifier}: {exc}") from exc
    state = committed_state(table)
    check_epoch(identifier, state, epoch)
    if state.sequence >= sequence or fresh.num_rows == 0:
        return None
    survivors = fresh
    if state.sequence > NO_SEQUENCE:
        survivors = fresh.filter(pc.greater(fresh.column("_sequence"), state.sequence))
    if survivors.num_rows == 0:
        return None
    # Rows the dedup window dropped; replayed ones are excluded by `_sequence > after`.
    drop = pa.array([], pa.int64())
    if fresh.num_rows < keys.num_rows:
        kept = pc.is_in(keys.column(ROW), value_set=fresh.column(ROW).combine_chunks())
        drop = keys.filter(pc.invert(kept)).column(ROW).combine_chunks()
    return WritePlan(stream, table, state.sequence, drop, survivors.num_rows)


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
    from pipeline.iceberg.commit import EPOCH_PROP, SEQUENCE_PROP

    want = (str(sequence), str(epoch))
    ours = set(paths)
    for snapshot in table.snapshots():
        props = snapshot.summary.additional_properties if snapshot.summary else {}
        if (props.get(SEQUENCE_PROP), props.get(EPOCH_PROP)) != want:
            continue
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
