"""The HTTP front of the ingestor: a raw ASGI 3 application, no web framework.

Why raw ASGI: on this machine kind a raw ASGI app on uvicorn (uvloop + httptools) answers
~28k single-event POSTs/s per core, while frameworks cost 25-50 % (``CEILINGS.md``). So the
hot path is kept lean: routes are matched by splitting the path (no regex), the headers an
ingest needs are picked out in one pass, responses are prebuilt bytes or msgspec-encoded.

Served by ``icefloe ingestor``, plain ingest POSTs (HTTP/1.1 keep-alive, Content-Length,
uncompressed) do not reach this app: the fast lane (:mod:`ingestor.http.fast`) answers them
from a callback, running the same steps (:mod:`ingestor.http.steps`) and
sending the same answers. This app serves everything else, and every request when
``[ingestor] http_fast_lane = false``.

Routes::

    POST    /v1/streams/{stream}/events          JSON object, JSON array, or NDJSON
    POST    /collect/{schema}/{table}            one JSON object   (seed-compatible alias)
    POST    /collect/{schema}/{table}/batch      a JSON array      (seed-compatible alias)
    POST    /v1/logs  /v1/traces  /v1/metrics    OTLP/HTTP exports (:mod:`ingestor.otlp.http`)
    OPTIONS (the three above)                    CORS preflight
    GET     /healthz (alias /health)  /readyz  /metrics  /openapi.json   (ingestor.http.openapi)

Content types: ``application/json`` is JSON; ``application/x-ndjson`` and
``application/ndjson`` are newline-delimited JSON (the events route only; the aliases
mirror the seed, which took JSON). ``application/x-www-form-urlencoded`` (what ``curl -d``
sends) is read as JSON on the ``/collect`` routes, on every route when the stream says
``form_body = "json"``, and nowhere with ``"refuse"``; a body that is not JSON is a 400.
``text/plain``, a form type and a missing Content-Type are read as JSON *with a
condition*, because a browser sends them cross-origin without a CORS
preflight (``navigator.sendBeacon``, ``fetch`` with a string or a typeless Blob): the
preflight is what lets ``cors_origins`` refuse a page, so without it any web page could
write to a token-free stream. They are therefore accepted only from a request that carries
no ``Origin`` (not a browser: curl, scripts, services) or whose ``Origin`` ``cors_origins``
allows; a page from any other origin gets 415. Anything else is 415.
``Content-Encoding`` may be ``gzip`` or ``zstd`` (``identity`` = none); others are 415.

Ordering of checks: route, method, stream, token, rate limits (an empty bucket), content
type/encoding and declared length all happen before a byte of the body is read, so refused
requests cost nothing. The body is then read message by message and refused (413) the
moment the received or the decompressed size passes ``ingestor.max_body_bytes``, or (408,
connection closed) when it arrives slower than the slow-loris rules allow
(:mod:`ingestor.http.slow_clients`). A 202 is sent only after ``IngestService.ingest`` returned,
i.e. when the events are durable in the object store.

The client address is the TCP peer, or what ``X-Forwarded-For`` / ``Forwarded`` say when the
peer is a trusted proxy (:mod:`ingestor.client_address`); it keys per-client rate limits.

This app does not own the runtime: ``lifespan`` is acknowledged and nothing else, because
the runtime (buffer, manifest producer) is shared with the gRPC front and its lifecycle
belongs to the server that runs both.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Final

import msgspec
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ingestor.errors import (
    BadRequest,
    IngestError,
    MethodNotAllowed,
    NotFoundRoute,
    Unavailable,
)
from ingestor.http.inflate import Inflater, body_too_large
from ingestor.http.openapi import openapi_document
from ingestor.http.slow_clients import BodyRead, SlowClientGuard
from ingestor.http.steps import (
    CLIENT_GONE_STATUS,
    JSON_CONTENT_TYPE,
    ClientGone,
    Headers,
    IngestSteps,
    Request,
    Target,
    error_body,
    ingest_target,
    request_events,
)
from ingestor.otlp.admit import OtlpAdmission
from ingestor.otlp.decode import PATHS as OTLP_PATHS
from ingestor.otlp.http import OtlpHttp
from ingestor.runtime import IngestorRuntime

__all__ = ["ClientGone", "HttpApp", "error_body"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

log = logging.getLogger("icefloe.ingestor.http")

_ALLOW_INGEST: Final = b"OPTIONS, POST"
_HEALTHY: Final = b'{"status":"ok"}'


async def _lifespan(receive: Receive, send: Send) -> None:
    """Acknowledge start and stop: the runtime's lifecycle belongs to the server (see top)."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


