"""Exactly-once for idempotent Kafka producers, proved end to end (issue #40, part 5).

A real librdkafka producer (confluent-kafka, ``enable.idempotence=true``) writes through a
proxy that loses the answers of chosen Produce requests *after* the ingestor got them
(:mod:`testing.kafka_proxy`), or into an ingestor that is killed with SIGKILL mid-batch,
or whose retries land on another ingestor; then the real collector (Spark) commits the
store into Iceberg. Each test checks both halves of the claim: the batch files hold
records twice (the retries really happened, the first attempts were durable), and the
table holds every acknowledged record exactly once (the collector's dedup window, keyed on
``kafka:<token>:<partition>:<producer id>:<epoch>:<sequence>``, absorbed them).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pyarrow.compute as pc
import pytest
from collector_support import collect_all, collector_config, read_table
from ingest_support import stored_events
from process_support import Child, free_port, write_config
from security_support import ingestor

from icefloe.config import Column, Config, StreamConfig, load_config
from pipeline.load.run import SparkEngine
from testing.kafka_proxy import KafkaProxy, every

confluent_kafka = pytest.importorskip("confluent_kafka")

KCLICKS = StreamConfig(name="kclicks", table="kafka.clicks", kafka_partitions=2, columns=(
    Column("pid", "string", required=True), Column("n", "long")))
"""No ``event_id_field``: the Kafka ids (producer id, epoch, sequence) are the event ids."""
PRODUCER: dict[str, Any] = {
    "enable.idempotence": True, "linger.ms": 2, "batch.num.messages": 10,
    "message.timeout.ms": 120_000, "retry.backoff.ms": 50, "reconnect.backoff.ms": 20,
    "reconnect.backoff.max.ms": 500, "socket.connection.setup.timeout.ms": 5_000,
}
"""Small batches (so there are many Produce requests to lose), fast reconnects, and a
message timeout long enough that no record fails while an ingestor restarts."""


def payload(i: int) -> bytes:
    return json.dumps({"pid": f"p{i}", "n": i}).encode()


@dataclass
class Acks:
    """What the producer was told, per payload id (None: acknowledged, else the error)."""

    outcome: dict[str, str | None] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, pid: str, err: str | None) -> None:
        with self.lock:
            self.outcome[pid] = err

    def callback(self, err: Any, msg: Any) -> None:
        """confluent-kafka's delivery report."""
        self.record(json.loads(msg.value())["pid"], None if err is None else str(err))

    def acked(self) -> set[str]:
        with self.lock:
            return {pid for pid, err in self.outcome.items() if err is None}

    def errors(self) -> Counter[str]:
        with self.lock:
            return Counter(err for err in self.outcome.values() if err is not None)


def produce(bootstrap: str, numbers: Iterable[int], on_delivery: Callable[[Any, Any], None],
            flush_s: float = 120) -> int:
    """Produce one record per number (keyed, so both partitions get some); flush. The
    records still unanswered after ``flush_s`` (0 when all were)."""
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, **PRODUCER})
    for i in numbers:
        producer.produce(KCLICKS.name, payload(i), key=f"k{i % 5}".encode(),
                         on_delivery=on_delivery)
        producer.poll(0)
    return int(producer.flush(flush_s))


def produce_kafka_python(bootstrap: str, numbers: Iterable[int], acks: Acks,
                         flush_s: float = 120) -> int:
    """The same with kafka-python (pure Python, its own idempotent producer): a second,
    independent implementation of the retry rules."""
    from kafka import KafkaProducer  # type: ignore[import-untyped]  # why: one variant needs it

    producer = KafkaProducer(
        bootstrap_servers=bootstrap, enable_idempotence=True, acks="all", linger_ms=2,
        batch_size=300, retry_backoff_ms=50, reconnect_backoff_ms=20,
        reconnect_backoff_max_ms=500, delivery_timeout_ms=120_000, request_timeout_ms=10_000)
    futures = []
    for i in numbers:
        future = producer.send(KCLICKS.name, payload(i), key=f"k{i % 5}".encode())
        future.add_callback(lambda _, pid=f"p{i}": acks.record(pid, None))
        future.add_errback(lambda exc, pid=f"p{i}": acks.record(pid, repr(exc)))
        futures.append(future)
    producer.flush(flush_s)
    producer.close(10)
    return sum(1 for f in futures if not f.is_done)


