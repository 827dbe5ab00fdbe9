"""Write one batch file and append it to the manifest: the producer's unit of durability.

Why shared: the ingestor's flusher, the benchmarks and the tests must all produce batches
exactly the same way — a unique ULID key, the store's write time as the append deadline's
clock, and the checksum the collector verifies — or tests would prove a different path
from the one that runs in production.

Who calls it: the ingestor's publishers (:mod:`ingestor.publish`: from the ingestor's
process, or inside its store helper process), the benchmarks and the tests.
"""

from __future__ import annotations

from collections.abc import Iterable

from ulid import ULID

from icefloe.checksum import crc32c
from icefloe.formats.batch import BatchBlock, BatchBuilder, Compression
from icefloe.formats.envelope import frame_events
from icefloe.manifest.producer import BatchRef, ManifestProducer
from icefloe.manifest.sharded_producer import ShardedProducer
from icefloe.store.base import AsyncObjectStore

BATCH_PREFIX = "batches/"
BATCH_SUFFIX = ".ifb"


SPREAD_PREFIXES = 256
"""Sub-folders of ``batches/`` that new batch keys spread over (two hex digits)."""


def new_batch_key() -> str:
    """``batches/<xx>/<ULID>.ifb``: unique, and spread over 256 key prefixes.

    Why the ``<xx>`` folder: S3 scales request rates per key prefix, and ULIDs of one
    moment share their leading characters, so every ingestor's PUTs would land on one
    prefix's partition. ``xx`` is the ULID's last random byte in hex: uniform, free, and
    no coordination (the store helper names files before it knows its producer id).
    Keys written before (``batches/<ULID>.ifb``) stay valid: readers take the location
    from the manifest entry, and GC lists all of ``batches/``.
    """
    ulid = ULID()
    return f"{BATCH_PREFIX}{ulid.bytes[-1]:02x}/{ulid}{BATCH_SUFFIX}"


async def publish_batch(store: AsyncObjectStore,
                        producer: ManifestProducer | ShardedProducer, data: bytes, *,
                        record_count: int, streams: Iterable[str],
                        checksum: int | None = None, registry_version: int = 0
                        ) -> int | None:
    """PUT ``data`` under a new key, then append it; return the manifest sequence."""
    key = new_batch_key()
    put = await store.put(key, data)
    return await producer.append(BatchRef(
        location=key, size=len(data), crc32c=crc32c(data) if checksum is None else checksum,
        record_count=record_count, streams=tuple(sorted(set(streams))),
        written_at=put.store_time, registry_version=registry_version))


async def publish_block(store: AsyncObjectStore,
                        producer: ManifestProducer | ShardedProducer,
                        block: BatchBlock, *, streams: Iterable[str],
                        registry_version: int = 0, key: str | None = None
                        ) -> tuple[int | None, int]:
    """:func:`publish_batch` for records not yet compressed: the store compresses them
    (in its helper process if it has one). Returns the manifest sequence and the file's
    size."""
    key = key or new_batch_key()
    stored = await store.put_encoded(key, block)
    sequence = await producer.append(BatchRef(
        location=key, size=stored.size, crc32c=stored.crc32c,
        record_count=block.record_count, streams=tuple(sorted(set(streams))),
        written_at=stored.result.store_time, registry_version=registry_version))
    return sequence, stored.size


def build_batch(events: Iterable[tuple[str, str, int, bytes]], level: int = 3
                ) -> tuple[bytes, int, tuple[str, ...]]:
    """A batch file of ``(stream, event_id, received_at_ms, canonical payload)`` records."""
    builder = BatchBuilder()
    streams: set[str] = set()
    for stream, event_id, received_ms, payload in events:
        builder.add_framed(frame_events(stream, received_ms, [event_id], [payload]), 1)
        streams.add(stream)
    return builder.finish(Compression.ZSTD, level), builder.record_count, tuple(sorted(streams))
