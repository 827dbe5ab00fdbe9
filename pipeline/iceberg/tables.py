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
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any

import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import (
    CommitFailedException,
    NamespaceAlreadyExistsError,
    NoSuchTableError,
    TableAlreadyExistsError,
)
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table, Transaction
from pyiceberg.table.sorting import (
    UNSORTED_SORT_ORDER,
    NullOrder,
    SortDirection,
    SortField,
    SortOrder,
)
from pyiceberg.table.update import (
    AddSortOrderUpdate,
    AssertDefaultSortOrderId,
    SetDefaultSortOrderUpdate,
    TableUpdate,
)
from pyiceberg.transforms import (
    BucketTransform,
    DayTransform,
    HourTransform,
    IdentityTransform,
    MonthTransform,
    Transform,
    TruncateTransform,
    YearTransform,
)
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
    TimestampType,
    TimestamptzType,
    TimeType,
    UUIDType,
)

from icefloe.config import StreamConfig
from icefloe.errors import CatalogError, IcefloeError, SchemaConflictError
from icefloe.streams.layout import (
    UUID_BOUNDS,
    UUID_BOUNDS_PROP,
    PartField,
    SortKey,
    partition_fields,
    sort_keys,
)
from icefloe.streams.typespec import TypeSpec, parse_type
from pipeline.columns import (
    DEAD_LETTER_COLUMNS,
    DEAD_LETTER_TABLE,
    ENVELOPE,
    SHARD_COLUMN,
    TIMESTAMP,
)
from pipeline.iceberg.evolution import promotable, shape
from pipeline.iceberg.field_numbers import numbers_property, remember_numbers, rename_by_numbers

log = logging.getLogger("icefloe.tables")

RETRIES_PROP = "commit.retry.num-retries"
MANAGED_PROP = "icefloe.managed"
"""Marks a table icefloe writes, so a collector taking over finds and fences it
(:mod:`pipeline.iceberg.fence`) even before anything was committed to it."""
TABLE_PROPERTIES: dict[str, str] = {RETRIES_PROP: "0", "format-version": "2",
                                    MANAGED_PROP: "true"}
PASSED_PROP = "icefloe.passed-properties"
"""The keys of ``table_properties`` icefloe last set, so a key dropped from the config is
removed from the table again (and keys set by other tools are left alone)."""
METRICS_COLUMN_PREFIX = "write.metadata.metrics.column."
"""Iceberg's per-column metrics mode (``none``, ``counts``, ``truncate(n)``, ``full``), which
pyiceberg's writers (every icefloe writer computes statistics through pyiceberg's
``compute_statistics_plan``) and Java's honour alike."""
_NO_BOUNDS = ("counts", "none")
_TIME_TRANSFORMS: dict[str, Transform[object, int]] = {
    "year": YearTransform(), "day": DayTransform(), "hour": HourTransform(),
    "month": MonthTransform(),
}
_FIELD_SUFFIX = {"bucket": "bucket", "truncate": "trunc"}
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
    "timestamp_ntz": TimestampType(),
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


def dead_letter_iceberg_schema() -> Schema:
    """The dead-letter table's schema: :data:`pipeline.columns.DEAD_LETTER_COLUMNS`."""
    named = [(name, _ADDED_TYPES[arrow]) for name, arrow in DEAD_LETTER_COLUMNS]
    named.insert(named.index(("sequence", LongType())) + 1, ("shard", IntegerType()))
    return _optional_schema(named)


def _optional_schema(named: list[tuple[str, IcebergType]]) -> Schema:
    return Schema(*(NestedField(i, name, kind, required=False)
                    for i, (name, kind) in enumerate(named, start=1)))


@dataclass(frozen=True)
class Layout:
    """What a table should look like beyond its columns: partition fields, sort order and
    the passed-through table properties."""

    partition: tuple[PartField, ...] = ()
    sort: tuple[SortKey, ...] = ()
    properties: Mapping[str, str] = dataclass_field(default_factory=dict)


def stream_layout(stream: StreamConfig) -> Layout:
    return Layout(tuple(partition_fields(stream)), tuple(sort_keys(stream)),
                  dict(stream.table_properties))


