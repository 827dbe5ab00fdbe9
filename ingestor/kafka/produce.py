"""A Produce request through icefloe's one admission path.

Each partition's record batch is checked (:mod:`ingestor.kafka.records`), its values are
parsed by the stream's format exactly as the HTTP and gRPC fronts parse theirs (JSON, a
Protobuf or Avro message in Confluent's wire format, or opaque bytes), and everything the
request carries is buffered at once, so its partitions share a flush; the answer goes out
only when that flush is durable (acks=1 and acks=all alike: an object store has no replicas
to wait for). Refusals are per partition, with the code a producer acts on
(:mod:`ingestor.kafka.codes`); nothing of a refused partition is buffered.

Why the event ids: an idempotent producer (producer id ≥ 0) retries a batch with the same
producer id, epoch and sequences, so record ``i`` of a batch gets
``kafka:<token>:<partition>:<producer id>:<epoch>:<base sequence + i>`` and the collector's
dedup window (``collector.dedup_window_s``) drops a retry that landed twice, whichever
ingestor took it. The token's name scopes the ids, so one credential's producer ids can
never collide with another's. Records of non-idempotent producers get generated ids: their
retries may duplicate (as with Kafka itself).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgspec

from icefloe.clock import SYSTEM, Clock
from icefloe.formats import speedups
from icefloe.formats.envelope import MAX_ID_BYTES
from ingestor.changes import without_nulls
from ingestor.errors import (
    BadRequest,
    IngestError,
    Overloaded,
    PayloadTooLarge,
    PermissionDenied,
    Unauthenticated,
    Unavailable,
    UnknownStream,
)
from ingestor.kafka.apis import PartitionData, PartitionResult, ProduceRequest
from ingestor.kafka.codes import Code, KafkaError
from ingestor.kafka.offsets import SyntheticOffsets
from ingestor.kafka.records import Records, read_batch
from ingestor.kafka.sequences import Batch, ConnectionSequences, DurableBatches, Key
from ingestor.mappings import check_kafka_key, kafka_meta, kafka_meta_wanted
from ingestor.service import Caller, IngestService
from ingestor.validate import Canonical, CompiledStream, InvalidEvents

T = TypeVar("T")
log = logging.getLogger("icefloe.ingestor.kafka")
MAX_RECORD_ERRORS = 100
"""Per-record errors one answer names (the rest are counted in the message)."""


@dataclass
class Producer:
    """Who is producing on one connection: the SASL token (None: unauthenticated), the
    client address and the connection's sequence bookkeeping."""

    token: str | None
    client: str | None
    sequences: ConnectionSequences = field(default_factory=ConnectionSequences)
    admitting: asyncio.Lock = field(default_factory=asyncio.Lock)
    """Held while one Produce request is checked and buffered. Why: a connection's requests
    run as concurrent tasks (their flushes overlap), but a request held by a rate limit
    must not be overtaken by the next: Kafka keeps a connection's batches in order, and an
    idempotent producer's next batch would otherwise reach the sequence check before the
    held one was admitted and be refused OUT_OF_ORDER_SEQUENCE_NUMBER. The lock is fair:
    requests are admitted in the order they were read."""


@dataclass
class _Admitted:
    """One partition's batch in the buffer: what to answer once it is durable."""

    result: PartitionResult
    durable: asyncio.Future[None]
    stream: str
    count: int
    key: Key | None
    batch: Batch | None


