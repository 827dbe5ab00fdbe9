"""Every way an ingest request can fail, with its HTTP status and gRPC code in one table.

Why one table: HTTP and gRPC clients must get the same answer for the same problem. Each
error carries a stable ``code`` (the JSON ``error`` field), a message that says what to do,
optional per-event ``details``, and ``retry_after_s`` for backpressure (429/503 with
``Retry-After``; gRPC RESOURCE_EXHAUSTED/UNAVAILABLE with a RetryInfo delay).
"""

from __future__ import annotations

from typing import Any

import grpc

from icefloe.errors import IcefloeError


class IngestError(IcefloeError):
    """A refused request. Nothing of it was accepted."""

    http_status = 500
    grpc_code = grpc.StatusCode.INTERNAL
    default_code = "internal"

    def __init__(self, message: str, *, code: str | None = None,
                 details: list[dict[str, Any]] | None = None,
                 retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code or self.default_code
        self.details = details or []
        self.retry_after_s = retry_after_s

    def body(self) -> dict[str, Any]:
        """The JSON error body: ``{"error": code, "message": ..., "details": [...]}``."""
        return {"error": self.code, "message": self.message, "details": self.details}


class BadRequest(IngestError):
    """Malformed JSON or failed validation (details: index, field, reason per event)."""

    http_status = 400
    grpc_code = grpc.StatusCode.INVALID_ARGUMENT
    default_code = "validation_failed"


class Unauthenticated(IngestError):
    http_status = 401
    grpc_code = grpc.StatusCode.UNAUTHENTICATED
    default_code = "unauthenticated"


class PermissionDenied(IngestError):
    http_status = 403
    grpc_code = grpc.StatusCode.PERMISSION_DENIED
    default_code = "permission_denied"


class UnknownStream(IngestError):
    http_status = 404
    grpc_code = grpc.StatusCode.NOT_FOUND
    default_code = "unknown_stream"


class NotFoundRoute(IngestError):
    http_status = 404
    grpc_code = grpc.StatusCode.UNIMPLEMENTED
    default_code = "not_found"


class MethodNotAllowed(IngestError):
    http_status = 405
    grpc_code = grpc.StatusCode.UNIMPLEMENTED
    default_code = "method_not_allowed"


class RequestTimeout(IngestError):
    """An HTTP body arrived too slowly (slow-loris defence); the connection is closed."""

    http_status = 408
    grpc_code = grpc.StatusCode.DEADLINE_EXCEEDED
    default_code = "request_timeout"


class PayloadTooLarge(IngestError):
    """Body (after decompression) or one event exceeds its configured limit."""

    http_status = 413
    grpc_code = grpc.StatusCode.INVALID_ARGUMENT
    default_code = "payload_too_large"


class UnsupportedMediaType(IngestError):
    http_status = 415
    grpc_code = grpc.StatusCode.INVALID_ARGUMENT
    default_code = "unsupported_media_type"


class Overloaded(IngestError):
    """Back off and retry: the buffer or the manifest queue is full, or a rate limit
    (``rate_limited``) or the token verifier (``auth_busy``) says slow down."""

    http_status = 429
    grpc_code = grpc.StatusCode.RESOURCE_EXHAUSTED
    default_code = "buffer_full"


class Unavailable(IngestError):
    """The store is unreachable or the flush failed: the events were NOT acknowledged.

    ``may_be_stored``: the flush failed in a way that may still have stored them (it timed
    out, or a write's answer was lost), so a retry may store them again. Not acknowledged
    either way; only a protocol that tells the two apart says so (Kafka: a request timeout,
    "possibly persisted", rather than "nothing was written")."""

    http_status = 503
    grpc_code = grpc.StatusCode.UNAVAILABLE
    default_code = "store_unavailable"

    def __init__(self, message: str, *, code: str | None = None,
                 details: list[dict[str, Any]] | None = None,
                 retry_after_s: float | None = None, may_be_stored: bool = False) -> None:
        super().__init__(message, code=code, details=details, retry_after_s=retry_after_s)
        self.may_be_stored = may_be_stored

    def body(self) -> dict[str, Any]:
        """The error body plus ``may_be_stored``: a client that resends without an
        idempotency key or event ids learns whether the resend may store the events twice."""
        return {**super().body(), "may_be_stored": self.may_be_stored}
