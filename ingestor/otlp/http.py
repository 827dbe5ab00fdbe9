"""OTLP/HTTP: ``POST /v1/logs``, ``/v1/traces``, ``/v1/metrics`` on the ingestor's HTTP app.

Why inside the HTTP app rather than a server of its own: the OTLP paths share everything
the other routes have — the HTTP limits of the protocol, the slow-client guard, bounded
decompression, the client address behind trusted proxies, CORS — so they are routes of
:class:`~ingestor.http.app.HttpApp`, served on the ingestor's HTTP port and, when
``[ingestor] otlp_http_port`` is set, on that port too (the same server listens on both).

Answers (OTLP specification, "OTLP/HTTP Response"), in the request's encoding
(:mod:`ingestor.otlp.answers`): 200 with the ``Export*ServiceResponse`` (``partial_success``
when records could not become rows) once every row is durable; else a ``google.rpc.Status``
with 400 (malformed, not retried), 401/403 (token), 404 (path, or OTLP off), 405, 408, 413
(over ``ingestor.max_body_bytes``, compressed or not), 415 (content type or encoding), and
429/503 with ``Retry-After`` (backpressure, store down: exporters retry those).

The order of checks keeps refusals cheap, as on the other routes: method, content type,
token and rate limits, content encoding and declared length — all before a byte of the
body is read.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Final

from ingestor.errors import (
    IngestError,
    MethodNotAllowed,
    NotFoundRoute,
    PayloadTooLarge,
    UnsupportedMediaType,
)
from ingestor.http.inflate import Inflater
from ingestor.http.steps import CLIENT_GONE_STATUS, ClientGone, Headers, IngestSteps, Request
from ingestor.otlp.admit import OtlpAdmission
from ingestor.otlp.answers import JSON, PROTOBUF, status_body, success_body
from ingestor.otlp.decode import Signal, parse_json

__all__ = ["TRANSPORT", "OtlpHttp", "media_type"]

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ReadBody = Callable[[Receive, Inflater | None], Awaitable[bytes]]
"""The app's bounded, slow-client-guarded body read (:meth:`HttpApp.read_body`)."""

TRANSPORT: Final = "otlp_http"
"""The ``transport`` label of this front's requests and acks."""
_PROTOBUF_TYPES: Final = frozenset({PROTOBUF, b"application/protobuf"})
_ALLOW: Final = b"OPTIONS, POST"
log = logging.getLogger("icefloe.ingestor.otlp")


def media_type(value: bytes | None) -> bytes:
    """A Content-Type without its parameters, lower case (b"" when absent)."""
    return b"" if value is None else value.split(b";", 1)[0].strip().lower()


class OtlpHttp:
    """The OTLP routes of one HTTP app (one per process): its steps (CORS, client address,
    limits) and its body read."""

    def __init__(self, app: IngestSteps, read_body: ReadBody, admission: OtlpAdmission
                 ) -> None:
        self.app = app
        self.read_body = read_body
        self.admission = admission
        self.service = app.service
        self.metrics = app.metrics
        self.ack_seconds = app.metrics.ack_seconds.labels(TRANSPORT)

    async def handle(self, scope: Scope, receive: Receive, send: Send, signal: Signal) -> None:
        """Answer one request to a signal's path (POST; OPTIONS is the app's preflight)."""
        request = Request(scope["headers"])
        json = media_type(request.content_type) == JSON
        cors = self.app.cors(request.origin)
        labels = self.admission.labels(signal.name) or ["-"]
        if scope["method"] != "POST":
            error = MethodNotAllowed(f"{scope['method']} is not allowed on {scope['path']}; "
                                     "OTLP/HTTP exports are POSTed")
            await self._refuse(send, error, json, [(b"allow", _ALLOW), *cors], labels[0], 1)
            return
        started = time.perf_counter()
        try:
            admitted_counts, rejected, message = await self._export(scope, receive, request,
                                                                    signal, json)
        except IngestError as error:
            await self._refuse(send, error, json, cors, labels[0], request.count)
            return
        except ClientGone:
            self._count(labels[0], CLIENT_GONE_STATUS)
            return
        except Exception:  # a bug must cost one request a 500, never the server
            log.exception("unexpected error in POST %s", scope["path"])
            internal = IngestError("internal error; the ingestor logged it; nothing was "
                                   "acknowledged")
            await self._refuse(send, internal, json, cors, labels[0], request.count)
            return
        self.ack_seconds.observe(time.perf_counter() - started)
        body = success_body(signal, rejected, message, json)
        await self._send(send, 200, body, json, cors)
        for stream in admitted_counts or labels[:1]:
            self._count(stream, 200)

    async def _export(self, scope: Scope, receive: Receive, request: Request, signal: Signal,
                      json: bool) -> tuple[list[str], int, str]:
        """Check, read, decode, admit and wait: the streams written, the rejected count and
        the partial-success message."""
        content = media_type(request.content_type)
        if not json and content not in _PROTOBUF_TYPES:
            raise UnsupportedMediaType(
                f"Content-Type {content.decode('latin-1')!r} is not OTLP/HTTP; send "
                "application/x-protobuf or application/json")
        client = self.app.client_address(scope.get("client"), request)
        authorized = await self.admission.authorize(signal.name, request.token(), client)
        inflater = None if request.content_encoding is None \
            else self.app.inflater(request.content_encoding)
        declared, limit = request.declared_length(), self.app.max_body_bytes
        if declared is not None and declared > limit:
            raise PayloadTooLarge(f"Content-Length {declared} exceeds the {limit}-byte limit "
                                  "(ingestor.max_body_bytes); lower the exporter's batch size")
        body = await self.read_body(receive, inflater)
        rows = self.admission.rows(signal.name, parse_json(signal, body)) if json \
            else self.admission.protobuf_rows(signal, body)
        request.count = max(1, sum(map(len, rows.rows.values())))
        admitted = self.admission.admit(rows, body, authorized)
        await admitted.settle(self.service)
        return list(admitted.counts), admitted.rejected, admitted.message

    async def unknown_path(self, scope: Scope, send: Send) -> None:
        """404 for a path under ``/v1/`` that no route serves, as OTLP answers it."""
        request = Request(scope["headers"])
        error = NotFoundRoute(f"no route {scope['method']} {scope['path']}; OTLP/HTTP exports "
                              "go to /v1/logs, /v1/traces and /v1/metrics, icefloe events to "
                              "/v1/streams/{stream}/events")
        await self._refuse(send, error, media_type(request.content_type) == JSON,
                           self.app.cors(request.origin), "-", 1)

    async def _refuse(self, send: Send, error: IngestError, json: bool, extra: Headers,
                      stream: str, events: int) -> None:
        """A ``google.rpc.Status`` answer, counted (``Retry-After`` on 429/503)."""
        self.service.reject(stream, error, events)
        headers = list(extra)
        if error.http_status in (429, 503):
            delay = error.retry_after_s if error.retry_after_s is not None \
                else self.app.retry_after_s
            headers.append((b"retry-after", str(max(1, math.ceil(delay))).encode()))
        if error.http_status == 408:
            headers.append((b"connection", b"close"))
        await self._send(send, error.http_status, status_body(error, json), json, headers)
        self._count(stream, error.http_status)

    @staticmethod
    async def _send(send: Send, status: int, body: bytes, json: bool, extra: Headers) -> None:
        headers = [(b"content-type", JSON if json else PROTOBUF), *extra,
                   (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    def _count(self, stream: str, status: int) -> None:
        self.metrics.requests.labels(TRANSPORT, stream, str(status)).inc()
