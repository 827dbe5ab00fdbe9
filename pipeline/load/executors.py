"""The cluster output path: rows stay on the executors, only event ids visit the driver.

Why: the embedded path (:func:`pipeline.load.run.run_spark`) collects every row to the driver with
``toArrow`` and appends it there — simple and fast on one machine, but on a Spark cluster the
driver becomes the bottleneck (all bytes cross the network to it, and it must hold a whole
run in memory). Here a run works in three steps, and the driver only ever holds the small
*keys* table (``_row``, ``_event_id``, ``_received_at``, ``_sequence``, and an upsert
sink's primary-key and tombstone columns) plus dead letters:

1. :func:`run_cluster` reads the run through the ``icefloe`` data source, tags each row with
   a stable ``_row`` id, persists the frame on the executors and collects the keys;
2. the collector deduplicates and replay-filters on the keys (the same
   :class:`~collector.dedup.DedupWindow` and committed-sequence logic as the embedded path)
   and :meth:`ClusterRunOutput.write_all` has the executors write the surviving rows as
   Parquet files into each target table's data location (each sink's own projection; a
   row of a source with several sinks once per sink), and a staged sink's rows as staged
   files into the staging area (:mod:`icefloe.staging`), through the ``icefloe-parquet``
   Python data source writer (:class:`ParquetSinkWriter`); the driver-side ``commit()`` of
   that writer receives the file list from the successful tasks' commit messages;
3. :class:`~pipeline.iceberg.data_files.AddFiles` commits those files with
   ``Table.add_files`` *through* :func:`pipeline.iceberg.commit.commit_rows` — one fast
   append carrying ``icefloe.sequence`` and ``icefloe.epoch``, with identical fencing,
   replay checks and unknown-outcome handling; staged files are recorded in the sink's
   staging state by the collector (:meth:`collector.staging.StagingArea.record`).

Why ``_row`` and not the event id to drop duplicates: the dedup window keeps the *first* of
repeated ids within a run, so it must be able to name one row among equals.
``monotonically_increasing_id`` is (partition index, position) and the data source is
deterministic, so the id is stable even if a persisted block is recomputed — and its order
is exactly the order ``toArrow`` gives the embedded path, so both paths keep the same rows.

Upserts (a sink with a ``primary_key``): the driver picks each key's latest row from the
keys and reads the key columns of the table's files to find those holding a replaced or
deleted key (:func:`plan_upsert`); the same write job then also rewrites each such file
without those keys — one row per file, unioned into the job, read by the executor as the
table's scan would — and the commit is one overwrite
(:class:`~pipeline.iceberg.data_files.ReplaceFiles`). Neither the new rows nor the
rewritten ones pass through the driver.

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
import numpy as np
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

from icefloe.staging import StagedFile, data_key
from icefloe.store.base import ObjectStore
from icefloe.streams.model import Column
from pipeline.columns import ARROW_TYPES, ENVELOPE, SHARD_COLUMN, dead_letter_arrow_schema
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
from pipeline.load.spec import RunSpec, StreamSpec, WhereSpec
from pipeline.where import judge, referenced, where_error_messages

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table
    from pyspark.sql import DataFrame, SparkSession

SINK_FORMAT = "icefloe-parquet"
ROW = "_row"
KEY_COLUMNS = (ROW, "_event_id", "_received_at", "_sequence")
TARGET = "_target"
"""The target (table) a row of the write job goes to."""
SOURCE = "_source"
"""The source of a staged row: what :mod:`collector.dedup` keys staged rows by."""
WHERE = "__icefloe_where_"
"""Prefix of the persisted run's boolean columns, one per ``where`` of the run's spec
(:func:`where_column`): whether that sink's predicate takes the row."""
WHERE_ERROR = "__icefloe_where_error_"
"""Prefix of the persisted run's string columns, one per ``where``: the error its predicate
raised on the row (Spark SQL's ANSI arithmetic), null where none."""
_INLINE_DROPS = 10_000
REWRITE_TASK = "__icefloe_rewrite_task"
REWRITE_KEYS = "__icefloe_rewrite_keys"
"""Columns of the rows of an upsert's rewrite part of a write job: one row per existing
file to rewrite (its pickled scan task, and the keys it holds as Arrow IPC)."""
_REWRITE_TASKS = 64
"""At most this many tasks rewrite an upsert's files (one file per task below it)."""


def rewrite_target(target: str) -> str:
    """The name the rewritten files of ``target``'s table travel under in a write job."""
    return f"{target}#rewrite"


log = logging.getLogger("icefloe.cluster")


# --------------------------------------------------------------------------- plain data


@dataclass(slots=True)
class WrittenFiles(WriterCommitMessage):
    """A task's commit message: the files it wrote (pickled back to the driver): table
    data files, and staged files by staged table."""

    files: list[DataFileRef] = field(default_factory=list)
    staged: list[tuple[str, StagedFile]] = field(default_factory=list)


