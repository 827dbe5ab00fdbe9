"""The cluster output path, driver side: rows stay on the executors, only ids visit the driver.

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
   Python data source writer (:class:`~pipeline.load.sink.ParquetSinkWriter`); the
   driver-side ``commit()`` of that writer receives the file list from the successful
   tasks' commit messages;
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
deleted key (:func:`~pipeline.load.plans.plan_upsert`); the same write job then also
rewrites each such file without those keys — one row per file, unioned into the job,
read by the executor as the table's scan would — and the commit is one overwrite
(:class:`~pipeline.iceberg.data_files.ReplaceFiles`). Neither the new rows nor the
rewritten ones pass through the driver.

Files that never make it into a table are deleted: a failing task deletes its own, a failed
job's ``abort()`` deletes the successful tasks' files, and
:meth:`~pipeline.iceberg.data_files.AddFiles.cleanup` deletes
the files of a commit that was refused or not attempted (only when it is certain they are
not referenced). A crash leaves them behind; the maintenance orphan sweep
(:func:`pipeline.iceberg.maintenance.delete_unreachable_files`) removes them once old enough.

Where each part runs: this module drives the run on the Spark session (the driver);
:mod:`pipeline.load.plans` plans each table's write against the catalog (the driver);
:mod:`pipeline.load.sink` is the data source writer shipped to the executors' Python
workers, and :mod:`pipeline.load.wheres` the per-batch ``where`` flags they compute.
"""


from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import StorageLevel
from pyspark.sql import SparkSession as PySparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, StringType, StructField, StructType
from ulid import ULID

from icefloe.staging import StagedFile
from pipeline.columns import ARROW_TYPES, ENVELOPE, SHARD_COLUMN, dead_letter_arrow_schema
from pipeline.iceberg.commit import SHARD_BITS
from pipeline.iceberg.data_files import DataFileRef, FileSet, TableTarget
from pipeline.load.decode import DeadLetters
from pipeline.load.frame import DEAD, KEY_COLUMNS, ROW, STREAM, struct_column
from pipeline.load.named import table_columns, table_name_flags
from pipeline.load.plans import INLINE_DROPS, WritePlan
from pipeline.load.sink import (
    REWRITE_KEYS,
    REWRITE_TASK,
    SINK_FORMAT,
    TARGET,
    ParquetSink,
    RewriteTarget,
    SinkJob,
    StageTarget,
    StoreRef,
    delete_refs,
    delete_staged,
    read_receipt,
    rewrite_target,
)
from pipeline.load.spec import RunSpec
from pipeline.load.wheres import declared_rows, where_column, where_error_column, where_flags

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

_REWRITE_TASKS = 64
"""At most this many tasks rewrite an upsert's files (one file per task below it)."""


log = logging.getLogger("icefloe.cluster")


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
    tables: dict[tuple[str, str], tuple[str, str, str]] = field(default_factory=dict)
    """Per (stream, table template), the keys' columns of the table each row names, the
    rule it broke and the message (:func:`~pipeline.load.named.table_columns`)."""

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
        assert self.spark is not None
        assert self.spec is not None
        inline = sum(len(p.drop) for p in plans) <= INLINE_DROPS
        parts = _job_parts(self.spec, plans, inline)
        frame = self._tagged(plans, parts, inline)
        fd, receipt = tempfile.mkstemp(prefix="icefloe-receipt-", suffix=".json")
        os.close(fd)
        os.unlink(receipt)
        spec = self.spec
        store = StoreRef(spec.store_url, spec.endpoint_url, spec.region) \
            if parts.staged else None
        job = SinkJob(attempt=str(ULID()), receipt=receipt, targets=tuple(parts.targets),
                      staged=tuple(parts.staged), store=store, rewrites=tuple(parts.rewrites))
        _activate(self.spark)
        started = time.monotonic()
        frame = frame.select(*parts.wanted)
        if parts.rewrites:
            frame = frame.unionByName(self._rewrite_rows(plans), allowMissingColumns=True)
        refs, stage_refs = _save(frame, job)
        log.debug("cluster write: %d files, %d staged, %d rows in %.3fs", len(refs),
                  len(stage_refs), sum(r.rows for r in refs) + sum(f.rows for _, f in
                                                                  stage_refs),
                  time.monotonic() - started)
        return _written(plans, job, refs, stage_refs)

    def _tagged(self, plans: Sequence[WritePlan], parts: JobParts, inline: bool
                ) -> DataFrame:
        """The run's frame with each row's target(s) in :data:`TARGET` (a row once per
        sink that takes it), its shard and shard-local sequence, the dropped rows gone."""
        assert self.frame is not None
        assert self.spark is not None
        # `_sequence` holds run positions (shard << SHARD_BITS | sequence): table rows get
        # the shard and the shard's own sequence, as commit_rows gives the embedded path's;
        # staged rows keep the positions, as the embedded path stages them.
        position = F.col("_sequence")
        frame = self.frame \
            .withColumn(SHARD_COLUMN[0], F.shiftright(position, SHARD_BITS).cast("int")) \
            .withColumn(_LOCAL_COLUMN, position.bitwiseAND(F.lit(_LOCAL)))
        terms = [F.when(term, target) for term, target, _ in parts.terms]
        single = len({stream for *_, stream in parts.terms}) == len(parts.terms)
        if single:  # a row has one target at most
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
        return frame

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
        return declared_rows(got, self.spec.streams[index])

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
        assert self.spark is not None
        assert self.frame is not None
        rows = self.frame.where(F.col(STREAM) == stream)
        if len(ids) <= INLINE_DROPS:
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