def with_kafka(config: Config, **ingestor: Any) -> Config:
    return msgspec.structs.replace(config, ingestor=msgspec.structs.replace(
        config.ingestor, host="127.0.0.1", http_port=0, grpc_port=0, kafka_port=0,
        **ingestor))


async def twice_in_batch_files(config: Config) -> tuple[int, int]:
    """(records in the queued batch files, event ids among them stored more than once)."""
    events = [e for e in await stored_events(config.store.url) if e.stream == KCLICKS.name]
    counts = Counter(e.event_id for e in events)
    assert all(i.startswith("kafka:-:") for i in counts), list(counts)[:3]
    return len(events), sum(1 for c in counts.values() if c > 1)


def assert_exactly_once(config: Config, acked: set[str], sent: set[str]) -> int:
    """Every acknowledged record once, nothing unsent, nothing twice; the row count."""
    rows = read_table(config, KCLICKS.table)
    pids = rows.column("pid").to_pylist()
    twice = [pid for pid, c in Counter(pids).items() if c > 1]
    assert not twice, f"{len(twice)} records committed twice: {twice[:10]}"
    assert pc.count_distinct(rows.column("_event_id")).as_py() == rows.num_rows
    assert acked <= set(pids), f"lost: {sorted(acked - set(pids))[:10]}"
    assert set(pids) <= sent, f"never sent: {sorted(set(pids) - sent)[:10]}"
    return rows.num_rows


def report(name: str, **numbers: Any) -> None:
    """The numbers a run produced, in the test log (``-s`` or the captured output)."""
    print(f"{name}: " + ", ".join(f"{k}={v}" for k, v in numbers.items()))


# -- 1. answers lost after the ingestor got the batch ---------------------------------------


async def test_retries_of_batches_whose_answers_were_lost_land_once(tmp_path: Path,
                                                                   spark: Any) -> None:
    n = 300
    upstream: list[tuple[str, int]] = []
    proxy = KafkaProxy(lambda _: upstream[0], every(3, limit=8))
    await proxy.start()
    # a slow flush (1 s): an "early" cut's retry (~0.1 s later) arrives while the first
    # attempt is still buffered, so the store gets both
    config = with_kafka(collector_config(tmp_path, (KCLICKS,)), flush_age_ms=1000.0,
                        kafka_advertised_port=proxy.port)
    acks = Acks()
    try:
        async with ingestor(config) as ports:
            assert ports.kafka is not None
            upstream.append(("127.0.0.1", ports.kafka))
            left = await asyncio.to_thread(produce, f"127.0.0.1:{proxy.port}", range(n),
                                           acks.callback)
    finally:
        await proxy.close()
    assert left == 0
    assert not acks.errors(), acks.errors()
    assert len(acks.acked()) == n
    assert proxy.stats.dropped["early"] >= 2, proxy.stats
    assert proxy.stats.dropped["late"] >= 2, proxy.stats
    stored, twice = await twice_in_batch_files(config)
    assert twice > 0, "no retry was stored twice: the test proved nothing"
    await collect_all(config, SparkEngine(spark, 2))
    rows = assert_exactly_once(config, acks.acked(), {f"p{i}" for i in range(n)})
    assert rows == n
    report("lost answers", records=n, produce_requests=proxy.stats.produce_requests,
           dropped=dict(proxy.stats.dropped), connections=proxy.stats.connections,
           stored=stored, ids_stored_twice=twice, iceberg_rows=rows)


# -- 3. a retry that lands on another ingestor ----------------------------------------------


