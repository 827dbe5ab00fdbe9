"""The compiled wire decoder (icefloe/otlp/_wire.pyx) against the reference path.

The reference is what the receivers did before it: parse the body with the
``opentelemetry-proto`` classes (upb), then ``export_rows(..., canonical=True)``. For every
body the decoder either gives exactly the reference's rows, byte for byte, or refers the body
to the reference (None), and it never reads a body the reference refuses. Requests come from
hypothesis in three forms: as protobuf serializes them (every AnyValue kind, nesting, empty and
missing fields, repeated keys, large and negative varints, non-finite doubles); re-encoded on
the wire as another sender may write them (fields out of order, unknown fields of every wire
type, non-minimal varints, scalar fields sent twice); and broken (truncated, bytes flipped,
strings that are not UTF-8).
"""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
from google.protobuf.descriptor import Descriptor
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
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

from icefloe.otlp.rows import ExportRows, export_rows
from icefloe.otlp.wire import compiled, wire_rows

pytestmark = pytest.mark.skipif(compiled is None, reason="speedups not built "
                                "(scripts/build_speedups.py, run by make)")

REQUESTS: dict[str, Any] = {"logs": ExportLogsServiceRequest,
                            "traces": ExportTraceServiceRequest,
                            "metrics": ExportMetricsServiceRequest}
LONG_MAX = 2**63 - 1


def reference(signal: str, body: bytes) -> ExportRows | None:
    """The receivers' reference path; None when it refuses the body (invalid_protobuf)."""
    try:
        request = REQUESTS[signal].FromString(body)
    except DecodeError:
        return None
    return export_rows(signal, request, canonical=True)


def check(signal: str, body: bytes, *, must_read: bool) -> None:
    expected = reference(signal, body)
    found = wire_rows(signal, body)
    if found is None:
        assert not must_read, "the decoder referred a request it should read"
        return
    assert expected is not None, "the decoder read a body the reference refuses"
    assert found == expected


# -- generated requests ---------------------------------------------------------------------

_text = st.text(st.characters(codec="utf-8"), max_size=6) | st.sampled_from(
    ["", "service.name", 'q"\\\n\t\x00\x1f\x7f', "é\u2028😀"])
_doubles = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from(
    [1e16, 1e-7, 0.1, -0.0, 5e-324, 1e22, 123456789.125])
_leaves = st.one_of(
    _text.map(lambda v: AnyValue(string_value=v)),
    st.integers(-2**63, 2**63 - 1).map(lambda v: AnyValue(int_value=v)),
    _doubles.map(lambda v: AnyValue(double_value=v)),
    st.booleans().map(lambda v: AnyValue(bool_value=v)),
    st.binary(max_size=7).map(lambda v: AnyValue(bytes_value=v)),
    st.integers(-5, 5).map(lambda v: AnyValue(string_value_strindex=v)),
    st.just(AnyValue()))
_keys = st.sampled_from(["a", "b", "", "service.name", "k\"\\"])


def _nest(inner: st.SearchStrategy[AnyValue]) -> st.SearchStrategy[AnyValue]:
    return st.one_of(
        st.lists(inner, max_size=3).map(
            lambda vs: AnyValue(array_value=ArrayValue(values=vs))),
        st.lists(st.tuples(_keys, inner), max_size=3).map(
            lambda kvs: AnyValue(kvlist_value=KeyValueList(
                values=[KeyValue(key=k, value=v) for k, v in kvs]))))


_values = st.recursive(_leaves, _nest, max_leaves=10)
_attributes = st.lists(st.builds(KeyValue, key=_keys, value=_values) |
                       st.builds(KeyValue, key=_keys), max_size=5)
_times = st.integers(0, LONG_MAX) | st.sampled_from([0, 1, 10**9, 1_767_323_045_123_456_789,
                                                     LONG_MAX])
_ids = st.binary(max_size=16)
_int32 = st.integers(-2**31, 2**31 - 1)
_uint32 = st.integers(0, 2**32 - 1)
_scope = st.builds(InstrumentationScope, name=_text, version=_text, attributes=_attributes,
                   dropped_attributes_count=_uint32)
