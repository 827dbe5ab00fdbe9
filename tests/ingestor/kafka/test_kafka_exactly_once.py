"""Exactly-once for idempotent Kafka producers, proved end to end (issue #40, part 5).

Real producers (librdkafka through confluent-kafka, and kafka-python, both with
``enable.idempotence``) write through a proxy that loses the answers of chosen Produce
requests *after* the ingestor got them (:mod:`testing.kafka_proxy`), with the retry
landing on the same ingestor or on another one; into an ingestor SIGKILLed mid-batch and
restarted on its port; and beside HTTP and gRPC producers while the store fails. Then the
real collector (Spark, one run) commits the store into Iceberg, and the table must hold
every acknowledged record exactly once — the collector's dedup window
(``collector.dedup_window_s``, default) keyed on
``kafka:<token>:<partition>:<producer id>:<epoch>:<sequence>``. Where the fault makes it
certain, the test also checks that the batch files hold records twice: the retries really
happened after their first attempts were durable, and the dedup absorbed them.
Each test prints its numbers (``-s``).
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

from icefloe.client import GrpcClient, HttpClient, IngestRejected
from icefloe.config import Column, Config, StreamConfig, load_config
from icefloe.config.manifest import ManifestConfig
from icefloe.store.failpoints import FAULTS_ENV
from pipeline.load.run import SparkEngine
from testing.kafka_proxy import KafkaProxy, every

confluent_kafka = pytest.importorskip("confluent_kafka")
pytestmark = pytest.mark.filterwarnings(  # kafka-python 3 loads its schemas the old way
    "ignore:(read_text|open_text) is deprecated:DeprecationWarning")

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


async def twice_in_batch_files(config: Config, stream: str = KCLICKS.name
                               ) -> tuple[int, int]:
    """(records of ``stream`` in the queued batch files, event ids among them stored more
    than once)."""
    events = [e for e in await stored_events(config.store.url) if e.stream == stream]
    counts = Counter(e.event_id for e in events)
    if stream == KCLICKS.name:
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


async def test_retries_of_batches_whose_answers_were_lost_land_once(
        tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every third Produce request loses its answer: "early" (the client is cut off as
    soon as the ingestor has the request, so its retry meets the first attempt not yet
    durable: both are stored) or "late" (cut off when the durable answer comes, so the
    retry is answered from the ingestor's duplicate cache with the first offset)."""
    n = 300
    upstream: list[tuple[str, int]] = []
    proxy = KafkaProxy(lambda _: upstream[0], every(3, limit=8))
    await proxy.start()
    # Every manifest append takes 0.6 s (a store that is slow, injected at the store's
    # boundary), so an "early" cut's retry (librdkafka reconnects within its 0.5 s
    # backoff cap) always finds its first attempt still being flushed. Why not a long
    # flush age: flushes are group commits that start at once when none is in flight, so
    # the age rarely held a batch at all and a clean-clone CI run now and then stored no
    # retry twice.
    faults = tmp_path / "faults.json"
    faults.write_text(json.dumps({"rules": [
        {"kind": "delay", "ops": ["put"], "key_prefix": ManifestConfig().key, "times": None,
         "delay_s": [0.6, 0.6]}]}))
    monkeypatch.setenv(FAULTS_ENV, str(faults))
    config = with_kafka(collector_config(tmp_path, (KCLICKS,)),
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
    assert Path(f"{faults}.log").read_text().count(" delay put") >= 2
    monkeypatch.delenv(FAULTS_ENV)  # the collector's store is not slow
    stored, twice = await twice_in_batch_files(config)
    assert twice > 0, "no retry was stored twice: the test proved nothing"
    await collect_all(config, SparkEngine(spark, 2))
    rows = assert_exactly_once(config, acks.acked(), {f"p{i}" for i in range(n)})
    assert rows == n
    report("lost answers", records=n, produce_requests=proxy.stats.produce_requests,
           dropped=dict(proxy.stats.dropped), connections=proxy.stats.connections,
           stored=stored, ids_stored_twice=twice, iceberg_rows=rows)


# -- 2. a retry that lands on another ingestor ----------------------------------------------


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


# -- 3. an ingestor killed mid-batch --------------------------------------------------------


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


# -- 4. Kafka, HTTP and gRPC producers at once, through a store fault window ----------------

MIXED = StreamConfig(name="mixed", table="kafka.mixed", event_id_field="pid", columns=(
    Column("pid", "string", required=True), Column("n", "long")))
"""The HTTP and gRPC producers' stream: their ids are their own (``pid``), resent as is."""
FAULTS: dict[str, Any] = {"seed": 40, "rules": [
    {"kind": "delay", "ops": ["put"], "times": 2, "delay_s": [1.2, 1.6]},
    {"kind": "delay", "probability": 0.5, "ops": ["put"], "times": None,
     "delay_s": [1.2, 1.6]},
    {"kind": "fail", "probability": 0.3, "times": None},
    {"kind": "slowdown", "probability": 0.2, "times": None},
    {"kind": "lose_response", "probability": 0.25, "ops": ["put"], "times": None}]}
"""For every store call of the ingestor: writes slower than its ``flush_timeout_s`` (the
first two for sure; the flush fails, its requests are refused as retriable — Kafka's
REQUEST_TIMED_OUT, HTTP 503, gRPC UNAVAILABLE — and the write may still land), 500s
and 503 SlowDown, and writes applied but their answers lost (ambiguous batch PUTs and
manifest CAS)."""


def send_batches(send: Callable[[str, list[dict[str, Any]], str], int], prefix: str,
                 requests: int, acks: Acks, started: threading.Event) -> None:
    """``requests`` requests of 10 events with their own ids and idempotency key; the
    client retries each with the same key and ids (``retries``); acked ids recorded."""
    for r in range(requests):
        events: list[dict[str, Any]] = [{"pid": f"{prefix}{r * 10 + i}", "n": r * 10 + i}
                                        for i in range(10)]
        try:
            accepted = send(MIXED.name, events, f"{prefix}r{r}")
        except IngestRejected as exc:  # gave up: its events may or may not be stored
            for event in events:
                acks.record(event["pid"], repr(exc))
            continue
        for event in events:
            acks.record(event["pid"], None if accepted == 10 else f"accepted {accepted}")
        started.set()


async def test_kafka_http_and_grpc_producers_through_store_faults_land_once(
        tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """One ingestor serves all three fronts while its store fails, slows down and loses
    write answers for three seconds; then the collector. Every acknowledged event of every
    producer once (HTTP and gRPC: an idempotency key and body ids; Kafka: the producer's
    sequences); unacknowledged ones at most once."""
    faults = tmp_path / "faults.json"
    faults.write_text("{}")
    monkeypatch.setenv(FAULTS_ENV, str(faults))
    config = with_kafka(collector_config(tmp_path, (KCLICKS, MIXED)), flush_timeout_s=1.0)
    kafka, other = Acks(), Acks()
    milestones = Milestones(kafka, [100])
    started = {front: threading.Event() for front in ("http", "grpc")}
    runtimes: list[Any] = []
    async with ingestor(config, on_runtime=runtimes.append) as ports:
        http = HttpClient(f"http://127.0.0.1:{ports.http}", retries=20)
        grpc = GrpcClient(f"127.0.0.1:{ports.grpc}", retries=20)
        producers = [
            asyncio.to_thread(produce, f"127.0.0.1:{ports.kafka}", range(1500),
                              milestones.callback),
            asyncio.to_thread(send_batches, http.send, "h", 60, other, started["http"]),
            asyncio.to_thread(send_batches, grpc.publish, "g", 60, other, started["grpc"])]
        running = asyncio.gather(*producers)
        for event in [milestones.events[100], *started.values()]:
            assert await asyncio.to_thread(event.wait, 30)
        faults.write_text(json.dumps(FAULTS))
        await asyncio.sleep(3.0)  # the fault window: a duration, not an event to await
        faults.write_text("{}")
        left, _, _ = await running
        http.close()
        grpc.close()
        answers = dict(requests_by_outcome(runtimes[0]))
    fired = Counter(line.split()[1] for line in Path(f"{faults}.log").read_text().splitlines())
    assert left == 0
    assert not kafka.errors(), kafka.errors()
    assert fired["delay"] >= 2, fired
    # Kafka retried: flushes that outlived flush_timeout_s (they may still land) answered
    # REQUEST_TIMED_OUT, "possibly persisted"; refusals of nothing written NOT_ENOUGH_REPLICAS
    assert answers.get("kafka/kclicks/REQUEST_TIMED_OUT", 0) > 0, answers
    stored = {s.name: await twice_in_batch_files(config, s.name) for s in (KCLICKS, MIXED)}
    await collect_all(config, SparkEngine(spark, 2))
    kafka_rows = assert_exactly_once(config, kafka.acked(), {f"p{i}" for i in range(1500)})
    rows = read_table(config, MIXED.table).column("pid").to_pylist()
    assert len(rows) == len(set(rows)), "an HTTP or gRPC event committed twice"
    assert other.acked() <= set(rows)
    assert set(rows) <= {f"{p}{i}" for p in "hg" for i in range(600)}
    report("mixed with store faults", kafka_acked=len(kafka.acked()), kafka_rows=kafka_rows,
           http_grpc_acked=len(other.acked()), http_grpc_unacked=len(other.errors()),
           http_grpc_rows=len(rows), faults=dict(fired), answers=answers,
           stored_and_stored_twice=stored)


def requests_by_outcome(runtime: Any) -> list[tuple[str, int]]:
    """The ingestor's ``icefloe_ingest_requests`` samples that are not zero, by labels."""
    out = []
    for metric in runtime.metrics.requests.collect():
        for sample in metric.samples:
            if sample.name.endswith("_total") and sample.value:
                out.append(("/".join(sample.labels.values()), int(sample.value)))
    return out
