"""The ``from = "kafka_*"`` columns, from the Kafka metadata in each record's envelope meta.

The Kafka listener keeps a record's topic, partition, offset, timestamp, key (base64) and
headers (JSON text) in the envelope meta under :data:`~icefloe.streams.mappings.META_KAFKA`;
:func:`pipeline.load.mapped.add_derived` parses every meta of a batch in one columnar pass
with :data:`KAFKA_META_TYPE` as that member's type and hands the struct column here.

Why columnar all the way, the key included: every Kafka record has its own meta (its
offset), so the "parse each distinct meta once" saving of request metadata does not apply,
and a Python loop per row would be the slowest step of the decode. The base64 key is
decoded with numpy over the whole column at once (:func:`b64decode_column`); a value that
is not the padded standard base64 the ingestor writes takes a per-row path that gives it
null, with a warning (a meta the ingestor did not write).
"""

from __future__ import annotations

import binascii
import logging

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from icefloe.streams.mappings import KAFKA_META_KEYS
from pipeline.columns import ARROW_TYPES, TIMESTAMP

log = logging.getLogger("icefloe.pipeline")

KAFKA_META_TYPE = pa.struct([
    pa.field("t", pa.string()), pa.field("p", pa.int64()), pa.field("o", pa.int64()),
    pa.field("ts", pa.int64()), pa.field("k", pa.string()), pa.field("hs", pa.string())])
"""The :data:`~icefloe.streams.mappings.META_KAFKA` member as the meta parse reads it."""

_ALPHABET = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_PAD = 64
_BAD = 255
_SEXTETS = np.full(256, _BAD, np.uint8)
_SEXTETS[np.frombuffer(_ALPHABET, np.uint8)] = np.arange(64, dtype=np.uint8)
_SEXTETS[ord("=")] = _PAD


def kafka_column(kafka: pa.ChunkedArray | pa.Array, source: str, type_: str,
                 column: str) -> pa.Array:
    """The values of a ``from = source`` column of type ``type_`` (named ``column`` in
    warnings) from the parsed Kafka meta struct (null where a record has none)."""
    field = pc.struct_field(kafka, KAFKA_META_KEYS[source])
    value = field.combine_chunks() if isinstance(field, pa.ChunkedArray) else field
    if source == "kafka_key":
        key = b64decode_column(value, column)
        return key if type_ == "binary" else _utf8(key, column)
    if source == "kafka_timestamp" and type_ != "long":
        # as from = "datetime": milliseconds → the microsecond timestamp (→ date)
        return pc.multiply(value, 1000).cast(TIMESTAMP).cast(ARROW_TYPES[type_])
    return value.cast(ARROW_TYPES[type_])


def b64decode_column(texts: pa.Array, column: str) -> pa.Array:
    """Padded standard base64 texts → their bytes (null stays null), vectorised."""
    decoded = _b64decode_fast(pc.fill_null(texts, ""))
    if decoded is None:
        decoded = _b64decode_rows(texts, column)
    return pc.if_else(texts.is_valid(), decoded, pa.scalar(None, pa.binary()))


def _b64decode_fast(texts: pa.Array) -> pa.Array | None:
    """``texts`` (no nulls) decoded in a few numpy passes over the characters; None when a
    value is not padded standard base64 (wrong length, alphabet or padding).

    How: every value is a whole number of 4-character quanta, so the concatenated
    characters are a sequence of quanta, each decoding to 3 bytes; padding (``=``, only in
    a value's last quantum) drops 1 or 2 of them, and each value's output offset is the
    running count of kept bytes at its first quantum.
    """
    if len(texts) == 0:
        return pa.array([], pa.binary())
    offsets = np.frombuffer(texts.buffers()[1], np.int32, len(texts) + 1, texts.offset * 4)
    starts = offsets - offsets[0]
    if (starts % 4).any():
        return None
    buffer = texts.buffers()[2]
    chars = np.frombuffer(buffer, np.uint8)[offsets[0]:offsets[-1]] if buffer is not None \
        else np.zeros(0, np.uint8)
    if len(chars) == 0:
        return pa.array([b""] * len(texts), pa.binary())
    sextets = _SEXTETS[chars]
    # one quantum per little-endian word: character i in bits 8i..8i+7
    quanta = sextets.view("<u4")
    pad3 = (quanta >> 24) == _PAD
    pad2 = ((quanta >> 16) & 0xFF) == _PAD
    last = np.zeros(len(quanta), bool)
    ends = starts[1:] // 4
    last[ends[ends > starts[:-1] // 4] - 1] = True
    if sextets.max() == _BAD or (quanta & 0x4040).any() or (pad2 & ~pad3).any() \
            or (pad3 & ~last).any():
        return None  # a character outside the alphabet, or "=" where it cannot be
    quanta = quanta & 0x3F3F3F3F  # "=" (64) counts as 0 bits
    word = ((quanta << 18) & 0xFC0000) | ((quanta << 4) & 0x3F000) \
        | ((quanta >> 10) & 0xFC0) | (quanta >> 24)
    triples = (word << 8).astype(">u4").view(np.uint8).reshape(-1, 4)[:, :3]
    padding = pad3.view(np.uint8) + pad2.view(np.uint8)
    if pad3.any():
        keep = np.ones((len(quanta), 3), bool)
        keep[:, 1] = ~pad2
        keep[:, 2] = ~pad3
        data = triples[keep]
    else:
        data = np.ascontiguousarray(triples).reshape(-1)
    kept = np.zeros(len(quanta) + 1, np.int32)
    np.cumsum(3 - padding, dtype=np.int32, out=kept[1:])
    out_offsets = kept[starts // 4]
    return pa.Array.from_buffers(pa.binary(), len(texts),
                                 [None, pa.py_buffer(out_offsets), pa.py_buffer(data)])


def _b64decode_rows(texts: pa.Array, column: str) -> pa.Array:
    """The slow path: each value decoded on its own, null when it is not base64."""
    out: list[bytes | None] = []
    for text in texts.to_pylist():
        try:
            out.append(None if text is None else binascii.a2b_base64(text, strict_mode=True))
        except (binascii.Error, ValueError):
            out.append(None)
    bad = sum(1 for text, value in zip(texts.to_pylist(), out, strict=True)
              if text is not None and value is None)
    if bad:
        log.warning("column %s (from = kafka_key): %d record key(s) in the envelope meta "
                    "are not base64 (a meta the ingestor did not write): stored as null",
                    column, bad, extra={"column": column})
    return pa.array(out, pa.binary())


def _utf8(keys: pa.Array, column: str) -> pa.Array:
    """Keys as text for a string column. The Kafka listener refuses a key that is not UTF-8
    for such a column (:func:`ingestor.mappings.check_kafka_key`); one that still is (the
    column was binary when the record was accepted) is null, with a warning."""
    try:
        return keys.cast(pa.string())
    except pa.ArrowInvalid:
        pass
    out: list[str | None] = []
    for key in keys.to_pylist():
        try:
            out.append(None if key is None else key.decode())
        except UnicodeDecodeError:
            out.append(None)
    bad = sum(1 for key, text in zip(keys.to_pylist(), out, strict=True)
              if key is not None and text is None)
    log.warning("column %s (from = kafka_key): %d record key(s) are not UTF-8 text for this "
                "string column: stored as null", column, bad, extra={"column": column})
    return pa.array(out, pa.string())
