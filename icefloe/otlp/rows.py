"""An OTLP export request as rows: one JSON object per log record, span or data point.

Why JSON objects: the rows belong to the generated streams (:mod:`icefloe.otlp.config`),
whose columns are :mod:`icefloe.otlp.schemas`'. The receivers decode the request (protobuf
or OTLP/JSON) into the ``opentelemetry-proto`` messages and call :func:`export_rows`; this
module reads them by attribute only (no import of the generated classes), so the core loads
without them. Two forms of the same rows:

* ``canonical=False``: what a client could have posted to the stream (attributes as JSON
  objects), to pass the stream's validation (``CompiledStream.from_events``);
* ``canonical=True``: what that validation would give back, byte for byte (maps as
  key/value entries, null members left out, timestamps RFC 3339 UTC): a receiver may admit
  these without validating again, which halves the ingest cost of a record. The equality is
  tested for every kind (tests/core/test_otlp_rows.py).

Speed: the resource and scope columns are encoded once per scope and spliced onto each of
its rows; a row is a msgspec struct built positionally (:mod:`icefloe.otlp.row_types`).

Values (docs/otlp.md): attributes and a non-string body as in :mod:`icefloe.otlp.values`;
a time of 0 is unset (null ``timestamp``; a log record without a time takes its observed
time, as the log data model says); a ``fixed64`` time or count at or past 2^63 cannot be a
``long`` and its record is rejected with the reason, never stored wrapped; empty strings
and ids (proto3 cannot tell them from unset) are null; a NaN or infinite double is null
(JSON has no such numbers); a ``Metric`` with no data cannot become a row and counts as
one rejected data point.
"""

from __future__ import annotations

import operator
from typing import Any

import msgspec

from icefloe.otlp.kinds import SIGNAL_KINDS
from icefloe.otlp.metric_rows import metric_rows
from icefloe.otlp.out import Attributes, ExportRows, Out
from icefloe.otlp.row_types import LogRow, Shared, SpanEvent, SpanLink, SpanRow
from icefloe.otlp.values import (
    SPAN_KINDS,
    STATUS_CODES,
    attribute_map,
    attribute_pairs,
    enum_name,
    hex_of,
    text_of,
    time_of,
)

_ENCODE = msgspec.json.Encoder().encode
__all__ = ["ExportRows", "export_rows"]


def export_rows(signal: str, request: Any, *, canonical: bool = False) -> ExportRows:
    """The rows of an ``Export{Logs,Trace,Metrics}ServiceRequest`` of ``signal`` (``logs``,
    ``traces`` or ``metrics``); ``canonical``: in the streams' canonical form (above)."""
    if signal not in SIGNAL_KINDS:
        raise ValueError(f"unknown OTLP signal {signal!r} (expected one of "
                         f"{', '.join(SIGNAL_KINDS)})")
    attrs = attribute_pairs if canonical else attribute_map
    out = Out()
    if signal == "logs":
        for resource in request.resource_logs:
            res = _resource(resource, attrs)
            for scope in resource.scope_logs:
                out.scope("logs", _shared(res, scope, attrs))
                out.add(_log_row, scope.log_records, attrs)
    elif signal == "traces":
        for resource in request.resource_spans:
            res = _resource(resource, attrs)
            for scope in resource.scope_spans:
                out.scope("spans", _shared(res, scope, attrs))
                out.add(_span_row, scope.spans, attrs)
    else:
        for resource in request.resource_metrics:
            res = _resource(resource, attrs)
            for scope in resource.scope_metrics:
                shared = _shared(res, scope, attrs)
                for metric in scope.metrics:
                    metric_rows(out, metric, shared, attrs)
    return out.result()._replace(canonical=canonical)


def _resource(resource_x: Any, attrs: Attributes) -> tuple[Any, Any, Any, Any]:
    """The resource columns of one ``Resource{Logs,Spans,Metrics}``."""
    resource = resource_x.resource
    pairs = resource.attributes
    service = None
    for kv in pairs:  # the last one wins, as in the map
        if kv.key == "service.name":
            service = text_of(kv.value)
    return (service, attrs(pairs), resource.dropped_attributes_count,
            resource_x.schema_url or None)


def _shared(resource: tuple[Any, Any, Any, Any], scope_x: Any, attrs: Attributes) -> bytes:
    """The resource and scope columns as the tail of a JSON object (``,"k":v...}``),
    spliced onto each row of the scope. A row is never empty (it always has a time's
    ``_unix_nano``), so the comma always follows a member."""
    scope = scope_x.scope
    columns = Shared(*resource, scope.name or None, scope.version or None,
                     attrs(scope.attributes), scope.dropped_attributes_count,
                     scope_x.schema_url or None)
    return b"," + _ENCODE(columns)[1:]


_LOG_FIELDS = operator.attrgetter(
    "time_unix_nano", "observed_time_unix_nano", "severity_number", "severity_text", "body",
    "attributes", "dropped_attributes_count", "flags", "trace_id", "span_id", "event_name")
"""A log record's fields in one call (a third cheaper than reading them one by one)."""


def _log_row(record: Any, attrs: Attributes) -> LogRow:
    (ns, observed_ns, severity, severity_text, body, attributes, dropped, flags, trace_id,
     span_id, event_name) = _LOG_FIELDS(record)
    observed = time_of(observed_ns, "observed_time_unix_nano")
    return LogRow(time_of(ns, "time_unix_nano") if ns else observed, ns,
                  observed, observed_ns, severity, severity_text or None,
                  text_of(body), attrs(attributes), dropped, flags,
                  trace_id.hex() if trace_id else None, span_id.hex() if span_id else None,
                  event_name or None)


_SPAN_FIELDS = operator.attrgetter(
    "trace_id", "span_id", "parent_span_id", "trace_state", "name", "kind",
    "start_time_unix_nano", "end_time_unix_nano", "status", "attributes",
    "dropped_attributes_count", "events", "dropped_events_count", "links",
    "dropped_links_count", "flags")


def _span_row(span: Any, attrs: Attributes) -> SpanRow:
    (trace_id, span_id, parent, trace_state, name, kind, start, end, status, attributes,
     dropped, events, dropped_events, links, dropped_links, flags) = _SPAN_FIELDS(span)
    return SpanRow(hex_of(trace_id), hex_of(span_id), hex_of(parent), trace_state or None,
                   name or None, enum_name(SPAN_KINDS, kind),
                   time_of(start, "start_time_unix_nano"), start,
                   time_of(end, "end_time_unix_nano"), end,
                   end - start if start and end else None,
                   enum_name(STATUS_CODES, status.code), status.message or None,
                   attrs(attributes), dropped,
                   [_span_event(e, attrs) for e in events] if events else [],
                   dropped_events,
                   [_span_link(link, attrs) for link in links] if links else [],
                   dropped_links, flags)


def _span_event(event: Any, attrs: Attributes) -> SpanEvent:
    ns = event.time_unix_nano
    return SpanEvent(time_of(ns, "events.time_unix_nano"), ns, event.name or None,
                     attrs(event.attributes), event.dropped_attributes_count)


def _span_link(link: Any, attrs: Attributes) -> SpanLink:
    return SpanLink(hex_of(link.trace_id), hex_of(link.span_id), link.trace_state or None,
                    attrs(link.attributes), link.flags, link.dropped_attributes_count)
