"""The pipeline's half of column mappings: ``ip``, ``header``, ``datetime``, ``id``, ``sql``
and the ``kafka_*`` sources.

Why two steps: ``ip``/``header``/``kafka_*`` values ride in each record's envelope meta and
``datetime``/``id`` are envelope fields, so the decode (in the Spark workers, one Arrow pass
per batch file) turns them into columns next to the payload's. ``sql`` columns are computed
by Spark itself over the decoded columns (:func:`project_sql`), so any allow-listed Spark
SQL function (:mod:`icefloe.streams.sql_functions`) works and the expression is compiled once per
run, not interpreted per row in Python.
``path`` and ``body`` columns were already filled by the ingestor (see
:mod:`ingestor.mappings`) and arrive as ordinary payload fields.

Why ANSI mode is off while the expressions are built: with it, one row whose ``CAST`` or
division fails aborts the whole Spark job, so the collector would retry the same run
forever and block the queue. Without it such a value becomes null, which the README
documents; Spark fixes the mode of each expression when it is parsed.

ANSI off does not catch everything: an allow-listed function can still throw on some row
(``element_at(a, 0)``, ``regexp_extract`` with a pattern read from the data, ``from_json``
in ``FAILFAST`` mode). So a run whose Spark job fails is retried *once* without its ``sql``
columns (:func:`fill_sql_safely`): if that fails too, the failure was not the mappings' and
the run fails as before (retried with backoff). If it succeeds, each ``sql`` column is
evaluated on its own over the decoded rows; a column that fails is bisected over row
ranges until the failing rows are isolated, and only they get null, counted per stream and
column (``icefloe_collector_sql_errors_total``). Bisection is bounded (:data:`MAX_PROBES`
evaluations per column per run): past the bound, every row of a range still failing gets
null (counted too) — an expression that fails on most rows costs its values, never the run.

Which rows a ``sql`` column is computed for: only rows of entries whose registry version
routes them to a sink declaring that column with that expression (``Derived.cases``, set
by the collector from the entries' versions). A deleted sink's expression never runs on
events accepted after the deletion, and a re-created sink's new expression never runs on
events accepted before it.

Resource limits (#36), so that one mapping's appetite costs its own values, never the run or
the other tables: a string value larger than ``collector.sql_max_value_bytes`` is an error of
its row (checked by Spark in a second projection, so the expression is computed once); a run
whose ``sql`` mappings take longer than ``collector.sql_max_run_s`` has its Spark job
cancelled (:func:`time_limit`), and the per-column evaluation gets the same budget again,
past which the values still missing are null (counted). A task that runs out of memory fails
its job instead of ending the JVM (``spark.executor.killOnFatalError.depth`` = 0, see
:mod:`pipeline.spark`), so it takes the same path. What no limit here can stop: a single
row whose evaluation the JVM cannot interrupt (a catastrophic regular expression) keeps its
task slot busy after the cancel until it ends.
"""

from __future__ import annotations

import io
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson

from icefloe.config import Column
from icefloe.errors import ConfigError
from icefloe.streams.mappings import (
    ENVELOPE_COLUMNS,
    KAFKA_SOURCES,
    META_ALL_HEADERS,
    META_HEADERS,
    META_IP,
    META_KAFKA,
    spark_sql,
)
from icefloe.streams.templates import TemplateRows
from icefloe.streams.templates import evaluate as evaluate_template
from pipeline.columns import ARROW_TYPES, TIMESTAMP
from pipeline.load.frame import STREAM, struct_column, wide_arrow_schema
from pipeline.load.kafka_meta import KAFKA_META_TYPE, kafka_column
from pipeline.load.spec import Derived, SqlCase, StreamPlan, StreamSpec
from pipeline.read.query import spark_error

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

log = logging.getLogger("icefloe.pipeline")

MAX_PROBES = 64
"""Spark evaluations one failing ``sql`` column may cost per run while its failing rows are
isolated (see the module doc)."""
ROW_ID = "__icefloe_row"
_SPARK_TYPES = {"string": "STRING", "long": "BIGINT", "int": "INT", "float": "FLOAT",
                "double": "DOUBLE", "boolean": "BOOLEAN", "timestamp": "TIMESTAMP",
                "date": "DATE", "json": "STRING"}


_META_KINDS = ("ip", "header", "headers", "template", *KAFKA_SOURCES)
"""Derived kinds read from the envelope meta."""


