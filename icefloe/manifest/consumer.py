"""The manifest consumer: reads entries in order, acks, dequeues — fenced by epoch.

Why epochs: exactly one collector may consume. ``initialize()`` bumps the manifest's epoch
in a CAS write, and every later read, ack and dequeue of a consumer checks that the epoch
is still its own. A collector that was replaced (or paused long enough for another to take
over) therefore gets :class:`~icefloe.errors.FencedError` on its very next manifest
operation and stops; it can never ack or dequeue entries the new collector has not seen.
Its Iceberg commits are refused separately, because tables record the epoch too.

Acks are durable (``acked_through`` in the manifest); ``dequeue`` removes acked entries in
bulk, so the two can be batched independently. Both are idempotent: a retry after an
ambiguous write re-reads, finds its own change, and writes nothing.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec
from ulid import ULID

from icefloe.clock import SYSTEM, Clock, StoreClock
from icefloe.config.manifest import ManifestConfig
from icefloe.errors import FencedError, LeaseHeldError
from icefloe.manifest.cas import CasStats, Loaded, cas_update, load
from icefloe.manifest.model import Entry, Manifest
from icefloe.store.base import AsyncObjectStore


class ManifestConsumer:
    """The single fenced reader of the manifest.

    ``clock`` (:mod:`icefloe.clock`) times CAS backoff; leases are judged on the store's
    clock.
    """

    def __init__(self, store: AsyncObjectStore, config: ManifestConfig | None = None,
                 holder: str | None = None, *, clock: Clock = SYSTEM) -> None:
        self.store = store
        self.clock = clock
        self.config = config or ManifestConfig()
        self.holder = holder or f"consumer-{ULID()}"
        self.epoch: int | None = None
        self.stats = CasStats()
        self.last_read: Manifest | None = None  # what read() saw (queue metrics need no GET)
        self.store_clock = StoreClock(clock)
        """The store's time as of the last manifest read or write (ages that decide what
        may be deleted or forgotten are judged by it, not by this host's clock)."""

    async def initialize(self, *, respect_lease: bool = False) -> int:
        """Take over the queue: bump the epoch (fencing any older consumer); return it.

        With ``respect_lease`` the bump happens only if no *other* holder has a live lease
        at the moment of the write (checked inside the CAS, so a standby that saw an expired
        lease cannot fence an active consumer that renewed in between, and two standbys
        cannot both take over); otherwise :class:`LeaseHeldError` is raised.
        """

        def bump(loaded: Loaded) -> Manifest:
            manifest = loaded.manifest
            holder = manifest.consumer.holder
            if respect_lease and holder not in ("", self.holder) \
                    and manifest.consumer.lease_expires_at > loaded.store_time:
                raise LeaseHeldError(holder, manifest.consumer.lease_expires_at
                                     - loaded.store_time)
            consumer = msgspec.structs.replace(
                manifest.consumer, holder=self.holder,
                lease_expires_at=loaded.store_time + self.config.lease_s)
            return manifest.replace(epoch=manifest.epoch + 1, consumer=consumer)

        _, written = await self._update(bump)
        assert written is not None
        self.epoch = written.epoch
        return written.epoch

    async def fence(self, epoch: int) -> None:
        """Raise this manifest's epoch to ``epoch`` claimed elsewhere; consume at it.

        Why: with shards, a takeover claims its epoch on shard 0 and then fences every
        other shard to the same epoch (:mod:`icefloe.manifest.sharded_consumer`). An epoch
        already higher means a newer consumer claimed it: :class:`FencedError`. Already
        at ``epoch`` under our name: nothing is written (a retried ambiguous fence).
        """

        def lift(loaded: Loaded) -> Manifest | None:
            manifest = loaded.manifest
            if manifest.epoch > epoch:
                raise FencedError(epoch, manifest.epoch)
            if manifest.epoch == epoch and manifest.consumer.holder == self.holder:
                return None
            consumer = msgspec.structs.replace(manifest.consumer, holder=self.holder)
            return manifest.replace(epoch=epoch, consumer=consumer)

        await self._update(lift)
        self.epoch = epoch

    async def renew_lease(self) -> float:
        """Extend our lease to store-time + ``lease_s``; FencedError if we were replaced.

        Why a lease on top of epochs: epochs make a replaced collector harmless, the lease
        decides *when* a standby may replace the active one — only once the active one has
        stopped renewing, so two healthy replicas never take turns fencing each other.
        Returns the new expiry (store clock).
        """
        expires = 0.0

        def extend(loaded: Loaded) -> Manifest:
            nonlocal expires
            manifest = loaded.manifest
            self._check(manifest)
            expires = loaded.store_time + self.config.lease_s
            consumer = msgspec.structs.replace(manifest.consumer, holder=self.holder,
                                               lease_expires_at=expires)
            return manifest.replace(consumer=consumer, revision=manifest.revision + 1)

        await self._update(extend)
        return expires

    async def release_lease(self) -> bool:
        """End our lease now; False when it is not ours any more (replaced, or taken).

        Why: a collector that stops cleanly (SIGTERM, ``icefloe run`` done) would otherwise
        keep a waiting standby out for up to ``lease_s``. Only the lease is ended: the epoch
        stays, so nothing this consumer might still send is accepted after a takeover any
        more than before, and a standby still bumps the epoch to become active.
        """
        released = False

        def end(loaded: Loaded) -> Manifest | None:
            nonlocal released
            manifest = loaded.manifest
            if self.epoch is None or manifest.epoch != self.epoch \
                    or manifest.consumer.holder != self.holder:
                return None
            released = True
            if manifest.consumer.lease_expires_at <= loaded.store_time:
                return None  # lapsed already
            consumer = msgspec.structs.replace(manifest.consumer,
                                               lease_expires_at=loaded.store_time)
            return manifest.replace(consumer=consumer, revision=manifest.revision + 1)

        await self._update(end)
        return released

    async def lease(self) -> tuple[str, float, float]:
        """``(holder, lease_expires_at, store_now)``: who holds the queue, until when."""
        loaded = await load(self.store, self.config.key, clock=self.clock)
        self.store_clock.observe(loaded.store_time)
        consumer = loaded.manifest.consumer
        return consumer.holder, consumer.lease_expires_at, loaded.store_time

    def _check(self, manifest: Manifest) -> None:
        if self.epoch is None:
            raise RuntimeError("ManifestConsumer.initialize() must be called first")
        if manifest.epoch != self.epoch:
            raise FencedError(self.epoch, manifest.epoch)

    async def _update(self, mutate: Callable[[Loaded], Manifest | None]
                      ) -> tuple[Loaded, Manifest | None]:
        loaded, written = await cas_update(self.store, self.config.key, mutate,
                                           backoff=self.config.conflict_backoff,
                                           stats=self.stats, clock=self.clock)
        self.store_clock.observe(loaded.store_time)
        return loaded, written

    async def read(self, from_sequence: int | None = None,
                   max_entries: int | None = None) -> list[Entry]:
        """Entries from ``from_sequence`` (default: after the last ack), in order."""
        loaded = await load(self.store, self.config.key, clock=self.clock)
        self.store_clock.observe(loaded.store_time)
        manifest = loaded.manifest
        self._check(manifest)
        self.last_read = manifest
        start = manifest.consumer.acked_through + 1 if from_sequence is None else from_sequence
        entries = manifest.entries_from(start)
        return list(entries if max_entries is None else entries[:max_entries])

    async def ack(self, sequence: int, *, dequeue: bool = False) -> int:
        """Acknowledge every entry up to and including ``sequence``.

        With ``dequeue=True`` the acknowledged entries are also removed in the same CAS
        write — one write instead of two, which matters when many producers contend for
        the manifest. Returns how many entries this call removed.
        """
        removed = 0

        def mark(loaded: Loaded) -> Manifest | None:
            nonlocal removed
            manifest = loaded.manifest
            self._check(manifest)
            acked = max(sequence, manifest.consumer.acked_through)
            if sequence >= manifest.next_sequence:
                raise ValueError(f"cannot ack sequence {sequence}: the highest sequence in "
                                 f"the manifest is {manifest.next_sequence - 1}")
            removed = max(0, acked + 1 - manifest.first_sequence) if dequeue else 0
            if acked == manifest.consumer.acked_through and removed == 0:
                return None  # already done (e.g. a retried ambiguous write)
            consumer = msgspec.structs.replace(manifest.consumer, acked_through=acked)
            return manifest.drop_first(removed).replace(consumer=consumer,
                                                        revision=manifest.revision + 1)

        await self._update(mark)
        return removed

    async def dequeue(self) -> int:
        """Remove acknowledged entries; return how many this call removed."""
        removed = 0

        def drop(loaded: Loaded) -> Manifest | None:
            nonlocal removed
            manifest = loaded.manifest
            self._check(manifest)
            removed = max(0, manifest.consumer.acked_through + 1 - manifest.first_sequence)
            if removed == 0:
                return None
            return manifest.drop_first(removed)

        await self._update(drop)
        return removed

    async def confirm(self) -> Manifest:
        """Read the manifest and raise :class:`FencedError` if another consumer took over.

        Why: a collector that created something others find only by listing (a table, a
        staging state) confirms its epoch afterwards, before relying on it; a newer
        collector that listed before the creation bumped the epoch first, so this read
        sees it.
        """
        manifest = (await load(self.store, self.config.key, clock=self.clock)).manifest
        self._check(manifest)
        return manifest

    async def snapshot(self) -> Manifest:
        """The manifest as it is now, without a fencing check (metrics, inspection)."""
        return (await load(self.store, self.config.key, clock=self.clock)).manifest

