"""Export requests as rows: every kind, every AnyValue type, and the records refused.

The requests are built with the ``opentelemetry-proto`` classes the receivers decode into;
each test also admits its rows through the generated stream's own validator (the ingestor's
``CompiledStream``), so a row the tables would refuse fails here first.
"""

from __future__ import annotations

import base64
import json
import math
from pathlib import Path
from typing import Any

import pytest
from config_support import HEADER, load_text
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import (
    AnyValue,
    ArrayValue,
    InstrumentationScope,
    KeyValue,
    KeyValueList,
)
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, ResourceLogs, ScopeLogs
from opentelemetry.proto.metrics.v1 import metrics_pb2 as m
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status

from icefloe.config import Config
from icefloe.otlp.row_types import ROW_TYPES, Shared
from icefloe.otlp.rows import export_rows
from icefloe.otlp.schemas import COLUMNS, RESOURCE_SCOPE
from icefloe.otlp.values import LONG_MAX
from ingestor.validate import CompiledStream

T0 = 1_767_323_045_123_456_789  # 2026-01-02T03:04:05.123456789Z
T0_TEXT = "2026-01-02T03:04:05.123456Z"
TRACE = bytes(range(0xA0, 0xB0))
SPAN = bytes(range(0xC0, 0xC8))


def value(v: Any) -> AnyValue:
    """A Python value as an AnyValue (bytes, lists and dicts nested)."""
    if isinstance(v, AnyValue):
        return v
    if isinstance(v, bool):
        return AnyValue(bool_value=v)
    if isinstance(v, int):
        return AnyValue(int_value=v)
    if isinstance(v, float):
        return AnyValue(double_value=v)
    if isinstance(v, bytes):
        return AnyValue(bytes_value=v)
    if isinstance(v, list):
        return AnyValue(array_value=ArrayValue(values=[value(x) for x in v]))
    if isinstance(v, dict):
        return AnyValue(kvlist_value=KeyValueList(values=attrs(v)))
    return AnyValue(string_value=v)


def attrs(values: dict[str, Any]) -> list[KeyValue]:
    return [KeyValue(key=k, value=value(v)) for k, v in values.items()]


def resource(service: str | None = "checkout", **extra: Any) -> Resource:
    found = dict(extra)
    if service is not None:
        found["service.name"] = service
    return Resource(attributes=attrs(found))


SCOPE = InstrumentationScope(name="io.opentelemetry.test", version="1.2.3",
                             attributes=attrs({"scope.k": "v"}))


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Config:
    return load_text(tmp_path_factory.mktemp("otlp"), HEADER + "[otlp]\nenabled = true\n")


def rows_of(signal: str, request: Any, config: Config, kind: str) -> list[dict[str, Any]]:
    """The rows of ``kind``, after the generated stream's validator accepted them, with
    every column present (a null one is left out of the JSON).

    Each time, the canonical form is checked to be byte for byte what the validator makes
    of the plain form, for every kind the request holds: a receiver may skip validation."""
    out = export_rows(signal, request)
    assert out.rejected == 0, out.message
    canonical = export_rows(signal, request, canonical=True)
    assert (canonical.rejected, canonical.message) == (0, "")
    assert canonical.rows.keys() == out.rows.keys()
    for found, payloads in out.rows.items():
        stream = config.stream(f"otlp.{found}")
        assert stream is not None
        assert CompiledStream(stream).from_events(payloads).payloads == \
            canonical.rows[found]
    return [{c.name: row.get(c.name) for c in COLUMNS[kind]}
            for row in map(json.loads, out.rows[kind])]


def logs_request(*records: LogRecord, res: Resource | None = None) -> ExportLogsServiceRequest:
    return ExportLogsServiceRequest(resource_logs=[ResourceLogs(
        resource=res if res is not None else resource(), schema_url="https://res/1.0",
        scope_logs=[ScopeLogs(scope=SCOPE, schema_url="https://scope/1.0",
                              log_records=list(records))])])


