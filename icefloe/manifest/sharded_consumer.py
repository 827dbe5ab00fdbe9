"""The fenced consumer of every manifest shard: read, ack and dequeue per shard.

Contract (what the collector relies on when it adopts this class):

* **Positions.** Every entry comes as a :class:`ShardEntry`: its ``shard`` and the
  ``entry`` (whose ``sequence`` is the shard's own). ``(shard, sequence)`` identifies an
  entry for ever; sequences of different shards are unrelated. A table that records
  "committed through" must record it per shard (``{shard: sequence}``), and a shard it
  never saw counts as "nothing committed" — which is how a single-manifest table reads:
  its one sequence is shard 0's.
* **Order.** :meth:`read` returns, from every shard, the entries after that shard's acked
  sequence (or after ``from_sequences[shard]``), each shard's in sequence order and never
  skipping one; shards are interleaved by ingestion time. ``max_entries`` cuts the merged
  list, which leaves every shard a contiguous prefix. No order between shards is implied.
* **Acks and dequeues are per shard** (:meth:`ack` takes ``{shard: sequence}``), durable,
  idempotent, and may be batched as with one manifest. :meth:`dequeue` and
  ``ack(..., dequeue=True)`` answer how many entries each shard dropped.
* **Growing.** The shard count is re-read on every :meth:`read`; entries on a new shard
  appear in the next read after the grow. A shard object that does not exist yet reads
  as empty.
* **Lease** lives on shard 0 only (:meth:`renew_lease`, :meth:`lease`).

Fencing across shards, and why it holds through a crash in the middle of it:

1. **Shard 0 decides.** :meth:`initialize` claims the next epoch on shard 0 with the
   single manifest's CAS (lease respected). That write is the takeover: from then on the
   new epoch exists, and no other consumer can claim the same one.
2. **Then every other shard is fenced** to that epoch (:meth:`ManifestConsumer.fence`),
   one CAS each, all at once; a shard already at a higher epoch means a newer takeover:
   FencedError. Their order does not matter (point 3 makes any subset safe), and one
   after the other a takeover took N contended CASes (seconds at 8-64 shards with busy
   producers, all of it with nothing drained).
3. **Every operation checks shard 0 before touching another shard**, within the same
   call: :meth:`read` reads shard 0 first, :meth:`ack` and :meth:`dequeue` write shard 0
   first (or read it when they leave it alone). So once a newer epoch is claimed on shard
   0, an older consumer is refused on *every* shard — including shards the takeover has
   not fenced yet because it crashed between two fences. Each shard's CAS still checks
   its own epoch as well, so a shard fenced already refuses even a consumer that skipped
   the check.
4. **A shard behind our epoch is fenced on first use**: a shard created after the
   takeover (the count grew), or one a crashed takeover of ours did not reach. Only after
   the shard-0 check of the same call passed, and the fence CAS refuses if the shard went
   higher meanwhile.

What is left is one benign window: an older consumer that checked shard 0 just before a
takeover may land one CAS on shard k before the takeover fences k. That write is ordered
before the fence of k, and the new consumer reads nothing of k before fencing it, so it
sees that write — exactly as, with one manifest, it sees an older consumer's last write
before its epoch bump. The old consumer is refused on its next call.
"""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass
from typing import TypeVar

from ulid import ULID

from icefloe.clock import SYSTEM, Clock, StoreClock
from icefloe.config.manifest import ManifestConfig
from icefloe.errors import FencedError
from icefloe.manifest.cas import CasStats
from icefloe.manifest.consumer import ManifestConsumer
from icefloe.manifest.model import Entry, Manifest
from icefloe.manifest.shards import ensure_shards, read_shard_count, shard_config
from icefloe.store.base import AsyncObjectStore

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ShardEntry:
    """One manifest entry and the shard it was read from."""

    shard: int
    entry: Entry

    @property
    def sequence(self) -> int:
        """The entry's sequence within its shard."""
        return self.entry.sequence

    @property
    def position(self) -> tuple[int, int]:
        """``(shard, sequence)``: the entry's identity across shards."""
        return self.shard, self.entry.sequence


