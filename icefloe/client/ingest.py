"""Small typed clients for the ingest API (HTTP and gRPC) that retry only what is safe.

Why retries are duplicate-free here
-----------------------------------
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

TLS: an ``https://`` URL (HTTP) or ``tls=ClientTls(...)`` (gRPC) encrypts; a
:class:`~icefloe.client.tls.ClientTls` names the CA to trust and, for ingestors that require
mutual TLS, this client's certificate and key.

The synchronous clients are thread-safe (httpx and gRPC channels are); the async twins
belong to one event loop.
"""

from __future__ import annotations

import asyncio
import email.utils
import functools
import random
import re
import ssl
import threading
import time
import uuid
from collections import deque
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import quote

import grpc
import httpx
import msgspec
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from icefloe.client.tls import ClientTls
from icefloe.errors import IcefloeError
from icefloe.v1 import ingest_pb2, ingest_pb2_grpc

__all__ = [
    "AsyncGrpcClient",
    "AsyncHttpClient",
    "Backoff",
    "ClientTls",
    "EventLike",
    "GrpcClient",
    "HttpClient",
    "IngestRejected",
    "new_key",
    "response_error",
]

T = TypeVar("T")
EventLike = Mapping[str, Any] | bytes | ingest_pb2.Event
"""An event: a JSON-serializable mapping, one JSON object as bytes, or a gRPC ``Event``."""

RETRYABLE_HTTP = frozenset({408, 429, 502, 503, 504})
REFUSED_STREAM = "refused_stream"
"""``IngestRejected.code`` of a call the server reset with HTTP/2 REFUSED_STREAM."""
STREAM_IDLE = "stream_idle"
"""The code of a PublishStream the server ended after ``grpc_stream_idle_s`` of silence
with nothing in flight; ``publish_stream`` opens a new one (resending nothing lost)."""
_REFUSED_DETAILS = re.compile(r"RST_STREAM.*error code 7\b")
"""How grpc core words a stream reset with REFUSED_STREAM (code 7) in the call's details."""
_RETRYABLE_GRPC = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
_MAX_HINT_S = 60.0
STREAM_WINDOW = 128
"""Requests ``publish_stream`` holds unanswered at most (taken from the source, not acked)."""
_FIELD = re.compile(r"^events\[(\d+)\](?:\.(.*))?$")
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
    """

    def __init__(self, status: int | grpc.StatusCode | None, code: str, message: str,
                 details: list[dict[str, Any]] | None = None, *,
                 retry_after_s: float | None = None, retryable: bool = False,
                 attempts: int = 1) -> None:
        super().__init__(f"{code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.details = details or []
        self.retry_after_s = retry_after_s
        self.retryable = retryable
        self.attempts = attempts


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
            return max(backoff, min(hint_s, _MAX_HINT_S) * random.uniform(1.0, 1.2))
        return backoff


REFUSED_BACKOFF = Backoff(base_s=0.01, max_s=0.5)
"""Backoff between attempts of a refused stream: short, the connection is merely busy."""


def new_key() -> str:
    """A fresh idempotency key (random, 32 hex characters)."""
    return uuid.uuid4().hex


def _json(event: EventLike) -> bytes:
    if isinstance(event, bytes | bytearray | memoryview):
        return bytes(event)
    if isinstance(event, ingest_pb2.Event):
        return event.json
    return _encode(event)


# -- retry loops ------------------------------------------------------------------------------


class _Attempts:
    """The retry budget of one call: ordinary retries, and refused streams apart.

    Why apart: a refused stream (HTTP/2 REFUSED_STREAM: the call was over the connection's
    stream limit and the server never looked at it) says only "this connection is busy",
    so a burst of concurrent calls over one channel must not spend the retries meant for a
    store outage. Refused attempts are retried with a short capped backoff
    (``REFUSED_BACKOFF``) until their waits add up to the client's ``timeout``.
    """

    __slots__ = ("owner", "refused", "refused_wait_s", "retry")

    def __init__(self, owner: _Retrying) -> None:
        self.owner = owner
        self.retry = 0
        self.refused = 0
        self.refused_wait_s = 0.0

    def delay(self, exc: IngestRejected) -> float | None:
        """Seconds to wait before the next attempt, or None to give up (raise ``exc``)."""
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


class _Retrying:
    refused_budget_s: float = 10.0
    """How long refused streams of one call may wait in backoff, in all (gRPC: timeout)."""

    def __init__(self, retries: int, backoff: Backoff | None) -> None:
        if retries < 0:
            raise ValueError("retries must be >= 0")
        self.retries = retries
        self.backoff = backoff or Backoff()

    def _retry(self, attempt: Callable[[], T]) -> T:
        attempts = _Attempts(self)
        while True:
            try:
                return attempt()
            except IngestRejected as exc:
                delay = attempts.delay(exc)
                if delay is None:
                    raise
            time.sleep(delay)

    async def _retry_async(self, attempt: Callable[[], Any]) -> Any:
        attempts = _Attempts(self)
        while True:
            try:
                return await attempt()
            except IngestRejected as exc:
                delay = attempts.delay(exc)
                if delay is None:
                    raise
            await asyncio.sleep(delay)


# -- HTTP -------------------------------------------------------------------------------------


def _retry_after(value: str | None) -> float | None:
    """``Retry-After``: delta-seconds or an HTTP date."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _http_rejected(response: httpx.Response) -> IngestRejected:
    status = response.status_code
    try:
        body = msgspec.json.decode(response.content)
        code, message = str(body["error"]), str(body.get("message", ""))
        details = list(body.get("details") or [])
    except (msgspec.DecodeError, KeyError, TypeError, AttributeError):  # a proxy's page
        code, message, details = f"http_{status}", response.text[:500], []
    return IngestRejected(status, code, message, details,
                          retry_after_s=_retry_after(response.headers.get("retry-after")),
                          retryable=status in RETRYABLE_HTTP)