@dataclass(slots=True)
class JobParts:
    """What a write job's plans become: the table, staged and rewrite targets of the
    :class:`~pipeline.load.sink.SinkJob`, the frame's columns it reads, and per plan the
    condition a row must meet to go to the plan's target (the condition, the target, the
    stream: one per plan, or one per group of a template's tables, :func:`_named_terms`)."""

    targets: list[TableTarget] = field(default_factory=list)
    staged: list[StageTarget] = field(default_factory=list)
    rewrites: list[RewriteTarget] = field(default_factory=list)
    wanted: list[str] = field(default_factory=lambda: [TARGET])
    terms: list[tuple[Any, Any, str]] = field(default_factory=list)


def _job_parts(spec: RunSpec, plans: Sequence[WritePlan], inline: bool) -> JobParts:
    """Each plan's target (its sink's projection of its stream's wide columns) and row
    condition (its stream, the entries it takes, its ``where``, its dropped rows)."""
    parts = JobParts()
    index = {s.name: i for i, s in enumerate(spec.streams)}
    envelope = [(name, name) for name, _ in ENVELOPE]
    for plan in plans:
        i = index[plan.stream]
        decoded = [name for name, _ in spec.streams[i].columns]
        sink = plan.columns or tuple(spec.streams[i].columns)
        source = {name: f"{struct_column(i)}__{name}" for name in decoded}
        if plan.stage is not None:  # staged rows keep run positions in `_sequence`
            parts.staged.append(StageTarget(plan.stage, plan.stream, tuple(
                (source.get(name, ""), name, kind) for name, kind in sink)))
            columns = [(source[n], n) for n, _ in sink if n in source] + envelope
        else:  # table rows get the shard and the shard's own sequence
            assert plan.table is not None
            columns = [(source.get(name, ""), name) for name, _ in sink] + [
                (_LOCAL_COLUMN if name == "_sequence" else name, name)
                for name, _ in ENVELOPE]
            if SHARD_COLUMN[0] in plan.table.schema().column_names:
                columns.append((SHARD_COLUMN[0], SHARD_COLUMN[0]))
            parts.targets.append(TableTarget.of(plan.target, plan.table, columns))
            if plan.rewrites:  # an upsert: its affected files, rewritten
                parts.rewrites.append(_rewrite_of(plan, parts.targets))
        parts.wanted += [src for src, _ in columns if src and src not in parts.wanted]
        if plan.named is None:
            parts.terms.append((_term(plan, [plan], inline), F.lit(plan.target),
                                plan.stream))
    parts.terms += _named_terms([p for p in plans if p.named is not None], inline)
    return parts


def _term(plan: WritePlan, drops: Sequence[WritePlan], inline: bool) -> Any:
    """The condition of ``plan``'s rows: its stream, past its committed sequences, of its
    entries and its ``where``, none of the rows ``drops`` drop."""
    term = (F.col(STREAM) == plan.stream) & _past(plan.after)
    if plan.sequences is not None:
        term = term & F.col("_sequence").isin(list(plan.sequences))
    if plan.where is not None:
        term = term & F.col(plan.where)
    dropped = [row for p in drops for row in p.drop.to_pylist()]
    if inline and dropped:  # a literal list: no extra job
        term = term & ~F.col(ROW).isin(dropped)
    return term


def _named_terms(plans: Sequence[WritePlan], inline: bool) -> list[tuple[Any, Any, str]]:
    """One condition per group of a template's tables that share everything but the name
    (stream, committed sequences, entries, ``where``, staged or not): its rows naming one
    of the group's tables, each row's target its name. Why: a run may touch hundreds of
    tables, and one ``CASE`` per table would be evaluated on every row. A row names one
    table, so the group's dropped rows (by ``_row``) may be unioned."""
    groups: dict[Any, list[WritePlan]] = {}
    for plan in plans:
        key = (plan.stream, plan.named, tuple(sorted(plan.after.items())), plan.sequences,
               plan.where, plan.stage is None)
        groups.setdefault(key, []).append(plan)
    out = []
    for group in groups.values():
        first = group[0]
        assert first.named is not None
        names = F.col(first.named)
        term = _term(first, group, inline) & names.isin([p.target for p in group])
        out.append((term, names, first.stream))
    return out


