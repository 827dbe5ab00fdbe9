"""Avro bodies → one Arrow table in the reader schema's columns. Runs in Spark workers.

Why a container file in memory: an Avro body is a datum with no framing, so the bodies
of one writer schema, concatenated into the blocks of an Avro object container file
(header, then per :data:`BLOCK` bodies: their count, their size, the bodies, the sync
marker), are a file that a vectorised reader decodes in one call: ``polars.read_avro``
(Rust, straight into Arrow, ~3 times the events/s of the JSON path; ``docs/avro.md`` has
the numbers). What it trusts: that each body is exactly one datum of its writer schema,
which the ingestor checked (:func:`icefloe.typed.avro.check`) before it stored the body,
under the batch file's checksum. A body that breaks this anyway shifts at most the rest
of its block: most such bodies make the read fail (then the per-row fallback below names
them), a body with extra bytes may not.

Why resolution here and not in the reader: polars reads each group with its own writer
schema; :func:`_conform` then applies Avro's resolution rules to whole Arrow columns
(fields matched by name or the reader's aliases, a field the writer lacks takes the
reader's default or null, fields only the writer has are dropped, int→long→float→double
and string↔bytes promotions, enums as text, logical types to the column types of
:mod:`icefloe.typed.avro`).

Why a per-row fallback: polars does not read Avro maps, and trusts its input (the
ingestor checked every body with :func:`icefloe.typed.avro.check` before storing it). A
group with a map, or one polars refuses, is decoded body by body with ``fastavro`` (which
resolves writer to reader itself); a body that does not decode is returned as ``(index,
message)`` and left out, the others kept.
"""

from __future__ import annotations

import decimal
import io
import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from icefloe.typed.avro import AvroType, check
from icefloe.typed.codec import TypedPayloadError
from pipeline.columns import arrow_type
from pipeline.load.native_arrow import restore

_SYNC = b"icefloe-avro-blk"  # 16 bytes; a container file's sync marker is any 16 bytes
_MILLIS = ("timestamp-millis", "local-timestamp-millis", "time-millis")
Bad = list[tuple[int, str]]


def reader_arrow_schema(reader: AvroType) -> pa.Schema:
    """The table schema of ``reader``'s columns (:func:`pipeline.columns.arrow_type`)."""
    return pa.schema([pa.field(c.name, arrow_type(c.type)) for c in reader.columns()])


def decode_avro(reader: AvroType, bodies: Sequence[bytes], writers: Sequence[AvroType]
                ) -> tuple[pa.Table, list[tuple[int, str]]]:
    """``bodies[i]`` (written with ``writers[i]``) as rows of ``reader``'s columns, in
    input order; bodies that do not decode are returned as ``(index, message)`` and left
    out. ``writers`` may repeat the same :class:`AvroType` (grouped by schema text)."""
    if len(bodies) != len(writers):
        raise ValueError(f"{len(bodies)} bodies but {len(writers)} writer schemas")
    schema = reader_arrow_schema(reader)
    groups: dict[str, tuple[AvroType, list[int]]] = {}
    for index, writer in enumerate(writers):
        groups.setdefault(writer.text, (writer, []))[1].append(index)
    tables: list[pa.Table] = []
    kept: list[np.ndarray] = []
    bad: Bad = []
    for writer, indices in groups.values():
        table, failed = _decode_group(reader, writer, [bodies[i] for i in indices], schema)
        bad += [(indices[i], message) for i, message in failed]
        dropped = {i for i, _ in failed}
        kept.append(np.array([x for n, x in enumerate(indices) if n not in dropped]
                             if dropped else indices, np.int64))
        tables.append(table)
    if not tables:
        return schema.empty_table(), []
    if len(tables) == 1:
        return tables[0], sorted(bad)
    order = np.argsort(np.concatenate(kept), kind="stable")
    return pa.concat_tables(tables).take(pa.array(order)), sorted(bad)


