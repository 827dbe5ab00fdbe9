"""Protobuf payloads of one stream → one Arrow table of its columns, without a Python
object per event.

Why ptars: it parses the wire format in Rust straight into Arrow builders (measured on
50k ``OrderPlaced`` messages of 10 fields: ~4x the events/s of ``pyarrow.json.read_json``
on the same events as NDJSON, where upb parsing alone, one message object per event, only
matches it and protarrow reaches a seventh of it; ``docs/protobuf.md``). What ptars yields
differs from icefloe's column types in a few places, so each column is then conformed,
column-wise: ``uint32`` → int64, ``uint64`` → ``decimal(20,0)``, ``Duration`` → int64
microseconds, map keys → their text, non-null child fields → nullable ones, and the
``Struct``/``Value``/``ListValue`` fields — decoded as bytes (ptars would cut the
recursive types into structs) — into JSON text (a Python step per *value* of a ``json``
column only).

A payload that does not decode fails ptars' whole call: the batch is then halved until
each bad payload is alone, so the good rows still decode and each bad one gets
:meth:`ProtobufType.check`'s precise reason (the collector dead-letters it).
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, struct_pb2

from icefloe.streams.typespec import TypeSpec, parse_type
from icefloe.typed.codec import TypedPayloadError
from icefloe.typed.protobuf import ProtobufType
from pipeline.columns import arrow_type

_JSON_TYPES = frozenset({"google.protobuf.Struct", "google.protobuf.Value",
                         "google.protobuf.ListValue"})
_JSON_CLASSES: dict[str, Any] = {"google.protobuf.Struct": struct_pb2.Struct,
                                 "google.protobuf.Value": struct_pb2.Value,
                                 "google.protobuf.ListValue": struct_pb2.ListValue}
_DECIMAL_U64 = pa.decimal128(20, 0)


def protobuf_schema(kind: ProtobufType) -> pa.Schema:
    """The Arrow schema of the stream's columns (nullable fields, icefloe's types)."""
    return pa.schema([pa.field(c.name, arrow_type(c.type)) for c in kind.columns()])


class DecodedProtobuf(NamedTuple):
    """The rows that decoded (``table``, in payload order) and, for each payload that did
    not, its index and why (``failed``, by index; the message names the field when the
    bytes show which). Unpacks as ``table, failed = decode_protobuf(...)``."""

    table: pa.Table
    failed: list[tuple[int, str]]

    def kept(self, count: int) -> pa.Array:
        """Indices (int64) of the payloads the table's rows come from, of ``count``
        payloads: what to ``take`` the envelope's columns with."""
        rows = np.arange(count, dtype=np.int64)
        if self.failed:
            rows = np.delete(rows, [index for index, _ in self.failed])
        return pa.array(rows)


def decode_protobuf(kind: ProtobufType, payloads: Sequence[bytes] | pa.Array
                    ) -> DecodedProtobuf:
    """Decode ``payloads`` (bytes, or an Arrow binary array: no Python object per event)
    into a table whose schema is exactly :func:`protobuf_schema`."""
    return _decoder(kind).decode(payloads)


_DECODERS: weakref.WeakKeyDictionary[ProtobufType, _Decoder] = weakref.WeakKeyDictionary()


def _decoder(kind: ProtobufType) -> _Decoder:
    found = _DECODERS.get(kind)
    if found is None:
        found = _DECODERS[kind] = _Decoder(kind)
    return found


