"""The steps of an ingest request, shared by both HTTP fronts.

The ASGI app (:mod:`ingestor.http.app`) and the fast lane (:mod:`ingestor.http.fast`) must
answer a request alike: same route matching, same checks in the same order, same status,
headers and JSON bodies. So what a request *is* (:class:`Request`, :func:`ingest_target`)
and what is done with it before and after its body (:class:`IngestSteps`: stream lookup,
token and client address, content type and encoding, decoding, CORS, refusals, counting)
live here, and each front only moves bytes: the app through ASGI messages, the fast lane
from parser callbacks.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any, Final

import msgspec

from icefloe.streams.mappings import stored_header
from ingestor.errors import (
    BadRequest,
    IngestError,
    PayloadTooLarge,
    RequestTimeout,
    UnsupportedMediaType,
)
from ingestor.http.inflate import ENCODINGS, Inflater
from ingestor.http.slow_clients import BodyRead, SlowClientGuard
from ingestor.runtime import IngestorRuntime
from ingestor.service import Caller
from ingestor.validate import Canonical, CompiledStream, InvalidEvents

__all__ = [
    "BATCH", "CLIENT_GONE_STATUS", "EVENTS", "JSON_CONTENT_TYPE", "ONE", "ClientGone", "Decode",
    "Headers", "IngestSteps", "Request", "Target", "encoding_name", "error_body",
    "ingest_target",
]

Headers = list[tuple[bytes, bytes]]
Decode = Callable[[CompiledStream, bytes], Canonical]

EVENTS, ONE, BATCH = "events", "one", "batch"  # the three ingest routes
Target = tuple[str, str, str]  # (route kind, stream or schema, "" or table)

CORS_MAX_AGE_S: Final = 7200  # the longest preflight cache Chromium honours
CLIENT_GONE_STATUS: Final = 499  # metrics label for a client that hung up mid-body
MAX_CACHED_TYPES: Final = 256  # distinct Content-Type values whose decoder is remembered

JSON_CONTENT_TYPE: Final = (b"content-type", b"application/json")
_PREFLIGHT: Final = (
    (b"access-control-allow-methods", b"POST, OPTIONS"),
    (b"access-control-allow-headers",
     b"Content-Type, Content-Encoding, Authorization, Idempotency-Key"),
    (b"access-control-max-age", str(CORS_MAX_AGE_S).encode()),
)
_EXPOSE: Final = (b"access-control-expose-headers", b"Retry-After")
_VARY: Final = (b"vary", b"Origin")
_CLOSE: Final = (b"connection", b"close")

# Header name (as uvicorn gives it: lower case) → Request attribute.
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
    b"application/octet-stream": "bytes",
    b"application/x-protobuf": "binary", b"application/protobuf": "binary",
    b"application/vnd.google.protobuf": "binary",
    b"application/vnd.apache.avro+binary": "binary", b"avro/binary": "binary",
}
_DELIMITED: Final = b"delimited=true"
"""The Content-Type parameter of a length-delimited stream of Protobuf messages."""
_FORM: Final = b"application/x-www-form-urlencoded"
"""curl's type with ``-d``: read as JSON where the stream's ``form_body`` says so."""
_NO_PREFLIGHT: Final = frozenset({b"", b"text/plain", _FORM})
"""Body types a browser sends cross-origin without a CORS preflight (see
:mod:`ingestor.http.app`): accepted only without an ``Origin`` or from an allowed one."""


class ClientGone(Exception):
    """The client hung up before its body arrived: nothing to answer."""


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


def _from_bytes(stream: CompiledStream, body: bytes) -> Canonical:
    """``application/octet-stream``: the body is one opaque entry of a bytes stream, or
    one message of a typed stream."""
    if stream.typed is not None:
        return stream.from_binary([body])
    return stream.from_entries([body])


def _from_binary(stream: CompiledStream, body: bytes) -> Canonical:
    """``application/x-protobuf`` (or Avro's binary type): one message of a typed stream."""
    return stream.from_binary([body])


def _from_delimited(stream: CompiledStream, body: bytes) -> Canonical:
    """``application/x-protobuf; delimited=true``: length-delimited messages."""
    return stream.from_delimited(body)


_RAW_LIST: Final = msgspec.json.Decoder(list[msgspec.Raw])


def request_events(decode: Decode, body: bytes) -> list[bytes] | None:
    """The body's events, each as its own JSON text, for a request that is split into
    valid events and dead letters; None when the body is not a list of events at all
    (malformed JSON, an empty body, bytes entries): then it is refused whole."""
    if decode is _from_ndjson:
        return [line for line in body.split(b"\n") if line.strip()] or None
    if decode in (_from_bytes, _from_binary, _from_delimited):
        return None
    start = body.lstrip()[:1]
    if start == b"{" and decode is not _array:
        return [body.strip()]
    if start == b"[" and decode is not _one_object:
        try:
            return [bytes(raw) for raw in _RAW_LIST.decode(body)] or None
        except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
            return None
    return None


_DECODERS: Final[dict[tuple[str, str], Decode]] = {
    (EVENTS, "bytes"): _from_bytes, (EVENTS, "binary"): _from_binary,
    (EVENTS, "delimited"): _from_delimited,
    (EVENTS, "json"): _from_json, (EVENTS, "ndjson"): _from_ndjson,
    (ONE, "json"): _one_object, (BATCH, "json"): _array,
}
_ACCEPTED_TYPES: Final = {
    EVENTS: "application/json, text/plain (as JSON), application/x-ndjson, or "
            "application/octet-stream (one entry of a payload = \"bytes\" stream), or "
            "for a format = \"protobuf\" or \"avro\" stream application/x-protobuf "
            "(\"; delimited=true\": length-delimited messages) or "
            "application/vnd.apache.avro+binary",
    ONE: "application/json or text/plain (as JSON)",
    BATCH: "application/json or text/plain (as JSON)",
}


# -- per-request state ----------------------------------------------------------------------

def _header_lookup(headers: Headers) -> Callable[[str], str | None]:
    """Look a request header up by lower-case name (repeated headers joined by commas);
    only a stream with header mappings pays for it."""
    def lookup(name: str) -> str | None:
        wanted = name.encode()
        values = [_header_text(name, v) for k, v in headers if k == wanted]
        return ",".join(values) if values else None
    return lookup


def _header_pairs(headers: Headers) -> list[tuple[str, str]]:
    """Every request header a ``from = "headers"`` column keeps, as text. The ones it
    leaves out (credentials; :func:`ingestor.mappings.all_headers_json` applies the same
    test) are skipped before their values are read, so whatever bytes they hold cannot
    refuse the request."""
    pairs = []
    for k, v in headers:
        name = k.decode("latin-1")
        if name.startswith(":") or name.endswith("-bin") or not stored_header(name.lower()):
            continue
        pairs.append((name, _header_text(name, v)))
    return pairs


def _header_text(name: str, value: bytes) -> str:
    """A header value a mapping stores: its UTF-8 text, what clients send (and how Kafka
    headers are read). A value that is not UTF-8 is refused naming the header (400
    ``invalid_utf8``), as a body or an ``Idempotency-Key`` that is not: read as latin-1
    (RFC 9110's obs-text) it would be stored as plausible, wrong text (``JosÃ©``)."""
    try:
        return value.decode()
    except UnicodeDecodeError as exc:
        raise BadRequest(f"header {name!r} is not valid UTF-8 (byte {exc.start} of "
                         f"{len(value)}); send header values a column stores as UTF-8 text",
                         code="invalid_utf8",
                         details=[{"index": None, "field": name,
                                   "reason": "header value not UTF-8"}]) from None


class Request:
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


def ingest_target(path: str) -> Target | None:
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


class IngestSteps:
    """The steps of an ingest both fronts run, with the settings and caches they need.

    Built once per process from the runtime; :class:`ingestor.http.app.HttpApp` is these
    steps plus the ASGI plumbing, and the fast lane calls them on the app it is given.
    Safe to share across connections of one event loop.
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
        self._counters: dict[tuple[str, int], Any] = {}
        self._decoders: dict[tuple[str, bytes | None, bool], tuple[Decode, bool]] = {}
        self.ack_seconds = self.metrics.ack_seconds.labels("http")

    def stream_of(self, target: Target, request: Request) -> CompiledStream:
        """The stream a route names (404 if none); remembered on ``request`` for metrics."""
        kind, first, second = target
        stream = self.service.stream(first) if kind == EVENTS else \
            self.service.stream_for_table(first, second)
        request.stream = stream.name
        return stream

    def pre_body_checks(self, kind: str, request: Request, stream: CompiledStream
                        ) -> tuple[Decode, Inflater | None, str | None]:
        """After the token, everything that needs no body: content type and encoding
        (415), idempotency key (400), declared length (413). Returns the body decoder, the
        inflater (None: not compressed) and the idempotency key."""
        form = stream.config.form_body
        decode, simple = self._decoder(kind, request.content_type,
                                       form == "json" or (form == "collect" and kind != EVENTS))
        if simple and request.origin is not None and not self._allowed(request.origin):
            raise UnsupportedMediaType(
                "a browser page may send text/plain, a form type or no Content-Type only from "
                "an origin listed in ingestor.cors_origins; send application/json (the "
                "browser then asks first, with a CORS preflight)")
        inflater = None if request.content_encoding is None \
            else self.inflater(request.content_encoding)
        key = request.key()
        declared, limit = request.declared_length(), self.max_body_bytes
        if declared is not None and declared > limit:
            raise PayloadTooLarge(f"Content-Length {declared} exceeds the {limit}-byte limit "
                                  "(ingestor.max_body_bytes); split it into smaller requests")
        return decode, inflater, key

    def decoded_meta(self, stream: CompiledStream, caller: Caller, headers: Headers) -> bytes:
        """The request's envelope metadata alone (for a request split into valid events
        and dead letters)."""
        try:
            return stream.request_meta(caller.client, _header_lookup(headers),
                                       lambda: _header_pairs(headers)) \
                if stream.wants_meta else b""
        except InvalidEvents as exc:
            raise self.service.bad_request(exc) from None

    def decoded(self, stream: CompiledStream, decode: Decode, body: bytes, caller: Caller,
                headers: Headers) -> tuple[Canonical, bytes]:
        """The body's events in canonical form and the request's envelope metadata (400
        with per-event details when they do not validate)."""
        try:
            meta = stream.request_meta(caller.client, _header_lookup(headers),
                                       lambda: _header_pairs(headers)) \
                if stream.wants_meta else b""
            return decode(stream, body), meta
        except InvalidEvents as exc:
            raise self.service.bad_request(exc) from None

    def client_address(self, peer: tuple[str, int] | None, request: Request) -> str | None:
        """The client address: the peer, or the forwarded one when the peer is trusted."""
        if not peer:
            return None
        if not self.proxies:
            return str(peer[0])
        forwarded, xff = request.forwarded, request.x_forwarded_for
        return self.proxies.client(str(peer[0]),
                                   None if forwarded is None else forwarded.decode("latin-1"),
                                   None if xff is None else xff.decode("latin-1"))

    def _decoder(self, kind: str, content_type: bytes | None, form_as_json: bool
                 ) -> tuple[Decode, bool]:
        """The body decoder of ``content_type`` on a ``kind`` route (415 if none), and
        whether the type is one a browser sends without a preflight. ``form_as_json``: a
        form-typed body is read as JSON (the stream's ``form_body`` allows it here)."""
        known = self._decoders.get((kind, content_type, form_as_json))
        if known is not None:
            return known
        media = _media_type(content_type)
        parse = "json" if media == _FORM and form_as_json else _MEDIA_TYPES.get(media, "")
        if parse == "binary" and _DELIMITED in (content_type or b"").lower().replace(b" ", b""):
            parse = "delimited"
        decode = _DECODERS.get((kind, parse))
        if decode is None:
            accepted = _ACCEPTED_TYPES[kind]
            if media == _FORM:
                accepted += " (this stream's form_body setting keeps the form type out here)"
            raise UnsupportedMediaType(
                f"Content-Type {media.decode('latin-1')!r} is not accepted here; send "
                f"{accepted}")
        if len(self._decoders) >= MAX_CACHED_TYPES:  # Content-Type is client input
            self._decoders.clear()
        found = self._decoders[(kind, content_type, form_as_json)] = (
            decode, media in _NO_PREFLIGHT)
        return found

    def inflater(self, content_encoding: bytes | None) -> Inflater | None:
        name = encoding_name(content_encoding)
        if name not in ENCODINGS:
            raise UnsupportedMediaType(
                f"Content-Encoding {name.decode('latin-1')!r} is not supported; send gzip, "
                "zstd or an uncompressed body", code="unsupported_encoding")
        inflater = ENCODINGS[name]
        return None if inflater is None else inflater(self.max_body_bytes)

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

    def preflight_cors(self, origin: bytes | None) -> Headers:
        """CORS headers of a preflight answer: the grant and what it allows for an allowed
        origin only (else the browser blocks the POST, which is the point)."""
        granted = self._grant(origin)
        if granted is not None:
            return [*granted, *_PREFLIGHT]
        return [_VARY] if self._cors_origins else []

    # -- refusals and counts ---------------------------------------------------------------

    def error_parts(self, err: IngestError, extra: Headers) -> tuple[int, bytes, Headers]:
        """Status, JSON body and headers of a refusal (``Retry-After`` on 429/503; a 408
        closes the connection, as the rest of a slow body is never read)."""
        headers = [JSON_CONTENT_TYPE, *extra]
        if err.http_status == RequestTimeout.http_status:
            headers.append(_CLOSE)
        if err.http_status in (429, 503):
            delay = err.retry_after_s if err.retry_after_s is not None else self.retry_after_s
            headers.append((b"retry-after", str(max(1, math.ceil(delay))).encode()))
        return err.http_status, error_body(err), headers

    def count(self, stream: str, status: int, requests: int = 1) -> None:
        """``requests{transport="http"}``, with label children cached (labels() locks)."""
        child = self._counters.get((stream, status))
        if child is None:
            child = self.metrics.requests.labels("http", stream, str(status))
            self._counters[(stream, status)] = child
        child.inc(requests)