# -- logs ---------------------------------------------------------------------------------

def test_should_turn_a_log_record_into_a_row_with_every_column(config: Config):
    record = LogRecord(time_unix_nano=T0, observed_time_unix_nano=T0 + 5_000,
                       severity_number=17,  # type: ignore[arg-type]
                       severity_text="ERROR",
                       body=value("payment failed"), attributes=attrs({"http.route": "/pay"}),
                       dropped_attributes_count=2, flags=1, trace_id=TRACE, span_id=SPAN,
                       event_name="payment.failed")
    (row,) = rows_of("logs", logs_request(record), config, "logs")
    assert row == {
        "time": T0_TEXT, "time_unix_nano": T0,
        "observed_time": "2026-01-02T03:04:05.123461Z",
        "observed_time_unix_nano": T0 + 5_000,
        "severity_number": 17, "severity_text": "ERROR", "body": "payment failed",
        "attributes": {"http.route": "/pay"}, "dropped_attributes_count": 2, "flags": 1,
        "trace_id": "a0a1a2a3a4a5a6a7a8a9aaabacadaeaf", "span_id": "c0c1c2c3c4c5c6c7",
        "event_name": "payment.failed",
        "service_name": "checkout", "resource_attributes": {"service.name": "checkout"},
        "resource_dropped_attributes_count": 0, "resource_schema_url": "https://res/1.0",
        "scope_name": "io.opentelemetry.test", "scope_version": "1.2.3",
        "scope_attributes": {"scope.k": "v"}, "scope_dropped_attributes_count": 0,
        "scope_schema_url": "https://scope/1.0"}


def test_should_keep_every_anyvalue_type_as_text(config: Config):
    mixed = {"s": "text", "i": -42, "d": 1.5, "whole": 2.0, "b": True, "f": False,
             "bytes": b"\x00\xff", "arr": ["a", 1, 2.5, False, b"\x01", [1], {"k": "v"}],
             "kv": {"n": 1, "inner": {"x": [True]}}, "nan": math.nan, "inf": math.inf,
             "ninf": -math.inf, "empty": AnyValue(), "big": 2**63 - 1}
    record = LogRecord(time_unix_nano=T0, attributes=attrs(mixed), body=value({"msg": "hi"}))
    (row,) = rows_of("logs", logs_request(record), config, "logs")
    assert row["attributes"] == {
        "s": "text", "i": "-42", "d": "1.5", "whole": "2.0", "b": "true", "f": "false",
        "bytes": base64.b64encode(b"\x00\xff").decode(),
        "arr": '["a",1,2.5,false,"AQ==",[1],{"k":"v"}]',
        "kv": '{"n":1,"inner":{"x":[true]}}', "nan": "NaN", "inf": "Infinity",
        "ninf": "-Infinity", "empty": None, "big": str(2**63 - 1)}
    assert row["body"] == '{"msg":"hi"}'


@pytest.mark.parametrize(("body", "text"), [
    (value(7), "7"), (value(0.25), "0.25"), (value(True), "true"), (value(b"ab"), "YWI="),
    (value([1, "x"]), '[1,"x"]'), (AnyValue(), None), (None, None), (value(""), "")])
def test_should_keep_a_body_of_any_type(config: Config, body: AnyValue | None, text: str | None):
    record = LogRecord(time_unix_nano=T0)
    if body is not None:
        record.body.CopyFrom(body)
    (row,) = rows_of("logs", logs_request(record), config, "logs")
    assert row["body"] == text


def test_should_fall_back_to_the_observed_time_and_to_null(config: Config):
    observed_only = LogRecord(observed_time_unix_nano=T0)
    neither = LogRecord(severity_text="INFO")
    first, second = rows_of("logs", logs_request(observed_only, neither), config, "logs")
    assert (first["time"], first["time_unix_nano"], first["observed_time"]) == (T0_TEXT, 0,
                                                                                 T0_TEXT)
    assert second["time"] is None
    assert second["observed_time"] is None
    assert second["trace_id"] is None
    assert second["span_id"] is None
    assert second["severity_text"] == "INFO"
    assert second["event_name"] is None


