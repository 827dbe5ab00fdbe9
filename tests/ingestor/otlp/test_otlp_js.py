"""The OpenTelemetry JavaScript SDK's OTLP exporters against a real ingestor (issue #41, "Real
clients"): logs, spans and metric points over OTLP/HTTP JSON, OTLP/HTTP protobuf and
OTLP/gRPC, read back from the batch files the ingestor made durable.

Why Node's exporters beside the Python SDK's (tests/ingestor/otlp/): they are a second,
independent implementation of the wire format — OTLP/JSON with integer attributes as JSON
numbers and hex ids, every counter as a double, their own gzip, headers and retry rules — and
a receiver that only agrees with one SDK is not an OTLP endpoint. The exporters run in a Node
process (tests/otel_js_support.py) while the ingestor serves in this test's event loop.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from ingest_support import TOKEN, stored_events
from otel_js_support import PROTOCOLS, SIGNALS, JsExport, export_async
from otlp_support import otlp_config
from security_support import ingestor

from icefloe.config import Config
from icefloe.formats.envelope import Envelope
from ingestor.server import BoundPorts

COUNT = 12
SERVICE = "js-checkout"


def js_config(store: Path) -> Config:
    """An ingestor with ``[otlp]`` on (every kind, TOKEN) and OTLP's own ports (any free)."""
    return otlp_config(store, otlp_http_port=0, otlp_grpc_port=0)


def endpoint(ports: BoundPorts, protocol: str) -> str:
    """The base URL an exporter of ``protocol`` is pointed at (OTLP's own ports)."""
    port = ports.otlp_grpc if protocol == "grpc" else ports.otlp_http
    return f"http://127.0.0.1:{port}"


def by_stream(events: list[Envelope]) -> dict[str, list[dict[str, Any]]]:
    """Stored rows per stream, in store order."""
    rows: dict[str, list[dict[str, Any]]] = {}
    for event in events:
        rows.setdefault(event.stream, []).append(json.loads(event.payload))
    return rows


def amap(entries: list[dict[str, str]]) -> dict[str, str]:
    """A ``map<string,string>`` column as the canonical payload holds it (key/value entries)."""
    return {entry["key"]: entry["value"] for entry in entries}


def succeeded(result: JsExport, items: int) -> None:
    assert result.ok, (result.errors, result.warnings, result.flush_error)
    assert result.items == items
    assert not [w for w in result.warnings if "partial" in w.lower()], result.warnings


def check_logs(result: JsExport, rows: list[dict[str, Any]]) -> None:
    """Every log record once, with its trace context, body and attributes of each type."""
    assert len(rows) == COUNT
    assert {r["service_name"] for r in rows} == {SERVICE}
    assert {r["trace_id"] for r in rows} == {result.details["trace_id"]}
    assert {r["span_id"] for r in rows} == {result.details["span_id"]}
    assert Counter(r["severity_text"] for r in rows) == {"INFO": 10, "ERROR": 2}
    first = next(r for r in rows if r["body"] == "log record 0")
    attributes = amap(first["attributes"])
    assert attributes["test.string"] == "value-0"
    assert json.loads(attributes["test.int"]) == 0
    assert json.loads(attributes["test.double"]) == 0.5
    assert json.loads(attributes["test.bool"]) is True
    assert json.loads(attributes["test.ints"]) == [1, 2, 0]
    assert json.loads(attributes["test.strings"]) == ["a", "b0"]
    assert base64.b64decode(attributes["test.bytes"]) == bytes([0, 1, 2, 0])
    assert json.loads(attributes["test.map"]) == {"nested": "yes", "depth": 1}
    assert first["event_name"] == "icefloe.test.first"
    assert amap(first["resource_attributes"])["service.name"] == SERVICE
    assert first["scope_name"] == "icefloe.js.test"
    map_body = next(r for r in rows if r["body"] and r["body"].startswith("{"))
    assert json.loads(map_body["body"])["message"].startswith("log record ")


def check_spans(result: JsExport, rows: list[dict[str, Any]]) -> None:
    """Every span once, in one trace under its root, with events and links."""
    assert len(rows) == COUNT
    assert {r["trace_id"] for r in rows} == {result.details["trace_id"]}
    assert sorted(r["span_id"] for r in rows) == sorted(result.details["span_ids"])
    root_id = result.details["root_span_id"]
    root = next(r for r in rows if r["span_id"] == root_id)
    assert root.get("parent_span_id") is None  # a null column is left out of the payload
    assert root["kind"] == "SERVER"
    children = [r for r in rows if r["span_id"] != root_id]
    assert {r.get("parent_span_id") for r in children} == {root_id}
    assert {r["service_name"] for r in rows} == {SERVICE}
    child = next(r for r in children if r["name"] == "child-4")
    assert child["status_code"] == "ERROR"
    assert child["status_message"] == "failed 4"
    assert [e["name"] for e in child["events"]] == ["checkpoint"]
    assert json.loads(amap(child["events"][0]["attributes"])["event.index"]) == 4
    assert len(child["links"][0]["trace_id"]) == 32
    assert json.loads(amap(child["attributes"])["test.doubles"]) == [0.25, 4.75]
    assert child["duration_ns"] == child["end_time_unix_nano"] - child["start_time_unix_nano"]