def ensure_stream_table(catalog: Catalog, stream: StreamConfig, *,
                        created: list[str] | None = None) -> Table:
    """The stream's table, created with its layout or evolved to match it (columns,
    partition spec, sort order, passed properties). When this call created the table, its
    name is appended to ``created`` (an admin task that fails later drops only what it
    created: :func:`drop_if_empty`)."""
    configured = {c.name: c.type for c in stream.columns}
    schema = table_iceberg_schema(stream)
    rename_by_numbers(catalog, stream, schema)  # a Protobuf stream's renamed fields, first
    table = _ensure(catalog, stream.table, schema, stream_layout(stream), configured, created,
                    born=numbers_property(stream))
    if stream.format == "protobuf":
        remember_numbers(catalog, stream)
        table = catalog.load_table(stream.table)
    return table


def drop_if_empty(catalog: Catalog, identifier: str) -> bool:
    """Drop ``identifier`` if no snapshot of it ever added a row; True if dropped.

    Why: an admin task creates a sink's table before the registry change, and a change
    refused at that last step (a racing sink declared a column differently) would leave an
    orphan that every collector start fences. Only an empty table goes: a fence snapshot
    adds nothing, a commit of rows keeps the table whatever happens to the sink.
    """
    try:
        table = catalog.load_table(identifier)
    except NoSuchTableError:
        return False
    for snapshot in table.snapshots():
        props = snapshot.summary.additional_properties if snapshot.summary else {}
        if int(props.get("added-records", 0)) or int(props.get("total-records", 0)):
            return False
    catalog.drop_table(identifier)
    log.info("dropped table %s (empty, created by a refused change)", identifier)
    return True


def ensure_dead_letter_table(catalog: Catalog) -> Table:
    """``icefloe.dead_letters``, partitioned by ``day(received_at)``."""
    return _ensure(catalog, DEAD_LETTER_TABLE, dead_letter_iceberg_schema(),
                   Layout((PartField("day", "received_at"),)), {})


def _ensure(catalog: Catalog, identifier: str, schema: Schema, layout: Layout,
            configured: Mapping[str, str], created: list[str] | None = None, *,
            born: Mapping[str, str] | None = None) -> Table:
    """Load-or-create, then evolve; catalog failures become :class:`CatalogError`.
    ``born``: properties a table created here gets in its creating commit (icefloe's
    own, not passed through)."""
    try:
        table = _load_or_create(catalog, identifier, schema, layout, created, born)
        table = _evolve(catalog, identifier, table, schema, configured)
        return _evolve_layout(catalog, identifier, table, layout)
    except IcefloeError:
        raise
    except Exception as exc:  # drivers raise their own trees; keep the cause chained
        raise CatalogError(f"cannot create or update table {identifier} in catalog "
                           f"{catalog.name!r}: {' '.join(str(exc).split())[:400]}") from exc


def _load_or_create(catalog: Catalog, identifier: str, schema: Schema, layout: Layout,
                    created: list[str] | None = None,
                    born: Mapping[str, str] | None = None) -> Table:
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
    spec = _spec(schema, layout.partition)
    properties = {**layout.properties, **TABLE_PROPERTIES}
    if layout.properties:
        properties[PASSED_PROP] = ",".join(sorted(layout.properties))
    properties.update(uuid_metrics_plan(identifier, schema, properties, layout.properties)[0])
    properties.update(born or {})
    try:
        table = catalog.create_table(identifier, schema, partition_spec=spec,
                                     sort_order=_sort_order(schema, layout.sort),
                                     properties=properties)
        log.info("created table %s partitioned by %s", identifier, _describe(spec, schema))
        if created is not None:
            created.append(identifier)
        return table
    except TableAlreadyExistsError:
        return catalog.load_table(identifier)


def iceberg_transform(part: PartField) -> Transform[Any, Any]:
    """The pyiceberg transform of a parsed partition field."""
    if part.transform == "identity":
        return IdentityTransform()
    if part.transform == "bucket":
        assert part.param is not None
        return BucketTransform(part.param)
    if part.transform == "truncate":
        assert part.param is not None
        return TruncateTransform(part.param)
    return _TIME_TRANSFORMS[part.transform]


