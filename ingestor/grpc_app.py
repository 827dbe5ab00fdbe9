"""The gRPC front: ``icefloe.v1.Ingest`` on grpc.aio, plus health and reflection (and, given
by the server, the OTLP Export services: :mod:`ingestor.otlp.grpc`).

Why it looks like this:

* **Same answers as HTTP.** Every refusal is an :class:`~ingestor.errors.IngestError`
  from the shared service; it becomes a ``google.rpc.Status`` with the error's gRPC code and
  rich details: ``BadRequest`` (one field violation per bad event, ``events[i].field``),
  ``RetryInfo`` for RESOURCE_EXHAUSTED/UNAVAILABLE (the HTTP ``Retry-After``) and
  ``ErrorInfo`` (``reason`` = the stable error code, ``domain`` = ``"icefloe"``; on
  UNAVAILABLE its ``metadata["may_be_stored"]`` says whether a resend may store the events
  twice, as the HTTP 503 body's ``may_be_stored``).
* **PublishStream pipelines.** Request k+1 starts ingesting while request k is still being
  flushed, so one stream's requests share group commits; acks still go back in request
  order, each only once its events are durable. At most ``max_inflight`` requests per
  stream are in flight: past that the servicer stops reading, and HTTP/2 flow control
  pushes back on the client. A refused request gets its own response with ``error`` set and
  the stream goes on; only a broken transport ends it.
* **Lean hot path.** A request is read straight into the lists the ingestor uses (the
  events' JSON bytes, and their ids or binary data only when any is set: :class:`Request`,
  compiled where :mod:`icefloe.formats.speedups` is built, protobuf otherwise); the schema
  layer decodes that list in one pass.
* **Per-connection limits.** HTTP/2 ``max_concurrent_streams`` bounds the calls one
  connection may run at once (``ingestor.grpc_max_streams_per_connection``), and each
  PublishStream has at most ``max_inflight`` requests in flight.
* **Who is calling.** The client address is the peer, or ``x-forwarded-for`` /
  ``forwarded`` metadata when the peer is a trusted proxy, as on HTTP.

Messages larger than ``ingestor.max_body_bytes`` are refused by gRPC itself with
RESOURCE_EXHAUSTED and no ``RetryInfo`` (retrying cannot help; the client does not retry
it); on ``PublishStream`` that ends the stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
import time
import urllib.parse
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Callable,
    Collection,
    Iterable,
    Sequence,
)
from typing import Any, NamedTuple

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.protobuf.message import DecodeError
from google.rpc import error_details_pb2, status_pb2
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from grpc_status import rpc_status

from icefloe.clock import SYSTEM, Clock
from icefloe.config import IngestorSection
from icefloe.errors import ConfigError
from icefloe.formats import speedups
from icefloe.v1 import ingest_pb2, ingest_pb2_grpc
from ingestor.auth import NeedsVerification
from ingestor.client_address import TrustedProxies
from ingestor.errors import BadRequest, IngestError, Unavailable
from ingestor.runtime import IngestorRuntime
from ingestor.service import Caller
from ingestor.tls import CertificateReloader
from ingestor.validate import Canonical, CompiledStream, InvalidEvents, Violation

log = logging.getLogger("icefloe.ingestor.grpc")

SERVICE_NAME = ingest_pb2.DESCRIPTOR.services_by_name["Ingest"].full_name
"""``icefloe.v1.Ingest``: the name health checks and reflection use."""

ERROR_DOMAIN = "icefloe"
DEFAULT_STREAM_INFLIGHT = 64
"""Requests of one PublishStream call being ingested at once (backpressure beyond)."""

MAX_TRAILER_DETAILS_BYTES = 4096
"""Budget for the rich status of a failed unary call: it travels in trailing metadata,
which clients refuse beyond 8 KiB by default. Extra field violations are summarized."""

UNKNOWN_STREAM_LABEL = "-"
"""Metrics label for stream names that are not configured: only configured names become
labels, never client input (bounded cardinality; the HTTP front uses the same label)."""

_MAX_REASON_CHARS = 200
_BACKPRESSURE = (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE)


# -- errors as google.rpc.Status ------------------------------------------------------------


def error_status(error: IngestError, *, retry_after_s: float | None = None,
                 max_details_bytes: int | None = None) -> status_pb2.Status:
    """The rich ``google.rpc.Status`` of a refusal (``retry_after_s``: fallback delay)."""
    code = error.grpc_code
    details: list[any_pb2.Any] = []
    if error.details:
        details.append(_pack(_bad_request(error.details, max_details_bytes)))
    delay = error.retry_after_s if error.retry_after_s is not None else retry_after_s
    if code in _BACKPRESSURE and delay is not None:
        details.append(_pack(error_details_pb2.RetryInfo(retry_delay=_duration(delay))))
    info = error_details_pb2.ErrorInfo(reason=error.code, domain=ERROR_DOMAIN)
    if isinstance(error, Unavailable):  # as the HTTP body's may_be_stored
        info.metadata["may_be_stored"] = "true" if error.may_be_stored else "false"
    details.append(_pack(info))
    return status_pb2.Status(code=code.value[0], message=error.message, details=details)


def _bad_request(details: Sequence[dict[str, Any]], budget: int | None
                 ) -> error_details_pb2.BadRequest:
    violation = error_details_pb2.BadRequest.FieldViolation
    bad = error_details_pb2.BadRequest()
    used = 0
    for shown, detail in enumerate(details):
        item = violation(field=_field_path(detail),
                         description=str(detail.get("reason") or "")[:_MAX_REASON_CHARS])
        used += item.ByteSize() + 4
        if budget is not None and used > budget:
            bad.field_violations.append(violation(
                field="events", description=f"... and {len(details) - shown} more "
                "violation(s) not listed (the response size is bounded)"))
            break
        bad.field_violations.append(item)
    return bad


def _field_path(detail: dict[str, Any]) -> str:
    index, field = detail.get("index"), detail.get("field")
    base = "events" if index is None else f"events[{index}]"
    return f"{base}.{field}" if field else base


def _duration(seconds: float) -> duration_pb2.Duration:
    nanos = max(0, round(seconds * 1e9))
    return duration_pb2.Duration(seconds=nanos // 1_000_000_000, nanos=nanos % 1_000_000_000)


def _pack(message: Any) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(message)
    return packed


def bearer_token(metadata: Metadata) -> str | None:
    """The token of ``authorization: Bearer <token>`` metadata, else None.

    Raises:
        BadRequest: ``authorization`` sent more than once (``duplicate_header``): which one
            counts is ambiguous, so neither does (as on HTTP).
    """
    values = [value for key, value in metadata or () if key == "authorization"]
    if len(values) > 1:
        raise BadRequest("the authorization metadata was sent more than once; send it once",
                         code="duplicate_header",
                         details=[{"index": None, "field": "authorization",
                                   "reason": "repeated metadata"}])
    if values and isinstance(values[0], str):
        scheme, _, token = values[0].strip().partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
    return None


class Malformed(NamedTuple):
    """What the request deserializer gives for bytes that are not a ``PublishRequest``
    (grpc would otherwise end the call with UNKNOWN): refused with INVALID_ARGUMENT."""

    reason: str


class Request(NamedTuple):
    """A ``PublishRequest`` as the servicer reads it: the events' fields as lists, one
    element per event, in order. ``event_ids`` and ``datas`` are None when no event sets
    one (the common case, with nothing built for it)."""

    stream: str
    request_id: str
    jsons: list[bytes]
    event_ids: list[str] | None
    datas: list[bytes] | None

    @classmethod
    def of(cls, message: ingest_pb2.PublishRequest) -> Request:
        """The lists of a decoded protobuf message."""
        events = list(message.events)  # one wrapper per event, read thrice
        ids = [event.event_id for event in events]
        datas = [event.data for event in events]
        return cls(message.stream, message.request_id, [event.json for event in events],
                   ids if any(ids) else None, datas if any(datas) else None)


_COMPILED_PARSE: Callable[[bytes], tuple[Any, ...] | None] | None = getattr(
    speedups.compiled, "publish_request", None)


def parse_request(data: bytes) -> Request | Malformed:
    """A ``PublishRequest``'s fields, never raising (see :class:`Malformed`).

    The compiled parse reads the plain encoding clients send; whatever it does not vouch
    for (an unknown field, a repeated one, bad UTF-8, truncation) is decoded by protobuf,
    which accepts or refuses it exactly as before."""
    if _COMPILED_PARSE is not None:
        fields = _COMPILED_PARSE(data)
        if fields is not None:
            return Request(*fields)
    try:
        return Request.of(ingest_pb2.PublishRequest.FromString(data))
    except DecodeError:
        return Malformed("the message is not a valid icefloe.v1.PublishRequest (bad "
                         "protobuf encoding, or a string field that is not UTF-8)")


def _malformed_error(request: Malformed) -> BadRequest:
    return BadRequest(request.reason, code="invalid_protobuf")


def add_ingest_servicer(servicer: IngestServicer, server: grpc.aio.Server) -> None:
    """Register ``icefloe.v1.Ingest`` as the generated code does, but with
    :func:`parse_request` as the deserializer."""
    handlers = {
        "Publish": grpc.unary_unary_rpc_method_handler(
            servicer.Publish, request_deserializer=parse_request,
            response_serializer=ingest_pb2.PublishResponse.SerializeToString),
        "PublishStream": grpc.stream_stream_rpc_method_handler(
            servicer.PublishStream, request_deserializer=parse_request,
            response_serializer=ingest_pb2.PublishResponse.SerializeToString),
    }
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)


Metadata = Collection[tuple[str, str | bytes]] | None
"""A call's invocation metadata (gRPC keys are lower case): grpc.aio's ``Metadata``, or
the tuples a test passes."""


def metadata_value(metadata: Metadata, key: str) -> str | None:
    """All values of ``key`` joined with commas (as repeated HTTP headers are), or None."""
    values = [v for k, v in metadata or () if k == key and isinstance(v, str)]
    return ",".join(values) if values else None


def peer_host(peer: str | None) -> str | None:
    """The address of a gRPC peer string (``ipv4:1.2.3.4:5``, ``ipv6:%5B::1%5D:5``)."""
    if not peer:
        return None
    kind, _, rest = urllib.parse.unquote(peer).partition(":")
    if kind not in ("ipv4", "ipv6") or not rest:
        return None
    host = rest.rsplit(":", 1)[0] if kind == "ipv4" or rest.startswith("[") else rest
    return host.strip("[]")


def client_address(context: grpc.aio.ServicerContext, proxies: TrustedProxies) -> str | None:
    """The client of a call: its peer, or the forwarded address behind a trusted proxy."""
    host = peer_host(context.peer())
    if host is None or not proxies:
        return host
    metadata = context.invocation_metadata()
    return proxies.client(host, metadata_value(metadata, "forwarded"),
                          metadata_value(metadata, "x-forwarded-for"))


# -- the servicer ---------------------------------------------------------------------------


class IngestServicer(ingest_pb2_grpc.IngestServicer):
    """``icefloe.v1.Ingest`` over one :class:`IngestorRuntime` (asyncio, one loop)."""

    def __init__(self, runtime: IngestorRuntime, *,
                 max_inflight: int = DEFAULT_STREAM_INFLIGHT,
                 stream_idle_s: float | None = None, clock: Clock = SYSTEM) -> None:
        if max_inflight < 1:
            raise ValueError("max_inflight must be >= 1")
        self.stream_idle_s = stream_idle_s if stream_idle_s is not None \
            else runtime.config.ingestor.grpc_stream_idle_s
        self.clock = clock
        self.service = runtime.service
        self.metrics = runtime.metrics
        self.max_inflight = max_inflight
        self.retry_after_s: float = runtime.config.ingestor.retry_after_s
        self._ack = runtime.metrics.ack_seconds.labels("grpc")
        self._ok: dict[str, Any] = {}
        self._readers: set[asyncio.Task[None]] = set()
        self.draining = False

    def drain(self) -> None:
        """Graceful shutdown: every PublishStream stops reading, answers what it read, and
        ends with UNAVAILABLE (``shutting_down``) so its client reconnects elsewhere, instead
        of holding the stream open until the grace period cancels it mid-flight."""
        self.draining = True
        for reader in list(self._readers):
            reader.cancel()

    async def Publish(self, request: Request | Malformed,
                      context: grpc.aio.ServicerContext) -> ingest_pb2.PublishResponse:
        metadata = context.invocation_metadata()
        try:
            if isinstance(request, Malformed):
                raise _malformed_error(request)
            token = bearer_token(metadata)
        except BadRequest as refused:
            self._refused(None, refused)
            return _failed(context, error_status(refused))
        accepted, dead, error = await self._attempt(
            request, token, client_address(context, self.service.proxies), metadata)
        if error is not None:
            return _failed(context, error_status(
                error, retry_after_s=self.retry_after_s,
                max_details_bytes=MAX_TRAILER_DETAILS_BYTES))
        return ingest_pb2.PublishResponse(accepted=accepted, request_id=request.request_id,
                                          dead_lettered=dead)

    async def PublishStream(self, request_iterator: AsyncIterable[Request | Malformed],
                            context: grpc.aio.ServicerContext
                            ) -> AsyncIterator[ingest_pb2.PublishResponse]:
        if self.draining:
            await self._abort_draining(context)
        metadata = context.invocation_metadata()
        try:
            token = bearer_token(metadata)
        except BadRequest as refused:
            self._refused(None, refused)
            _failed(context, error_status(refused))
            return
        client = client_address(context, self.service.proxies)
        slots = asyncio.Semaphore(self.max_inflight)
        order: asyncio.Queue[asyncio.Task[ingest_pb2.PublishResponse] | None] = \
            asyncio.Queue()
        activity = _Activity(self.clock.monotonic())
        reader = asyncio.create_task(self._read(request_iterator, token, client, metadata,
                                                slots, order, activity),
                                     name="grpc-publish-stream-reader")
        reader.add_done_callback(_retrieve)  # a call cancelled mid-read must not log noise
        self._readers.add(reader)
        reader.add_done_callback(self._readers.discard)
        watchdog = asyncio.create_task(self._watch_idle(reader, activity),
                                       name="grpc-publish-stream-idle")
        try:
            while (task := await order.get()) is not None:
                response = await task
                slots.release()
                activity.answered(self.clock.monotonic())
                yield response
            await asyncio.wait([reader])  # it put the end marker: it is finishing
            if activity.idle:
                self._end_idle(context)
                return
            if reader.cancelled():  # only drain() cancels it while the call goes on
                await self._abort_draining(context)
            reader.result()  # re-raise a broken request stream
        finally:
            watchdog.cancel()
            reader.cancel()
            while not order.empty():
                pending = order.get_nowait()
                if pending is not None:
                    pending.cancel()  # a flush already started still completes (shielded)

    async def _watch_idle(self, reader: asyncio.Task[None], activity: _Activity) -> None:
        """Cancel ``reader`` once the stream had nothing in flight and sent nothing for
        ``stream_idle_s``. Why a watchdog rather than a timeout on each read: one sleeping
        task per stream costs nothing per message, and a stream waiting on its own flushes
        (requests in flight) is never idle, however long the store takes."""
        while not reader.done():
            now = self.clock.monotonic()
            due = activity.last + self.stream_idle_s
            if activity.inflight == 0 and now >= due:
                activity.idle = True
                reader.cancel()
                return
            # busy: look again in a quarter period, so a stream is ended at most
            # 1.25 x stream_idle_s after its last answer
            await self.clock.sleep(due - now if activity.inflight == 0
                                   else self.stream_idle_s / 4)

    def _end_idle(self, context: grpc.aio.ServicerContext) -> None:
        """Set the call's final status (UNAVAILABLE ``stream_idle``) for a plain return."""
        self.metrics.grpc_idle_streams.inc()
        error = Unavailable(f"no request on this stream for {self.stream_idle_s:g} s with "
                            "nothing in flight: the server ended it; open a new stream when "
                            "there are events to send", code="stream_idle")
        _failed(context, error_status(error))

    async def _abort_draining(self, context: grpc.aio.ServicerContext) -> None:
        error = Unavailable("this ingestor is shutting down: reconnect (to another one) and "
                            "resend the requests that got no response, with their "
                            "request_id", code="shutting_down", retry_after_s=self.retry_after_s)
        await context.abort_with_status(rpc_status.to_status(error_status(error)))

    async def _read(self, requests: AsyncIterable[Request | Malformed],
                    token: str | None, client: str | None, metadata: Metadata,
                    slots: asyncio.Semaphore,
                    order: asyncio.Queue[asyncio.Task[ingest_pb2.PublishResponse] | None],
                    activity: _Activity) -> None:
        iterator = aiter(requests)
        try:
            while True:
                await slots.acquire()  # backpressure: read no further while at the bound
                try:
                    request = await anext(iterator)
                except StopAsyncIteration:
                    return
                activity.inflight += 1
                order.put_nowait(asyncio.create_task(
                    self._respond(request, token, client, metadata)))
        finally:
            order.put_nowait(None)

    async def _respond(self, request: Request | Malformed,
                       token: str | None, client: str | None, metadata: Metadata
                       ) -> ingest_pb2.PublishResponse:
        if isinstance(request, Malformed):  # answered in order; the stream goes on
            malformed = _malformed_error(request)
            self._refused(None, malformed)
            return ingest_pb2.PublishResponse(error=error_status(malformed))
        accepted, dead, error = await self._attempt(request, token, client, metadata)
        if error is None:
            return ingest_pb2.PublishResponse(accepted=accepted, request_id=request.request_id,
                                              dead_lettered=dead)
        return ingest_pb2.PublishResponse(
            request_id=request.request_id,
            error=error_status(error, retry_after_s=self.retry_after_s))

    # -- one request -----------------------------------------------------------------------

    async def _attempt(self, request: Request, token: str | None,
                       client: str | None, metadata: Metadata = None
                       ) -> tuple[int, int, IngestError | None]:
        """Ingest one request: (accepted, dead-lettered, None) once durable, or (0, 0, why
        it was refused)."""
        started = time.perf_counter()
        try:
            try:
                durable, stream, count, dead = self._admit(request, token, client, metadata,
                                                           None)
            except NeedsVerification:  # a first-time token: verify it (may take a while)
                stream = self.service.stream(request.stream)
                authority = self.service.auth
                caller = await self.service.authorize(stream, token, client)
                if self.service.auth is not authority:
                    # a registry version came meanwhile (a rotated token?), and _admit looks
                    # the stream up again: judge the token by the version it is admitted at
                    stream = self.service.stream(request.stream)
                    caller = await self.service.authorize(stream, token, client)
                durable, stream, count, dead = self._admit(request, token, client, metadata,
                                                           caller)
            await durable
        except IngestError as error:
            self._refused(request, error)
            return 0, 0, error
        except Exception as exc:  # a bug must not leave the client without an answer
            log.exception("gRPC publish to stream %r failed unexpectedly", request.stream,
                          exc_info=exc)
            # the exception's text stays in the log: it may say more than a client should see
            internal = IngestError("internal error; the ingestor logged it; nothing was "
                                   "acknowledged")
            self._refused(request, internal)
            return 0, 0, internal
        self._ack.observe(time.perf_counter() - started)
        ok = self._ok.get(stream.name)
        if ok is None:
            ok = self._ok[stream.name] = self.metrics.requests.labels(
                "grpc", stream.name, grpc.StatusCode.OK.name)
        ok.inc()
        return self.service.accepted(stream.name, count), dead, None

    def _admit(self, request: Request, token: str | None,
               client: str | None, metadata: Metadata, caller: Caller | None
               ) -> tuple[asyncio.Future[None], CompiledStream, int, int]:
        """Check, frame and buffer one request without awaiting: the future resolves once
        its events are durable; with it, the accepted and dead-lettered counts.
        ``caller`` None: authorize from cached token outcomes (raises
        :class:`NeedsVerification` for a first-time token)."""
        service = self.service
        stream = service.stream(request.stream)
        if caller is None:
            caller = service.authorize_known(stream, token, client)
        jsons = request.jsons
        try:
            meta = stream.request_meta(client, lambda key: metadata_value(metadata, key),
                                       lambda: [(k, v) for k, v in metadata or ()
                                                if isinstance(v, str)])
        except InvalidEvents as exc:
            raise service.bad_request(exc) from None
        if stream.typed is None and request.datas is not None:
            # refused whatever on_invalid says: dead-lettering it would keep an empty payload
            # in place of the bytes sent, and json beside data would drop them silently
            raise service.bad_request(data_on_json_stream(stream, request))
        try:
            canonical = stream.from_events(jsons) if stream.typed is None \
                else typed_events(stream, request)
        except InvalidEvents as exc:
            if stream.config.on_invalid != "dead_letter" or not jsons:
                raise service.bad_request(exc) from None
            canonical = None
        ids = request.event_ids
        if canonical is None:  # on_invalid = "dead_letter": keep the valid ones
            durable, count, dead = service.admit_valid(
                stream, jsons, event_ids=ids, idempotency_key=request.request_id or None,
                caller=caller, meta=meta)
            return durable, stream, count, dead
        durable = service.admit(stream, canonical, event_ids=ids,
                                idempotency_key=request.request_id or None, caller=caller,
                                meta=meta)
        return durable, stream, len(jsons), 0

    def _refused(self, request: Request | None, error: IngestError) -> None:
        """Count a refusal (``request`` None: refused before it could be read)."""
        label = request.stream if request is not None and \
            request.stream in self.service.streams else UNKNOWN_STREAM_LABEL
        self.service.reject(label, error, 1 if request is None else len(request.jsons))
        self.metrics.requests.labels("grpc", label, error.grpc_code.name).inc()


