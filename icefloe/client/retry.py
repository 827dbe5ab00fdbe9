"""What both ingest clients share: the refusal, the backoff, and retrying only what is safe.

Why retries are duplicate-free
------------------------------
An ingestor derives the id of every event that has none (no ``event_id_field`` value, no
gRPC ``Event.event_id``) from the request's idempotency key: the key itself for a one-event
request, ``key:index`` otherwise. These clients give **every call** a key (a fresh random one
unless you pass ``idempotency_key`` / ``request_id``) and send the **same key with the same
events in the same order on every retry**. So if an attempt that looked failed had in fact
been stored (a timeout or a reset after the ingestor acknowledged), its retry carries
identical event ids, and the collector's deduplication by event id (within its dedup
window) drops the second copy.

Retried (jittered exponential backoff, never sooner than the server's ``Retry-After`` /
``RetryInfo``; at most ``retries`` times in a row):

* HTTP 429 and 503 (the ingestor's backpressure, rate limits and "not acknowledged"
  answers), 408 (an upload the ingestor found too slow), 502/504 (a gateway in front of
  it), and transport errors: connection refused/reset, timeouts.
* gRPC calls reset with HTTP/2 REFUSED_STREAM (UNAVAILABLE "Received RST_STREAM with
  error code 7": more calls at once than the connection's stream limit; the server never
  read them): retried apart from ``retries`` (jittered backoff of at most 0.5 s, for as
  long as ``timeout`` in all), so a burst over one channel does not use up ``retries``.
* gRPC UNAVAILABLE (store down, shutting down, connection failures), RESOURCE_EXHAUSTED
  *with* a ``RetryInfo`` (buffer or manifest queue full, rate limited; without one it is a
  local limit such as an oversized message, which a retry cannot fix), and
  DEADLINE_EXCEEDED.

Not retried, raised at once as :class:`IngestRejected`: 400/401/403/404/413/415 and the gRPC
codes INVALID_ARGUMENT, UNAUTHENTICATED, PERMISSION_DENIED, NOT_FOUND, ... — the request
can never succeed unchanged. When the retries run out, the last answer is raised as an
:class:`IngestRejected` with ``retryable=True``: nothing of that request was acknowledged,
and sending it again later *with the same key* stays safe.

What is **not** safe: reusing one key for *different* events (their ids collide with the
earlier ones and they are dropped as duplicates), or retrying a request yourself without
a key and without event ids. ``publish_stream`` gives every request without a
``request_id`` a fresh one, and after a broken stream resends the unacknowledged requests
with their ids.

The HTTP client (:mod:`icefloe.client.http`) and the gRPC client (:mod:`icefloe.client.grpc`)
each say which of their answers are retryable; the loops here do the waiting.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec
from google.protobuf.message import Message

from icefloe.clock import SYSTEM, Clock
from icefloe.errors import IcefloeError
from icefloe.v1 import ingest_pb2

if TYPE_CHECKING:
    import grpc

__all__ = [
    "MAX_HINT_S", "REFUSED_BACKOFF", "REFUSED_STREAM", "STREAM_IDLE", "Attempts", "Backoff",
    "EventLike", "IngestRejected", "Retrying", "event_json", "new_key",
]

T = TypeVar("T")
EventLike = Mapping[str, Any] | bytes | ingest_pb2.Event | Message
"""An event: a JSON-serializable mapping, one JSON object as bytes, a gRPC ``Event``, or
(gRPC, a ``format = "protobuf"`` stream) the stream's Protobuf message itself."""

REFUSED_STREAM = "refused_stream"
"""``IngestRejected.code`` of a call the server reset with HTTP/2 REFUSED_STREAM."""
STREAM_IDLE = "stream_idle"
"""The code of a PublishStream the server ended after ``grpc_stream_idle_s`` of silence
with nothing in flight; ``publish_stream`` opens a new one (resending nothing lost)."""
MAX_HINT_S = 60.0
"""The longest server back-off hint honoured (seconds)."""
_encode = msgspec.json.Encoder().encode