def test_should_give_null_service_name_for_an_empty_resource_or_a_missing_attribute(
        config: Config):
    request = ExportLogsServiceRequest(resource_logs=[
        ResourceLogs(scope_logs=[ScopeLogs(log_records=[LogRecord(time_unix_nano=T0)])]),
        ResourceLogs(resource=resource(None, host="h1"),
                     scope_logs=[ScopeLogs(log_records=[LogRecord(time_unix_nano=T0)])]),
        ResourceLogs(resource=resource(None, **{"service.name": 5}),
                     scope_logs=[ScopeLogs(log_records=[LogRecord(time_unix_nano=T0)])])])
    empty, missing, typed = rows_of("logs", request, config, "logs")
    assert empty["service_name"] is None
    assert empty["resource_attributes"] == {}
    assert empty["scope_name"] is None
    assert empty["scope_attributes"] == {}
    assert empty["resource_schema_url"] is None
    assert missing["service_name"] is None
    assert missing["resource_attributes"] == {"host": "h1"}
    assert typed["service_name"] == "5"


def test_should_keep_request_order_across_resources_and_scopes(config: Config):
    request = ExportLogsServiceRequest(resource_logs=[
        ResourceLogs(resource=resource(f"svc{r}"), scope_logs=[
            ScopeLogs(scope=InstrumentationScope(name=f"scope{s}"), log_records=[
                LogRecord(time_unix_nano=T0 + i, body=value(f"{r}.{s}.{i}"))
                for i in range(3)]) for s in range(2)]) for r in range(2)])
    rows = rows_of("logs", request, config, "logs")
    assert [row["body"] for row in rows] == [f"{r}.{s}.{i}" for r in range(2)
                                             for s in range(2) for i in range(3)]
    assert [row["service_name"] for row in rows] == ["svc0"] * 6 + ["svc1"] * 6
    assert rows[3]["scope_name"] == "scope1"


def test_should_reject_a_time_past_the_long_range_and_keep_the_others(config: Config):
    request = logs_request(LogRecord(time_unix_nano=T0), LogRecord(time_unix_nano=2**63),
                           LogRecord(observed_time_unix_nano=2**64 - 1))
    out = export_rows("logs", request)
    assert len(out.rows["logs"]) == 1
    assert out.rejected == 2
    assert out.message.startswith("2 records rejected; the first: time_unix_nano "
                                  f"{2**63} is past 2^63 ns")


def test_should_give_no_rows_for_an_empty_request_and_refuse_an_unknown_signal():
    assert export_rows("logs", ExportLogsServiceRequest()) [:3] == ({}, 0, "")
    empty_scope = ExportLogsServiceRequest(resource_logs=[ResourceLogs(
        scope_logs=[ScopeLogs()])])
    assert export_rows("logs", empty_scope) [:3] == ({}, 0, "")
    with pytest.raises(ValueError, match="unknown OTLP signal 'profiles'"):
        export_rows("profiles", ExportLogsServiceRequest())


# -- spans --------------------------------------------------------------------------------