class HttpApp(IngestSteps):
    """The ASGI 3 app of one ingestor process. Safe to share across connections of one loop.

    ``HttpApp(runtime)`` serves ``runtime.service``; errors are spelled by
    :mod:`ingestor.errors` (status, JSON body, ``Retry-After`` on 429/503). The steps of an
    ingest are inherited from :class:`~ingestor.http.steps.IngestSteps`, which the fast lane
    calls on this app too.
    """

    def __init__(self, runtime: IngestorRuntime, guard: SlowClientGuard | None = None) -> None:
        super().__init__(runtime, guard)
        self._gets: dict[str, Callable[[Send], Awaitable[None]]] = {
            "/healthz": self._healthz, "/health": self._healthz, "/readyz": self._readyz,
            "/metrics": self._metrics,
            "/openapi.json": self._openapi}
        self._openapi_body = msgspec.json.encode(openapi_document())
        self.otlp = OtlpHttp(self, self.read_body,
                             OtlpAdmission(runtime.service, runtime.config))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            try:
                await self._http(scope, receive, send)
            except Exception:  # a bug must cost one request a 500, never the server
                log.exception("unexpected error in %s %s", scope["method"], scope["path"])
                await self._error(send, IngestError("internal error; the ingestor logged it"),
                                  [], "-")
        elif kind == "lifespan":
            await _lifespan(receive, send)

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope["path"]
        method: str = scope["method"]
        get = self._gets.get(path)
        if get is not None:
            if method == "GET":
                await get(send)
            else:
                await self._wrong_method(send, method, path, b"GET", [])
            return
        signal = OTLP_PATHS.get(path)
        if signal is not None:
            if method == "OPTIONS":
                await self._preflight(scope, send)
            else:
                await self.otlp.handle(scope, receive, send, signal)
            return
        target = ingest_target(path)
        if target is None and path.startswith("/v1/") and not path.startswith("/v1/streams"):
            await self.otlp.unknown_path(scope, send)
        elif target is None:
            await self._error(send, NotFoundRoute(
                f"no route {method} {path}; ingest with POST /v1/streams/{{stream}}/events"),
                [], "-")
        elif method == "POST":
            await self._ingest(scope, receive, send, target)
        elif method == "OPTIONS":
            await self._preflight(scope, send)
        else:
            request = Request(scope["headers"])
            await self._wrong_method(send, method, path, _ALLOW_INGEST,
                                     self.cors(request.origin))

    # -- ingest ------------------------------------------------------------------------------

    async def _ingest(self, scope: Scope, receive: Receive, send: Send, target: Target) -> None:
        """Answer 202 once durable; refusals are counted per stream and reason."""
        started = time.perf_counter()
        request = Request(scope["headers"])
        cors = self.cors(request.origin)
        try:
            accepted = await self._accept(scope, request, receive, target)
        except IngestError as err:
            self.service.reject(request.stream, err, request.count)
            await self._error(send, err, cors, request.stream)
            return
        except ClientGone:
            self.count(request.stream, CLIENT_GONE_STATUS)
            return
        except Exception:
            log.exception("unexpected error in POST %s", scope["path"])
            internal = IngestError("internal error; the ingestor logged it")
            self.service.reject(request.stream, internal, request.count)
            await self._error(send, internal, cors, request.stream)
            return
        self.ack_seconds.observe(time.perf_counter() - started)
        count, dead = accepted
        answer = b'{"accepted":%d}' % count if dead is None else \
            b'{"accepted":%d,"dead_lettered":%d}' % (count, dead)
        await self._respond(send, 202, answer, [JSON_CONTENT_TYPE, *cors], request.stream)

    async def _accept(self, scope: Scope, request: Request, receive: Receive,
                      target: Target) -> tuple[int, int | None]:
        """Check everything that needs no body, read it within limits, validate, ingest.
        Returns the accepted count and, for an ``on_invalid = "dead_letter"`` stream, the
        dead-lettered count (None otherwise: the answer stays ``{"accepted": n}``)."""
        stream = self.stream_of(target, request)
        caller = await self.service.authorize(stream, request.token(),
                                              self.client_address(scope.get("client"), request))
        decode, inflater, key = self.pre_body_checks(target[0], request, stream)
        body = await self.read_body(receive, inflater)
        dead_letters = stream.config.on_invalid == "dead_letter"
        try:
            canonical, meta = self.decoded(stream, decode, body, caller, scope["headers"])
        except BadRequest:
            events = request_events(decode, body) if dead_letters else None
            if events is None:
                raise
            meta = self.decoded_meta(stream, caller, scope["headers"])
            request.count = len(events)
            durable, count, dead = self.service.admit_valid(
                stream, events, idempotency_key=key, caller=caller, meta=meta)
            await durable
            return self.service.accepted(stream.name, count), dead
        request.count = len(canonical.payloads)
        count = await self.service.ingest(stream, canonical, idempotency_key=key,
                                          caller=caller, meta=meta)
        return count, 0 if dead_letters else None

    async def read_body(self, receive: Receive, inflater: Inflater | None) -> bytes:
        """Read ``http.request`` messages, refusing as soon as a limit is passed.

        A chunked upload is refused at the first message that takes the total over the
        limit (a declared Content-Length over it was refused before: :meth:`pre_body_checks`).
        The limit applies to the bytes received and, when compressed, to the decompressed
        bytes. A body slower than the slow-loris rules allow is refused with 408.
        """
        read = self.guard.begin_body()
        try:
            return await self._receive_body(receive, inflater, read)
        except asyncio.CancelledError:
            if not read.expired:
                raise
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            raise self.too_slow(read) from None
        finally:
            self.guard.end_body(read)

    async def _receive_body(self, receive: Receive, inflater: Inflater | None,
                            read: BodyRead) -> bytes:
        limit = self.max_body_bytes
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                raise ClientGone
            chunk: bytes = message.get("body", b"")
            more = message.get("more_body", False)
            if not chunk:
                continue
            size += len(chunk)
            read.received = size
            if size > limit:
                raise body_too_large(limit, "request")
            if inflater is not None:
                inflater.feed(chunk)
            else:
                chunks.append(chunk)
        if inflater is not None:
            return inflater.finish()
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    # -- CORS ------------------------------------------------------------------------------
    async def _preflight(self, scope: Scope, send: Send) -> None:
        """204 with ``Allow``, plus the CORS grant for an allowed origin only. No stream
        lookup: a preflight must not fail where the POST itself would get a readable 404
        or 401."""
        request = Request(scope["headers"])
        headers = [(b"allow", _ALLOW_INGEST), *self.preflight_cors(request.origin)]
        await self._respond(send, 204, b"", headers, "-")


    async def _healthz(self, send: Send) -> None:
        """Liveness: the process answers. Says nothing about the store (that is /readyz)."""
        await self._respond(send, 200, _HEALTHY, [JSON_CONTENT_TYPE], "-")

    async def _readyz(self, send: Send) -> None:
        ok, reason = await self.service.ready()
        if ok:
            body = msgspec.json.encode({"status": "ready", "detail": reason,
                                        "registry_version": self.service.registry_version})
            await self._respond(send, 200, body, [JSON_CONTENT_TYPE], "-")
        else:
            await self._error(send, Unavailable(reason, code="not_ready",
                                                retry_after_s=self.retry_after_s), [], "-")

    async def _openapi(self, send: Send) -> None:
        await self._respond(send, 200, self._openapi_body, [JSON_CONTENT_TYPE], "-")

    async def _metrics(self, send: Send) -> None:
        body = generate_latest(self.metrics.registry)
        await self._respond(send, 200, body, [(b"content-type", CONTENT_TYPE_LATEST.encode())],
                            "-")

    # -- responses -------------------------------------------------------------------------

    async def _wrong_method(self, send: Send, method: str, path: str, allow: bytes,
                            extra: Headers) -> None:
        err = MethodNotAllowed(f"{method} is not allowed on {path}; allowed: "
                               f"{allow.decode()}")
        await self._error(send, err, [(b"allow", allow), *extra], "-")

    async def _error(self, send: Send, err: IngestError, extra: Headers, stream: str) -> None:
        await self._respond(send, *self.error_parts(err, extra), stream)

    async def _respond(self, send: Send, status: int, body: bytes, headers: Headers,
                       stream: str) -> None:
        headers.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        self.count(stream, status)