def field_name(part: PartField) -> str:
    """Iceberg's usual partition field names: ``c`` (identity), ``c_day``, ``c_bucket``,
    ``c_trunc``."""
    if part.transform == "identity":
        return part.column
    return f"{part.column}_{_FIELD_SUFFIX.get(part.transform, part.transform)}"


def _spec(schema: Schema, fields: Sequence[PartField]) -> PartitionSpec:
    return PartitionSpec(*(PartitionField(source_id=schema.find_field(part.column).field_id,
                                          field_id=1000 + i, transform=iceberg_transform(part),
                                          name=field_name(part))
                           for i, part in enumerate(fields)))


def _sort_order(schema: Schema, keys: Sequence[SortKey]) -> SortOrder:
    if not keys:
        return UNSORTED_SORT_ORDER
    return SortOrder(*(SortField(source_id=schema.find_field(key.column).field_id,
                                 transform=IdentityTransform(),
                                 direction=SortDirection.DESC if key.descending
                                 else SortDirection.ASC,
                                 null_order=NullOrder.NULLS_FIRST if key.nulls_first
                                 else NullOrder.NULLS_LAST)
                       for key in keys))


def _describe(spec: PartitionSpec, schema: Schema) -> str:
    fields = [f"{f.transform}({schema.find_column_name(f.source_id)})" for f in spec.fields]
    return ", ".join(fields) or "nothing (unpartitioned)"


def _spec_shape(spec: PartitionSpec) -> list[tuple[int, str]]:
    return [(f.source_id, str(f.transform)) for f in spec.fields]


def _sort_shape(order: SortOrder) -> list[tuple[int, str, str, str]]:
    return [(f.source_id, str(f.transform), str(f.direction), str(f.null_order))
            for f in order.fields]


def _evolve_layout(catalog: Catalog, identifier: str, table: Table, layout: Layout
                   ) -> Table:
    """Evolve the partition spec, the sort order and the passed properties to ``layout``,
    in one commit. Why evolve rather than warn: Iceberg keeps every file under the spec it
    was written with, so readers see old and new files alike; only new files take the new
    layout. A lost race is re-planned on the reloaded table, as for columns."""
    for attempt in range(_EVOLVE_ATTEMPTS):
        schema = table.schema()
        spec_changes = _spec_shape(table.spec()) != _spec_shape(_spec(schema, layout.partition))
        wanted_order = _sort_order(schema, layout.sort)
        sort_changes = _sort_shape(table.sort_order()) != _sort_shape(wanted_order)
        set_props, drop_props = _property_plan(table.properties, layout.properties)
        after = {k: v for k, v in {**table.properties, **set_props}.items()
                 if k not in drop_props}
        set_uuid, drop_uuid = uuid_metrics_plan(identifier, schema, after, layout.properties)
        set_props.update(set_uuid)
        drop_props = [k for k in drop_props if k not in set_uuid] + drop_uuid
        if not (spec_changes or sort_changes or set_props or drop_props):
            return table
        try:
            with table.transaction() as tx:
                if set_props:
                    tx.set_properties(set_props)
                if drop_props:
                    tx.remove_properties(*drop_props)
                if spec_changes:
                    _update_spec(tx, table.spec(), schema, layout.partition)
                if sort_changes and not layout.sort:
                    _clear_sort_order(tx)
                elif sort_changes:
                    with tx.update_sort_order() as order:
                        for key in layout.sort:
                            nulls = NullOrder.NULLS_FIRST if key.nulls_first \
                                else NullOrder.NULLS_LAST
                            add = order.desc if key.descending else order.asc
                            add(key.column, IdentityTransform(), nulls)
        except CommitFailedException:
            if attempt == _EVOLVE_ATTEMPTS - 1:
                raise
            table = catalog.load_table(identifier)
            continue
        if spec_changes:
            log.warning("table %s: partition spec evolved from %s to %s (files written "
                        "before keep their spec)", identifier,
                        _describe(table.spec(), schema),
                        _describe(_spec(schema, layout.partition), schema))
        if sort_changes:
            log.info("table %s: sort order set to %s", identifier,
                     [f"{k.column} {'desc' if k.descending else 'asc'}" for k in layout.sort])
        return catalog.load_table(identifier)
    raise AssertionError("unreachable")