def test_should_turn_a_span_into_a_row_with_events_and_links(config: Config):
    span = Span(trace_id=TRACE, span_id=SPAN, parent_span_id=b"\x01" * 8, trace_state="k=v",
                name="GET /users/{id}", kind=Span.SPAN_KIND_SERVER,
                start_time_unix_nano=T0, end_time_unix_nano=T0 + 1_500_000,
                attributes=attrs({"http.response.status_code": 500}),
                dropped_attributes_count=1, dropped_events_count=2, dropped_links_count=3,
                flags=0x301,
                status=Status(code=Status.STATUS_CODE_ERROR, message="boom"),
                events=[Span.Event(time_unix_nano=T0 + 1000, name="exception",
                                   attributes=attrs({"exception.type": "ValueError"}),
                                   dropped_attributes_count=4)],
                links=[Span.Link(trace_id=b"\x02" * 16, span_id=b"\x03" * 8, trace_state="a=b",
                                 attributes=attrs({"link.k": 1}), flags=1,
                                 dropped_attributes_count=5)])
    request = ExportTraceServiceRequest(resource_spans=[ResourceSpans(
        resource=resource("frontend"), scope_spans=[ScopeSpans(scope=SCOPE, spans=[span])])])
    (row,) = rows_of("traces", request, config, "spans")
    assert row["trace_id"] == TRACE.hex()
    assert row["span_id"] == SPAN.hex()
    assert row["parent_span_id"] == "01" * 8
    assert row["trace_state"] == "k=v"
    assert (row["name"], row["kind"], row["status_code"], row["status_message"]) == (
        "GET /users/{id}", "SERVER", "ERROR", "boom")
    assert (row["start_time"], row["end_time"]) == (T0_TEXT, "2026-01-02T03:04:05.124956Z")
    assert (row["start_time_unix_nano"], row["end_time_unix_nano"]) == (T0, T0 + 1_500_000)
    assert row["duration_ns"] == 1_500_000
    assert row["attributes"] == {"http.response.status_code": "500"}
    assert (row["dropped_attributes_count"], row["dropped_events_count"],
            row["dropped_links_count"], row["flags"]) == (1, 2, 3, 0x301)
    assert row["events"] == [{"time": "2026-01-02T03:04:05.123457Z",
                              "time_unix_nano": T0 + 1000, "name": "exception",
                              "attributes": {"exception.type": "ValueError"},
                              "dropped_attributes_count": 4}]
    assert row["links"] == [{"trace_id": "02" * 16, "span_id": "03" * 8, "trace_state": "a=b",
                             "attributes": {"link.k": "1"}, "flags": 1,
                             "dropped_attributes_count": 5}]
    assert row["service_name"] == "frontend"


def test_should_name_every_span_kind_and_status_and_leave_unset_times_null(config: Config):
    spans = [Span(trace_id=TRACE, span_id=SPAN, name=f"s{k}", kind=k,  # type: ignore[arg-type]
                  status=Status(code=k % 3))  # type: ignore[arg-type]
             for k in range(6)]
    spans.append(Span(trace_id=TRACE, span_id=SPAN, name="future", kind=9,  # type: ignore[arg-type]
                      start_time_unix_nano=T0))
    request = ExportTraceServiceRequest(resource_spans=[ResourceSpans(
        scope_spans=[ScopeSpans(spans=spans)])])
    rows = rows_of("traces", request, config, "spans")
    assert [r["kind"] for r in rows] == ["UNSPECIFIED", "INTERNAL", "SERVER", "CLIENT",
                                         "PRODUCER", "CONSUMER", "9"]
    assert [r["status_code"] for r in rows[:3]] == ["UNSET", "OK", "ERROR"]
    assert rows[0]["start_time"] is None
    assert rows[0]["duration_ns"] is None
    assert rows[6]["start_time"] == T0_TEXT
    assert rows[6]["end_time"] is None
    assert rows[6]["duration_ns"] is None
    assert rows[0]["parent_span_id"] is None
    assert rows[0]["events"] == []
    assert rows[0]["links"] == []


# -- metrics ------------------------------------------------------------------------------

def metrics_request(*metrics: m.Metric, res: Resource | None = None
                    ) -> ExportMetricsServiceRequest:
    return ExportMetricsServiceRequest(resource_metrics=[m.ResourceMetrics(
        resource=res if res is not None else resource("meter"),
        scope_metrics=[m.ScopeMetrics(scope=SCOPE, metrics=list(metrics))])])


EXEMPLAR = m.Exemplar(time_unix_nano=T0, as_double=0.5, trace_id=TRACE, span_id=SPAN,
                      filtered_attributes=attrs({"user": "u1"}))


