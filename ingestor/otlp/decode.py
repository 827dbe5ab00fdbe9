"""OTLP export requests from bytes: the three signals, their messages, and the two encodings.

Why a module of its own: both transports read the same messages (gRPC hands over the bytes
of its message, HTTP its decompressed body), and a request that cannot be read must be
refused alike, with a message that says where it is broken, before anything is admitted.

OTLP/JSON is the protobuf JSON mapping with two differences (OTLP specification,
"JSON Protobuf Encoding"): trace and span ids are hex strings, not base64, and unknown
fields are ignored. So the body is parsed as JSON, every id is turned from hex into what
``google.protobuf.json_format`` expects (base64), and ``json_format`` does the rest (it
takes lowerCamelCase and the original field names, enums as integers or their full names,
64-bit integers as numbers or decimal strings). An enum name that is not the enum's and an
id of the wrong length are refused here (``json_format`` would take the first as 0).
"""

from __future__ import annotations

import base64
import re
from typing import Any, Final, NamedTuple

import msgspec
from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.logs.v1 import logs_pb2
from opentelemetry.proto.metrics.v1 import metrics_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from ingestor.errors import BadRequest

__all__ = ["PATHS", "SIGNALS", "Signal", "parse_json", "parse_protobuf"]


class Signal(NamedTuple):
    """One OTLP signal: its name (``[otlp]``'s ``SIGNAL_KINDS`` key), its export request and
    response messages, and the response's rejected-count field (partial success)."""

    name: str
    request: type[Message]
    response: type[Message]
    rejected_field: str


SIGNALS: Final = {
    "logs": Signal("logs", logs_service_pb2.ExportLogsServiceRequest,
                   logs_service_pb2.ExportLogsServiceResponse, "rejected_log_records"),
    "traces": Signal("traces", trace_service_pb2.ExportTraceServiceRequest,
                     trace_service_pb2.ExportTraceServiceResponse, "rejected_spans"),
    "metrics": Signal("metrics", metrics_service_pb2.ExportMetricsServiceRequest,
                      metrics_service_pb2.ExportMetricsServiceResponse,
                      "rejected_data_points"),
}
PATHS: Final = {"/v1/logs": SIGNALS["logs"], "/v1/traces": SIGNALS["traces"],
                "/v1/metrics": SIGNALS["metrics"]}
"""OTLP/HTTP's paths (the specification's defaults) and their signals."""

_ID_KEYS: Final = frozenset({"traceId", "trace_id", "spanId", "span_id", "parentSpanId",
                             "parent_span_id"})
"""The bytes fields OTLP/JSON spells in hex: ids of spans, links, log records, exemplars.
Attribute keys never collide with them: an attribute's name is the *value* of ``key``."""
_ID_DIGITS: Final = {"traceId": 32, "trace_id": 32}
"""Hex digits of a trace id (16 bytes); every other id is a span id (8 bytes, 16 digits).
An empty string is an id left unset (a root span's ``parentSpanId``)."""
_ENUMS: Final = {
    "kind": ("SpanKind", tuple(trace_pb2.Span.SpanKind.keys())),
    "code": ("StatusCode", tuple(trace_pb2.Status.StatusCode.keys())),
    "severityNumber": ("SeverityNumber", tuple(logs_pb2.SeverityNumber.keys())),
    "severity_number": ("SeverityNumber", tuple(logs_pb2.SeverityNumber.keys())),
    "aggregationTemporality": ("AggregationTemporality",
                               tuple(metrics_pb2.AggregationTemporality.keys())),
    "aggregation_temporality": ("AggregationTemporality",
                                tuple(metrics_pb2.AggregationTemporality.keys())),
}
"""The enum fields of the three signals, by JSON key: OTLP/JSON spells them as integers,
and ``json_format`` also takes their full names, but with unknown fields ignored it turns
any other name (``"SERVER"`` for ``SPAN_KIND_SERVER``) into 0 without a word, so a name
that is not one of the enum's is refused here. (Each key names one enum in OTLP: ``kind``
only a span's, ``code`` only a status'.)"""
_JSON: Final = msgspec.json.Decoder()
_LONE_SURROGATE: Final = re.compile(
    rb"(?<!\\)(?:\\\\)*\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})"
    rb"|(?<!\\)(?:\\\\)*(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2}")
"""A high surrogate escape not followed by a low one, or a low one not after a high one."""
_MAX_PATH_SHOWN: Final = 120


