"""Kafka's ``wrk``: librdkafka's own Produce requests, captured once, replayed at full speed.

Why: on this 2-core machine a librdkafka producer spends more CPU per record than the
ingestor it feeds (kcat: ~4 CPU-µs per record, over a core at 300k records/s), so a
producer on the same machine measures the two processes' share of the cores, not what one
ingestor takes. ``wrk`` does the same for HTTP: it replays one prepared body. This replays
the requests librdkafka built, so the ingestor does everything it does for librdkafka —
the same batches, records, CRCs, idempotent sequences — while the client only rewrites a
few header fields per request.

``python bench/_kafka_replay.py capture LISTEN_PORT INGESTOR_PORT TOPIC RECORDS OUT``
runs a pass-through proxy on LISTEN_PORT (the capture ingestor must advertise it:
``kafka_advertised_port``, or librdkafka would connect past it) and a confluent-kafka
producer configured as ``_kafka_load.py``'s (idempotent, ``linger.ms`` 5, ``batch.size``
1 MiB, no compression) sending RECORDS of its records; it writes every Produce request the
producer sent to OUT.

``python bench/_kafka_replay.py replay PORT FRAMES SECONDS CONNECTIONS WARMUP`` opens
CONNECTIONS connections, takes a producer id for each (InitProducerId), and sends the
captured requests round and round, at most five in flight per connection (an idempotent
producer's limit), each with the connection's producer id and the partition's next
sequence (the batch's CRC32C recomputed). It prints ``counting`` and ``counted`` around a
window of SECONDS after WARMUP and one JSON line last: ``{"records", "seconds",
"requests", "errors", "first_error"}``; a record counts when its request was answered
without error in the window.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import struct
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import google_crc32c

IN_FLIGHT = 5
"""Requests in flight per connection: an idempotent producer's maximum."""
_PRODUCER_ID_AT, _CRC_AT, _CRC_FROM = 43, 17, 21
"""Offsets inside a v2 record batch: producer id (then epoch, base sequence), CRC, and
where the CRC's coverage starts."""


@dataclass
class Template:
    """One captured Produce request: the frame (with its size) and where its one batch
    starts; the partition it writes and how many records it holds."""

    frame: bytes
    batch_at: int
    partition: int
    count: int
    version: int


def templates(path: str) -> list[Template]:
    out: list[Template] = []
    data = memoryview(Path(path).read_bytes())
    pos = 0
    while pos < len(data):
        batch_at, partition, count, version, size = struct.unpack_from(">iiihi", data, pos)
        pos += 18
        out.append(Template(bytes(data[pos:pos + size]), batch_at, partition, count, version))
        pos += size
    return out


# -- capture ---------------------------------------------------------------------------------

async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                keep: list[bytes] | None) -> None:
    try:
        while True:
            head = await reader.readexactly(4)
            body = await reader.readexactly(int.from_bytes(head, "big"))
            if keep is not None and body[:2] == b"\x00\x00":  # api key 0: Produce
                keep.append(head + body)
            writer.write(head + body)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()