def _transport_rejected(exc: httpx.TransportError) -> IngestRejected:
    code = "timeout" if isinstance(exc, httpx.TimeoutException) else "connection_failed"
    return IngestRejected(None, code, f"{type(exc).__name__}: {exc}", retryable=True)


class _HttpBase(_Retrying):
    def __init__(self, base_url: str, token: str | None, timeout: float, retries: int,
                 backoff: Backoff | None) -> None:
        super().__init__(retries, backoff)
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._headers = {"content-type": "application/json"}
        if token:
            self._headers["authorization"] = f"Bearer {token}"

    def _prepare(self, stream: str, events: Iterable[EventLike], key: str | None
                 ) -> tuple[str, bytes, dict[str, str]]:
        body = b"[" + b",".join(_json(event) for event in events) + b"]"
        headers = {**self._headers, "idempotency-key": key or new_key()}
        return f"/v1/streams/{quote(stream, safe='')}/events", body, headers

    @staticmethod
    def _accepted(response: httpx.Response) -> int:
        if response.is_success:
            return int(msgspec.json.decode(response.content)["accepted"])
        raise _http_rejected(response)


def _verify(tls: ClientTls | None) -> ssl.SSLContext | bool:
    return True if tls is None else tls.ssl_context()


class HttpClient(_HttpBase):
    """POSTs events to ``{base_url}/v1/streams/{stream}/events`` (a JSON array).

    ``timeout`` bounds each attempt (seconds); ``retries`` counts retries after the first
    attempt; ``tls`` configures verification and the client certificate of an ``https://``
    URL. Use it as a context manager, or call :meth:`close`.
    """

    def __init__(self, base_url: str, token: str | None = None, timeout: float = 10,
                 retries: int = 5, *, backoff: Backoff | None = None,
                 tls: ClientTls | None = None) -> None:
        super().__init__(base_url, token, timeout, retries, backoff)
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout, verify=_verify(tls))

    def send(self, stream: str, events: Iterable[EventLike],
             idempotency_key: str | None = None) -> int:
        """Send one request; return how many events are durable (all of them).

        Raises:
            IngestRejected: refused (at once) or still failing after the retries.
        """
        path, body, headers = self._prepare(stream, events, idempotency_key)

        def attempt() -> int:
            try:
                response = self._http.post(path, content=body, headers=headers)
            except httpx.TransportError as exc:
                raise _transport_rejected(exc) from exc
            return self._accepted(response)

        return self._retry(attempt)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> HttpClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncHttpClient(_HttpBase):
    """The asyncio twin of :class:`HttpClient` (``await send(...)``, ``async with``)."""

    def __init__(self, base_url: str, token: str | None = None, timeout: float = 10,
                 retries: int = 5, *, backoff: Backoff | None = None,
                 tls: ClientTls | None = None) -> None:
        super().__init__(base_url, token, timeout, retries, backoff)
        self._http = httpx.AsyncClient(base_url=self.base_url, timeout=timeout,
                                       verify=_verify(tls))

    async def send(self, stream: str, events: Iterable[EventLike],
                   idempotency_key: str | None = None) -> int:
        """See :meth:`HttpClient.send`."""
        path, body, headers = self._prepare(stream, events, idempotency_key)

        async def attempt() -> int:
            try:
                response = await self._http.post(path, content=body, headers=headers)
            except httpx.TransportError as exc:
                raise _transport_rejected(exc) from exc
            return self._accepted(response)

        result: int = await self._retry_async(attempt)
        return result

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncHttpClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