def decode_avro_by_id(reader: AvroType, bodies: pa.BinaryArray, schema_ids: np.ndarray,
                      writers: Mapping[int, AvroType]) -> tuple[pa.Table, list[tuple[int, str]]]:
    """:func:`decode_avro` for a batch's bodies as one Arrow array, each written with the
    schema ``writers[schema_ids[i]]`` (every id must be there): grouped by id with numpy,
    so no Python object is made per body on the vectorised path."""
    schema = reader_arrow_schema(reader)
    ids = np.asarray(schema_ids, dtype=np.int64)
    unique = np.unique(ids)
    if len(unique) == 1:  # the usual batch: one writer schema
        return _decode_group(reader, writers[int(unique[0])], bodies, schema)
    tables: list[pa.Table] = []
    kept: list[np.ndarray] = []
    bad: Bad = []
    for schema_id in unique:
        indices = np.flatnonzero(ids == schema_id)
        table, failed = _decode_group(reader, writers[int(schema_id)],
                                      bodies.take(pa.array(indices)), schema)
        bad += [(int(indices[i]), message) for i, message in failed]
        dropped = np.array([i for i, _ in failed], dtype=np.int64)
        kept.append(np.delete(indices, dropped) if len(dropped) else indices)
        tables.append(table)
    order = np.argsort(np.concatenate(kept), kind="stable")
    return pa.concat_tables(tables).take(pa.array(order)), sorted(bad)


def _decode_group(reader: AvroType, writer: AvroType, bodies: Sequence[bytes] | pa.BinaryArray,
                  schema: pa.Schema) -> tuple[pa.Table, Bad]:
    if _vectorised(writer.value):
        try:
            return _vectorised_group(reader, writer, bodies, schema), []
        except Exception:  # polars' errors, Arrow's: find the body below, one by one
            pass
        except BaseException as exc:  # polars' Rust panics (pyo3 PanicException)
            if type(exc).__name__ != "PanicException":
                raise
    rows = bodies.to_pylist() if isinstance(bodies, pa.Array) else list(bodies)
    return _row_group(reader, writer, rows, schema)


def _vectorised(schema: Any, seen: frozenset[str] = frozenset()) -> bool:
    """Whether polars reads this writer schema: anything but a map, at any depth."""
    kind = schema.type
    if kind == "map":
        return False
    if kind == "union":
        return all(_vectorised(s, seen) for s in schema.schemas)
    if kind == "array":
        return _vectorised(schema.items, seen)
    if kind == "record":
        if schema.fullname in seen:
            return False
        inside = seen | {schema.fullname}
        return all(_vectorised(f.type, inside) for f in schema.fields)
    return True


# -- the vectorised path: polars over an in-memory container file ---------------------------


BLOCK = 1024
"""Bodies per container block. Why not one block per body: polars pays ~20 µs a block (50k
ev/s at one body a block, 2.2M at 1,024); why not one block for all: a bad body can only
shift the rows of its own block, and larger blocks were no faster."""


def container(writer: AvroType, bodies: Sequence[bytes]) -> bytes:
    """An Avro object container file of ``bodies`` (:data:`BLOCK` a block), codec null."""
    header = io.BytesIO()
    header.write(b"Obj\x01")
    meta = {"avro.schema": _header_schema(writer), "avro.codec": b"null"}
    header.write(_long(len(meta)))
    for key, value in meta.items():
        header.write(_long(len(key)) + key.encode() + _long(len(value)) + value)
    header.write(b"\x00" + _SYNC)
    parts = [header.getvalue()]
    if isinstance(bodies, pa.BinaryArray):  # a batch's bodies as they lie in its block
        _, offset_buffer, values = bodies.buffers()
        offsets = np.frombuffer(offset_buffer, dtype=np.int32)[
            bodies.offset:bodies.offset + len(bodies) + 1]
        for start in range(0, len(bodies), BLOCK):
            stop = min(start + BLOCK, len(bodies))
            first, last = int(offsets[start]), int(offsets[stop])
            data = b"" if values is None else values.slice(first, last - first).to_pybytes()
            parts += (_long(stop - start), _long(len(data)), data, _SYNC)
        return b"".join(parts)
    for start in range(0, len(bodies), BLOCK):
        chunk = bodies[start:start + BLOCK]
        data = b"".join(chunk)
        parts += (_long(len(chunk)), _long(len(data)), data, _SYNC)
    return b"".join(parts)


