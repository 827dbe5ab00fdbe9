"""The HTTP front of the ingestor: a raw ASGI 3 application, no web framework.

Why raw ASGI: on this machine kind a raw ASGI app on uvicorn (uvloop + httptools) answers
~28k single-event POSTs/s per core, while frameworks cost 25-50 % (``CEILINGS.md``). So the
hot path is kept lean: routes are matched by splitting the path (no regex), the headers an
ingest needs are picked out in one pass, responses are prebuilt bytes or msgspec-encoded.

Served by ``icefloe ingestor``, plain ingest POSTs (HTTP/1.1 keep-alive, Content-Length,
uncompressed) do not reach this app: the fast lane (:mod:`ingestor.http.fast`) answers them
from a callback, running the same steps (the methods under "the steps of an ingest") and
sending the same answers. This app serves everything else, and every request when
``[ingestor] http_fast_lane = false``.

Routes::

    POST    /v1/streams/{stream}/events          JSON object, JSON array, or NDJSON
    POST    /collect/{schema}/{table}            one JSON object   (seed-compatible alias)
    POST    /collect/{schema}/{table}/batch      a JSON array      (seed-compatible alias)
    OPTIONS (the three above)                    CORS preflight
    GET     /healthz  /readyz  /metrics  /openapi.json   (the last: ingestor.http.openapi)

Content types: ``application/json`` is JSON; ``application/x-ndjson`` and
``application/ndjson`` are newline-delimited JSON (the events route only; the aliases
mirror the seed, which took JSON). ``text/plain`` and a missing Content-Type are read as
JSON *with a condition*, because a browser sends them cross-origin without a CORS
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
import math
import time
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any, Final

import msgspec
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ingestor.errors import (
    BadRequest,
    IngestError,
    MethodNotAllowed,
    NotFoundRoute,
    PayloadTooLarge,
    RequestTimeout,
    Unavailable,
    UnsupportedMediaType,
)
from ingestor.http.inflate import ENCODINGS, Inflater, body_too_large
from ingestor.http.openapi import openapi_document
from ingestor.http.slow_clients import BodyRead, SlowClientGuard
from ingestor.runtime import IngestorRuntime
from ingestor.service import Caller
from ingestor.validate import Canonical, CompiledStream, InvalidEvents

__all__ = ["HttpApp", "error_body"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Headers = list[tuple[bytes, bytes]]
Decode = Callable[[CompiledStream, bytes], Canonical]

log = logging.getLogger("icefloe.ingestor.http")

EVENTS, ONE, BATCH = "events", "one", "batch"  # the three ingest routes
Target = tuple[str, str, str]  # (route kind, stream or schema, "" or table)

CORS_MAX_AGE_S: Final = 7200  # the longest preflight cache Chromium honours
CLIENT_GONE_STATUS: Final = 499  # metrics label for a client that hung up mid-body
MAX_CACHED_TYPES: Final = 256  # distinct Content-Type values whose decoder is remembered

_JSON: Final = (b"content-type", b"application/json")
_ALLOW_INGEST: Final = b"OPTIONS, POST"
_PREFLIGHT: Final = (
    (b"access-control-allow-methods", b"POST, OPTIONS"),
    (b"access-control-allow-headers",
     b"Content-Type, Content-Encoding, Authorization, Idempotency-Key"),
    (b"access-control-max-age", str(CORS_MAX_AGE_S).encode()),
)
_EXPOSE: Final = (b"access-control-expose-headers", b"Retry-After")
_VARY: Final = (b"vary", b"Origin")
_HEALTHY: Final = b'{"status":"ok"}'
_CLOSE: Final = (b"connection", b"close")

# Header name (as uvicorn gives it: lower case) → _Request attribute.
_WANTED: Final = {
    b"authorization": "authorization", b"content-encoding": "content_encoding",
    b"content-length": "content_length", b"content-type": "content_type",
    b"idempotency-key": "idempotency_key", b"origin": "origin",
    b"forwarded": "forwarded", b"x-forwarded-for": "x_forwarded_for",
}
_JOINED: Final = frozenset({"forwarded", "x_forwarded_for"})
"""Headers a request may repeat; their values are joined with commas (RFC 9110 5.3)."""
_SINGLE: Final = {"authorization": "Authorization", "idempotency_key": "Idempotency-Key"}
"""Headers a request may not repeat: which of two tokens or keys counts is ambiguous, and
an ingestor and a proxy in front of it may pick differently (400 ``duplicate_header``)."""
_MEDIA_TYPES: Final = {
    b"": "json", b"application/json": "json", b"text/plain": "json",
    b"application/x-ndjson": "ndjson", b"application/ndjson": "ndjson",
}
_NO_PREFLIGHT: Final = frozenset({b"", b"text/plain"})
"""Body types a browser sends cross-origin without a CORS preflight (see the module
docstring): accepted only without an ``Origin`` or from an allowed one."""


def error_body(err: IngestError) -> bytes:
    """The JSON error body every refusal carries: ``{"error", "message", "details"}``."""
    return msgspec.json.encode(err.body())


# -- body decoders: one per (route, media type) -------------------------------------------

def _from_json(stream: CompiledStream, body: bytes) -> Canonical:
    return stream.from_json(body)


def _from_ndjson(stream: CompiledStream, body: bytes) -> Canonical:
    return stream.from_ndjson(body)


def _one_object(stream: CompiledStream, body: bytes) -> Canonical:
    """``/collect/{schema}/{table}``: the seed took exactly one object here."""
    if body.lstrip()[:1] == b"[":
        raise InvalidEvents("invalid_json", "this route takes one JSON object; POST arrays "
                            "to /collect/{schema}/{table}/batch")
    return stream.from_json(body)


def _array(stream: CompiledStream, body: bytes) -> Canonical:
    """``/collect/{schema}/{table}/batch``: the seed took a JSON array here."""
    if body.lstrip()[:1] == b"{":
        raise InvalidEvents("invalid_json", "this route takes a JSON array of objects; POST "
                            "single objects to /collect/{schema}/{table}")
    return stream.from_json(body)


_DECODERS: Final[dict[tuple[str, str], Decode]] = {
    (EVENTS, "json"): _from_json, (EVENTS, "ndjson"): _from_ndjson,
    (ONE, "json"): _one_object, (BATCH, "json"): _array,
}
_ACCEPTED_TYPES: Final = {
    EVENTS: "application/json, text/plain (as JSON) or application/x-ndjson",
    ONE: "application/json or text/plain (as JSON)",
    BATCH: "application/json or text/plain (as JSON)",
}


# -- per-request state ----------------------------------------------------------------------

class _ClientGone(Exception):
    """The client hung up before its body arrived: nothing to answer."""


def _header_lookup(headers: Headers) -> Callable[[str], str | None]:
    """Look a request header up by lower-case name (repeated headers joined by commas);
    only a stream with header mappings pays for it."""
    def lookup(name: str) -> str | None:
        wanted = name.encode()
        values = [v.decode("latin-1") for k, v in headers if k == wanted]
        return ",".join(values) if values else None
    return lookup


class _Request:
    """The headers an ingest needs (picked out in one pass) and what the handler learnt."""

    __slots__ = ("authorization", "content_encoding", "content_length", "content_type",
                 "count", "forwarded", "idempotency_key", "origin", "repeated", "stream",
                 "x_forwarded_for")

    def __init__(self, raw: Iterable[tuple[bytes, bytes]]) -> None:
        self.authorization: bytes | None = None
        self.content_encoding: bytes | None = None
        self.content_length: bytes | None = None
        self.content_type: bytes | None = None
        self.idempotency_key: bytes | None = None
        self.origin: bytes | None = None
        self.forwarded: bytes | None = None
        self.x_forwarded_for: bytes | None = None
        self.stream = "-"  # metrics label: only configured names, never client input
        self.count = 1  # events refused if this request fails (1 until the body is parsed)
        self.repeated: str | None = None  # a header of _SINGLE sent twice
        for name, value in raw:
            attr = _WANTED.get(name)
            if attr is not None:
                previous = getattr(self, attr)
                if previous is not None:
                    if attr in _JOINED:
                        value = previous + b"," + value
                    elif attr in _SINGLE:
                        self.repeated = _SINGLE[attr]
                setattr(self, attr, value)

    def token(self) -> str | None:
        """The bearer token; another scheme counts as no token (401, which says what to send).

        Raises:
            BadRequest: Authorization or Idempotency-Key was sent more than once.
        """
        if self.repeated is not None:
            raise BadRequest(f"the {self.repeated} header was sent more than once; send it "
                             "once", code="duplicate_header",
                             details=[{"index": None, "field": self.repeated,
                                       "reason": "repeated header"}])
        value = self.authorization
        if value is None or value[:7].lower() != b"bearer ":
            return None
        return value[7:].strip().decode("utf-8", "replace") or None

    def key(self) -> str | None:
        if self.idempotency_key is None:
            return None
        try:
            return self.idempotency_key.decode("utf-8")
        except UnicodeDecodeError:
            raise BadRequest("the Idempotency-Key header must be UTF-8 text",
                             code="invalid_idempotency_key") from None

    def declared_length(self) -> int | None:
        if self.content_length is None:
            return None
        try:
            return int(self.content_length)
        except ValueError:
            raise BadRequest("the Content-Length header is not a number",
                             code="invalid_content_length") from None


def _ingest_target(path: str) -> Target | None:
    """Match the ingest routes by splitting the path: cheaper than any regex per request."""
    parts = path.split("/")
    n = len(parts)
    if n == 5 and parts[1] == "v1" and parts[2] == "streams" and parts[4] == "events" \
            and parts[3]:
        return EVENTS, parts[3], ""
    if n == 3 and parts[1] == "ingest" and parts[2]:  # alias of the events route
        return EVENTS, parts[2], ""
    if n in (4, 5) and parts[1] == "collect" and parts[2] and parts[3]:
        if n == 4:
            return ONE, parts[2], parts[3]
        if parts[4] == "batch":
            return BATCH, parts[2], parts[3]
    return None


def encoding_name(value: bytes | None) -> bytes:
    """A Content-Encoding header as ``ENCODINGS`` keys it (b"" when absent)."""
    return (value or b"").strip().lower()


def _media_type(value: bytes | None) -> bytes:
    if value is None:
        return b""
    return value.split(b";", 1)[0].strip().lower()


async def _lifespan(receive: Receive, send: Send) -> None:
    """Acknowledge start and stop: the runtime's lifecycle belongs to the server (see top)."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