# -- gRPC -------------------------------------------------------------------------------------


def _from_status(code: grpc.StatusCode, status: status_pb2.Status | None, message: str
                 ) -> IngestRejected:
    """An IngestRejected from a gRPC code and its rich ``google.rpc.Status`` (if any)."""
    name, details, hint = code.name.lower(), [], None
    for packed in status.details if status is not None else ():
        if packed.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            packed.Unpack(info)
            name = info.reason or name
        elif packed.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            retry = error_details_pb2.RetryInfo()
            packed.Unpack(retry)
            hint = retry.retry_delay.ToTimedelta().total_seconds()
        elif packed.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            packed.Unpack(bad)
            details = [_violation(v.field, v.description) for v in bad.field_violations]
    retryable = code in _RETRYABLE_GRPC or (
        code == grpc.StatusCode.RESOURCE_EXHAUSTED and hint is not None)
    return IngestRejected(code, name, status.message if status is not None else message,
                          details, retry_after_s=hint, retryable=retryable)


def _violation(field: str, reason: str) -> dict[str, Any]:
    match = _FIELD.match(field)
    if match is None:
        return {"index": None, "field": field or None, "reason": reason}
    return {"index": int(match.group(1)), "field": match.group(2) or None, "reason": reason}


def _code(value: int) -> grpc.StatusCode:
    return next((c for c in grpc.StatusCode if c.value[0] == value), grpc.StatusCode.UNKNOWN)


def response_error(response: ingest_pb2.PublishResponse) -> IngestRejected | None:
    """The refusal a ``PublishStream`` response carries in ``error``, else None.

    ``retryable`` says whether resending that request (same ``request_id``) may succeed.
    """
    if not response.HasField("error") or response.error.code == 0:
        return None
    return _from_status(_code(response.error.code), response.error, response.error.message)


def _rpc_rejected(exc: grpc.RpcError) -> IngestRejected:
    call: Any = exc
    try:
        status = rpc_status.from_call(call)
    except ValueError:  # details that contradict the call's code: ignore them
        status = None
    details = call.details() or ""
    if call.code() == grpc.StatusCode.UNAVAILABLE and _REFUSED_DETAILS.search(details):
        return IngestRejected(call.code(), REFUSED_STREAM, "the server refused the stream "
                              f"(over its per-connection limit; nothing was sent): {details}",
                              retryable=True)
    return _from_status(call.code(), status, details)


