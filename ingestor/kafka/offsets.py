"""Synthetic Kafka offsets: what a Produce answer reports as each partition's base offset.

Why synthetic: icefloe has no log, so there is no real offset to report, yet Kafka clients
expect one per acknowledged batch, increasing per partition (clients hand it to their
callbacks as the record's offset; applications log it, or order by it). An offset here only has
to be plausible and never go back, within a process, for one (topic, partition); and two
ingestors must not report the same offset at the same moment, so a reader that keys on it
(a log line, a dedup in a client's callback) cannot confuse two batches.

Layout, an int64 that is always positive::

    ((ms - EPOCH_MS) << 22) | (slot << 16) | counter

``ms`` is a *virtual* millisecond clock: the injected clock's wall time, but never going
back (an NTP step backwards cannot make offsets repeat) and running ahead when a partition
fills its cell: ``counter`` (16 bits) numbers offsets within one millisecond for one
partition, so a partition taking more than 65536 records in one millisecond moves on to the
next millisecond. ``slot`` (6 bits) is the process's :attr:`ProducerIds.slot
<ingestor.kafka.producer_ids.ProducerIds.slot>`, which keeps the offsets of up to 64
ingestors apart at the same millisecond. 41 bits of milliseconds last until 2094.

Memory is bounded: the last offset of at most ``max_partitions`` partitions is kept (least
recently used first out). A partition seen for the first time (or again after eviction)
starts strictly after the newest millisecond of any evicted partition, so eviction never
breaks monotonicity.
"""

from __future__ import annotations

import math

from icefloe.clock import SYSTEM, Clock

__all__ = ["COUNTER_BITS", "DEFAULT_MAX_PARTITIONS", "EPOCH_MS", "MAX_COUNT", "MS_SHIFT",
           "SLOT_BITS", "SyntheticOffsets"]

EPOCH_MS = 1_735_689_600_000
"""2025-01-01T00:00:00Z in Unix milliseconds: offsets count milliseconds from here."""
COUNTER_BITS = 16
SLOT_BITS = 6
MS_SHIFT = COUNTER_BITS + SLOT_BITS
MAX_COUNT = 1 << COUNTER_BITS
"""The most records one Produce batch of one partition can be given offsets for (65536)."""
_COUNTER_MASK = MAX_COUNT - 1
_SLOTS = 1 << SLOT_BITS
_MAX_MS = (1 << (63 - MS_SHIFT)) - 1
DEFAULT_MAX_PARTITIONS = 100_000


def _check(topic: str, partition: int, count: int) -> None:
    """Refuse what cannot be numbered, before anything is remembered for it."""
    if count < 1:
        raise ValueError(f"a Produce batch for {topic}/{partition} holds {count} "
                         "records; a batch needs at least one record to get offsets")
    if count > MAX_COUNT:
        raise ValueError(
            f"a Produce batch for {topic}/{partition} holds {count} records; icefloe "
            f"assigns offsets to 1..{MAX_COUNT} records per partition per batch: send "
            "smaller batches (lower the producer's batch.size or linger.ms)")
    if partition < 0:
        raise ValueError(f"partition {partition} of topic {topic!r} must be >= 0")


class SyntheticOffsets:
    """Assigns base offsets per (topic, partition) for one process (one ``slot``).

    Not thread-safe: called from the event loop only (each call is synchronous and short).
    """

    def __init__(self, slot: int, *, clock: Clock = SYSTEM,
                 max_partitions: int = DEFAULT_MAX_PARTITIONS) -> None:
        if not 0 <= slot < _SLOTS:
            raise ValueError(f"SyntheticOffsets slot {slot} must be in 0..{_SLOTS - 1}")
        if max_partitions < 1:
            raise ValueError(f"SyntheticOffsets max_partitions {max_partitions} must be >= 1")
        self.slot = slot
        self.clock = clock
        self.max_partitions = max_partitions
        self._last: dict[tuple[str, int], int] = {}
        """Last offset handed out per partition, least recently used first."""
        self._floor_ms = 0
        """The virtual clock: the newest cell's millisecond (relative to EPOCH_MS)."""
        self._evicted_ms = 0
        """The newest millisecond of any evicted partition's last offset."""

    @property
    def tracked(self) -> int:
        """How many partitions' last offsets are remembered (at most ``max_partitions``)."""
        return len(self._last)

    def assign(self, topic: str, partition: int, count: int) -> int:
        """A base offset for ``count`` records of ``topic``/``partition``: base .. base +
        count - 1 share one (ms, slot) cell and lie above every offset this process gave
        that partition before."""
        _check(topic, partition, count)
        key = (topic, partition)
        ms, counter = self._cell(self._last.get(key), count)
        if ms > _MAX_MS:
            raise OverflowError(f"synthetic Kafka offsets ran out of milliseconds ({ms} ms "
                                "after 2025-01-01): the 41-bit clock ends in 2094")
        self._floor_ms = max(self._floor_ms, ms)
        base = (ms << MS_SHIFT) | (self.slot << COUNTER_BITS) | counter
        self._last.pop(key, None)  # re-inserted: the most recently used come last
        self._last[key] = base + count - 1
        if len(self._last) > self.max_partitions:
            self._evict_oldest()
        return base

    def _cell(self, last: int | None, count: int) -> tuple[int, int]:
        """The (ms, first counter) for the next ``count`` offsets after ``last``.

        The virtual now is never below any cell used, so a known partition either moves to
        a newer millisecond or continues its own; a new one starts after every evicted one.
        """
        now = max(self._floor_ms, self._wall_ms())
        if last is None:
            return max(now, self._evicted_ms + 1), 0
        last_ms, last_counter = last >> MS_SHIFT, last & _COUNTER_MASK
        if now > last_ms:
            return now, 0
        if last_counter + count <= _COUNTER_MASK:
            return last_ms, last_counter + 1
        return last_ms + 1, 0

    def _wall_ms(self) -> int:
        """The injected clock in milliseconds after EPOCH_MS (negative before 2025)."""
        return math.floor(self.clock.time() * 1000) - EPOCH_MS

    def _evict_oldest(self) -> None:
        """Forget the least recently used partition, remembering its millisecond."""
        key = next(iter(self._last))
        self._evicted_ms = max(self._evicted_ms, self._last.pop(key) >> MS_SHIFT)

    @staticmethod
    def describe(offset: int) -> tuple[int, int, int]:
        """``(unix ms, slot, counter)`` an offset was made of (for docs, logs and tests)."""
        if not 0 <= offset < 2**63:
            raise ValueError(f"offset {offset} is not a synthetic int64 offset")
        return ((offset >> MS_SHIFT) + EPOCH_MS, (offset >> COUNTER_BITS) & (_SLOTS - 1),
                offset & _COUNTER_MASK)
