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

from pyiceberg.catalog import Catalog
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.types import IcebergType, ListType, MapType, StructType

from icefloe.errors import SchemaConflictError
from icefloe.streams.model import StreamConfig
from icefloe.typed.kinds import protobuf_kind
from icefloe.typed.protobuf import ProtobufType
from pipeline.iceberg.errors import load_table_or_none
from pipeline.iceberg.evolution import promotable

FIELDS_PROP = "icefloe.protobuf.field-numbers"
"""Table property: JSON object, field-number path → dotted column path."""

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
    renames = kind.renames_from(stored)
    if not renames:
        return
    with table.transaction() as tx:
        with tx.update_schema() as update:
            for old, new in renames:
                update.rename_column(iceberg_path(schema, old), new.rsplit(".", 1)[-1])
        tx.set_properties({FIELDS_PROP: json.dumps(kind.number_paths(), sort_keys=True)})
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
    now = number_paths(stream)
    if now is None:
        return
    table = catalog.load_table(stream.table)
    if _stored(table) != now:
        table.transaction().set_properties(
            {FIELDS_PROP: json.dumps(now, sort_keys=True)}).commit_transaction()


def _stored(table: Table) -> Mapping[str, str]:
    text = table.properties.get(FIELDS_PROP)
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