def _meta_schema(derived: Sequence[Derived]) -> pa.Schema:
    headers = sorted({d.arg for d in derived if d.kind == "header"})
    fields = [pa.field(META_IP, pa.string())]
    if any(d.kind in ("headers", "template") for d in derived):
        fields.append(pa.field(META_ALL_HEADERS, pa.string()))
    if headers:
        fields.append(pa.field(META_HEADERS, pa.struct([pa.field(h, pa.string())
                                                          for h in headers])))
    if any(d.kind in KAFKA_SOURCES for d in derived):
        fields.append(pa.field(META_KAFKA, KAFKA_META_TYPE))
    return pa.schema(fields)


def _meta_table(metas: Sequence[bytes] | pa.Array | None, rows: int,
                derived: Sequence[Derived]) -> pa.Table | None:
    """The metas parsed in one columnar pass (records without meta give nulls)."""
    if not any(d.kind in _META_KINDS for d in derived):
        return None
    schema = _meta_schema(derived)
    if metas is None:
        return schema.empty_table() if rows == 0 else pa.table(
            {f.name: pa.nulls(rows, f.type) for f in schema}, schema=schema)
    # All events of a request share one meta: parse each distinct meta once, then gather.
    # Not with Kafka columns: each Kafka record has its own meta (its offset), so hashing
    # the metas to find the distinct ones would cost more than it saves.
    array = metas if isinstance(metas, pa.Array) else pa.array(metas, pa.binary())
    encoded = None if any(d.kind in KAFKA_SOURCES for d in derived) else \
        array.dictionary_encode()
    distinct = (array if encoded is None else encoded.dictionary).to_pylist()
    ndjson = b"\n".join(m or b"{}" for m in distinct) + b"\n"
    parsed = pajson.read_json(
        io.BytesIO(ndjson),
        read_options=pajson.ReadOptions(use_threads=False, block_size=max(len(ndjson), 1 << 16)),
        parse_options=pajson.ParseOptions(explicit_schema=schema,
                                          unexpected_field_behavior="ignore"))
    return parsed if encoded is None else parsed.take(encoded.indices)


def add_derived(payload: pa.Table, plan: StreamPlan, event_ids: Sequence[str] | pa.Array,
                received_ms: Sequence[int] | np.ndarray,
                metas: Sequence[bytes] | pa.Array | None) -> pa.Table:
    """``payload`` plus every derived column (``sql`` ones null until Spark fills them),
    in the table's column order."""
    if not plan.derived:
        return payload
    rows = payload.num_rows
    meta = _meta_table(metas, rows, plan.derived)
    received = pa.array(received_ms, pa.int64())
    columns = dict(zip(payload.column_names, payload.columns, strict=True))
    for d in plan.derived:
        kind = ARROW_TYPES[d.type]
        # (meta: _meta_table gives a table whenever a column reads the request's meta)
        if d.kind == "ip":
            value = meta.column(META_IP)  # type: ignore[union-attr]
        elif d.kind == "headers":
            value = meta.column(META_ALL_HEADERS)  # type: ignore[union-attr]
        elif d.kind == "header":
            value = pc.struct_field(meta.column(META_HEADERS), d.arg)  # type: ignore[union-attr]
        elif d.kind == "id":
            value = event_ids if isinstance(event_ids, pa.Array) else pa.array(event_ids,
                                                                                pa.string())
        elif d.kind == "datetime":
            value = received if d.type == "long" else \
                pc.multiply(received, 1000).cast(TIMESTAMP).cast(kind)
        elif d.kind in KAFKA_SOURCES:
            value = kafka_column(meta.column(META_KAFKA),  # type: ignore[union-attr]
                                 d.kind, d.type, d.column)
        elif d.kind == "template":
            continue  # the event's JSON text, until apply_templates replaces it
        else:
            value = pa.nulls(rows, kind)
        columns[d.column] = value
    return pa.table({name: columns[name] for name in plan.order})