_DROPPED = frozenset({"default", "doc", "aliases", "order"})


def _header_schema(writer: AvroType) -> bytes:
    """The writer schema as the container's header names it: named types expanded at
    every use, without defaults, docs, aliases and orders, which reading a writer's data
    never uses and polars' schema parser refuses some of (an array's ``[]`` default);
    enums as ``int``, their encoding (polars reads an enum only as a top-level field);
    logical types kept."""
    def strip(node: Any) -> Any:
        if isinstance(node, dict) and node.get("type") == "enum":
            return "int"  # the symbol's index, as encoded; :func:`_conform` names it
        if isinstance(node, dict):
            return {k: strip(v) for k, v in node.items() if k not in _DROPPED}
        if isinstance(node, list):
            return [strip(v) for v in node]
        return node
    from fastavro.schema import expand_schema  # optional dep: the avro stream format

    # polars does not resolve a named type's later uses: every use carries its definition
    return json.dumps(strip(expand_schema(writer.schema)), separators=(",", ":")).encode()


_SMALL = [bytes([2 * n]) if n < 64 else bytes([(2 * n & 0x7F) | 0x80, 2 * n >> 7])
          for n in range(8192)]


def _long(value: int) -> bytes:
    """Avro's zig-zag varint of a non-negative int (small ones from a table)."""
    if value < len(_SMALL):
        return _SMALL[value]
    zigzag = value << 1
    out = bytearray()
    while zigzag > 0x7F:
        out.append((zigzag & 0x7F) | 0x80)
        zigzag >>= 7
    out.append(zigzag)
    return bytes(out)


def _vectorised_group(reader: AvroType, writer: AvroType,
                      bodies: Sequence[bytes] | pa.BinaryArray, schema: pa.Schema) -> pa.Table:
    import polars  # optional dep: the avro stream format (imported by the first batch)

    frame = polars.read_avro(io.BytesIO(container(writer, bodies)))
    read = frame.to_arrow().combine_chunks()
    if read.num_rows != len(bodies):
        raise ValueError(f"{read.num_rows} rows from {len(bodies)} bodies")
    columns = _record_children([read.column(i).chunk(0) if read.column(i).num_chunks else
                                pa.array([], read.schema.field(i).type)
                                for i in range(read.num_columns)],
                               writer.value, reader.value, list(schema), len(bodies))
    return pa.Table.from_arrays(columns, schema=schema)


def _branch(schema: Any) -> Any:
    """A type without its null branch (a null union's one other type)."""
    if schema.type == "union":
        return next(s for s in schema.schemas if s.type != "null")
    return schema


def _record_children(arrays: list[pa.Array], writer: Any, reader: Any,
                     targets: list[pa.Field], count: int) -> list[pa.Array]:
    """The reader record's fields from the writer record's decoded ones."""
    by_name = {f.name: (i, f) for i, f in enumerate(writer.fields)}
    out = []
    for field, target in zip(reader.fields, targets, strict=True):
        names = [field.name, *(field.props.get("aliases") or ())]
        found = next((by_name[n] for n in names if n in by_name), None)
        if found is None:
            out.append(_default(field, target.type, count))
        else:
            index, written = found
            out.append(_conform(arrays[index], written.type, field.type, target.type))
    return out


