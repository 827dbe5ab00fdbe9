"""Reading OTLP export requests (issue #41): protobuf and OTLP/JSON, and the answers' shapes.

OTLP/JSON differs from the protobuf JSON mapping in its ids (hex, not base64) and in
ignoring unknown fields; field names come lowerCamelCase or as in the .proto, enums as
names or integers, 64-bit integers as numbers or strings. Every broken body is a 400
(``BadRequest``) whose message says what is wrong.
"""

from __future__ import annotations

import json

import pytest
from google.rpc import status_pb2
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from ingestor.errors import BadRequest, Overloaded
from ingestor.otlp.answers import status_body, success_body
from ingestor.otlp.decode import PATHS, SIGNALS, parse_json, parse_protobuf

TRACE = "5b8efff798038103d269b633813fc60c"
SPAN = "eee19b7ec3c1b174"


def test_should_read_otlp_json_with_hex_ids_camel_case_and_int_enums():
    body = json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [{
        "traceId": TRACE, "spanId": SPAN, "parentSpanId": "", "name": "GET /",
        "kind": 2, "startTimeUnixNano": "1700000000000000000", "endTimeUnixNano": 1700000001,
        "links": [{"traceId": TRACE, "spanId": SPAN}],
        "futureField": {"ignored": True}}]}]}]}).encode()
    request = parse_json(SIGNALS["traces"], body)
    span = request.resource_spans[0].scope_spans[0].spans[0]
    assert span.trace_id.hex() == TRACE
    assert span.span_id.hex() == SPAN
    assert span.links[0].span_id.hex() == SPAN
    assert span.kind == 2
    assert span.start_time_unix_nano == 1700000000000000000


def test_should_read_original_field_names_and_enum_names():
    body = json.dumps({"resource_logs": [{"scope_logs": [{"log_records": [{
        "trace_id": TRACE, "severity_number": "SEVERITY_NUMBER_ERROR",
        "body": {"string_value": "boom"}}]}]}]}).encode()
    record = parse_json(SIGNALS["logs"], body).resource_logs[0].scope_logs[0].log_records[0]
    assert record.trace_id.hex() == TRACE
    assert record.severity_number == 17
    assert record.body.string_value == "boom"


def test_should_take_an_attribute_named_like_an_id_as_it_is():
    """An attribute's name is the value of ``key``: never mistaken for an id field."""
    body = json.dumps({"resourceLogs": [{"scopeLogs": [{"logRecords": [{"attributes": [
        {"key": "traceId", "value": {"stringValue": "not hex at all"}}]}]}]}]}).encode()
    record = parse_json(SIGNALS["logs"], body).resource_logs[0].scope_logs[0].log_records[0]
    assert record.attributes[0].value.string_value == "not hex at all"


@pytest.mark.parametrize(("body", "words"), [
    (b"{not json", "not valid JSON"),
    (b"[1, 2]", "not an object"),
    (b'{"resourceLogs": [{"scopeLogs": [{"logRecords": [{"traceId": "zz"}]}]}]}',
     "resourceLogs[0].scopeLogs[0].logRecords[0].traceId: 'zz' is not a hex string"),
    (b'{"resourceLogs": [{"scopeLogs": [{"logRecords": [{"timeUnixNano": "soon"}]}]}]}',
     "not a valid OTLP/JSON ExportLogsServiceRequest"),
    (b'{"resourceLogs": [{"scopeLogs": [{"logRecords": [{"body": {"stringValue": "\xff"}}]}]}]}',
     "not valid JSON"),
])
def test_should_refuse_broken_json_saying_where(body, words):
    with pytest.raises(BadRequest) as info:
        parse_json(SIGNALS["logs"], body)
    assert words in info.value.message
    assert info.value.code == "invalid_json"


def test_should_refuse_malformed_protobuf_and_invalid_utf8():
    request = logs_service_pb2.ExportLogsServiceRequest()
    record = request.resource_logs.add().scope_logs.add().log_records.add()
    record.attributes.add(key="user", value={"string_value": "zoë"})
    good = request.SerializeToString()
    assert parse_protobuf(SIGNALS["logs"], good) == request
    bad_utf8 = good.replace("zoë".encode(), b"zo\xff\xfe")
    with pytest.raises(BadRequest) as info:
        parse_protobuf(SIGNALS["logs"], bad_utf8)
    assert "UTF-8" in info.value.message
    assert info.value.code == "invalid_protobuf"
    with pytest.raises(BadRequest) as info:
        parse_protobuf(SIGNALS["logs"], b"\x0a\xff\xff\xff")
    assert "ExportLogsServiceRequest" in info.value.message


def test_should_answer_partial_success_and_status_in_the_request_encoding():
    ok = trace_service_pb2.ExportTraceServiceResponse.FromString(
        success_body(SIGNALS["traces"], 0, "", json=False))
    assert not ok.HasField("partial_success")
    assert json.loads(success_body(SIGNALS["traces"], 0, "", json=True)) == {}
    partial = json.loads(success_body(SIGNALS["traces"], 2, "2 records rejected", json=True))
    assert partial == {"partialSuccess": {"rejectedSpans": "2",
                                          "errorMessage": "2 records rejected"}}
    error = Overloaded("buffer full", retry_after_s=1)
    status = status_pb2.Status.FromString(status_body(error, json=False))
    assert (status.code, status.message) == (8, "buffer full")  # RESOURCE_EXHAUSTED
    assert json.loads(status_body(error, json=True)) == {"code": 8, "message": "buffer full"}


def test_should_route_the_three_default_paths():
    assert {path: signal.name for path, signal in PATHS.items()} == {
        "/v1/logs": "logs", "/v1/traces": "traces", "/v1/metrics": "metrics"}