def apply_templates(table: pa.Table, plan: StreamPlan, received_ms: Sequence[int] | np.ndarray,
                    metas: Sequence[bytes] | pa.Array | None, sequence: int
                    ) -> tuple[pa.Table, dict[int, tuple[str, str]]]:
    """``table`` (the rows of entry ``sequence``) with each ``template`` column's value
    computed from the event's JSON text (in that column) and request data, with the
    Jsonnet of the registry version the entry was accepted under
    (:meth:`Derived.template_for`; null when that version declares none), and
    ``{row: (column, reason)}`` for the rows whose template failed (their values are left
    as they were; the caller dead-letters them)."""
    templates = [d for d in plan.derived if d.kind == "template"]
    if not templates or table.num_rows == 0:
        return table, {}
    meta = _meta_table(metas, table.num_rows, plan.derived)
    ips = meta.column(META_IP).to_pylist() if meta is not None else [None] * table.num_rows
    headers = meta.column(META_ALL_HEADERS).to_pylist() if meta is not None else \
        [None] * table.num_rows
    received = list(received_ms.tolist() if isinstance(received_ms, np.ndarray)
                    else received_ms)
    failed: dict[int, tuple[str, str]] = {}
    for d in templates:
        position = table.column_names.index(d.column)
        content = d.template_for(sequence)
        if content is None:
            values: list[str | None] = [None] * table.num_rows
        else:
            rows = TemplateRows(table.column(position).to_pylist(), ips, headers, received)
            values, errors = evaluate_template(content, rows)
            for row, reason in errors.items():
                failed.setdefault(row, (d.column, reason))
        table = table.set_column(position, table.schema.field(position),
                                 pa.array(values, ARROW_TYPES[d.type]))
    return table, failed


def sequence_ranges(sequences: Sequence[int]) -> tuple[tuple[int, int], ...]:
    """Sorted sequences folded into inclusive ``(first, last)`` ranges."""
    out: list[tuple[int, int]] = []
    for seq in sorted(set(sequences)):
        if out and out[-1][1] == seq - 1:
            out[-1] = (out[-1][0], seq)
        else:
            out.append((seq, seq))
    return tuple(out)


def _spark_body(column: str, sql: str, dialect: str, type_: str,
                rename: dict[str, str]) -> str | None:
    """One expression as Spark SQL over the wide frame, cast to the column type; None when
    the allow-list refuses it (a registry written before the check: never run)."""
    try:
        body = spark_sql(Column(column, type_, sql=sql, dialect=dialect), rename)
    except ValueError as exc:
        log.warning("sql column %s is not run (null): %s", column, exc,
                    extra={"column": column})
        return None
    return f"CAST(({body}) AS {_SPARK_TYPES[type_]})"


def _in_ranges(ranges: Sequence[tuple[int, int]]) -> str:
    return " OR ".join(f"`_sequence` = {a}" if a == b else f"`_sequence` BETWEEN {a} AND {b}"
                       for a, b in ranges)


def sql_expressions(index: int, stream: str, columns: Sequence[str],
                    derived: Sequence[Derived], prefix: str, stream_column: str
                    ) -> dict[str, str]:
    """Spark SQL for each ``sql`` column of stream ``index`` in the wide frame: its column
    references renamed to the frame's ``<prefix><name>`` columns, cast to the column type,
    and only evaluated on the stream's own rows (and, with ``cases``, only on the rows of
    the entries each expression applies to)."""
    rename = {name: f"{prefix}{name}" for name in columns}
    rename.update({name: name for name in ENVELOPE_COLUMNS})
    quoted = stream.replace("\\", "\\\\").replace("'", "\\'")
    own = f"`{stream_column}` = '{quoted}'"
    out: dict[str, str] = {}
    for d in derived:
        if d.kind != "sql":
            continue
        whens: list[str] = []
        cases = d.cases if d.cases is not None else (SqlCase(d.arg, d.dialect, ()),)
        for case in cases:
            body = _spark_body(d.column, case.sql, case.dialect, d.type, rename)
            if body is None or (d.cases is not None and not case.ranges):
                continue
            guard = own if d.cases is None else f"{own} AND ({_in_ranges(case.ranges)})"
            whens.append(f"WHEN {guard} THEN {body}")
        out[f"{prefix}{d.column}"] = (f"CASE {' '.join(whens)} END" if whens else
                                      f"CAST(NULL AS {_SPARK_TYPES[d.type]})")
    return out


