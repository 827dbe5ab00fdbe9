"""Avro streams: a schema's columns, its fingerprint, payload framings and checks.

Why here, in the core: the ingestor checks each payload against its writer schema and
strips the framing before it stores the body, the admin API derives a table's columns from
a schema and refuses a version the table cannot follow, and the collector decodes batches
of bodies (:mod:`pipeline.load.avro_arrow`); all of them read the same :class:`AvroType`.
No pyarrow here (the ingestor does not install it): parsing and validation are Apache
``avro``'s (through :mod:`icefloe.schemas.formats`, as the schema registry parses), payload
checks are ``fastavro``'s, both imported when first used.

Mapping (see ``docs/avro.md``): a union of ``null`` and one type is that type, nullable;
a union of several non-null types is refused (no column type holds "one of"); logical
types map natively (decimal, uuid, date, time, timestamp, local timestamp), unknown ones
as their underlying type; recursive records are refused.
"""

from __future__ import annotations

import io
import json
import re
import struct
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, Final

from icefloe.errors import SchemaRegistryError
from icefloe.schemas.compat import readable
from icefloe.schemas.formats import Parsed, parse
from icefloe.streams.typespec import MAX_DECIMAL_PRECISION, BadType, parse_type
from icefloe.typed.codec import TypeChangeError, TypedColumn, TypedPayloadError

CONFLUENT_MAGIC: Final = b"\x00"
"""Confluent's wire format: this byte, the schema id (u32 big-endian), the Avro body."""
SINGLE_OBJECT_MAGIC: Final = b"\xc3\x01"
"""Avro's single-object encoding: these two bytes, the writer schema's CRC-64-AVRO
fingerprint (8 bytes little-endian), the Avro body."""

_PRIMITIVE: Final = {"boolean": "boolean", "int": "int", "long": "long", "float": "float",
                     "double": "double", "bytes": "binary", "string": "string"}
_LOGICAL: Final = {
    ("uuid", "string"): "uuid", ("uuid", "fixed"): "uuid", ("date", "int"): "date",
    ("time-millis", "int"): "time", ("time-micros", "long"): "time",
    ("timestamp-millis", "long"): "timestamp", ("timestamp-micros", "long"): "timestamp",
    ("local-timestamp-millis", "long"): "timestamp_ntz",
    ("local-timestamp-micros", "long"): "timestamp_ntz",
}
"""(logicalType, underlying type) → column type; decimal is built from its parameters.
Any other pair (timestamp-nanos, duration, a logical type Avro does not define) is the
underlying type, as Avro's own readers treat a logical type they do not know."""


_POINTER: Final = re.compile(r"/[A-Za-z0-9_/]*")


class AvroSchemaError(TypeChangeError):
    """An Avro schema icefloe cannot turn into a table (not a record, a union of several
    types, a recursive record, a decimal wider than 38 digits) or that does not parse; the
    message names the field."""


