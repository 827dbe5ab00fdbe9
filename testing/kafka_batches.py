"""Kafka record batches (magic 2) built by hand, for tests and benchmarks that must send
exactly the bytes they mean: a correct batch, or one with a single thing wrong.

Why not a client's encoder: real clients are used wherever the client is the point
(tests/ingestor/kafka/test_kafka_clients.py); here the point is the listener's checks, so
each field can be set to a lie.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

import cramjam
import google_crc32c
import zstandard

CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


def varint(value: int) -> bytes:
    """A zig-zag varint, as records use."""
    raw = (value << 1) ^ (value >> 63)
    out = bytearray()
    while raw > 0x7F:
        out.append((raw & 0x7F) | 0x80)
        raw >>= 7
    out.append(raw)
    return bytes(out)


def field(value: bytes | None) -> bytes:
    """A nullable length-prefixed field of a record (key, value, header name or value)."""
    return varint(-1) if value is None else varint(len(value)) + value


@dataclass
class Record:
    value: bytes | None
    key: bytes | None = None
    headers: Sequence[tuple[str, bytes | None]] = ()
    timestamp_delta: int = 0


def encode_record(index: int, record: Record) -> bytes:
    body = b"\x00" + varint(record.timestamp_delta) + varint(index) + field(record.key) \
        + field(record.value) + varint(len(record.headers))
    for name, value in record.headers:
        body += field(name.encode()) + field(value)
    return varint(len(body)) + body


def compress(codec: str, data: bytes) -> bytes:
    if codec == "none":
        return data
    if codec == "gzip":
        return bytes(cramjam.gzip.compress(data))
    if codec == "snappy":
        return bytes(cramjam.snappy.compress_raw(data))
    if codec == "lz4":
        return bytes(cramjam.lz4.compress(data))
    return zstandard.ZstdCompressor().compress(data)


@dataclass
class Batch:
    """Every field of a v2 record batch; ``encode()`` computes what is not overridden."""

    records: Sequence[Record]
    codec: str = "none"
    producer_id: int = -1
    producer_epoch: int = -1
    base_sequence: int = -1
    base_timestamp: int = 1_767_225_600_000
    attributes_extra: int = 0
    """Bits ORed into the attributes (0x10 transactional, 0x20 control, 0x08 log-append)."""
    magic: int = 2
    count: int | None = None
    last_offset_delta: int | None = None
    crc: int | None = None
    body: bytes | None = None
    """The (compressed) records as sent, instead of encoding ``records``."""
    extra: bytes = b""

    def encode(self) -> bytes:
        count = len(self.records) if self.count is None else self.count
        raw = b"".join(encode_record(i, r) for i, r in enumerate(self.records))
        body = compress(self.codec, raw) if self.body is None else self.body
        after_crc = struct.pack(
            ">hiqqqhii", CODECS[self.codec] | self.attributes_extra,
            count - 1 if self.last_offset_delta is None else self.last_offset_delta,
            self.base_timestamp, self.base_timestamp, self.producer_id, self.producer_epoch,
            self.base_sequence, count) + body
        crc = google_crc32c.value(after_crc) if self.crc is None else self.crc
        head = struct.pack(">qiib", 0, 4 + 1 + 4 + len(after_crc), 0, self.magic)
        return head + struct.pack(">I", crc) + after_crc + self.extra
