"""Telemetry made by the OpenTelemetry Python SDK and sent by its real OTLP exporters.

Why in-memory first, then ``exporter.export(...)``: the SDK's processors and readers hide
an export's outcome (a batch processor logs it); calling the real exporter on what the SDK
recorded gives the outcome (SUCCESS or FAILURE, after the exporter's own retries) to assert
on, with exactly the bytes, headers, compression and retry logic the SDK uses in production.
The exporters block: call these from a thread (``asyncio.to_thread``) when the ingestor runs
in the test's event loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from opentelemetry._logs import LogRecord, SeverityNumber
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.metrics.view import ExponentialBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode

SERVICE = "checkout"
RESOURCE = Resource.create({"service.name": SERVICE, "deployment.environment": "test"})


@dataclass(frozen=True)
class Telemetry:
    """What the SDK recorded, ready for the exporters."""

    logs: list[Any]
    spans: list[Any]
    metrics: Any
    """``MetricsData``: a counter (sum), a gauge, a histogram, an exponential histogram."""


def record(logs: int = 3, spans: int = 2, tag: str = "") -> Telemetry:
    """Log records, spans (a server span with a child) and metric points from the SDK."""
    span_exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider(resource=RESOURCE)
    tracer_provider.add_span_processor(SimpleSpanProcessor(span_exporter))
    tracer = tracer_provider.get_tracer("icefloe.tests", "1.0")
    for i in range(spans):
        with tracer.start_as_current_span(f"GET /cart/{tag}{i}", kind=SpanKind.SERVER,
                                          attributes={"http.route": "/cart", "i": i}) as span:
            span.add_event("cache miss", {"key": f"k{i}"})
            with tracer.start_as_current_span("SELECT cart"):
                pass
            span.set_status(Status(StatusCode.ERROR, "boom"))
    log_exporter = InMemoryLogRecordExporter()
    logger_provider = LoggerProvider(resource=RESOURCE)
    logger_provider.add_log_record_processor(SimpleLogRecordProcessor(log_exporter))
    logger = logger_provider.get_logger("icefloe.tests.logs")
    for i in range(logs):
        logger.emit(LogRecord(body=f"payment failed {tag}{i}", severity_text="ERROR",
                              severity_number=SeverityNumber.ERROR,
                              trace_id=0x5B8EFFF798038103D269B633813FC60C,
                              span_id=0xEEE19B7EC3C1B174 + i,
                              attributes={"attempt": i, "user": "zoë"}))
    return Telemetry(log_exporter.get_finished_logs(), list(span_exporter.get_finished_spans()),
                     _metrics(tag))


def _metrics(tag: str) -> Any:
    reader = InMemoryMetricReader()
    provider = MeterProvider(resource=RESOURCE, metric_readers=[reader], views=[
        View(instrument_name="latency.exp", aggregation=ExponentialBucketHistogramAggregation())])
    meter = provider.get_meter("icefloe.tests.metrics")
    meter.create_counter("orders").add(3, {"tag": tag})
    meter.create_gauge("queue.depth").set(7, {"tag": tag})
    histogram = meter.create_histogram("latency", unit="ms")
    exponential = meter.create_histogram("latency.exp", unit="ms")
    for value in (1.0, 12.5, 130.0):
        histogram.record(value, {"tag": tag})
        exponential.record(value, {"tag": tag})
    return reader.get_metrics_data()


def exporters(transport: str, endpoint: str, token: str | None, **options: Any
              ) -> tuple[Any, Any, Any]:
    """The SDK's OTLP (log, span, metric) exporters for ``transport`` ("http" or "grpc").

    ``endpoint``: the base URL (``http://127.0.0.1:4318``) for HTTP, ``127.0.0.1:4317`` for
    gRPC. ``options`` go to each exporter (``compression``, ``timeout``; gRPC
    ``credentials`` for TLS, else the channel is plaintext)."""
    headers = {"authorization": f"Bearer {token}"} if token else None
    if transport == "http":
        from opentelemetry.exporter.otlp.proto.http import (  # lazy: the test's transport
            _log_exporter,
            metric_exporter,
            trace_exporter,
        )
        return (_log_exporter.OTLPLogExporter(endpoint=f"{endpoint}/v1/logs", headers=headers,
                                              **options),
                trace_exporter.OTLPSpanExporter(endpoint=f"{endpoint}/v1/traces",
                                                headers=headers, **options),
                metric_exporter.OTLPMetricExporter(endpoint=f"{endpoint}/v1/metrics",
                                                   headers=headers, **options))
    from opentelemetry.exporter.otlp.proto.grpc import (  # lazy: the test's transport
        _log_exporter as grpc_logs,
    )
    from opentelemetry.exporter.otlp.proto.grpc import metric_exporter as grpc_metrics
    from opentelemetry.exporter.otlp.proto.grpc import trace_exporter as grpc_traces
    options.setdefault("insecure", "credentials" not in options)  # TLS with credentials
    return (grpc_logs.OTLPLogExporter(endpoint=endpoint, headers=headers, **options),
            grpc_traces.OTLPSpanExporter(endpoint=endpoint, headers=headers, **options),
            grpc_metrics.OTLPMetricExporter(endpoint=endpoint, headers=headers, **options))


def export(transport: str, endpoint: str, token: str | None, telemetry: Telemetry,
           **options: Any) -> tuple[str, str, str]:
    """Export ``telemetry`` with fresh exporters; each signal's result name (``SUCCESS`` or
    ``FAILURE``)."""
    logs, spans, metrics = exporters(transport, endpoint, token, **options)
    try:
        return (logs.export(telemetry.logs).name, spans.export(telemetry.spans).name,
                metrics.export(telemetry.metrics).name)
    finally:
        for exporter in (logs, spans):
            exporter.shutdown()
        metrics.shutdown(timeout_millis=1000)
