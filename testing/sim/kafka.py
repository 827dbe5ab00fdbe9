"""The ``kafka-retry`` family (#40): idempotent Kafka producers on the simulated ingestors.

Every ingestor gets its real Kafka side, built as the listener builds it: an
:class:`~ingestor.service.IngestService` over the ingestor's own batcher (so Kafka batches
share flushes with the HTTP clients' requests), a :class:`~ingestor.kafka.producer_ids.ProducerIds`
claiming id blocks in the simulated store, and a :class:`~ingestor.kafka.listener.KafkaFront`
whose :class:`~ingestor.kafka.produce.ProduceHandler` takes each Produce request. Only the
TCP connection is not run: a producer's "connection" is the :class:`Producer` state the
connection would hold, and it is dropped whenever an answer is lost (a producer has one
connection to the one broker the listener advertises; after a drop it reconnects to
whichever ingestor the balancer picks).

What a producer does (librdkafka's idempotent producer, one batch in flight): record
batches of 1-4 JSON records built with :class:`testing.kafka_batches.Batch` (producer id,
epoch, base sequence), retried byte for byte until answered. Answers are lost at random
after the batch was made durable, or because the ingestor died or the answer was late (the
batch may land later); after a lost answer the producer sometimes gives the batch up and
bumps its epoch (InitProducerId with its id and epoch: epoch + 1, sequences from 0), as
librdkafka does after a timeout. The checker then requires every acknowledged record in
its table exactly once, and every record given up at most once.
"""

from __future__ import annotations

import asyncio
import random
import struct
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from icefloe.config import Config
from icefloe.errors import StoreError
from icefloe.store.base import AsyncObjectStore
from ingestor.buffer import Batcher
from ingestor.kafka.apis import (
    Broker,
    InitProducerIdRequest,
    PartitionData,
    PartitionResult,
    ProduceRequest,
    TopicData,
)
from ingestor.kafka.codes import Code
from ingestor.kafka.listener import KafkaFront
from ingestor.kafka.produce import Producer
from ingestor.kafka.producer_ids import ProducerIds, producer_ids_key
from ingestor.metrics import IngestMetrics
from ingestor.service import IngestService
from testing.kafka_batches import Batch, Record

RETRIABLE = {Code.NOT_ENOUGH_REPLICAS, Code.REQUEST_TIMED_OUT, Code.UNKNOWN_TOPIC_OR_PARTITION}
"""Answers a Kafka client retries the identical batch after (a fresh ingestor that has not
read the registry yet knows no topic)."""
MAX_ATTEMPTS = 8
"""Attempts per batch before the producer gives it up (its message timeout)."""
PRODUCE_VERSION = 3
INIT_VERSION = 3
"""InitProducerId v3+ carries the producer's id and epoch (KIP-360's epoch bump)."""


@dataclass
class SimRuntime:
    """What :class:`KafkaFront` reads of an ingestor's runtime."""

    config: Config
    service: IngestService
    metrics: IngestMetrics
    store: AsyncObjectStore


class KafkaSide:
    """One ingestor's Kafka listener without its sockets: the real front and handler."""

    def __init__(self, name: str, config: Config, batcher: Batcher, metrics: IngestMetrics,
                 store: AsyncObjectStore, clock: Any) -> None:
        self.name = name
        self.config, self.store, self.metrics, self.clock = config, store, metrics, clock
        self.service = IngestService(config, batcher, metrics, store, clock=clock)
        self.ids = ProducerIds(store, producer_ids_key(config), clock=clock)
        self.front: KafkaFront | None = None

    async def start(self) -> None:
        """Claim the first producer-id block (as ``start_kafka_server`` does), retrying
        while the store fails, then serve."""
        while True:
            try:
                await self.ids.start()
                break
            except StoreError:
                await self.clock.sleep(1.0)
        runtime = SimRuntime(self.config, self.service, self.metrics, self.store)
        self.front = KafkaFront(runtime, self.ids, Broker(0, self.name, 9092),  # type: ignore[arg-type]
                                clock=self.clock)

    async def init_producer_id(self, producer_id: int, epoch: int) -> tuple[int, int, int]:
        """InitProducerId through the real front: (error code, producer id, epoch)."""
        if self.front is None:
            raise ConnectionError(f"{self.name}: Kafka listener not up yet")
        answer = await self.front.init_producer_id(
            INIT_VERSION, InitProducerIdRequest(None, producer_id, epoch))
        _, error, got_id, got_epoch = struct.unpack(">ihqh", answer[:16])
        return error, got_id, got_epoch

    async def produce(self, request: ProduceRequest, producer: Producer
                      ) -> tuple[int, PartitionResult]:
        """One Produce request of one partition: the registry version its stream was
        looked up at (read before the handler's first await, as it looks it up) and the
        partition's answer."""
        if self.front is None:
            raise ConnectionError(f"{self.name}: Kafka listener not up yet")
        version = self.service.registry_version
        answers, _ = await self.front.produce(request, producer)
        return version, answers[0][1][0]


