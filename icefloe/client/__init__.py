"""The ingest API's typed clients (HTTP and gRPC), retrying only what is safe.

``from icefloe.client import HttpClient`` is the public path. Inside:
:mod:`~icefloe.client.http` (``HttpClient``, ``AsyncHttpClient``),
:mod:`~icefloe.client.grpc` (``GrpcClient``, ``AsyncGrpcClient``, ``response_error``),
:mod:`~icefloe.client.retry` (the refusal, the backoff and why retries are duplicate-free)
and :mod:`~icefloe.client.tls` (the TLS settings).
"""

from icefloe.client.grpc import AsyncGrpcClient, GrpcClient, response_error
from icefloe.client.http import AsyncHttpClient, HttpClient
from icefloe.client.retry import Backoff, EventLike, IngestRejected, new_key
from icefloe.client.tls import ClientTls

__all__ = [
    "AsyncGrpcClient",
    "AsyncHttpClient",
    "Backoff",
    "ClientTls",
    "EventLike",
    "GrpcClient",
    "HttpClient",
    "IngestRejected",
    "new_key",
    "response_error",
]
