"""A manifest producer over the shard set: one shard per producer, moved when it grows.

Why it wraps :class:`~icefloe.manifest.producer.ManifestProducer` instead of changing it:
each shard is a whole manifest, so a producer bound to one shard's key is already
correct (group commit, idempotence, deadline, bounds). What sharding adds is only the
choice of shard and the move when the count grows:

* **One shard per producer id.** A process has a stable instance name; its shard is
  :func:`~icefloe.manifest.shards.pick_shard` of that name and the store's count — or,
  given the process's ``index`` among its peers, ``index % count``: hashing spreads
  evenly only on average (one shard per ingestor leaves some shards with 3-5 writers,
  whose acks then wait through lost CAS races), an index spreads exactly (a grow then
  moves most processes, not only those a new shard takes: each move costs a new producer
  id and a wait for the appends in flight, nothing else). Its producer
  (a fresh id) appends only there. Order within a producer is the shard's order.
* **Growing online.** The count is re-read every ``recheck_s`` (injected clock) before an
  append. When the pick changes, appends pause, the old producer's appends in flight
  finish (so every batch of this process appended before the move precedes, in time,
  every batch after it), and a new producer with a new id starts on the new shard. The
  old id is never used again, so its idempotence record on the old shard stays exact.
* **Same face as ManifestProducer** (``append``, ``close``, ``producer_id``, ``stats``,
  ``store``, ``config``), so :mod:`icefloe.manifest.publish` takes either. ``stats`` is one
  object shared by every producer this process had (metrics hold it), and ``shard`` says
  where appends go now.

With ``shards = 1`` on a store that never grew, appends go to shard 0 — the manifest
key itself — exactly as a plain ManifestProducer's do, plus one small GET of the shard
set record per ``recheck_s``.
"""

from __future__ import annotations

import asyncio

from ulid import ULID

from icefloe.clock import SYSTEM, Clock
from icefloe.config.manifest import ManifestConfig
from icefloe.manifest.producer import BatchRef, ManifestProducer, ProducerStats
from icefloe.manifest.shards import pick_shard, read_shard_count, shard_config
from icefloe.store.base import AsyncObjectStore

DEFAULT_RECHECK_S = 10.0
"""How often a producer re-reads the shard count (how long a grow takes to be used)."""


class ShardedProducer:
    """Appends to the shard its instance picks; see the module docstring.

    ``shard`` pins the shard (benchmarks, tests): the count is then never read.
    ``index`` (>= 0) picks shard ``index % count`` instead of hashing ``instance``.
    """

    def __init__(self, store: AsyncObjectStore, config: ManifestConfig | None = None, *,
                 instance: str | None = None, shard: int | None = None,
                 index: int | None = None, recheck_s: float = DEFAULT_RECHECK_S,
                 clock: Clock = SYSTEM) -> None:
        self.store = store
        self.config = config or ManifestConfig()
        self.instance = instance or str(ULID())
        self.clock = clock
        self.recheck_s = recheck_s
        self.stats = ProducerStats()
        self.shard_count = 0
        """The shard count as last read (0 before the first append)."""
        self.moves = 0
        """How often this process moved to another shard (the count grew)."""
        self._pinned = shard
        self._index = index
        self._current: ManifestProducer | None = None
        self._shard: int | None = None
        self._next_check = 0.0
        self._lock = asyncio.Lock()

    @property
    def producer_id(self) -> str | None:
        """The id appends use now (None before the first append)."""
        return self._current.producer_id if self._current is not None else None

    @property
    def shard(self) -> int | None:
        """The shard appends go to now (None before the first append)."""
        return self._shard

    async def append(self, batch: BatchRef) -> int | None:
        """:meth:`ManifestProducer.append` on this process's current shard.

        The returned sequence is the shard's; ``shard`` (read right after, before any
        other await) says which one.
        """
        producer = await self._producer()
        return await producer.append(batch)

    async def close(self) -> None:
        """Wait for queued appends to finish."""
        if self._current is not None:
            await self._current.close()

    async def _producer(self) -> ManifestProducer:
        if self._current is not None and self.clock.monotonic() < self._next_check:
            return self._current
        async with self._lock:
            if self._current is None or self.clock.monotonic() >= self._next_check:
                await self._refresh()
            assert self._current is not None
            return self._current

    async def _refresh(self) -> None:
        """Re-read the count; start a producer on the picked shard if it changed."""
        if self._pinned is not None:
            target = self._pinned
        else:
            self.shard_count = await read_shard_count(self.store, self.config.key,
                                                      clock=self.clock)
            target = pick_shard(self.instance, self.shard_count) if self._index is None \
                else self._index % self.shard_count
        if self._current is None or target != self._shard:
            if self._current is not None:
                # the old id's appends land before the new id's; appends arriving
                # meanwhile wait on the lock (the check time is not renewed yet)
                await self._current.close()
                self.moves += 1
            producer = ManifestProducer(self.store, shard_config(self.config, target),
                                        clock=self.clock)
            producer.stats = self.stats  # one set of counters across moves
            self._current, self._shard = producer, target
        self._next_check = self.clock.monotonic() + self.recheck_s
