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
3. :class:`~pipeline.iceberg.data_files.AddFiles` commits those files with
   ``Table.add_files`` *through* :func:`pipeline.iceberg.commit.commit_rows` — one fast
   append carrying ``icefloe.sequence`` and ``icefloe.epoch``, with identical fencing,
   replay checks and unknown-outcome handling.

Why ``_row`` and not the event id to drop duplicates: the dedup window keeps the *first* of
repeated ids within a run, so it must be able to name one row among equals.
``monotonically_increasing_id`` is (partition index, position) and the data source is
deterministic, so the id is stable even if a persisted block is recomputed — and its order
is exactly the order ``toArrow`` gives the embedded path, so both paths keep the same rows.

Files that never make it into a table are deleted: a failing task deletes its own, a failed
job's ``abort()`` deletes the successful tasks' files, and
:meth:`~pipeline.iceberg.data_files.AddFiles.cleanup` deletes
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
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType
from ulid import ULID

from pipeline.columns import ENVELOPE, SHARD_COLUMN, dead_letter_arrow_schema
from pipeline.iceberg.commit import (
    SHARD_BITS,
    check_epoch,
    committed_state,
    covers,
    not_committed,
)
from pipeline.iceberg.data_files import (
    DataFileRef,
    FileSet,
    TableFiles,
    TableTarget,
    delete_files,
)
from pipeline.load.decode import DeadLetters
from pipeline.load.frame import DEAD, STREAM, struct_column
from pipeline.load.spec import RunSpec

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table
    from pyspark.sql import DataFrame, SparkSession

SINK_FORMAT = "icefloe-parquet"
ROW = "_row"
KEY_COLUMNS = (ROW, "_event_id", "_received_at", "_sequence")
_INLINE_DROPS = 10_000

log = logging.getLogger("icefloe.cluster")


# --------------------------------------------------------------------------- plain data


@dataclass(slots=True)
class WrittenFiles(WriterCommitMessage):
    """A task's commit message: the files it wrote (pickled back to the driver)."""

    files: list[DataFileRef] = field(default_factory=list)


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
        tables = {t.stream: TableFiles(t, self.job.attempt, task) for t in self.job.targets}
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
        body = json.dumps([r.to_json() for r in refs])
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


def _delete_refs(job: SinkJob, refs: Sequence[DataFileRef]) -> None:
    from pyiceberg.io import load_file_io

    for target in job.targets:
        paths = [r.path for r in refs if r.stream == target.stream]
        if paths:
            delete_files(load_file_io(target.io_properties, target.location), paths)


# --------------------------------------------------------------------------- driver side


@dataclass(frozen=True, slots=True)
class WritePlan:
    """Write ``stream``'s rows past ``after`` (per manifest shard, the table's committed
    sequence: a row's run position names its shard) except rows ``drop`` to ``table``."""

    stream: str
    table: Table
    after: dict[int, int]
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
            if SHARD_COLUMN[0] in plan.table.schema().column_names:
                columns.append((SHARD_COLUMN[0], SHARD_COLUMN[0]))
            targets.append(TableTarget.of(plan.stream, plan.table, columns))
            wanted += [src for src, _ in columns if src not in wanted]
            term = (F.col(STREAM) == plan.stream) & _past(plan.after)
            condition = term if condition is None else condition | term
        # `_sequence` holds run positions (shard << SHARD_BITS | sequence): the written
        # rows get the shard and the shard's own sequence, as commit_rows gives the
        # embedded path's.
        position = F.col("_sequence")
        frame = self.frame.where(condition) \
            .withColumn(SHARD_COLUMN[0], F.shiftright(position, SHARD_BITS).cast("int")) \
            .withColumn("_sequence", position.bitwiseAND(F.lit(_LOCAL)))
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


_LOCAL = (1 << SHARD_BITS) - 1


def _past(after: dict[int, int]) -> Any:
    """A Spark condition: the row's position is past its shard's sequence in ``after``."""
    from pyspark.sql import functions as F

    position = F.col("_sequence")
    condition = F.lit(True)
    for shard, sequence in after.items():
        condition = condition & ((F.shiftright(position, SHARD_BITS) != shard)
                                 | (position.bitwiseAND(F.lit(_LOCAL)) > sequence))
    return condition


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
        return [DataFileRef.from_json(item) for item in json.load(f)]


def register(spark: SparkSession) -> None:
    """Make ``icefloe-parquet`` available to ``df.write.format``."""
    spark.dataSource.register(ParquetSink)


def run_cluster(spark: SparkSession, spec: RunSpec, frame: DataFrame) -> ClusterRunOutput:
    """Persist the run on the executors, return its keys and dead letters.

    ``frame`` is the run in the wide schema with its ``sql`` columns
    (:func:`pipeline.load.run.read_frame`): the run module reads it, and builds this path
    on top of the one it shares with the embedded path, so this module needs nothing of it.
    """
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    started = time.monotonic()
    frame = frame.withColumn(ROW, F.monotonically_increasing_id())
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
               fresh: pa.Table, *, sequences: Mapping[int, int], epoch: int
               ) -> WritePlan | None:
    """What to write for one table, or None when nothing is new.

    Reads the table's committed sequences and epoch first: a fenced collector stops before
    writing a byte, and rows a previous attempt already committed (per manifest shard)
    are never rewritten. ``keys`` are all the stream's rows of the run (``_sequence``:
    run positions), ``fresh`` those the dedup window kept; ``sequences`` the run's last
    sequence per shard.
    """
    from icefloe.errors import CatalogError

    try:
        table = catalog.load_table(identifier)
    except Exception as exc:
        raise CatalogError(f"cannot load table {identifier}: {exc}") from exc
    state = committed_state(table)
    check_epoch(identifier, state, epoch)
    done = state.sequences
    if covers(done, sequences) or fresh.num_rows == 0:
        return None
    survivors = not_committed(fresh, "_sequence", done) if done else fresh
    if survivors.num_rows == 0:
        return None
    if SHARD_COLUMN[0] not in table.schema().column_names and \
            pc.any(pc.greater(survivors.column("_sequence"), _LOCAL)).as_py():
        raise CatalogError(f"table {identifier} has no {SHARD_COLUMN[0]} column for rows of "
                           "manifest shards above 0: it was not evolved")
    # Rows the dedup window dropped; replayed ones are excluded by `_sequence > after`.
    drop = pa.array([], pa.int64())
    if fresh.num_rows < keys.num_rows:
        kept = pc.is_in(keys.column(ROW), value_set=fresh.column(ROW).combine_chunks())
        drop = keys.filter(pc.invert(kept)).column(ROW).combine_chunks()
    return WritePlan(stream, table, done, drop, survivors.num_rows)