class StageTarget(msgspec.Struct, frozen=True):
    """What an executor needs to stage one sink's rows (see :mod:`icefloe.staging`).

    ``columns`` are (wide-frame column or "" for a column the source does not decode, sink
    column, declared type): the staged file holds exactly what the embedded path stages —
    the sink's columns in their declared Arrow types, the envelope and ``_source``.
    """

    table: str
    source: str
    columns: tuple[tuple[str, str, str], ...]


class StoreRef(msgspec.Struct, frozen=True):
    """The object store of the staging area, as the run's spec names it."""

    url: str
    endpoint_url: str | None = None
    region: str | None = None


class RewriteTarget(msgspec.Struct, frozen=True):
    """What an executor needs to rewrite files of one upsert table without some keys.

    The table's metadata (as Iceberg JSON) lets the executor read an older file exactly
    as a scan of the table does — projected to the current schema by field ids, minus the
    rows other engines' position deletes removed; ``key`` names the primary-key columns.
    The rewritten rows are written through the :class:`TableTarget` of the same name.
    """

    target: str
    metadata_json: str
    key: tuple[str, ...]


class SinkJob(msgspec.Struct, frozen=True):
    """The ``job`` option of one write: a unique attempt id, targets, and the receipt path.

    ``receipt`` is a local file the driver-side ``commit()`` writes the file list to: that
    method runs in a Python worker the Spark driver starts on the driver host, not in the
    collector's own interpreter, so a file is the way back.
    """

    attempt: str
    receipt: str
    targets: tuple[TableTarget, ...]
    staged: tuple[StageTarget, ...] = ()
    store: StoreRef | None = None
    rewrites: tuple[RewriteTarget, ...] = ()

    def encode(self) -> str:
        return msgspec.json.encode(self).decode()

    @classmethod
    def decode(cls, text: str) -> SinkJob:
        return msgspec.json.decode(text, type=cls)


# --------------------------------------------------------------------------- executor side


class ParquetSinkWriter(DataSourceArrowWriter):
    """Writes wide-frame rows as Parquet files of their target's table (or staging area);
    commits nothing.

    Each row carries its target in :data:`TARGET` (a table name; a row of a source with
    several sinks arrives once per sink). The Iceberg commit and the staging-state write
    are the collector's: this writer only reports the files (``commit`` writes the receipt)
    and deletes them when the job fails (``abort``).
    """

    def __init__(self, job: SinkJob) -> None:
        self.job = job

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WrittenFiles:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        task = f"{ctx.partitionId():05d}-{ctx.attemptNumber()}" if ctx else "00000-0"
        tables = {t.stream: TableFiles(t, self.job.attempt, task) for t in self.job.targets}
        staged = {t.table: StagedRows(t, f"{self.job.attempt}-{task}")
                  for t in self.job.staged}
        written: list[tuple[str, StagedFile]] = []
        rewrites = {r.target: r for r in self.job.rewrites}
        try:
            for batch in iterator:
                if batch.num_rows == 0:
                    continue
                rows = pa.Table.from_batches([batch])
                if rewrites and REWRITE_TASK in rows.column_names:
                    rows = _rewrite_files(rows, rewrites, tables)
                    if rows.num_rows == 0:
                        continue
                keys = rows.column(TARGET)
                single = len(tables) + len(staged) == 1
                for name, sink in [*tables.items(), *staged.items()]:
                    part = rows if single else rows.filter(pc.equal(keys, name))
                    if part.num_rows:
                        sink.add(part)
            if staged:
                store = _open_store(self.job)
                try:
                    for name, rows_of in staged.items():
                        done = rows_of.put(store)
                        if done is not None:
                            written.append((name, done))
                finally:
                    store.close()
            return WrittenFiles([ref for files in tables.values() for ref in files.close()],
                                written)
        except BaseException:
            for files in tables.values():
                files.discard()
            if written:
                _delete_staged(self.job, [key for _, key in written])
            raise

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        done = [m for m in messages if isinstance(m, WrittenFiles)]
        body = json.dumps({
            "files": [r.to_json() for m in done for r in m.files],
            "staged": [[table, msgspec.to_builtins(f)] for m in done for table, f in m.staged],
        })
        tmp = f"{self.job.receipt}.tmp"
        with open(tmp, "w", encoding="utf-8") as out:
            out.write(body)
        os.replace(tmp, self.job.receipt)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        done = [m for m in messages if isinstance(m, WrittenFiles)]
        _delete_refs(self.job, [ref for m in done for ref in m.files])
        _delete_staged(self.job, [f for m in done for _, f in m.staged])