def test_should_turn_gauge_and_sum_points_into_rows_keeping_ints_exact(config: Config):
    gauge = m.Metric(name="system.memory.usage", description="memory", unit="By",
                     metadata=attrs({"origin": "host"}), gauge=m.Gauge(data_points=[
                         m.NumberDataPoint(time_unix_nano=T0, as_int=2**62 + 1,
                                           attributes=attrs({"state": "used"})),
                         m.NumberDataPoint(time_unix_nano=T0, start_time_unix_nano=T0 - 10**9,
                                           as_double=0.25, exemplars=[EXEMPLAR]),
                         m.NumberDataPoint(time_unix_nano=T0, flags=1)]))
    total = m.Metric(name="http.server.requests", unit="{request}", sum=m.Sum(
        aggregation_temporality=m.AGGREGATION_TEMPORALITY_CUMULATIVE, is_monotonic=True,
        data_points=[m.NumberDataPoint(time_unix_nano=T0, as_int=7)]))
    out = export_rows("metrics", metrics_request(gauge, total))
    assert set(out.rows) == {"gauge", "sum"}
    assert out.rejected == 0
    exact, double, stale = rows_of("metrics", metrics_request(gauge), config, "gauge")
    assert (exact["value"], exact["value_int"]) == (float(2**62 + 1), 2**62 + 1)
    assert exact["metric_name"] == "system.memory.usage"
    assert exact["metric_unit"] == "By"
    assert exact["metric_description"] == "memory"
    assert exact["metric_metadata"] == {"origin": "host"}
    assert exact["attributes"] == {"state": "used"}
    assert exact["exemplars"] == []
    assert exact["time"] == T0_TEXT
    assert exact["start_time"] is None
    assert exact["service_name"] == "meter"
    assert (double["value"], double.get("value_int")) == (0.25, None)
    assert double["start_time_unix_nano"] == T0 - 10**9
    assert double["exemplars"] == [{
        "time": T0_TEXT, "time_unix_nano": T0, "value": 0.5, "trace_id": TRACE.hex(),
        "span_id": SPAN.hex(), "filtered_attributes": {"user": "u1"}}]
    assert stale["flags"] == 1
    assert stale.get("value") is None
    (point,) = rows_of("metrics", metrics_request(total), config, "sum")
    assert (point["value"], point["value_int"]) == (7.0, 7)
    assert (point["aggregation_temporality"], point["is_monotonic"]) == ("CUMULATIVE", True)


def test_should_turn_histogram_points_into_rows(config: Config):
    metric = m.Metric(name="http.server.request.duration", unit="s", histogram=m.Histogram(
        aggregation_temporality=m.AGGREGATION_TEMPORALITY_DELTA, data_points=[
            m.HistogramDataPoint(time_unix_nano=T0, count=6, sum=2.5, min=0.1, max=1.0,
                                 bucket_counts=[1, 2, 3], explicit_bounds=[0.25, 0.5],
                                 exemplars=[m.Exemplar(time_unix_nano=T0, as_int=3)]),
            m.HistogramDataPoint(time_unix_nano=T0, count=0)]))
    full, bare = rows_of("metrics", metrics_request(metric), config, "histogram")
    assert (full["count"], full["sum"], full["min"], full["max"]) == (6, 2.5, 0.1, 1.0)
    assert full["bucket_counts"] == [1, 2, 3]
    assert full["explicit_bounds"] == [0.25, 0.5]
    assert full["aggregation_temporality"] == "DELTA"
    assert full["exemplars"][0]["value"] == 3.0
    assert full["exemplars"][0]["value_int"] == 3
    assert "trace_id" not in full["exemplars"][0]
    assert bare["count"] == 0
    assert bare["sum"] is None
    assert bare["min"] is None
    assert bare["bucket_counts"] == []
    assert bare["explicit_bounds"] == []


