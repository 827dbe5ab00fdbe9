"""The typed client: instances of a model class sent to their stream.

Why a wrapper and not a new client: the transports, retries (duplicate-free by
idempotency key / request id), TLS and error mapping are :mod:`icefloe.client`'s; this adds
only the encoding (:meth:`~icefloe.pymodels.ModelStream.encode`) and the stream name, so a
producer cannot send an object of another class or a field the stream does not declare.
Refusals are :class:`~icefloe.client.IngestRejected` as the server worded them (HTTP status
or gRPC code, code, message, and per-event details naming the field).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Generic, Literal, TypeVar

from icefloe.client import GrpcClient, HttpClient

T = TypeVar("T")


class ModelClient(Generic[T]):
    """Sends instances of one model to stream ``stream`` over HTTP (default) or gRPC, each
    turned into its JSON by ``encode`` (:meth:`~icefloe.pymodels.ModelStream.encode`; made
    by :meth:`~icefloe.pymodels.ModelStream.client`). Use it as a context manager, or call
    :meth:`close`. Thread-safe (both transports are)."""

    def __init__(self, stream: str, encode: Callable[[T], bytes], url: str,
                 token: str | None = None, *, transport: Literal["http", "grpc"] = "http",
                 **options: Any) -> None:
        self.stream = stream
        self._encode = encode
        self.transport = transport
        self._http: HttpClient | None = None
        self._grpc: GrpcClient | None = None
        if transport == "http":
            self._http = HttpClient(url, token, **options)
        elif transport == "grpc":
            self._grpc = GrpcClient(url.removeprefix("grpc://"), token, **options)
        else:
            raise ValueError(f"transport {transport!r}: expected 'http' or 'grpc'")

    def send(self, event: T, *, idempotency_key: str | None = None) -> int:
        """Send one instance; returns 1 once it is durable.

        Raises:
            ModelError: a value no column can hold (naming the field), nothing sent.
            IngestRejected: the ingestor refused it (its message and details).
        """
        return self.send_many([event], idempotency_key=idempotency_key)

    def send_many(self, events: Iterable[T], *, idempotency_key: str | None = None) -> int:
        """Send the instances as one request (all accepted or none); returns how many are
        durable. ``idempotency_key`` (HTTP) or request id (gRPC) makes a retry of the same
        batch duplicate-free; one is made per call when left out."""
        payloads = [self._encode(event) for event in events]
        if not payloads:
            return 0
        if self._http is not None:
            return self._http.send(self.stream, payloads, idempotency_key)
        assert self._grpc is not None
        return self._grpc.publish(self.stream, payloads, idempotency_key)

    def close(self) -> None:
        if self._http is not None:
            self._http.close()
        if self._grpc is not None:
            self._grpc.close()

    def __enter__(self) -> ModelClient[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