def _rewrite_files(rows: pa.Table, rewrites: Mapping[str, RewriteTarget],
                   tables: Mapping[str, TableFiles]) -> pa.Table:
    """Rewrite the existing files named by ``rows``' rewrite rows (each: read the file as
    the table's scan would, drop the rows whose key the upsert replaces or deletes, write
    the rest through the table's writer); returns the other rows, the run's own."""
    todo = pc.is_valid(rows.column(REWRITE_TASK))
    if not pc.any(todo).as_py():
        return rows
    import pickle

    from pyiceberg.expressions import AlwaysTrue
    from pyiceberg.io.pyarrow import ArrowScan
    from pyiceberg.table.metadata import TableMetadataUtil

    from pipeline.iceberg.upsert import without_keys

    for item in rows.filter(todo).select([TARGET, REWRITE_TASK, REWRITE_KEYS]).to_pylist():
        target = rewrites[item[TARGET]]
        files = tables[item[TARGET]]
        metadata = TableMetadataUtil.parse_raw(target.metadata_json)
        task = pickle.loads(item[REWRITE_TASK])  # written by this job's driver
        keys = pa.ipc.open_stream(item[REWRITE_KEYS]).read_all()
        scan = ArrowScan(metadata, files.io, metadata.schema(), AlwaysTrue())
        kept = without_keys(scan.to_table([task]), keys, target.key)
        if kept.num_rows:  # a file left empty is only removed
            files.add(kept)
    return rows.filter(pc.invert(todo))


class StagedRows:
    """One task's rows of one staged sink: written as one staged Parquet file at the end.

    Why one file per task and not per run: the rows never meet on one machine. The files
    of one run overlap in sequences; the state records them together and the import never
    splits overlapping files (:func:`collector.commit.chunk_of`).
    """

    def __init__(self, target: StageTarget, unique: str) -> None:
        from pipeline.columns import ARROW_TYPES

        self.target = target
        self.unique = unique
        self.types = [ARROW_TYPES[kind] for _, _, kind in target.columns]
        self.parts: list[pa.Table] = []

    def add(self, rows: pa.Table) -> None:
        arrays, names = [], []
        for (src, name, _), kind in zip(self.target.columns, self.types, strict=True):
            if src and src in rows.column_names:
                column = rows.column(src)
                arrays.append(column if column.type == kind else column.cast(kind))
            else:  # a column this source does not decode: nulls, as the embedded path
                arrays.append(pa.nulls(rows.num_rows, kind))
            names.append(name)
        for name, kind in ENVELOPE:
            column = rows.column(name)
            arrays.append(column if column.type == kind else column.cast(kind))
            names.append(name)
        arrays.append(pa.array([self.target.source] * rows.num_rows, pa.string()))
        names.append(SOURCE)
        self.parts.append(pa.Table.from_arrays(arrays, names=names))

    def put(self, store: ObjectStore) -> StagedFile | None:
        """Write the staged file (None when this task had no rows for the sink)."""
        if not self.parts:
            return None
        import io

        import pyarrow.parquet as pq

        rows = pa.concat_tables(self.parts)
        sequences = rows.column("_sequence")
        first, last = pc.min(sequences).as_py(), pc.max(sequences).as_py()
        oldest = pc.min(rows.column("_received_at")).cast(pa.int64()).as_py() // 1000
        sink = io.BytesIO()
        pq.write_table(rows, sink, compression="zstd")
        data = sink.getvalue()
        key = data_key(self.target.table, first, last, self.unique)
        store.put(key, data)
        lasts = _last_per_shard(sequences)
        return StagedFile(key, first, last, rows.num_rows, len(data), oldest,
                          sequences=lasts if any(lasts) else {})


def _last_per_shard(positions: pa.ChunkedArray) -> dict[int, int]:
    """Per shard, the last sequence among run ``positions`` (a staged file's ``through``)."""
    pos = positions.combine_chunks().to_numpy(zero_copy_only=False)
    shards = pos >> SHARD_BITS
    return {int(shard): int((pos[shards == shard] & _LOCAL).max())
            for shard in np.unique(shards)}


def _open_store(job: SinkJob) -> ObjectStore:
    from pipeline.load.fetch import open_run_store

    assert job.store is not None, "a job with staged targets names its store"
    return open_run_store(job.store.url, job.store.endpoint_url, job.store.region)


def _delete_staged(job: SinkJob, files: Sequence[StagedFile]) -> None:
    """Best effort: staged files no state will reference (the sweep gets the rest)."""
    if not files:
        return
    store = _open_store(job)
    try:
        for staged in files:
            with contextlib.suppress(Exception):
                store.delete(staged.key)
    finally:
        store.close()


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

    @property
    def target(self) -> str:
        return self.key or self.stream


@dataclass(slots=True)
class Written:
    """What one write job produced: table files and staged files, by plan target."""

    files: dict[str, FileSet] = field(default_factory=dict)
    staged: dict[str, tuple[StagedFile, ...]] = field(default_factory=dict)


