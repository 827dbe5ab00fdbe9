"""The manifest producer: appends flushed batch files, exactly once, with group commit.

Why it is built this way:

* **Group commit.** Every process has one appender task. Batches that arrive while a CAS
  is in flight wait and go together in the next one — or join the current group when its
  CAS lost a race and is retried — so N concurrent flushes cost one manifest write, and
  the entries carried per write grow as contention between processes rises.
* **Idempotent producer.** Each process has a producer id (a ULID) and numbers its batches
  1, 2, 3… The manifest remembers, per producer, the highest number appended and the
  numbers below it that the same write refused (deadline, full queue). Before appending,
  the producer drops batches at or below that mark that were not refused: a retry after an
  ambiguous write (timeout, lost response) can never append the same batch twice — even if
  the collector consumed and dequeued the entry in between — and never answers a batch
  that write refused as appended.
* **Deadline.** A batch older than ``append_deadline_s`` (store clock) is never appended;
  its waiters fail instead. GC's grace period exceeds the deadline, so GC never deletes a
  file that could still be appended.
* **Bounded queue.** Beyond ``max_entries``/``max_bytes`` appends fail with
  ``QueueFullError`` (the ingestor answers 429/503) instead of growing one object forever.
* **Never fenced.** Producers keep the consumer's state as they found it; an epoch change
  never blocks them.
* **No read before most appends.** The producer starts each CAS from the manifest it wrote
  last (:class:`~icefloe.store.cas.LastWritten`); only when someone else wrote since (the
  collector's acks, another ingestor) does the conditional PUT fail and a read follow.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

from ulid import ULID

from icefloe.clock import SYSTEM, Clock
from icefloe.config.manifest import ManifestConfig
from icefloe.errors import DeadlineExceededError, QueueFullError
from icefloe.manifest.cas import CasStats, LastWritten, Loaded, cas_update
from icefloe.manifest.model import Entry, Manifest, ProducerState
from icefloe.store.base import AsyncObjectStore


@dataclass(frozen=True, slots=True)
class BatchRef:
    """A batch file already written to the store, ready to be appended.

    ``written_at`` is the store's clock when the PUT was acknowledged (``PutResult``).
    """

    location: str
    size: int
    crc32c: int
    record_count: int
    streams: tuple[str, ...]
    written_at: float
    registry_version: int = 0


@dataclass
class _Pending:
    number: int
    batch: BatchRef
    future: asyncio.Future[int | None]


@dataclass
class ProducerStats(CasStats):
    """Counters for metrics: CAS writes/conflicts plus batches by outcome."""

    appended: int = 0
    duplicates_skipped: int = 0
    deadline_exceeded: int = 0
    queue_full: int = 0
    groups: int = 0
    largest_group: int = 0


Outcome = int | None | Exception


class ManifestProducer:
    """Appends :class:`BatchRef` s to the manifest; one instance per process.

    ``clock`` (:mod:`icefloe.clock`) times CAS backoff and carries the store's clock
    forward from the last write; deadlines themselves are judged on the store's clock.
    """

    def __init__(self, store: AsyncObjectStore, config: ManifestConfig | None = None,
                 producer_id: str | None = None, *, clock: Clock = SYSTEM) -> None:
        self.store = store
        self.clock = clock
        self.config = config or ManifestConfig()
        self.producer_id = producer_id or str(ULID())
        self.stats = ProducerStats()
        self._next_number = 1
        self._queue: list[_Pending] = []
        self._worker: asyncio.Task[None] | None = None
        self._last: LastWritten[Manifest] = LastWritten(clock)  # no read before most appends

    async def append(self, batch: BatchRef) -> int | None:
        """Append ``batch``; return its sequence once the manifest write succeeded.

        Returns None when an earlier ambiguous attempt turned out to have succeeded and the
        entry was already dequeued (durable, sequence no longer known). Raises
        ``DeadlineExceededError``, ``QueueFullError`` or a store error when the batch was
        *not* appended (or, for a store error, may have been: it is then present at most
        once, and the caller must not acknowledge it).
        """
        future: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()
        self._queue.append(_Pending(self._next_number, batch, future))
        self._next_number += 1
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._drain(), name="manifest-appender")
        return await future

    async def close(self) -> None:
        """Wait for queued appends to finish."""
        if self._worker is not None:
            with contextlib.suppress(Exception):
                await self._worker

    async def _drain(self) -> None:
        while self._queue:
            group: list[_Pending] = []
            try:
                outcomes = await self._commit(group)
            except Exception as exc:  # the store failed: nobody in the group is durable
                outcomes = {p.number: exc for p in group}
            for pending in group:
                if pending.future.done():
                    continue  # the caller went away; the batch may still be appended
                outcome = outcomes[pending.number]
                if isinstance(outcome, Exception):
                    pending.future.set_exception(outcome)
                else:
                    pending.future.set_result(outcome)

    def _absorb(self, group: list[_Pending]) -> None:
        """Move queued batches into ``group`` (up to ``max_group``).

        Called at the start of every CAS attempt: batches that arrived while a lost race
        was being retried ride along, so groups grow exactly when contention is high.
        """
        take = self.config.max_group - len(group)
        if take > 0 and self._queue:
            group.extend(self._queue[:take])
            del self._queue[:take]

    async def _commit(self, group: list[_Pending]) -> dict[int, Outcome]:
        outcomes: dict[int, Outcome] = {}
        duplicates: set[int] = set()

        def mutate(loaded: Loaded) -> Manifest | None:
            self._absorb(group)
            outcomes.clear()
            duplicates.clear()
            return self._plan(loaded, group, outcomes, duplicates)

        await cas_update(self.store, self.config.key, mutate,
                         backoff=self.config.conflict_backoff, stats=self.stats,
                         last=self._last, clock=self.clock)
        self._count(outcomes, duplicates, group_size=len(group))
        return outcomes

    def _plan(self, loaded: Loaded, group: list[_Pending], outcomes: dict[int, Outcome],
              duplicates: set[int]) -> Manifest | None:
        """Decide each batch's fate against the manifest as read; the new manifest or None.

        A number at or below the producer's mark was appended by an earlier, ambiguous
        attempt — unless that attempt refused it (``ProducerState.refused``): then it was
        not appended, and is judged again like a new batch.
        """
        manifest, now, cfg = loaded.manifest, loaded.store_time, self.config
        state = manifest.producers.get(self.producer_id)
        done_through = state.batch if state else 0
        not_appended = frozenset(state.refused) if state else frozenset()
        room = cfg.max_entries - manifest.entry_count
        full_bytes = loaded.size >= cfg.max_bytes
        sequence = manifest.next_sequence
        new_entries: list[Entry] = []
        for pending in group:
            number = pending.number
            if number <= done_through and number not in not_appended:
                duplicates.add(number)
                outcomes[number] = self._find_sequence(manifest, number)
                continue
            refusal = self._refusal(pending.batch, loaded, room, full_bytes, now)
            if refusal is not None:
                outcomes[number] = refusal
                continue
            new_entries.append(self._entry(pending, sequence))
            outcomes[number] = sequence
            sequence += 1
            room -= 1
        if not new_entries:
            return None
        producers = {pid: ps for pid, ps in manifest.producers.items()
                     if now - ps.updated_at <= cfg.producer_ttl_s}
        producers[self.producer_id] = self._state(group, outcomes, new_entries,
                                                  done_through, now)
        return manifest.append(new_entries, producers=producers, next_sequence=sequence)

    def _refusal(self, batch: BatchRef, loaded: Loaded, room: int, full_bytes: bool,
                 now: float) -> Exception | None:
        """Why ``batch`` cannot be appended to the manifest as read, or None if it can."""
        cfg, manifest = self.config, loaded.manifest
        if now - batch.written_at > cfg.append_deadline_s:
            return DeadlineExceededError(
                f"batch {batch.location} is {now - batch.written_at:.0f}s old, past the "
                f"{cfg.append_deadline_s:g}s append deadline; it was not appended")
        if room <= 0 or full_bytes:
            return QueueFullError(
                f"manifest queue full ({manifest.entry_count} entries, {loaded.size} "
                f"bytes; limits {cfg.max_entries} entries, {cfg.max_bytes} bytes): the "
                "collector is behind; retry later")
        return None

    def _entry(self, pending: _Pending, sequence: int) -> Entry:
        batch = pending.batch
        return Entry(
            sequence=sequence, location=batch.location, size=batch.size,
            crc32c=batch.crc32c, record_count=batch.record_count, streams=batch.streams,
            ingested_at=batch.written_at, producer_id=self.producer_id,
            producer_batch=pending.number, registry_version=batch.registry_version)

    @staticmethod
    def _state(group: list[_Pending], outcomes: dict[int, Outcome],
               new_entries: list[Entry], done_through: int, now: float) -> ProducerState:
        """The producer's record after this write: its highest appended number (a batch
        refused once may be appended later, after a higher one: the mark never goes back),
        the last sequence it appended, and the numbers below the mark this group refused.

        Why only this group's refusals: a retry re-plans the same group (it only grows,
        upwards), and no number below the group's lowest is ever asked about again, so
        refusals of earlier groups can be forgotten.
        """
        high = max(done_through, max(entry.producer_batch for entry in new_entries))
        refused = tuple(p.number for p in group
                        if p.number < high and isinstance(outcomes[p.number], Exception))
        return ProducerState(batch=high, sequence=new_entries[-1].sequence, updated_at=now,
                             refused=refused)

    def _find_sequence(self, manifest: Manifest, number: int) -> int | None:
        for entry in reversed(manifest.entries):
            if entry.producer_id == self.producer_id and entry.producer_batch == number:
                return entry.sequence
        return None

    def _count(self, outcomes: dict[int, Outcome], duplicates: set[int], *,
               group_size: int) -> None:
        stats = self.stats
        stats.groups += 1
        stats.largest_group = max(stats.largest_group, group_size)
        stats.duplicates_skipped += len(duplicates)
        for number, outcome in outcomes.items():
            if isinstance(outcome, DeadlineExceededError):
                stats.deadline_exceeded += 1
            elif isinstance(outcome, QueueFullError):
                stats.queue_full += 1
            elif number not in duplicates:
                stats.appended += 1