def project_sql(frame: DataFrame, expressions: dict[str, str], *,
                max_value_bytes: int | None = None) -> DataFrame:
    """Replace the wide frame's ``sql`` columns with their Spark expressions (ANSI off
    while they are parsed: a failing cast gives null instead of failing the run); with
    ``max_value_bytes``, a larger string value raises on its row (see the module doc)."""
    if not expressions:
        return frame
    from pyspark.sql import functions as F  # lazy: pyspark
    from pyspark.sql.types import BinaryType, StringType  # lazy: pyspark

    spark = frame.sparkSession
    key = "spark.sql.ansi.enabled"
    previous = spark.conf.get(key)
    spark.conf.set(key, "false")
    try:
        out = frame.withColumns({name: F.expr(sql) for name, sql in expressions.items()})
        if max_value_bytes is None:
            return out
        # A second projection: Spark does not merge it into the first (that would compute
        # each expression twice), so the size check reads the value already computed.
        types = {f.name: f.dataType for f in out.schema.fields}
        return out.withColumns({
            name: F.expr(f"CASE WHEN octet_length(`{name}`) > {max_value_bytes} THEN "
                         f"raise_error('sql value of {name} is larger than {max_value_bytes} "
                         f"bytes (collector.sql_max_value_bytes)') ELSE `{name}` END")
            for name in expressions if isinstance(types[name], (StringType, BinaryType))})
    finally:
        if previous is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, previous)


@contextmanager
def time_limit(spark: SparkSession, seconds: float) -> Iterator[None]:
    """Cancel the Spark jobs started while the block runs once ``seconds`` pass (they then
    raise in the caller). Why by job id and not a job group: a group is a thread-local
    property of the JVM thread that serves the call, which is not reliably the one that
    runs the job (measured: in a long-lived session the job ran without the group and the
    cancel found nothing). Jobs already running when the block starts are never touched;
    the collector runs one Spark step at a time, so the jobs started meanwhile are its own.
    Why cancel again and again: a cancel reaches only jobs already submitted, and the block
    may submit its job after the deadline (planning, the first Python worker)."""
    context = spark.sparkContext
    tracker = context.statusTracker()
    before = set(tracker.getActiveJobsIds())
    done = threading.Event()

    def cancel() -> None:
        if done.wait(max(seconds, 0.0)):
            return
        while not done.is_set():
            for job in tracker.getActiveJobsIds():
                if job not in before:
                    context._jsc.sc().cancelJob(job)
            done.wait(_CANCEL_EVERY_S)

    canceller = threading.Thread(target=cancel, name="icefloe-sql-time-limit", daemon=True)
    canceller.start()
    try:
        yield
    finally:
        done.set()
        canceller.join()


_CANCEL_EVERY_S = 0.05


SqlErrors = dict[str, int]
"""Rows whose ``sql`` value was lost to a runtime failure, by wide-frame column name."""


def fill_sql_safely(spark: SparkSession, base: pa.Table, expressions: dict[str, str],
                    *, max_probes: int = MAX_PROBES, max_value_bytes: int | None = None,
                    max_seconds: float = float("inf"),
                    clock: Callable[[], float] = time.monotonic,
                    owners: dict[str, str] | None = None) -> tuple[pa.Table, SqlErrors]:
    """``base`` (the wide rows, ``sql`` columns still null) with each ``sql`` column computed
    on its own; rows where it fails, or that ``max_seconds`` (all columns together) leaves
    uncomputed, get null and are counted (see the module doc). ``owners`` names each
    column's stream: only its rows are counted (the others' values are null anyway)."""
    from pyspark.sql.pandas.types import from_arrow_schema  # lazy: pyspark

    rows = base.append_column(ROW_ID, pa.array(range(base.num_rows), pa.int64()))
    schema = from_arrow_schema(rows.schema, prefer_timestamp_ntz=False)
    errors: SqlErrors = {}
    budget = _Budget(clock, max_seconds)
    with _as_jobs(spark):
        evaluated = {name: _evaluate_column(spark, rows, schema, name, sql, max_probes,
                                            max_value_bytes, budget)
                     for name, sql in expressions.items()}
    for name, (values, missed) in evaluated.items():
        owner = (owners or {}).get(name)
        if owner is not None and STREAM in base.column_names:
            missed = pc.and_(missed, pc.fill_null(pc.equal(base.column(STREAM), owner), False))
        failed = pc.sum(missed.cast(pa.int64())).as_py() or 0
        if failed:
            errors[name] = failed
            log.warning("sql column %s failed on %d rows of this run: they get null", name,
                        failed, extra={"column": name, "rows": failed})
        base = base.set_column(base.schema.get_field_index(name), name,
                               values.cast(base.schema.field(name).type))
    if budget.spent:
        log.warning("the sql mappings of this run passed collector.sql_max_run_s (%.1f s): "
                    "the values not computed by then are null", max_seconds,
                    extra={"seconds": max_seconds})
    if errors:
        _check_session(spark)
    return base, errors


