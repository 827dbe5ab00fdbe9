"""The rows as msgspec structs, one per kind, fields in their table's column order.

Why structs and not dicts: built positionally they cost a third of a dict, and encoding
leaves out null members in C (``omit_defaults``), exactly as the streams' validator writes
its canonical payloads; the field order is the columns', so a canonical row is byte for
byte what the validator would have made of it (tests/core/test_otlp_rows.py checks that,
and that these fields are :mod:`icefloe.otlp.schemas`' columns). The resource and scope
columns are not here: they are encoded once per scope (:class:`Shared`) and spliced onto
each row. Values are ``Any``: attributes are a dict or a list of entries, by the form asked.
"""

from __future__ import annotations

from typing import Any

import msgspec


class _Row(msgspec.Struct, omit_defaults=True, gc=False):
    """A row or nested struct: a null member is left out, as in canonical payloads."""


class Shared(_Row):
    service_name: Any = None
    resource_attributes: Any = None
    resource_dropped_attributes_count: Any = None
    resource_schema_url: Any = None
    scope_name: Any = None
    scope_version: Any = None
    scope_attributes: Any = None
    scope_dropped_attributes_count: Any = None
    scope_schema_url: Any = None


class LogRow(_Row):
    time: Any = None
    time_unix_nano: Any = None
    observed_time: Any = None
    observed_time_unix_nano: Any = None
    severity_number: Any = None
    severity_text: Any = None
    body: Any = None
    attributes: Any = None
    dropped_attributes_count: Any = None
    flags: Any = None
    trace_id: Any = None
    span_id: Any = None
    event_name: Any = None


class SpanRow(_Row):
    trace_id: Any = None
    span_id: Any = None
    parent_span_id: Any = None
    trace_state: Any = None
    name: Any = None
    kind: Any = None
    start_time: Any = None
    start_time_unix_nano: Any = None
    end_time: Any = None
    end_time_unix_nano: Any = None
    duration_ns: Any = None
    status_code: Any = None
    status_message: Any = None
    attributes: Any = None
    dropped_attributes_count: Any = None
    events: Any = None
    dropped_events_count: Any = None
    links: Any = None
    dropped_links_count: Any = None
    flags: Any = None


class SpanEvent(_Row):
    time: Any = None
    time_unix_nano: Any = None
    name: Any = None
    attributes: Any = None
    dropped_attributes_count: Any = None


class SpanLink(_Row):
    trace_id: Any = None
    span_id: Any = None
    trace_state: Any = None
    attributes: Any = None
    flags: Any = None
    dropped_attributes_count: Any = None


class Exemplar(_Row):
    time: Any = None
    time_unix_nano: Any = None
    value: Any = None
    value_int: Any = None
    trace_id: Any = None
    span_id: Any = None
    filtered_attributes: Any = None


class Quantile(_Row):
    quantile: Any = None
    value: Any = None


class _Point(_Row):
    """The columns every metric point starts with (``schemas.METRIC``)."""

    metric_name: Any = None
    metric_description: Any = None
    metric_unit: Any = None
    metric_metadata: Any = None
    time: Any = None
    time_unix_nano: Any = None
    start_time: Any = None
    start_time_unix_nano: Any = None
    attributes: Any = None
    flags: Any = None


class GaugeRow(_Point):
    value: Any = None
    value_int: Any = None
    exemplars: Any = None


class SumRow(GaugeRow):
    aggregation_temporality: Any = None
    is_monotonic: Any = None


class _Stats(_Point):
    count: Any = None
    sum: Any = None
    min: Any = None
    max: Any = None


class HistogramRow(_Stats):
    bucket_counts: Any = None
    explicit_bounds: Any = None
    aggregation_temporality: Any = None
    exemplars: Any = None


class ExponentialHistogramRow(_Stats):
    scale: Any = None
    zero_count: Any = None
    zero_threshold: Any = None
    positive_offset: Any = None
    positive_bucket_counts: Any = None
    negative_offset: Any = None
    negative_bucket_counts: Any = None
    aggregation_temporality: Any = None
    exemplars: Any = None


class SummaryRow(_Point):
    count: Any = None
    sum: Any = None
    quantile_values: Any = None


ROW_TYPES: dict[str, type[_Row]] = {
    "logs": LogRow, "spans": SpanRow, "gauge": GaugeRow, "sum": SumRow,
    "histogram": HistogramRow, "exponential_histogram": ExponentialHistogramRow,
    "summary": SummaryRow}
"""Each kind's row struct (its columns but the resource and scope ones)."""