def _keyed(request: ingest_pb2.PublishRequest) -> ingest_pb2.PublishRequest:
    """The request with a ``request_id`` (a copy with a fresh one if it had none)."""
    if request.request_id:
        return request
    copy = ingest_pb2.PublishRequest()
    copy.CopyFrom(request)
    copy.request_id = new_key()
    return copy


class _GrpcBase(_Retrying):
    def __init__(self, target: str, token: str | None, retries: int, timeout: float,
                 backoff: Backoff | None) -> None:
        super().__init__(retries, backoff)
        self.target = target
        self.timeout = timeout
        self.refused_budget_s = timeout
        self._metadata: tuple[tuple[str, str], ...] = (
            (("authorization", f"Bearer {token}"),) if token else ())

    @staticmethod
    def _request(stream: str, events: Iterable[EventLike], request_id: str | None
                 ) -> ingest_pb2.PublishRequest:
        return ingest_pb2.PublishRequest(
            stream=stream, request_id=request_id or new_key(),
            events=[event if isinstance(event, ingest_pb2.Event)
                    else ingest_pb2.Event(json=_json(event)) for event in events])


def _credentials(tls: ClientTls | None, credentials: grpc.ChannelCredentials | None
                 ) -> grpc.ChannelCredentials | None:
    if tls is not None and credentials is not None:
        raise ValueError("give tls or credentials, not both")
    return tls.grpc_credentials() if tls is not None else credentials