_LOCAL_RELATION = "org.apache.spark.sql.catalyst.optimizer.ConvertToLocalRelation"


@contextmanager
def _as_jobs(spark: SparkSession) -> Iterator[None]:
    """Keep Spark from computing a projection over rows it was handed while it optimizes
    the plan (on the driver, outside any job: no time limit could cancel it); measured:
    the probes of a slow mapping ran to the end past a 0.05 s budget."""
    key = "spark.sql.optimizer.excludedRules"
    previous = spark.conf.get(key, "") or ""
    spark.conf.set(key, ",".join(filter(None, (previous, _LOCAL_RELATION))))
    try:
        yield
    finally:
        if previous:
            spark.conf.set(key, previous)
        else:
            spark.conf.unset(key)


class _Budget:
    """The evaluation time left to a run's per-column ``sql`` evaluation."""

    def __init__(self, clock: Callable[[], float], seconds: float) -> None:
        self.clock = clock
        self.deadline = clock() + seconds
        self.spent = False

    def left(self) -> float:
        left = self.deadline - self.clock()
        if left <= 0:
            self.spent = True
        return left


def _check_session(spark: SparkSession) -> None:
    """Raise if Spark itself is failing: then the probes failed for Spark's sake, not the
    expressions', and nulling their rows would lose values a retry computes."""
    try:
        spark.range(1).collect()
    except Exception as exc:
        raise RuntimeError(f"Spark failed while isolating failing sql rows: {exc}") from exc


def _evaluate_column(spark: SparkSession, rows: pa.Table, schema: StructType, name: str,
                     sql: str, max_probes: int, max_value_bytes: int | None,
                     budget: _Budget) -> tuple[pa.Array, pa.Array]:
    """The column's values over ``rows`` (null where evaluation fails) and which rows
    failed: evaluate a range, and split a failing one in halves while probes and time
    remain."""
    values: list[pa.Table] = []
    pending = [(0, rows.num_rows)]
    probes = 0
    while pending:
        start, stop = pending.pop()
        part = rows.slice(start, stop - start)
        left = budget.left()
        if probes >= max_probes or left <= 0:
            continue
        probes += 1
        try:
            frame = spark.createDataFrame(part, schema=schema)
            with time_limit(spark, left) if left != float("inf") else nullcontext():
                got = project_sql(frame, {name: sql}, max_value_bytes=max_value_bytes
                                  ).select(ROW_ID, name).toArrow()
        except Exception:  # the expression threw on some row of this range, or timed out
            if stop - start > 1:
                middle = (start + stop) // 2
                pending += [(middle, stop), (start, middle)]
            continue
        values.append(got)
    field = rows.schema.field(name)
    done = pa.concat_tables([v.cast(pa.schema([pa.field(ROW_ID, pa.int64()), field]))
                             for v in values]) if values else None
    out = pa.nulls(rows.num_rows, field.type)
    filled = np.full(rows.num_rows, -1, dtype=np.int64)
    if done is not None and done.num_rows:
        positions = done.column(ROW_ID).to_numpy()
        filled[positions] = np.arange(done.num_rows)
        taken = done.column(name).combine_chunks().take(
            pa.array(np.where(filled >= 0, filled, 0)))
        out = pc.if_else(pa.array(filled >= 0), taken, out)
    return out, pa.array(filled < 0)


def check_on_spark(spark: SparkSession, streams: Sequence[StreamSpec]) -> None:
    """Compile every ``sql`` mapping on Spark at start-up, one column at a time, so an
    unknown function or a type error names its stream and column instead of failing the
    first run (and every retry) later. Analysis only: no job runs."""
    from pyspark.sql.pandas.types import from_arrow_schema  # lazy: pyspark

    schema = from_arrow_schema(wide_arrow_schema(tuple(streams)), prefer_timestamp_ntz=False)
    empty = spark.createDataFrame([], schema)
    for i, stream in enumerate(streams):
        names = [name for name, _ in stream.columns]
        for d in stream.derived:
            if d.kind != "sql":
                continue
            one = sql_expressions(i, stream.name, names, (d,), f"{struct_column(i)}__", STREAM)
            try:
                project_sql(empty, one)
            except Exception as exc:  # AnalysisException, ParseException
                raise ConfigError(f"stream {stream.name!r}, column {d.column!r}: sql "
                                  f"{d.arg!r} does not compile on Spark: "
                                  f"{spark_error(exc, {})}") from None
