"""The ingestor's Kafka listener: a TCP (or TLS) server whose connections share one
:class:`KafkaFront` over the ingestor's runtime.

Why every ingestor says it leads every partition: icefloe has no partition leaders (any
ingestor takes any record, and durability is the object store's), so Metadata names this
ingestor, at its *advertised* address, as the one broker, node 0, leader and only replica
of every partition. Behind a load balancer every ingestor advertises the balancer, and
clients spread over them however it routes; a producer that reconnects elsewhere keeps
its exactly-once (:mod:`ingestor.kafka.produce`).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import socket
import time
from dataclasses import dataclass

from icefloe.clock import SYSTEM, Clock
from icefloe.errors import ConfigError, StoreError
from ingestor.errors import IngestError, Overloaded, PermissionDenied, Unauthenticated
from ingestor.kafka import apis
from ingestor.kafka.apis import Broker, InitProducerIdRequest, MetadataRequest, TopicMetadata
from ingestor.kafka.codes import Code
from ingestor.kafka.connection import Connection
from ingestor.kafka.offsets import SyntheticOffsets
from ingestor.kafka.produce import ProduceHandler, Producer
from ingestor.kafka.producer_ids import ProducerIds, producer_ids_key
from ingestor.runtime import IngestorRuntime
from ingestor.tls import CertificateReloader

log = logging.getLogger("icefloe.ingestor.kafka")
NODE_ID = 0
MAX_EPOCH = 32767


class KafkaFront:
    """What every Kafka connection of one ingestor shares."""

    def __init__(self, runtime: IngestorRuntime, ids: ProducerIds, broker: Broker, *,
                 clock: Clock = SYSTEM) -> None:
        self.config = runtime.config
        self.service = runtime.service
        self.metrics = runtime.metrics
        self.ids = ids
        self.broker = broker
        self.cluster_id = "icefloe-" + hashlib.sha256(runtime.store.url.encode()
                                                      ).hexdigest()[:16]
        self.handler = ProduceHandler(self.service, SyntheticOffsets(ids.slot, clock=clock),
                                      clock=clock)
        self._ack = runtime.metrics.ack_seconds.labels("kafka")

    def closed(self, reason: str) -> None:
        self.metrics.kafka_closed.labels(reason).inc()

    async def metadata(self, version: int, request: MetadataRequest, token: str | None,
                       client: str | None = None) -> bytes:
        """Every named topic (a stream, or UNKNOWN_TOPIC_OR_PARTITION), or, asked for all,
        the streams this connection may produce to: the open ones, and with SASL those its
        token is accepted by (a token never learns the names of streams it cannot use)."""
        streams = self.service.streams
        if request.topics is None:
            names = [name for name in streams if await self._may_produce(name, token, client)]
        else:
            names = request.topics
        topics = []
        for name in names:
            stream = streams.get(name)
            if stream is None:
                topics.append(TopicMetadata(name, Code.UNKNOWN_TOPIC_OR_PARTITION, 0))
            else:
                topic_id = hashlib.sha256(name.encode()).digest()[:16]
                topics.append(TopicMetadata(name, 0, stream.config.kafka_partitions,
                                            topic_id))
        return apis.metadata_response(version, self.broker, self.cluster_id, topics)

    async def _may_produce(self, stream: str, token: str | None, client: str | None) -> bool:
        """Whether ``token`` (None: no SASL) may produce to ``stream`` (verified once per
        stream and token, then cached, as a Produce's check is)."""
        try:
            await self.service.auth.authorize(stream, token, client)
        except (Unauthenticated, PermissionDenied, Overloaded):
            return False
        return True

    async def init_producer_id(self, version: int, request: InitProducerIdRequest) -> bytes:
        """A new producer id from the store-wide allocator, or the same id with the next
        epoch for a client that bumps its own (KIP-360)."""
        if request.transactional_id is not None:
            log.warning("InitProducerId with transactional.id %r refused: transactions are "
                        "not served", request.transactional_id)
            return apis.init_producer_id_response(
                version, Code.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, -1, -1)
        if request.producer_id >= 0 and 0 <= request.producer_epoch < MAX_EPOCH - 1:
            # Why a warning: the client renumbers the records it still holds under the new
            # epoch, so their event ids change; a record whose earlier attempt was stored
            # (its answer lost or refused as retriable) is then stored twice, as on a Kafka
            # broker. It happens when records time out, which a longer message.timeout.ms
            # or a stream's event_id_field prevents.
            self.metrics.kafka_epoch_bumps.inc()
            log.warning("Kafka producer %d bumped its epoch %d -> %d (records ran out of "
                        "message.timeout.ms): the records it renumbers get new event ids, so "
                        "one already stored may be stored again; give producers a "
                        "message.timeout.ms longer than any outage, or the stream an "
                        "event_id_field", request.producer_id, request.producer_epoch,
                        request.producer_epoch + 1)
            return apis.init_producer_id_response(version, 0, request.producer_id,
                                                  request.producer_epoch + 1)
        try:
            producer_id = await self.ids.next_id()
        except StoreError as exc:
            log.warning("InitProducerId: producer ids could not be claimed: %s", exc)
            return apis.init_producer_id_response(version, Code.COORDINATOR_NOT_AVAILABLE,
                                                  -1, -1)
        return apis.init_producer_id_response(version, 0, producer_id, 0)

    async def token_valid(self, token: str, client: str | None) -> bool:
        """Whether ``token`` is a write token of at least one stream served here."""
        for name in self.service.streams:
            try:
                if await self.service.auth.authorize(name, token, client) is not None:
                    return True
            except (Unauthenticated, PermissionDenied, Overloaded):
                continue
        return False

    async def produce(self, request: apis.ProduceRequest, producer: Producer
                      ) -> tuple[list[tuple[str, list[apis.PartitionResult]]], int]:
        started = time.perf_counter()
        answers, throttle = await self.handler.produce(request, producer)
        requests = self.metrics.requests
        ok = True
        for topic, parts in answers:
            label = topic if topic in self.service.streams else "-"
            for part in parts:
                requests.labels("kafka", label, Code(part.error).name).inc()
                if part.error:
                    ok = False
                    self.service.reject(label, IngestError(part.message or "",
                                                           code=Code(part.error).name.lower()))
        if ok:
            self._ack.observe(time.perf_counter() - started)
        return answers, throttle


@dataclass
class KafkaServer:
    server: asyncio.Server
    port: int
    front: KafkaFront

    async def stop(self) -> None:
        self.server.close()
        await self.server.wait_closed()


def advertised(config_host: str | None, bind_host: str, port: int,
               config_port: int | None) -> Broker:
    """The address Metadata gives clients: the configured one, else the bind host (a
    wildcard bind advertises this machine's name, as a broker's default does)."""
    host = config_host or bind_host
    if host in ("0.0.0.0", "::", ""):
        host = socket.getfqdn()
    return Broker(NODE_ID, host, config_port or port)


async def start_kafka_server(runtime: IngestorRuntime, host: str, port: int, *,
                             tls: CertificateReloader | None, reuse_port: bool = False,
                             clock: Clock = SYSTEM) -> KafkaServer:
    """Claim this process's producer-id block, bind, and serve Kafka connections."""
    ing = runtime.config.ingestor
    ids = ProducerIds(runtime.store, producer_ids_key(runtime.config), clock=clock)
    await ids.start()
    connections = 0
    front_box: list[KafkaFront] = []

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        front = front_box[0]
        if connections >= ing.kafka_max_connections:
            front.closed("too_many_connections")
            writer.close()
            return
        peer = writer.get_extra_info("peername")
        connections += 1
        front.metrics.kafka_connections.set(connections)
        try:
            await Connection(front, reader, writer, peer[0] if peer else None).run()
        finally:
            connections -= 1
            front.metrics.kafka_connections.set(connections)

    try:
        server = await asyncio.start_server(
            accept, host, port, ssl=tls.http_context if tls is not None else None,
            reuse_port=reuse_port or None, backlog=2048, limit=1 << 16)
    except OSError as exc:
        raise ConfigError(f"cannot bind Kafka to {host}:{port}: {exc.strerror} (--kafka-port, "
                          "ICEFLOE_INGESTOR_KAFKA_PORT)") from None
    bound = server.sockets[0].getsockname()[1]
    broker = advertised(ing.kafka_advertised_host, host, bound, ing.kafka_advertised_port)
    front_box.append(KafkaFront(runtime, ids, broker, clock=clock))
    log.info("Kafka listener on %s:%d, advertising %s:%d", host, bound, broker.host,
             broker.port)
    return KafkaServer(server, bound, front_box[0])
