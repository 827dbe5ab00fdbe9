"""The uvicorn server of the HTTP front: TLS, deadlines and the fast lane wired in.

Why here and not in ``server.py``: the production server and the tests must run the very
same HTTP stack (protocol class, TLS context, timeouts), so it is built in one function.

:class:`GuardedHttpToolsProtocol` subclasses uvicorn's httptools protocol
(:func:`guarded_protocol` binds it to one server's guard, fast lane and limits):

* plain ingest POSTs are handed to the fast lane (:mod:`ingestor.http.fast`), which stands
  in for uvicorn's request cycle and answers from the durability future's callback; every
  other request gets uvicorn's ASGI cycle, built only then;
* uvicorn has no deadline for request headers, and its keep-alive timer is armed and
  cancelled per request; instead each connection keeps two clocks (``headers_since``,
  ``idle_since``) that a :class:`~ingestor.http.slow_clients.SlowClientGuard` sweeps: too slow
  headers get 408 and a close, connections idle past ``keep_alive_s`` are closed;
* a request answered before its body arrived (a 401/404/429 refusal, a 413) waits for
  headers from the moment of the answer: the rest of that body (dropped unread) and the
  next request's headers must arrive within ``header_timeout_s``, or it gets 408 and is
  closed — else a client could hold the connection for ever by trickling a body nobody
  reads;
* each ASGI response is written with one ``send()`` (:class:`ResponseCork`);
* the front's own limits (:class:`~ingestor.http.limits.HttpLimits`, issue #29; the
  decisions are plain functions in :mod:`ingestor.http.limits`), checked before any route sees a
  request: request head bytes (counted per read as they arrive, so a 64 MiB header is
  refused after ``max_header_bytes`` plus one read, never buffered whole by httptools) and
  header count (431); HTTP versions other than 1.0/1.1 (505, an HTTP/2 preface included);
  transfer codings other than plain ``chunked`` (501: a body framed as ``gzip, chunked``
  would otherwise be read as if it were not compressed); and open connections per process
  (more are closed as soon as they are accepted). A refused request is answered with
  JSON, then the connection lingers: its write side is shut and what the client still
  sends is read and dropped for up to ``LINGER_S``, so the answer is not lost to the reset
  that closing on unread data would cause; so does a connection whose answer ends it while
  the request's body is still coming (a 408 from the slow-client guard:
  :meth:`GuardedHttpToolsProtocol.close_after_answer`, on both paths);
* a client that half-closes (``shutdown(SHUT_WR)``) after its request still gets the
  answer; the connection closes once it is written.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, ClassVar, Final

import httptools
import uvicorn
from prometheus_client import Counter
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from icefloe.config import IngestorSection
from ingestor.http.app import HttpApp
from ingestor.http.fast import FastIngest, FastLane
from ingestor.http.limits import (
    HttpLimits,
    Refusal,
    framing_refusal,
    parse_error_refusal,
    refusal_response,
)
from ingestor.http.slow_clients import SlowClientGuard
from ingestor.tls import CertificateReloader

_TIMEOUT_408 = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\nconnection: close\r\n\r\n%s")
_TIMEOUT_BODY = (b'{"error":"request_timeout","message":"the request headers did not arrive '
                 b'in time","details":[]}')
LINGER_S: Final = 2.0
"""How long a refused connection keeps reading (and dropping) what its client still sends."""

__all__ = ["LINGER_S", "GuardedHttpToolsProtocol", "HttpLimits", "ResponseCork",
           "guarded_protocol", "http_config", "refusal_response", "slow_client_guard"]


class _Refused(Exception):
    """Raised in a parser callback to stop parsing; the connection's ``refusal`` says why."""