@dataclass(slots=True)
class ClusterRunOutput:
    """One run, kept on the executors: per-stream keys and dead letters on the driver.

    ``keys[stream]`` has :data:`KEY_COLUMNS` in row order, then the stream's ``where``
    columns (``wheres[(stream, table)]`` names the one of the sink writing ``table``: true
    where its predicate takes the row); call :meth:`release` when done.
    """

    spark: SparkSession | None = None
    frame: DataFrame | None = None
    spec: RunSpec | None = None
    keys: dict[str, pa.Table] = field(default_factory=dict)
    dead: pa.Table = field(default_factory=lambda: dead_letter_arrow_schema().empty_table())
    wheres: dict[tuple[str, str], str] = field(default_factory=dict)
    where_errors: dict[tuple[str, str], str] = field(default_factory=dict)
    """Per (stream, table), the keys' column of the message of the error that sink's
    ``where`` raised on a row (null: none; :func:`where_error_column`)."""

    @property
    def rows(self) -> int:
        return sum(t.num_rows for t in self.keys.values())

    def write(self, plans: Sequence[WritePlan]) -> dict[str, FileSet]:
        """:meth:`write_all` for table plans only: the files per target."""
        return self.write_all(plans).files

    def write_all(self, plans: Sequence[WritePlan]) -> Written:
        """Have the executors write the planned rows; return the files per target.

        One Spark job for all targets: each row is tagged with the target(s) it goes to
        (several for a source with several sinks) and each task writes per target. If the
        job fails, every file it wrote is deleted (tasks clean up after themselves,
        ``abort`` after the successful ones).
        """
        plans = [p for p in plans if p.expected > 0 or p.rewrites]
        if not plans:
            return Written()
        from pyspark.sql import functions as F

        assert self.spark is not None
        assert self.frame is not None
        assert self.spec is not None
        index = {s.name: i for i, s in enumerate(self.spec.streams)}
        targets: list[TableTarget] = []
        staged: list[StageTarget] = []
        rewrites: list[RewriteTarget] = []
        wanted = [TARGET]
        terms = []
        inline = sum(len(p.drop) for p in plans) <= _INLINE_DROPS
        for plan in plans:
            i = index[plan.stream]
            decoded = [name for name, _ in self.spec.streams[i].columns]
            sink = plan.columns or tuple(self.spec.streams[i].columns)
            source = {name: f"{struct_column(i)}__{name}" for name in decoded}
            envelope = [(name, name) for name, _ in ENVELOPE]
            if plan.stage is not None:  # staged rows keep run positions in `_sequence`
                staged.append(StageTarget(plan.stage, plan.stream, tuple(
                    (source.get(name, ""), name, kind) for name, kind in sink)))
                columns = [(source[n], n) for n, _ in sink if n in source] + envelope
            else:  # table rows get the shard and the shard's own sequence
                assert plan.table is not None
                columns = [(source.get(name, ""), name) for name, _ in sink] + [
                    (_LOCAL_COLUMN if name == "_sequence" else name, name)
                    for name, _ in ENVELOPE]
                if SHARD_COLUMN[0] in plan.table.schema().column_names:
                    columns.append((SHARD_COLUMN[0], SHARD_COLUMN[0]))
                targets.append(TableTarget.of(plan.target, plan.table, columns))
                if plan.rewrites:  # an upsert: its affected files, rewritten
                    rewrites.append(_rewrite_of(plan, targets))
            wanted += [src for src, _ in columns if src and src not in wanted]
            term = (F.col(STREAM) == plan.stream) & _past(plan.after)
            if plan.sequences is not None:
                term = term & F.col("_sequence").isin(list(plan.sequences))
            if plan.where is not None:
                term = term & F.col(plan.where)
            if inline and len(plan.drop):  # a literal list: no extra job
                term = term & ~F.col(ROW).isin(plan.drop.to_pylist())
            terms.append(F.when(term, F.lit(plan.target)))
        # `_sequence` holds run positions (shard << SHARD_BITS | sequence): table rows get
        # the shard and the shard's own sequence, as commit_rows gives the embedded path's;
        # staged rows keep the positions, as the embedded path stages them.
        position = F.col("_sequence")
        frame = self.frame \
            .withColumn(SHARD_COLUMN[0], F.shiftright(position, SHARD_BITS).cast("int")) \
            .withColumn(_LOCAL_COLUMN, position.bitwiseAND(F.lit(_LOCAL)))
        if len({p.stream for p in plans}) == len(plans):  # a row has one target at most
            frame = frame.withColumn(TARGET, F.coalesce(*terms)).where(
                F.col(TARGET).isNotNull())
        else:  # fan-out: a row once per sink that takes it
            frame = frame.withColumn(TARGET, F.explode(F.filter(
                F.array(*terms), lambda target: target.isNotNull())))
        if not inline:  # many retried ids: a broadcast anti-join scales better
            dropped = self.spark.createDataFrame(pa.concat_tables([pa.table({
                ROW: p.drop, TARGET: pa.array([p.target] * len(p.drop), pa.string())})
                for p in plans]))
            frame = frame.join(F.broadcast(dropped), on=[ROW, TARGET], how="left_anti")
        fd, receipt = tempfile.mkstemp(prefix="icefloe-receipt-", suffix=".json")
        os.close(fd)
        os.unlink(receipt)
        spec = self.spec
        store = StoreRef(spec.store_url, spec.endpoint_url, spec.region) if staged else None
        job = SinkJob(attempt=str(ULID()), receipt=receipt, targets=tuple(targets),
                      staged=tuple(staged), store=store, rewrites=tuple(rewrites))
        _activate(self.spark)
        started = time.monotonic()
        try:
            frame = frame.select(*wanted)
            if rewrites:
                frame = frame.unionByName(self._rewrite_rows(plans), allowMissingColumns=True)
            frame.write.format(SINK_FORMAT).option("job", job.encode()) \
                .mode("append").save()
            refs, stage_refs = _read_receipt(receipt)
        except BaseException:
            if os.path.exists(receipt):  # committed, yet the call failed: nobody owns them
                with contextlib.suppress(Exception):
                    refs, stage_refs = _read_receipt(receipt)
                    _delete_refs(job, refs)
                    _delete_staged(job, [f for _, f in stage_refs])
            raise
        finally:
            for path in (receipt, f"{receipt}.tmp"):
                if os.path.exists(path):
                    os.unlink(path)
        log.debug("cluster write: %d files, %d staged, %d rows in %.3fs", len(refs),
                  len(stage_refs), sum(r.rows for r in refs) + sum(f.rows for _, f in
                                                                  stage_refs),
                  time.monotonic() - started)
        out = Written(
            {p.target: FileSet(tuple(r for r in refs
                                     if r.stream in (p.target, rewrite_target(p.target))))
             for p in plans if p.stage is None},
            {p.target: tuple(sorted((f for t, f in stage_refs if t == p.stage),
                                    key=lambda f: (f.last_sequence, f.first_sequence)))
             for p in plans if p.stage is not None})
        for plan in plans:
            got = (sum(f.rows for f in out.staged[plan.target]) if plan.stage is not None
                   else sum(f.rows for f in out.files[plan.target].files
                            if f.stream == plan.target))
            if got != plan.expected:
                _delete_refs(job, refs)
                _delete_staged(job, [f for _, f in stage_refs])
                raise RuntimeError(f"cluster write of {plan.target} produced {got} rows, "
                                   f"expected {plan.expected}")
        return out

    def _rewrite_rows(self, plans: Sequence[WritePlan]) -> DataFrame:
        """The rewrite part of a write job: one row per existing file an upsert rewrites,
        spread over up to :data:`_REWRITE_TASKS` tasks."""
        names: list[str] = []
        tasks: list[bytes] = []
        held: list[bytes] = []
        for plan in plans:
            for task, keys in plan.rewrites:
                names.append(rewrite_target(plan.target))
                tasks.append(task)
                held.append(keys)
        assert self.spark is not None
        rows = pa.table({TARGET: pa.array(names, pa.string()),
                         REWRITE_TASK: pa.array(tasks, pa.binary()),
                         REWRITE_KEYS: pa.array(held, pa.binary())})
        return self.spark.createDataFrame(rows).repartition(min(len(names), _REWRITE_TASKS))

    def collect_rows(self, stream: str, rows: pa.Array,
                     columns: Sequence[tuple[str, str]]) -> pa.Table:
        """A few rows of ``stream`` (by ``_row``) with the sink ``columns`` (nulls for
        those the stream does not decode) and the envelope: what a dead letter of the
        cluster path needs, which the driver's keys do not hold."""
        _, picked = self._picked(stream)
        decoded = dict(picked)
        got = self._fetch(stream, rows, [(decoded[n], n) for n, _ in columns if n in decoded])
        for name, kind in columns:
            if name not in decoded:
                got = got.append_column(name, pa.nulls(got.num_rows, ARROW_TYPES[kind]))
        return got.select([name for name, _ in columns] + [name for name, _ in ENVELOPE])

    def rows_of(self, stream: str, ids: pa.Array) -> pa.Table:
        """``stream``'s rows ``ids`` (``_row`` values) on the driver, as the embedded path
        holds a stream's rows: its decoded columns in their declared types, then the
        envelope (the unrouted events a source dead-letters)."""
        index, picked = self._picked(stream)
        got = self._fetch(stream, ids, [(wide, name) for name, wide in picked])
        assert self.spec is not None
        return _declared_rows(got, self.spec.streams[index])

    def _picked(self, stream: str) -> tuple[int, list[tuple[str, str]]]:
        """``stream``'s index in the spec and its decoded columns as (name, wide column)."""
        assert self.spec is not None
        index = next(i for i, s in enumerate(self.spec.streams) if s.name == stream)
        return index, [(name, f"{struct_column(index)}__{name}")
                       for name, _ in self.spec.streams[index].columns]

    def _fetch(self, stream: str, ids: pa.Array, columns: list[tuple[str, str]]
               ) -> pa.Table:
        """The rows ``ids`` (``_row`` values) of ``stream`` from the executors, in run order
        (``_sequence``, then ``_row``): the wide ``columns`` as (wide, name), then the
        envelope. A literal id list, or a broadcast join when there are many ids."""
        from pyspark.sql import functions as F

        assert self.spark is not None
        assert self.frame is not None
        rows = self.frame.where(F.col(STREAM) == stream)
        if len(ids) <= _INLINE_DROPS:
            rows = rows.where(F.col(ROW).isin(ids.to_pylist()))
        else:
            wanted = self.spark.createDataFrame(pa.table({ROW: ids}))
            rows = rows.join(F.broadcast(wanted), on=ROW, how="left_semi")
        got = rows.select(*[F.col(wide).alias(name) for wide, name in columns],
                          *[F.col(name) for name, _ in ENVELOPE], F.col(ROW)).toArrow()
        return got.sort_by([("_sequence", "ascending"), (ROW, "ascending")]) \
            .drop_columns([ROW])

    def session_works(self) -> bool:
        """Whether the session still runs a Python task (a one-row job, no storage).

        Why: when every table's write of a run fails, this tells a failure of the tables
        (their data locations, their files) from one of the session they share (its
        Python workers, its JVM), which must not be counted against each table."""
        if self.spark is None:
            return True
        try:
            probe = self.spark.range(1).mapInArrow(_same_batches, "id long")
            return probe.count() == 1
        except Exception as exc:  # the session is what fails
            log.warning("the Spark session fails a one-row job: %s", exc)
            return False

    def release(self) -> None:
        """Drop the persisted run from the executors."""
        if self.frame is not None:
            self.frame.unpersist(blocking=False)
            self.frame = None