def _clear_sort_order(tx: Transaction) -> None:
    """Make the table unsorted again. Why by hand: pyiceberg's ``update_sort_order`` with
    no fields tries to add order 0 as "the last added" one and fails."""
    metadata = tx.table_metadata
    updates: tuple[TableUpdate, ...] = (SetDefaultSortOrderUpdate(sort_order_id=0),)
    if metadata.sort_order_by_id(0) is None:
        updates = (AddSortOrderUpdate(sort_order=UNSORTED_SORT_ORDER), *updates)
    tx._apply(updates, (AssertDefaultSortOrderId(
        default_sort_order_id=metadata.default_sort_order_id),))


def _update_spec(tx: Transaction, current: PartitionSpec, schema: Schema,
                 wanted: Sequence[PartField]) -> None:
    """Remove the fields no longer wanted, add the new ones (pyiceberg's ``update_spec``)."""
    want = {(schema.find_field(p.column).field_id, str(iceberg_transform(p))): p
            for p in wanted}
    have = {(f.source_id, str(f.transform)): f for f in current.fields}
    with tx.update_spec() as update:
        for key, existing in have.items():
            if key not in want:
                update.remove_field(existing.name)
        for key, part in want.items():
            if key not in have:
                update.add_field(part.column, iceberg_transform(part), field_name(part))


def _property_plan(have: Mapping[str, str], want: Mapping[str, str]
                   ) -> tuple[dict[str, str], list[str]]:
    """(properties to set, keys to remove): the configured ones, and those icefloe passed
    before that the config no longer has."""
    before = [k for k in have.get(PASSED_PROP, "").split(",") if k]
    drop = [k for k in before if k not in want and k in have]
    updates = {k: v for k, v in want.items() if have.get(k) != v}
    keys = ",".join(sorted(want))
    if keys != have.get(PASSED_PROP, "") and (keys or PASSED_PROP in have):
        if keys:
            updates[PASSED_PROP] = keys
        else:
            drop.append(PASSED_PROP)
    return updates, drop


def uuid_metrics_plan(identifier: str, schema: Schema, have: Mapping[str, str],
                      passed: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """(properties to set, keys to remove) so the table's top-level ``uuid`` columns get
    the metrics mode :data:`~icefloe.streams.layout.UUID_BOUNDS_PROP` asks for.

    ``omit`` (the default): ``write.metadata.metrics.column.<name> = counts`` (value and
    null counts, no min/max), unless already ``counts`` or ``none``. Why: Java Iceberg up to
    1.10 compares uuid bounds signed while the spec (and icefloe's writer) orders them
    unsigned, so Spark with Iceberg's runtime prunes the file holding ``uid = '...'``.
    pyiceberg already keeps nested fields (a uuid in a struct or list) to counts.
    ``write``: a ``counts`` found on a uuid column is removed, so the default (bounds)
    applies. A metrics key the stream's ``table_properties`` sets itself is left to it.
    ``have``: the table's properties as they will be (``passed``: the configured ones).
    """
    mode = have.get(UUID_BOUNDS_PROP, "omit")
    if mode not in UUID_BOUNDS:
        log.warning("table %s: %s = %r is not one of %s; uuid bounds are omitted",
                    identifier, UUID_BOUNDS_PROP, mode, ", ".join(UUID_BOUNDS))
        mode = "omit"
    updates: dict[str, str] = {}
    drop: list[str] = []
    for field in schema.fields:
        key = METRICS_COLUMN_PREFIX + field.name
        if not isinstance(field.field_type, UUIDType) or key in passed:
            continue
        if mode == "omit" and have.get(key) not in _NO_BOUNDS:
            updates[key] = "counts"
        elif mode == "write" and have.get(key) == "counts":
            drop.append(key)
    if updates or drop:
        log.info("table %s: uuid columns %s written %s min/max bounds (%s = %s)", identifier,
                 ", ".join(k.removeprefix(METRICS_COLUMN_PREFIX) for k in [*updates, *drop]),
                 "without" if mode == "omit" else "with", UUID_BOUNDS_PROP, mode)
    return updates, drop


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
        elif have == field.field_type or shape(have) == shape(field.field_type):
            continue
        elif promotable(have, field.field_type):
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
    return shape(kind)