def data_on_json_stream(stream: CompiledStream, request: Request) -> InvalidEvents:
    """The refusal of a request to a JSON stream whose events set ``data`` (alone or beside
    ``json``): ``data`` is for a ``format = "protobuf"`` or ``"avro"`` stream, and a JSON
    stream has nothing to store its bytes in. One violation per such event (capped)."""
    datas = request.datas or ()
    bad = [i for i, binary in enumerate(datas) if binary][:stream.MAX_VIOLATIONS]
    return InvalidEvents(
        "invalid_payload", f"event {bad[0]} sets data; stream {stream.name!r} takes JSON "
        "events (Event.json); Event.data is for a format = \"protobuf\" or \"avro\" stream",
        [Violation(i, "data", "json and data both set; a JSON stream takes json only"
                   if request.jsons[i] else "data set; a JSON stream takes json",
                   "invalid_payload") for i in bad])


def typed_events(stream: CompiledStream, request: Request) -> Canonical:
    """A typed stream's events: each sets ``data`` (its binary message) or ``json`` (a
    Protobuf stream's canonical JSON), never both; one request holds one kind."""
    jsons, data = request.jsons, request.datas
    if data is None:  # no event sets data
        return stream.from_events(jsons)
    both = [i for i, (json, binary) in enumerate(zip(jsons, data, strict=True))
            if json and binary]
    if both:
        raise InvalidEvents("invalid_payload", f"event {both[0]} sets both json and data; "
                            "set one", [Violation(i, "data", "both json and data set",
                                                  "invalid_payload") for i in both])
    if all(data):
        return stream.from_binary(data)
    raise InvalidEvents("invalid_payload", "the request mixes events with data and with "
                        "json; send one kind per request")


