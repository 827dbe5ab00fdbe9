"""Idempotent producers' sequence numbers: what an ingestor remembers, and what it need not.

Why exactly-once does not depend on this module: every record of an idempotent producer gets
the event id ``kafka:<token>:<partition>:<producer id>:<epoch>:<sequence>``
(:func:`ingestor.kafka.produce.event_ids`), so a retried batch has the ids it had the first
time, on whichever ingestor it lands, after any restart, and the collector's dedup window
drops what was already committed. What this module adds is Kafka's answers:

* a batch identical to one of the last five this ingestor made durable for that producer and
  partition is answered at once with the first one's offset (Kafka's duplicate handling),
  without buffering it again;
* a sequence gap *on one connection* is OUT_OF_ORDER_SEQUENCE_NUMBER, and an epoch older than
  the connection's is INVALID_PRODUCER_EPOCH. Only per connection: a producer that moved to
  another ingestor and back (behind a load balancer) is not refused because this one
  missed its batches in between — ingestors keep no producer state that must be right.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from typing import NamedTuple

from ingestor.kafka.codes import Code, KafkaError

REMEMBERED_BATCHES = 5
"""Kafka's broker keeps the last five batches per producer and partition."""
MAX_PRODUCERS = 100_000
"""(stream, partition, producer) keys one ingestor remembers; the oldest are forgotten."""

Key = tuple[str, int, int, str | None]
"""(stream, partition, producer id, token name): the token as the event ids carry it, so
one credential's batch is never answered as another's duplicate (a producer id is only a
number a client sends)."""


class Batch(NamedTuple):
    epoch: int
    first: int
    last: int
    base_offset: int


class DurableBatches:
    """The last batches made durable per producer and partition, process-wide."""

    def __init__(self, max_keys: int = MAX_PRODUCERS) -> None:
        self._batches: OrderedDict[Key, deque[Batch]] = OrderedDict()
        self._max = max_keys

    def duplicate(self, key: Key, epoch: int, first: int, last: int) -> int | None:
        """The base offset of a durable batch with exactly these sequences, if remembered."""
        batches = self._batches.get(key)
        if batches is None:
            return None
        for batch in batches:
            if batch.epoch == epoch and batch.first == first and batch.last == last:
                return batch.base_offset
        return None

    def add(self, key: Key, batch: Batch) -> None:
        batches = self._batches.get(key)
        if batches is None:
            batches = self._batches[key] = deque(maxlen=REMEMBERED_BATCHES)
            if len(self._batches) > self._max:
                self._batches.popitem(last=False)
        else:
            self._batches.move_to_end(key)
        batches.append(batch)


class ConnectionSequences:
    """The next sequence expected per producer and partition on one connection."""

    def __init__(self) -> None:
        self._next: dict[Key, tuple[int, int]] = {}

    def check(self, key: Key, epoch: int, first: int) -> None:
        """Refuse a batch Kafka would refuse on this connection.

        Raises:
            KafkaError: INVALID_PRODUCER_EPOCH (an epoch older than the connection's) or
                OUT_OF_ORDER_SEQUENCE_NUMBER (a gap after the last batch admitted here).
        """
        known = self._next.get(key)
        if known is None:
            return
        known_epoch, expected = known
        if epoch < known_epoch:
            raise KafkaError(Code.INVALID_PRODUCER_EPOCH, f"producer epoch {epoch} is older "
                             f"than {known_epoch}, already used on this connection")
        if epoch == known_epoch and first > expected:
            raise KafkaError(Code.OUT_OF_ORDER_SEQUENCE_NUMBER, f"sequence {first} follows "
                             f"{expected - 1}: {first - expected} sequence(s) missing")

    def admitted(self, key: Key, epoch: int, last: int) -> None:
        known = self._next.get(key)
        if known is None or (epoch, last + 1) > known:
            self._next[key] = (epoch, (last + 1) & 0x7FFFFFFF)

    def failed(self, key: Key) -> None:
        """A batch was not made durable: forget what was expected, so its retry (which
        repeats sequences already admitted here) is taken."""
        self._next.pop(key, None)
