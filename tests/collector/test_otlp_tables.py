"""OTLP rows of every kind through the real collector into Iceberg, read back typed.

Export requests built with the ``opentelemetry-proto`` classes become rows
(:func:`icefloe.otlp.rows.export_rows`), pass the generated streams' own validation (the
ingestor's ``CompiledStream``, as the receivers admit them) and are published as batch
files with the receivers' derived ids; the Spark collector commits them. The tables are then
checked for their Iceberg types and partition spec (day and a bucket of ``service_name``),
a retried export is shown to add nothing, and every SQL example of docs/otlp.md is run on
both query engines against the result.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
from pathlib import Path
from typing import Any

import pytest
from collector_support import BASE_MS, collect_all, collector_config, output_engine, read_table
from collector_support import publish_sync as publish
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, ResourceLogs, ScopeLogs
from opentelemetry.proto.metrics.v1 import metrics_pb2 as m
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status

from icefloe.config import Config
from icefloe.otlp.config import OtlpSection, otlp_streams
from icefloe.otlp.rows import export_rows
from ingestor.validate import CompiledStream

DOC = Path(__file__).resolve().parents[2] / "docs" / "otlp.md"
UTC = dt.UTC
T0 = 1_767_323_045_000_000_000  # 2026-01-02T03:04:05Z
MINUTE = 60 * 10**9
MS = 10**6
TRACE = bytes.fromhex("5b8efff798038103d269b633813fc60c")
OTHER_TRACE = bytes.fromhex("aa" * 16)
PAY_SPAN = bytes.fromhex("eee19b7ec3c1b174")


def attrs(**values: Any) -> list[KeyValue]:
    out = []
    for key, v in values.items():
        if isinstance(v, bool):
            value = AnyValue(bool_value=v)
        elif isinstance(v, int):
            value = AnyValue(int_value=v)
        elif isinstance(v, float):
            value = AnyValue(double_value=v)
        else:
            value = AnyValue(string_value=v)
        out.append(KeyValue(key=key.replace("__", "."), value=value))
    return out


def service(name: str | None) -> Resource:
    return Resource(attributes=attrs(service__name=name) if name else [])


def logs() -> ExportLogsServiceRequest:
    def record(ns: int, severity: int, text: str, body: str, span: bytes = b"",
               trace: bytes = TRACE) -> LogRecord:
        return LogRecord(time_unix_nano=ns, observed_time_unix_nano=ns + 1000,
                         severity_number=severity,  # type: ignore[arg-type]
                         severity_text=text, body=AnyValue(string_value=body),
                         trace_id=trace, span_id=span, attributes=attrs(code__line=42))
    return ExportLogsServiceRequest(resource_logs=[
        ResourceLogs(resource=service("checkout"), scope_logs=[ScopeLogs(log_records=[
            record(T0, 9, "INFO", "order placed"),
            record(T0 + 2 * MS, 17, "ERROR", "payment declined", PAY_SPAN),
            record(T0 + 3 * MS, 13, "WARN", "retrying", PAY_SPAN)])]),
        ResourceLogs(resource=service("frontend"), scope_logs=[ScopeLogs(log_records=[
            record(T0 + 5 * MS, 18, "ERROR", "upstream answered 502"),
            record(T0 + 6 * MS, 17, "ERROR", "elsewhere", trace=OTHER_TRACE)])]),
        ResourceLogs(scope_logs=[ScopeLogs(log_records=[LogRecord(
            observed_time_unix_nano=T0, body=AnyValue(int_value=7))])])])


def spans() -> ExportTraceServiceRequest:
    def span(name: str, span_id: int, ms: int, kind: int, status: int = 0,
             code: int | None = None, **extra: Any) -> Span:
        return Span(trace_id=TRACE, span_id=bytes([span_id]) * 8 if span_id else PAY_SPAN,
                    name=name, kind=kind,  # type: ignore[arg-type]
                    start_time_unix_nano=T0, end_time_unix_nano=T0 + ms * MS,
                    status=Status(code=status),  # type: ignore[arg-type]
                    attributes=attrs(http__response__status_code=code) if code else [],
                    **extra)
    failure = Span.Event(time_unix_nano=T0 + MS, name="exception",
                         attributes=attrs(exception__type="CardDeclined"))
    return ExportTraceServiceRequest(resource_spans=[
        ResourceSpans(resource=service("checkout"), scope_spans=[ScopeSpans(spans=[
            span("POST /pay", 0, 250, Span.SPAN_KIND_SERVER, Status.STATUS_CODE_ERROR, 502,
                 events=[failure]),
            span("SELECT orders", 2, 40, Span.SPAN_KIND_CLIENT),
            span("GET /cart", 3, 120, Span.SPAN_KIND_SERVER, code=200)])]),
        ResourceSpans(resource=service("frontend"), scope_spans=[ScopeSpans(spans=[
            span("GET /", 4, 900, Span.SPAN_KIND_SERVER, code=503, links=[Span.Link(
                trace_id=OTHER_TRACE, span_id=b"\x05" * 8, attributes=attrs(n=1))])])])])


def metrics() -> ExportMetricsServiceRequest:
    cpu = m.Metric(name="system.cpu.utilization", unit="1", gauge=m.Gauge(data_points=[
        m.NumberDataPoint(time_unix_nano=T0 + i * 20 * 10**9, as_double=v)
        for i, v in enumerate([0.2, 0.4, 0.6, 0.8])]))
    requests = m.Metric(name="http.server.requests", sum=m.Sum(
        aggregation_temporality=m.AGGREGATION_TEMPORALITY_CUMULATIVE, is_monotonic=True,
        data_points=[m.NumberDataPoint(time_unix_nano=T0, start_time_unix_nano=T0 - MINUTE,
                                       as_int=2**60 + 1)]))
    duration = m.Metric(name="http.server.request.duration", unit="s", histogram=m.Histogram(
        aggregation_temporality=m.AGGREGATION_TEMPORALITY_DELTA, data_points=[
            m.HistogramDataPoint(time_unix_nano=T0, count=count, sum=total,
                                 bucket_counts=[count, 0], explicit_bounds=[1.0],
                                 attributes=attrs(http__route=route),
                                 exemplars=[m.Exemplar(time_unix_nano=T0, as_double=0.5,
                                                       trace_id=TRACE)])
            for route, count, total in [("/pay", 4, 2.0), ("/cart", 10, 1.0),
                                        ("/pay", 2, 1.0)]]))
    latency = m.Metric(name="rpc.latency", exponential_histogram=m.ExponentialHistogram(
        data_points=[m.ExponentialHistogramDataPoint(
            time_unix_nano=T0, count=3, scale=2, zero_count=1,
            positive=m.ExponentialHistogramDataPoint.Buckets(offset=-1, bucket_counts=[1, 1]))]))
    quantiles = m.Metric(name="gc.pause", summary=m.Summary(data_points=[m.SummaryDataPoint(
        time_unix_nano=T0, count=2, sum=0.3, quantile_values=[
            m.SummaryDataPoint.ValueAtQuantile(quantile=0.5, value=0.1)])]))
    return ExportMetricsServiceRequest(resource_metrics=[m.ResourceMetrics(
        resource=service("checkout"), scope_metrics=[m.ScopeMetrics(
            metrics=[cpu, requests, duration, latency, quantiles])])])


def events(config: Config, signal: str, request: Any) -> list[tuple[str, str, int, bytes]]:
    """The request's rows as the receivers admit them, with ids derived from the request's
    bytes: logs validated by their stream, spans and metrics in the canonical form the
    validator would have made (admitted without validating again)."""
    digest = hashlib.sha256(request.SerializeToString()).hexdigest()[:32]
    out = export_rows(signal, request, canonical=signal != "logs")
    assert out.rejected == 0, out.message
    found = []
    for kind, rows in out.rows.items():
        stream = config.stream(f"otlp.{kind}")
        assert stream is not None
        payloads = CompiledStream(stream).from_events(rows).payloads if signal == "logs" \
            else rows
        found += [(stream.name, f"otlp:{kind}:{digest}:{index}", BASE_MS + index, payload)
                  for index, payload in enumerate(payloads)]
    return found


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory, spark: Any) -> Config:
    """Every kind of row committed by the collector; a retried export published again."""
    import asyncio

    root = tmp_path_factory.mktemp("otlp")
    config = collector_config(root, streams=otlp_streams(OtlpSection(enabled=True), "test"))
    batch = [*events(config, "logs", logs()), *events(config, "traces", spans()),
             *events(config, "metrics", metrics())]
    retried = events(config, "traces", spans())
    publish(config, [batch, retried])
    asyncio.run(collect_all(config, output_engine(spark, "embedded")))
    return config


def table_of(config: Config, name: str) -> Any:
    from pipeline.iceberg.catalog import open_catalog

    return open_catalog(config.catalog).load_table(name)


@pytest.mark.parametrize("table", ["otel.logs", "otel.spans", "otel.metrics_gauge",
                                   "otel.metrics_sum", "otel.metrics_histogram",
                                   "otel.metrics_exp_histogram", "otel.metrics_summary"])
def test_every_table_is_partitioned_by_day_and_a_bucket_of_the_service(lake, table):
    iceberg = table_of(lake, table)
    schema = iceberg.schema()
    fields = [(schema.find_field(f.source_id).name, str(f.transform))
              for f in iceberg.spec().fields]
    time = "start_time" if table == "otel.spans" else "time"
    assert fields == [(time, "day"), ("service_name", "bucket[16]")]
    types = {f.name: str(f.field_type) for f in schema.fields}
    assert types[time] == "timestamptz"
    assert types["resource_attributes"] == "map<string, string>"
    assert types["service_name"] == "string"


def test_logs_read_back_with_their_types(lake):
    types = {f.name: str(f.field_type) for f in table_of(lake, "otel.logs").schema().fields}
    assert (types["time_unix_nano"], types["severity_number"], types["flags"]) == (
        "long", "int", "long")
    rows = sorted(read_table(lake, "otel.logs").to_pylist(),
                  key=lambda r: (r["time_unix_nano"], r["body"]))
    assert [r["body"] for r in rows] == ["7", "order placed", "payment declined", "retrying",
                                         "upstream answered 502", "elsewhere"]
    unnamed, placed = rows[0], rows[1]
    assert unnamed["service_name"] is None
    assert unnamed["time"] == dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert placed["time_unix_nano"] == T0
    assert placed["observed_time"] == dt.datetime(2026, 1, 2, 3, 4, 5, 1, tzinfo=UTC)
    assert placed["trace_id"] == TRACE.hex()
    assert placed["span_id"] is None
    assert dict(placed["attributes"]) == {"code.line": "42"}
    assert dict(placed["resource_attributes"]) == {"service.name": "checkout"}


def test_spans_read_back_with_nested_events_and_links_and_no_retried_copy(lake):
    types = {f.name: str(f.field_type) for f in table_of(lake, "otel.spans").schema().fields}
    assert types["events"].startswith("list<struct<")
    assert "time: optional timestamptz" in types["events"]
    assert types["links"].startswith("list<struct<")
    table = read_table(lake, "otel.spans")
    assert table.num_rows == 4  # the retried export's rows were deduplicated
    rows = {r["name"]: r for r in table.to_pylist()}
    pay = rows["POST /pay"]
    assert (pay["kind"], pay["status_code"], pay["duration_ns"]) == ("SERVER", "ERROR",
                                                                     250 * MS)
    assert pay["start_time"] == dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    [event] = pay["events"]
    assert event["name"] == "exception"
    assert event["time"] == dt.datetime(2026, 1, 2, 3, 4, 5, 1000, tzinfo=UTC)
    assert dict(event["attributes"]) == {"exception.type": "CardDeclined"}
    [link] = rows["GET /"]["links"]
    assert (link["trace_id"], link["span_id"]) == (OTHER_TRACE.hex(), "05" * 8)
    assert rows["GET /cart"]["links"] == []


def test_metric_points_read_back_in_their_tables(lake):
    gauge = read_table(lake, "otel.metrics_gauge").to_pylist()
    assert sorted(r["value"] for r in gauge) == [0.2, 0.4, 0.6, 0.8]
    assert {r["value_int"] for r in gauge} == {None}
    [total] = read_table(lake, "otel.metrics_sum").to_pylist()
    assert (total["value_int"], total["aggregation_temporality"], total["is_monotonic"]) == (
        2**60 + 1, "CUMULATIVE", True)
    assert total["start_time"] == dt.datetime(2026, 1, 2, 3, 3, 5, tzinfo=UTC)
    histogram = read_table(lake, "otel.metrics_histogram").to_pylist()
    assert sorted(r["count"] for r in histogram) == [2, 4, 10]
    assert histogram[0]["bucket_counts"][1] == 0
    assert histogram[0]["explicit_bounds"] == [1.0]
    assert histogram[0]["exemplars"][0]["trace_id"] == TRACE.hex()
    [expo] = read_table(lake, "otel.metrics_exp_histogram").to_pylist()
    assert (expo["scale"], expo["zero_count"], expo["positive_offset"]) == (2, 1, -1)
    assert expo["positive_bucket_counts"] == [1, 1]
    assert expo["negative_bucket_counts"] == []
    assert expo["sum"] is None
    [summary] = read_table(lake, "otel.metrics_summary").to_pylist()
    assert summary["quantile_values"] == [{"quantile": 0.5, "value": 0.1}]


def doc_queries() -> list[str]:
    """The ```sql blocks of docs/otlp.md's Queries section, in order."""
    section = DOC.read_text().split("\n## Queries\n", 1)[1]
    return re.findall(r"```sql\n(.*?)```", section, re.S)


EXPECTED: list[list[tuple[Any, ...]]] = [
    [("POST /pay", 250 * MS, TRACE.hex()), ("GET /cart", 120 * MS, TRACE.hex()),
     ("SELECT orders", 40 * MS, TRACE.hex())],
    [(dt.datetime(2026, 1, 2, 3, 4, 5, 2000, tzinfo=UTC), "checkout", "ERROR",
      "payment declined"),
     (dt.datetime(2026, 1, 2, 3, 4, 5, 5000, tzinfo=UTC), "frontend", "ERROR",
      "upstream answered 502")],
    [(dt.datetime(2026, 1, 2, 3, 4, tzinfo=UTC), 0.4),
     (dt.datetime(2026, 1, 2, 3, 5, tzinfo=UTC), 0.8)],
    [("/cart", 10, 0.1), ("/pay", 6, 0.5)],
    [("frontend", "GET /", "UNSET"), ("checkout", "POST /pay", "ERROR")],
    [("POST /pay", "payment declined"), ("POST /pay", "retrying")],
]
"""What each query of the docs answers on the data above, in order."""
ON_DUCKDB = {1, 5}
"""The queries the embedded engine answers exactly (``--engine auto`` runs them there); the
others (timestamp literals, map lookups, casts, ``date_trunc``) it leaves to Spark."""


def normalized(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """Rows as tuples; naive datetimes (Spark's, in its UTC session) made aware, floats
    rounded (the engines sum in different orders)."""
    def cell(value: Any) -> Any:
        if isinstance(value, dt.datetime) and value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        if isinstance(value, float):
            return round(value, 9)
        return value
    return [tuple(cell(v) for v in row.values()) for row in rows]


def test_the_docs_list_the_expected_queries():
    assert len(doc_queries()) == len(EXPECTED)


@pytest.mark.parametrize("index", range(len(EXPECTED)))
def test_every_docs_query_answers_on_spark(lake, spark, index):
    from pipeline.read.query import run_query

    result = run_query(spark, lake, doc_queries()[index])[0].to_pylist()
    assert normalized(result) == EXPECTED[index]


@pytest.mark.parametrize("index", range(len(EXPECTED)))
def test_the_docs_queries_duckdb_can_answer_agree_with_spark(lake, index):
    from pipeline.read.embedded import choose, run_embedded
    from pipeline.read.query import plan

    sql = doc_queries()[index]
    pinned = plan(sql, lake)
    choice = choose(lake, pinned, "auto")
    if index not in ON_DUCKDB:  # icefloe query --engine auto answers it with Spark
        assert choice.engine == "spark", choice
        assert "not known to give the same answers in DuckDB and Spark" in choice.reason
        return
    assert choice.engine == "duckdb", choice.reason
    assert choice.duck_sql is not None
    assert choice.planned is not None
    result = run_embedded(lake, pinned, choice.duck_sql, choice.planned)[0].to_pylist()
    assert normalized(result) == EXPECTED[index]