def _conform(array: pa.Array, writer: Any, reader: Any, target: pa.DataType) -> pa.Array:
    """A column decoded with the writer's type as the reader's column type."""
    writer, reader = _branch(writer), _branch(reader)
    mask = array.is_null() if array.null_count else None
    if pa.types.is_struct(target):
        children = [array.field(i) for i in range(array.type.num_fields)]
        fields = _record_children(children, writer, reader, list(target), len(array))
        return pa.StructArray.from_arrays(fields, fields=list(target), mask=mask)
    if pa.types.is_list(target):
        values = _conform(array.values, writer.items, reader.items, target.value_type)
        offsets = array.offsets.cast(pa.int32())
        return pa.ListArray.from_arrays(offsets, values, type=target, mask=mask)
    if pa.types.is_map(target):
        raise TypeError("maps are decoded body by body")
    if target == pa.binary(16) and (pa.types.is_string(array.type) or
                                    pa.types.is_large_string(array.type)):
        text = pa.chunked_array([array.cast(pa.string())])
        return restore(text, target).chunk(0)  # uuid text → 16 bytes, vectorised
    if writer.type == "enum":  # read as its symbol's index: the symbol, by one take
        if pa.types.is_dictionary(array.type):
            array = array.dictionary_decode()
        else:
            array = pa.array(writer.symbols, pa.string()).take(array)
    if pa.types.is_time64(array.type) and pa.types.is_time64(target):
        return array.cast(target)  # polars reads times as nanoseconds: exact in micros
    return array.cast(target)


def _default(field: Any, target: pa.DataType, count: int) -> pa.Array:
    """A field the writer lacks: the reader's default in every row, or nulls."""
    if not field.has_default or field.default is None:
        return pa.nulls(count, target)
    value = _default_value(field.default, _branch(field.type), target)
    return pa.repeat(pa.scalar(value, target), count)


def _default_value(value: Any, schema: Any, target: pa.DataType) -> Any:
    """An Avro default (JSON) as the Python value of the column type."""
    logical = schema.get_prop("logicalType")
    if value is None:
        return None
    if logical == "decimal" and isinstance(value, str):
        raw = value.encode("latin-1")
        return _decimal(int.from_bytes(raw, "big", signed=True), schema.get_prop("scale") or 0)
    if logical == "uuid" and isinstance(value, str):
        return uuid.UUID(value).bytes
    if logical in _MILLIS and isinstance(value, int):
        return value * 1000
    if schema.type in ("bytes", "fixed") and isinstance(value, str):
        return value.encode("latin-1")
    if schema.type == "record" and isinstance(value, dict):
        return {f.name: _default_value(value.get(f.name, f.default if f.has_default else
                                                 None), _branch(f.type),
                                       target.field(f.name).type) for f in schema.fields}
    if schema.type == "array" and isinstance(value, list):
        return [_default_value(v, _branch(schema.items), target.value_type) for v in value]
    return value


def _decimal(unscaled: int, scale: int) -> Any:
    return decimal.Decimal(unscaled).scaleb(-scale)


# -- the per-row path: fastavro, body by body ----------------------------------------------


def _keeping_symbols(reader: AvroType, writer: AvroType) -> Any:
    """``reader``'s schema for fastavro with every enum also holding the symbols the
    writer's enum of the same name (or an alias) has and it lacks.

    Why: an enum column is text, and a symbol the reader's enum lacks is kept as the
    writer wrote it (the columnar path reads the writer's symbol); fastavro would give the
    reader's ``default`` instead, so the same symbol would land as two values depending on
    which path a batch took (a map in the writer schema takes this one)."""
    key = (reader.text, writer.text)
    found = _KEEPING.get(key)
    if found is not None:
        return found
    import fastavro  # optional dep: the avro stream format

    extra = {name: named["symbols"] for name, named in
             writer.fast.get("__named_schemas", {}).items()
             if isinstance(named, dict) and named.get("type") == "enum"}
    schema = json.loads(json.dumps(reader.schema))  # a copy to widen
    widened = bool(extra) and _widen(schema, "", extra)
    found = fastavro.parse_schema(schema) if widened else reader.fast
    if len(_KEEPING) > 64:
        _KEEPING.clear()
    _KEEPING[key] = found
    return found