class GrpcClient(_GrpcBase):
    """``icefloe.v1.Ingest`` over one channel (plaintext unless ``tls`` or ``credentials``).

    ``timeout`` bounds each ``publish`` attempt (seconds). ``options`` are channel options,
    e.g. ``[("grpc.max_send_message_length", ...)]``. ``tls=ClientTls()`` speaks TLS with
    the system's CAs; give ``ca_file`` (and ``cert_file``/``key_file`` for mutual TLS) as
    needed.
    """

    def __init__(self, target: str, token: str | None = None, retries: int = 5, *,
                 timeout: float = 10, backoff: Backoff | None = None,
                 credentials: grpc.ChannelCredentials | None = None,
                 options: Iterable[tuple[str, Any]] = (), tls: ClientTls | None = None
                 ) -> None:
        super().__init__(target, token, retries, timeout, backoff)
        credentials = _credentials(tls, credentials)
        options = list(options)
        self._channel = grpc.secure_channel(target, credentials, options) if credentials \
            else grpc.insecure_channel(target, options)
        self._stub = ingest_pb2_grpc.IngestStub(self._channel)

    def publish(self, stream: str, events: Iterable[EventLike],
                request_id: str | None = None) -> int:
        """Publish one request; return how many events are durable (all of them).

        Raises:
            IngestRejected: refused (at once) or still failing after the retries.
        """
        request = self._request(stream, events, request_id)

        def attempt() -> int:
            try:
                reply = self._stub.Publish(request, metadata=self._metadata,
                                           timeout=self.timeout)
            except grpc.RpcError as exc:
                raise _rpc_rejected(exc) from None
            return int(reply.accepted)

        return self._retry(attempt)

    def publish_stream(self, requests: Iterable[ingest_pb2.PublishRequest]
                       ) -> Iterator[ingest_pb2.PublishResponse]:
        """Pipeline ``requests`` on one PublishStream; yield one response each, in order.

        A refused request's response is yielded with ``error`` set (see
        :func:`response_error`) and the stream goes on. If the stream itself breaks with a
        retryable status, a new one is opened and every unacknowledged request is sent
        again with the same ``request_id`` (requests without one get a fresh one first).
        ``requests`` is consumed from a helper thread, at most ``STREAM_WINDOW`` requests
        ahead of the responses.

        Raises:
            IngestRejected: the stream broke for good (not retryable, or retries exhausted).
        """
        feed = _StreamFeed(iter(requests))
        attempts = _Attempts(self)
        try:
            while True:
                call = self._stub.PublishStream(feed.outgoing(), metadata=self._metadata)
                try:
                    for response in call:
                        feed.acked()
                        attempts.reset()
                        yield response
                    if feed.done():
                        return
                    exc = IngestRejected(grpc.StatusCode.UNAVAILABLE, "stream_ended",
                                         "the server ended the stream before answering "
                                         "every request", retryable=True)
                except grpc.RpcError as error:
                    exc = _rpc_rejected(error)
                finally:
                    call.cancel()
                delay = attempts.delay(exc)
                if delay is None:
                    raise exc
                time.sleep(delay)
        finally:
            feed.close()

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> GrpcClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _StreamFeed:
    """The requests of one logical stream across reconnects (sync).

    A pump thread takes requests from the source (never under the lock, so a slow source
    cannot hold up acks) into ``unacked``: every request taken and not yet answered, in
    order, at most ``STREAM_WINDOW`` of them. Request number ``acked + i`` is
    ``unacked[i]``. Each call's sender (a gRPC thread) starts at the first unanswered
    request, so a new call resends exactly those; a superseded sender stops at its next
    step. An exception of the source half-closes the stream; it is raised once the
    requests taken before it are answered.
    """

    def __init__(self, source: Iterator[ingest_pb2.PublishRequest]) -> None:
        self.unacked: deque[ingest_pb2.PublishRequest] = deque()
        self.acked_count = 0
        self.exhausted = False
        self.closed = False
        self.failure: Exception | None = None
        self.generation = 0
        self.changed = threading.Condition()
        self.pump = threading.Thread(target=self._pump, args=(source,), daemon=True,
                                     name="icefloe-publish-stream-source")
        self.pump.start()

    def _pump(self, source: Iterator[ingest_pb2.PublishRequest]) -> None:
        try:
            for request in source:
                keyed = _keyed(request)
                with self.changed:
                    self.changed.wait_for(
                        lambda: self.closed or len(self.unacked) < STREAM_WINDOW)
                    if self.closed:
                        return
                    self.unacked.append(keyed)
                    self.changed.notify_all()
        except Exception as exc:  # the caller's iterator failed: stop sending
            self.failure = exc
        with self.changed:
            self.exhausted = True
            self.changed.notify_all()

    def outgoing(self) -> Iterator[ingest_pb2.PublishRequest]:
        with self.changed:
            self.generation += 1
            self.changed.notify_all()
            return self._outgoing(self.generation, self.acked_count)

    def _outgoing(self, generation: int, number: int) -> Iterator[ingest_pb2.PublishRequest]:
        while True:
            with self.changed:
                self.changed.wait_for(functools.partial(self._can_send, generation, number))
                index = number - self.acked_count
                if generation != self.generation or self.closed or index >= len(self.unacked):
                    return  # superseded, abandoned, or every request sent: half-close
                request = self.unacked[index]
            number += 1
            yield request

    def _can_send(self, generation: int, number: int) -> bool:
        """Whether the sender of call ``generation`` can take request ``number`` (or stop)."""
        return (generation != self.generation or self.closed or self.exhausted
                or number - self.acked_count < len(self.unacked))

    def acked(self) -> None:
        with self.changed:
            self.unacked.popleft()
            self.acked_count += 1
            self.changed.notify_all()

    def done(self) -> bool:
        with self.changed:
            finished = self.exhausted and not self.unacked
        if finished and self.failure is not None:
            raise self.failure
        return finished

    def close(self) -> None:
        with self.changed:
            self.closed = True
            self.changed.notify_all()


