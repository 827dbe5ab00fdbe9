"""The fast lane of the HTTP front: plain ingest POSTs answered without an ASGI cycle.

Why: on this machine kind (wrk, 256 connections, 2 cores) uvicorn's httptools protocol in
front of a raw ASGI app that answers a bare 202 manages ~44k requests/s, while the same
parser (httptools) driven by a plain asyncio protocol writing a prebuilt response manages
~215k. Most of uvicorn's ~23 µs per request is the ASGI layer: a scope dict, an
``asyncio.Event``, a request cycle object, a Task, and the receive/send message dicts.
A durable ingest needs none of it: its work is synchronous up to the point where it waits
for a flush, and the flush can answer it from a callback. So a request in the fast lane
is a :class:`FastIngest` that takes the place of uvicorn's request cycle on the connection;
the body is collected as the parser delivers it, and the response is written by the
future that resolves when the events are durable.

Which requests take it (:meth:`FastLane.begin`): HTTP/1.1 keep-alive POSTs to an ingest
route with a ``Content-Length``, no ``Content-Encoding``, no ``Expect``, not pipelined
behind an unanswered request. They get every answer here, from the very steps the ASGI path
uses (:class:`ingestor.http.steps.IngestSteps`), so status, headers and JSON bodies are the same;
the single exception is a token this process has not verified yet, which needs a wait
(a hash in a worker thread) and is therefore left to the ASGI path, before anything was
done or counted. Everything else — compressed or chunked bodies, ``Expect: 100-continue``,
HTTP/1.0, ``Connection: close``, GETs, preflights — takes the ASGI path unchanged.

Slow-loris rules apply alike: the body is registered with the connection's
:class:`~ingestor.http.slow_clients.SlowClientGuard`, which answers 408 and closes when it
trickles in.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Final, NamedTuple, Protocol

from uvicorn.protocols.http.httptools_impl import STATUS_LINE

from ingestor.auth import NeedsVerification
from ingestor.errors import IngestError
from ingestor.http.inflate import ENCODINGS, body_too_large
from ingestor.http.steps import (
    CLIENT_GONE_STATUS,
    JSON_CONTENT_TYPE,
    Decode,
    Headers,
    IngestSteps,
    Request,
    Target,
    encoding_name,
    ingest_target,
)

if TYPE_CHECKING:
    import httptools

    from ingestor.http.slow_clients import BodyRead
    from ingestor.service import Caller
    from ingestor.validate import CompiledStream

log = logging.getLogger("icefloe.ingestor.http")

_UNKNOWN: Final = object()
_UNCACHED: Final[Target] = ("", "", "")  # a path not looked up yet (compared by identity)
MAX_CACHED_PATHS: Final = 1024
_CLOSE_LINE: Final = b"connection: close\r\n"


class LaneConnection(Protocol):
    """What the fast lane uses of a connection: uvicorn's httptools protocol (subclassed in
    :mod:`ingestor.http.server`)."""

    parser: httptools.HttpRequestParser
    http_version: str  # the parser's, read once at the end of headers
    url: bytes
    headers: list[tuple[bytes, bytes]]
    expect_100_continue: bool
    client: tuple[str, int] | None
    transport: asyncio.Transport
    loop: asyncio.AbstractEventLoop
    cycle: object

    def on_response_complete(self) -> None: ...

    def close_after_answer(self) -> None: ...


class _NoEvent:
    """uvicorn sets its cycle's ``message_event`` when a connection is lost; a fast
    request waits on no event, so this one does nothing."""

    __slots__ = ()

    def set(self) -> None:
        return None


_NO_EVENT: Final = _NoEvent()


class _Admitted(NamedTuple):
    """What a request admitted before its body needs once the body is in."""

    stream: CompiledStream
    caller: Caller
    decode: Decode
    key: str | None


class FastLane:
    """The fast lane of one HTTP server (see module docstring); holds no per-request state."""

    def __init__(self, app: IngestSteps) -> None:
        self.app = app
        self.service = app.service
        self.guard = app.guard
        self._date_source: object = None
        self._date = b""
        self._accepted_head = b""
        self._targets: dict[bytes, Target | None] = {}
        self._tally: dict[str, list[int]] = {}
        self._tally_due = False

    def begin(self, connection: LaneConnection, default_headers: Headers) -> FastIngest | None:
        """At a request's end of headers: a :class:`FastIngest` for it, or None (ASGI path).

        A refusal found before the body (404, 401/403, 429, 415, 413, 400) is answered at
        once; the connection ignores the rest of that body, as uvicorn does.
        """
        parser = connection.parser
        if (parser.get_method() != b"POST" or connection.expect_100_continue
                or connection.http_version != "1.1" or not parser.should_keep_alive()
                or parser.should_upgrade()):
            return None
        url = connection.url
        if url[:1] != b"/" or b"%" in url:  # absolute-form or escaped: let uvicorn parse it
            return None
        query = url.find(b"?")
        path = url if query < 0 else url[:query]
        target = self._targets.get(path, _UNCACHED)
        if target is _UNCACHED:
            target = self._target(path)
        if target is None:
            return None
        request = Request(connection.headers)
        if request.content_length is None or \
                ENCODINGS.get(encoding_name(request.content_encoding), _UNKNOWN) is not None:
            return None  # chunked, or compressed (or an unknown encoding: 415 there)
        fast = FastIngest(self, connection, request, default_headers)
        connection.cycle = fast  # from here on, the connection's request is this one
        app = self.app
        try:
            stream = app.stream_of(target, request)
            if stream.config.on_invalid == "dead_letter":  # its answer has another shape
                connection.cycle = None
                return None
            client = app.client_address(connection.client, request)
            caller = self.service.authorize_known(stream, request.token(), client)
            decode, _, key = app.pre_body_checks(target[0], request, stream)
        except NeedsVerification:
            connection.cycle = None  # nothing was done: uvicorn takes it from the start
            return None
        except IngestError as err:
            fast.refuse(err)
            return fast
        fast.ready(stream, caller, decode, key)
        return fast

    def tally(self, connection: LaneConnection, stream: str, events: int) -> None:
        """Count one 202 and its events; the Prometheus counters are updated once per
        event-loop turn (a flush answers its requests in one turn), not per request."""
        counts = self._tally.get(stream)
        if counts is None:
            counts = self._tally[stream] = [0, 0]
        counts[0] += 1
        counts[1] += events
        if not self._tally_due:
            self._tally_due = True
            connection.loop.call_soon(self._publish)

    def _publish(self) -> None:
        tally, self._tally, self._tally_due = self._tally, {}, False
        for stream, (requests, events) in tally.items():
            self.service.accepted(stream, events)
            self.app.count(stream, 202, requests)

    def _target(self, path: bytes) -> Target | None:
        """The route of ``path``, remembered: a few hundred paths at most are ever used, and
        the bound keeps a client that invents paths from growing the cache."""
        try:
            target = ingest_target(path.decode("ascii"))
        except UnicodeDecodeError:
            return None
        if len(self._targets) >= MAX_CACHED_PATHS:
            self._targets.clear()
        self._targets[path] = target
        return target

    def date_line(self, default_headers: Headers) -> bytes:
        """uvicorn's default headers (its ``date``, refreshed every second) as bytes."""
        if default_headers is not self._date_source:
            self._date = b"".join(b"%s: %s\r\n" % pair for pair in default_headers)
            self._accepted_head = b"%s%s%s: %s\r\ncontent-length: " % (
                STATUS_LINE[202], self._date, *JSON_CONTENT_TYPE)
            self._date_source = default_headers
        return self._date

    def accepted_head(self, default_headers: Headers) -> bytes:
        """A 202's status line and headers up to the Content-Length value."""
        self.date_line(default_headers)
        return self._accepted_head


