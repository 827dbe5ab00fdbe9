"""A Protobuf stream's table keeps each field's column by the field's *number* (#39).

Why: Protobuf identifies a field by its number, so renaming ``amount_cents`` to
``total_cents`` (same number) in the ``.proto`` is the same field, and its column must
stay the same column — at every nesting level — or old rows would read as null under the
new name and the old name would linger as a dead column. Iceberg identifies a column by
its field id, which the catalog assigns (unique per table, nested fields included), so
icefloe cannot make a field number *be* a field id. Instead the table remembers, in the
property :data:`FIELDS_PROP`, which column path each field-number path (``"4.1"``: field 1
of the message in field 4) was last written under. When the type changes, a number path
whose column path changed is a rename: applied with Iceberg's rename, which keeps the
field id, before any new column is added and before data of the new type is written.
A number path that is gone keeps its column (nullable from then on); a new one adds a
column through the ordinary evolution.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping

import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.types import IcebergType, ListType, MapType, NestedField, StructType

from icefloe.errors import SchemaConflictError
from icefloe.streams.model import StreamConfig
from icefloe.typed.kinds import protobuf_kind
from icefloe.typed.protobuf import ProtobufType, encoding_change
from pipeline.iceberg.errors import load_table_or_none
from pipeline.iceberg.evolution import promotable

FIELDS_PROP = "icefloe.protobuf.field-numbers"
"""Table property: JSON object, field-number path → dotted column path."""
TYPES_PROP = "icefloe.protobuf.field-types"
"""Table property: JSON object, field-number path → the field's ``.proto`` value type
(``int32``, ``sint64``...) as last written. Why: a column's type does not show a field's
encoding (``int32`` and ``sint32`` both fill an ``int`` column), so without it a new
descriptor that changes only the encoding would be taken, and every payload still queued or
sent by an old producer would be read as another value (see
:func:`icefloe.typed.protobuf.encoding_change`). Tables made before it have none: their
first evolution records it."""

log = logging.getLogger("icefloe.tables")


def _kind(stream: StreamConfig) -> ProtobufType | None:
    if stream.format != "protobuf" or stream.schema is None:
        return None
    schema = stream.schema
    return protobuf_kind(schema.text, schema.message or "", schema.enums)


def number_paths(stream: StreamConfig) -> dict[str, str] | None:
    """A Protobuf stream's field-number paths and their column paths (None: not Protobuf)."""
    kind = _kind(stream)
    return None if kind is None else dict(kind.number_paths())


def numbers_property(stream: StreamConfig) -> dict[str, str]:
    """The property a Protobuf stream's table is *created* with (empty: not Protobuf).

    Why at creation, in the creating commit: a table whose numbers were recorded only by a
    later commit (:func:`remember_numbers`) and whose collector died in between holds
    columns no recorded number names, so the next rename in the ``.proto`` would not be
    seen as one: the renamed top-level field would get a new column beside the old one
    (its values split across two names), and a renamed nested field would be refused as a
    struct change, parking the table for good (the simulator's ``protobuf-rename`` family
    found it: a crash at ``before_remember``)."""
    kind = _kind(stream)
    return {} if kind is None else _props(kind)


def _props(kind: ProtobufType) -> dict[str, str]:
    """The properties that remember ``kind``'s field numbers and their types."""
    return {FIELDS_PROP: json.dumps(kind.number_paths(), sort_keys=True),
            TYPES_PROP: json.dumps(kind.number_types(), sort_keys=True)}


def rename_by_numbers(catalog: Catalog, stream: StreamConfig, target: Schema) -> None:
    """Before the table evolves to ``stream``'s columns: rename the columns whose field
    number the table already holds under another name (see the module doc). Only a field
    whose own name changed is renamed (a child follows its renamed parent by itself); all
    paths are the table's current ones, as one schema update takes them."""
    kind = _kind(stream)
    if kind is None:
        return
    table = load_table_or_none(catalog, stream.table)
    if table is None:
        return
    stored = _stored(table)
    schema = table.schema()
    _refuse_reused_numbers(stream, schema, target, stored, kind.number_paths())
    _refuse_encoding_changes(stream, _stored(table, TYPES_PROP), kind)
    renames = kind.renames_from(stored)
    if not renames:
        return
    with table.transaction() as tx:
        with tx.update_schema() as update:
            for old, new in renames:
                update.rename_column(iceberg_path(schema, old), new.rsplit(".", 1)[-1])
        tx.set_properties(_props(kind))
    for old, new in renames:
        log.info("table %s: renamed column %s to %s (same Protobuf field number)",
                 stream.table, old, new)