class ResponseCork:
    """The transport a request cycle writes through: a response's head rides with its body.

    Why: uvicorn writes the status line and headers, then the body, as two ``send()``
    syscalls. On this project's CI-class VM (nested virtualisation) a syscall costs
    ~10 µs, so the second write was ~15 % of a durable single-event request (py-spy,
    native). A head is held until the next write — the body, in the same task step for
    every icefloe response — and sent with it in one syscall; a head nothing follows is
    sent at the end of the loop iteration (``call_soon``), so nothing is ever held longer.
    Order is preserved: a held head always goes out before anything written after it.
    """

    __slots__ = ("_close", "_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop,
                 close: Callable[[], None] | None = None) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None
        self._close = close or transport.close
        """How the cycle's close is carried out (the connection's: it may linger)."""

    def write(self, data: bytes) -> None:
        held = self._held
        if held is not None:
            self._held = None
            self._transport.write(held + data)
        elif data[:5] == b"HTTP/":
            self._held = data
            self._loop.call_soon(self.flush)
        else:
            self._transport.write(data)

    def flush(self) -> None:
        held, self._held = self._held, None
        if held is not None and not self._transport.is_closing():
            self._transport.write(held)

    def close(self) -> None:
        self.flush()
        self._close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:  # everything else is the real transport's
        return getattr(self._transport, name)


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, with header deadlines enforced by ``slow_guard``, each
    response written in one syscall (:class:`ResponseCork`), the front's ``http_limits``
    (decided in :mod:`ingestor.http.limits`), and — given ``fast_lane`` — plain ingest
    POSTs answered by the fast lane (:mod:`ingestor.http.fast`) instead of an ASGI task.

    uvicorn makes a protocol per connection from the class alone, so the guard, the lane
    and the limits are class attributes: :func:`guarded_protocol` makes the subclass that
    carries them."""

    slow_guard: ClassVar[SlowClientGuard]
    fast_lane: ClassVar[FastLane | None] = None
    http_limits: ClassVar[HttpLimits] = HttpLimits()
    # the two limits checked per read and per header field, copied to the connection when
    # it opens: an instance attribute is read faster than a class one (CPython 3.11), and
    # these are read several times per request (bench/security_bench.py measures it)
    max_header_bytes: int = HttpLimits.max_header_bytes
    max_headers: int = HttpLimits.max_headers

    # the guard's clocks (see SlowClientGuard): waiting for headers since / idle since
    headers_since: float | None = None
    idle_since: float | None = None
    # the limits' state: bytes read of the request head being parsed (counted while
    # head_pending: between requests and inside a head), its HTTP version (read once
    # here, also for the fast lane), its Transfer-Encoding values, why it is refused
    head_pending = True
    head_bytes = 0
    http_version = "1.1"
    transfer_encoding: list[bytes] | None = None
    refusal: Refusal | None = None
    lingering = False  # refused: what arrives is dropped until the close
    eof_seen = False  # the client half-closed: answer, then close

    # -- the connection ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        limits = self.http_limits
        if limits.too_many_connections(len(self.connections)):
            limits.count("max_connections")
            self.lingering = self.head_pending = True
            transport.close()
            return
        self.cork = ResponseCork(transport, self.loop, self.close_after_answer)
        self.max_header_bytes, self.max_headers = limits.max_header_bytes, limits.max_headers
        self.slow_guard.watch(self)
        self.headers_since = self.slow_guard.now()

    def data_received(self, data: bytes) -> None:
        """uvicorn's, plus the head-size limit: bytes are counted per read while a head
        is pending, and checked once the parser has taken them (a read that completes
        the head resets the count, so a body in the same read never counts)."""
        if self.head_pending:
            if self.lingering:
                return
            self.head_bytes += len(data)
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
        except httptools.HttpParserError as exc:
            self._parse_error(data, exc)
            return
        if self.head_pending and self.head_bytes > self.max_header_bytes:
            refusal = self.http_limits.head_refusal(self.head_bytes)
            if refusal is not None:
                self.refuse(*refusal)

    def _parse_error(self, data: bytes, exc: Exception) -> None:
        """A refusal noted while parsing (raised as :class:`_Refused` from a callback), or
        what :func:`~ingestor.http.limits.parse_error_refusal` makes of the parser's error."""
        self.refuse(*(self.refusal or parse_error_refusal(data, exc)))

    def refuse(self, status: int, reason: str, code: str, message: str) -> None:
        """Answer ``status`` with a JSON error, shut the write side and linger (see
        the module docstring); counted by ``reason``."""
        self.http_limits.count(reason)
        self.lingering = self.head_pending = True  # head_pending: data_received looks
        self.headers_since = self.idle_since = None
        transport = self.transport
        if transport.is_closing():
            return
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            transport.close()  # an earlier request is still being answered
            return
        transport.write(refusal_response(status, code, message))
        self._shut_and_linger()

    def close_after_answer(self) -> None:
        """Close after an answer that ends the connection (a 408 for a body too slow,
        ``Connection: close``). If the request's body is still coming, linger as a refusal
        does: closing on data still arriving resets the connection, and a client busy
        sending could lose the answer to that reset instead of reading it."""
        transport, cycle = self.transport, self.cycle
        if transport.is_closing():
            return
        if cycle is None or not cycle.more_body:
            transport.close()
            return
        self.lingering = self.head_pending = True
        self.headers_since = self.idle_since = None
        self._shut_and_linger()

    def _shut_and_linger(self) -> None:
        """Shut the write side, then drop what arrives for ``LINGER_S`` before closing
        (``lingering`` is set); over TLS, which cannot half-close, close at once."""
        transport = self.transport
        if transport.can_write_eof():
            transport.write_eof()
            self.loop.call_later(LINGER_S, transport.close)
        else:
            transport.close()

    def eof_received(self) -> bool | None:  # type: ignore[override]  # asyncio's contract
        # (True keeps a half-closed transport open); uvicorn's signature says None
        """Half-closed after a whole request: keep the connection to answer it. With
        nothing to answer, or mid-body (that request can never complete: the client
        has gone, 499), it closes; so it does on TLS, which cannot half-close."""
        cycle = self.cycle
        if self.lingering or self.scheme == "https" or cycle is None \
                or cycle.response_complete or cycle.more_body:
            return None
        self.eof_seen = True
        return True

    # -- the parser's callbacks ----------------------------------------------------------------

    def on_message_begin(self) -> None:
        # uvicorn's also builds the ASGI scope, which the fast lane never needs: that
        # is left to _asgi_scope, for requests that take the ASGI path
        self.url = b""
        self.expect_100_continue = False
        self.headers = []
        self.transfer_encoding = None
        self.idle_since = None
        if self.headers_since is None:  # kept when it already waits (see below)
            self.headers_since = self.slow_guard.now()

    def on_header(self, name: bytes, value: bytes) -> None:
        headers = self.headers
        if len(headers) >= self.max_headers:
            self.refusal = self.http_limits.header_count_refusal(len(headers))
            raise _Refused
        name = name.lower()  # as uvicorn's, plus Transfer-Encoding noted
        if name == b"expect":
            if value.lower() == b"100-continue":
                self.expect_100_continue = True
        elif name == b"transfer-encoding":
            if self.transfer_encoding is None:
                self.transfer_encoding = []
            self.transfer_encoding.append(value)
        headers.append((name, value))

    def _check_framing(self) -> None:
        """The version and transfer codings (:func:`~ingestor.http.limits.framing_refusal`);
        raises :class:`_Refused` with ``refusal`` set."""
        version = self.http_version = self.parser.get_http_version()
        codings = self.transfer_encoding
        if codings is None and (version == "1.1" or version == "1.0"):
            return  # nothing to refuse: no call on the common path
        refusal = framing_refusal(version, codings)
        if refusal is not None:
            self.refusal = refusal
            raise _Refused

    def _asgi_scope(self) -> None:
        url, headers, expect = self.url, self.headers, self.expect_100_continue
        super().on_message_begin()  # the scope, as uvicorn builds it
        self.url, self.expect_100_continue = url, expect
        self.headers = self.scope["headers"] = headers

    def on_headers_complete(self) -> None:
        self.headers_since = None
        self.head_pending = False
        self.head_bytes = 0
        self._check_framing()
        cycle, lane = self.cycle, self.fast_lane
        if lane is not None and (cycle is None or cycle.response_complete) \
                and lane.begin(self,  # type: ignore[arg-type]  # the lane's own cycle
                               self.server_state.default_headers) is not None:
            return  # the lane set self.cycle to its FastIngest
        self._asgi_scope()
        super().on_headers_complete()
        self.cycle.transport = self.cork  # type: ignore[assignment]

    def on_body(self, body: bytes) -> None:
        cycle = self.cycle
        if type(cycle) is FastIngest:
            cycle.body(body)
        else:
            super().on_body(body)

    def on_message_complete(self) -> None:
        self.head_pending = True  # what follows is the next request's head
        self.head_bytes = 0
        cycle = self.cycle
        if type(cycle) is FastIngest:
            cycle.complete()
        else:
            super().on_message_complete()

    # -- after the answer -------------------------------------------------------------------

    def on_response_complete(self) -> None:
        if self.lingering:  # answered and closing (close_after_answer): nothing follows
            return
        if self.pipeline or self.transport.is_closing():
            super().on_response_complete()  # starts the next pipelined request
            return
        if self.eof_seen:  # half-closed: nothing more can come
            self.transport.close()
            return
        # as uvicorn's, but idle connections are the guard's: no timer per request
        self.server_state.total_requests += 1
        self.flow.resume_reading()
        cycle = self.cycle
        if cycle is not None and cycle.more_body:  # answered; its body is still coming
            if self.headers_since is None:
                self.headers_since = self.slow_guard.now()
        else:
            self.idle_since = self.slow_guard.now()

    def connection_lost(self, exc: Exception | None) -> None:
        self.slow_guard.forget(self)
        cycle = self.cycle
        if type(cycle) is FastIngest and not cycle.response_complete:
            cycle.lost()
        super().connection_lost(exc)

    def idle_timeout(self) -> None:
        """Idle for ``keep_alive_s``: close, as uvicorn's keep-alive timer would."""
        self.timeout_keep_alive_handler()

    def header_timeout(self) -> None:
        """Too slow: say so (408) and close, like nginx's ``client_header_timeout``."""
        if not self.transport.is_closing():
            self.transport.write(_TIMEOUT_408 % (len(_TIMEOUT_BODY), _TIMEOUT_BODY))
            self.transport.close()


