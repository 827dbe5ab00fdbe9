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

import numpy as np
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
    """base64 text → binary, uuid text → 16 bytes."""
    if pa.types.is_fixed_size_binary(target):
        fast = _uuids_from_canonical(array)
        if fast is not None:
            return fast
    try:
        if pa.types.is_fixed_size_binary(target):
            return pa.array([None if v is None else uuid.UUID(v).bytes
                             for v in array.to_pylist()], target)
        return pa.array([None if v is None else base64.b64decode(v, validate=True)
                         for v in array.to_pylist()], target)
    except (ValueError, binascii.Error) as exc:
        raise pa.ArrowInvalid(f"not a canonical {target} value: {exc}") from None


_UUID_TEXT = 36
_NIL_UUID = str(uuid.UUID(int=0))
_HYPHENS = np.array([8, 13, 18, 23])
_HEX_DIGITS = np.setdiff1d(np.arange(_UUID_TEXT), _HYPHENS)


def _nibble_table() -> np.ndarray:
    """Byte → its hex digit's value (either case), 255 for any other byte."""
    table = np.full(256, 255, np.uint8)
    for value, char in enumerate("0123456789abcdef"):
        table[ord(char)] = table[ord(char.upper())] = value
    return table


_NIBBLE = _nibble_table()


def _uuids_from_canonical(array: pa.Array) -> pa.Array | None:
    """uuid text in the ingestor's form (36 characters, hex with hyphens at 8/13/18/23)
    → 16 bytes for a whole array in a few numpy steps, or None when any value has another
    form. Why: the per-value ``uuid.UUID`` path cost ~1.4 µs a value — as much as parsing
    the rest of a 14-column payload. Anything else ``uuid.UUID`` accepts (braces, ``urn:``,
    no hyphens) or refuses goes to that path, so results and errors stay exactly its own."""
    count = len(array)
    if count == 0 or not pa.types.is_string(array.type) or array.null_count == count:
        return None
    text = array.fill_null(_NIL_UUID) if array.null_count else array  # nulls: any valid text
    offsets = np.frombuffer(text.buffers()[1], np.int32, count + 1, text.offset * 4)
    if not (np.diff(offsets) == _UUID_TEXT).all():
        return None
    chars = np.frombuffer(text.buffers()[2], np.uint8, _UUID_TEXT * count, int(offsets[0]))
    chars = chars.reshape(count, _UUID_TEXT)
    if not (chars[:, _HYPHENS] == ord("-")).all():
        return None
    nibbles = _NIBBLE[chars[:, _HEX_DIGITS]]
    if (nibbles == 255).any():
        return None
    packed = (nibbles[:, 0::2] << 4) | nibbles[:, 1::2]
    validity = pc.is_valid(array).buffers()[1] if array.null_count else None
    return pa.Array.from_buffers(pa.binary(16), count, [validity, pa.py_buffer(packed.tobytes())],
                                 null_count=array.null_count)
