"""The columns of each OTLP table: one documented schema per kind of row.

Why these names: they are OTLP's own protobuf field names in snake_case (``time_unix_nano``,
``severity_number``, ``dropped_attributes_count``), so the OpenTelemetry specification
documents every column; the few columns OTLP has no field for say where they come from
(``service_name`` is the resource attribute ``service.name``, ``duration_ns`` is end minus
start). Resource and scope fields are flattened into ``resource_*`` and ``scope_*`` columns
of every row (a table has no parent rows). The docs' column tables are generated from
:data:`COLUMNS` (``scripts/gen_docs.py``), so they cannot drift from what the tables hold.

Types, and why:

* times are ``timestamp`` (microseconds, UTC) *and* ``..._unix_nano`` ``long`` columns:
  Iceberg keeps nanosecond timestamps only in format-version 3 tables, which the writer
  cannot write yet, so the nanoseconds are kept exactly in the ``long`` beside it;
* attributes are ``map<string,string>``: a string value as it is, any other value as its
  JSON text (``42``, ``1.5``, ``true``, ``["a",1]``, ``{"k":"v"}``; bytes as base64 text;
  a non-finite double as ``NaN``, ``Infinity``, ``-Infinity``). One map type queries with
  ``attributes['http.route']`` whatever types a producer sends, and a key that changes type
  between producers (an int here, a string there) never breaks a write; casting back is
  ``CAST(attributes['http.response.status_code'] AS INT)``;
* ids are lower-case hex strings (what every trace UI shows and OTLP/JSON sends);
* enums the spec names (span kind, status code, temporality) are their names without the
  prefix (``SERVER``, ``ERROR``, ``CUMULATIVE``); severity stays a number (it is ordered);
* unsigned 32-bit counts and flags are ``long`` (an ``int`` cannot hold 2^31 and more).
"""

from __future__ import annotations

from icefloe.otlp.kinds import KINDS
from icefloe.streams.model import Column

ATTRS = "map<string,string>"
EXEMPLARS = ("list<struct<time: timestamp, time_unix_nano: long, value: double, "
             "value_int: long, trace_id: string, span_id: string, "
             "filtered_attributes: map<string,string>>>")
SPAN_EVENTS = ("list<struct<time: timestamp, time_unix_nano: long, name: string, "
               f"attributes: {ATTRS}, dropped_attributes_count: long>>")
SPAN_LINKS = (f"list<struct<trace_id: string, span_id: string, trace_state: string, "
              f"attributes: {ATTRS}, flags: long, dropped_attributes_count: long>>")


def _c(name: str, type: str, doc: str) -> Column:
    return Column(name=name, type=type, doc=doc)


RESOURCE_SCOPE: tuple[Column, ...] = (
    _c("service_name", "string", "the resource attribute `service.name` (null without it); "
       "its own column so tables can be partitioned and filtered by it"),
    _c("resource_attributes", ATTRS, "the resource's attributes (`service.name` included)"),
    _c("resource_dropped_attributes_count", "long", "resource attributes the sender dropped"),
    _c("resource_schema_url", "string", "the resource's semantic-conventions schema URL"),
    _c("scope_name", "string", "instrumentation scope name (the library that produced it)"),
    _c("scope_version", "string", "instrumentation scope version"),
    _c("scope_attributes", ATTRS, "instrumentation scope attributes"),
    _c("scope_dropped_attributes_count", "long", "scope attributes the sender dropped"),
    _c("scope_schema_url", "string", "the scope's schema URL"),
)
"""Columns every kind has: from the ``Resource*`` and ``Scope*`` message around a record."""

LOGS: tuple[Column, ...] = (
    _c("time", "timestamp", "when the event occurred (`time_unix_nano`); the observed time "
       "when that is 0 (unset), null when both are"),
    _c("time_unix_nano", "long", "when the event occurred, nanoseconds since the epoch as "
       "sent (0: unset)"),
    _c("observed_time", "timestamp", "when the event was observed by the collection system "
       "(null when unset)"),
    _c("observed_time_unix_nano", "long", "the observed time in nanoseconds as sent"),
    _c("severity_number", "int", "1-24 (TRACE 1-4, DEBUG 5-8, INFO 9-12, WARN 13-16, ERROR "
       "17-20, FATAL 21-24); 0 unset"),
    _c("severity_text", "string", "the severity as the source wrote it (`ERROR`, `warn`)"),
    _c("body", "string", "the body: a string as it is, any other value as its JSON text"),
    _c("attributes", ATTRS, "the log record's attributes"),
    _c("dropped_attributes_count", "long", "attributes the sender dropped"),
    _c("flags", "long", "W3C trace flags (bit 0: sampled)"),
    _c("trace_id", "string", "32 lower-case hex digits; null when unset"),
    _c("span_id", "string", "16 lower-case hex digits; null when unset"),
    _c("event_name", "string", "the event's name (`event_name`, an event log record)"),
    *RESOURCE_SCOPE,
)

