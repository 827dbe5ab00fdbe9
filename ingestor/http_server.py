"""The uvicorn server of the HTTP front: TLS, deadlines and the fast lane wired in.

Why here and not in ``server.py``: the production server and the tests must run the very
same HTTP stack (protocol class, TLS context, timeouts), so it is built in one function.

:func:`guarded_protocol` subclasses uvicorn's httptools protocol:

* plain ingest POSTs are handed to the fast lane (:mod:`ingestor.http_fast`), which stands
  in for uvicorn's request cycle and answers from the durability future's callback; every
  other request gets uvicorn's ASGI cycle, built only then;
* uvicorn has no deadline for request headers, and its keep-alive timer is armed and
  cancelled per request; instead each connection keeps two clocks (``headers_since``,
  ``idle_since``) that a :class:`~ingestor.slow_clients.SlowClientGuard` sweeps: too slow
  headers get 408 and a close, connections idle past ``keep_alive_s`` are closed;
* a request answered before its body arrived (a 401/404/429 refusal, a 413) waits for
  headers from the moment of the answer: the rest of that body (dropped unread) and the
  next request's headers must arrive within ``header_timeout_s``, or it gets 408 and is
  closed — else a client could hold the connection for ever by trickling a body nobody
  reads;
* each ASGI response is written with one ``send()`` (:class:`ResponseCork`).
"""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from icefloe.config import IngestorSection
from ingestor.http_app import HttpApp
from ingestor.http_fast import FastIngest, FastLane
from ingestor.slow_clients import SlowClientGuard
from ingestor.tls import CertificateReloader

_TIMEOUT_408 = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\nconnection: close\r\n\r\n%s")
_TIMEOUT_BODY = (b'{"error":"request_timeout","message":"the request headers did not arrive '
                 b'in time","details":[]}')


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

    __slots__ = ("_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None

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
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:  # everything else is the real transport's
        return getattr(self._transport, name)


def guarded_protocol(guard: SlowClientGuard,
                     lane: FastLane | None = None) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol, with header deadlines enforced by ``guard``, each
    response written in one syscall (:class:`ResponseCork`), and — given ``lane`` — plain
    ingest POSTs answered by the fast lane (:mod:`ingestor.http_fast`) instead of an ASGI
    task."""

    class GuardedHttpToolsProtocol(HttpToolsProtocol):
        # the guard's clocks (see SlowClientGuard): waiting for headers since / idle since
        headers_since: float | None = None
        idle_since: float | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self.cork = ResponseCork(transport, self.loop)
            self.headers_since = self.loop.time()
            guard.watch(self)

        def on_message_begin(self) -> None:
            # uvicorn's also builds the ASGI scope, which the fast lane never needs: that
            # is left to _asgi_scope, for requests that take the ASGI path
            self.url = b""
            self.expect_100_continue = False
            self.headers = []
            self.idle_since = None
            if self.headers_since is None:  # kept when it already waits (see below)
                self.headers_since = self.loop.time()

        def _asgi_scope(self) -> None:
            url, headers, expect = self.url, self.headers, self.expect_100_continue
            super().on_message_begin()  # the scope, as uvicorn builds it
            self.url, self.expect_100_continue = url, expect
            self.headers = self.scope["headers"] = headers

        def on_headers_complete(self) -> None:
            self.headers_since = None
            cycle = self.cycle
            if lane is not None and (cycle is None or cycle.response_complete) \
                    and lane.begin(self, self.server_state.default_headers) is not None:
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
            cycle = self.cycle
            if type(cycle) is FastIngest:
                cycle.complete()
            else:
                super().on_message_complete()

        def on_response_complete(self) -> None:
            if self.pipeline or self.transport.is_closing():
                super().on_response_complete()  # starts the next pipelined request
                return
            # as uvicorn's, but idle connections are the guard's: no timer per request
            self.server_state.total_requests += 1
            self.flow.resume_reading()
            cycle = self.cycle
            if cycle is not None and cycle.more_body:  # answered; its body is still coming
                if self.headers_since is None:
                    self.headers_since = self.loop.time()
            else:
                self.idle_since = self.loop.time()

        def connection_lost(self, exc: Exception | None) -> None:
            guard.forget(self)
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

    return GuardedHttpToolsProtocol


def slow_client_guard(ing: IngestorSection) -> SlowClientGuard:
    return SlowClientGuard(ing.header_timeout_s, ing.body_timeout_s, ing.body_min_bytes_per_s,
                           keep_alive_s=ing.keep_alive_s)


def http_config(app: Any, ing: IngestorSection, guard: SlowClientGuard,
                tls: CertificateReloader | None = None, *,
                loop: str = "none") -> uvicorn.Config:
    """uvicorn settings of the HTTP front; serve with ``Server.serve(sockets=[...])``."""
    lane = FastLane(app) if isinstance(app, HttpApp) and ing.http_fast_lane else None
    config = uvicorn.Config(
        app, loop=loop, http=guarded_protocol(guard, lane), lifespan="off", access_log=False,
        log_level="warning", log_config=None,  # uvicorn's lines go through our redacting handler
        timeout_graceful_shutdown=int(ing.shutdown_timeout_s),
        timeout_keep_alive=ing.keep_alive_s,  # type: ignore[arg-type]
        proxy_headers=False, server_header=False,
        ssl_context_factory=None if tls is None else (lambda _config, _default:
                                                      tls.http_context))
    return config