class ProduceHandler:
    """Produce requests of every connection of one ingestor."""

    def __init__(self, service: IngestService, offsets: SyntheticOffsets, *,
                 clock: Clock = SYSTEM) -> None:
        self.service = service
        self.offsets = offsets
        self.durable = DurableBatches()
        self.clock = clock
        self.max_batch_bytes = service.config.ingestor.kafka_max_request_bytes

    async def produce(self, request: ProduceRequest, producer: Producer
                      ) -> tuple[list[tuple[str, list[PartitionResult]]], int]:
        """Every partition's answer, in request order, and the throttle time (ms) to
        report: for a client before Produce v6, how long the answer was held for a rate
        limit (as a broker reports it); for v6+ (KIP-219: the client waits it itself) only
        what the client should still wait, for a batch refused over a limit."""
        if request.transactional_id is not None:
            raise KafkaError(Code.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, "transactions are "
                             "not served; unset transactional.id")
        if request.acks not in (-1, 0, 1):
            raise KafkaError(Code.INVALID_REQUIRED_ACKS, f"acks={request.acks}: 0, 1 or -1")
        answers: list[tuple[str, list[PartitionResult]]] = []
        admitted: list[_Admitted] = []
        throttle = 0
        deadline = self.clock.monotonic() + max(request.timeout_ms, 0) / 1000
        async with producer.admitting:  # one request at a time: see Producer.admitting
            throttle = await self._admit_all(request, producer, deadline, answers, admitted)
        for entry in admitted:
            throttle = max(throttle, await self._settle(entry, producer))
        return answers, throttle

    async def _admit_all(self, request: ProduceRequest, producer: Producer, deadline: float,
                         answers: list[tuple[str, list[PartitionResult]]],
                         admitted: list[_Admitted]) -> int:
        """Check and buffer every partition of ``request`` (answers of refused ones filled
        in); the throttle time so far (ms)."""
        throttle = 0
        for topic in request.topics:
            results: list[PartitionResult] = []
            for part in topic.partitions:
                result = PartitionResult(part.index)
                results.append(result)
                try:
                    entry, waited = await self._admit(topic.name, part, result, producer,
                                                      deadline)
                    if not request.client_throttles:  # (a v6+ client would wait twice)
                        throttle += waited
                    if entry is not None:
                        admitted.append(entry)
                except KafkaError as error:
                    _refuse(result, error)
                    throttle = max(throttle, error.throttle_ms)
            answers.append((topic.name, results))
        return throttle

    async def _settle(self, entry: _Admitted, producer: Producer) -> int:
        """Wait until ``entry`` is durable; fill its answer; the throttle time (ms)."""
        try:
            await entry.durable
        except IngestError as error:
            if entry.key is not None:
                producer.sequences.failed(entry.key)
            kafka = _kafka_error(error)
            _refuse(entry.result, kafka)
            return kafka.throttle_ms
        except Exception:  # a bug must not leave the producer without an answer
            log.exception("Kafka produce to stream %r failed unexpectedly", entry.stream)
            _refuse(entry.result, KafkaError(Code.UNKNOWN_SERVER_ERROR, "internal error; the "
                                             "ingestor logged it; nothing was acknowledged"))
            return 0
        self.service.accepted(entry.stream, entry.count)
        if entry.key is not None and entry.batch is not None:
            self.durable.add(entry.key, entry.batch)
        return 0

    async def _admit(self, topic: str, part: PartitionData, result: PartitionResult,
                     producer: Producer, deadline: float) -> tuple[_Admitted | None, int]:
        """Check and buffer one partition's batch; (None, 0) for a remembered duplicate
        (its answer is filled in already)."""
        try:
            stream = self.service.stream(topic)
        except UnknownStream:
            raise KafkaError(Code.UNKNOWN_TOPIC_OR_PARTITION, f"no stream {topic!r}: topics "
                             "are icefloe streams, and none is created on produce") from None
        partitions = stream.config.kafka_partitions
        if not 0 <= part.index < partitions:
            raise KafkaError(Code.UNKNOWN_TOPIC_OR_PARTITION, f"topic {topic!r} has "
                             f"partitions 0-{partitions - 1} (kafka_partitions); not "
                             f"{part.index}")
        caller, waited = await self._authorize(stream, producer, deadline)
        if not part.records:
            raise KafkaError(Code.CORRUPT_MESSAGE, "the partition's records are empty")
        records = read_batch(part.records, self.max_batch_bytes,
                             kafka_meta_wanted(stream.config))
        head = records.header
        key: Key | None = None
        batch: Batch | None = None
        if head.producer_id >= 0:
            key = (stream.name, part.index, head.producer_id, caller.token)
            last = (head.base_sequence + head.count - 1) & 0x7FFFFFFF
            remembered = self.durable.duplicate(key, head.producer_epoch, head.base_sequence,
                                                last)
            if remembered is not None:  # Kafka answers a duplicate with the first offset
                raise _Duplicate(remembered)
            producer.sequences.check(key, head.producer_epoch, head.base_sequence)
            batch = Batch(head.producer_epoch, head.base_sequence, last, 0)
        entry, more = await self._buffer(stream, topic, result, records, caller, deadline)
        if key is not None and batch is not None:
            producer.sequences.admitted(key, head.producer_epoch, batch.last)
            entry.batch = batch._replace(base_offset=entry.result.base_offset)
        entry.key = key
        return entry, waited + more

    async def _authorize(self, stream: CompiledStream, producer: Producer, deadline: float
                         ) -> tuple[Caller, int]:
        waited = 0
        while True:
            try:
                return await self.service.authorize(stream, producer.token,
                                                    producer.client), waited
            except Overloaded as error:
                waited += await self._wait(error, deadline)
            except (Unauthenticated, PermissionDenied) as error:
                raise KafkaError(Code.TOPIC_AUTHORIZATION_FAILED, error.message) from None

    async def _wait(self, error: Overloaded, deadline: float) -> int:
        """A rate limit: wait as a throttled Kafka broker would, within the request's
        timeout; past it, REQUEST_TIMED_OUT (retriable) with the throttle time."""
        pause = error.retry_after_s or 0.1
        if error.code != "rate_limited" or self.clock.monotonic() + pause > deadline:
            raise _kafka_error(error)
        await self.clock.sleep(pause)
        return int(pause * 1000)

    async def _buffer(self, stream: CompiledStream, topic: str, result: PartitionResult,
                      records: Records, caller: Caller, deadline: float
                      ) -> tuple[_Admitted, int]:
        partition = result.index
        sent = len(records.values)
        origin: list[int] | None = None  # each kept record's index in the batch sent
        if stream.config.cdc is not None and None in records.values:
            records, origin = self._without_tombstones(stream, records)
            if not records.values:  # nothing but tombstones: nothing to buffer
                result.base_offset = self.offsets.assign(topic, partition, sent)
                durable = asyncio.get_running_loop().create_future()
                durable.set_result(None)
                return _Admitted(result, durable, stream.name, 0, None, None), 0
        try:
            canonical, ids = self._canonical(stream, partition, records, caller, origin)
            count = len(canonical.payloads)
            try:  # offsets for every record sent (tombstones too), as a broker numbers them
                base = self.offsets.assign(topic, partition, sent)
            except ValueError as exc:
                raise KafkaError(Code.MESSAGE_TOO_LARGE, str(exc)) from None
            metas = self._metas(stream, topic, partition, base, records, caller, origin)
        except KafkaError as error:
            if origin is not None:  # name the records as the producer numbered them
                error.record_errors = [(origin[i], why) for i, why in error.record_errors]
            raise
        waited = 0
        while True:
            try:
                durable = self.service.admit(stream, canonical, derived_ids=ids,
                                             caller=caller, metas=metas)
                break
            except Overloaded as error:
                waited += await self._wait(error, deadline)
            except IngestError as error:
                raise _kafka_error(error) from None
        result.base_offset = base
        return _Admitted(result, durable, stream.name, count, None, None), waited

    def _without_tombstones(self, stream: CompiledStream, records: Records
                            ) -> tuple[Records, list[int]]:
        """A change stream's batch without its null values (Debezium's tombstone after
        each delete, for Kafka's log compaction: the delete itself removed the key),
        counted in ``icefloe_ingest_cdc_null_values_ignored_total``; and the index each
        kept record had in the batch."""
        values, kept = without_nulls(records.values)
        self.service.metrics.cdc_nulls_ignored.labels(stream.name).inc(
            len(records.values) - len(kept))
        return dataclasses.replace(records, values=list[bytes | None](values),
                                   keys=_pick(records.keys, kept),
                                   timestamps=_pick(records.timestamps, kept),
                                   headers=_pick(records.headers, kept)), kept

    def _canonical(self, stream: CompiledStream, partition: int, records: Records,
                   caller: Caller, origin: list[int] | None = None
                   ) -> tuple[Canonical, tuple[bytes, list[bytes]] | None]:
        values = records.values
        if None in values:  # a C-level scan; the list of them only for the refusal
            nulls = [i for i, value in enumerate(values) if value is None]
            raise KafkaError(Code.INVALID_RECORD, f"{len(nulls)} record(s) have a null value "
                             "(a tombstone); icefloe streams take a value per record",
                             record_errors=[(i, "null value") for i in nulls[:MAX_RECORD_ERRORS]])
        payloads: list[bytes] = values  # type: ignore[assignment]  # no nulls left
        try:
            if stream.config.payload == "bytes":
                canonical = stream.from_entries(payloads)
            elif stream.typed is not None:
                canonical = stream.from_binary(payloads)
            else:
                canonical = stream.from_events(payloads)
        except InvalidEvents as exc:
            raise KafkaError(Code.INVALID_RECORD, str(exc), record_errors=[
                (v.index, f"{v.field}: {v.reason}" if v.field else v.reason)
                for v in exc.violations[:MAX_RECORD_ERRORS]]) from None
        except IngestError as error:  # a writer schema id not read yet: retriable
            raise _kafka_error(error) from None
        head = records.header
        if head.producer_id < 0:
            return canonical, None
        stem, suffixes = sequence_ids(caller.token, partition, head.producer_id,
                                      head.producer_epoch, head.base_sequence, head.count)
        if origin is not None:  # each kept record keeps its own sequence's id
            suffixes = [suffixes[i] for i in origin]
        return canonical, (stem, suffixes)

    def _metas(self, stream: CompiledStream, topic: str, partition: int, base: int,
               records: Records, caller: Caller, origin: list[int] | None = None
               ) -> list[bytes] | None:
        """Each record's envelope meta when the stream maps Kafka metadata, else None
        (``origin``: each record's index in the batch sent, which its offset follows)."""
        config = stream.config
        if not kafka_meta_wanted(config):
            return None
        bad = [(i, why) for i, key in enumerate(records.keys)
               if (why := check_kafka_key(config, key)) is not None]
        if bad:
            raise KafkaError(Code.INVALID_RECORD, f"{len(bad)} record key(s) refused: "
                             f"{bad[0][1]}", record_errors=bad[:MAX_RECORD_ERRORS])
        try:
            shared = stream.request_meta(caller.client, lambda name: None, lambda: [])
        except InvalidEvents as exc:
            raise KafkaError(Code.INVALID_RECORD, str(exc)) from None
        common: dict[str, Any] = msgspec.json.decode(shared) if shared else {}
        encode = msgspec.json.encode
        return [encode({**common, "kf": kafka_meta(topic, partition,
                                                   base + (i if origin is None else origin[i]),
                                                   records.timestamps[i], records.keys[i],
                                                   records.headers[i])})
                for i in range(len(records.values))]


