"""OTLP/gRPC: the ``Export`` methods of ``LogsService``, ``TraceService`` and
``MetricsService`` on the ingestor's gRPC server.

Why registered by hand rather than through the generated ``add_*Servicer_to_server``: the
request deserializer keeps the message's bytes. The event ids are derived from exactly the
bytes the exporter sent (a retry sends the same bytes: :mod:`ingestor.otlp.admit`), and a
message that does not parse is refused with INVALID_ARGUMENT and a reason, not the UNKNOWN
grpc gives a deserializer that raises.

Answers (OTLP specification, "OTLP/gRPC Response"): the ``Export*ServiceResponse``
(``partial_success`` when records could not become rows) once every row is durable; else
the failure's status with the rich details of the other gRPC front
(:func:`ingestor.grpc_app.error_status`): INVALID_ARGUMENT (malformed; not retried),
UNAUTHENTICATED / PERMISSION_DENIED (token), UNIMPLEMENTED (OTLP off), and
RESOURCE_EXHAUSTED / UNAVAILABLE with ``google.rpc.RetryInfo`` on backpressure (exporters
retry those after the delay). The ``authorization`` metadata carries ``Bearer <token>``.
"""

from __future__ import annotations

import logging
import time
from typing import Final

import grpc
from google.protobuf.message import Message
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from ingestor.errors import IngestError
from ingestor.grpc_app import (
    MAX_TRAILER_DETAILS_BYTES,
    bearer_token,
    client_address,
    error_status,
)
from ingestor.otlp.admit import OtlpAdmission
from ingestor.otlp.answers import export_response
from ingestor.otlp.decode import SIGNALS, Signal
from ingestor.runtime import IngestorRuntime

__all__ = ["SERVICES", "TRANSPORT", "OtlpExport", "add_otlp_services"]

TRANSPORT: Final = "otlp_grpc"
SERVICES: Final = {
    "logs": logs_service_pb2.DESCRIPTOR.services_by_name["LogsService"].full_name,
    "traces": trace_service_pb2.DESCRIPTOR.services_by_name["TraceService"].full_name,
    "metrics": metrics_service_pb2.DESCRIPTOR.services_by_name["MetricsService"].full_name,
}
"""Signal -> the full name of its OTLP collector service (each has one method, Export)."""
RETRY_INFO_TRAILER: Final = "google.rpc.retryinfo-bin"
log = logging.getLogger("icefloe.ingestor.otlp")


def _raw(data: bytes) -> bytes:
    return data


def _serialize(message: Message) -> bytes:
    return message.SerializeToString()


class OtlpExport:
    """The three Export methods over one runtime (asyncio, one loop)."""

    def __init__(self, runtime: IngestorRuntime) -> None:
        self.service = runtime.service
        self.metrics = runtime.metrics
        self.admission = OtlpAdmission(runtime.service, runtime.config)
        self.retry_after_s: float = runtime.config.ingestor.retry_after_s
        self.ack_seconds = runtime.metrics.ack_seconds.labels(TRANSPORT)

    def handler(self, signal: Signal) -> grpc.RpcMethodHandler:
        async def export(data: bytes, context: grpc.aio.ServicerContext) -> Message:
            return await self.export(signal, data, context)
        return grpc.unary_unary_rpc_method_handler(
            export, request_deserializer=_raw, response_serializer=_serialize)

    async def export(self, signal: Signal, data: bytes, context: grpc.aio.ServicerContext
                     ) -> Message:
        """One Export call: the response once durable, or the failure's status."""
        started = time.perf_counter()
        labels = self.admission.labels(signal.name) or ["-"]
        events = 1
        try:
            authorized = await self.admission.authorize(
                signal.name, bearer_token(context.invocation_metadata()),
                client_address(context, self.service.proxies))
            rows = self.admission.protobuf_rows(signal, data)
            events = max(1, sum(map(len, rows.rows.values())))
            admitted = self.admission.admit(rows, data, authorized)
            await admitted.settle(self.service)
        except IngestError as error:
            return self._refuse(context, signal, error, labels[0], events)
        except Exception:  # a bug must not leave the exporter without an answer
            log.exception("OTLP/gRPC %s export failed unexpectedly", signal.name)
            internal = IngestError("internal error; the ingestor logged it; nothing was "
                                   "acknowledged")
            return self._refuse(context, signal, internal, labels[0], events)
        self.ack_seconds.observe(time.perf_counter() - started)
        for stream in list(admitted.counts) or labels[:1]:
            self.metrics.requests.labels(TRANSPORT, stream, grpc.StatusCode.OK.name).inc()
        return export_response(signal, admitted.rejected, admitted.message)

    def _refuse(self, context: grpc.aio.ServicerContext, signal: Signal, error: IngestError,
                stream: str, events: int) -> Message:
        """Set the call's status (the returned message is never sent; see
        :func:`ingestor.grpc_app._failed` for why not ``abort``)."""
        self.service.reject(stream, error, events)
        self.metrics.requests.labels(TRANSPORT, stream, error.grpc_code.name).inc()
        status = error_status(error, retry_after_s=self.retry_after_s,
                              max_details_bytes=MAX_TRAILER_DETAILS_BYTES)
        set_status(context, status)
        return signal.response()


def set_status(context: grpc.aio.ServicerContext, status: status_pb2.Status) -> None:
    """A ``google.rpc.Status`` as the call's final status, code, message and details.

    Why the RetryInfo twice: the standard place is among the status details
    (``grpc-status-details-bin``), where the OpenTelemetry Collector's exporter reads it;
    the Python SDK's exporter reads a ``google.rpc.retryinfo-bin`` trailer instead."""
    final = rpc_status.to_status(status)
    trailers = tuple(final.trailing_metadata)
    for detail in status.details:
        if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            trailers += ((RETRY_INFO_TRAILER, detail.value),)
    context.set_code(final.code)
    context.set_details(final.details)
    context.set_trailing_metadata(trailers)


def add_otlp_services(runtime: IngestorRuntime, server: grpc.aio.Server) -> list[str]:
    """Register the three OTLP services on ``server`` (before it starts); their names."""
    export = OtlpExport(runtime)
    for name, signal in SIGNALS.items():
        handlers = {"Export": export.handler(signal)}
        service = SERVICES[name]
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(service, handlers),))
        server.add_registered_method_handlers(service, handlers)
    return list(SERVICES.values())
