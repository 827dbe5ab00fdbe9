"""An OTLP export request as rows: one JSON object per log record, span or data point.

Why JSON objects: the rows enter the generated streams (:mod:`icefloe.otlp.config`) through
their ordinary validation, so they are exactly what a client could have posted; the
columns are :mod:`icefloe.otlp.schemas`'. The receivers decode the request (protobuf or
OTLP/JSON) into the ``opentelemetry-proto`` messages and call :func:`export_rows`; this
module reads them by attribute only (no import of the generated classes), so the core
loads without them.

Speed: the resource and scope columns are encoded once per scope and spliced into each of
its rows; a row is one dict encoded by msgspec. Values:

* attributes and a non-string body: see :mod:`icefloe.otlp.schemas` (JSON text);
* a time of 0 is unset: its ``timestamp`` column is null (a log record without a time
  takes its observed time, as the log data model says to);
* a ``fixed64`` time or count at or past 2^63 (year 2262) does not fit a ``long``: the
  record is rejected with the reason, never stored wrapped;
* an empty string (proto3 cannot tell it from unset) and empty ids are null;
* a ``Metric`` with no data (none of gauge, sum, histogram, exponential histogram,
  summary) cannot become a row: it counts as one rejected data point with the reason.
"""

from __future__ import annotations

import base64
import datetime as dt
import math
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import msgspec

from icefloe.otlp.kinds import METRIC_KINDS, SIGNAL_KINDS

LONG_MAX = 2**63 - 1
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_US = dt.timedelta(microseconds=1)
_ENCODE = msgspec.json.Encoder().encode
_SPAN_KINDS = ("UNSPECIFIED", "INTERNAL", "SERVER", "CLIENT", "PRODUCER", "CONSUMER")
_STATUS_CODES = ("UNSET", "OK", "ERROR")
_TEMPORALITIES = ("UNSPECIFIED", "DELTA", "CUMULATIVE")
_NON_FINITE = {math.inf: "Infinity", -math.inf: "-Infinity"}
Row = dict[str, Any]


class ExportRows(NamedTuple):
    """What one export request becomes: ``rows`` per kind (JSON object bytes, in request
    order; only kinds with rows appear), and the records that could not become rows."""

    rows: dict[str, list[bytes]]
    rejected: int
    message: str
    """Why the first rejected record was (with the count when more were); "" when none."""


class Rejected(ValueError):
    """A record that cannot become a row; the message says which and why."""


def export_rows(signal: str, request: Any) -> ExportRows:
    """The rows of an ``Export{Logs,Trace,Metrics}ServiceRequest`` of ``signal`` (``logs``,
    ``traces`` or ``metrics``)."""
    if signal not in SIGNAL_KINDS:
        raise ValueError(f"unknown OTLP signal {signal!r} (expected one of "
                         f"{', '.join(SIGNAL_KINDS)})")
    out = _Out()
    if signal == "logs":
        for resource in request.resource_logs:
            res = _resource(resource)
            for scope in resource.scope_logs:
                shared = _shared(res, scope)
                for record in scope.log_records:
                    out.add("logs", _log_row, record, shared)
    elif signal == "traces":
        for resource in request.resource_spans:
            res = _resource(resource)
            for scope in resource.scope_spans:
                shared = _shared(res, scope)
                for span in scope.spans:
                    out.add("spans", _span_row, span, shared)
    else:
        for resource in request.resource_metrics:
            res = _resource(resource)
            for scope in resource.scope_metrics:
                shared = _shared(res, scope)
                for metric in scope.metrics:
                    _metric_rows(out, metric, shared)
    return out.result()


class _Out:
    """Rows per kind, and the rejected count with the first reason."""

    def __init__(self) -> None:
        self.rows: dict[str, list[bytes]] = {}
        self.rejected = 0
        self.first = ""

    def add(self, kind: str, build: Callable[[Any], Row], record: Any, shared: bytes) -> None:
        try:
            row = build(record)
        except Rejected as exc:
            self.reject(str(exc))
            return
        payload = _ENCODE(row)
        rows = self.rows.get(kind)
        if rows is None:
            rows = self.rows[kind] = []
        rows.append(payload[:-1] + shared)

    def reject(self, why: str, count: int = 1) -> None:
        if not self.rejected:
            self.first = why
        self.rejected += count

    def result(self) -> ExportRows:
        message = self.first
        if self.rejected > 1:
            message = f"{self.rejected} records rejected; the first: {self.first}"
        return ExportRows(self.rows, self.rejected, message)


# -- values ---------------------------------------------------------------------------------