def _pick(column: list[T], kept: list[int]) -> list[T]:
    """``column`` at ``kept`` (an empty column, left unbuilt by the parse, stays empty)."""
    return [column[i] for i in kept] if column else column


def sequence_ids(token: str | None, partition: int, producer_id: int, epoch: int,
                 base_sequence: int, count: int) -> tuple[bytes, list[bytes]]:
    """The event ids of an idempotent producer's batch, as a stem and a suffix per record:
    ``kafka:<token name>:<partition>:<producer id>:<epoch>:`` + the record's sequence
    (sequences wrap at 2**31, as the producer's do). Bytes, already checked: the ingest
    service frames them as they are (0.4 -> 0.1 us per record against formatting and
    checking each id as text)."""
    stem = f"kafka:{token or '-'}:{partition}:{producer_id}:{epoch}:".encode()
    if len(stem) + 10 > MAX_ID_BYTES:  # a very long token name: refused by the id checks
        raise KafkaError(Code.INVALID_RECORD, f"the event ids of this batch would be over "
                         f"{MAX_ID_BYTES} bytes (the token's name is {len(token or '')} "
                         "characters): use a token with a shorter name")
    if speedups.compiled is not None:  # the same suffixes, ~3x faster
        return stem, speedups.compiled.decimal_suffixes(base_sequence, count)
    end = base_sequence + count
    if end <= 0x80000000:
        return stem, [b"%d" % sequence for sequence in range(base_sequence, end)]
    return stem, [b"%d" % (sequence & 0x7FFFFFFF) for sequence in range(base_sequence, end)]