@dataclass
class KafkaRecord:
    """One record as its producer sent it; ``acked``: the producer was told it is durable;
    ``given_up``: its batch was abandoned with an epoch bump (it may have landed once)."""

    uid: str
    topic: str
    producer_id: int
    epoch: int
    sequence: int
    acked: bool = False
    given_up: bool = False

    def label(self) -> str:
        return (f"{self.uid} (producer {self.producer_id} epoch {self.epoch} sequence "
                f"{self.sequence})")


@dataclass
class KafkaLedger:
    records: dict[str, KafkaRecord] = field(default_factory=dict)
    stats: Counter[str] = field(default_factory=Counter)


@dataclass
class _Sent:
    """One batch in flight: its records, its bytes (identical on every retry)."""

    topic: str
    records: list[KafkaRecord]
    data: bytes
    last_host: str | None = None
    """The ingestor the previous attempt went to (the story counts where retries land)."""
    durable: dict[int, int] = field(default_factory=dict)
    """Base offset → registry version of each attempt made durable, seen by the world
    even when the producer never heard (an answer lost): a retry the ingestor answers
    from its duplicate cache gets the first attempt's offset, and its records were
    accepted under that attempt's version, not the retry's."""

    def attempt_done(self, task: asyncio.Task[tuple[int, PartitionResult]]) -> None:
        if task.cancelled() or task.exception() is not None:
            return
        version, result = task.result()
        if result.error == Code.NONE:
            self.durable.setdefault(result.base_offset, version)

    @property
    def uids(self) -> list[str]:
        return [r.uid for r in self.records]


