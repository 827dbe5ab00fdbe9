"""OTLP receivers driven by the OpenTelemetry Python SDK's real exporters (issue #41).

Logs, spans and metric points go through ``opentelemetry-exporter-otlp-proto-http`` and
``-grpc`` into an in-process ingestor — on its own HTTP and gRPC ports and on the dedicated
OTLP ports — and are read back from the batch files the ingestor made durable: one row per
log record, span and data point, in the kind's stream, with ids derived from the request.
OTLP/JSON (hex ids) and partial success are posted by hand: the SDK sends neither.
"""

from __future__ import annotations

import asyncio
import gzip
import json

import grpc
import httpx
import pytest
from ingest_support import TOKEN
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from otel_sdk import SERVICE, export, record
from otlp_support import otlp_config, stored_rows
from security_support import ingestor

TRACE = "5b8efff798038103d269b633813fc60c"


def endpoint(transport: str, ports: object, dedicated: bool) -> str:
    if transport == "http":
        port = ports.otlp_http if dedicated else ports.http  # type: ignore[attr-defined]
        return f"http://127.0.0.1:{port}"
    port = ports.otlp_grpc if dedicated else ports.grpc  # type: ignore[attr-defined]
    return f"127.0.0.1:{port}"


@pytest.mark.parametrize("transport", ["http", "grpc"])
@pytest.mark.parametrize("dedicated", [False, True], ids=["shared-port", "otlp-port"])
async def test_should_store_every_signal_from_the_sdk_exporters(tmp_path, transport, dedicated):
    config = otlp_config(tmp_path / "store", otlp_http_port=0, otlp_grpc_port=0)
    telemetry = record(logs=3, spans=2)
    async with ingestor(config) as ports:
        assert ports.otlp_http
        assert ports.otlp_grpc
        results = await asyncio.to_thread(export, transport, endpoint(transport, ports, dedicated),
                                          TOKEN, telemetry)
    assert results == ("SUCCESS", "SUCCESS", "SUCCESS")
    rows = await stored_rows(config)
    assert {stream: len(found) for stream, found in rows.items()} == {
        "otlp.logs": 3, "otlp.spans": 4, "otlp.sum": 1, "otlp.gauge": 1, "otlp.histogram": 1,
        "otlp.exponential_histogram": 1}
    logs = [row for _, row in rows["otlp.logs"]]
    assert sorted(row["body"] for row in logs) == [f"payment failed {i}" for i in range(3)]
    assert {(row["severity_number"], row["trace_id"], row["service_name"]) for row in logs} == {
        (17, TRACE, SERVICE)}
    spans = {row["name"]: row for _, row in rows["otlp.spans"]}
    assert spans["GET /cart/0"]["kind"] == "SERVER"
    assert spans["GET /cart/0"]["status_code"] == "ERROR"
    assert spans["SELECT cart"]["parent_span_id"] in {s["span_id"] for s in spans.values()}
    assert rows["otlp.sum"][0][1]["metric_name"] == "orders"
    assert rows["otlp.histogram"][0][1]["count"] == 3
    for stream, found in rows.items():
        kind = stream.removeprefix("otlp.")
        ids = [event_id for event_id, _ in found]
        stem = ids[0].rsplit(":", 1)[0]
        assert stem.startswith(f"otlp:{kind}:")
        assert len(stem.split(":")[2]) == 32
        assert ids == [f"{stem}:{i}" for i in range(len(ids))]


@pytest.mark.parametrize("transport", ["http", "grpc"])
async def test_should_take_gzip_compressed_exports(tmp_path, transport):
    config = otlp_config(tmp_path / "store")
    compression = Compression.Gzip if transport == "http" else grpc.Compression.Gzip
    async with ingestor(config) as ports:
        results = await asyncio.to_thread(export, transport, endpoint(transport, ports, False),
                                          TOKEN, record(logs=5, spans=1),
                                          compression=compression)
    assert results == ("SUCCESS", "SUCCESS", "SUCCESS")
    rows = await stored_rows(config)
    assert len(rows["otlp.logs"]) == 5
    assert len(rows["otlp.spans"]) == 2