def test_should_turn_exponential_histogram_points_into_rows(config: Config):
    metric = m.Metric(name="latency", exponential_histogram=m.ExponentialHistogram(
        aggregation_temporality=m.AGGREGATION_TEMPORALITY_CUMULATIVE, data_points=[
            m.ExponentialHistogramDataPoint(
                time_unix_nano=T0, count=10, sum=12.5, min=0.5, max=4.0, scale=-2,
                zero_count=1, zero_threshold=1e-9,
                positive=m.ExponentialHistogramDataPoint.Buckets(offset=-3,
                                                                 bucket_counts=[4, 3]),
                negative=m.ExponentialHistogramDataPoint.Buckets(offset=2,
                                                                 bucket_counts=[2]))]))
    (row,) = rows_of("metrics", metrics_request(metric), config, "exponential_histogram")
    assert (row["count"], row["sum"], row["scale"], row["zero_count"]) == (10, 12.5, -2, 1)
    assert row["zero_threshold"] == 1e-9
    assert (row["positive_offset"], row["positive_bucket_counts"]) == (-3, [4, 3])
    assert (row["negative_offset"], row["negative_bucket_counts"]) == (2, [2])
    assert row["aggregation_temporality"] == "CUMULATIVE"


def test_should_turn_summary_points_into_rows(config: Config):
    Q = m.SummaryDataPoint.ValueAtQuantile
    metric = m.Metric(name="rpc.duration", summary=m.Summary(data_points=[
        m.SummaryDataPoint(time_unix_nano=T0, count=3, sum=6.0,
                           quantile_values=[Q(quantile=0.5, value=2.0),
                                            Q(quantile=1.0, value=3.0)])]))
    (row,) = rows_of("metrics", metrics_request(metric), config, "summary")
    assert (row["count"], row["sum"]) == (3, 6.0)
    assert row["quantile_values"] == [{"quantile": 0.5, "value": 2.0},
                                      {"quantile": 1.0, "value": 3.0}]


def test_should_reject_a_metric_without_data_and_counts_past_the_long_range():
    request = metrics_request(
        m.Metric(name="empty"),
        m.Metric(name="ok", gauge=m.Gauge(data_points=[m.NumberDataPoint(as_int=1)])),
        m.Metric(name="huge", histogram=m.Histogram(data_points=[
            m.HistogramDataPoint(count=2**63), m.HistogramDataPoint(bucket_counts=[2**64 - 1]),
            m.HistogramDataPoint(count=1)])))
    out = export_rows("metrics", request)
    assert out.rejected == 3
    assert out.message == ("3 records rejected; the first: metric 'empty' has no data (none "
                           "of gauge, sum, histogram, exponential_histogram, summary)")
    assert len(out.rows["gauge"]) == 1
    assert len(out.rows["histogram"]) == 1
    single = export_rows("metrics", metrics_request(m.Metric(name="huge", sum=m.Sum(
        data_points=[m.NumberDataPoint(time_unix_nano=LONG_MAX + 1)]))))
    assert single.rejected == 1
    assert single.rows == {}
    assert single.message == (f"metric 'huge': time_unix_nano {LONG_MAX + 1} is past 2^63 "
                              "ns (year 2262): not a time")


def test_should_survive_the_json_mapping_of_a_request(config: Config, tmp_path: Path):
    """OTLP/JSON decodes into the same messages (ids aside, which the receivers convert)."""
    from google.protobuf import json_format  # why: only this test parses JSON requests
    text = json.dumps({"resourceLogs": [{"resource": {"attributes": [
        {"key": "service.name", "value": {"stringValue": "js"}}]}, "scopeLogs": [
        {"logRecords": [{"timeUnixNano": str(T0), "body": {"intValue": "5"},
                         "attributes": [{"key": "n", "value": {"doubleValue": 2}}]}]}]}]})
    request = json_format.Parse(text, ExportLogsServiceRequest())
    (row,) = rows_of("logs", request, config, "logs")
    assert (row["body"], row["attributes"], row["service_name"]) == ("5", {"n": "2.0"}, "js")


