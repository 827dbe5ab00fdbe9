"""The six Kafka APIs a producer needs, their versions, and their request and response
layouts.

Versions served (``SUPPORTED``): a client negotiates the highest it shares with these through
ApiVersions. Produce starts at v3 (the first with record batches of magic 2); every other
API is served from v0. Flexible versions (compact strings and arrays, tagged fields) start
where the protocol says (``FLEXIBLE_FROM``). Fetch, offsets, groups and transactions are not
listed: a client that asks for them anyway gets a clear refusal (see
:mod:`ingestor.kafka.connection`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ingestor.kafka.wire import Malformed, Reader, Writer

PRODUCE, FETCH, METADATA, API_VERSIONS, SASL_HANDSHAKE, INIT_PRODUCER_ID, SASL_AUTHENTICATE = \
    0, 1, 3, 18, 17, 22, 36
FIND_COORDINATOR = 10
SUPPORTED: dict[int, tuple[int, int]] = {
    PRODUCE: (3, 9), METADATA: (0, 12), API_VERSIONS: (0, 3), SASL_HANDSHAKE: (0, 1),
    INIT_PRODUCER_ID: (0, 4), SASL_AUTHENTICATE: (0, 2), FIND_COORDINATOR: (0, 4)}
"""FindCoordinator is served only to refuse: a consumer group or a transaction gets a
non-retriable authorization error with a message saying icefloe serves producers only (an
unlisted FindCoordinator made librdkafka's consumers retry silently forever)."""
REFUSING = frozenset({FIND_COORDINATOR})
"""Served only to answer with a refusal the client shows its application."""
ADVERTISED: dict[int, tuple[int, int]] = {**SUPPORTED, FETCH: (4, 12)}
"""What ApiVersions lists. Fetch is listed but never served: librdkafka infers the record
batch format (magic 2) and zstd from the *pair* of Produce and Fetch versions a broker
lists, and without Fetch it would write the old message format (and no idempotence). A
Fetch that arrives anyway closes the connection with a log line saying why."""
FLEXIBLE_FROM = {PRODUCE: 9, FETCH: 12, METADATA: 9, API_VERSIONS: 3, SASL_HANDSHAKE: 99,
                 INIT_PRODUCER_ID: 2, SASL_AUTHENTICATE: 2, FIND_COORDINATOR: 3}
NAMES = {0: "Produce", 1: "Fetch", 2: "ListOffsets", 3: "Metadata", 8: "OffsetCommit",
         9: "OffsetFetch", 10: "FindCoordinator", 11: "JoinGroup", 12: "Heartbeat",
         13: "LeaveGroup", 14: "SyncGroup", 17: "SaslHandshake", 18: "ApiVersions",
         19: "CreateTopics", 22: "InitProducerId", 24: "AddPartitionsToTxn",
         25: "AddOffsetsToTxn", 26: "EndTxn", 32: "DescribeConfigs", 36: "SaslAuthenticate",
         60: "DescribeCluster"}


def api_name(key: int) -> str:
    return NAMES.get(key, f"API key {key}")


def flexible(key: int, version: int) -> bool:
    return version >= FLEXIBLE_FROM.get(key, 99)


@dataclass(frozen=True, slots=True)
class RequestHeader:
    api_key: int
    version: int
    correlation_id: int
    client_id: str | None


def read_header(frame: bytes | memoryview) -> tuple[RequestHeader, Reader]:
    """The request header, and a reader at the body. An API or version not served still
    gives its header (the caller answers or closes); its tagged fields are not read."""
    reader = Reader(frame)
    key, version = reader.int16("api key"), reader.int16("api version")
    correlation = reader.int32("correlation id")
    client_id = reader.nullable_string("client id")
    low, high = SUPPORTED.get(key, (0, -1))
    if low <= version <= high and flexible(key, version):
        reader.tagged_fields()
    return RequestHeader(key, version, correlation, client_id), reader


def response_frame(header: RequestHeader, body: bytes) -> bytes:
    """Size + correlation id (+ tagged fields for flexible versions; never ApiVersions,
    whose response header stays v0 so any client can read it) + body."""
    head = Writer().int32(header.correlation_id)
    if header.api_key != API_VERSIONS and flexible(header.api_key, header.version):
        head.tagged_fields()
    out = head.getvalue() + body
    return len(out).to_bytes(4, "big") + out


# -- ApiVersions ---------------------------------------------------------------------------

def api_versions_response(version: int, error: int = 0) -> bytes:
    """Every served API with its version range (also the answer, at v0 with
    UNSUPPORTED_VERSION, to an ApiVersions version we do not serve)."""
    compact = version >= 3
    out = Writer().int16(error).array_len(len(ADVERTISED), compact=compact)
    for key, (low, high) in sorted(ADVERTISED.items()):
        out.int16(key).int16(low).int16(high)
        if compact:
            out.tagged_fields()
    if version >= 1:
        out.int32(0)  # throttle_time_ms
    if compact:
        out.tagged_fields()
    return out.getvalue()


# -- Metadata ------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class MetadataRequest:
    topics: list[str] | None
    """None: every topic."""


def read_metadata(reader: Reader, version: int) -> MetadataRequest:
    compact = version >= 9

    def topic(r: Reader) -> str:
        if version >= 10:
            r.uuid("topic id")
        name = r.compact_nullable_string("topic") if compact else r.string("topic")
        if compact:
            r.tagged_fields()
        if name is None:
            raise Malformed("Metadata by topic id is not served; name the topic")
        return name

    topics = reader.array(topic, "topics", compact=compact, nullable=version >= 1)
    if version == 0 and not topics:
        topics = None  # v0: an empty list means every topic
    if version >= 4:
        reader.boolean("allow_auto_topic_creation")  # topics are streams: never created
    if 8 <= version <= 10:
        reader.boolean("include_cluster_authorized_operations")
    if version >= 8:
        reader.boolean("include_topic_authorized_operations")
    if compact:
        reader.tagged_fields()
    return MetadataRequest(topics)


@dataclass(frozen=True, slots=True)
class Broker:
    node_id: int
    host: str
    port: int


@dataclass(frozen=True, slots=True)
class TopicMetadata:
    name: str
    error: int
    partitions: int
    topic_id: bytes = bytes(16)


def metadata_response(version: int, broker: Broker, cluster_id: str,
                      topics: list[TopicMetadata]) -> bytes:
    compact = version >= 9
    out = Writer()
    if version >= 3:
        out.int32(0)  # throttle_time_ms
    out.array_len(1, compact=compact).int32(broker.node_id)
    out.string(broker.host, compact=compact).int32(broker.port)
    if version >= 1:
        out.string(None, compact=compact)  # rack
    if compact:
        out.tagged_fields()
    if version >= 2:
        out.string(cluster_id, compact=compact)
    if version >= 1:
        out.int32(broker.node_id)  # controller
    out.array_len(len(topics), compact=compact)
    for topic in topics:
        _topic_metadata(out, version, broker, topic)
    if 8 <= version <= 10:
        out.int32(-2147483648)  # cluster_authorized_operations: not computed
    if compact:
        out.tagged_fields()
    return out.getvalue()


def _topic_metadata(out: Writer, version: int, broker: Broker, topic: TopicMetadata) -> None:
    compact = version >= 9
    out.int16(topic.error).string(topic.name, compact=compact)
    if version >= 10:
        out.parts.append(topic.topic_id)
    if version >= 1:
        out.boolean(False)  # is_internal
    out.array_len(topic.partitions, compact=compact)
    for index in range(topic.partitions):
        out.int16(0).int32(index).int32(broker.node_id)
        if version >= 7:
            out.int32(0)  # leader_epoch
        out.int32_array([broker.node_id], compact=compact)  # replicas
        out.int32_array([broker.node_id], compact=compact)  # in-sync replicas
        if version >= 5:
            out.int32_array([], compact=compact)  # offline replicas
        if compact:
            out.tagged_fields()
    if version >= 8:
        out.int32(-2147483648)  # topic_authorized_operations: not computed
    if compact:
        out.tagged_fields()


# -- InitProducerId ------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class InitProducerIdRequest:
    transactional_id: str | None
    producer_id: int = -1
    producer_epoch: int = -1


def read_init_producer_id(reader: Reader, version: int) -> InitProducerIdRequest:
    compact = version >= 2
    txn = reader.compact_nullable_string("transactional id") if compact else \
        reader.nullable_string("transactional id")
    reader.int32("transaction timeout")
    pid = epoch = -1
    if version >= 3:
        pid, epoch = reader.int64("producer id"), reader.int16("producer epoch")
    if compact:
        reader.tagged_fields()
    return InitProducerIdRequest(txn, pid, epoch)


def init_producer_id_response(version: int, error: int, producer_id: int, epoch: int) -> bytes:
    out = Writer().int32(0).int16(error).int64(producer_id).int16(epoch)
    if version >= 2:
        out.tagged_fields()
    return out.getvalue()


# -- Produce -------------------------------------------------------------------------------

@dataclass(slots=True)
class PartitionData:
    index: int
    records: bytes | memoryview | None


@dataclass(slots=True)
class TopicData:
    name: str
    partitions: list[PartitionData]


@dataclass(frozen=True, slots=True)
class ProduceRequest:
    transactional_id: str | None
    acks: int
    timeout_ms: int
    topics: list[TopicData]
    client_throttles: bool = False
    """Produce v6+: the client itself waits an answer's ``throttle_time_ms`` before its next
    request (KIP-219), so a wait the answer was already held for must not be reported
    again (the client would wait twice)."""


def read_produce(reader: Reader, version: int) -> ProduceRequest:
    compact = version >= 9

    def partition(r: Reader) -> PartitionData:
        index = r.int32("partition")
        records = r.compact_nullable_bytes("records") if compact else \
            r.nullable_bytes("records")
        if compact:
            r.tagged_fields()
        return PartitionData(index, records)

    def topic(r: Reader) -> TopicData:
        name = r.compact_string("topic") if compact else r.string("topic")
        parts = r.array(partition, "partitions", compact=compact) or []
        if compact:
            r.tagged_fields()
        return TopicData(name, parts)

    txn = reader.compact_nullable_string("transactional id") if compact else \
        reader.nullable_string("transactional id")
    acks, timeout = reader.int16("acks"), reader.int32("timeout")
    topics = reader.array(topic, "topics", compact=compact) or []
    if compact:
        reader.tagged_fields()
    return ProduceRequest(txn, acks, timeout, topics, client_throttles=version >= 6)


@dataclass(slots=True)
class PartitionResult:
    index: int
    error: int = 0
    base_offset: int = -1
    message: str | None = None
    record_errors: list[tuple[int, str]] = field(default_factory=list)


def produce_response(version: int, results: list[tuple[str, list[PartitionResult]]],
                     throttle_ms: int) -> bytes:
    compact = version >= 9
    out = Writer().array_len(len(results), compact=compact)
    for name, partitions in results:
        out.string(name, compact=compact).array_len(len(partitions), compact=compact)
        for part in partitions:
            out.int32(part.index).int16(part.error).int64(part.base_offset)
            out.int64(-1)  # log_append_time_ms: CreateTime is kept
            if version >= 5:
                out.int64(0)  # log_start_offset
            if version >= 8:
                out.array_len(len(part.record_errors), compact=compact)
                for index, why in part.record_errors:
                    out.int32(index).string(why, compact=compact)
                    if compact:
                        out.tagged_fields()
                out.string(part.message, compact=compact)
            if compact:
                out.tagged_fields()
        if compact:
            out.tagged_fields()
    out.int32(throttle_ms)
    if compact:
        out.tagged_fields()
    return out.getvalue()


# -- FindCoordinator (refused) -------------------------------------------------------------

def read_find_coordinator(reader: Reader, version: int) -> tuple[int, list[str]]:
    """(key type: 0 group, 1 transaction; the keys asked for)."""
    if version >= 4:
        key_type = reader.int8("key type")
        keys = reader.array(lambda r: r.compact_string("key"), "keys", compact=True) or []
    else:
        key = reader.compact_string("key") if version >= 3 else reader.string("key")
        key_type = reader.int8("key type") if version >= 1 else 0
        keys = [key]
    if version >= 3:
        reader.tagged_fields()
    return key_type, keys


def find_coordinator_response(version: int, keys: list[str], error: int,
                              message: str) -> bytes:
    compact = version >= 3
    out = Writer()
    if version >= 1:
        out.int32(0)  # throttle_time_ms
    if version >= 4:
        out.array_len(len(keys), compact=True)
        for key in keys:
            out.string(key, compact=True).int32(-1).string("", compact=True).int32(-1)
            out.int16(error).string(message, compact=True).tagged_fields()
        return out.tagged_fields().getvalue()
    out.int16(error)
    if version >= 1:
        out.string(message, compact=compact)
    out.int32(-1).string("", compact=compact).int32(-1)
    if compact:
        out.tagged_fields()
    return out.getvalue()


# -- SASL ----------------------------------------------------------------------------------

def read_sasl_handshake(reader: Reader) -> str:
    return reader.string("mechanism")


def sasl_handshake_response(error: int, mechanisms: list[str]) -> bytes:
    out = Writer().int16(error).array_len(len(mechanisms), compact=False)
    for name in mechanisms:
        out.string(name, compact=False)
    return out.getvalue()


def read_sasl_authenticate(reader: Reader, version: int) -> bytes:
    compact = version >= 2
    raw = reader.compact_nullable_bytes("auth bytes") if compact else \
        reader.nullable_bytes("auth bytes")
    if compact:
        reader.tagged_fields()
    return bytes(raw or b"")


def sasl_authenticate_response(version: int, error: int, message: str | None) -> bytes:
    compact = version >= 2
    out = Writer().int16(error).string(message, compact=compact)
    out.bytes_(b"", compact=compact)
    if version >= 1:
        out.int64(0)  # session_lifetime_ms: no re-authentication asked
    if compact:
        out.tagged_fields()
    return out.getvalue()
