"""The Kafka error codes the produce path answers with, and what each tells a producer.

Why a table of our own: a client acts on the code alone (retry, refresh metadata, fail the
message), so each refusal must pick the code whose client behaviour matches what icefloe
wants: retriable for "not durable yet" (the store, the buffer, a rate limit), permanent
for bad input. The numbers are the protocol's.
"""

from __future__ import annotations

from enum import IntEnum


class Code(IntEnum):
    NONE = 0
    UNKNOWN_SERVER_ERROR = -1
    """A bug: logged; nothing of the batch was acknowledged."""
    CORRUPT_MESSAGE = 2
    """A record batch whose CRC32C does not match, or which does not parse."""
    UNKNOWN_TOPIC_OR_PARTITION = 3
    """No stream of that name, or a partition beyond its ``kafka_partitions``."""
    REQUEST_TIMED_OUT = 7
    """Still over a rate limit when the request's own timeout ran out (retriable)."""
    MESSAGE_TOO_LARGE = 10
    """A record over ``max_event_bytes`` or a batch over the request limit."""
    COORDINATOR_NOT_AVAILABLE = 15
    """InitProducerId could not claim producer ids from the store (retriable)."""
    NOT_ENOUGH_REPLICAS = 19
    """The store is unreachable or the buffer is full: nothing was made durable (retriable)."""
    INVALID_REQUIRED_ACKS = 21
    TOPIC_AUTHORIZATION_FAILED = 29
    GROUP_AUTHORIZATION_FAILED = 30
    """FindCoordinator for a consumer group: consumers are not served."""
    CLUSTER_AUTHORIZATION_FAILED = 31
    UNSUPPORTED_SASL_MECHANISM = 33
    ILLEGAL_SASL_STATE = 34
    UNSUPPORTED_VERSION = 35
    INVALID_REQUEST = 42
    UNSUPPORTED_FOR_MESSAGE_FORMAT = 43
    """A record batch older than magic 2 (Kafka 0.11's format)."""
    OUT_OF_ORDER_SEQUENCE_NUMBER = 45
    INVALID_PRODUCER_EPOCH = 47
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
    """Transactions are not served (see docs/kafka.md)."""
    SASL_AUTHENTICATION_FAILED = 58
    INVALID_RECORD = 87
    """A record the stream refuses (its value does not validate, a tombstone, a control
    batch); the answer's ``record_errors`` name each one."""


class KafkaError(Exception):
    """A refusal of one partition's batch (or of a whole request) with its code."""

    def __init__(self, code: Code, message: str, *,
                 record_errors: list[tuple[int, str]] | None = None,
                 throttle_ms: int = 0) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.record_errors = record_errors or []
        self.throttle_ms = throttle_ms