SPANS: tuple[Column, ...] = (
    _c("trace_id", "string", "32 lower-case hex digits"),
    _c("span_id", "string", "16 lower-case hex digits"),
    _c("parent_span_id", "string", "the parent's span id; null for a root span"),
    _c("trace_state", "string", "W3C trace state"),
    _c("name", "string", "the span's name (`GET /users/{id}`)"),
    _c("kind", "string", "`INTERNAL`, `SERVER`, `CLIENT`, `PRODUCER`, `CONSUMER` or "
       "`UNSPECIFIED`"),
    _c("start_time", "timestamp", "when the span started; null when unset"),
    _c("start_time_unix_nano", "long", "start in nanoseconds since the epoch as sent"),
    _c("end_time", "timestamp", "when the span ended; null when unset"),
    _c("end_time_unix_nano", "long", "end in nanoseconds since the epoch as sent"),
    _c("duration_ns", "long", "end minus start in nanoseconds; null when either is unset"),
    _c("status_code", "string", "`UNSET`, `OK` or `ERROR`"),
    _c("status_message", "string", "the status's message (errors)"),
    _c("attributes", ATTRS, "the span's attributes"),
    _c("dropped_attributes_count", "long", "attributes the sender dropped"),
    _c("events", SPAN_EVENTS, "the span's events (exceptions, annotations), in order"),
    _c("dropped_events_count", "long", "events the sender dropped"),
    _c("links", SPAN_LINKS, "links to other spans"),
    _c("dropped_links_count", "long", "links the sender dropped"),
    _c("flags", "long", "W3C trace flags (bit 0: sampled) and OTLP's parent-is-remote bits"),
    *RESOURCE_SCOPE,
)

METRIC: tuple[Column, ...] = (
    _c("metric_name", "string", "the metric's name (`http.server.request.duration`)"),
    _c("metric_description", "string", "the metric's description"),
    _c("metric_unit", "string", "the metric's unit (UCUM: `s`, `By`, `{request}`)"),
    _c("metric_metadata", ATTRS, "the metric's `metadata` key-values (rarely set)"),
    _c("time", "timestamp", "when the point was recorded (`time_unix_nano`); null when "
       "unset"),
    _c("time_unix_nano", "long", "the point's time in nanoseconds as sent"),
    _c("start_time", "timestamp", "start of the point's aggregation interval; null when "
       "unset"),
    _c("start_time_unix_nano", "long", "the start in nanoseconds as sent"),
    _c("attributes", ATTRS, "the point's attributes (its dimensions)"),
    _c("flags", "long", "data point flags (bit 0: no recorded value, a staleness marker)"),
)
"""Columns every metric point has, before its kind's own."""

NUMBER: tuple[Column, ...] = (
    _c("value", "double", "the value; an integer point's value converted to double "
       "(exact up to 2^53)"),
    _c("value_int", "long", "the exact value of an integer point (`as_int`); null for a "
       "double point"),
    _c("exemplars", EXEMPLARS, "the point's exemplars (sampled measurements with their "
       "trace)"),
)

HISTOGRAM_STATS: tuple[Column, ...] = (
    _c("count", "long", "number of measurements"),
    _c("sum", "double", "sum of the measurements; null when not sent"),
    _c("min", "double", "smallest measurement; null when not sent"),
    _c("max", "double", "largest measurement; null when not sent"),
)

COLUMNS: dict[str, tuple[Column, ...]] = {
    "logs": LOGS,
    "spans": SPANS,
    "gauge": (*METRIC, *NUMBER, *RESOURCE_SCOPE),
    "sum": (*METRIC, *NUMBER,
            _c("aggregation_temporality", "string", "`DELTA`, `CUMULATIVE` or "
               "`UNSPECIFIED`"),
            _c("is_monotonic", "boolean", "whether the sum only grows (a counter)"),
            *RESOURCE_SCOPE),
    "histogram": (*METRIC, *HISTOGRAM_STATS,
                  _c("bucket_counts", "list<long>", "count per bucket; one more than the "
                     "bounds"),
                  _c("explicit_bounds", "list<double>", "the buckets' upper bounds (bucket "
                     "i: bounds[i-1] < x <= bounds[i])"),
                  _c("aggregation_temporality", "string", "`DELTA`, `CUMULATIVE` or "
                     "`UNSPECIFIED`"),
                  _c("exemplars", EXEMPLARS, "the point's exemplars"),
                  *RESOURCE_SCOPE),
    "exponential_histogram": (
        *METRIC, *HISTOGRAM_STATS,
        _c("scale", "int", "resolution: bucket boundaries are powers of 2^(2^-scale)"),
        _c("zero_count", "long", "measurements in the zero bucket"),
        _c("zero_threshold", "double", "width of the zero bucket"),
        _c("positive_offset", "int", "index of the first positive bucket"),
        _c("positive_bucket_counts", "list<long>", "counts of the positive buckets"),
        _c("negative_offset", "int", "index of the first negative bucket"),
        _c("negative_bucket_counts", "list<long>", "counts of the negative buckets"),
        _c("aggregation_temporality", "string", "`DELTA`, `CUMULATIVE` or `UNSPECIFIED`"),
        _c("exemplars", EXEMPLARS, "the point's exemplars"),
        *RESOURCE_SCOPE),
    "summary": (*METRIC,
                _c("count", "long", "number of measurements"),
                _c("sum", "double", "sum of the measurements"),
                _c("quantile_values", "list<struct<quantile: double, value: double>>",
                   "the quantiles (0.5: the median, 1.0: the maximum)"),
                *RESOURCE_SCOPE),
}
"""Each kind's columns, in table order."""

TIME_COLUMN: dict[str, str] = {kind: "start_time" if kind == "spans" else "time"
                               for kind in KINDS}
"""The column each kind's table is partitioned by (by day, by default)."""
