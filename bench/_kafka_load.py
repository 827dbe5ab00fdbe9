"""Kafka load generator (runs in its own process): a confluent-kafka (librdkafka) producer.

``python bench/_kafka_load.py throughput BOOTSTRAP TOPIC SECONDS LINGER_MS COMPRESSION WARMUP``
produces keyed records as fast as librdkafka takes them (``produce()`` until its queue is
full, then ``poll()``), with the settings a Kafka user tunes for throughput: idempotence
on (acks=all, at most 5 requests in flight), ``linger.ms`` as given, ``batch.size`` 1 MiB
(``message.max.bytes`` raised to hold it), ``batch.num.messages`` and the queue limits at
librdkafka's defaults. It counts records whose delivery callback reports success during
SECONDS that start once WARMUP seconds are over and a first record was delivered.

``python bench/_kafka_load.py latency BOOTSTRAP TOPIC SECONDS LINGER_MS COMPRESSION WARMUP
RATE`` produces one record at a time, RATE per second, and times each from ``produce()`` to
its delivery callback (``poll()`` waits for the callbacks between sends, so a callback runs
as soon as librdkafka has the answer).

Both print one JSON line last: ``{"records", "seconds", "errors", "p50_ms", "p99_ms",
"first_error"}``; ``throughput`` prints ``counting`` and ``counted`` before it, as the
counted window opens and closes (the parent reads the ingestor's CPU time at each).

The records are the ingest benchmark's event (``ingest_bench.EVENT``) with varying numbers,
keyed by user id, so every partition gets some.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from confluent_kafka import KafkaError, Message, Producer

EVENT = ('{"user_id":"user-%05d","url":"https://example.com/products/%d?ref=campaign-7",'
         '"duration_ms":%d,"ts":"2026-11-23T01:02:03.456Z","ref":"newsletter-2026-11"}')
POOL = 20_000
"""Distinct records, produced round and round (zstd sees 20k different ones, not a handful)."""
BATCH_BYTES = 1024 * 1024
PURGED = (KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT)
NEVER = float("inf")
GIVE_UP_S = 60.0
"""A throughput run that delivers nothing for this long after its warmup fails."""


def records() -> list[tuple[bytes, bytes]]:
    out = []
    for i in range(POOL):
        user = i * 7919 % 50_000
        out.append((EVENT % (user, i % 997, i * 37 % 60_000)).encode())
    return [(value, value[13:23]) for value in out]  # key: the user id


def producer(bootstrap: str, linger_ms: float, compression: str, **more: Any) -> Producer:
    return Producer({
        "bootstrap.servers": bootstrap, "enable.idempotence": True,
        "linger.ms": linger_ms, "batch.size": BATCH_BYTES,
        "message.max.bytes": BATCH_BYTES + 64 * 1024, "compression.type": compression,
        **more})


class Tally:
    """Delivery callbacks: successes inside the counted window, errors, latencies."""

    def __init__(self, counted_from: float = NEVER, until: float = NEVER) -> None:
        self.counted_from = counted_from
        self.until = until
        self.records = 0
        self.any_delivered = False
        self.errors = 0
        self.first_error: str | None = None
        self.latencies: list[float] = []

    def delivered(self, err: KafkaError | None, msg: Message) -> None:
        now = time.monotonic()
        if err is not None and now >= self.until and err.code() in PURGED:
            return  # the run is over: what was still queued is dropped on purpose
        if err is not None:
            self.errors += 1
            self.first_error = self.first_error or str(err)
            return
        self.any_delivered = True
        if self.counted_from <= now < self.until:
            self.records += 1

    def report(self, seconds: float) -> str:
        sample = sorted(self.latencies)
        return json.dumps({
            "records": self.records, "seconds": seconds, "errors": self.errors,
            "first_error": self.first_error,
            "p50_ms": 1000 * sample[len(sample) // 2] if sample else None,
            "p99_ms": 1000 * sample[int(len(sample) * 0.99)] if sample else None})


def throughput(bootstrap: str, topic: str, seconds: float, linger_ms: float,
               compression: str, warmup: float) -> str:
    """Records/s as described above; the window opens once ``warmup`` seconds are over and
    a first record was delivered (on a busy machine the first 1 MiB batches take seconds)."""
    pool = records()
    warm_until = time.monotonic() + warmup
    tally = Tally()
    kafka = producer(bootstrap, linger_ms, compression, on_delivery=tally.delivered)
    produce, poll = kafka.produce, kafka.poll
    i = 0
    while (now := time.monotonic()) < tally.until:
        if tally.counted_from == NEVER and now >= warm_until:
            if tally.any_delivered:  # "counting"/"counted": the parent reads the CPU time
                tally.counted_from, tally.until = now, now + seconds
                print("counting", flush=True)
            elif now > warm_until + GIVE_UP_S:
                tally.errors += 1
                tally.first_error = f"no record delivered within {GIVE_UP_S + warmup:g} s"
                break
        try:
            for _ in range(1000):
                value, key = pool[i % POOL]
                produce(topic, value, key)
                i += 1
        except BufferError:  # librdkafka's queue is full: serve callbacks, then go on
            poll(0.005)
        poll(0)
    print("counted", flush=True)
    tally.until = min(tally.until, time.monotonic())
    kafka.purge()
    kafka.flush(10)
    return tally.report(seconds)


def latency(bootstrap: str, topic: str, seconds: float, linger_ms: float, compression: str,
            warmup: float, rate: float) -> str:
    pool = records()
    counted_from = time.monotonic() + warmup
    tally = Tally(counted_from)
    # as latency-minded users run librdkafka: Nagle off (its default holds a small request
    # back until the previous one is acknowledged), see docs/kafka.md
    kafka = producer(bootstrap, linger_ms, compression, **{"socket.nagle.disable": True})

    def timed(sent: float) -> Any:
        def done(err: KafkaError | None, msg: Message) -> None:
            tally.delivered(err, msg)
            if err is None and sent >= counted_from:
                tally.latencies.append(time.monotonic() - sent)
        return done

    interval = 1 / rate
    next_send = time.monotonic()
    end = counted_from + seconds
    i = 0
    while next_send < end:
        value, key = pool[i % POOL]
        kafka.produce(topic, value, key, on_delivery=timed(time.monotonic()))
        i += 1
        next_send += interval
        while (left := next_send - time.monotonic()) > 0:
            kafka.poll(left)
    left_over = kafka.flush(30)
    if left_over:
        tally.errors += left_over
        tally.first_error = tally.first_error or f"{left_over} records never delivered"
    return tally.report(seconds)


if __name__ == "__main__":
    mode, bootstrap, topic, seconds, linger, codec, warmup = sys.argv[1:8]
    if mode == "throughput":
        print(throughput(bootstrap, topic, float(seconds), float(linger), codec, float(warmup)))
    else:
        print(latency(bootstrap, topic, float(seconds), float(linger), codec, float(warmup),
                      float(sys.argv[8])))