def _time(ns: int, field: str) -> dt.datetime | None:
    """A ``fixed64`` nanosecond time as a UTC datetime (microseconds); 0 is unset."""
    if not ns:
        return None
    if ns > LONG_MAX:
        raise Rejected(f"{field} {ns} is past 2^63 ns (year 2262): not a time")
    return _EPOCH + (ns // 1000) * _US


def _long(value: int, field: str) -> int:
    """A ``uint64``/``fixed64`` count that must fit a signed long."""
    if value > LONG_MAX:
        raise Rejected(f"{field} {value} does not fit a 64-bit signed integer")
    return value


def _longs(values: Iterable[int], field: str) -> list[int]:
    found = list(values)
    if found and max(found) > LONG_MAX:
        raise Rejected(f"{field} holds a count past 2^63-1")
    return found


def _hex(raw: bytes) -> str | None:
    return raw.hex() if raw else None


def _enum(names: tuple[str, ...], value: int) -> str:
    return names[value] if 0 <= value < len(names) else str(value)


def _plain(value: Any) -> Any:
    """An ``AnyValue`` as a JSON-ready Python value (arrays and kvlists nested)."""
    kind = value.WhichOneof("value")
    if kind == "string_value":
        return value.string_value
    if kind == "int_value":
        return value.int_value
    if kind == "double_value":
        number = value.double_value
        return number if math.isfinite(number) else _non_finite(number)
    if kind == "bool_value":
        return value.bool_value
    if kind == "bytes_value":
        return base64.b64encode(value.bytes_value).decode()
    if kind == "array_value":
        return [_plain(item) for item in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _plain(kv.value) for kv in value.kvlist_value.values}
    return None  # unset (an empty AnyValue), or profiles' string_value_strindex


def _non_finite(number: float) -> str:
    return "NaN" if math.isnan(number) else _NON_FINITE[number]


def _text(value: Any) -> str | None:
    """An ``AnyValue`` as text: a string as it is, anything else as its JSON text, null for
    an empty value."""
    kind = value.WhichOneof("value")
    if kind == "string_value":
        text: str = value.string_value
        return text
    if kind is None:
        return None
    if kind == "int_value":
        return str(value.int_value)
    if kind == "bool_value":
        return "true" if value.bool_value else "false"
    plain = _plain(value)
    if plain is None or plain.__class__ is str:
        return plain
    return _ENCODE(plain).decode()


def _attributes(pairs: Iterable[Any]) -> dict[str, str | None]:
    """``KeyValue`` pairs as a map (a repeated key: the last one wins, as in OTLP/JSON)."""
    return {kv.key: _text(kv.value) for kv in pairs}


# -- resource and scope ---------------------------------------------------------------------

def _resource(resource_x: Any) -> Row:
    """The resource columns of one ``Resource{Logs,Spans,Metrics}``."""
    resource = resource_x.resource
    attributes = _attributes(resource.attributes)
    return {"service_name": attributes.get("service.name"),
            "resource_attributes": attributes,
            "resource_dropped_attributes_count": resource.dropped_attributes_count,
            "resource_schema_url": resource_x.schema_url or None}


def _shared(resource: Row, scope_x: Any) -> bytes:
    """The resource and scope columns as the tail of a JSON object (``,"k":v...}``),
    spliced onto each row of the scope."""
    scope = scope_x.scope
    columns = {**resource,
               "scope_name": scope.name or None,
               "scope_version": scope.version or None,
               "scope_attributes": _attributes(scope.attributes),
               "scope_dropped_attributes_count": scope.dropped_attributes_count,
               "scope_schema_url": scope_x.schema_url or None}
    return b"," + _ENCODE(columns)[1:]


# -- logs and spans -------------------------------------------------------------------------

def _log_row(record: Any) -> Row:
    ns = record.time_unix_nano
    observed_ns = record.observed_time_unix_nano
    observed = _time(observed_ns, "observed_time_unix_nano")
    body = _text(record.body) if record.HasField("body") else None
    return {"time": _time(ns, "time_unix_nano") if ns else observed,
            "time_unix_nano": ns,
            "observed_time": observed,
            "observed_time_unix_nano": observed_ns,
            "severity_number": record.severity_number,
            "severity_text": record.severity_text or None,
            "body": body,
            "attributes": _attributes(record.attributes),
            "dropped_attributes_count": record.dropped_attributes_count,
            "flags": record.flags,
            "trace_id": _hex(record.trace_id),
            "span_id": _hex(record.span_id),
            "event_name": record.event_name or None}


def _span_row(span: Any) -> Row:
    start, end = span.start_time_unix_nano, span.end_time_unix_nano
    status = span.status
    return {"trace_id": _hex(span.trace_id),
            "span_id": _hex(span.span_id),
            "parent_span_id": _hex(span.parent_span_id),
            "trace_state": span.trace_state or None,
            "name": span.name,
            "kind": _enum(_SPAN_KINDS, span.kind),
            "start_time": _time(start, "start_time_unix_nano"),
            "start_time_unix_nano": start,
            "end_time": _time(end, "end_time_unix_nano"),
            "end_time_unix_nano": end,
            "duration_ns": end - start if start and end else None,
            "status_code": _enum(_STATUS_CODES, status.code),
            "status_message": status.message or None,
            "attributes": _attributes(span.attributes),
            "dropped_attributes_count": span.dropped_attributes_count,
            "events": [_span_event(event) for event in span.events],
            "dropped_events_count": span.dropped_events_count,
            "links": [_span_link(link) for link in span.links],
            "dropped_links_count": span.dropped_links_count,
            "flags": span.flags}


def _span_event(event: Any) -> Row:
    ns = event.time_unix_nano
    return {"time": _time(ns, "events.time_unix_nano"), "time_unix_nano": ns,
            "name": event.name, "attributes": _attributes(event.attributes),
            "dropped_attributes_count": event.dropped_attributes_count}


def _span_link(link: Any) -> Row:
    return {"trace_id": _hex(link.trace_id), "span_id": _hex(link.span_id),
            "trace_state": link.trace_state or None,
            "attributes": _attributes(link.attributes), "flags": link.flags,
            "dropped_attributes_count": link.dropped_attributes_count}


# -- metrics --------------------------------------------------------------------------------

def _metric_rows(out: _Out, metric: Any, shared: bytes) -> None:
    """Each data point of one ``Metric`` as a row of its kind's table."""
    kind = metric.WhichOneof("data")
    if kind not in METRIC_KINDS:
        out.reject(f"metric {metric.name!r} has no data (none of {', '.join(METRIC_KINDS)})")
        return
    head: Row = {"metric_name": metric.name,
                 "metric_description": metric.description or None,
                 "metric_unit": metric.unit or None,
                 "metric_metadata": _attributes(metric.metadata)}
    data = getattr(metric, kind)
    extra: Row = {}
    if kind in ("sum", "histogram", "exponential_histogram"):
        extra["aggregation_temporality"] = _enum(_TEMPORALITIES,
                                                 data.aggregation_temporality)
    if kind == "sum":
        extra["is_monotonic"] = data.is_monotonic
    point_row = _POINT_ROWS[kind]
    splice = b"," + _ENCODE({**head, **extra})[1:-1] + shared

    def build(point: Any) -> Row:
        return point_row(point, metric.name)

    for point in data.data_points:
        out.add(kind, build, point, splice)


def _point(point: Any, name: str) -> Row:
    """The columns every data point has."""
    ns, start = point.time_unix_nano, point.start_time_unix_nano
    return {"time": _time(ns, f"metric {name!r}: time_unix_nano"),
            "time_unix_nano": ns,
            "start_time": _time(start, f"metric {name!r}: start_time_unix_nano"),
            "start_time_unix_nano": start,
            "attributes": _attributes(point.attributes),
            "flags": point.flags}


def _number(point: Any, name: str) -> Row:
    """A gauge or sum point: ``value`` always a double, ``value_int`` exact for ints."""
    row = _point(point, name)
    which = point.WhichOneof("value")
    if which == "as_int":
        row["value"] = float(point.as_int)
        row["value_int"] = point.as_int
    elif which == "as_double":
        row["value"] = point.as_double
    row["exemplars"] = [_exemplar(e, name) for e in point.exemplars]
    return row


def _exemplar(exemplar: Any, name: str) -> Row:
    ns = exemplar.time_unix_nano
    row: Row = {"time": _time(ns, f"metric {name!r}: exemplar time_unix_nano"),
                "time_unix_nano": ns,
                "trace_id": _hex(exemplar.trace_id), "span_id": _hex(exemplar.span_id),
                "filtered_attributes": _attributes(exemplar.filtered_attributes)}
    which = exemplar.WhichOneof("value")
    if which == "as_int":
        row["value"] = float(exemplar.as_int)
        row["value_int"] = exemplar.as_int
    elif which == "as_double":
        row["value"] = exemplar.as_double
    return row


def _stats(point: Any, name: str) -> Row:
    """count, sum, min and max of a histogram point (sum, min, max are optional)."""
    row = _point(point, name)
    row["count"] = _long(point.count, f"metric {name!r}: count")
    for field in ("sum", "min", "max"):
        if point.HasField(field):
            row[field] = getattr(point, field)
    row["exemplars"] = [_exemplar(e, name) for e in point.exemplars]
    return row


def _histogram(point: Any, name: str) -> Row:
    row = _stats(point, name)
    row["bucket_counts"] = _longs(point.bucket_counts, f"metric {name!r}: bucket_counts")
    row["explicit_bounds"] = list(point.explicit_bounds)
    return row


def _exponential_histogram(point: Any, name: str) -> Row:
    row = _stats(point, name)
    row["scale"] = point.scale
    row["zero_count"] = _long(point.zero_count, f"metric {name!r}: zero_count")
    row["zero_threshold"] = point.zero_threshold
    for side in ("positive", "negative"):
        buckets = getattr(point, side)
        row[f"{side}_offset"] = buckets.offset
        row[f"{side}_bucket_counts"] = _longs(buckets.bucket_counts,
                                              f"metric {name!r}: {side}.bucket_counts")
    return row


def _summary(point: Any, name: str) -> Row:
    row = _point(point, name)
    row["count"] = _long(point.count, f"metric {name!r}: count")
    row["sum"] = point.sum
    row["quantile_values"] = [{"quantile": q.quantile, "value": q.value}
                              for q in point.quantile_values]
    return row


_POINT_ROWS: dict[str, Callable[[Any, str], Row]] = {
    "gauge": _number, "sum": _number, "histogram": _histogram,
    "exponential_histogram": _exponential_histogram, "summary": _summary}
