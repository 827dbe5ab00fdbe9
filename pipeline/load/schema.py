"""Stream columns → Arrow and Iceberg schemas, the one mapping every part of the pipeline uses.

Why one place: the Python data source must yield Arrow batches whose schema *equals* what
Spark derives from its declared schema, ``pyarrow.json.read_json`` needs the same schema to
parse canonical payloads in one columnar pass, and the Iceberg table must accept the result
without casts. If any of the three drifted, a run would fail at its first batch — or worse,
silently coerce. Every column is optional in Iceberg: ``required`` is enforced by the
ingestor, and optional columns keep later schema evolution (adding columns) always legal.
"""

from __future__ import annotations

from collections.abc import Iterable

import pyarrow as pa
from pyiceberg.schema import Schema
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    LongType,
    NestedField,
    StringType,
    TimestamptzType,
)

from icefloe.config import StreamConfig

TIMESTAMP = pa.timestamp("us", tz="UTC")

ARROW_TYPES: dict[str, pa.DataType] = {
    "string": pa.string(), "long": pa.int64(), "int": pa.int32(), "float": pa.float32(),
    "double": pa.float64(), "boolean": pa.bool_(), "timestamp": TIMESTAMP,
    "date": pa.date32(), "json": pa.string(),
}
ICEBERG_TYPES: dict[str, IcebergType] = {
    "string": StringType(), "long": LongType(), "int": IntegerType(), "float": FloatType(),
    "double": DoubleType(), "boolean": BooleanType(), "timestamp": TimestamptzType(),
    "date": DateType(), "json": StringType(),
}

# Columns icefloe adds to every stream table, after the declared ones.
META_FIELDS: tuple[tuple[str, pa.DataType, IcebergType], ...] = (
    ("_event_id", pa.string(), StringType()),
    ("_received_at", TIMESTAMP, TimestamptzType()),
    ("_sequence", pa.int64(), LongType()),
)

DEAD_LETTER_TABLE = "icefloe.dead_letters"
DEAD_LETTER_FIELDS: tuple[tuple[str, pa.DataType, IcebergType], ...] = (
    ("stream", pa.string(), StringType()),
    ("sequence", pa.int64(), LongType()),
    ("location", pa.string(), StringType()),
    ("record_index", pa.int64(), LongType()),
    ("event_id", pa.string(), StringType()),
    ("reason", pa.string(), StringType()),
    ("message", pa.string(), StringType()),
    ("raw", pa.binary(), BinaryType()),
    ("received_at", TIMESTAMP, TimestamptzType()),
)


def payload_schema(stream: StreamConfig) -> pa.Schema:
    """The declared columns only: what ``read_json`` parses a canonical payload into."""
    return pa.schema([pa.field(c.name, ARROW_TYPES[c.type]) for c in stream.columns])


def table_arrow_schema(stream: StreamConfig) -> pa.Schema:
    """Declared columns + ``_event_id``, ``_received_at``, ``_sequence``: one table row."""
    return columns_arrow_schema((c.name, c.type) for c in stream.columns)


def columns_arrow_schema(columns: Iterable[tuple[str, str]]) -> pa.Schema:
    """:func:`table_arrow_schema` from ``(name, icefloe type)`` pairs (a ``StreamSpec``'s)."""
    fields = [pa.field(name, ARROW_TYPES[kind]) for name, kind in columns]
    fields += [pa.field(name, arrow) for name, arrow, _ in META_FIELDS]
    return pa.schema(fields)


def table_iceberg_schema(stream: StreamConfig) -> Schema:
    """The Iceberg schema a new stream table is created with (field ids 1..n)."""
    named = [(c.name, ICEBERG_TYPES[c.type]) for c in stream.columns]
    named += [(name, iceberg) for name, _, iceberg in META_FIELDS]
    return Schema(*(NestedField(i, name, kind, required=False)
                    for i, (name, kind) in enumerate(named, start=1)))


def dead_letter_arrow_schema() -> pa.Schema:
    return pa.schema([pa.field(name, arrow) for name, arrow, _ in DEAD_LETTER_FIELDS])


def dead_letter_iceberg_schema() -> Schema:
    return Schema(*(NestedField(i, name, kind, required=False)
                    for i, (name, _, kind) in enumerate(DEAD_LETTER_FIELDS, start=1)))