class IngestRejected(IcefloeError):
    """The ingestor refused a request (or could not be reached): nothing was acknowledged.

    Attributes:
        status: the HTTP status, the ``grpc.StatusCode``, or None when no answer came back.
        code: the stable error code (``"validation_failed"``, ``"buffer_full"``, ...;
            ``"connection_failed"`` / ``"timeout"`` for transport errors).
        message: what went wrong and what to do.
        details: per-event problems, ``{"index", "field", "reason"}`` each.
        retry_after_s: the server's back-off hint, if any.
        retryable: True if a later retry with the same key may succeed.
        attempts: how many attempts were made before giving up.
        may_be_stored: True if this attempt, or any earlier one of the same call, may have
            stored the events although none was acknowledged: the server said so (a
            flush that timed out or lost a write's answer: the 503 body's
            ``may_be_stored``, gRPC's ``ErrorInfo`` metadata), or the answer never came
            back after the request may have been sent. A resend with the same key is
            deduplicated either way; a resend under a new key, after the dedup window,
            or to another table may store them twice. False: the events were not stored.
    """

    def __init__(self, status: int | grpc.StatusCode | None, code: str, message: str,
                 details: list[dict[str, Any]] | None = None, *,
                 retry_after_s: float | None = None, retryable: bool = False,
                 attempts: int = 1, may_be_stored: bool = False) -> None:
        super().__init__(f"{code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.details = details or []
        self.retry_after_s = retry_after_s
        self.retryable = retryable
        self.attempts = attempts
        self.may_be_stored = may_be_stored


@dataclass(frozen=True)
class Backoff:
    """Full-jitter exponential backoff (``base_s`` · 2^(n-1), capped at ``max_s``).

    A server hint wins when it is longer: the delay is then the hint plus up to 20 % jitter,
    so clients told to wait do not all come back in the same instant.
    """

    base_s: float = 0.1
    max_s: float = 10.0

    def delay(self, retry: int, hint_s: float | None = None) -> float:
        backoff = random.uniform(0, min(self.max_s, self.base_s * 2 ** (retry - 1)))
        if hint_s:
            return max(backoff, min(hint_s, MAX_HINT_S) * random.uniform(1.0, 1.2))
        return backoff


REFUSED_BACKOFF = Backoff(base_s=0.01, max_s=0.5)
"""Backoff between attempts of a refused stream: short, the connection is merely busy."""


def new_key() -> str:
    """A fresh idempotency key (random, 32 hex characters)."""
    return uuid.uuid4().hex


def event_json(event: EventLike) -> bytes:
    """One event's JSON bytes, whichever shape it was given in."""
    if isinstance(event, bytes | bytearray | memoryview):
        return bytes(event)
    if isinstance(event, ingest_pb2.Event):
        return event.json
    return _encode(event)


# -- retry loops ------------------------------------------------------------------------------


class Attempts:
    """The retry budget of one call: ordinary retries, and refused streams apart.

    Why apart: a refused stream (HTTP/2 REFUSED_STREAM: the call was over the connection's
    stream limit and the server never looked at it) says only "this connection is busy",
    so a burst of concurrent calls over one channel must not spend the retries meant for a
    store outage. Refused attempts are retried with a short capped backoff
    (``REFUSED_BACKOFF``) until their waits add up to the client's ``timeout``.
    """

    __slots__ = ("may_be_stored", "owner", "refused", "refused_wait_s", "retry")

    def __init__(self, owner: Retrying) -> None:
        self.owner = owner
        self.retry = 0
        self.refused = 0
        self.refused_wait_s = 0.0
        self.may_be_stored = False  # sticky: never cleared, not even by reset()

    def delay(self, exc: IngestRejected) -> float | None:
        """Seconds to wait before the next attempt, or None to give up (raise ``exc``)."""
        self.may_be_stored = exc.may_be_stored = self.may_be_stored or exc.may_be_stored
        if exc.code == STREAM_IDLE:  # the server ended a quiet stream: not a failure
            return REFUSED_BACKOFF.delay(1)
        if exc.code == REFUSED_STREAM and self.refused_wait_s < self.owner.refused_budget_s:
            self.refused += 1
            exc.attempts = self.retry + self.refused
            wait = REFUSED_BACKOFF.delay(self.refused)
            self.refused_wait_s += wait
            return wait
        self.retry += 1
        exc.attempts = self.retry + self.refused
        if not exc.retryable or self.retry > self.owner.retries:
            return None
        return self.owner.backoff.delay(self.retry, exc.retry_after_s)

    def reset(self) -> None:
        """An answer came back: the connection works again (streams)."""
        self.retry = self.refused = 0
        self.refused_wait_s = 0.0


class Retrying:
    """The retry loops of a client (sync and async), with its ``retries`` and ``backoff``;
    the waits are on ``clock`` (a test's manual clock spends them in no real time)."""

    refused_budget_s: float = 10.0
    """How long refused streams of one call may wait in backoff, in all (gRPC: timeout)."""

    def __init__(self, retries: int, backoff: Backoff | None, clock: Clock = SYSTEM) -> None:
        if retries < 0:
            raise ValueError("retries must be >= 0")
        self.retries = retries
        self.backoff = backoff or Backoff()
        self.clock = clock

    def _retry(self, attempt: Callable[[], T]) -> T:
        attempts = Attempts(self)
        while True:
            try:
                return attempt()
            except IngestRejected as exc:
                delay = attempts.delay(exc)
                if delay is None:
                    raise
            self.clock.sleep_sync(delay)

    async def _retry_async(self, attempt: Callable[[], Any]) -> Any:
        attempts = Attempts(self)
        while True:
            try:
                return await attempt()
            except IngestRejected as exc:
                delay = attempts.delay(exc)
                if delay is None:
                    raise
            await self.clock.sleep(delay)