class _Decoder:
    """ptars' handler for a type (built once per type: it compiles the descriptors)."""

    def __init__(self, kind: ProtobufType) -> None:
        import ptars  # imported here: the collector loads it only for Protobuf streams

        self.kind = kind
        self.schema = protobuf_schema(kind)
        self.specs = {c.name: parse_type(c.type) for c in kind.columns()}
        self.json_fields = kind.json_fields()
        pool = descriptor_pool.DescriptorPool()
        files = [_json_as_bytes(f) for f in kind.files]
        for file in files:
            pool.Add(file)
        config = ptars.PtarsConfig(
            timestamp_tz="UTC", timestamp_unit="us", time_unit="us", duration_unit="us",
            list_value_name="element", list_nullable=True, map_nullable=True,
            list_value_nullable=True, map_value_nullable=True,
            enum_repr="string" if kind.enums == "string" else "int32")
        message = pool.FindMessageTypeByName(kind.full_name)
        handlers = ptars.HandlerPool([message.file], config=config)
        self.handler = handlers.get_for_message(message)

    def decode(self, payloads: Sequence[bytes] | pa.Array) -> DecodedProtobuf:
        try:
            if isinstance(payloads, pa.Array):
                batch = self.handler.array_to_record_batch(payloads.cast(pa.binary()))
            else:  # ptars reads the bytes objects in place (no Arrow array to build)
                batch = self.handler.list_to_record_batch(
                    payloads if isinstance(payloads, list) else list(payloads))
        except ValueError:
            pass  # some payload does not decode: find which, keep the others
        else:
            return DecodedProtobuf(self._conform(batch), [])
        array = payloads.cast(pa.binary()) if isinstance(payloads, pa.Array) else pa.array(
            payloads, pa.binary())
        good: list[pa.RecordBatch] = []
        errors: list[tuple[int, str]] = []
        self._split(array, 0, good, errors)
        table = pa.concat_tables([self._conform(b) for b in good]) if good else \
            self.schema.empty_table()
        return DecodedProtobuf(table, sorted(errors))

    def _split(self, array: pa.Array, start: int, good: list[pa.RecordBatch],
               errors: list[tuple[int, str]]) -> None:
        """Halve ``array`` (rows from ``start``) until each bad payload is alone."""
        try:
            good.append(self.handler.array_to_record_batch(array))
            return
        except ValueError as exc:
            if len(array) == 1:
                errors.append((start, self._reason(array[0].as_py(), str(exc))))
                return
        half = len(array) // 2
        self._split(array.slice(0, half), start, good, errors)
        self._split(array.slice(half), start + half, good, errors)

    def _reason(self, payload: bytes | None, fallback: str) -> str:
        """:meth:`ProtobufType.check`'s precise reason, else ptars' own."""
        try:
            self.kind.check(payload or b"")
        except TypedPayloadError as exc:
            return str(exc)
        return f"{self.kind.full_name}: {fallback}"

    def _conform(self, batch: pa.RecordBatch) -> pa.Table:
        columns = [_conform(batch.column(name), self.specs[name], f.type, name,
                            self.json_fields)
                   for name, f in zip(self.schema.names, self.schema, strict=True)]
        return pa.Table.from_arrays(columns, schema=self.schema)


def _json_as_bytes(file: descriptor_pb2.FileDescriptorProto
                   ) -> descriptor_pb2.FileDescriptorProto:
    """A copy of ``file`` whose ``Struct``/``Value``/``ListValue`` fields are ``bytes``
    (the same wire encoding): ptars hands over each value's bytes, which become JSON."""
    out = descriptor_pb2.FileDescriptorProto()
    out.CopyFrom(file)
    for message in out.message_type:
        _retype(message, out.syntax == "proto3")
    return out


def _retype(message: descriptor_pb2.DescriptorProto, proto3: bool) -> None:
    for one in message.field:
        if one.type == one.TYPE_MESSAGE and one.type_name.lstrip(".") in _JSON_TYPES:
            one.type = one.TYPE_BYTES
            one.ClearField("type_name")
            if proto3 and one.label != one.LABEL_REPEATED and not one.HasField("oneof_index"):
                # a message field has presence, a proto3 bytes field not: keep it, so an
                # absent Struct stays null (not "{}")
                one.proto3_optional = True
                one.oneof_index = len(message.oneof_decl)
                message.oneof_decl.add().name = f"_{one.name}_icefloe_json"
    for nested in message.nested_type:
        _retype(nested, proto3)


def _conform(array: pa.Array, spec: TypeSpec, target: pa.DataType, path: str,
             json_fields: dict[str, str]) -> pa.Array:
    """``array`` as ptars made it → the column's Arrow type (column-wise)."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    mask = array.is_null() if array.null_count else None
    if spec.name == "json":
        return _json_text(array, json_fields[path])
    if spec.name == "struct":
        children = {f.name: a for f, a in zip(array.type, array.flatten(), strict=True)}
        return pa.StructArray.from_arrays(
            [_conform(children[name], kind, target.field(name).type, f"{path}.{name}",
                      json_fields) for name, kind in spec.fields],
            fields=list(target), mask=mask)
    if spec.name == "list":
        assert spec.element is not None
        values = _conform(array.values, spec.element, target.value_type,
                          f"{path}.element", json_fields)
        return pa.ListArray.from_arrays(array.offsets, values, type=target, mask=mask)
    if spec.name == "map":
        assert spec.element is not None
        keys = array.keys if array.keys.type == pa.string() else _key_text(array.keys)
        items = _conform(array.items, spec.element, target.item_type, f"{path}.value",
                         json_fields)
        return pa.MapArray.from_arrays(array.offsets, keys, items, type=target, mask=mask)
    if array.type == target:
        return array
    return array.cast(target)


def _key_text(keys: pa.Array) -> pa.Array:
    """Map keys as Protobuf's JSON writes them: integers in decimal, ``true``/``false``."""
    return pc.cast(keys, pa.string())


def _json_text(array: pa.Array, type_name: str) -> pa.Array:
    """Each value's bytes (a ``Struct``/``Value``/``ListValue``) as compact JSON text, keys
    sorted: a Struct is a map, whose order on the wire is the producer's accident."""
    parse = _JSON_CLASSES[type_name].FromString
    return pa.array([None if raw is None else json.dumps(
        json_format.MessageToDict(parse(raw)), separators=(",", ":"), ensure_ascii=False,
        sort_keys=True)
        for raw in array.to_pylist()], pa.string())
