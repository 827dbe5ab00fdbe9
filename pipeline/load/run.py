"""Run the pipeline over a run of batch files: rows per stream table, plus dead letters.

Two engines, one result type. :func:`run_spark` reads the files through the ``icefloe``
Python data source (Spark workers fetch and decode) and collects Arrow on the driver — the
embedded output path, where the driver makes one append per table; packed
(:mod:`pipeline.load.packed`) when no stream has ``sql`` columns, as rows otherwise.
:func:`run_local` does the same decode in this process without Spark: the benchmark's
baseline and a tool for tests.
:class:`SparkClusterEngine` is the cluster output path: its result keeps the rows on the
executors, which write Parquet files the collector commits (see :mod:`pipeline.load.cluster`).
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import msgspec
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.columns import ARROW_TYPES, ENVELOPE, dead_letter_arrow_schema
from pipeline.load.decode import DeadLetters
from pipeline.load.fetch import decode_refs, open_run_store
from pipeline.load.frame import DEAD, FORMAT, STREAM, struct_column
from pipeline.load.mapped import fill_sql_safely, project_sql, sql_expressions, time_limit
from pipeline.load.packed import needs_rows, packed_partitions, unpack
from pipeline.load.spec import RunSpec

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from pipeline.load.cluster import ClusterRunOutput


@dataclass(slots=True)
class RunOutput:
    """``tables[stream]``: payload + envelope columns; ``dead``: dead-letter rows."""

    tables: dict[str, pa.Table] = field(default_factory=dict)
    dead: pa.Table = field(default_factory=lambda: dead_letter_arrow_schema().empty_table())
    sql_errors: dict[tuple[str, str], int] = field(default_factory=dict)
    """Rows whose ``sql`` value became null because its expression threw, by (stream,
    column); see :func:`pipeline.load.mapped.fill_sql_safely`."""

    @property
    def rows(self) -> int:
        return sum(t.num_rows for t in self.tables.values())


def read_frame(spark: SparkSession, spec: RunSpec, *, sql: bool = True) -> DataFrame:
    """The run as a Spark DataFrame in the wide schema (see :mod:`pipeline.load.frame`), with
    the ``sql`` mapping columns computed by Spark (:mod:`pipeline.load.mapped`), or left null
    (``sql=False``)."""
    frame = spark.read.format(FORMAT).option("spec", spec.encode()).load()
    return project_sql(frame, run_expressions(spec), max_value_bytes=spec.sql_max_value_bytes
                       ) if sql else frame


def run_expressions(spec: RunSpec) -> dict[str, str]:
    """Every ``sql`` column of the run, by wide-frame column name."""
    expressions: dict[str, str] = {}
    for i, stream in enumerate(spec.streams):
        expressions.update(sql_expressions(i, stream.name, [n for n, _ in stream.columns],
                                           stream.derived, f"{struct_column(i)}__", STREAM))
    return expressions


def read_rows_safely(spark: SparkSession, spec: RunSpec, *,
                     failed: Exception | None = None) -> RunOutput:
    """The row path: one Spark job; if it fails (or ``failed``: it already did, on the
    cluster path) and the run has ``sql`` columns, the rows again without them, then each
    ``sql`` column on its own, a row whose expression throws losing only its value (see
    :mod:`pipeline.load.mapped`). A failure without the ``sql`` columns is not theirs: the first
    error is raised (the run is retried). The first job and the per-column evaluation each
    get ``spec.sql_max_run_s``."""
    first = failed
    expressions = run_expressions(spec)
    if first is None:
        try:
            with time_limit(spark, spec.sql_max_run_s) if expressions else nullcontext():
                return split_wide(read_frame(spark, spec).toArrow(), spec)
        except Exception as exc:
            first = exc
    if not expressions:
        raise first
    try:
        base = read_frame(spark, spec, sql=False).toArrow()
    except Exception:
        raise first from None
    names = {f"{struct_column(i)}__{name}": (stream.name, name)
             for i, stream in enumerate(spec.streams) for name, _ in stream.columns}
    wide, errors = fill_sql_safely(spark, base, expressions,
                                   max_value_bytes=spec.sql_max_value_bytes,
                                   max_seconds=spec.sql_max_run_s,
                                   owners={c: names[c][0] for c in expressions})
    out = split_wide(wide, spec)
    out.sql_errors = {names[column]: count for column, count in errors.items()}
    return out


def packed_frame(spark: SparkSession, spec: RunSpec) -> DataFrame:
    """The run as packed rows (``_stream``, ``_part``; see :mod:`pipeline.load.packed`)."""
    return spark.read.format(FORMAT).option("spec", spec.encode()).option(
        "packed", "true").load()


def split_wide(wide: pa.Table, spec: RunSpec) -> RunOutput:
    """Split the wide Arrow result into per-stream tables and dead letters."""
    out = RunOutput()
    if wide.num_rows == 0:
        return out
    stream_col = wide.column(STREAM)
    for i, stream in enumerate(spec.streams):
        rows = wide.filter(pc.equal(stream_col, stream.name))
        if rows.num_rows == 0:
            continue
        names = [name for name, _ in stream.columns]
        arrays = [_declared(rows.column(f"{struct_column(i)}__{name}").combine_chunks(), kind)
                  for name, kind in stream.columns]
        arrays += [rows.column(name).combine_chunks() for name, _ in ENVELOPE]
        names += [name for name, _ in ENVELOPE]
        out.tables[stream.name] = pa.Table.from_arrays(arrays, names=names)
    dead_rows = wide.filter(pc.is_null(stream_col))
    if dead_rows.num_rows:
        out.dead = DeadLetters.decode_rows(dead_rows.column(DEAD).to_pylist()).to_arrow()
    return out


def _declared(column: pa.Array, kind: str) -> pa.Array:
    """A row-path column back in its declared Arrow type (Spark has no uuid and keeps
    times in nanoseconds: 16 bytes and ``time64[us]`` again)."""
    declared = ARROW_TYPES[kind]
    return column if column.type == declared else column.cast(declared)


def run_spark(spark: SparkSession, spec: RunSpec, *, packed: bool | None = None) -> RunOutput:
    """The run through Spark: packed (:mod:`pipeline.load.packed`) unless a stream has ``sql``
    columns, which need rows; ``packed`` forces one path (tests compare both).

    Raises:
        ValueError: ``packed=True`` for a run with ``sql`` columns (they would stay null).
    """
    rows_needed = needs_rows(spec)
    if packed and rows_needed:
        raise ValueError("a stream of this run has sql columns: only the row path "
                         "computes them")
    if not spec.batches:
        return RunOutput()
    if packed is False or rows_needed:
        return read_rows_safely(spark, spec)
    spec = msgspec.structs.replace(spec, partitions=packed_partitions(spec))
    tables, dead = unpack(packed_frame(spark, spec).toArrow(), spec)
    return RunOutput(tables, dead)


def run_local(spec: RunSpec) -> RunOutput:
    """Fetch and decode in this process (no Spark): same result as :func:`run_spark`,
    except for ``sql`` mapping columns, which need Spark (refused here)."""
    for stream in spec.streams:
        if any(d.kind == "sql" for d in stream.derived):
            raise ValueError(f"stream {stream.name!r} has sql mapping columns, which only the "
                             "Spark engine computes")
    schemas = {s.name: s.plan() for s in spec.streams}
    parts: dict[str, list[pa.Table]] = {}
    dead_parts: list[pa.Table] = []
    store = open_run_store(spec.store_url, spec.endpoint_url, spec.region)
    try:
        for _, decoded in decode_refs(store, spec.refs(), schemas):
            for name, table in decoded.tables.items():
                if table.num_rows:
                    parts.setdefault(name, []).append(table)
            if len(decoded.dead):
                dead_parts.append(decoded.dead.to_arrow())
    finally:
        store.close()
    out = RunOutput({s.name: pa.concat_tables(parts[s.name]) for s in spec.streams
                     if s.name in parts})  # the spec's stream order, as run_spark
    if dead_parts:
        out.dead = pa.concat_tables(dead_parts)
    return out





class SparkEngine:
    """Runs on Spark (``local[*]`` embedded, or a cluster master)."""

    name = "spark"

    def __init__(self, spark: SparkSession, partitions: int = 4, *,
                 rows: bool = False) -> None:
        self.spark = spark
        self.partitions = partitions
        self.rows = rows  # always the row path (benchmarks); else packed where possible

    def run(self, spec: RunSpec) -> RunOutput:
        return run_spark(self.spark, spec, packed=False if self.rows else None)

    def warm_up(self, spec: RunSpec) -> None:
        """Plan and run the data source once on no files, so the first real run does not
        pay for starting the Python workers (~5 s)."""
        empty = msgspec.structs.replace(spec, batches=())
        read_frame(self.spark, empty).count()
        if not needs_rows(spec):
            packed_frame(self.spark, empty).count()


class LocalEngine:
    """Decodes in the collector process; the baseline Spark is measured against."""

    name = "local"
    partitions = 1

    def run(self, spec: RunSpec) -> RunOutput:
        return run_local(spec)


class SparkClusterEngine:
    """Runs on Spark and keeps the rows on the executors (the cluster output path).

    ``run`` returns a :class:`pipeline.load.cluster.ClusterRunOutput`: only event ids, sequences
    and dead letters reach the driver; the collector has the executors write Parquet files
    and commits them with one ``add_files`` per table (see :mod:`pipeline.load.cluster`).
    """

    name = "spark-cluster"

    def __init__(self, spark: SparkSession, partitions: int = 4) -> None:
        from pipeline.load.cluster import register  # lazy: pyspark

        self.spark = spark
        self.partitions = partitions
        self.embedded = SparkEngine(spark, partitions)
        register(spark)

    def run(self, spec: RunSpec) -> ClusterRunOutput | RunOutput:
        """The run kept on the executors; if its job fails and the run has ``sql``
        columns, the embedded shape instead, whose row path costs a throwing expression
        only the values it cannot compute (see :func:`read_rows_safely`)."""
        from pipeline.load.cluster import ClusterRunOutput, run_cluster  # lazy: pyspark

        if not spec.batches:
            return ClusterRunOutput()
        try:
            with time_limit(self.spark, spec.sql_max_run_s) if run_expressions(spec) \
                    else nullcontext():
                return run_cluster(self.spark, spec, read_frame(self.spark, spec))
        except Exception as exc:
            if not run_expressions(spec):
                raise
            return read_rows_safely(self.spark, spec, failed=exc)

    def run_embedded(self, spec: RunSpec) -> RunOutput:
        """The run in the embedded shape, on the same session: for runs the cluster path
        cannot write in one shot (fan-out, staging; the collector decides)."""
        return self.embedded.run(spec)