class FastIngest:
    """One request in the fast lane; stands in for uvicorn's request cycle.

    uvicorn's protocol reads ``response_complete``, ``keep_alive`` (cleared on shutdown:
    answer, then close), ``more_body``, ``disconnected`` and ``message_event`` of its
    cycle; the guarded protocol feeds :meth:`body` and calls :meth:`complete`/:meth:`lost`.
    """

    __slots__ = ("admitted", "chunks", "connection", "cors", "count", "default_headers",
                 "disconnected", "keep_alive", "lane", "message_event", "more_body", "read",
                 "request", "response_complete", "started")

    def __init__(self, lane: FastLane, connection: LaneConnection, request: Request,
                 default_headers: Headers) -> None:
        self.lane = lane
        self.connection = connection
        self.request = request
        self.default_headers = default_headers
        self.started = time.perf_counter()
        self.cors = lane.app.cors(request.origin)
        self.admitted: _Admitted | None = None
        self.read: BodyRead | None = None
        self.chunks: list[bytes] = []
        self.count = 1
        self.response_complete = False
        self.keep_alive = True
        self.more_body = True
        self.disconnected = False
        self.message_event = _NO_EVENT

    def ready(self, stream: CompiledStream, caller: Caller, decode: Decode,
              key: str | None) -> None:
        """Admitted before its body: read the body under the slow-loris rules."""
        self.admitted = _Admitted(stream, caller, decode, key)
        self.read = self.lane.guard.begin_body(self.too_slow)

    # -- what the connection calls ---------------------------------------------------------

    def body(self, chunk: bytes) -> None:
        read = self.read
        if read is None:  # answered already: the rest is dropped, as uvicorn does
            return
        read.received += len(chunk)
        if read.received > self.lane.app.max_body_bytes:  # a Content-Length that lied
            self.read = None
            self.lane.guard.end_body(read)
            self.refuse(body_too_large(self.lane.app.max_body_bytes, "request"))
            return
        self.chunks.append(chunk)

    def complete(self) -> None:
        """The whole body is in: validate, buffer, and answer once durable."""
        self.more_body = False
        read, admitted = self.read, self.admitted
        if read is None or admitted is None:  # refused before its body, or cut off
            return
        self.read = None
        lane = self.lane
        lane.guard.end_body(read)
        chunks = self.chunks
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        stream, caller, decode, key = admitted
        try:
            canonical, meta = lane.app.decoded(stream, decode, body, caller,
                                               self.connection.headers)
            self.count = len(canonical.payloads)
            future = lane.service.admit(stream, canonical, idempotency_key=key,
                                        caller=caller, meta=meta)
        except IngestError as err:
            self.refuse(err)
            return
        except Exception as exc:
            self.crashed(exc)
            return
        future.add_done_callback(self.durable)

    def lost(self) -> None:
        """The client hung up. Before its body was in: nothing to answer (counted like the
        ASGI path's 499). Afterwards the events still become durable; only the answer has
        nowhere to go."""
        if self.read is not None:
            self.lane.guard.end_body(self.read)
            self.read = None
            self.lane.app.count(self.request.stream, CLIENT_GONE_STATUS)

    def too_slow(self) -> None:
        """The slow-loris guard's verdict on this body: 408, and the connection closes."""
        read, self.read = self.read, None
        if read is not None:
            self.refuse(self.lane.app.too_slow(read))

    # -- answers ---------------------------------------------------------------------------

    def durable(self, future: asyncio.Future[None]) -> None:
        """The flush is over: 202, or the refusal that says why it failed."""
        if future.cancelled():  # nothing cancels it; if something did, say so
            self.crashed(asyncio.CancelledError("the wait for durability was cancelled"))
            return
        error = future.exception()
        if error is None:
            lane, stream, count = self.lane, self.request.stream, self.count
            lane.app.ack_seconds.observe(time.perf_counter() - self.started)
            if self.cors or not self.keep_alive:
                lane.service.accepted(stream, count)
                self.respond(202, b'{"accepted":%d}' % count, [JSON_CONTENT_TYPE, *self.cors])
                return
            # the common answer, from a prebuilt head (what respond() would write)
            body = b'{"accepted":%d}' % count
            self._write(b"%s%d\r\n\r\n%s" % (lane.accepted_head(self.default_headers),
                                                len(body), body))
            lane.tally(self.connection, stream, count)
            self.connection.on_response_complete()
        elif isinstance(error, IngestError):
            self.refuse(error)
        else:
            self.crashed(error)

    def refuse(self, err: IngestError) -> None:
        self.lane.service.reject(self.request.stream, err, self.count)
        self.respond(*self.lane.app.error_parts(err, self.cors))

    def crashed(self, exc: BaseException) -> None:
        """A bug costs this request a 500, never the server (as on the ASGI path)."""
        # not the URL: by now the connection may be parsing its next request
        log.error("unexpected error in a POST to stream %r", self.request.stream,
                  exc_info=exc)
        self.refuse(IngestError("internal error; the ingestor logged it"))

    def respond(self, status: int, body: bytes, headers: Headers) -> None:
        """Write the whole response in one ``send()`` and hand the connection back."""
        if self.response_complete:
            return
        lane = self.lane
        parts = [STATUS_LINE[status], lane.date_line(self.default_headers)]
        for name, value in headers:
            if name == b"connection" and value == b"close":
                self.keep_alive = False
            else:
                parts.append(b"%s: %s\r\n" % (name, value))
        if not self.keep_alive:
            parts.append(_CLOSE_LINE)
        parts.append(b"content-length: %d\r\n\r\n" % len(body))
        parts.append(body)
        self._write(b"".join(parts))
        lane.app.count(self.request.stream, status)
        self.connection.on_response_complete()

    def _write(self, response: bytes) -> None:
        """Send ``response`` unless the client is gone; close after it if not keep-alive."""
        self.response_complete = True
        transport = self.connection.transport
        if not transport.is_closing():
            transport.write(response)
            if not self.keep_alive:  # lingers if the body is still coming (a 408)
                self.connection.close_after_answer()