class AvroType:
    """A parsed Avro schema whose top level is a record: one table row.

    ``schema``: the schema as JSON text or a parsed JSON value; ``named``: earlier parsed
    schemas whose named types (records, enums, fixed) this one references by full name
    (a registry subject's references). Raises :class:`AvroSchemaError` when the schema does
    not parse or its top level is not a record.
    """

    def __init__(self, schema: str | Mapping[str, Any] | Sequence[Any],
                 named: Sequence[AvroType] = ()) -> None:
        text = schema if isinstance(schema, str) else json.dumps(schema)
        self.parsed: Parsed
        refs = {f"ref{i}": ref.parsed for i, ref in enumerate(named)}
        try:
            with warnings.catch_warnings():  # avro warns of logical types it does not
                warnings.simplefilter("ignore")  # know (local-timestamp-*): mapped here
                self.parsed = parse("AVRO", text, refs)
        except SchemaRegistryError as exc:
            raise AvroSchemaError(str(exc)) from None
        self.value: Any = self.parsed.value
        if self.value.type != "record":
            raise AvroSchemaError(f"an Avro stream's schema must be a record (one table row), "
                                  f"not {self.value.type}")
        self.schema: dict[str, Any] = self.value.to_json()
        """The schema as one self-contained JSON value (referenced named types inlined at
        their first use): what a reader of this schema alone needs."""
        self.text: str = self.parsed.canonical
        self.name: str = self.value.fullname
        self._fast: Any = None

    @classmethod
    def from_schema(cls, text: str, named: Sequence[AvroType] = ()) -> AvroType:
        """The schema of JSON ``text`` (a schema file's contents, a registry's schema);
        what :func:`icefloe.typed.kinds.avro_kind` caches by text."""
        return cls(text, named)

    def __repr__(self) -> str:
        return f"AvroType({self.name!r})"

    def check(self, body: bytes, writer: AvroType | None = None) -> None:
        """:func:`check` of ``body`` against ``writer`` (this schema when left out): the
        method form the ingestor calls, as it calls a Protobuf type's."""
        check(body, writer or self)

    @property
    def fast(self) -> Any:
        """The schema parsed by ``fastavro`` (what :func:`check` and the decoders read
        with), parsed on first use."""
        if self._fast is None:
            import fastavro  # optional dep: the avro stream format

            self._fast = fastavro.parse_schema(self.schema)
        return self._fast

    def columns(self) -> tuple[TypedColumn, ...]:
        """One column per top-level field: ``required`` unless its type is a union with
        null. Raises :class:`AvroSchemaError` naming the field that has no column type."""
        out = []
        for field in self.value.fields:
            inner, nullable = _unwrap(field.type, field.name)
            kind = _column_type(inner, field.name, (self.name,))
            try:
                parse_type(kind)
            except BadType as exc:
                raise AvroSchemaError(f"field {field.name}: {exc}") from None
            out.append(TypedColumn(field.name, kind, required=not nullable,
                                   doc=field.doc or ""))
        return tuple(out)

    def fingerprint(self) -> bytes:
        """The 8-byte CRC-64-AVRO (Rabin) fingerprint of the schema's Parsing Canonical
        Form, little-endian: the bytes a single-object encoded payload carries."""
        from fastavro.schema import fingerprint, to_parsing_canonical_form  # optional dep

        canonical = to_parsing_canonical_form(self.schema)
        return bytes.fromhex(fingerprint(canonical, "CRC-64-AVRO"))

    def incompatibilities(self, writer: AvroType) -> list[str]:
        """Why this (reader) schema cannot read data written with ``writer`` by Avro's
        resolution rules (Apache ``avro``'s checker, as the registry's BACKWARD check);
        each message names the field's location. Empty: every datum resolves."""
        return [_POINTER.sub(lambda m: self._field_at(m.group(0)), message)
                for message in readable(reader=self.parsed, writer=writer.parsed)]

    def _field_at(self, pointer: str) -> str:
        """A location of Avro's checker (a JSON pointer into the reader schema, e.g.
        ``/fields/1/type``) as the field it names (``field qty``)."""
        node: Any = self.schema
        names: list[str] = []
        for step in pointer.strip("/").split("/") if pointer != "/" else []:
            if isinstance(node, list) and step.isdigit() and int(step) < len(node):
                node = node[int(step)]
                if isinstance(node, dict) and "name" in node and "type" in node and \
                        not isinstance(node.get("fields"), list):
                    names.append(str(node["name"]))  # a record's field
            elif isinstance(node, dict) and step in node:
                node = node[step]
            else:
                break
        return f"field {'.'.join(names)}" if names else "the record"


def _unwrap(schema: Any, where: str) -> tuple[Any, bool]:
    """A field's type without its null branch, and whether it had one."""
    if schema.type != "union":
        if schema.type == "null":
            raise AvroSchemaError(f"field {where}: a field of type null holds nothing; "
                                  "give it a type (a union with null makes it optional)")
        return schema, False
    branches = [s for s in schema.schemas if s.type != "null"]
    if len(branches) != 1:
        names = ", ".join(_type_name(s) for s in branches) or "none"
        raise AvroSchemaError(
            f"field {where}: a union of several non-null types ({names}) has no column "
            "type; icefloe maps only a union of null and one type (an optional field)")
    return branches[0], len(branches) < len(schema.schemas)


def _type_name(schema: Any) -> str:
    return str(getattr(schema, "fullname", None) or schema.type)