def _refuse_reused_numbers(stream: StreamConfig, schema: Schema, target: Schema,
                           stored: Mapping[str, str], now: Mapping[str, str]) -> None:
    """Before anything changes: a field number the table holds whose new type its column
    cannot take (Protobuf's rule broken: a number reused with another type) refuses the
    change, naming the field, its number and both types — never a rename half done."""
    for number, old in stored.items():
        new = now.get(number)
        if new is None:
            continue
        try:
            have = schema.find_field(".".join(iceberg_path(schema, old))).field_type
            want = target.find_field(".".join(iceberg_path(target, new))).field_type
        except (KeyError, ValueError):
            continue  # not in one of them (a column kept or added): evolution decides
        if not _takes(have, want):
            raise SchemaConflictError(
                f"table {stream.table}: Protobuf field {new} (number path {number}, column "
                f"{old}) is {have} in the table but {want} in the new descriptor: a field "
                "number reused with another type; give the new field a new number (the old "
                "column stays)")


def _refuse_encoding_changes(stream: StreamConfig, stored: Mapping[str, str],
                             kind: ProtobufType) -> None:
    """Before anything changes: a field number whose ``.proto`` type changed to another
    encoding (see :data:`TYPES_PROP`) refuses the change, naming the field, its number and
    both types."""
    paths = kind.number_paths()
    for number, new in kind.number_types().items():
        old = stored.get(number)
        why = encoding_change(old, new) if old is not None else ""
        if why:
            raise SchemaConflictError(
                f"table {stream.table}: Protobuf field {paths[number]} (number path "
                f"{number}) was {old} and is {new} in the new descriptor: {why}; give the "
                "new field a new number (the old column stays)")


def _takes(have: IcebergType, want: IcebergType) -> bool:
    """Whether a column of type ``have`` can hold a field now of type ``want`` (the same
    type, a promotion; a struct's own fields are judged by their own numbers)."""
    if isinstance(have, StructType) and isinstance(want, StructType):
        return True
    if isinstance(have, ListType) and isinstance(want, ListType):
        return _takes(have.element_type, want.element_type)
    if isinstance(have, MapType) and isinstance(want, MapType):
        return _takes(have.key_type, want.key_type) and _takes(have.value_type,
                                                               want.value_type)
    return have == want or promotable(have, want)


def remember_numbers(catalog: Catalog, stream: StreamConfig) -> None:
    """After the table evolved: record the field-number paths its columns now hold."""
    kind = _kind(stream)
    if kind is None:
        return
    table = catalog.load_table(stream.table)
    if _stored(table) != kind.number_paths() \
            or _stored(table, TYPES_PROP) != kind.number_types():
        table.transaction().set_properties(_props(kind)).commit_transaction()


def _stored(table: Table, prop: str = FIELDS_PROP) -> Mapping[str, str]:
    text = table.properties.get(prop)
    if not text:
        return {}
    value = json.loads(text)
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}


def iceberg_path(schema: Schema, dotted: str) -> tuple[str, ...]:
    """A dotted column path (``items.sku``) as Iceberg names it, stepping into a list's
    ``element`` and a map's ``value`` on the way (``items.element.sku``)."""
    path: list[str] = []
    kind: IcebergType = schema.as_struct()
    for name in dotted.split("."):
        while True:
            if isinstance(kind, ListType):
                path.append("element")
                kind = kind.element_type
            elif isinstance(kind, MapType):
                path.append("value")
                kind = kind.value_type
            else:
                break
        found = kind.field_by_name(name) if isinstance(kind, StructType) else None
        if found is None:
            raise KeyError(f"the table has no column {dotted!r} (at {name!r})")
        path.append(name)
        kind = found.field_type
    return tuple(path)


