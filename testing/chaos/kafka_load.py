"""A Kafka client process for a chaos run: an idempotent librdkafka producer with a ledger.

Why it differs from the HTTP and gRPC clients (:mod:`testing.chaos.load`): a Kafka
producer does its own retries — after a reset, a refused connection to a killed ingestor,
a retriable NOT_ENOUGH_REPLICAS or REQUEST_TIMED_OUT while the store is stalled — with the
same producer id, epoch and sequences, and the ingestor turns those into the event ids the collector
deduplicates on. So the client only produces and records, per record, what its delivery
report said: acknowledged, or failed (a record whose ``message.timeout.ms`` ran out, or
still unanswered when the run stops, may or may not be stored: at most once). Any other
delivery error counts as a valid record refused.

The bootstrap list names every ingestor; each one advertises itself as the leader of
every partition, so the producer follows whichever answered its last Metadata and a retry
may land on another ingestor than its first attempt.
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from pathlib import Path
from typing import IO, Any

from testing.chaos.cluster import KAFKA_STREAM
from testing.chaos.load import ClientSpec

PRODUCER: dict[str, Any] = {
    # librdkafka's default delivery timeout, longer than any outage of a run: when records
    # time out, librdkafka bumps its epoch and renumbers the records it still holds, and a
    # retried record whose first attempt was stored gets new ids and is stored twice (as on
    # a Kafka broker; docs/kafka.md). 40 s let a seed's ingestor restart during a store
    # stall do exactly that.
    "enable.idempotence": True, "linger.ms": 5, "message.timeout.ms": 300_000,
    "retry.backoff.ms": 100, "reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 1_000,
    "log_level": 3,
}
FLUSH_S = 45.0
"""At the stop: how long unanswered records may still be answered (the harness waits 60 s
for its clients)."""
IN_FLIGHT = 500
"""Records produced but not yet answered, at most (without ``rate``: as fast as acks come)."""
GAVE_UP = ("_MSG_TIMED_OUT", "_PURGE_QUEUE", "_PURGE_INFLIGHT")
"""Delivery errors that mean "not known to be stored", not "refused"."""


class _Ledger:
    """One JSON line per answered record, in :func:`testing.chaos.load.read_ledgers`'s form."""

    def __init__(self, out: IO[str], prefix: str) -> None:
        self.out = out
        self.prefix = prefix
        self.pending: dict[int, float] = {}
        self.statuses: Counter[str] = Counter()

    def sent(self, number: int) -> None:
        self.pending[number] = time.time()

    def write(self, number: int, error: str | None) -> None:
        self.pending.pop(number, None)
        acked = error is None
        row: dict[str, Any] = {"prefix": self.prefix, "first": number, "count": 1,
                               "key": "", "acked": acked, "hangs": 0, "at": time.time()}
        if not acked:
            row["error"] = "gave up" if error in GAVE_UP else error
        self.out.write(json.dumps(row) + "\n")

    def delivered(self, err: Any, msg: Any) -> None:
        number = int(msg.key().decode().rsplit("-", 1)[1])
        name = None if err is None else str(err.name())
        self.statuses[name or "ok"] += 1
        self.write(number, name)


def run_kafka_client(spec: ClientSpec) -> None:
    """Produce until the stop file appears, then flush; every record ends in the ledger."""
    from confluent_kafka import Producer  # a test-only dependency, in the Kafka client only

    rng = random.Random(spec.seed)
    stop = Path(spec.stop_file)
    producer = Producer({"bootstrap.servers": ",".join(spec.endpoints),
                         "client.id": f"chaos-c{spec.index}", **PRODUCER})
    with open(spec.ledger, "a") as out:
        ledger = _Ledger(out, f"c{spec.index}-")
        try:
            _produce(producer, ledger, spec, rng, stop)
            producer.flush(FLUSH_S)
        finally:
            for number in list(ledger.pending):
                ledger.write(number, "_MSG_TIMED_OUT")
            out.write(json.dumps({"statuses": dict(ledger.statuses)}) + "\n")


def _produce(producer: Any, ledger: _Ledger, spec: ClientSpec, rng: random.Random,
             stop: Path) -> None:
    n = 0
    while not stop.exists():
        size = rng.choice((1, 1, 5, 20, 100))
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        for number in range(n, n + size):
            value = json.dumps({"id": f"{ledger.prefix}{number}", "client": f"c{spec.index}",
                                "n": number, "sent_at": now}).encode()
            while True:
                try:
                    producer.produce(KAFKA_STREAM, value, key=f"{ledger.prefix}{number}",
                                     on_delivery=ledger.delivered)
                    break
                except BufferError:  # librdkafka's queue is full: wait for answers
                    producer.poll(0.1)
            ledger.sent(number)
        n += size
        producer.poll(0)
        while len(ledger.pending) > IN_FLIGHT and not stop.exists():
            producer.poll(0.05)
        if spec.rate:
            producer.poll(rng.expovariate(spec.rate))