def guarded_protocol(guard: SlowClientGuard, lane: FastLane | None = None,
                     limits: HttpLimits | None = None) -> type[GuardedHttpToolsProtocol]:
    """The :class:`GuardedHttpToolsProtocol` of one server: its ``guard``, ``lane`` and
    ``limits`` as class attributes (uvicorn builds each connection's protocol from the
    class)."""
    settings = {"slow_guard": guard, "fast_lane": lane, "http_limits": limits or HttpLimits()}
    return type("GuardedHttpToolsProtocol", (GuardedHttpToolsProtocol,), settings)


def slow_client_guard(ing: IngestorSection) -> SlowClientGuard:
    return SlowClientGuard(ing.header_timeout_s, ing.body_timeout_s, ing.body_min_bytes_per_s,
                           keep_alive_s=ing.keep_alive_s, body_max_s=ing.body_max_s)


def http_config(app: Any, ing: IngestorSection, guard: SlowClientGuard,
                tls: CertificateReloader | None = None, *,
                loop: str = "none", lane: Any = None,
                refused: Counter | None = None) -> uvicorn.Config:
    """uvicorn settings of the HTTP front; serve with ``Server.serve(sockets=[...])``.

    ``lane`` and ``refused`` stand in for the fast lane and the refusal counter of an app
    that is not an :class:`HttpApp` yet (the front of a starting ingestor,
    :mod:`ingestor.starting`)."""
    if isinstance(app, HttpApp):
        lane = FastLane(app) if ing.http_fast_lane else None
        refused = app.metrics.http_refused
    limits = HttpLimits.of(ing, refused)
    config = uvicorn.Config(
        app, loop=loop, http=guarded_protocol(guard, lane, limits), lifespan="off",
        access_log=False,
        log_level="warning", log_config=None,  # uvicorn's lines go through our redacting handler
        timeout_graceful_shutdown=int(ing.shutdown_timeout_s),
        timeout_keep_alive=ing.keep_alive_s,  # type: ignore[arg-type]
        proxy_headers=False, server_header=False,
        ssl_context_factory=None if tls is None else (lambda _config, _default:
                                                      tls.http_context))
    return config