class ShardedConsumer:
    """The single fenced reader of all shards; see the module docstring for the contract.

    ``clock`` (:mod:`icefloe.clock`) times CAS backoff; leases are judged on the store's
    clock. ``config.shards`` is brought onto the store at :meth:`initialize` (a grow; a config
    asking for fewer than the store has reads the store's count, with a warning).
    """

    def __init__(self, store: AsyncObjectStore, config: ManifestConfig | None = None,
                 holder: str | None = None, *, clock: Clock = SYSTEM) -> None:
        self.store = store
        self.clock = clock
        self.config = config or ManifestConfig()
        self.holder = holder or f"consumer-{ULID()}"
        self.epoch: int | None = None
        self.shard_count = 0
        """The shard count as last read (0 before :meth:`initialize`)."""
        self.store_clock = StoreClock(clock)
        self.last_read: dict[int, Manifest] = {}
        """Each shard as the last :meth:`read` saw it (queue metrics need no GET)."""
        self._shards: dict[int, ManifestConsumer] = {}

    # -- shards ---------------------------------------------------------------------------

    def shard(self, number: int) -> ManifestConsumer:
        """The single-manifest consumer of shard ``number`` (same holder, shared clock)."""
        consumer = self._shards.get(number)
        if consumer is None:
            consumer = ManifestConsumer(self.store, shard_config(self.config, number),
                                        self.holder, clock=self.clock)
            consumer.store_clock = self.store_clock
            consumer.epoch = self.epoch if number else consumer.epoch
            self._shards[number] = consumer
        return consumer

    @property
    def stats(self) -> dict[int, CasStats]:
        """CAS writes and conflicts per shard (this consumer's own)."""
        return {number: consumer.stats for number, consumer in sorted(self._shards.items())}

    async def refresh_count(self) -> int:
        """Re-read the shard count from the store."""
        self.shard_count = await read_shard_count(self.store, self.config.key,
                                                  clock=self.clock)
        return self.shard_count

    # -- taking over ----------------------------------------------------------------------

    async def initialize(self, *, respect_lease: bool = False) -> int:
        """Claim the next epoch on shard 0, then fence every other shard; return it.

        A crash (or a store error) after the claim leaves shards unfenced; that is safe
        (module docstring, point 3) and the next ``initialize`` claims a newer epoch and
        fences them all. Raises :class:`LeaseHeldError` with ``respect_lease`` if another
        holder's lease is live, and FencedError if a newer takeover overtook this one.
        """
        self.shard_count = await ensure_shards(self.store, self.config, clock=self.clock)
        epoch = await self.shard(0).initialize(respect_lease=respect_lease)
        self.epoch = epoch
        # all fences finish (or fail) before this returns or raises: nothing of this
        # takeover writes after it has answered
        outcomes = await asyncio.gather(
            *(self.shard(number).fence(epoch) for number in range(1, self.shard_count)),
            return_exceptions=True)
        errors = [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
        if errors:
            fenced = [e for e in errors if isinstance(e, FencedError)]
            raise (fenced or errors)[0]
        return epoch

    async def renew_lease(self) -> float:
        """Extend the lease on shard 0 (the only one); FencedError if replaced."""
        return await self.shard(0).renew_lease()

    async def release_lease(self) -> bool:
        """End our lease on shard 0 now (a clean stop); False if it is not ours."""
        return await self.shard(0).release_lease()

    async def lease(self) -> tuple[str, float, float]:
        """``(holder, lease_expires_at, store_now)`` of shard 0."""
        return await self.shard(0).lease()

    async def confirm(self) -> Manifest:
        """Raise FencedError unless shard 0 still holds our epoch; shard 0 as read."""
        self._require_epoch()
        return await self.shard(0).confirm()

    # -- consuming ------------------------------------------------------------------------

    async def read(self, from_sequences: Mapping[int, int] | None = None,
                   max_entries: int | None = None) -> list[ShardEntry]:
        """Entries of every shard after its ack (or ``from_sequences[shard]``); see the
        contract. Shard 0 is read (and its epoch checked) before any other."""
        self._require_epoch()
        starts = dict(from_sequences or {})
        first = await self.shard(0).read(starts.get(0))
        self._keep(0)
        count = await self.refresh_count()

        async def read_one(number: int) -> list[Entry]:
            entries = await self._on_shard(number, lambda c: c.read(starts.get(number)))
            self._keep(number)
            return entries

        rest = await asyncio.gather(*(read_one(n) for n in range(1, count)))
        tagged = [[ShardEntry(number, entry) for entry in entries]
                  for number, entries in enumerate([first, *rest])]
        merged = heapq.merge(*tagged, key=lambda item: item.entry.ingested_at)
        out: list[ShardEntry] = []
        for item in merged:
            if max_entries is not None and len(out) >= max_entries:
                break
            out.append(item)
        return out

    async def ack(self, positions: Mapping[int, int], *, dequeue: bool = False
                  ) -> dict[int, int]:
        """Acknowledge each shard through its sequence in ``positions``; with ``dequeue``
        also drop the acknowledged entries in the same write. Returns entries removed per
        shard. Shard 0 goes first (it is the fencing check for the others)."""
        self._require_epoch()
        removed: dict[int, int] = {}
        if 0 in positions:
            removed[0] = await self.shard(0).ack(positions[0], dequeue=dequeue)
        elif positions:
            await self.shard(0).confirm()
        others = [n for n in sorted(positions) if n != 0]
        def acker(n: int) -> Callable[[ManifestConsumer], Awaitable[int]]:
            return lambda c: c.ack(positions[n], dequeue=dequeue)

        done = await asyncio.gather(*(self._on_shard(n, acker(n)) for n in others))
        removed.update(zip(others, done, strict=True))
        return removed

    async def dequeue(self, *, skip: Collection[int] = ()) -> dict[int, int]:
        """Drop acknowledged entries from every shard but those in ``skip`` (dequeued by
        the caller just now); entries removed per shard. Shard 0 is always read first: it
        is the fencing check for the others."""
        self._require_epoch()
        removed = {0: await self.shard(0).dequeue()}
        count = self.shard_count or await self.refresh_count()
        others = [n for n in range(1, count) if n not in skip]
        done = await asyncio.gather(*(self._on_shard(n, lambda c: c.dequeue())
                                      for n in others))
        removed.update(zip(others, done, strict=True))
        return removed

    async def snapshot(self) -> dict[int, Manifest]:
        """Every shard as it is now, without a fencing check (metrics, inspection)."""
        count = await self.refresh_count()
        manifests = await asyncio.gather(*(self.shard(n).snapshot() for n in range(count)))
        return dict(enumerate(manifests))

    def acked(self) -> dict[int, int]:
        """Acked sequence per shard as the last :meth:`read` saw it (-1: none)."""
        return {n: m.consumer.acked_through for n, m in sorted(self.last_read.items())}

    # -- helpers --------------------------------------------------------------------------

    def _require_epoch(self) -> None:
        if self.epoch is None:
            raise RuntimeError("ShardedConsumer.initialize() must be called first")

    def _keep(self, number: int) -> None:
        manifest = self.shard(number).last_read
        if manifest is not None:
            self.last_read[number] = manifest

    async def _on_shard(self, number: int,
                        operation: Callable[[ManifestConsumer], Awaitable[T]]) -> T:
        """Run ``operation`` on shard ``number`` (> 0; shard 0 was checked by the caller
        in this call), fencing the shard first if it is behind our epoch."""
        consumer = self.shard(number)
        consumer.epoch = self.epoch
        try:
            return await operation(consumer)
        except FencedError as exc:
            assert self.epoch is not None
            if exc.current_epoch > self.epoch:
                raise
        await consumer.fence(self.epoch)
        return await operation(consumer)