_resource = st.builds(Resource, attributes=_attributes, dropped_attributes_count=_uint32)


@st.composite
def _log_record(draw: st.DrawFn) -> LogRecord:
    record = LogRecord(time_unix_nano=draw(_times), observed_time_unix_nano=draw(_times),
                       severity_number=draw(_int32),  # type: ignore[arg-type]
                       severity_text=draw(_text),
                       attributes=draw(_attributes), dropped_attributes_count=draw(_uint32),
                       flags=draw(_uint32), trace_id=draw(_ids), span_id=draw(_ids),
                       event_name=draw(_text))
    if draw(st.booleans()):
        record.body.CopyFrom(draw(_values))
    return record


def _holder(message: Any, head: str, head_value: Any, items: str, found: list[Any],
            url: str) -> Any:
    out = message(schema_url=url, **{items: found})
    if head_value is not None:
        getattr(out, head).CopyFrom(head_value)
    return out


@st.composite
def log_requests(draw: st.DrawFn) -> ExportLogsServiceRequest:
    request = ExportLogsServiceRequest()
    for _ in range(draw(st.integers(0, 2))):
        scopes = [_holder(ScopeLogs, "scope", draw(st.none() | _scope), "log_records",
                          draw(st.lists(_log_record(), max_size=3)), draw(_text))
                  for _ in range(draw(st.integers(0, 2)))]
        request.resource_logs.append(_holder(ResourceLogs, "resource",
                                             draw(st.none() | _resource), "scope_logs",
                                             scopes, draw(_text)))
    return request


def _span_event(draw: st.DrawFn) -> Span.Event:
    return Span.Event(time_unix_nano=draw(_times), name=draw(_text),
                      attributes=draw(_attributes), dropped_attributes_count=draw(_uint32))


def _span_link(draw: st.DrawFn) -> Span.Link:
    return Span.Link(trace_id=draw(_ids), span_id=draw(_ids), trace_state=draw(_text),
                     attributes=draw(_attributes), dropped_attributes_count=draw(_uint32),
                     flags=draw(_uint32))


@st.composite
def _span(draw: st.DrawFn) -> Span:
    span = Span(trace_id=draw(_ids), span_id=draw(_ids), trace_state=draw(_text),
                parent_span_id=draw(_ids), flags=draw(_uint32), name=draw(_text),
                kind=draw(st.integers(-2, 7)),  # type: ignore[arg-type]
                start_time_unix_nano=draw(_times),
                end_time_unix_nano=draw(_times), attributes=draw(_attributes),
                dropped_attributes_count=draw(_uint32), dropped_events_count=draw(_uint32),
                dropped_links_count=draw(_uint32),
                events=[_span_event(draw) for _ in range(draw(st.integers(0, 2)))],
                links=[_span_link(draw) for _ in range(draw(st.integers(0, 2)))])
    if draw(st.booleans()):
        span.status.CopyFrom(Status(code=draw(st.integers(-1, 4)),  # type: ignore[arg-type]
                                  message=draw(_text)))
    return span


@st.composite
def span_requests(draw: st.DrawFn) -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    for _ in range(draw(st.integers(0, 2))):
        scopes = [_holder(ScopeSpans, "scope", draw(st.none() | _scope), "spans",
                          draw(st.lists(_span(), max_size=3)), draw(_text))
                  for _ in range(draw(st.integers(0, 2)))]
        request.resource_spans.append(_holder(ResourceSpans, "resource",
                                              draw(st.none() | _resource), "scope_spans",
                                              scopes, draw(_text)))
    return request


def _number_value(draw: st.DrawFn, point: Any) -> None:
    choice = draw(st.sampled_from(["double", "int", "none"]))
    if choice == "double":
        point.as_double = draw(_doubles)
    elif choice == "int":
        point.as_int = draw(st.integers(-2**63, 2**63 - 1))


