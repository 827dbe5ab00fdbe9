"""Avro object container files decoded with the standard library alone.

Why not pyiceberg's Avro reader: it resolves records against Iceberg schemas built from
pyiceberg's pydantic models, and importing those (with the table layer that uses them) is
most of what a cold ``icefloe query`` spends before DuckDB starts. A manifest list and a
manifest are small Avro files in one fixed layout; decoding them by their own writer
schema takes a few dozen lines. Only the ``null`` and ``deflate`` codecs are read (Iceberg
writes ``deflate`` unless a table property says otherwise); any other codec, a bad magic
number or sync marker, or a schema this reader does not know raises
:class:`AvroUnsupported`, and the caller reads the table through pyiceberg instead.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Callable, Iterator
from typing import Any

MAGIC = b"Obj\x01"
SYNC_SIZE = 16

Decoder = Callable[[bytes, int], tuple[Any, int]]


class AvroUnsupported(ValueError):
    """The file is not one this reader decodes exactly (the caller falls back)."""


def read_long(data: bytes, pos: int) -> tuple[int, int]:
    """A zig-zag varint ``int``/``long`` at ``pos``; the value and the next position."""
    byte = data[pos]
    pos += 1
    value = byte & 0x7F
    shift = 7
    while byte & 0x80:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
    return (value >> 1) ^ -(value & 1), pos


def _bytes(data: bytes, pos: int) -> tuple[bytes, int]:
    size, pos = read_long(data, pos)
    if size < 0:
        raise AvroUnsupported("negative byte length")
    return data[pos:pos + size], pos + size


def _string(data: bytes, pos: int) -> tuple[str, int]:
    raw, pos = _bytes(data, pos)
    return raw.decode("utf-8"), pos


def _null(data: bytes, pos: int) -> tuple[None, int]:
    return None, pos


def _boolean(data: bytes, pos: int) -> tuple[bool, int]:
    return data[pos] != 0, pos + 1


def _float(data: bytes, pos: int) -> tuple[float, int]:
    return struct.unpack_from("<f", data, pos)[0], pos + 4


def _double(data: bytes, pos: int) -> tuple[float, int]:
    return struct.unpack_from("<d", data, pos)[0], pos + 8


PRIMITIVES: dict[str, Decoder] = {"null": _null, "boolean": _boolean, "int": read_long,
                                  "long": read_long, "float": _float, "double": _double,
                                  "bytes": _bytes, "string": _string}


def _blocks(data: bytes, pos: int, item: Decoder) -> tuple[list[Any], int]:
    """Array or map blocks: a count (negative: followed by the block's byte size), items,
    until a zero count."""
    out: list[Any] = []
    while True:
        count, pos = read_long(data, pos)
        if count == 0:
            return out, pos
        if count < 0:
            count = -count
            _, pos = read_long(data, pos)
        for _ in range(count):
            value, pos = item(data, pos)
            out.append(value)


def _full_name(name: str, namespace: str | None) -> str:
    return name if "." in name or not namespace else f"{namespace}.{name}"


def compile_schema(schema: Any, names: dict[str, Decoder] | None = None,
                   namespace: str | None = None) -> Decoder:
    """A decoder for values of the writer ``schema`` (parsed JSON). Records decode to dicts
    keyed by field name, enums to their symbol, maps to dicts, fixed to bytes."""
    names = {} if names is None else names
    if isinstance(schema, str):
        if schema in PRIMITIVES:
            return PRIMITIVES[schema]
        full = _full_name(schema, namespace)
        if full not in names and schema not in names:
            raise AvroUnsupported(f"unknown Avro type {schema!r}")
        key = full if full in names else schema
        return lambda data, pos: names[key](data, pos)
    if isinstance(schema, list):
        return _union([compile_schema(s, names, namespace) for s in schema])
    if not isinstance(schema, dict):
        raise AvroUnsupported(f"not an Avro schema: {schema!r}")
    kind = schema.get("type")
    if isinstance(kind, str) and kind in PRIMITIVES:
        return PRIMITIVES[kind]  # a logical type decodes as its underlying type here
    if kind == "record" or kind == "error":
        return _record(schema, names, namespace)
    if kind == "enum":
        symbols = list(schema["symbols"])
        decoder = _enum(symbols)
    elif kind == "fixed":
        decoder = _fixed(int(schema["size"]))
    elif kind == "array":
        return _array(compile_schema(schema["items"], names, namespace))
    elif kind == "map":
        return _map(compile_schema(schema["values"], names, namespace))
    else:
        return compile_schema(kind, names, namespace)  # {"type": {...}} or a named type
    _register(schema, names, namespace, decoder)
    return decoder


def _register(schema: dict[str, Any], names: dict[str, Decoder], namespace: str | None,
              decoder: Decoder) -> str | None:
    """Name a named type (record, enum, fixed) under its full and short names."""
    own = schema.get("namespace", namespace)
    full = _full_name(schema["name"], own)
    names[full] = decoder
    names.setdefault(schema["name"], decoder)
    return own if "." not in schema["name"] else schema["name"].rpartition(".")[0]


def _record(schema: dict[str, Any], names: dict[str, Decoder], namespace: str | None
            ) -> Decoder:
    fields: list[tuple[str, Decoder]] = []

    def decode(data: bytes, pos: int) -> tuple[dict[str, Any], int]:
        out: dict[str, Any] = {}
        for name, field in fields:
            out[name], pos = field(data, pos)
        return out, pos

    inner = _register(schema, names, namespace, decode)  # before the fields: recursion
    fields.extend((f["name"], compile_schema(f["type"], names, inner))
                  for f in schema["fields"])
    return decode


def _union(branches: list[Decoder]) -> Decoder:
    def decode(data: bytes, pos: int) -> tuple[Any, int]:
        index, pos = read_long(data, pos)
        if not 0 <= index < len(branches):
            raise AvroUnsupported(f"union branch {index} out of range")
        return branches[index](data, pos)
    return decode


def _enum(symbols: list[str]) -> Decoder:
    def decode(data: bytes, pos: int) -> tuple[str, int]:
        index, pos = read_long(data, pos)
        if not 0 <= index < len(symbols):
            raise AvroUnsupported(f"enum index {index} out of range")
        return symbols[index], pos
    return decode


def _fixed(size: int) -> Decoder:
    def decode(data: bytes, pos: int) -> tuple[bytes, int]:
        return data[pos:pos + size], pos + size
    return decode


def _array(item: Decoder) -> Decoder:
    def decode(data: bytes, pos: int) -> tuple[list[Any], int]:
        return _blocks(data, pos, item)
    return decode


def _map(value: Decoder) -> Decoder:
    def pair(data: bytes, pos: int) -> tuple[tuple[str, Any], int]:
        key, pos = _string(data, pos)
        item, pos = value(data, pos)
        return (key, item), pos

    def decode(data: bytes, pos: int) -> tuple[dict[str, Any], int]:
        pairs, pos = _blocks(data, pos, pair)
        return dict(pairs), pos
    return decode


class AvroFile:
    """One container file in memory: its metadata, writer schema and records."""

    def __init__(self, data: bytes) -> None:
        if data[:4] != MAGIC:
            raise AvroUnsupported("not an Avro object container file")
        try:
            pairs, pos = _blocks(data, 4, _map_pair)
        except (IndexError, UnicodeDecodeError) as exc:
            raise AvroUnsupported(f"unreadable Avro header: {exc}") from None
        self.metadata: dict[str, bytes] = dict(pairs)
        self.sync = data[pos:pos + SYNC_SIZE]
        self._data = data
        self._start = pos + SYNC_SIZE
        codec = self.metadata.get("avro.codec", b"null").decode()
        if codec not in ("null", "deflate"):
            raise AvroUnsupported(f"Avro codec {codec!r}")
        self.codec = codec
        self.schema: Any = json.loads(self.metadata["avro.schema"])

    def records(self) -> Iterator[Any]:
        """Every record, in file order, decoded by the writer schema."""
        decode = compile_schema(self.schema)
        data, pos = self._data, self._start
        try:
            while pos < len(data):
                count, pos = read_long(data, pos)
                size, pos = read_long(data, pos)
                block = data[pos:pos + size]
                pos += size
                if data[pos:pos + SYNC_SIZE] != self.sync:
                    raise AvroUnsupported("Avro sync marker does not match")
                pos += SYNC_SIZE
                if self.codec == "deflate":
                    block = zlib.decompress(block, -15)
                at = 0
                for _ in range(count):
                    record, at = decode(block, at)
                    yield record
                if at != len(block):
                    raise AvroUnsupported("Avro block not fully decoded")
        except (IndexError, struct.error, zlib.error, UnicodeDecodeError) as exc:
            raise AvroUnsupported(f"unreadable Avro block: {exc}") from None


def _map_pair(data: bytes, pos: int) -> tuple[tuple[str, bytes], int]:
    key, pos = _string(data, pos)
    value, pos = _bytes(data, pos)
    return (key, value), pos


def field_names_by_id(record_schema: Any) -> dict[int, str]:
    """``{field-id: name}`` of a record schema's fields (Iceberg writes ``field-id``)."""
    if not isinstance(record_schema, dict) or record_schema.get("type") != "record":
        raise AvroUnsupported("expected a record schema")
    return {int(f["field-id"]): f["name"] for f in record_schema["fields"]
            if "field-id" in f}


def record_schema_of(field_type: Any) -> Any:
    """The record inside a field's type (the type itself, or the non-null branch of an
    optional one)."""
    if isinstance(field_type, list):
        branches = [b for b in field_type if b != "null"]
        if len(branches) != 1:
            raise AvroUnsupported("expected an optional record")
        field_type = branches[0]
    return field_type