def _locate(frame: bytes) -> tuple[int, int, int, int]:
    """(batch offset, partition, record count, version) of a one-partition Produce frame."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from ingestor.kafka import apis  # why: parse the captured frame once, at capture time

    header, body = apis.read_header(frame[4:])
    request = apis.read_produce(body, header.version)
    parts = [p for t in request.topics for p in t.partitions]
    if len(parts) != 1 or parts[0].records is None:
        raise SystemExit(f"a captured Produce holds {len(parts)} partitions; the replay "
                         "takes one batch per request (message.max.bytes ~ batch.size)")
    batch = bytes(parts[0].records)
    at = frame.rfind(batch)
    count = struct.unpack_from(">i", batch, 57)[0]
    return at, parts[0].index, count, header.version


async def capture(listen: int, upstream: int, topic: str, count: int, out: str) -> None:
    from _kafka_load import producer, records  # why: the same producer and records

    kept: list[bytes] = []

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_connection("127.0.0.1", upstream)
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(_pipe(reader, up_w, kept), _pipe(up_r, writer, None))

    server = await asyncio.start_server(accept, "127.0.0.1", listen)
    pool = records()

    def produce() -> None:
        client = producer(f"127.0.0.1:{listen}", 5, "none")
        for i in range(count):
            value, key = pool[i % len(pool)]
            while True:
                try:
                    client.produce(topic, value, key)
                    break
                except BufferError:
                    client.poll(0.05)
        if client.flush(60):
            raise SystemExit("the capture producer did not deliver every record")

    await asyncio.to_thread(produce)
    server.close()
    records_total = 0
    with open(out, "wb") as sink:
        for frame in kept:
            at, partition, records_in, version = _locate(frame)
            records_total += records_in
            sink.write(struct.pack(">iiihi", at, partition, records_in, version, len(frame)))
            sink.write(frame)
    print(json.dumps({"requests": len(kept), "records": records_total}))


# -- replay ----------------------------------------------------------------------------------

@dataclass
class Tally:
    counting: bool = False
    records: int = 0
    requests: int = 0
    errors: int = 0
    first_error: str = ""
    stop: bool = False
    sequences: dict[tuple[int, int], int] = field(default_factory=dict)


def _init_producer_id(correlation: int) -> bytes:
    body = struct.pack(">hhih", 22, 0, correlation, -1) + struct.pack(">hi", -1, 60_000)
    return len(body).to_bytes(4, "big") + body


def _uvarint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _produce_error(answer: bytes, version: int) -> int:
    """The error code of the one partition a replayed Produce answer holds."""
    if version >= 9:  # flexible: tagged fields, compact arrays and strings
        _, pos = _uvarint(answer, 4)  # the response header's tagged fields
        _, pos = _uvarint(answer, pos)  # topics
        name, pos = _uvarint(answer, pos)
        _, pos = _uvarint(answer, pos + name - 1)  # partitions
    else:
        pos = 4 + 4
        name = struct.unpack_from(">h", answer, pos)[0]
        pos += 2 + name + 4
    return struct.unpack_from(">h", answer, pos + 4)[0]


async def _connection(port: int, plans: list[Template], tally: Tally, offset: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(_init_producer_id(0))
    size = int.from_bytes(await reader.readexactly(4), "big")
    answer = await reader.readexactly(size)
    error, producer_id, epoch = struct.unpack_from(">hqh", answer, 8)
    if error:
        raise SystemExit(f"InitProducerId answered error {error}")
    pending: asyncio.Queue[tuple[int, int] | None] = asyncio.Queue(IN_FLIGHT)
    sequences: dict[int, int] = {}

    async def answers() -> None:
        while (sent := await pending.get()) is not None:
            count, version = sent
            size = int.from_bytes(await reader.readexactly(4), "big")
            code = _produce_error(await reader.readexactly(size), version)
            if tally.counting:
                tally.requests += 1
                if code:
                    tally.errors += 1
                    tally.first_error = tally.first_error or f"Produce error code {code}"
                else:
                    tally.records += count

    reading = asyncio.create_task(answers())
    correlation = 1
    while not tally.stop:
        plan = plans[(offset + correlation) % len(plans)]
        frame = bytearray(plan.frame)
        struct.pack_into(">i", frame, 8, correlation)
        at = plan.batch_at
        sequence = sequences.get(plan.partition, 0)
        sequences[plan.partition] = (sequence + plan.count) & 0x7FFFFFFF
        struct.pack_into(">qhi", frame, at + _PRODUCER_ID_AT, producer_id, epoch, sequence)
        end = at + 12 + struct.unpack_from(">i", frame, at + 8)[0]
        crc = google_crc32c.value(bytes(frame[at + _CRC_FROM:end]))
        struct.pack_into(">I", frame, at + _CRC_AT, crc)
        await pending.put((plan.count, plan.version))
        writer.write(frame)
        await writer.drain()
        correlation += 1
    await pending.put(None)
    await reading
    writer.close()


async def replay(port: int, frames: str, seconds: float, connections: int,
                 warmup: float) -> None:
    plans = templates(frames)
    tally = Tally()
    tasks = [asyncio.create_task(_connection(port, plans, tally, n * 7))
             for n in range(connections)]
    await asyncio.sleep(warmup)
    print("counting", flush=True)
    tally.counting = True
    started = time.perf_counter()
    await asyncio.sleep(seconds)
    tally.counting = False
    took = time.perf_counter() - started
    print("counted", flush=True)
    tally.stop = True
    await asyncio.gather(*tasks)
    print(json.dumps({"records": tally.records, "seconds": took, "requests": tally.requests,
                      "errors": tally.errors, "first_error": tally.first_error}))


def main() -> None:
    mode, *args = sys.argv[1:]
    if mode == "capture":
        asyncio.run(capture(int(args[0]), int(args[1]), args[2], int(args[3]), args[4]))
    elif mode == "replay":
        asyncio.run(replay(int(args[0]), args[1], float(args[2]), int(args[3]),
                           float(args[4])))
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