def _exemplar(draw: st.DrawFn) -> m.Exemplar:
    found = m.Exemplar(time_unix_nano=draw(_times), filtered_attributes=draw(_attributes),
                       trace_id=draw(_ids), span_id=draw(_ids))
    _number_value(draw, found)
    return found


@st.composite
def _number_point(draw: st.DrawFn) -> m.NumberDataPoint:
    point = m.NumberDataPoint(time_unix_nano=draw(_times), start_time_unix_nano=draw(_times),
                              attributes=draw(_attributes), flags=draw(_uint32),
                              exemplars=[_exemplar(draw)
                                         for _ in range(draw(st.integers(0, 2)))])
    _number_value(draw, point)
    return point


@st.composite
def _histogram_point(draw: st.DrawFn) -> m.HistogramDataPoint:
    counts = draw(_counts)
    point = m.HistogramDataPoint(
        time_unix_nano=draw(_times), start_time_unix_nano=draw(_times),
        attributes=draw(_attributes), flags=draw(_uint32), count=draw(_times),
        bucket_counts=counts, explicit_bounds=draw(st.lists(_doubles, max_size=3)),
        exemplars=[_exemplar(draw) for _ in range(draw(st.integers(0, 2)))])
    for name in ("sum", "min", "max"):
        if draw(st.booleans()):
            setattr(point, name, draw(_doubles))
    return point


_counts = st.lists(st.integers(0, 2**63 - 1) | st.sampled_from([0, 1, 7]), max_size=4)
_sint32 = st.integers(-2**31, 2**31 - 1)


@st.composite
def _exponential_point(draw: st.DrawFn) -> m.ExponentialHistogramDataPoint:
    Buckets = m.ExponentialHistogramDataPoint.Buckets
    point = m.ExponentialHistogramDataPoint(
        time_unix_nano=draw(_times), start_time_unix_nano=draw(_times),
        attributes=draw(_attributes), flags=draw(_uint32), count=draw(_times),
        scale=draw(_sint32), zero_count=draw(_times), zero_threshold=draw(_doubles),
        exemplars=[_exemplar(draw) for _ in range(draw(st.integers(0, 2)))])
    for name in ("sum", "min", "max"):
        if draw(st.booleans()):
            setattr(point, name, draw(_doubles))
    for name in ("positive", "negative"):
        if draw(st.booleans()):
            getattr(point, name).CopyFrom(Buckets(offset=draw(_sint32),
                                                  bucket_counts=draw(_counts)))
    return point


@st.composite
def _summary_point(draw: st.DrawFn) -> m.SummaryDataPoint:
    Q = m.SummaryDataPoint.ValueAtQuantile
    return m.SummaryDataPoint(
        time_unix_nano=draw(_times), start_time_unix_nano=draw(_times),
        attributes=draw(_attributes), flags=draw(_uint32), count=draw(_times),
        sum=draw(_doubles), quantile_values=[Q(quantile=draw(_doubles), value=draw(_doubles))
                                             for _ in range(draw(st.integers(0, 3)))])


@st.composite
def _metric(draw: st.DrawFn, others: bool) -> m.Metric:
    metric = m.Metric(name=draw(_text), description=draw(_text), unit=draw(_text),
                      metadata=draw(_attributes))
    points = draw(st.lists(_number_point(), max_size=3))
    kinds = ["gauge", "sum", "histogram", "exponential_histogram", "summary",
             *(["none"] if others else [])]
    kind = draw(st.sampled_from(kinds))
    if kind != "none":
        getattr(metric, kind).SetInParent()  # data without points is data
    if kind == "gauge":
        metric.gauge.data_points.extend(points)
    elif kind == "sum":
        metric.sum.data_points.extend(points)
        metric.sum.aggregation_temporality = draw(st.integers(-1, 4))  # type: ignore[assignment]
        metric.sum.is_monotonic = draw(st.booleans())
    elif kind == "histogram":
        metric.histogram.aggregation_temporality = draw(  # type: ignore[assignment]
            st.integers(-1, 4))
        for _ in range(draw(st.integers(0, 3))):
            metric.histogram.data_points.append(draw(_histogram_point()))
    elif kind == "exponential_histogram":
        metric.exponential_histogram.aggregation_temporality = draw(  # type: ignore[assignment]
            st.integers(-1, 4))
        for _ in range(draw(st.integers(0, 3))):
            metric.exponential_histogram.data_points.append(draw(_exponential_point()))
    elif kind == "summary":
        for _ in range(draw(st.integers(0, 3))):
            metric.summary.data_points.append(draw(_summary_point()))
    return metric