_KEEPING: dict[tuple[str, str], Any] = {}


def _widen(node: Any, namespace: str, extra: Mapping[str, list[str]]) -> bool:
    """Add ``extra``'s symbols to every enum below ``node`` (by full name or alias), in
    place; whether any changed."""
    if isinstance(node, list):
        return any([_widen(item, namespace, extra) for item in node])
    if not isinstance(node, dict):
        return False
    kind = node.get("type")
    if kind in ("record", "error", "enum", "fixed"):
        name = str(node.get("name", ""))
        space = str(node.get("namespace", namespace)) if "." not in name \
            else name.rsplit(".", 1)[0]
        full = name if "." in name or not space else f"{space}.{name}"
        if kind == "enum":
            names = [full] + [a if "." in a or not space else f"{space}.{a}"
                              for a in node.get("aliases", [])]
            more = [sym for n in names for sym in extra.get(n, [])
                    if sym not in node["symbols"]]
            if more:
                node["symbols"] = [*node["symbols"], *dict.fromkeys(more)]
                return True
            return False
        return any([_widen(f.get("type"), space, extra) for f in node.get("fields", [])])
    changed = False
    for child in ("type", "items", "values"):
        if child in node and isinstance(node[child], dict | list):
            changed = _widen(node[child], namespace, extra) or changed
    return changed


def _row_group(reader: AvroType, writer: AvroType, bodies: list[bytes], schema: pa.Schema
               ) -> tuple[pa.Table, Bad]:
    from fastavro import schemaless_reader  # optional dep: the avro stream format

    fix = _fixer(reader.value)
    keeping = _keeping_symbols(reader, writer)
    rows: list[Any] = []
    bad: Bad = []
    for index, body in enumerate(bodies):
        stream = io.BytesIO(body)
        try:
            row = schemaless_reader(stream, writer.fast, keeping)
            if stream.tell() != len(body):
                check(body, writer)  # raises, saying how many bytes are left
            rows.append(fix(row) if fix is not None else row)
        except TypedPayloadError as exc:
            bad.append((index, str(exc)))
        except Exception as exc:  # fastavro raises EOFError, ValueError, IndexError, ...
            try:
                check(body, writer)
                message = f"the Avro body does not resolve to schema {reader.name}: {exc}"
            except TypedPayloadError as found:
                message = str(found)
            bad.append((index, message))
    return pa.Table.from_pylist(rows, schema=schema), bad


Fix = Callable[[Any], Any]


def _fixer(schema: Any) -> Fix | None:
    """What turns a fastavro value into the Arrow-ready one (uuid text → 16 bytes), or
    None when nothing needs it."""
    schema = _branch(schema)
    logical = schema.get_prop("logicalType")
    if logical == "uuid" and schema.type == "string":
        return lambda v: None if v is None else v.bytes if isinstance(v, uuid.UUID) \
            else uuid.UUID(v).bytes
    if schema.type == "record":
        fixes = [(f.name, fx) for f in schema.fields if (fx := _fixer(f.type)) is not None]
        if not fixes:
            return None

        def record(value: Any) -> Any:
            if value is None:
                return None
            for name, fx in fixes:
                value[name] = fx(value.get(name))
            return value
        return record
    if schema.type in ("array", "map"):
        inner = _fixer(schema.items if schema.type == "array" else schema.values)
        if inner is None:
            return None
        if schema.type == "array":
            return lambda v: None if v is None else [inner(x) for x in v]
        return lambda v: None if v is None else {k: inner(x) for k, x in v.items()}
    return None