def rows_under_current_names(table: Table, rows: pa.Table) -> pa.Table:
    """``rows`` written under an older schema of ``table`` (staged before a Protobuf rename
    by field number, imported after it), with every column and nested field under the
    name the same Iceberg field has now.

    Why: staged rows wait in files under the names they were decoded with; a rename that
    lands meanwhile keeps each field's id but not its name, and an import by name would
    refuse the old names for good (the table parked, its rows never landing — the
    simulator's ``protobuf-rename`` family found it). The rows' schema is the newest of
    the table's schemas that holds every one of their column paths; each field is then
    found by its id in the current schema. Columns no schema holds (the envelope's) and
    rows that already fit are left as they are."""
    current = table.schema()
    if _fits(current.as_struct(), rows.schema):
        return rows
    for old in sorted(table.metadata.schemas, key=lambda s: s.schema_id, reverse=True):
        if old.schema_id == current.schema_id or not _fits(old.as_struct(), rows.schema):
            continue
        columns, fields = [], []
        for name, column in zip(rows.column_names, rows.columns, strict=True):
            was = old.as_struct().field_by_name(name)
            now = _by_id(current, was.field_id) if was is not None else None
            if was is None or now is None:  # an envelope column, or a field since dropped
                columns.append(column)
                fields.append(rows.schema.field(name))
                continue
            column = pa.chunked_array([_renamed(chunk, was.field_type, current)
                                       for chunk in column.chunks])
            columns.append(column)
            fields.append(pa.field(now.name, column.type,
                                   nullable=rows.schema.field(name).nullable))
        return pa.Table.from_arrays(columns, schema=pa.schema(fields))
    return rows


def _by_id(schema: Schema, field_id: int) -> NestedField | None:
    try:
        return schema.find_field(field_id)
    except ValueError:
        return None


def _fits(struct: StructType, arrow: pa.Schema | pa.StructType) -> bool:
    """Whether every table column among ``arrow``'s fields (``_``-prefixed envelope
    columns aside) is in ``struct`` under the same name, nested fields included."""
    for field in arrow:
        found = struct.field_by_name(field.name)
        if found is None:
            if field.name.startswith("_"):
                continue
            return False
        if not _fits_type(found.field_type, field.type):
            return False
    return True


def _fits_type(kind: IcebergType, arrow: pa.DataType) -> bool:
    if isinstance(kind, StructType) and pa.types.is_struct(arrow):
        for i in range(arrow.num_fields):
            found = kind.field_by_name(arrow.field(i).name)
            if found is None or not _fits_type(found.field_type, arrow.field(i).type):
                return False
        return True
    if isinstance(kind, ListType) and (pa.types.is_list(arrow) or pa.types.is_large_list(arrow)):
        return _fits_type(kind.element_type, arrow.value_type)
    if isinstance(kind, MapType) and pa.types.is_map(arrow):
        return _fits_type(kind.value_type, arrow.item_type)
    return True


def _renamed(array: pa.Array, kind: IcebergType, current: Schema) -> pa.Array:
    """``array`` (the rows' values of a field that was ``kind``) with each nested field
    under its current name (found by field id in ``current``). Rebuilt, not cast: Arrow
    casts structs by field name, which would null a renamed field's values."""
    if isinstance(kind, (ListType, MapType)) and array.offset:
        array = pa.concat_arrays([array])  # offsets from zero: a validity mask is taken
    if isinstance(kind, StructType) and isinstance(array, pa.StructArray):
        children, fields = [], []
        for i in range(array.type.num_fields):
            child = array.type.field(i)
            was = kind.field_by_name(child.name)
            assert was is not None  # _fits checked
            now = _by_id(current, was.field_id)
            values = _renamed(array.field(i), was.field_type, current)
            children.append(values)
            fields.append(pa.field(now.name if now is not None else child.name,
                                   values.type, nullable=child.nullable))
        if pa.struct(fields) == array.type:
            return array  # nothing under it was renamed
        return pa.StructArray.from_arrays(children, fields=fields, mask=array.is_null())
    if isinstance(kind, ListType) and isinstance(array, pa.ListArray | pa.LargeListArray):
        values = _renamed(array.values, kind.element_type, current)
        if values.type == array.values.type:
            return array
        return type(array).from_arrays(array.offsets, values, mask=array.is_null())
    if isinstance(kind, MapType) and isinstance(array, pa.MapArray):
        items = _renamed(array.items, kind.value_type, current)
        if items.type == array.items.type:
            return array
        return pa.MapArray.from_arrays(array.offsets, array.keys, items,
                                       mask=array.is_null())
    return array
