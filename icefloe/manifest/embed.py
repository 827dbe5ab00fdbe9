"""The manifest's reading side as a Python object: ``Collector`` for your own process.

Why on the manifest and not the Spark collector: a program that wants the events (to index
them, forward them, test against them) needs the queue's guarantees — one fenced reader,
entries in order per shard, nothing skipped, acks that survive a crash — not Iceberg. So
this is :class:`icefloe.manifest.ShardedConsumer`, the very consumer the collector runs,
plus the verified batch-file read (:func:`icefloe.manifest.reader.fetch_batch`) and the
record envelope decode. It takes the same lease as ``icefloe collector``: :meth:`initialize`
refuses while another reader's lease is live (a running collector) unless
``takeover=True``, and taking over fences the previous reader on every shard.

    collector = Collector.open(config)
    await collector.initialize()
    while (batch := await collector.next_batch()) is not None:
        handle(batch.events)
        await collector.ack(batch)      # at least once: a crash before this re-delivers

A reader that stores its own positions downstream (opendata's ``last_acked_sequence``)
passes them back: ``initialize(start_after={shard: sequence})`` never hands out an entry
at or below them, and :meth:`Collector.flush` acknowledges and dequeues everything read so
far in one write per shard.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from icefloe.clock import SYSTEM, Clock
from icefloe.config import Config
from icefloe.config.manifest import ManifestConfig
from icefloe.formats.batch import decode_block, iter_records
from icefloe.formats.envelope import Envelope, decode_envelope
from icefloe.manifest.reader import fetch_batch
from icefloe.manifest.sharded_consumer import ShardedConsumer, ShardEntry
from icefloe.store import open_async_store, options_for
from icefloe.store.base import AsyncObjectStore
from icefloe.streams.entries import entry_bytes
from icefloe.streams.model import StreamConfig


@dataclass(frozen=True)
class Batch:
    """The entries :meth:`Collector.next_batch` read and their events, in entry order."""

    entries: Sequence[ShardEntry]
    events: Sequence[Envelope]
    positions: dict[int, int] = field(default_factory=dict)
    """Per shard, the highest sequence in the batch: what :meth:`Collector.ack` acks."""


class Collector:
    """The fenced reader of a store's manifest (all shards)."""

    def __init__(self, store: AsyncObjectStore, manifest: ManifestConfig | None = None, *,
                 holder: str | None = None, clock: Clock = SYSTEM,
                 owns_store: bool = False, streams: Sequence[StreamConfig] = ()) -> None:
        self.store = store
        self._opaque = {s.name: s for s in streams if s.payload == "bytes"}
        """``payload = "bytes"`` streams: their events are handed out as the entries'
        bytes, not as the canonical JSON that carries them."""
        self.consumer = ShardedConsumer(store, manifest or ManifestConfig(), holder,
                                        clock=clock)
        self.clock = clock
        self._owns_store = owns_store
        self._next: dict[int, int] = {}
        """Per shard, the sequence after the last one handed out (the next batch's start)."""
        self._renewed_at = 0.0

    @classmethod
    def open(cls, config: Config, *, holder: str | None = None,
             clock: Clock = SYSTEM) -> Collector:
        """A reader of ``config``'s store and ``[manifest]`` (it closes the store)."""
        store = open_async_store(config.store.url, options_for(config.store.endpoint_url,
                                                               config.store.region),
                                 control_url=config.store.control_url)
        return cls(store, config.manifest.build(), holder=holder, clock=clock,
                   owns_store=True, streams=config.streams)

    @property
    def epoch(self) -> int | None:
        return self.consumer.epoch

    async def initialize(self, *, takeover: bool = False,
                         start_after: Mapping[int, int] | None = None) -> int:
        """Take the lease and fence any earlier reader; return the new epoch.

        Raises :class:`icefloe.errors.LeaseHeldError` (holder, seconds left) while another
        reader's lease is live, unless ``takeover``: then that reader is fenced (its next
        read or ack fails with :class:`icefloe.errors.FencedError`).

        ``start_after={shard: sequence}``: positions the caller stored downstream (the
        ``positions`` of the last batch it made durable). Entries at or below them are
        skipped, never handed out again, even when the manifest has not acknowledged them
        (the caller's store is the truth); the next :meth:`ack` or :meth:`flush` of that
        shard acknowledges them too. Shards left out start after their acknowledged entry.
        """
        for shard, sequence in (start_after or {}).items():
            if shard < 0 or sequence < -1:
                raise ValueError(f"start_after: shard {shard}, sequence {sequence}: shards "
                                 "and sequences are whole numbers from 0 (-1: from the start)")
        epoch = await self.consumer.initialize(respect_lease=not takeover)
        self._next = {shard: sequence + 1 for shard, sequence in (start_after or {}).items()}
        self._renewed_at = self.clock.monotonic()
        return epoch

    async def next_batch(self, max_entries: int | None = None) -> Batch | None:
        """The entries after the last one handed out (after the acked ones at first),
        their batch files verified and their events decoded; None when nothing waits.
        Renews the lease when half of it has passed."""
        await self._keep_lease()
        entries = await self.consumer.read(self._next or None, max_entries)
        if not entries:
            return None
        events: list[Envelope] = []
        positions: dict[int, int] = {}
        for item in entries:
            block, count = decode_block(await fetch_batch(self.store, item.entry))
            events.extend(self._handed(decode_envelope(record))
                          for record in iter_records(block, count))
            positions[item.shard] = max(positions.get(item.shard, -1), item.sequence)
        self._next.update({shard: last + 1 for shard, last in positions.items()})
        return Batch(entries, events, positions)

    def _handed(self, event: Envelope) -> Envelope:
        """A bytes stream's event carries its entry's bytes as the payload."""
        stream = self._opaque.get(event.stream)
        if stream is None:
            return event
        return dataclasses.replace(event, payload=entry_bytes(stream, event.payload))

    async def flush(self) -> dict[int, int]:
        """Acknowledge and dequeue everything handed out so far (and what ``start_after``
        skipped), one write per shard; returns the positions acknowledged. opendata's
        ``flush()``: for a reader that acks downstream first and the queue in bulk."""
        positions: dict[int, int] = {}
        for shard, following in self._next.items():
            last = self.consumer.last_read.get(shard)
            if last is None:
                continue  # never read: nothing of it was handed out
            through = min(following - 1, last.next_sequence - 1)
            if through >= last.consumer.acked_through and through >= 0:
                positions[shard] = through
        if positions:
            await self.consumer.ack(positions, dequeue=True)
        return positions

    async def ack(self, batch: Batch, *, dequeue: bool = True) -> None:
        """Acknowledge ``batch`` (and everything handed out before it); with ``dequeue``
        the acked entries leave the manifest in the same write. Their batch files stay:
        deleting them is the collector's garbage collection."""
        await self.consumer.ack(batch.positions, dequeue=dequeue)

    async def _keep_lease(self) -> None:
        if self.clock.monotonic() - self._renewed_at >= self.consumer.config.lease_s / 2:
            await self.consumer.renew_lease()
            self._renewed_at = self.clock.monotonic()

    async def close(self) -> None:
        if self._owns_store:
            await self.store.close()

    async def __aenter__(self) -> Collector:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