def _column_type(schema: Any, where: str, records: tuple[str, ...]) -> str:
    """The icefloe type string of a (non-union) Avro type; ``records``: the names of the
    enclosing records, to refuse recursion."""
    kind = schema.type
    logical = schema.get_prop("logicalType")
    if logical == "decimal" and kind in ("bytes", "fixed"):
        precision, scale = schema.get_prop("precision"), schema.get_prop("scale") or 0
        if not isinstance(precision, int) or precision > MAX_DECIMAL_PRECISION:
            raise AvroSchemaError(f"field {where}: decimal precision {precision} is larger "
                                  f"than {MAX_DECIMAL_PRECISION}, the most Iceberg stores")
        return f"decimal({precision},{scale})"
    mapped = _LOGICAL.get((str(logical), kind))
    if mapped is not None and not (logical == "uuid" and kind == "fixed" and
                                   schema.size != 16):
        return mapped
    if kind in _PRIMITIVE:
        return _PRIMITIVE[kind]
    if kind == "fixed":
        return "binary"
    if kind == "enum":
        return "string"
    if kind == "array":
        return f"list<{_column_type(_unwrap_nested(schema.items, where), where, records)}>"
    if kind == "map":
        value = _column_type(_unwrap_nested(schema.values, where), where, records)
        return f"map<string,{value}>"
    if kind == "record":
        return _struct_type(schema, where, records)
    raise AvroSchemaError(f"field {where}: Avro type {kind} has no column type")


def _unwrap_nested(schema: Any, where: str) -> Any:
    inner, _ = _unwrap(schema, where)
    return inner


def _struct_type(schema: Any, where: str, records: tuple[str, ...]) -> str:
    if schema.fullname in records:
        raise AvroSchemaError(f"field {where}: record {schema.fullname} contains itself; "
                              "a recursive record has no fixed column type")
    if not schema.fields:
        raise AvroSchemaError(f"field {where}: record {schema.fullname} has no fields; a "
                              "struct column needs at least one")
    inside = (*records, schema.fullname)
    fields = []
    for field in schema.fields:
        path = f"{where}.{field.name}"
        inner, _ = _unwrap(field.type, path)
        fields.append(f"{field.name}: {_column_type(inner, path, inside)}")
    return "struct<" + ", ".join(fields) + ">"


def unframe(payload: bytes) -> tuple[str, int | bytes, bytes]:
    """A framed payload's framing, writer schema reference and Avro body.

    Confluent's wire format (``0x00``, schema id u32 big-endian, body) gives
    ``("confluent", id, body)``; single-object encoding (``0xC3 0x01``, 8-byte
    little-endian fingerprint, body) gives ``("single", fingerprint, body)``. Anything
    else raises :class:`TypedPayloadError` naming both framings and the first bytes seen.
    """
    if payload[:1] == CONFLUENT_MAGIC and len(payload) >= 5:
        (schema_id,) = struct.unpack_from(">I", payload, 1)
        return "confluent", schema_id, payload[5:]
    if payload[:2] == SINGLE_OBJECT_MAGIC and len(payload) >= 10:
        return "single", payload[2:10], payload[10:]
    raise TypedPayloadError(
        "an Avro payload starts with Confluent's wire format (0x00 then a 4-byte schema id) "
        "or Avro's single-object encoding (0xC3 0x01 then an 8-byte fingerprint); this one "
        f"is {len(payload)} bytes starting with {payload[:10].hex(' ') or 'nothing'}")


def check(body: bytes, writer: AvroType) -> None:
    """Raise :class:`TypedPayloadError` unless ``body`` is exactly one datum of ``writer``
    (no bytes before or after it). The message names the field where decoding stopped."""
    from fastavro import schemaless_reader  # optional dep: the avro stream format

    stream = io.BytesIO(body)
    try:
        schemaless_reader(stream, writer.fast, None)
    except Exception as exc:  # fastavro raises EOFError, ValueError, IndexError, ...
        field = _failed_field(body, writer)
        where = f" at field {field}" if field else ""
        raise TypedPayloadError(f"the Avro body does not decode with schema {writer.name}"
                                f"{where}: {type(exc).__name__}: {exc}".rstrip(": "),
                                field=field) from None
    left = len(body) - stream.tell()
    if left:
        raise TypedPayloadError(f"{left} bytes are left after the Avro datum of schema "
                                f"{writer.name} ({len(body)} bytes in all); a body holds "
                                "exactly one datum")


def _failed_field(body: bytes, writer: AvroType) -> str | None:
    """The dotted path of the top-level field where a bad body stops decoding: decode
    field by field, each with a one-field record schema, until one fails."""
    from fastavro import parse_schema, schemaless_reader  # optional dep

    named: dict[str, Any] = {}
    parse_schema(writer.schema, named_schemas=named)
    stream = io.BytesIO(body)
    for field in writer.schema["fields"]:
        # the writer's namespace, so the field's relative type names resolve as in it
        single = {"type": "record", "name": f"{writer.name}IcefloeField", "fields": [field]}
        try:
            schemaless_reader(stream, parse_schema(single, named_schemas=named), None)
        except Exception:  # the field that does not decode, whatever fastavro raises
            return str(field["name"])
    return None
