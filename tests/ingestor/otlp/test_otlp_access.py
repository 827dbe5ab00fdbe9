"""Who may export where (issue #41): TLS and the plaintext rule on the OTLP ports, tokens
scoped to some kinds, ``otlp.kinds`` leaving kinds out, and browsers' CORS preflight."""

from __future__ import annotations

import asyncio

import grpc
import httpx
import msgspec
import pytest
from ingest_support import TOKEN, TOKEN_HASH
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from otel_sdk import export, record
from otlp_support import otlp_config, stored_rows
from security_support import Authority, ingestor

from icefloe.config import TokenConfig
from icefloe.errors import ConfigError
from icefloe.tokens import hash_token

GAUGE_TOKEN = "gauge-only-token"


async def test_should_refuse_plaintext_otlp_ports_off_loopback(tmp_path):
    config = otlp_config(tmp_path / "store", host="0.0.0.0", otlp_http_port=0)
    with pytest.raises(ConfigError) as info:
        async with ingestor(config):
            pytest.fail("an ingestor serving plaintext OTLP on 0.0.0.0 started")
    message = str(info.value)
    assert "refusing to serve 0.0.0.0 without TLS" in message
    assert "OTLP/HTTP port" in message
    assert "Authorization header" in message


async def test_should_serve_the_otlp_ports_over_tls(tmp_path, monkeypatch):
    for name in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):  # requests prefers them to the
        monkeypatch.delenv(name, raising=False)           # exporter's certificate_file
    authority = Authority.create(tmp_path, "otlp")
    cert, key = authority.write("localhost", server=True)
    config = otlp_config(tmp_path / "store", otlp_http_port=0, otlp_grpc_port=0,
                         tls_cert_file=str(cert), tls_key_file=str(key))
    async with ingestor(config) as ports:
        https = await asyncio.to_thread(
            export, "http", f"https://localhost:{ports.otlp_http}", TOKEN,
            record(logs=1, spans=1, tag="tls"), certificate_file=str(authority.ca_file))
        credentials = grpc.ssl_channel_credentials(authority.ca_file.read_bytes())
        over_grpc = await asyncio.to_thread(
            export, "grpc", f"localhost:{ports.otlp_grpc}", TOKEN,
            record(logs=1, spans=1, tag="tls-grpc"), credentials=credentials)
        with pytest.raises(httpx.HTTPError):  # plaintext on a TLS port gets nowhere
            async with httpx.AsyncClient() as client:
                await client.post(f"http://localhost:{ports.otlp_http}/v1/logs", content=b"")
    assert https == ("SUCCESS",) * 3
    assert over_grpc == ("SUCCESS",) * 3
    assert len((await stored_rows(config))["otlp.logs"]) == 2


def gauge_and_sum() -> bytes:
    request = metrics_service_pb2.ExportMetricsServiceRequest()
    scope = request.resource_metrics.add().scope_metrics.add()
    scope.metrics.add(name="temp").gauge.data_points.add(time_unix_nano=1, as_double=1.0)
    total = scope.metrics.add(name="orders").sum
    total.is_monotonic = True
    total.data_points.add(time_unix_nano=1, as_int=3)
    return request.SerializeToString()


def gauge_only() -> bytes:
    request = metrics_service_pb2.ExportMetricsServiceRequest()
    scope = request.resource_metrics.add().scope_metrics.add()
    scope.metrics.add(name="temp").gauge.data_points.add(time_unix_nano=1, as_double=1.0)
    return request.SerializeToString()


async def test_should_hold_a_token_scoped_to_some_kinds_to_them(tmp_path):
    """A ``[[tokens]]`` entry naming ``otlp.gauge`` writes gauges, nothing else: a metrics
    export that also carries a sum is refused whole (403), and logs are refused before
    their body is read."""
    base = otlp_config(tmp_path / "store", tokens=(TOKEN_HASH,))
    config = msgspec.structs.replace(base, tokens=(TokenConfig(
        "gauges", hash_token(GAUGE_TOKEN, log2_n=10), ("otlp.gauge",)),))
    headers = {"Authorization": f"Bearer {GAUGE_TOKEN}",
               "Content-Type": "application/x-protobuf"}
    async with ingestor(config) as ports, httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{ports.http}") as client:
        mixed = await client.post("/v1/metrics", content=gauge_and_sum(), headers=headers)
        logs = await client.post("/v1/logs", content=b"", headers=headers)
        gauges = await client.post("/v1/metrics", content=gauge_only(), headers=headers)
    assert mixed.status_code == 403
    assert logs.status_code == 403
    assert gauges.status_code == 200
    assert {stream: len(rows) for stream, rows in (await stored_rows(config)).items()} == {
        "otlp.gauge": 1}


async def test_should_refuse_kinds_the_section_leaves_out(tmp_path):
    config = otlp_config(tmp_path / "store", otlp={"kinds": ("logs", "gauge")})
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/x-protobuf"}
    async with ingestor(config) as ports, httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{ports.http}") as client:
        traces = await client.post("/v1/traces", content=b"", headers=headers)
        metrics = await client.post("/v1/metrics", content=gauge_and_sum(), headers=headers)
    assert traces.status_code == 404
    answer = metrics_service_pb2.ExportMetricsServiceResponse.FromString(metrics.content)
    assert answer.partial_success.rejected_data_points == 1
    assert "otlp.kinds leaves sum out" in answer.partial_success.error_message
    assert {stream: len(rows) for stream, rows in (await stored_rows(config)).items()} == {
        "otlp.gauge": 1}


async def test_should_answer_a_browsers_preflight(tmp_path):
    origin = "https://shop.example.com"
    config = otlp_config(tmp_path / "store", cors_origins=(origin,))
    async with ingestor(config) as ports, httpx.AsyncClient() as client:
        answer = await client.options(
            f"http://127.0.0.1:{ports.http}/v1/traces",
            headers={"Origin": origin, "Access-Control-Request-Method": "POST",
                     "Access-Control-Request-Headers": "content-type, authorization"})
    assert answer.status_code == 204
    assert answer.headers["access-control-allow-origin"] == origin
    assert "Authorization" in answer.headers["access-control-allow-headers"]