@st.composite
def metric_requests(draw: st.DrawFn, others: bool = False) -> ExportMetricsServiceRequest:
    request = ExportMetricsServiceRequest()
    for _ in range(draw(st.integers(0, 2))):
        scopes = [_holder(m.ScopeMetrics, "scope", draw(st.none() | _scope), "metrics",
                          draw(st.lists(_metric(others), max_size=3)), draw(_text))
                  for _ in range(draw(st.integers(0, 2)))]
        request.resource_metrics.append(_holder(m.ResourceMetrics, "resource",
                                                draw(st.none() | _resource), "scope_metrics",
                                                scopes, draw(_text)))
    return request


# -- the wire as other senders write it -----------------------------------------------------

def _varint(value: int, width: int = 0) -> bytes:
    """``value`` as a varint of at least ``width`` bytes (padded with empty 7-bit groups,
    which protobuf allows up to ten bytes, five for tags and lengths)."""
    groups = []
    while True:
        groups.append(value & 0x7F)
        value >>= 7
        if not value:
            break
    groups += [0] * (width - len(groups))
    return bytes(g | 0x80 for g in groups[:-1]) + bytes(groups[-1:])


def _fields(data: bytes) -> list[tuple[int, int, bytes]]:
    """A message's fields as (number, wire type, raw value bytes)."""
    found, pos = [], 0
    while pos < len(data):
        tag, pos = _read_varint(data, pos)
        number, wt = tag >> 3, tag & 7
        start = pos
        if wt == 0:
            _, pos = _read_varint(data, pos)
        elif wt == 1:
            pos += 8
        elif wt == 5:
            pos += 4
        else:
            size, start = _read_varint(data, pos)
            pos = start + size
        found.append((number, wt, data[start:pos]))
    return found


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, pos


_UNKNOWN = [(900, 0, _varint(2**64 - 1)), (901, 1, b"\xff" * 8), (902, 5, b"\x01\x02\x03\x04"),
            (903, 2, b"\xff\xfe not utf-8"), (536870911, 0, b"\x00")]


def rewrite(data: bytes, descriptor: Descriptor, rng: random.Random) -> bytes:
    """The same message as another encoder may write it: fields shuffled (each field's own
    occurrences kept in order), unknown fields added, varints padded, a scalar sent twice
    (the later one counting, as protobuf says)."""
    by_number = {f.number: f for f in descriptor.fields}
    fields = []
    for number, wt, raw in _fields(data):
        field = by_number.get(number)
        if field is not None and field.message_type is not None:
            raw = rewrite(raw, field.message_type, rng)
        elif field is not None and not field.is_repeated and field.containing_oneof is None \
                and rng.random() < 0.2:
            fields.append((number, wt, _decoy(wt, rng)))
        fields.append((number, wt, raw))
    if rng.random() < 0.5:
        fields.insert(rng.randint(0, len(fields)), rng.choice(_UNKNOWN))
    order = sorted(range(len(fields)), key=lambda i: (rng.random(), i))
    firsts: dict[int, list[int]] = {}
    for i in range(len(fields)):
        firsts.setdefault(fields[i][0], []).append(i)
    queues = {n: list(ix) for n, ix in firsts.items()}
    out = bytearray()
    for i in order:  # the i-th slot takes its field's next occurrence, in original order
        number, wt, raw = fields[queues[fields[i][0]].pop(0)]
        out += _varint(number << 3 | wt, _width(rng, 3, 6))
        if wt == 2:
            out += _varint(len(raw), _width(rng, 4, 6)) + raw
        elif wt == 0:
            value, _ = _read_varint(raw, 0)
            out += _varint(value, _width(rng, 10, 11))
        else:
            out += raw
    return bytes(out)