@pytest.mark.parametrize("client", ["confluent-kafka", "kafka-python"])
async def test_a_retry_on_another_ingestor_lands_once(tmp_path: Path, spark: Any,
                                                      client: str) -> None:
    """Two ingestors on one store; after each lost answer the client's reconnect goes to
    the *other* one, which has never seen the batch (no duplicate cache to answer from):
    the store gets it twice and only the collector's dedup keeps it once. With librdkafka
    and with kafka-python, two independent implementations of the producer's retries."""
    n = 300
    targets: list[tuple[str, int]] = []
    proxy = KafkaProxy(lambda _: targets[proxy.stats.cuts % 2], every(3, limit=6))
    await proxy.start()
    config = with_kafka(collector_config(tmp_path, (KCLICKS,)),
                        kafka_advertised_port=proxy.port)
    acks = Acks()
    try:
        async with ingestor(config) as a, ingestor(config) as b:
            assert a.kafka is not None
            assert b.kafka is not None
            targets.extend((("127.0.0.1", a.kafka), ("127.0.0.1", b.kafka)))
            bootstrap = f"127.0.0.1:{proxy.port}"
            left = await asyncio.to_thread(produce, bootstrap, range(n), acks.callback) \
                if client == "confluent-kafka" \
                else await asyncio.to_thread(produce_kafka_python, bootstrap, range(n), acks)
    finally:
        await proxy.close()
    assert left == 0
    assert not acks.errors(), acks.errors()
    assert len(acks.acked()) == n
    assert len(proxy.stats.routed) == 2, proxy.stats
    assert min(proxy.stats.routed.values()) >= 3, proxy.stats
    assert sum(proxy.stats.dropped.values()) >= 4, proxy.stats
    stored, twice = await twice_in_batch_files(config)
    assert twice > 0, "no retry was stored twice: the test proved nothing"
    await collect_all(config, SparkEngine(spark, 2))
    rows = assert_exactly_once(config, acks.acked(), {f"p{i}" for i in range(n)})
    assert rows == n
    report(f"retry elsewhere ({client})", records=n, produce_requests=proxy.stats.produce_requests,
           dropped=dict(proxy.stats.dropped), routed=dict(proxy.stats.routed),
           stored=stored, ids_stored_twice=twice, iceberg_rows=rows)


# -- 2. an ingestor killed mid-batch --------------------------------------------------------


class Milestones:
    """Events the test waits for: the producer's acknowledgements passing thresholds."""

    def __init__(self, acks: Acks, thresholds: list[int]) -> None:
        self.acks = acks
        self.events = {t: threading.Event() for t in thresholds}

    def callback(self, err: Any, msg: Any) -> None:
        self.acks.callback(err, msg)
        done = len(self.acks.acked())
        for threshold, event in self.events.items():
            if done >= threshold:
                event.set()


def start_ingestor(config_path: Path, port: int, index: int) -> Child:
    child = Child(["ingestor", "--config", str(config_path), "--http-port", "0",
                   "--grpc-port", "0", "--kafka-port", str(port), "--log-level", "warning"],
                  config_path.parent, config_path.parent / f"ingestor-{index}.log")
    assert child.ready()["kafka_port"] == port
    return child


async def test_an_ingestor_killed_mid_batch_loses_and_duplicates_nothing_acknowledged(
        tmp_path: Path, spark: Any) -> None:
    """SIGKILL twice while batches are in flight (some buffered, some being flushed, some
    durable but unanswered), restart on the same port; librdkafka reconnects and retries."""
    n = 800
    kills = [n // 4, n // 2]
    path = write_config(tmp_path, (KCLICKS,))
    with path.open("a") as toml:  # the last [[streams]] table is KCLICKS
        toml.write(f"kafka_partitions = {KCLICKS.kafka_partitions}\n")
    port = free_port()
    acks = Acks()
    milestones = Milestones(acks, kills)
    children = [start_ingestor(path, port, 0)]
    in_flight: list[int] = []
    try:
        producing = asyncio.create_task(asyncio.to_thread(
            produce, f"127.0.0.1:{port}", range(n), milestones.callback))
        for threshold in kills:
            assert await asyncio.to_thread(milestones.events[threshold].wait, 60)
            children[-1].proc.kill()
            children[-1].proc.wait(30)
            in_flight.append(n - len(acks.acked()))
            children.append(start_ingestor(path, port, len(children)))
        left = await producing
        assert children[-1].stop() == 0, children[-1].tail()
    finally:
        for child in children:
            child.close()
    assert left == 0
    assert not acks.errors(), acks.errors()
    assert all(count > 0 for count in in_flight), in_flight  # killed mid-batch, not after
    config = load_config(path)
    stored, twice = await twice_in_batch_files(config)
    await collect_all(config, SparkEngine(spark, 2))
    rows = assert_exactly_once(config, acks.acked(), {f"p{i}" for i in range(n)})
    assert rows == len(acks.acked()) == n
    report("ingestor killed", records=n, unacknowledged_at_kills=in_flight, stored=stored,
           ids_stored_twice=twice, iceberg_rows=rows)

