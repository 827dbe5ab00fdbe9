"""The gRPC ingest client: ``icefloe.v1.Ingest`` ``Publish`` and ``PublishStream``.

What is retried and why that is duplicate-free: :mod:`icefloe.client.retry` (UNAVAILABLE,
DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED with a ``RetryInfo``, and REFUSED_STREAM resets apart
from ``retries``). Anything else (INVALID_ARGUMENT, UNAUTHENTICATED, PERMISSION_DENIED,
NOT_FOUND, ...) is raised at once as :class:`~icefloe.client.retry.IngestRejected`.
``publish_stream`` gives every request without a ``request_id`` a fresh one, and after a
broken stream resends the unacknowledged requests with their ids.

TLS: ``tls=ClientTls(...)`` encrypts (:class:`~icefloe.client.tls.ClientTls`: the CA to
trust and, for mutual TLS, this client's certificate and key). :class:`GrpcClient` is
thread-safe (gRPC channels are); :class:`AsyncGrpcClient` belongs to one event loop.
"""

from __future__ import annotations

import asyncio
import functools
import re
import threading
from collections import deque
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator
from typing import Any

import grpc
from google.protobuf.message import Message
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from icefloe.client.retry import (
    REFUSED_STREAM,
    Attempts,
    Backoff,
    EventLike,
    IngestRejected,
    Retrying,
    event_json,
    new_key,
)
from icefloe.client.tls import ClientTls
from icefloe.clock import SYSTEM, Clock
from icefloe.v1 import ingest_pb2, ingest_pb2_grpc

__all__ = ["STREAM_WINDOW", "AsyncGrpcClient", "GrpcClient", "response_error"]

_REFUSED_DETAILS = re.compile(r"RST_STREAM.*error code 7\b")
"""How grpc core words a stream reset with REFUSED_STREAM (code 7) in the call's details."""
_NOT_CONNECTED = "failed to connect to all addresses"
"""How grpc core begins the details of an UNAVAILABLE call that never had a connection:
nothing was sent, so nothing can have been stored."""
_CORE_INTERNAL = "Internal error from Core"
"""The details grpc core itself gives an INTERNAL status when a connection breaks under a
call (a server stopped mid-stream, seen in a restart test one run in many): a transport
failure like UNAVAILABLE, not the server's answer (icefloe's own INTERNAL answers say
"internal error; the ingestor logged it"). Every request is keyed, so resending is safe."""
_RETRYABLE_GRPC = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
_UNKNOWN_OUTCOME = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                              grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN,
                              grpc.StatusCode.CANCELLED})
"""Codes that, without icefloe's ``ErrorInfo``, come from gRPC itself after the request may
have been sent: whether it was stored is unknown (``may_be_stored``)."""
STREAM_WINDOW = 128
"""Requests ``publish_stream`` holds unanswered at most (taken from the source, not acked)."""
_FIELD = re.compile(r"^events\[(\d+)\](?:\.(.*))?$")


def _from_status(code: grpc.StatusCode, status: status_pb2.Status | None, message: str
                 ) -> IngestRejected:
    """An IngestRejected from a gRPC code and its rich ``google.rpc.Status`` (if any)."""
    name, details, hint = code.name.lower(), [], None
    # no icefloe ErrorInfo: gRPC's own failure (a deadline, a broken or failed connection)
    # says nothing of whether the request was stored
    stored: bool | None = None
    for packed in status.details if status is not None else ():
        if packed.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            packed.Unpack(info)
            name = info.reason or name
            stored = info.metadata.get("may_be_stored") == "true"
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
    if stored is None:  # a call that never connected sent nothing
        stored = code in _UNKNOWN_OUTCOME and not message.startswith(_NOT_CONNECTED)
    return IngestRejected(code, name, status.message if status is not None else message,
                          details, retry_after_s=hint, retryable=retryable,
                          may_be_stored=stored)


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
    if call.code() == grpc.StatusCode.INTERNAL and status is None \
            and details == _CORE_INTERNAL:
        return IngestRejected(call.code(), "transport_broken", "the connection broke under "
                              f"the call (grpc core: {details})", retryable=True,
                              may_be_stored=True)
    return _from_status(call.code(), status, details)


def _stream_ended() -> IngestRejected:
    """A stream the server ended with requests unanswered: they may have been stored."""
    return IngestRejected(grpc.StatusCode.UNAVAILABLE, "stream_ended", "the server ended "
                          "the stream before answering every request", retryable=True,
                          may_be_stored=True)


def _keyed(request: ingest_pb2.PublishRequest) -> ingest_pb2.PublishRequest:
    """The request with a ``request_id`` (a copy with a fresh one if it had none)."""
    if request.request_id:
        return request
    copy = ingest_pb2.PublishRequest()
    copy.CopyFrom(request)
    copy.request_id = new_key()
    return copy


class _GrpcBase(Retrying):
    def __init__(self, target: str, token: str | None, retries: int, timeout: float,
                 backoff: Backoff | None, clock: Clock) -> None:
        super().__init__(retries, backoff, clock)
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
            events=[_event(event) for event in events])


def _event(event: EventLike) -> ingest_pb2.Event:
    """One event as the wire has it: a Protobuf message of a typed stream travels as its
    bytes (``Event.data``), anything else as JSON."""
    if isinstance(event, ingest_pb2.Event):
        return event
    if isinstance(event, Message):
        return ingest_pb2.Event(data=event.SerializeToString())
    return ingest_pb2.Event(json=event_json(event))


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
    needed. ``clock`` is what the backoff between retries waits on (tests: a manual clock).
    """

    def __init__(self, target: str, token: str | None = None, retries: int = 5, *,
                 timeout: float = 10, backoff: Backoff | None = None,
                 credentials: grpc.ChannelCredentials | None = None,
                 options: Iterable[tuple[str, Any]] = (), tls: ClientTls | None = None,
                 clock: Clock = SYSTEM) -> None:
        super().__init__(target, token, retries, timeout, backoff, clock)
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
        attempts = Attempts(self)
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
                    exc = _stream_ended()
                except grpc.RpcError as error:
                    exc = _rpc_rejected(error)
                finally:
                    call.cancel()
                delay = attempts.delay(exc)
                if delay is None:
                    raise exc
                self.clock.sleep_sync(delay)
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
                 options: Iterable[tuple[str, Any]] = (), tls: ClientTls | None = None,
                 clock: Clock = SYSTEM) -> None:
        super().__init__(target, token, retries, timeout, backoff, clock)
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
        attempts = Attempts(self)
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
                    exc = _stream_ended()
                except grpc.RpcError as error:
                    exc = _rpc_rejected(error)
                finally:
                    call.cancel()
                    await _stopped(writer)
                delay = attempts.delay(exc)
                if delay is None:
                    raise exc
                await self.clock.sleep(delay)
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