def test_the_row_structs_hold_the_schemas_columns_in_order():
    for kind, row_type in ROW_TYPES.items():
        own = [c.name for c in COLUMNS[kind] if c not in RESOURCE_SCOPE]
        assert list(row_type.__struct_fields__) == own, kind
        assert [c.name for c in COLUMNS[kind]][-len(RESOURCE_SCOPE):] == list(
            Shared.__struct_fields__)


def test_should_keep_the_last_of_a_repeated_attribute_key_in_both_forms(config: Config):
    record = LogRecord(time_unix_nano=T0, attributes=attrs({"a": 1, "b": 2}) + attrs({"a": 3}))
    (row,) = rows_of("logs", logs_request(record), config, "logs")
    assert row["attributes"] == {"a": "3", "b": "2"}


def test_should_store_non_finite_doubles_as_null_in_both_forms(config: Config):
    Q = m.SummaryDataPoint.ValueAtQuantile
    request = metrics_request(
        m.Metric(name="g", gauge=m.Gauge(data_points=[
            m.NumberDataPoint(time_unix_nano=T0, as_double=math.nan),
            m.NumberDataPoint(time_unix_nano=T0, as_double=-math.inf)])),
        m.Metric(name="h", histogram=m.Histogram(data_points=[m.HistogramDataPoint(
            time_unix_nano=T0, count=1, sum=math.inf, min=math.nan, max=1.0,
            explicit_bounds=[math.inf])])),
        m.Metric(name="s", summary=m.Summary(data_points=[m.SummaryDataPoint(
            time_unix_nano=T0, sum=math.nan, quantile_values=[Q(quantile=0.5,
                                                                value=math.nan)])])))
    assert [r["value"] for r in rows_of("metrics", request, config, "gauge")] == [None, None]
    (histogram,) = rows_of("metrics", request, config, "histogram")
    assert (histogram["sum"], histogram["min"], histogram["max"]) == (None, None, 1.0)
    assert histogram["explicit_bounds"] == [None]
    (summary,) = rows_of("metrics", request, config, "summary")
    assert summary["sum"] is None
    assert summary["quantile_values"] == [{"quantile": 0.5}]


_leaves = st.one_of(st.text(max_size=8), st.integers(-2**63, 2**63 - 1),
                    st.floats(allow_nan=True, allow_infinity=True), st.booleans(),
                    st.binary(max_size=6), st.just(AnyValue()))
_values = st.recursive(_leaves, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=3)),
    max_leaves=8)
_attributes = st.lists(st.tuples(st.sampled_from(["a", "b", "service.name", ""]), _values),
                       max_size=5)


@settings(max_examples=150, deadline=None)
@given(record=_attributes, resource_attrs=_attributes, body=_values,
       times=st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 2**63 - 1)),
       ids=st.tuples(st.binary(max_size=16), st.binary(max_size=8)),
       text=st.text(max_size=6))
def test_any_record_gives_the_same_rows_in_both_forms(config, record, resource_attrs, body,
                                                       times, ids, text):
    """Whatever the values, the canonical form is what validation makes of the plain one,
    and a record is a row or a rejection, never an error."""
    def pairs(found: list[tuple[str, Any]]) -> list[KeyValue]:
        return [KeyValue(key=k, value=value(v)) for k, v in found]
    log = LogRecord(time_unix_nano=times[0], observed_time_unix_nano=times[1],
                    body=value(body), trace_id=ids[0], span_id=ids[1], severity_text=text,
                    attributes=pairs(record))
    request = logs_request(log, res=Resource(attributes=pairs(resource_attrs)))
    out = export_rows("logs", request)
    if times[0] > LONG_MAX:
        assert (out.rows, out.rejected) == ({}, 1)
        return
    (row,) = rows_of("logs", request, config, "logs")
    assert list(row["attributes"]) == list(dict(record))  # first places, repeats once
    assert row["service_name"] == row["resource_attributes"].get("service.name")


def test_should_say_which_form_the_rows_are_in():
    request = ExportLogsServiceRequest()
    assert export_rows("logs", request).canonical is False
    assert export_rows("logs", request, canonical=True).canonical is True