class _Activity:
    """What the idle watchdog of one PublishStream looks at: requests read and not yet
    answered, and when the stream last moved (a request read or a response sent)."""

    __slots__ = ("idle", "inflight", "last")

    def __init__(self, now: float) -> None:
        self.last = now
        self.inflight = 0
        self.idle = False

    def answered(self, now: float) -> None:
        self.inflight -= 1
        self.last = now


def _failed(context: grpc.aio.ServicerContext,
            status: status_pb2.Status) -> ingest_pb2.PublishResponse:
    """Set the call's final (error) status for a plain return; the message returned with
    it is never sent.

    Why not ``abort_with_status``: ending idle PublishStreams through its exception path
    kept memory (RSS grew ~5 MB per 1,000 streams and was not given back; flat when the
    status is set and the handler returns), and refusals are what a hostile client makes
    many of."""
    final = rpc_status.to_status(status)
    context.set_code(final.code)
    context.set_details(final.details)
    context.set_trailing_metadata(final.trailing_metadata)
    return ingest_pb2.PublishResponse()


def _retrieve(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()


# -- the server -----------------------------------------------------------------------------


class _Health(health.aio.HealthServicer):
    """The standard health service; entering graceful shutdown also drains the streams."""

    def __init__(self, servicer: IngestServicer) -> None:
        super().__init__()
        self.servicer = servicer

    async def enter_graceful_shutdown(self) -> None:
        await super().enter_graceful_shutdown()
        self.servicer.drain()


class GrpcServer(NamedTuple):
    """A started gRPC server, its bound port, and its health service.

    At shutdown, ``await health.enter_graceful_shutdown()`` first: every service turns
    NOT_SERVING (load balancers stop routing here) and open PublishStreams answer what they
    read and end with UNAVAILABLE so clients reconnect elsewhere; then
    ``await server.stop(grace)`` lets unary calls finish.
    """

    server: grpc.aio.Server
    port: int
    health: health.aio.HealthServicer
    otlp_port: int | None = None
    """The ``otlp_grpc_port`` address bound (None: not asked for)."""


async def start_grpc_server(runtime: IngestorRuntime, host: str, port: int, *,
                            max_inflight: int = DEFAULT_STREAM_INFLIGHT,
                            reuse_port: bool = False,
                            tls: CertificateReloader | None = None,
                            clock: Clock = SYSTEM,
                            otlp_port: int | None = None,
                            services: Callable[[grpc.aio.Server], Iterable[str]] | None = None
                            ) -> GrpcServer:
    """Serve ``icefloe.v1.Ingest`` + health + reflection on ``host:port`` (0 = any free port),
    and on ``otlp_port`` too when given (OTLP's default 4317; the same services answer on
    both). ``services`` registers more services before the start and names them (the OTLP
    Export services: :func:`ingestor.otlp.grpc.add_otlp_services`).

    With ``tls`` the port speaks only TLS (mutual TLS if it has a client CA), with
    certificates reloaded on change; a plaintext client cannot connect.

    Raises:
        ConfigError: the port is in use (``grpc.so_reuseport`` is off unless ``reuse_port``,
            so a second server never silently splits traffic with the first) or cannot be
            bound.
    """
    ing = runtime.config.ingestor
    server = grpc.aio.server(options=[
        ("grpc.so_reuseport", int(reuse_port)),
        ("grpc.max_receive_message_length", ing.max_body_bytes),
        *server_options(ing),
    ])
    servicer = IngestServicer(runtime, max_inflight=max_inflight,
                              stream_idle_s=ing.grpc_stream_idle_s, clock=clock)
    add_ingest_servicer(servicer, server)
    extra = tuple(services(server)) if services is not None else ()
    health_servicer = _Health(servicer)
    for name in (health.OVERALL_HEALTH, SERVICE_NAME):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (SERVICE_NAME, *extra, health.SERVICE_NAME, reflection.SERVICE_NAME),
        server)
    bound = await bind_port(server, host, port, tls)
    otlp = None
    if otlp_port is not None:  # a second address of the same server (OTLP's 4317)
        otlp = await bind_port(server, host, otlp_port, tls, what="OTLP/gRPC",
                               flag="--otlp-grpc-port, ICEFLOE_INGESTOR_OTLP_GRPC_PORT")
    await server.start()
    return GrpcServer(server, bound, health_servicer, otlp)


