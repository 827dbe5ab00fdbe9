"""Create or evolve the Iceberg tables icefloe writes: one per stream, plus the dead letters.

Why evolve on start instead of failing: a stream's columns change over time, and Iceberg
can absorb the safe changes without rewriting data — new optional columns (old rows read
back as null) and the widenings int→long and float→double. Everything else (string→long,
long→int, ...) would make existing files unreadable with the new type, so it is refused with
a :class:`SchemaConflictError` before anything is changed. Columns dropped from the config
stay in the table: dropping would hide data other readers may still query.

Why ``commit.retry.num-retries=0`` is enforced on every start: pyiceberg otherwise retries a
rejected commit on top of the newer snapshot, so a stale collector would append its batch a
second time (see DESIGN.md pitfalls). An existing table without it is fixed and logged.

Several processes may call these functions at once (ingestors, a collector and its standby):
"already exists" and lost schema commits are resolved by loading what the winner created.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping

import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import (
    CommitFailedException,
    NamespaceAlreadyExistsError,
    NoSuchTableError,
    TableAlreadyExistsError,
)
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC, PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.transforms import DayTransform, HourTransform, MonthTransform, Transform
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    TimestamptzType,
    TimeType,
    UUIDType,
)

from icefloe.config import StreamConfig
from icefloe.errors import CatalogError, IcefloeError, SchemaConflictError
from icefloe.streams.typespec import TypeSpec, parse_type
from pipeline.columns import (
    DEAD_LETTER_COLUMNS,
    DEAD_LETTER_TABLE,
    ENVELOPE,
    SHARD_COLUMN,
    TIMESTAMP,
)

log = logging.getLogger("icefloe.tables")

RETRIES_PROP = "commit.retry.num-retries"
MANAGED_PROP = "icefloe.managed"
"""Marks a table icefloe writes, so a collector taking over finds and fences it
(:mod:`pipeline.iceberg.fence`) even before anything was committed to it."""
TABLE_PROPERTIES: dict[str, str] = {RETRIES_PROP: "0", "format-version": "2",
                                    MANAGED_PROP: "true"}
_TRANSFORMS: dict[str, Transform[object, int]] = {
    "day": DayTransform(), "hour": HourTransform(), "month": MonthTransform(),
}
_PROMOTIONS = {(IntegerType(), LongType()), (FloatType(), DoubleType())}
_EVOLVE_ATTEMPTS = 5

ICEBERG_TYPES: dict[str, IcebergType] = {
    "string": StringType(), "long": LongType(), "int": IntegerType(), "float": FloatType(),
    "double": DoubleType(), "boolean": BooleanType(), "timestamp": TimestamptzType(),
    "date": DateType(), "json": StringType(),
}
"""Each column type of the config as Iceberg stores it (the Arrow side:
:data:`pipeline.columns.ARROW_TYPES`)."""
_NATIVE_ICEBERG: dict[str, IcebergType] = {
    "uuid": UUIDType(), "binary": BinaryType(), "time": TimeType(),
}
"""The flat native types; decimals and nested types are built by :func:`iceberg_type`."""
_ADDED_TYPES: dict[pa.DataType, IcebergType] = {
    pa.string(): StringType(), pa.int64(): LongType(), pa.binary(): BinaryType(),
    TIMESTAMP: TimestamptzType(), pa.int32(): IntegerType(),
}
"""The Arrow types of the columns icefloe adds (:mod:`pipeline.columns`) in Iceberg."""


def table_iceberg_schema(stream: StreamConfig) -> Schema:
    """The Iceberg schema a new stream table is created with (field ids 1..n): the
    declared columns, then the envelope columns of :data:`pipeline.columns.ENVELOPE`.
    Every column is optional: ``required`` is enforced by the ingestor, and optional
    columns keep later schema evolution (adding columns) always legal."""
    ids = iter(range(10_000, 1_000_000))
    named = [(c.name, ICEBERG_TYPES.get(c.type) or iceberg_type(c.type, ids))
             for c in stream.columns]
    named += [(name, _ADDED_TYPES[arrow]) for name, arrow in ENVELOPE]
    named.insert(named.index(("_sequence", LongType())) + 1,
                 (SHARD_COLUMN[0], _ADDED_TYPES[SHARD_COLUMN[1]]))
    return _optional_schema(named)


def iceberg_type(kind: str, ids: Iterator[int] | None = None) -> IcebergType:
    """A column type string as Iceberg stores it. Nested fields take ids from ``ids``
    (10,000 up by default): placeholders only, unique within one schema, because creating
    a table or adding a column assigns fresh ids."""
    return _spec_iceberg(parse_type(kind), ids or iter(range(10_000, 1_000_000)))


def _spec_iceberg(spec: TypeSpec, ids: Iterator[int]) -> IcebergType:
    if spec.name == "decimal":
        return DecimalType(spec.precision, spec.scale)
    if spec.name == "list":
        assert spec.element is not None
        return ListType(next(ids), _spec_iceberg(spec.element, ids), element_required=False)
    if spec.name == "map":
        assert spec.element is not None
        key_id, value_id = next(ids), next(ids)
        return MapType(key_id, StringType(), value_id, _spec_iceberg(spec.element, ids),
                       value_required=False)
    if spec.name == "struct":
        return StructType(*(NestedField(next(ids), name, _spec_iceberg(kind, ids),
                                        required=False) for name, kind in spec.fields))
    return _NATIVE_ICEBERG.get(spec.name) or ICEBERG_TYPES[spec.name]


def _shape(kind: IcebergType) -> str:
    """A type without its field ids (two schemas' nested fields never share ids)."""
    if isinstance(kind, ListType):
        return f"list<{_shape(kind.element_type)}>"
    if isinstance(kind, MapType):
        return f"map<{_shape(kind.key_type)},{_shape(kind.value_type)}>"
    if isinstance(kind, StructType):
        return "struct<" + ",".join(f"{f.name}:{_shape(f.field_type)}"
                                    for f in kind.fields) + ">"
    return str(kind)


def _promotable(have: IcebergType, want: IcebergType) -> bool:
    """Iceberg's legal top-level promotions: int→long, float→double, and a decimal's
    precision widening at the same scale."""
    if (have, want) in _PROMOTIONS:
        return True
    return isinstance(have, DecimalType) and isinstance(want, DecimalType) and \
        have.scale == want.scale and want.precision > have.precision


def dead_letter_iceberg_schema() -> Schema:
    """The dead-letter table's schema: :data:`pipeline.columns.DEAD_LETTER_COLUMNS`."""
    named = [(name, _ADDED_TYPES[arrow]) for name, arrow in DEAD_LETTER_COLUMNS]
    named.insert(named.index(("sequence", LongType())) + 1, ("shard", IntegerType()))
    return _optional_schema(named)


def _optional_schema(named: list[tuple[str, IcebergType]]) -> Schema:
    return Schema(*(NestedField(i, name, kind, required=False)
                    for i, (name, kind) in enumerate(named, start=1)))


def ensure_stream_table(catalog: Catalog, stream: StreamConfig) -> Table:
    """The stream's table, created (partitioned by ``stream.partition``) or evolved to match."""
    configured = {c.name: c.type for c in stream.columns}
    return _ensure(catalog, stream.table, table_iceberg_schema(stream), "_received_at",
                   stream.partition, configured)


def ensure_dead_letter_table(catalog: Catalog) -> Table:
    """``icefloe.dead_letters``, partitioned by ``day(received_at)``."""
    return _ensure(catalog, DEAD_LETTER_TABLE, dead_letter_iceberg_schema(), "received_at",
                   "day", {})


def _ensure(catalog: Catalog, identifier: str, schema: Schema, column: str, partition: str,
            configured: Mapping[str, str]) -> Table:
    """Load-or-create, then evolve; catalog failures become :class:`CatalogError`."""
    spec = _spec(schema, column, partition)
    try:
        table = _load_or_create(catalog, identifier, schema, spec)
        _warn_partition_change(identifier, table, spec, schema)
        return _evolve(catalog, identifier, table, schema, configured)
    except IcefloeError:
        raise
    except Exception as exc:  # drivers raise their own trees; keep the cause chained
        raise CatalogError(f"cannot create or update table {identifier} in catalog "
                           f"{catalog.name!r}: {' '.join(str(exc).split())[:400]}") from exc


def _load_or_create(catalog: Catalog, identifier: str, schema: Schema, spec: PartitionSpec
                    ) -> Table:
    try:
        return catalog.load_table(identifier)
    except NoSuchTableError:
        pass
    namespace = identifier.split(".", 1)[0]
    try:
        catalog.create_namespace(namespace)
        log.info("created namespace %s", namespace)
    except NamespaceAlreadyExistsError:
        pass
    except Exception:
        # The SQL catalog checks then inserts: a racing creator surfaces as a raw
        # IntegrityError. If the namespace exists now, the race is harmless.
        if not catalog.namespace_exists(namespace):
            raise
    try:
        table = catalog.create_table(identifier, schema, partition_spec=spec,
                                     properties=TABLE_PROPERTIES)
        log.info("created table %s partitioned by %s", identifier, _describe(spec, schema))
        return table
    except TableAlreadyExistsError:
        return catalog.load_table(identifier)


def _spec(schema: Schema, column: str, partition: str) -> PartitionSpec:
    if partition == "none":
        return UNPARTITIONED_PARTITION_SPEC
    source = schema.find_field(column)
    return PartitionSpec(PartitionField(source_id=source.field_id, field_id=1000,
                                        transform=_TRANSFORMS[partition],
                                        name=f"{column}_{partition}"))


def _describe(spec: PartitionSpec, schema: Schema) -> str:
    fields = [f"{f.transform}({schema.find_column_name(f.source_id)})" for f in spec.fields]
    return ", ".join(fields) or "nothing (unpartitioned)"


def _warn_partition_change(identifier: str, table: Table, spec: PartitionSpec,
                           schema: Schema) -> None:
    """Partition evolution is not automatic (it splits the layout for every reader): warn."""
    have, want = _describe(table.spec(), table.schema()), _describe(spec, schema)
    if have != want:
        log.warning("table %s is partitioned by %s but the config asks for %s; leaving it "
                    "(change the partitioning with an Iceberg tool if intended)",
                    identifier, have, want)


def _evolve(catalog: Catalog, identifier: str, table: Table, schema: Schema,
            configured: Mapping[str, str]) -> Table:
    """Add missing columns, widen promotable ones, pin the retry property and the
    ``icefloe.managed`` mark: one commit.

    A concurrent evolver may win the commit (retries are 0); then the plan is recomputed on
    the reloaded table, where it is usually empty.
    """
    for attempt in range(_EVOLVE_ATTEMPTS):
        adds, widen = _plan(identifier, table.schema(), schema, configured)
        retries = table.properties.get(RETRIES_PROP)
        fix_retries = retries != "0"
        mark = table.properties.get(MANAGED_PROP) != "true"
        if not (adds or widen or fix_retries or mark):
            return table
        try:
            with table.transaction() as tx:
                if fix_retries or mark:
                    tx.set_properties({RETRIES_PROP: "0", MANAGED_PROP: "true"})
                if adds or widen:
                    with tx.update_schema() as update:
                        for name, kind in widen:
                            update.update_column(name, field_type=kind)
                        for name, kind in adds:
                            update.add_column(name, kind, required=False)
        except CommitFailedException:
            if attempt == _EVOLVE_ATTEMPTS - 1:
                raise
            table = catalog.load_table(identifier)
            continue
        if fix_retries:
            log.warning("table %s had %s=%s; set it to 0 (a retried commit could duplicate "
                        "rows)", identifier, RETRIES_PROP, retries)
        for name, kind in widen:
            log.info("table %s: widened column %s to %s", identifier, name, kind)
        for name, kind in adds:
            log.info("table %s: added column %s %s", identifier, name, kind)
        return catalog.load_table(identifier)
    raise AssertionError("unreachable")


def _plan(identifier: str, current: Schema, wanted: Schema, configured: Mapping[str, str]
          ) -> tuple[list[tuple[str, IcebergType]], list[tuple[str, IcebergType]]]:
    """(columns to add, columns to widen); raises on the first change Iceberg cannot make."""
    existing = {field.name: field.field_type for field in current.fields}
    adds: list[tuple[str, IcebergType]] = []
    widen: list[tuple[str, IcebergType]] = []
    for field in wanted.fields:
        have = existing.get(field.name)
        if have is None:
            adds.append((field.name, field.field_type))
        elif have == field.field_type or _shape(have) == _shape(field.field_type):
            continue
        elif _promotable(have, field.field_type):
            widen.append((field.name, field.field_type))
        else:
            table_type = _type_name(have)
            wanted_type = configured.get(field.name, _type_name(field.field_type))
            raise SchemaConflictError(
                f"table {identifier}: column {field.name!r} is {table_type} in the table but "
                f"configured as {wanted_type}; Iceberg can only widen int→long, "
                f"float→double and a decimal's precision (same scale). Set the column's "
                f"type back to {table_type!r} in the config, "
                "or give the new data a new column name (the old column stays in the table)")
    return adds, widen


def _type_name(kind: IcebergType) -> str:
    """Iceberg type in icefloe's config vocabulary (``timestamptz`` → ``timestamp``)."""
    for name, iceberg in (*ICEBERG_TYPES.items(), *_NATIVE_ICEBERG.items()):
        if iceberg == kind:
            return name
    if isinstance(kind, DecimalType):
        return f"decimal({kind.precision},{kind.scale})"
    return _shape(kind)