def _width(rng: random.Random, padded: int, too_long: int) -> int:
    """Mostly minimal; sometimes padded (valid); rarely one byte too long (invalid)."""
    roll = rng.random()
    return 0 if roll < 0.8 else padded if roll < 0.9995 else too_long


def _decoy(wt: int, rng: random.Random) -> bytes:
    """A value that a later occurrence of the same scalar field overrides."""
    return {0: _varint(rng.choice([0, 7, 2**64 - 1])), 1: b"\x07" * 8, 5: b"\x07" * 4,
            2: b"decoy"}[wt]


def corrupt(body: bytes, rng: random.Random) -> bytes:
    """``body`` broken in one of the ways the wire breaks."""
    if not body:
        return b"\x0a\x05ab"
    at = rng.randrange(len(body))
    how = rng.randrange(4)
    if how == 0:
        return body[:at]
    if how == 1:
        return body[:at] + bytes([body[at] ^ (1 << rng.randrange(8))]) + body[at + 1:]
    if how == 2:
        return body[:at] + bytes([rng.choice([0x80, 0xC0, 0xED, 0xFF, 0x0B, 0x0C])]) + body[at:]
    return body[:at] + b"\xed\xa0\x80" + body[at:]  # an encoded surrogate


# -- the tests ------------------------------------------------------------------------------