async def bind_port(server: grpc.aio.Server, host: str, port: int,
                    tls: CertificateReloader | None, *, what: str = "gRPC",
                    flag: str = "--grpc-port, ICEFLOE_INGESTOR_GRPC_PORT") -> int:
    """Add ``host:port`` (TLS when ``tls``) to ``server``; the port bound.

    Raises:
        ConfigError: the port cannot be bound (``server`` is stopped).
    """
    address = f"[{host}]:{port}" if ":" in host and not host.startswith("[") \
        else f"{host}:{port}"
    try:
        bound = server.add_secure_port(address, tls.grpc_credentials()) if tls is not None \
            else server.add_insecure_port(address)
    except RuntimeError:  # grpcio raises on a failed bind (older versions returned 0)
        bound = 0
    if not bound:
        await server.stop(None)
        raise _bind_error(host, port, what, flag)
    return int(bound)


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def server_options(ing: IngestorSection) -> list[tuple[str, int]]:
    """The grpc core options that bound a connection's and its streams' lifetime.

    Why each: keepalive finds peers that vanished without a FIN (their streams would stay
    open); the ping policy turns a ping flood into GOAWAY ENHANCE_YOUR_CALM after a few
    strikes; idle and age limits make every connection end, the age grace letting calls in
    flight finish (the config makes it at least ``flush_timeout_s``).
    """
    return [
        ("grpc.max_concurrent_streams", ing.grpc_max_streams_per_connection),
        ("grpc.keepalive_time_ms", _ms(ing.grpc_keepalive_time_s)),
        ("grpc.keepalive_timeout_ms", _ms(ing.grpc_keepalive_timeout_s)),
        ("grpc.http2.min_recv_ping_interval_without_data_ms",
         _ms(ing.grpc_min_ping_interval_s)),
        ("grpc.http2.max_pings_without_data", 0),  # keepalive also on a stream gone quiet
        # client keepalive pings on a connection without calls are fine at the minimum
        # interval too (grpc would allow one per 2 h there and strike the rest)
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_ping_strikes", ing.grpc_max_ping_strikes),
        ("grpc.max_connection_idle_ms", _ms(ing.grpc_max_connection_idle_s)),
        ("grpc.max_connection_age_ms", _ms(ing.grpc_max_connection_age_s)),
        ("grpc.max_connection_age_grace_ms", _ms(ing.grpc_max_connection_age_grace_s)),
    ]


def _bind_error(host: str, port: int, what: str, flag: str) -> ConfigError:
    """Say why gRPC could not bind (it only reports "failed"): probe the port ourselves."""
    reason = "the address cannot be bound"
    with contextlib.suppress(OSError), socket.socket(
            socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host.strip("[]"), port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return ConfigError(
                    f"{what} port {port} on {host} is already in use: stop the other process "
                    f"or choose another port ({flag})")
            reason = exc.strerror or str(exc)
    return ConfigError(f"cannot bind {what} to {host}:{port}: {reason}")
