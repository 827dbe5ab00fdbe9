"""Kafka frames and record batches built by hand, for tests that speak the protocol over a
raw socket (tests/ingestor/kafka/test_kafka_bad_input.py, test_kafka_auth.py).

Why by hand and not through a client: a client never sends a bad CRC, a lying record count,
two batches in one partition or a sequence gap; these builders make a *correct* frame or
batch (CRC32C computed with google_crc32c, as the protocol defines it) and let a test change
exactly one thing. The request/response layouts come from :mod:`ingestor.kafka.apis`'s
writers where the listener has them; the Produce request and response readers here are
independent of the listener's own code, so a test does not just mirror it.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import zlib
from dataclasses import dataclass, field

import google_crc32c

from ingestor.kafka.wire import Reader, Writer
from testing.kafka_batches import compress as codec_compress
from testing.kafka_batches import field as _nullable
from testing.kafka_batches import varint as zigzag

PRODUCE, METADATA, API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE = 0, 3, 18, 17, 36
INIT_PRODUCER_ID = 22
CODEC = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


def record(index: int, value: bytes | None, key: bytes | None = None, *,
           offset_delta: int | None = None, headers: tuple[tuple[str, bytes], ...] = ()
           ) -> bytes:
    """One record (length-prefixed); ``offset_delta`` defaults to ``index`` (the truth)."""
    body = bytes([0]) + zigzag(0) + zigzag(index if offset_delta is None else offset_delta)
    body += _nullable(key) + _nullable(value) + zigzag(len(headers))
    for name, raw in headers:
        body += _nullable(name.encode()) + _nullable(raw)
    return zigzag(len(body)) + body


def compress(raw: bytes, codec: str) -> bytes:
    """``raw`` as the producer of each codec writes it (snappy raw, as librdkafka)."""
    return codec_compress(codec, raw)


@dataclass
class Batch:
    """A v2 record batch: every field a test may change, the CRC computed last."""

    values: list[bytes | None]
    producer_id: int = -1
    epoch: int = -1
    base_sequence: int = -1
    codec: str = "none"
    attributes: int = 0
    """Extra attribute bits (0x10 transactional, 0x20 control); the codec is ORed in."""
    magic: int = 2
    count: int | None = None
    last_offset_delta: int | None = None
    offset_deltas: list[int] | None = None
    keys: list[bytes | None] = field(default_factory=list)
    timestamp_ms: int = 1_767_225_600_000
    records_bytes: bytes | None = None
    """The (uncompressed) records part as is, instead of building it from ``values``."""
    compressed: bytes | None = None
    """The records part as sent, instead of compressing ``records_bytes``/``values``."""

    def records(self) -> bytes:
        if self.records_bytes is not None:
            return self.records_bytes
        deltas = self.offset_deltas or list(range(len(self.values)))
        return b"".join(record(i, value, self.keys[i] if self.keys else None,
                               offset_delta=deltas[i])
                        for i, value in enumerate(self.values))

    def encode(self, *, crc: int | None = None) -> bytes:
        """The batch's bytes; ``crc`` replaces the correct CRC32C."""
        body = self.compressed if self.compressed is not None else \
            compress(self.records(), self.codec)
        count = len(self.values) if self.count is None else self.count
        last = count - 1 if self.last_offset_delta is None else self.last_offset_delta
        covered = struct.pack(">hiqqqhii", CODEC[self.codec] | self.attributes, last,
                              self.timestamp_ms, self.timestamp_ms, self.producer_id,
                              self.epoch, self.base_sequence, count) + body
        checksum = google_crc32c.value(covered) if crc is None else crc
        after_length = struct.pack(">ibI", 0, self.magic, checksum) + covered
        return struct.pack(">qi", 0, len(after_length)) + after_length


def message_set_v1(value: bytes) -> bytes:
    """One record in the pre-0.11 message format (magic 1, CRC32): what an old client sends."""
    message = struct.pack(">bbq", 1, 0, 1_767_225_600_000) + struct.pack(">i", -1) + \
        struct.pack(">i", len(value)) + value
    crc = zlib.crc32(message)
    entry = struct.pack(">I", crc) + message
    return struct.pack(">qi", 0, len(entry)) + entry


# -- requests -------------------------------------------------------------------------------

def produce_body(version: int, topics: dict[str, list[tuple[int, bytes | None]]], *,
                 acks: int = -1, timeout_ms: int = 10_000,
                 transactional_id: str | None = None) -> bytes:
    """A Produce request body (v3-v9): ``topics`` maps a name to (partition, records)."""
    compact = version >= 9
    out = Writer().string(transactional_id, compact=compact).int16(acks).int32(timeout_ms)
    out.array_len(len(topics), compact=compact)
    for name, partitions in topics.items():
        out.string(name, compact=compact).array_len(len(partitions), compact=compact)
        for index, records in partitions:
            out.int32(index).bytes_(records, compact=compact)
            if compact:
                out.tagged_fields()
        if compact:
            out.tagged_fields()
    if compact:
        out.tagged_fields()
    return out.getvalue()


FLEXIBLE_FROM = {PRODUCE: 9, METADATA: 9, API_VERSIONS: 3, SASL_AUTHENTICATE: 2,
                 INIT_PRODUCER_ID: 2}


