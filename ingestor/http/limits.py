"""The HTTP front's own limits (issue #29) as plain decisions, apart from the protocol.

Why apart: the uvicorn protocol (:mod:`ingestor.http.server`) is callbacks over a socket
and a parser; what it refuses, and with which answer, is a few comparisons. Here they are
functions of plain values — bytes counted, header fields, the HTTP version, the
Transfer-Encoding values, open connections — that a test calls without a server, and the
protocol calls them from its callbacks. Each returns ``None`` (go on) or the
:class:`Refusal` to answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, NamedTuple

import msgspec
from prometheus_client import Counter
from uvicorn.protocols.http.httptools_impl import STATUS_LINE

from icefloe.config import IngestorSection

HTTP2_PREFACE: Final = b"PRI * HTTP/2.0\r\n"
"""What an HTTP/2 client sends first (refused with 505 on this HTTP/1 port)."""


class Refusal(NamedTuple):
    """One refused request: its ``status``, the ``reason`` label it is counted under
    (``icefloe_ingest_http_refused_total{reason}``), and the JSON body's ``code`` and
    ``message``."""

    status: int
    reason: str
    code: str
    message: str


VERSION_REFUSAL: Final = Refusal(505, "http_version", "http_version_not_supported",
                                 "this port speaks HTTP/1.1 (and 1.0); HTTP/2 is served on "
                                 "the gRPC port only")
CODING_REFUSAL: Final = Refusal(501, "transfer_encoding", "unsupported_transfer_encoding",
                                "only Transfer-Encoding: chunked is supported; send "
                                "compressed bodies with Content-Encoding")


@dataclass(frozen=True)
class HttpLimits:
    """The HTTP front's own limits (``[ingestor]`` keys of the same names) and the counter
    of what they refused (``icefloe_ingest_http_refused_total{reason}``)."""

    max_header_bytes: int = 64 * 1024
    max_headers: int = 100
    max_connections: int = 10_000
    refused: Counter | None = None

    @classmethod
    def of(cls, ing: IngestorSection, refused: Counter | None = None) -> HttpLimits:
        return cls(ing.max_header_bytes, ing.max_headers, ing.max_connections, refused)

    def count(self, reason: str) -> None:
        if self.refused is not None:
            self.refused.labels(reason).inc()

    def too_many_connections(self, open_connections: int) -> bool:
        """Whether a connection just accepted, making ``open_connections``, is one too
        many (it is closed at once, counted as ``max_connections``)."""
        return open_connections > self.max_connections

    def head_refusal(self, head_bytes: int) -> Refusal | None:
        """431 once the request line and headers read so far exceed ``max_header_bytes``."""
        if head_bytes <= self.max_header_bytes:
            return None
        return Refusal(431, "header_bytes", "header_too_large",
                       f"the request line and headers exceed {self.max_header_bytes} bytes "
                       "(ingestor.max_header_bytes)")

    def header_count_refusal(self, count: int) -> Refusal | None:
        """431 for a header field beyond ``max_headers`` (``count``: the fields before it)."""
        if count < self.max_headers:
            return None
        return Refusal(431, "header_count", "too_many_headers",
                       f"the request has more than {self.max_headers} header fields "
                       "(ingestor.max_headers)")


def framing_refusal(version: str, codings: Sequence[bytes] | None) -> Refusal | None:
    """505 for an HTTP version other than 1.0/1.1; 501 for transfer codings (the values of
    every Transfer-Encoding field, None without one) other than a plain ``chunked``: a body
    framed as ``gzip, chunked`` would otherwise be read as if it were not compressed."""
    if version != "1.1" and version != "1.0":
        return VERSION_REFUSAL
    if codings is not None and [c.strip().lower() for c in b",".join(codings)
                                .split(b",")] != [b"chunked"]:
        return CODING_REFUSAL
    return None


def parse_error_refusal(data: bytes, error: Exception) -> Refusal:
    """What a request the parser gave up on gets: 505 for HTTP/2's preface, else 400
    ``malformed_request`` naming what the parser found (counted, never logged: a client's
    mistake must not flood the log)."""
    if data.startswith(HTTP2_PREFACE):
        return VERSION_REFUSAL
    found = str(error).strip() or type(error).__name__
    return Refusal(400, "malformed_request", "malformed_request",
                   f"the request is not valid HTTP/1.1 ({found[:120]})")


def refusal_response(status: int, code: str, message: str) -> bytes:
    """A whole HTTP/1.1 response: the JSON error body every refusal carries, and a close."""
    body = msgspec.json.encode({"error": code, "message": message, "details": []})
    return b"%scontent-type: application/json\r\ncontent-length: %d\r\nconnection: close" \
        b"\r\n\r\n%s" % (STATUS_LINE[status], len(body), body)
