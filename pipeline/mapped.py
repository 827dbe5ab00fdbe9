"""The pipeline's half of column mappings: ``ip``, ``header``, ``datetime``, ``id`` and ``sql``.

Why two steps: ``ip``/``header`` values ride in each record's envelope meta and
``datetime``/``id`` are envelope fields, so the decode (in the Spark workers, one Arrow pass
per batch file) turns them into columns next to the payload's. ``sql`` columns are computed
by Spark itself over the decoded columns (:func:`project_sql`), so any Spark SQL function
works and the expression is compiled once per run, not interpreted per row in Python.
``path`` and ``body`` columns were already filled by the ingestor (see
:mod:`icefloe.ingest_mappings`) and arrive as ordinary payload fields.

Why ANSI mode is off while the expressions are built: with it, one row whose ``CAST`` or
division fails aborts the whole Spark job, so the collector would retry the same run
forever and block the queue. Without it such a value becomes null, which the README
documents; Spark fixes the mode of each expression when it is parsed.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson

from icefloe.config import Column, StreamConfig
from icefloe.errors import ConfigError
from icefloe.ingest_mappings import META_HEADERS, META_IP
from icefloe.mappings import ENVELOPE_COLUMNS, spark_sql
from pipeline.schema import ARROW_TYPES, TIMESTAMP

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from pipeline.spec import StreamSpec

DERIVED_KINDS = ("ip", "header", "datetime", "id", "sql")
_SPARK_TYPES = {"string": "STRING", "long": "BIGINT", "int": "INT", "float": "FLOAT",
                "double": "DOUBLE", "boolean": "BOOLEAN", "timestamp": "TIMESTAMP",
                "date": "DATE", "json": "STRING"}


class Derived(msgspec.Struct, frozen=True):
    """A column the pipeline fills (not read from the payload): its mapping, as plain data.

    ``arg`` is the lower-case header name of a ``header`` mapping, the SQL of a ``sql``.
    """

    column: str
    type: str
    kind: str
    arg: str = ""
    dialect: str = "spark"


def derived_columns(stream: StreamConfig) -> tuple[Derived, ...]:
    out: list[Derived] = []
    for column in stream.columns:
        kind = column.mapping
        if kind not in DERIVED_KINDS:
            continue
        arg = (column.header or "").lower() if kind == "header" else column.sql or ""
        out.append(Derived(column.name, column.type, kind, arg, column.dialect))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class StreamPlan:
    """What the decode needs for one stream: the payload schema and the derived columns,
    and the order of the table's columns."""

    payload: pa.Schema
    derived: tuple[Derived, ...]
    order: tuple[str, ...]


def _meta_schema(derived: Sequence[Derived]) -> pa.Schema:
    headers = sorted({d.arg for d in derived if d.kind == "header"})
    fields = [pa.field(META_IP, pa.string())]
    if headers:
        fields.append(pa.field(META_HEADERS, pa.struct([pa.field(h, pa.string())
                                                          for h in headers])))
    return pa.schema(fields)


def _meta_table(metas: Sequence[bytes] | pa.Array | None, rows: int,
                derived: Sequence[Derived]) -> pa.Table | None:
    """The metas parsed in one columnar pass (records without meta give nulls)."""
    if not any(d.kind in ("ip", "header") for d in derived):
        return None
    schema = _meta_schema(derived)
    if metas is None:
        return schema.empty_table() if rows == 0 else pa.table(
            {f.name: pa.nulls(rows, f.type) for f in schema}, schema=schema)
    # All events of a request share one meta: parse each distinct meta once, then gather.
    encoded = (metas if isinstance(metas, pa.Array) else pa.array(metas, pa.binary())
               ).dictionary_encode()
    distinct = encoded.dictionary.to_pylist()
    ndjson = b"\n".join(m or b"{}" for m in distinct) + b"\n"
    parsed = pajson.read_json(
        io.BytesIO(ndjson),
        read_options=pajson.ReadOptions(use_threads=False, block_size=max(len(ndjson), 1 << 16)),
        parse_options=pajson.ParseOptions(explicit_schema=schema,
                                          unexpected_field_behavior="ignore"))
    return parsed.take(encoded.indices)


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
        if d.kind == "ip":
            value = meta.column(META_IP)  # type: ignore[union-attr]
        elif d.kind == "header":
            value = pc.struct_field(meta.column(META_HEADERS), d.arg)  # type: ignore[union-attr]
        elif d.kind == "id":
            value = event_ids if isinstance(event_ids, pa.Array) else pa.array(event_ids,
                                                                                pa.string())
        elif d.kind == "datetime":
            value = received if d.type == "long" else \
                pc.multiply(received, 1000).cast(TIMESTAMP).cast(kind)
        else:
            value = pa.nulls(rows, kind)
        columns[d.column] = value
    return pa.table({name: columns[name] for name in plan.order})



def sql_expressions(index: int, stream: str, columns: Sequence[str],
                    derived: Sequence[Derived], prefix: str, stream_column: str
                    ) -> dict[str, str]:
    """Spark SQL for each ``sql`` column of stream ``index`` in the wide frame: its column
    references renamed to the frame's ``<prefix><name>`` columns, cast to the column type,
    and only evaluated on the stream's own rows."""
    rename = {name: f"{prefix}{name}" for name in columns}
    rename.update({name: name for name in ENVELOPE_COLUMNS})
    quoted = stream.replace("'", "\\'")
    out: dict[str, str] = {}
    for d in derived:
        if d.kind != "sql":
            continue
        column = Column(d.column, d.type, sql=d.arg, dialect=d.dialect)
        body = spark_sql(column, rename)
        out[f"{prefix}{d.column}"] = (f"CASE WHEN `{stream_column}` = '{quoted}' THEN "
                                      f"CAST(({body}) AS {_SPARK_TYPES[d.type]}) END")
    return out


def project_sql(frame: DataFrame, expressions: dict[str, str]) -> DataFrame:
    """Replace the wide frame's ``sql`` columns with their Spark expressions (ANSI off
    while they are parsed: a failing cast gives null instead of failing the run)."""
    if not expressions:
        return frame
    from pyspark.sql import functions as F

    spark = frame.sparkSession
    key = "spark.sql.ansi.enabled"
    previous = spark.conf.get(key)
    spark.conf.set(key, "false")
    try:
        return frame.withColumns({name: F.expr(sql) for name, sql in expressions.items()})
    finally:
        spark.conf.set(key, previous)


def check_on_spark(spark: SparkSession, streams: Sequence[StreamSpec]) -> None:
    """Compile every ``sql`` mapping on Spark at start-up, one column at a time, so an
    unknown function or a type error names its stream and column instead of failing the
    first run (and every retry) later. Analysis only: no job runs."""
    from pyspark.sql.pandas.types import from_arrow_schema

    from pipeline.query import spark_error
    from pipeline.source import STREAM, struct_column, wide_arrow_schema

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
