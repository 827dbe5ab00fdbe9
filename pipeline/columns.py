"""Stream columns → Arrow schemas, and the columns icefloe adds to every table.

Why one place, below both halves of the pipeline: the Python data source must yield Arrow
batches whose schema *equals* what Spark derives from its declared schema,
``pyarrow.json.read_json`` needs the same schema to parse canonical payloads in one
columnar pass, and the Iceberg table (:mod:`pipeline.iceberg.tables`, which maps these same
columns to Iceberg types) must accept the result without casts. If any of the three
drifted, a run would fail at its first batch — or worse, silently coerce. This module needs
only pyarrow, so the Iceberg side can share it without knowing the loading side.
"""

from __future__ import annotations

from collections.abc import Iterable

import pyarrow as pa

from icefloe.config import StreamConfig
from icefloe.streams.typespec import TypeSpec, parse_type

TIMESTAMP = pa.timestamp("us", tz="UTC")

_FLAT_ARROW: dict[str, pa.DataType] = {
    "string": pa.string(), "long": pa.int64(), "int": pa.int32(), "float": pa.float32(),
    "double": pa.float64(), "boolean": pa.bool_(), "timestamp": TIMESTAMP,
    "date": pa.date32(), "json": pa.string(), "uuid": pa.binary(16), "binary": pa.binary(),
    "time": pa.time64("us"), "timestamp_ntz": pa.timestamp("us"),
}
UUID = pa.binary(16)
"""``uuid`` in Arrow: 16 bytes, which pyiceberg writes as Iceberg's ``uuid`` (Parquet
``UUID`` logical type); Spark and pyiceberg's scans show it as 16 bytes / ``arrow.uuid``."""


def arrow_type(kind: str) -> pa.DataType:
    """The Arrow type of a column type string (flat, native or nested)."""
    return _spec_arrow(parse_type(kind))


def _spec_arrow(spec: TypeSpec) -> pa.DataType:
    if spec.name == "decimal":
        return pa.decimal128(spec.precision, spec.scale)
    if spec.name == "list":
        assert spec.element is not None
        return pa.list_(pa.field("element", _spec_arrow(spec.element)))
    if spec.name == "map":
        assert spec.element is not None
        return pa.map_(pa.string(), _spec_arrow(spec.element))
    if spec.name == "struct":
        return pa.struct([pa.field(name, _spec_arrow(kind)) for name, kind in spec.fields])
    return _FLAT_ARROW[spec.name]


class _ArrowTypes(dict[str, pa.DataType]):
    """Column type string → Arrow type; parameterized and nested types are parsed on first
    use (every caller looks types up by their config string)."""

    def __missing__(self, kind: str) -> pa.DataType:
        arrow = self[kind] = arrow_type(kind)
        return arrow


ARROW_TYPES: dict[str, pa.DataType] = _ArrowTypes(_FLAT_ARROW)

ENVELOPE: tuple[tuple[str, pa.DataType], ...] = (
    ("_event_id", pa.string()),
    ("_received_at", TIMESTAMP),
    ("_sequence", pa.int64()),
)
"""The envelope columns icefloe adds to every stream table, after the declared ones."""

SHARD_COLUMN = ("_shard", pa.int32())
"""The manifest shard of a row's entry, next to ``_sequence`` in every stream table (and
``shard`` next to ``sequence`` in the dead letters): ``(_shard, _sequence)`` identifies
the entry. The pipeline does not produce it: inside a run ``_sequence`` carries the whole
position, and the commit splits it (:func:`pipeline.iceberg.commit.with_shard_column`).
Rows written before shards existed read it as null, which means shard 0."""

DEAD_LETTER_TABLE = "icefloe.dead_letters"
DEAD_LETTER_COLUMNS: tuple[tuple[str, pa.DataType], ...] = (
    ("stream", pa.string()),
    ("sequence", pa.int64()),
    ("location", pa.string()),
    ("record_index", pa.int64()),
    ("event_id", pa.string()),
    ("reason", pa.string()),
    ("message", pa.string()),
    ("raw", pa.binary()),
    ("received_at", TIMESTAMP),
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
    fields += [pa.field(name, arrow) for name, arrow in ENVELOPE]
    return pa.schema(fields)


def dead_letter_arrow_schema() -> pa.Schema:
    return pa.schema([pa.field(name, arrow) for name, arrow in DEAD_LETTER_COLUMNS])
