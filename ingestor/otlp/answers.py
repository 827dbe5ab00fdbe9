"""What an OTLP exporter is answered, in the encoding it sent.

Why these shapes (OTLP specification, "OTLP/HTTP Response"): success is the signal's
``Export*ServiceResponse``, whose ``partial_success`` carries the count of records or points
the server refused and why (a refusal an exporter must not retry); a failure carries a
``google.rpc.Status`` whose code is the gRPC code of the same failure, so an HTTP and a gRPC
exporter learn the same thing. Both travel in the request's own encoding: protobuf for
``application/x-protobuf``, OTLP/JSON for ``application/json``.
"""

from __future__ import annotations

from typing import Final

from google.protobuf import json_format
from google.protobuf.message import Message
from google.rpc import status_pb2

from ingestor.errors import IngestError
from ingestor.otlp.decode import Signal

__all__ = ["JSON", "PROTOBUF", "export_response", "status_body", "success_body"]

PROTOBUF: Final = b"application/x-protobuf"
JSON: Final = b"application/json"


def export_response(signal: Signal, rejected: int, message: str) -> Message:
    """The signal's ``Export*ServiceResponse``: empty when everything was taken, else a
    ``partial_success`` with the rejected count and the reason."""
    response = signal.response()
    if rejected or message:
        partial = response.partial_success  # type: ignore[attr-defined]
        setattr(partial, signal.rejected_field, rejected)
        partial.error_message = message
    return response


def success_body(signal: Signal, rejected: int, message: str, json: bool) -> bytes:
    """:func:`export_response` encoded as the request was."""
    return encode(export_response(signal, rejected, message), json)


def status_body(error: IngestError, json: bool) -> bytes:
    """A ``google.rpc.Status`` with the error's gRPC code and message, encoded as the request
    was (no details: OTLP/HTTP carries the retry delay in ``Retry-After``)."""
    status = status_pb2.Status(code=error.grpc_code.value[0], message=error.message)
    return encode(status, json)


def encode(message: Message, json: bool) -> bytes:
    if not json:
        return message.SerializeToString()
    return json_format.MessageToJson(message, indent=None).encode()