_SETTINGS = settings(max_examples=150, deadline=None,
                     suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@_SETTINGS
@given(request=log_requests())
def test_should_read_any_log_request_as_the_reference_does(request):
    check("logs", request.SerializeToString(), must_read=True)


@_SETTINGS
@given(request=log_requests(), seed=st.integers(0, 2**32))
def test_should_read_log_requests_as_other_senders_write_them(request, seed):
    rng = random.Random(seed)
    body = rewrite(request.SerializeToString(), request.DESCRIPTOR, rng)
    check("logs", body, must_read=False)


@_SETTINGS
@given(request=log_requests(), seed=st.integers(0, 2**32))
def test_should_refer_broken_log_requests_to_the_reference(request, seed):
    rng = random.Random(seed)
    check("logs", corrupt(request.SerializeToString(), rng), must_read=False)


@_SETTINGS
@given(request=span_requests())
def test_should_read_any_span_request_as_the_reference_does(request):
    check("traces", request.SerializeToString(), must_read=True)


@_SETTINGS
@given(request=span_requests(), seed=st.integers(0, 2**32))
def test_should_read_span_requests_as_other_senders_write_them(request, seed):
    rng = random.Random(seed)
    check("traces", rewrite(request.SerializeToString(), request.DESCRIPTOR, rng),
          must_read=False)


@_SETTINGS
@given(request=span_requests(), seed=st.integers(0, 2**32))
def test_should_refer_broken_span_requests_to_the_reference(request, seed):
    check("traces", corrupt(request.SerializeToString(), random.Random(seed)), must_read=False)


@_SETTINGS
@given(request=metric_requests())
def test_should_read_any_metric_request_as_the_reference_does(request):
    check("metrics", request.SerializeToString(), must_read=True)


@_SETTINGS
@given(request=metric_requests(others=True), seed=st.integers(0, 2**32))
def test_should_read_metric_requests_as_other_senders_write_them(request, seed):
    """Metrics without data are the reference's (it rejects them: referred)."""
    rng = random.Random(seed)
    check("metrics", rewrite(request.SerializeToString(), request.DESCRIPTOR, rng),
          must_read=False)


@_SETTINGS
@given(request=metric_requests(), seed=st.integers(0, 2**32))
def test_should_refer_broken_metric_requests_to_the_reference(request, seed):
    check("metrics", corrupt(request.SerializeToString(), random.Random(seed)),
          must_read=False)


@pytest.mark.parametrize("signal", ["logs", "traces", "metrics"])
def test_should_read_an_empty_request(signal):
    assert wire_rows(signal, b"") == ExportRows({}, 0, "", canonical=True)


def test_should_refer_a_time_past_the_long_range_to_the_reference_which_rejects_it():
    request = ExportLogsServiceRequest(resource_logs=[ResourceLogs(scope_logs=[ScopeLogs(
        log_records=[LogRecord(time_unix_nano=2**63), LogRecord(time_unix_nano=1)])])])
    body = request.SerializeToString()
    assert wire_rows("logs", body) is None
    found = reference("logs", body)
    assert found is not None
    assert (len(found.rows["logs"]), found.rejected) == (1, 1)


@pytest.mark.parametrize("body", [
    b"\x0a\x02\x12",  # a nested length past its message
    b"\x0a\x03\x12\x01\xff",  # a ScopeLogs that is one byte of a field
    b"\x00\x00",  # field number 0
    b"\x0a\x0c\x12\x0a\x12\x08\x1a\x06\xff\xfe\xfd\xfc\xfb\xfa",  # severity_text not UTF-8
    b"\x08" + b"\xff" * 10 + b"\x01",  # a varint over ten bytes
])
def test_should_refer_malformed_bodies_that_the_reference_refuses(body):
    assert reference("logs", body) is None
    assert wire_rows("logs", body) is None


def _nest_bytes(record: bytes) -> bytes:
    """A logs request of one resource, one scope and the record ``record`` (wire bytes)."""
    scope = b"\x12" + _varint(len(record)) + record
    resource = b"\x12" + _varint(len(scope)) + scope
    return b"\x0a" + _varint(len(resource)) + resource


def test_should_refer_a_body_sent_twice_which_protobuf_merges():
    record = LogRecord(time_unix_nano=1, body=AnyValue(kvlist_value=KeyValueList(
        values=[KeyValue(key="a", value=AnyValue(int_value=1))])))
    body = _nest_bytes(record.SerializeToString() * 2)  # one body: two entries, merged
    assert wire_rows("logs", body) is None
    found = reference("logs", body)
    assert found is not None
    assert b'"body":"{\\"a\\":1}"' in found.rows["logs"][0]


def test_should_refer_unknown_groups_which_the_reference_skips():
    body = b"\x2b\x08\x01\x2c" + _nest_bytes(LogRecord(time_unix_nano=1).SerializeToString())
    check("logs", body, must_read=False)
    assert wire_rows("logs", body) is None
    assert reference("logs", body) is not None


def test_should_write_doubles_as_msgspec_does():
    values = [1e16, 1e-7, 1e-5, 0.1, -0.0, 5e-324, 1.7976931348623157e308, math.nan,
              math.inf, -math.inf, 100.5]
    record = LogRecord(time_unix_nano=1, attributes=[
        KeyValue(key=f"k{i}", value=AnyValue(double_value=v)) for i, v in enumerate(values)],
        body=AnyValue(array_value=ArrayValue(values=[AnyValue(double_value=v)
                                                     for v in values])))
    request = ExportLogsServiceRequest(resource_logs=[ResourceLogs(scope_logs=[ScopeLogs(
        log_records=[record])])])
    check("logs", request.SerializeToString(), must_read=True)


def test_should_refer_a_metric_without_data_which_the_reference_counts_as_rejected():
    request = ExportMetricsServiceRequest(resource_metrics=[m.ResourceMetrics(scope_metrics=[
        m.ScopeMetrics(metrics=[m.Metric(name="empty"), m.Metric(name="g", gauge=m.Gauge(
            data_points=[m.NumberDataPoint(time_unix_nano=1, as_int=3)]))])])])
    body = request.SerializeToString()
    assert wire_rows("metrics", body) is None
    found = reference("metrics", body)
    assert found is not None
    assert (len(found.rows["gauge"]), found.rejected) == (1, 1)
