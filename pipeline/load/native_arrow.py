"""Native column types through Arrow's JSON reader: what to read them as, and the way back.

Why: ``pyarrow.json.read_json`` parses a whole batch in one columnar pass, but it cannot
read every type icefloe declares. Canonical payloads (:mod:`icefloe.streams.native`) carry
those values in a form it can read — binary as base64 text, uuids as text, times as
microseconds, maps as lists of ``{key, value}`` objects, dates as ISO text — so a column
is read as :func:`read_type` and turned into its declared type by :func:`restore`, at any
nesting depth. Columns without such types pay nothing (``read_type`` returns the type).
"""

from __future__ import annotations

import base64
import binascii
import uuid

import pyarrow as pa
import pyarrow.compute as pc


def read_type(target: pa.DataType) -> pa.DataType:
    """The type the JSON reader parses a column of declared type ``target`` as."""
    if pa.types.is_binary(target) or pa.types.is_fixed_size_binary(target) or \
            pa.types.is_date32(target):
        return pa.string()
    if pa.types.is_time64(target):
        return pa.int64()
    if pa.types.is_map(target):
        return pa.list_(pa.field("element", pa.struct([
            pa.field("key", pa.string()), pa.field("value", read_type(target.item_type))])))
    if pa.types.is_list(target):
        return pa.list_(pa.field("element", read_type(target.value_type)))
    if pa.types.is_struct(target):
        return pa.struct([pa.field(f.name, read_type(f.type)) for f in target])
    return target


def restore(column: pa.ChunkedArray, target: pa.DataType) -> pa.ChunkedArray:
    """``column`` (read as :func:`read_type` of ``target``) as ``target``.

    Raises:
        pa.ArrowInvalid: a value that is not what the ingestor wrote (bad base64 or uuid
            text), so the caller's per-row fallback dead-letters only that row.
    """
    return pa.chunked_array([_restore(chunk, target) for chunk in column.chunks], target)


def _restore(array: pa.Array, target: pa.DataType) -> pa.Array:
    if array.type == target:
        return array
    mask = array.is_null() if array.null_count else None
    if pa.types.is_struct(target):
        children = [_restore(array.field(i), f.type) for i, f in enumerate(target)]
        return pa.StructArray.from_arrays(children, fields=list(target), mask=mask)
    if pa.types.is_map(target):
        entries = array.values
        items = _restore(entries.field(1), target.item_type)
        return pa.MapArray.from_arrays(array.offsets, entries.field(0), items, type=target,
                                       mask=mask)
    if pa.types.is_list(target):
        values = _restore(array.values, target.value_type)
        return pa.ListArray.from_arrays(array.offsets, values, type=target, mask=mask)
    if pa.types.is_time64(target) or pa.types.is_date32(target):
        return pc.cast(array, target)
    return _from_text(array, target)


def _from_text(array: pa.Array, target: pa.DataType) -> pa.Array:
    """base64 text → binary, uuid text → 16 bytes (one Python call per value)."""
    try:
        if pa.types.is_fixed_size_binary(target):
            return pa.array([None if v is None else uuid.UUID(v).bytes
                             for v in array.to_pylist()], target)
        return pa.array([None if v is None else base64.b64decode(v, validate=True)
                         for v in array.to_pylist()], target)
    except (ValueError, binascii.Error) as exc:
        raise pa.ArrowInvalid(f"not a canonical {target} value: {exc}") from None
