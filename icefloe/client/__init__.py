"""The ingest API's typed clients (HTTP and gRPC), retrying only what is safe.

``from icefloe.client import HttpClient`` is the public path; :mod:`icefloe.client.ingest`
holds the clients and the retry rules, :mod:`icefloe.client.tls` the TLS settings.
"""

from icefloe.client.ingest import (
    AsyncGrpcClient,
    AsyncHttpClient,
    Backoff,
    ClientTls,
    EventLike,
    GrpcClient,
    HttpClient,
    IngestRejected,
    new_key,
    response_error,
)

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