def _save(frame: DataFrame, job: SinkJob
          ) -> tuple[list[DataFileRef], list[tuple[str, StagedFile]]]:
    """Run the write job; the files it wrote (from the receipt its driver-side
    ``commit()`` left). Files of a job that committed but whose call failed are deleted:
    nobody else owns them."""
    receipt = job.receipt
    try:
        frame.write.format(SINK_FORMAT).option("job", job.encode()).mode("append").save()
        return read_receipt(receipt)
    except BaseException:
        if os.path.exists(receipt):  # committed, yet the call failed: nobody owns them
            with contextlib.suppress(Exception):
                refs, stage_refs = read_receipt(receipt)
                delete_refs(job, refs)
                delete_staged(job, [f for _, f in stage_refs])
        raise
    finally:
        for path in (receipt, f"{receipt}.tmp"):
            if os.path.exists(path):
                os.unlink(path)


def _written(plans: Sequence[WritePlan], job: SinkJob, refs: list[DataFileRef],
             stage_refs: list[tuple[str, StagedFile]]) -> Written:
    """The job's files by plan target, each target's row count checked against its plan
    (a mismatch deletes every file of the job and raises)."""
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
            delete_refs(job, refs)
            delete_staged(job, [f for _, f in stage_refs])
            raise RuntimeError(f"cluster write of {plan.target} produced {got} rows, "
                               f"expected {plan.expected}")
    return out


def _with_wheres(frame: DataFrame, spec: RunSpec) -> DataFrame:
    """``frame`` with :func:`where_flags`' columns, computed on the executors."""
    schema = StructType([*frame.schema.fields, *[
        StructField(where_column(j), BooleanType(), nullable=False)
        for j in range(len(spec.wheres))], *[
        StructField(where_error_column(j), StringType(), nullable=True)
        for j in range(len(spec.wheres))]])

    def flags(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            yield where_flags(spec, batch)

    return frame.mapInArrow(flags, schema)


def _with_tables(frame: DataFrame, spec: RunSpec) -> DataFrame:
    """``frame`` with :func:`table_name_flags`' columns, computed on the executors."""
    schema = StructType([*frame.schema.fields, *[
        StructField(name, StringType(), nullable=True)
        for j in range(len(spec.tables)) for name in table_columns(j)]])

    def named(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            yield table_name_flags(spec, batch)

    return frame.mapInArrow(named, schema)


_DDL = {pa.int64(): "bigint", pa.string(): "string", pa.binary(): "binary"}


def _ddl(schema: pa.Schema) -> str:
    """A flat Arrow schema as the Spark DDL ``mapInArrow`` wants."""
    return ", ".join(f"`{f.name}` {_DDL[f.type]}" for f in schema)


def _past(after: dict[int, int]) -> Any:
    """A Spark condition: the row's position is past its shard's sequence in ``after``."""
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
    jvm = spark._jvm
    PySparkSession._get_j_spark_session_class(jvm).setActiveSession(spark._jsparkSession)


def register(spark: SparkSession) -> None:
    """Make ``icefloe-parquet`` available to ``df.write.format``."""
    spark.dataSource.register(ParquetSink)


def run_cluster(spark: SparkSession, spec: RunSpec, frame: DataFrame) -> ClusterRunOutput:
    """Persist the run on the executors, return its keys and dead letters.

    ``frame`` is the run in the wide schema with its ``sql`` columns
    (:func:`pipeline.load.run.read_frame`): the run module reads it, and builds this path
    on top of the one it shares with the embedded path, so this module needs nothing of it.
    """
    started = time.monotonic()
    frame = frame.withColumn(ROW, F.monotonically_increasing_id())
    if spec.wheres:  # routing by content: each sink's predicate, on the executors
        frame = _with_wheres(frame, spec)
    if spec.tables:  # tables named by the data: each template's verdict, on the executors
        frame = _with_tables(frame, spec)
    frame = frame.persist(StorageLevel.MEMORY_AND_DISK)
    out = ClusterRunOutput(spark, frame, spec)
    extra = _key_columns(spec)
    flags = [where_column(j) for j in range(len(spec.wheres))]
    failed = [where_error_column(j) for j in range(len(spec.wheres))]
    named = [name for j in range(len(spec.tables)) for name in table_columns(j)]
    try:
        keys = frame.select(STREAM, *KEY_COLUMNS, *extra, DEAD, *flags, *failed, *named
                            ).toArrow()
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
            mine += [name for j, t in enumerate(spec.tables) if t.stream == stream.name
                     for name in table_columns(j)]
            part = rows.select([*KEY_COLUMNS, *mine])
            for name in stream.keys:  # an upsert sink's key and tombstone columns
                wide = f"{struct_column(i)}__{name}"
                if wide in extra and name not in part.column_names:
                    part = part.append_column(name, rows.column(wide))
            out.keys[stream.name] = part.combine_chunks()
    out.wheres = {(w.stream, w.table): flags[j] for j, w in enumerate(spec.wheres)}
    out.where_errors = {(w.stream, w.table): failed[j] for j, w in enumerate(spec.wheres)}
    out.tables = {(t.stream, t.template): table_columns(j) for j, t in enumerate(spec.tables)}
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