class KafkaProducer:
    """An idempotent producer with one connection at a time and one batch in flight."""

    def __init__(self, world: Any, name: str, rng: random.Random,
                 copy: Callable[[str, str, int, bool], Any]) -> None:
        self.world = world
        self.name = name
        self.rng = rng
        self.copy = copy
        """Makes the world's ledger entry (uid, source, registry version, acked) of one
        record carried by one request (the world's ``Copy``: it imports this module)."""
        self.conn: tuple[Any, Producer] | None = None
        self.producer_id = -1
        self.epoch = -1
        self.next_sequence: dict[str, int] = {}

    @property
    def ledger(self) -> KafkaLedger:
        ledger: KafkaLedger = self.world.ledger.kafka
        return ledger

    async def run(self, until: float) -> None:
        world = self.world
        while world.sim.now < until:
            await asyncio.sleep(self.rng.uniform(0.1, 0.8))
            topics = self._topics()
            if not topics:
                continue
            if self.producer_id < 0 and not await self._init(until):
                continue
            sent = self._batch(self.rng.choice(topics))
            await self._deliver(sent, until)

    def _topics(self) -> list[str]:
        """The topics a producer finds in Metadata: sources with a live sink (a source
        whose sinks are all disabled, deleted or moved away is not served: the listener
        answers UNKNOWN_TOPIC_OR_PARTITION, which a producer retries)."""
        history = self.world.registry_history
        if not history:
            return []
        open_now = set(self.world.open_sources())
        return [s.id for s in history[-1].live_sources()
                if s.id in open_now and s.live_sinks()]

    def _batch(self, topic: str) -> _Sent:
        """The next batch of ``topic`` (partition 0): 1-4 JSON records, sequences after
        this epoch's last batch of the partition."""
        base = self.next_sequence.get(topic, 0)
        records, values = [], []
        for i in range(self.rng.randint(1, 4)):
            n = self.world.next_id(topic)
            uid = f"{topic}/{n}"
            values.append(Record(value=b'{"uid": "%s", "n": %d}' % (uid.encode(), n)))
            record = KafkaRecord(uid, topic, self.producer_id, self.epoch,
                                 (base + i) & 0x7FFFFFFF)
            records.append(record)
            self.ledger.records[uid] = record
        self.next_sequence[topic] = (base + len(records)) & 0x7FFFFFFF
        data = Batch(values, producer_id=self.producer_id, producer_epoch=self.epoch,
                     base_sequence=base).encode()
        self.ledger.stats["batches"] += 1
        return _Sent(topic, records, data)

    async def _deliver(self, sent: _Sent, until: float) -> None:
        """Send ``sent`` until it is acknowledged; after a lost answer, sometimes (and
        after :data:`MAX_ATTEMPTS`) give it up and bump the epoch."""
        stats = self.ledger.stats
        for attempt in range(MAX_ATTEMPTS):
            if attempt:
                stats["retries"] += 1
            outcome = await self._attempt(sent)
            if outcome == "acked":
                for record in sent.records:
                    record.acked = True
                return
            if outcome == "refused" or (
                    outcome == "lost" and self.rng.random() < self.world.scenario.kafka_bump):
                break
            await asyncio.sleep(self.rng.uniform(0.2, 2.0))
        for record in sent.records:
            record.given_up = True
        stats["given_up_batches"] += 1
        stats["given_up_records"] += len(sent.records)
        await self._bump(until)

    def _connect(self) -> tuple[Any, Producer]:
        if self.conn is None or not self.conn[0].alive:
            ingestor = self.rng.choice(self.world.ingestors)
            self.conn = (ingestor, Producer(token=None, client=self.name))
        return self.conn

    async def _attempt(self, sent: _Sent) -> str:
        """One Produce of ``sent``: ``acked``, ``lost`` (no answer: it may have landed),
        ``retry`` (a retriable refusal) or ``refused`` (a refusal no retry helps)."""
        world, stats = self.world, self.ledger.stats
        ingestor, producer = self._connect()
        if sent.last_host is not None:
            stats["retry_" + ("same_ingestor" if ingestor.name == sent.last_host else
                              "restarted_ingestor" if ingestor.name == sent.last_host + "r"
                              else "other_ingestor")] += 1
        sent.last_host = ingestor.name
        world.ledger.requests += 1
        world.ledger.sent.update(sent.uids)
        kafka = ingestor.kafka
        version = kafka.service.registry_version
        request = ProduceRequest(None, -1, 30_000, [TopicData(sent.topic, [
            PartitionData(0, sent.data)])])
        task = world.spawn(ingestor.name, kafka.produce(request, producer))
        task.add_done_callback(sent.attempt_done)
        # a lost answer: half the time the connection breaks while the batch is in flight
        # (it may still be made durable, or fail), else once it was answered (durable)
        lose = self.rng.random() < world.scenario.kafka_lost
        early = lose and self.rng.random() < 0.5
        wait = self.rng.uniform(0.0, 0.12) if early \
            else world.config.ingestor.flush_timeout_s + 5
        done, _ = await asyncio.wait({task}, timeout=wait)
        if not done or task.cancelled() or isinstance(task.exception(), ConnectionError):
            stats["lost_in_flight" if early and not done else "lost_no_answer"] += 1
            return self._lost(sent, version)
        if task.exception() is not None:
            exc = task.exception()
            world.checker.violation(f"{ingestor.name}: Kafka produce died of an unexpected "
                                    f"error: {type(exc).__name__}: {exc}")
            return self._lost(sent, version)
        version, result = task.result()
        if result.error == Code.NONE:
            if lose:
                stats["lost_answers"] += 1
                return self._lost(sent, version)  # durable, but the producer never hears
            world.ledger.acked += 1
            accepted = sent.durable.get(result.base_offset, version)
            if accepted != version:
                stats["acked_from_duplicate_cache_across_versions"] += 1
            self._copies(sent, accepted, acked=True)
            return "acked"
        self._copies(sent, version, acked=False)
        if result.error in RETRIABLE:
            stats[f"refused_{Code(result.error).name}"] += 1
            return "retry"
        world.checker.violation(f"{ingestor.name} refused a valid Kafka batch of "
                                f"{sent.topic} with {Code(result.error).name}: "
                                f"{result.message}", key=f"kafka-refused:{result.error}")
        return "refused"

    def _lost(self, sent: _Sent, version: int) -> str:
        self._copies(sent, version, acked=False)
        self.conn = None  # the connection is gone; the next attempt reconnects
        return "lost"

    def _copies(self, sent: _Sent, version: int, *, acked: bool) -> None:
        self.world.ledger.copies.extend(self.copy(u, sent.topic, version, acked)
                                        for u in sent.uids)

    async def _init(self, until: float) -> bool:
        """InitProducerId: a new producer id (``producer_id`` -1), or the same id with the
        next epoch (KIP-360). False if no ingestor answered before ``until``."""
        while self.world.sim.now < until + 300:
            ingestor, _ = self._connect()
            try:
                error, got_id, epoch = await ingestor.kafka.init_producer_id(
                    self.producer_id, self.epoch)
            except ConnectionError:
                error = -1
            if error == 0:
                self.producer_id, self.epoch = got_id, epoch
                self.next_sequence.clear()
                return True
            self.conn = None
            await asyncio.sleep(self.rng.uniform(0.5, 2.0))
        return False

    async def _bump(self, until: float) -> None:
        before = self.epoch
        if await self._init(until):
            self.ledger.stats["epoch_bumps"] += 1
            self.world.checker.note(f"{self.name}: producer {self.producer_id} bumps its "
                                    f"epoch {before} -> {self.epoch} after giving a batch up")