def _same_batches(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The probe of :meth:`ClusterRunOutput.session_works`: its batches, unchanged."""
    yield from batches


_LOCAL = (1 << SHARD_BITS) - 1
_LOCAL_COLUMN = "__icefloe_local_sequence"
"""The wide frame's column of a row's own shard sequence (``_sequence`` & ``_LOCAL``)."""


def _rewrite_of(plan: WritePlan, targets: list[TableTarget]) -> RewriteTarget:
    """The rewrite target of an upsert ``plan``; adds the writer's :class:`TableTarget` of
    its rewritten files to ``targets`` (the table's own columns, by name: those rows come
    from the table's files, not from the run's frame)."""
    assert plan.table is not None
    name = rewrite_target(plan.target)
    columns = [(f.name, f.name) for f in plan.table.schema().fields]
    targets.append(TableTarget.of(name, plan.table, columns))
    return RewriteTarget(name, plan.table.metadata.model_dump_json(), plan.upsert_key)


def where_column(index: int) -> str:
    """The persisted run's boolean column of the spec's ``index``-th ``where``."""
    return f"{WHERE}{index}"


def where_error_column(index: int) -> str:
    """The persisted run's column of the errors of the spec's ``index``-th ``where``."""
    return f"{WHERE_ERROR}{index}"


def _declared(column: pa.Array | pa.ChunkedArray, kind: pa.DataType
              ) -> pa.Array | pa.ChunkedArray:
    """A column as Spark hands it back (no uuid, times in nanoseconds, maybe large
    strings) in its declared Arrow type."""
    return column if column.type == kind else column.cast(kind)


def _declared_rows(rows: pa.Table, stream: StreamSpec) -> pa.Table:
    kinds = [ARROW_TYPES[kind] for _, kind in stream.columns] + [k for _, k in ENVELOPE]
    return pa.Table.from_arrays([_declared(rows.column(i), kind)
                                 for i, kind in enumerate(kinds)], names=rows.column_names)


def where_flags(spec: RunSpec, batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` of the wide run with one boolean column per ``where`` of ``spec``
    (:func:`where_column`): TRUE where the sink takes the row — a row of its stream, of an
    entry whose version it receives, that the predicate of that version takes (FALSE and
    NULL do not). Runs on the executors; the embedded path applies the same evaluator to
    the same decoded values on the driver (:func:`collector.routing.where_mask`)."""
    rows = pa.Table.from_batches([batch])
    arrays, names = list(batch.columns), list(batch.schema.names)
    errors, error_names = [], []
    index = {s.name: i for i, s in enumerate(spec.streams)}
    for j, where in enumerate(spec.wheres):
        i = index[where.stream]
        flag, failed = _where_mask(where, rows, i, spec.streams[i])
        arrays.append(flag)
        names.append(where_column(j))
        errors.append(failed)
        error_names.append(where_error_column(j))
    return pa.RecordBatch.from_arrays(arrays + errors, names=names + error_names)


def _where_mask(where: WhereSpec, rows: pa.Table, index: int, stream: StreamSpec
                ) -> tuple[pa.Array, pa.Array]:
    """:func:`where_verdict` over the wide batch ``rows``: FALSE (no error) on other
    streams' rows."""
    names = {n for case in where.cases if case.sql is not None
             for n in referenced(case.sql, where.columns)}
    flag, failed = where_verdict(where, _predicate_rows(rows, index, stream,
                                                        tuple(sorted(names))))
    mine = pc.fill_null(pc.equal(rows.column(STREAM), where.stream), False)
    mine = mine.combine_chunks() if isinstance(mine, pa.ChunkedArray) else mine
    failed = pc.if_else(mine, failed, pa.scalar(None, pa.string()))
    return pc.and_(mine, flag), (failed.combine_chunks()
                                 if isinstance(failed, pa.ChunkedArray) else failed)


def where_flag(where: WhereSpec, rows: pa.Table) -> pa.Array:
    """Which of ``rows`` (one stream's decoded rows: its columns by name in their declared
    types, and the envelope) the sink of ``where`` takes: a row of an entry in one of its
    cases that the case's predicate takes (None: every row). No nulls."""
    return where_verdict(where, rows)[0]


def where_verdict(where: WhereSpec, rows: pa.Table) -> tuple[pa.Array, pa.Array]:
    """:func:`where_flag`, and per row the message of the error the predicate raised on
    it (null: none), named as the embedded path names it
    (:func:`collector.routing.where_verdict`, through the same
    :func:`pipeline.where.judge`)."""
    sequences = rows.column("_sequence")
    columns = tuple(Column(name, kind) for name, kind in where.columns)
    taken: Any = None
    errors: Any = pa.nulls(rows.num_rows, pa.string())
    for case in where.cases:
        chosen = pc.is_in(sequences, pa.array(case.sequences(), pa.int64()))
        if case.sql is not None:
            verdict = judge(case.sql, columns, rows)
            if verdict.errors is not None:
                failed = where_error_messages(where.sink, where.table, case.sql,
                                              verdict.errors)
                errors = pc.coalesce(errors, pc.if_else(chosen, failed, pa.scalar(
                    None, pa.string())))
            chosen = pc.and_kleene(chosen, verdict.taken)
        taken = chosen if taken is None else pc.or_kleene(taken, chosen)
    if taken is None:
        return pa.array(np.zeros(rows.num_rows, dtype=bool)), errors
    taken = taken.combine_chunks() if isinstance(taken, pa.ChunkedArray) else taken
    return pc.fill_null(taken, False), errors


def _predicate_rows(rows: pa.Table, index: int, stream: StreamSpec,
                    names: tuple[str, ...]) -> pa.Table:
    """The decoded values a predicate reads (``names``), as the embedded path holds them:
    the stream's columns under their own names in their declared types, and the envelope;
    a name the stream does not decode is left out (the evaluator reads it as NULL)."""
    kinds = dict(stream.columns)
    arrays, out = [], []
    for name, kind in ENVELOPE:
        arrays.append(_declared(rows.column(name), kind))
        out.append(name)
    for name in names:
        if name in kinds:
            arrays.append(_declared(rows.column(f"{struct_column(index)}__{name}"),
                                    ARROW_TYPES[kinds[name]]))
            out.append(name)
    return pa.Table.from_arrays(arrays, names=out)


def _with_wheres(frame: DataFrame, spec: RunSpec) -> DataFrame:
    """``frame`` with :func:`where_flags`' columns, computed on the executors."""
    from pyspark.sql.types import BooleanType, StringType, StructField

    schema = StructType([*frame.schema.fields, *[
        StructField(where_column(j), BooleanType(), nullable=False)
        for j in range(len(spec.wheres))], *[
        StructField(where_error_column(j), StringType(), nullable=True)
        for j in range(len(spec.wheres))]])

    def flags(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            yield where_flags(spec, batch)

    return frame.mapInArrow(flags, schema)


_DDL = {pa.int64(): "bigint", pa.string(): "string", pa.binary(): "binary"}


def _ddl(schema: pa.Schema) -> str:
    """A flat Arrow schema as the Spark DDL ``mapInArrow`` wants."""
    return ", ".join(f"`{f.name}` {_DDL[f.type]}" for f in schema)


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


def _read_receipt(path: str) -> tuple[list[DataFileRef], list[tuple[str, StagedFile]]]:
    with open(path, encoding="utf-8") as f:
        body = json.load(f)
    refs = [DataFileRef.from_json(item) for item in body["files"]]
    # strict=False: JSON object keys are strings; a file's per-shard ``sequences`` has ints
    staged = [(table, msgspec.convert(f, StagedFile, strict=False))
              for table, f in body["staged"]]
    return refs, staged


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
    if spec.wheres:  # routing by content: each sink's predicate, on the executors
        frame = _with_wheres(frame, spec)
    frame = frame.persist(StorageLevel.MEMORY_AND_DISK)
    out = ClusterRunOutput(spark, frame, spec)
    extra = _key_columns(spec)
    flags = [where_column(j) for j in range(len(spec.wheres))]
    failed = [where_error_column(j) for j in range(len(spec.wheres))]
    try:
        keys = frame.select(STREAM, *KEY_COLUMNS, *extra, DEAD, *flags, *failed).toArrow()
    except BaseException:
        out.release()
        raise
    log.debug("cluster keys: %d rows in %.3fs", keys.num_rows, time.monotonic() - started)
    # Sequence order first (see DedupWindow.filter_in_sequence_order), row id within it.
    keys = keys.sort_by([("_sequence", "ascending"), (ROW, "ascending")])
    streams = keys.column(STREAM)
    for i, stream in enumerate(spec.streams):
        rows = keys.filter(pc.equal(streams, stream.name))
        if rows.num_rows:
            mine = [flags[j] for j, w in enumerate(spec.wheres) if w.stream == stream.name]
            mine += [failed[j] for j, w in enumerate(spec.wheres) if w.stream == stream.name]
            part = rows.select([*KEY_COLUMNS, *mine])
            for name in stream.keys:  # an upsert sink's key and tombstone columns
                wide = f"{struct_column(i)}__{name}"
                if wide in extra and name not in part.column_names:
                    part = part.append_column(name, rows.column(wide))
            out.keys[stream.name] = part.combine_chunks()
    out.wheres = {(w.stream, w.table): flags[j] for j, w in enumerate(spec.wheres)}
    out.where_errors = {(w.stream, w.table): failed[j] for j, w in enumerate(spec.wheres)}
    dead = keys.filter(pc.is_null(streams))
    if dead.num_rows:
        out.dead = DeadLetters.decode_rows(dead.column(DEAD).to_pylist()).to_arrow()
    return out


def _key_columns(spec: RunSpec) -> list[str]:
    """The wide-frame columns of every stream's :attr:`~pipeline.load.spec.StreamSpec.keys`
    that the stream decodes (one it does not decode is absent from its keys: no value)."""
    out: list[str] = []
    for i, stream in enumerate(spec.streams):
        decoded = {name for name, _ in stream.columns}
        out += [f"{struct_column(i)}__{name}" for name in stream.keys if name in decoded]
    return out


def plan_write(catalog: Catalog, identifier: str, stream: str, keys: pa.Table,
               fresh: pa.Table, *, sequences: Mapping[int, int], epoch: int, key: str = "",
               columns: tuple[tuple[str, str], ...] | None = None,
               entries: tuple[int, ...] | None = None,
               where: str | None = None) -> WritePlan | None:
    """What to write for one table, or None when nothing is new.

    Reads the table's committed sequences and epoch first: a fenced collector stops before
    writing a byte, and rows a previous attempt already committed (per manifest shard)
    are never rewritten. ``keys`` are the stream's rows of the run that go to this table
    (of the entries in ``entries``, run positions, if given; ``_sequence``: run
    positions), ``fresh`` those the dedup window kept; ``sequences`` the run's last
    sequence per shard; ``key``, ``columns`` and ``where``: see :class:`WritePlan` (rows
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
                     columns=columns, sequences=entries, where=where)



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


def plan_upsert(catalog: Catalog, identifier: str, stream: str, keys: pa.Table,
                fresh: pa.Table, *, key: Sequence[str], tombstone: str | None,
                sequences: Mapping[int, int], epoch: int, target: str = "",
                columns: tuple[tuple[str, str], ...] | None = None,
                entries: tuple[int, ...] | None = None,
                where: str | None = None) -> UpsertPlan | None:
    """:func:`plan_write` for a table with a primary key, or None when nothing is new.

    ``keys`` (every row of the run for this table) and ``fresh`` (those the dedup window
    kept, each with a value in every ``key`` column) carry the key and ``tombstone``
    columns. The rows past the committed sequences are reduced to the latest per key by
    the embedded path's rule (:func:`~pipeline.iceberg.upsert.survivors`); the executors
    write those that are not tombstones (every other row of ``keys`` is dropped by
    ``_row``) and rewrite each existing file that holds one of the keys without it. Only
    key columns reach the driver: the rows themselves stay on the executors.
    """
    import pickle

    from pyiceberg.table import FileScanTask

    from pipeline.iceberg.upsert import affected_files, survivors

    found = _pending(catalog, identifier, fresh, sequences, epoch)
    if found is None:
        return None
    table, done, pending = found
    replaced_keys, write = survivors(pending, key, tombstone)
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
                      pending.num_rows)



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
    from icefloe.errors import CatalogError

    try:
        return catalog.load_table(identifier)
    except Exception as exc:
        raise CatalogError(f"cannot load table {identifier}: {exc}") from exc


def _check_shards(table: Table, identifier: str, rows: pa.Table) -> None:
    """Refuse rows of manifest shards above 0 for a table without the shard column."""
    from icefloe.errors import CatalogError

    if SHARD_COLUMN[0] not in table.schema().column_names and \
            pc.any(pc.greater(rows.column("_sequence"), _LOCAL)).as_py():
        raise CatalogError(f"table {identifier} has no {SHARD_COLUMN[0]} column for rows of "
                           "manifest shards above 0: it was not evolved")