class HttpApp:
    """The ASGI 3 app of one ingestor process. Safe to share across connections of one loop.

    ``HttpApp(runtime)`` serves ``runtime.service``; errors are spelled by
    :mod:`ingestor.errors` (status, JSON body, ``Retry-After`` on 429/503).
    """

    def __init__(self, runtime: IngestorRuntime, guard: SlowClientGuard | None = None) -> None:
        self.runtime = runtime
        self.service = runtime.service
        self.metrics = runtime.metrics
        ing = runtime.config.ingestor
        self.guard = guard or SlowClientGuard(ing.header_timeout_s, ing.body_timeout_s,
                                              ing.body_min_bytes_per_s,
                                              body_max_s=ing.body_max_s)
        self.proxies = runtime.service.proxies
        self.max_body_bytes = ing.max_body_bytes
        self.retry_after_s = float(ing.retry_after_s)
        self._cors_any = "*" in ing.cors_origins
        self._cors_origins = frozenset(o.rstrip("/").lower().encode()
                                       for o in ing.cors_origins if o != "*")
        self._gets: dict[str, Callable[[Send], Awaitable[None]]] = {
            "/healthz": self._healthz, "/readyz": self._readyz, "/metrics": self._metrics,
            "/openapi.json": self._openapi}
        self._openapi_body = msgspec.json.encode(openapi_document())
        self._counters: dict[tuple[str, int], Any] = {}
        self._decoders: dict[tuple[str, bytes | None], tuple[Decode, bool]] = {}
        self.ack_seconds = self.metrics.ack_seconds.labels("http")

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
        target = _ingest_target(path)
        if target is None:
            await self._error(send, NotFoundRoute(
                f"no route {method} {path}; ingest with POST /v1/streams/{{stream}}/events"),
                [], "-")
        elif method == "POST":
            await self._ingest(scope, receive, send, target)
        elif method == "OPTIONS":
            await self._preflight(scope, send)
        else:
            request = _Request(scope["headers"])
            await self._wrong_method(send, method, path, _ALLOW_INGEST,
                                     self.cors(request.origin))

    # -- ingest ------------------------------------------------------------------------------

    async def _ingest(self, scope: Scope, receive: Receive, send: Send, target: Target) -> None:
        """Answer 202 once durable; refusals are counted per stream and reason."""
        started = time.perf_counter()
        request = _Request(scope["headers"])
        cors = self.cors(request.origin)
        try:
            accepted = await self._accept(scope, request, receive, target)
        except IngestError as err:
            self.service.reject(request.stream, err, request.count)
            await self._error(send, err, cors, request.stream)
            return
        except _ClientGone:
            self.count(request.stream, CLIENT_GONE_STATUS)
            return
        except Exception:
            log.exception("unexpected error in POST %s", scope["path"])
            err = IngestError("internal error; the ingestor logged it")
            self.service.reject(request.stream, err, request.count)
            await self._error(send, err, cors, request.stream)
            return
        self.ack_seconds.observe(time.perf_counter() - started)
        await self._respond(send, 202, b'{"accepted":%d}' % accepted, [_JSON, *cors],
                            request.stream)

    async def _accept(self, scope: Scope, request: _Request, receive: Receive,
                      target: Target) -> int:
        """Check everything that needs no body, read it within limits, validate, ingest."""
        stream = self.stream_of(target, request)
        caller = await self.service.authorize(stream, request.token(),
                                              self.client_address(scope.get("client"), request))
        decode, inflater, key = self.pre_body_checks(target[0], request)
        body = await self._read_body(receive, inflater)
        canonical, meta = self.decoded(stream, decode, body, caller, scope["headers"])
        request.count = len(canonical.payloads)
        return await self.service.ingest(stream, canonical, idempotency_key=key,
                                         caller=caller, meta=meta)

    # -- the steps of an ingest, shared with the fast lane (ingestor.http.fast) -------------

    def stream_of(self, target: Target, request: _Request) -> CompiledStream:
        """The stream a route names (404 if none); remembered on ``request`` for metrics."""
        kind, first, second = target
        stream = self.service.stream(first) if kind == EVENTS else \
            self.service.stream_for_table(first, second)
        request.stream = stream.name
        return stream

    def pre_body_checks(self, kind: str, request: _Request
                        ) -> tuple[Decode, Inflater | None, str | None]:
        """After the token, everything that needs no body: content type and encoding
        (415), idempotency key (400), declared length (413). Returns the body decoder, the
        inflater (None: not compressed) and the idempotency key."""
        decode, simple = self._decoder(kind, request.content_type)
        if simple and request.origin is not None and not self._allowed(request.origin):
            raise UnsupportedMediaType(
                "a browser page may send text/plain or no Content-Type only from an origin "
                "listed in ingestor.cors_origins; send application/json (the browser then "
                "asks first, with a CORS preflight)")
        inflater = None if request.content_encoding is None \
            else self._inflater(request.content_encoding)
        key = request.key()
        declared, limit = request.declared_length(), self.max_body_bytes
        if declared is not None and declared > limit:
            raise PayloadTooLarge(f"Content-Length {declared} exceeds the {limit}-byte limit "
                                  "(ingestor.max_body_bytes); split it into smaller requests")
        return decode, inflater, key

    def decoded(self, stream: CompiledStream, decode: Decode, body: bytes, caller: Caller,
                headers: Headers) -> tuple[Canonical, bytes]:
        """The body's events in canonical form and the request's envelope metadata (400
        with per-event details when they do not validate)."""
        try:
            meta = stream.request_meta(caller.client, _header_lookup(headers)) \
                if stream.wants_meta else b""
            return decode(stream, body), meta
        except InvalidEvents as exc:
            raise self.service.bad_request(exc) from None

    def client_address(self, peer: tuple[str, int] | None, request: _Request) -> str | None:
        """The client address: the peer, or the forwarded one when the peer is trusted."""
        if not peer:
            return None
        if not self.proxies:
            return str(peer[0])
        forwarded, xff = request.forwarded, request.x_forwarded_for
        return self.proxies.client(str(peer[0]),
                                   None if forwarded is None else forwarded.decode("latin-1"),
                                   None if xff is None else xff.decode("latin-1"))

    def _decoder(self, kind: str, content_type: bytes | None) -> tuple[Decode, bool]:
        """The body decoder of ``content_type`` on a ``kind`` route (415 if none), and
        whether the type is one a browser sends without a preflight."""
        known = self._decoders.get((kind, content_type))
        if known is not None:
            return known
        media = _media_type(content_type)
        decode = _DECODERS.get((kind, _MEDIA_TYPES.get(media, "")))
        if decode is None:
            raise UnsupportedMediaType(
                f"Content-Type {media.decode('latin-1')!r} is not accepted here; send "
                f"{_ACCEPTED_TYPES[kind]}")
        if len(self._decoders) >= MAX_CACHED_TYPES:  # Content-Type is client input
            self._decoders.clear()
        found = self._decoders[(kind, content_type)] = (decode, media in _NO_PREFLIGHT)
        return found

    def _inflater(self, content_encoding: bytes | None) -> Inflater | None:
        name = encoding_name(content_encoding)
        if name not in ENCODINGS:
            raise UnsupportedMediaType(
                f"Content-Encoding {name.decode('latin-1')!r} is not supported; send gzip, "
                "zstd or an uncompressed body", code="unsupported_encoding")
        inflater = ENCODINGS[name]
        return None if inflater is None else inflater(self.max_body_bytes)

    async def _read_body(self, receive: Receive, inflater: Inflater | None) -> bytes:
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

    def too_slow(self, read: BodyRead) -> RequestTimeout:
        """The 408 of a body that arrived slower than the slow-loris rules allow."""
        if read.capped:
            return RequestTimeout(
                f"the body was not complete within {self.guard.body_max_s:g} s "
                f"({read.received} bytes arrived; ingestor.body_max_s)")
        return RequestTimeout(
            f"the body arrived too slowly ({read.received} bytes after "
            f"{self.guard.body_timeout_s:g} s plus 1 s per "
            f"{self.guard.body_min_bytes_per_s} bytes; ingestor.body_timeout_s, "
            "ingestor.body_min_bytes_per_s)")

    async def _receive_body(self, receive: Receive, inflater: Inflater | None,
                            read: BodyRead) -> bytes:
        limit = self.max_body_bytes
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                raise _ClientGone
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

    def _allowed(self, origin: bytes) -> bool:
        """``cors_origins`` lets ``origin`` in (``*``, or listed)."""
        return self._cors_any or origin.rstrip(b"/").lower() in self._cors_origins

    def _grant(self, origin: bytes | None) -> Headers | None:
        """The headers that let a browser read the response; None if the origin may not.

        ``*`` answers ``*`` (no credentials are involved: tokens travel in Authorization).
        Listed origins are echoed with ``Vary: Origin`` so caches keep answers apart.
        Retry-After is exposed so browser code can honour 429/503 back-off.
        """
        if origin is None:
            return None
        if self._cors_any:
            return [(b"access-control-allow-origin", b"*"), _EXPOSE]
        if origin.rstrip(b"/").lower() in self._cors_origins:
            return [(b"access-control-allow-origin", origin), _VARY, _EXPOSE]
        return None

    def cors(self, origin: bytes | None) -> Headers:
        """CORS headers of an ingest response: the grant, else only ``Vary: Origin`` when
        the answer depends on the origin (listed origins), else nothing."""
        granted = self._grant(origin)
        if granted is not None:
            return granted
        return [_VARY] if self._cors_origins else []

    async def _preflight(self, scope: Scope, send: Send) -> None:
        """204 with ``Allow``, plus the CORS grant for an allowed origin only (else the
        browser blocks the POST, which is the point). No stream lookup: a preflight must
        not fail where the POST itself would get a readable 404 or 401."""
        request = _Request(scope["headers"])
        headers = [(b"allow", _ALLOW_INGEST)]
        granted = self._grant(request.origin)
        if granted is not None:
            headers += granted
            headers += _PREFLIGHT
        elif self._cors_origins:
            headers.append(_VARY)
        await self._respond(send, 204, b"", headers, "-")

    # -- GET routes ----------------------------------------------------------------------------

    async def _healthz(self, send: Send) -> None:
        """Liveness: the process answers. Says nothing about the store (that is /readyz)."""
        await self._respond(send, 200, _HEALTHY, [_JSON], "-")

    async def _readyz(self, send: Send) -> None:
        ok, reason = await self.service.ready()
        if ok:
            body = msgspec.json.encode({"status": "ready", "detail": reason,
                                        "registry_version": self.service.registry_version})
            await self._respond(send, 200, body, [_JSON], "-")
        else:
            await self._error(send, Unavailable(reason, code="not_ready",
                                                retry_after_s=self.retry_after_s), [], "-")

    async def _openapi(self, send: Send) -> None:
        await self._respond(send, 200, self._openapi_body, [_JSON], "-")

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

    def error_parts(self, err: IngestError, extra: Headers) -> tuple[int, bytes, Headers]:
        """Status, JSON body and headers of a refusal (``Retry-After`` on 429/503; a 408
        closes the connection, as the rest of a slow body is never read)."""
        headers = [_JSON, *extra]
        if err.http_status == RequestTimeout.http_status:
            headers.append(_CLOSE)
        if err.http_status in (429, 503):
            delay = err.retry_after_s if err.retry_after_s is not None else self.retry_after_s
            headers.append((b"retry-after", str(max(1, math.ceil(delay))).encode()))
        return err.http_status, error_body(err), headers

    async def _respond(self, send: Send, status: int, body: bytes, headers: Headers,
                       stream: str) -> None:
        headers.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        self.count(stream, status)

    def count(self, stream: str, status: int, requests: int = 1) -> None:
        """``requests{transport="http"}``, with label children cached (labels() locks)."""
        child = self._counters.get((stream, status))
        if child is None:
            child = self.metrics.requests.labels("http", stream, str(status))
            self._counters[(stream, status)] = child
        child.inc(requests)