def request_frame(api_key: int, version: int, correlation: int, body: bytes, *,
                  client_id: str | None = "raw-test") -> bytes:
    """Size + request header (v1, or v2 with tagged fields for flexible versions) + body."""
    head = Writer().int16(api_key).int16(version).int32(correlation)
    head.string(client_id, compact=False)
    if version >= FLEXIBLE_FROM.get(api_key, 99):
        head.tagged_fields()
    data = head.getvalue() + body
    return len(data).to_bytes(4, "big") + data


def init_producer_id_v3_body(producer_id: int = -1, epoch: int = -1) -> bytes:
    """An InitProducerId v3 request body (flexible, KIP-360): no transactional id; an
    existing producer id and epoch asks for that id's next epoch."""
    return (Writer().uvarint(0).int32(60_000).int64(producer_id).int16(epoch)
            .tagged_fields().getvalue())


def read_init_producer_id_v3(frame: bytes) -> tuple[int, int, int]:
    """(error, producer id, epoch) of an InitProducerId v3 response."""
    reader = Reader(frame)
    reader.int32()  # correlation id
    reader.tagged_fields()
    reader.int32()  # throttle
    answer = reader.int16(), reader.int64(), reader.int16()
    reader.tagged_fields()
    assert reader.remaining() == 0, "bytes left after the InitProducerId response"
    return answer


# -- responses ------------------------------------------------------------------------------

@dataclass
class PartitionAnswer:
    index: int
    error: int
    base_offset: int
    record_errors: list[tuple[int, str | None]]
    message: str | None


@dataclass
class ProduceAnswer:
    correlation: int
    topics: dict[str, list[PartitionAnswer]]
    throttle_ms: int

    def partition(self, topic: str, index: int) -> PartitionAnswer:
        return next(p for p in self.topics[topic] if p.index == index)


def read_produce_answer(frame: bytes, version: int) -> ProduceAnswer:
    """A Produce response (v3-v9), read field by field as the protocol defines it."""
    compact = version >= 9
    reader = Reader(frame)
    correlation = reader.int32()
    if compact:
        reader.tagged_fields()

    def count() -> int:
        return reader.uvarint() - 1 if compact else reader.int32()

    def text() -> str | None:
        return reader.compact_nullable_string() if compact else reader.nullable_string()

    topics: dict[str, list[PartitionAnswer]] = {}
    for _ in range(count()):
        name = text() or ""
        parts = topics[name] = []
        for _ in range(count()):
            index, error, base = reader.int32(), reader.int16(), reader.int64()
            reader.int64()  # log_append_time_ms
            if version >= 5:
                reader.int64()  # log_start_offset
            record_errors: list[tuple[int, str | None]] = []
            message = None
            if version >= 8:
                for _ in range(count()):
                    record_errors.append((reader.int32(), text()))
                    if compact:
                        reader.tagged_fields()
                message = text()
            if compact:
                reader.tagged_fields()
            parts.append(PartitionAnswer(index, error, base, record_errors, message))
        if compact:
            reader.tagged_fields()
    throttle = reader.int32()
    if compact:
        reader.tagged_fields()
    assert reader.remaining() == 0, "bytes left after the Produce response"
    return ProduceAnswer(correlation, topics, throttle)


def read_api_versions_v0(frame: bytes) -> tuple[int, int, dict[int, tuple[int, int]]]:
    """(correlation id, error code, {api key: (min, max)}) of an ApiVersions v0 response."""
    reader = Reader(frame)
    correlation, error = reader.int32(), reader.int16()
    apis = {}
    for _ in range(reader.int32()):
        key = reader.int16()
        apis[key] = (reader.int16(), reader.int16())
    assert reader.remaining() == 0
    return correlation, error, apis


class RawKafka:
    """One client connection speaking frames by hand (asyncio streams: the in-process
    ingestor shares the test's loop)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.correlation = 0

    @classmethod
    async def open(cls, port: int, **kwargs: object) -> RawKafka:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, **kwargs)  # type: ignore[arg-type]
        return cls(reader, writer)

    async def send_raw(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def send(self, api_key: int, version: int, body: bytes) -> int:
        """Send one request; its correlation id."""
        self.correlation += 1
        await self.send_raw(request_frame(api_key, version, self.correlation, body))
        return self.correlation

    async def answer(self, timeout: float = 10) -> bytes:
        """The next response frame (after its size)."""
        size = int.from_bytes(await asyncio.wait_for(self.reader.readexactly(4), timeout),
                              "big")
        return await asyncio.wait_for(self.reader.readexactly(size), timeout)

    async def produce(self, version: int, topics: dict[str, list[tuple[int, bytes | None]]],
                      **kwargs: object) -> ProduceAnswer:
        correlation = await self.send(PRODUCE, version, produce_body(version, topics,
                                                                     **kwargs))  # type: ignore[arg-type]
        answer = read_produce_answer(await self.answer(), version)
        assert answer.correlation == correlation
        return answer

    async def closed(self, timeout: float = 10) -> bool:
        """Whether the server closed the connection (EOF) within ``timeout``; data that
        arrives first is skipped."""
        try:
            async with asyncio.timeout(timeout):
                while await self.reader.read(65536):
                    pass
        except TimeoutError:
            return False
        except ConnectionError:
            return True
        return True

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self.writer.wait_closed()