class AsyncGrpcClient(_GrpcBase):
    """The asyncio twin of :class:`GrpcClient` (``grpc.aio``; ``async with``)."""

    def __init__(self, target: str, token: str | None = None, retries: int = 5, *,
                 timeout: float = 10, backoff: Backoff | None = None,
                 credentials: grpc.ChannelCredentials | None = None,
                 options: Iterable[tuple[str, Any]] = (), tls: ClientTls | None = None
                 ) -> None:
        super().__init__(target, token, retries, timeout, backoff)
        credentials = _credentials(tls, credentials)
        options = list(options)
        self._channel = grpc.aio.secure_channel(target, credentials, options) \
            if credentials else grpc.aio.insecure_channel(target, options)
        self._stub = ingest_pb2_grpc.IngestStub(self._channel)

    async def publish(self, stream: str, events: Iterable[EventLike],
                      request_id: str | None = None) -> int:
        """See :meth:`GrpcClient.publish`."""
        request = self._request(stream, events, request_id)

        async def attempt() -> int:
            try:
                reply = await self._stub.Publish(request, metadata=self._metadata,
                                                 timeout=self.timeout)
            except grpc.RpcError as exc:
                raise _rpc_rejected(exc) from None
            return int(reply.accepted)

        result: int = await self._retry_async(attempt)
        return result

    async def publish_stream(
            self, requests: AsyncIterable[ingest_pb2.PublishRequest]
            | Iterable[ingest_pb2.PublishRequest]) -> AsyncIterator[ingest_pb2.PublishResponse]:
        """See :meth:`GrpcClient.publish_stream` (``requests`` may be async)."""
        feed = _AsyncStreamFeed(requests)
        attempts = _Attempts(self)
        try:
            while True:
                call = self._stub.PublishStream(metadata=self._metadata)
                writer = asyncio.create_task(feed.write(call))
                try:
                    while (response := await call.read()) is not grpc.aio.EOF:
                        feed.unacked.popleft()
                        attempts.reset()
                        yield response
                    if feed.done():
                        return
                    exc = IngestRejected(grpc.StatusCode.UNAVAILABLE, "stream_ended",
                                         "the server ended the stream before answering "
                                         "every request", retryable=True)
                except grpc.RpcError as error:
                    exc = _rpc_rejected(error)
                finally:
                    call.cancel()
                    await _stopped(writer)
                delay = attempts.delay(exc)
                if delay is None:
                    raise exc
                await asyncio.sleep(delay)
        finally:
            await _stopped(feed.pump)

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> AsyncGrpcClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


_END = object()


class _AsyncStreamFeed:
    """Async :class:`_StreamFeed`: a pump task reads the source into a queue, and one
    writer task per call resends the unacknowledged requests, then takes from the queue.

    Why the pump: a broken call's writer is cancelled; cancelled inside the caller's async
    generator, that generator would be unusable for the next call. A writer cancelled in
    ``queue.get()`` loses nothing, and one cancelled after taking a request has already
    put it in ``unacked``, so the next call resends it.
    """

    def __init__(self, requests: AsyncIterable[ingest_pb2.PublishRequest]
                 | Iterable[ingest_pb2.PublishRequest]) -> None:
        self.unacked: deque[ingest_pb2.PublishRequest] = deque()
        self.exhausted = False
        self.failure: Exception | None = None
        self.queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=1)
        self.pump = asyncio.create_task(self._pump(requests))

    async def _pump(self, requests: AsyncIterable[ingest_pb2.PublishRequest]
                    | Iterable[ingest_pb2.PublishRequest]) -> None:
        try:
            if isinstance(requests, AsyncIterable):
                async for request in requests:
                    await self.queue.put(request)
            else:
                for request in requests:
                    await self.queue.put(request)
        except Exception as exc:  # the caller's iterator failed: stop sending
            self.failure = exc
        await self.queue.put(_END)

    async def write(self, call: Any) -> None:
        for request in list(self.unacked):
            await call.write(request)
        while not self.exhausted:
            item = await self.queue.get()
            if item is _END:
                self.exhausted = True
                break
            request = _keyed(item)
            self.unacked.append(request)
            await call.write(request)
        await call.done_writing()

    def done(self) -> bool:
        if self.exhausted and not self.unacked and self.failure is not None:
            raise self.failure
        return self.exhausted and not self.unacked


async def _stopped(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` and wait for it, discarding its outcome (ours is what matters)."""
    task.cancel()
    await asyncio.wait([task])
    if not task.cancelled():
        task.exception()