def check_metrics(rows: dict[str, list[dict[str, Any]]]) -> None:
    """Each instrument's points in its kind's stream: counter and up-down counter as sums."""
    assert {kind: len(rows.get(f"otlp.{kind}", [])) for kind in
            ("sum", "gauge", "histogram", "exponential_histogram", "summary")} == {
        "sum": 2 * COUNT, "gauge": COUNT, "histogram": COUNT, "exponential_histogram": COUNT,
        "summary": 0}
    everything = [r for kind_rows in rows.values() for r in kind_rows]
    assert {r["service_name"] for r in everything} == {SERVICE}
    counter = sorted((r for r in rows["otlp.sum"] if r["metric_name"] == "icefloe.test.requests"),
                     key=lambda r: json.loads(amap(r["attributes"])["point.index"]))
    assert [r["value"] for r in counter] == [float(i + 1) for i in range(COUNT)]
    assert {(r["is_monotonic"], r["aggregation_temporality"]) for r in counter} == {
        (True, "CUMULATIVE")}
    histogram = rows["otlp.histogram"][0]
    assert histogram["count"] == 1
    assert len(histogram["bucket_counts"]) == len(histogram["explicit_bounds"]) + 1
    assert {r["metric_unit"] for r in rows["otlp.gauge"]} == {"Cel"}
    assert all(r["scale"] is not None for r in rows["otlp.exponential_histogram"])


def check_event_ids(events: list[Envelope]) -> None:
    """Ids derived from the request (``otlp:<kind>:<digest>:<index>``), each kind 0..n-1."""
    per_stem: dict[str, list[int]] = {}
    for event in events:
        stem, _, index = event.event_id.rpartition(":")
        assert stem.startswith(f"otlp:{event.stream.removeprefix('otlp.')}:"), event.event_id
        per_stem.setdefault(stem, []).append(int(index))
    assert all(sorted(i) == list(range(len(i))) for i in per_stem.values()), per_stem


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_js_exporters_land_every_signal(tmp_path: Path, protocol: str) -> None:
    """Logs, spans and metric points from the JS SDK over ``protocol``, each stored once."""
    store = tmp_path / "store"
    async with ingestor(js_config(store)) as ports:
        url = endpoint(ports, protocol)
        common = {"token": TOKEN, "count": COUNT, "service": SERVICE}
        logs, spans, metrics = await asyncio.gather(
            *(export_async(url, protocol, signal, **common) for signal in SIGNALS))
    succeeded(logs, COUNT)
    succeeded(spans, COUNT)
    succeeded(metrics, 5 * COUNT)
    events = await stored_events(store.as_uri())
    rows = by_stream(events)
    check_logs(logs, rows["otlp.logs"])
    check_spans(spans, rows["otlp.spans"])
    check_metrics({k: v for k, v in rows.items() if k not in ("otlp.logs", "otlp.spans")})
    check_event_ids(events)


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_js_exporters_gzip(tmp_path: Path, protocol: str) -> None:
    """The exporters' ``compression: gzip`` is decoded (HTTP Content-Encoding, gRPC's)."""
    store = tmp_path / "store"
    async with ingestor(js_config(store)) as ports:
        result = await export_async(endpoint(ports, protocol), protocol, "logs", token=TOKEN,
                                    count=COUNT, service=SERVICE, compression="gzip")
    succeeded(result, COUNT)
    check_logs(result, by_stream(await stored_events(store.as_uri()))["otlp.logs"])


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_js_exporter_with_a_wrong_token_fails_and_stores_nothing(
        tmp_path: Path, protocol: str) -> None:
    """A refused token is an export failure the JS exporter reports (and does not retry)."""
    store = tmp_path / "store"
    async with ingestor(js_config(store)) as ports:
        result = await export_async(endpoint(ports, protocol), protocol, "traces",
                                    token="not-the-token", count=3, service=SERVICE,
                                    timeout_ms=5000)
    assert not result.ok
    assert result.exports == 1, result.results
    assert result.errors, result.results
    assert await stored_events(store.as_uri()) == []