class _Duplicate(KafkaError):
    """A batch this ingestor already made durable: answered with its first offset."""

    def __init__(self, base_offset: int) -> None:
        super().__init__(Code.NONE, "duplicate of a durable batch")
        self.base_offset = base_offset


def _refuse(result: PartitionResult, error: KafkaError) -> None:
    if isinstance(error, _Duplicate):
        result.base_offset = error.base_offset
        return
    result.error = int(error.code)
    result.message = error.message
    result.record_errors = error.record_errors
    result.base_offset = -1


def _kafka_error(error: IngestError) -> KafkaError:
    """An ingest refusal as the Kafka code whose client behaviour fits."""
    throttle = int((error.retry_after_s or 0) * 1000)
    if isinstance(error, Overloaded):
        code = Code.REQUEST_TIMED_OUT if error.code == "rate_limited" \
            else Code.NOT_ENOUGH_REPLICAS
    elif isinstance(error, Unavailable):
        # Kafka's meanings: NOT_ENOUGH_REPLICAS is "nothing was written", REQUEST_TIMED_OUT
        # "possibly persisted" (librdkafka marks the records so); both are retried with the
        # same sequences, so the ids, and the collector's dedup, still hold
        code = Code.REQUEST_TIMED_OUT if error.may_be_stored else Code.NOT_ENOUGH_REPLICAS
    elif isinstance(error, PayloadTooLarge):
        code = Code.MESSAGE_TOO_LARGE
    elif isinstance(error, BadRequest):
        code = Code.INVALID_RECORD
    elif isinstance(error, Unauthenticated | PermissionDenied):
        code = Code.TOPIC_AUTHORIZATION_FAILED
    else:
        code = Code.UNKNOWN_SERVER_ERROR
    details = [(int(d["index"]), str(d.get("reason"))) for d in error.details or ()
               if isinstance(d, dict) and isinstance(d.get("index"), int)]
    return KafkaError(code, error.message, record_errors=details[:MAX_RECORD_ERRORS],
                      throttle_ms=throttle)