def json_logs(*bodies: str) -> bytes:
    return json.dumps({"resourceLogs": [{
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "web"}}]},
        "scopeLogs": [{"scope": {"name": "js"}, "logRecords": [
            {"timeUnixNano": "1764680000000000000", "severityNumber": 13, "traceId": TRACE,
             "spanId": "eee19b7ec3c1b174", "body": {"stringValue": body},
             "attributes": [{"key": "n", "value": {"intValue": "7"}}]}
            for body in bodies]}]}]}).encode()


async def test_should_take_otlp_json_with_hex_ids_and_answer_json(tmp_path):
    config = otlp_config(tmp_path / "store")
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    async with ingestor(config) as ports, httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{ports.http}") as client:
        plain = await client.post("/v1/logs", content=json_logs("a", "b"), headers=headers)
        zipped = await client.post("/v1/logs", content=gzip.compress(json_logs("c")),
                                   headers={**headers, "Content-Encoding": "gzip"})
    for answer in (plain, zipped):
        assert answer.status_code == 200, answer.text
        assert answer.headers["content-type"] == "application/json"
        assert answer.json() == {}
    rows = [row for _, row in (await stored_rows(config))["otlp.logs"]]
    assert [row["body"] for row in rows] == ["a", "b", "c"]
    assert {(row["trace_id"], row["span_id"], row["severity_number"]) for row in rows} == {
        (TRACE, "eee19b7ec3c1b174", 13)}


def metrics_with_an_empty_metric() -> metrics_service_pb2.ExportMetricsServiceRequest:
    """A gauge point, a summary point, and a metric with no data (it cannot become a row)."""
    request = metrics_service_pb2.ExportMetricsServiceRequest()
    scope = request.resource_metrics.add().scope_metrics.add()
    gauge = scope.metrics.add(name="temp")
    gauge.gauge.data_points.add(time_unix_nano=1764680000000000000, as_double=21.5)
    summary = scope.metrics.add(name="rpc.latency")
    point = summary.summary.data_points.add(time_unix_nano=1764680000000000000, count=2, sum=3)
    point.quantile_values.add(quantile=0.5, value=1.0)
    scope.metrics.add(name="empty")
    return request


async def test_should_answer_partial_success_for_points_that_cannot_be_rows(tmp_path):
    config = otlp_config(tmp_path / "store")
    request = metrics_with_an_empty_metric()
    async with ingestor(config) as ports:
        async with httpx.AsyncClient() as client:
            answer = await client.post(
                f"http://127.0.0.1:{ports.http}/v1/metrics", content=request.SerializeToString(),
                headers={"Authorization": f"Bearer {TOKEN}",
                         "Content-Type": "application/x-protobuf"})
        async with grpc.aio.insecure_channel(f"127.0.0.1:{ports.grpc}") as channel:
            stub = metrics_service_pb2_grpc.MetricsServiceStub(channel)
            via_grpc = await stub.Export(request, metadata=[("authorization", f"Bearer {TOKEN}")])
    assert answer.status_code == 200
    assert answer.headers["content-type"] == "application/x-protobuf"
    via_http = metrics_service_pb2.ExportMetricsServiceResponse.FromString(answer.content)
    for response in (via_http, via_grpc):
        assert response.partial_success.rejected_data_points == 1
        assert "empty" in response.partial_success.error_message
    rows = await stored_rows(config)
    assert [row["metric_name"] for _, row in rows["otlp.gauge"]] == ["temp", "temp"]
    assert [row["count"] for _, row in rows["otlp.summary"]] == [2, 2]


async def test_should_answer_an_empty_export_with_success_and_store_nothing(tmp_path):
    config = otlp_config(tmp_path / "store")
    async with ingestor(config) as ports, httpx.AsyncClient() as client:
        answer = await client.post(
            f"http://127.0.0.1:{ports.http}/v1/traces", content=b"",
            headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/x-protobuf"})
        metrics = (await client.get(f"http://127.0.0.1:{ports.http}/metrics")).text
    assert answer.status_code == 200
    assert answer.content == b""
    assert await stored_rows(config) == {}
    assert 'icefloe_ingest_requests_total{status="200",stream="otlp.spans",transport="otlp_http"}' \
        ' 1.0' in metrics