def parse_protobuf(signal: Signal, body: bytes) -> Message:
    """The export request in ``body`` (binary protobuf).

    Raises:
        BadRequest: ``invalid_protobuf``: not a valid message of the signal, including a
            string field (an attribute's key or value, a body, a name) that is not UTF-8.
    """
    try:
        return signal.request.FromString(body)
    except DecodeError as exc:
        raise BadRequest(f"the body is not a valid OTLP {signal.request.DESCRIPTOR.full_name} "
                         f"(protobuf): {_reason(exc)}; send the exporter's "
                         "application/x-protobuf body unchanged", code="invalid_protobuf") \
            from None


def parse_json(signal: Signal, body: bytes) -> Message:
    """The export request in ``body`` (OTLP/JSON: hex ids; unknown fields ignored).

    Raises:
        BadRequest: ``invalid_json``: not UTF-8 JSON, an id that is not hex, or a value
            the message's field cannot take.
    """
    try:
        tree = _JSON.decode(body)
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        if _LONE_SURROGATE.search(body):  # msgspec calls it "truncated"
            raise BadRequest("the body holds a \\uD800-\\uDFFF escape without its pair (a "
                             "lone UTF-16 surrogate), which is no Unicode character; send "
                             "the character itself, or both halves of its escape",
                             code="invalid_json") from None
        raise BadRequest(f"the body is not valid JSON ({_reason(exc)}); OTLP/JSON is one "
                         "UTF-8 JSON "
                         f"object, an {signal.request.DESCRIPTOR.name}",
                         code="invalid_json") from None
    if not isinstance(tree, dict):
        raise BadRequest(f"the body is JSON {type(tree).__name__}, not an object: OTLP/JSON "
                         f"is one {signal.request.DESCRIPTOR.name} object", code="invalid_json")
    _prepare(tree, "")
    message = signal.request()
    try:
        json_format.ParseDict(tree, message, ignore_unknown_fields=True)
    except (json_format.ParseError, ValueError, TypeError) as exc:
        raise BadRequest(f"the body is not a valid OTLP/JSON {signal.request.DESCRIPTOR.name}: "
                         f"{_reason(exc)}", code="invalid_json") from None
    return message


def _prepare(node: Any, path: str) -> None:
    """Turn every hex id below ``node`` into base64, in place (see :data:`_ID_KEYS`), and
    refuse an enum name that is not the enum's (see :data:`_ENUMS`)."""
    if isinstance(node, dict):
        for key, value in node.items():
            where = f"{path}.{key}" if path else str(key)
            if key in _ID_KEYS and isinstance(value, str):
                node[key] = _hex_to_base64(value, where, _ID_DIGITS.get(key, 16))
            elif key in _ENUMS and isinstance(value, str):
                _check_enum_name(value, where, *_ENUMS[key])
            elif isinstance(value, dict | list):
                _prepare(value, where)
    elif isinstance(node, list):
        for index, value in enumerate(node):
            if isinstance(value, dict | list):
                _prepare(value, f"{path}[{index}]")


def _check_enum_name(value: str, where: str, enum: str, names: tuple[str, ...]) -> None:
    if value not in names:
        raise BadRequest(f"{where[:_MAX_PATH_SHOWN]}: {value[:40]!r} is not a {enum}; "
                         f"OTLP/JSON spells enums as integers (or the full names: "
                         f"{', '.join(names[:3])}, ...)", code="invalid_json")


def _hex_to_base64(value: str, where: str, digits: int) -> str:
    try:
        raw = bytes.fromhex(value)
    except ValueError:
        raise BadRequest(f"{where[:_MAX_PATH_SHOWN]}: {value[:40]!r} is not a hex string; "
                         "OTLP/JSON spells trace and span ids in hex (32 and 16 digits), not "
                         "base64", code="invalid_json") from None
    if value and (len(value) != digits or len(raw) * 2 != digits):
        raise BadRequest(f"{where[:_MAX_PATH_SHOWN]}: {value[:40]!r} is not {digits} hex "
                         f"digits (a {'trace' if digits == 32 else 'span'} id is "
                         f"{digits // 2} bytes)", code="invalid_json")
    return base64.b64encode(raw).decode("ascii")


def _reason(exc: Exception) -> str:
    """The parser's own words, on one line and bounded (a client's mistake, not a log)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:300]

